#!/bin/bash
# Session 36, helper E, device call 1 (one H200), issue 51: PyTorch's peaks with and without
# torch.utils.checkpoint around every block, and Ingot unfitted, for gpt2 and resnet50 at 224.
#  lane G: scripts/gpu_bench.py (the lead's checkout), gpt2 bf16 batch 8, torch.compile + SDPA,
#          AdamW lr 3e-4 wd 0.01 (Ingot's gpt2), TORCH_BENCH_CHECKPOINT=1, then without.
#  lane R: resnet_beside_torch.py (this branch's, beside this script), resnet50 224 batch 128
#          bf16 torch.compile channels_last, SGD lr 0.1 momentum 0.9 wd 5e-4 (Ingot's resnet),
#          with --checkpoint-blocks and without, the two compiling at once and timing one at a
#          time (--lock).
#  then, under the same lock: Ingot (main's build, unfitted) gpt2 bf16 and resnet50 bf16
#          INGOT_CONV=cudnn, `ingot train --json`: median step, planned and measured bytes.
# Lanes G and R run at once: their memory peaks are each process's own; their step times are
# indicative only (device call 2 times the comparison one run at a time).
# usage: bash .device-bin/e/script1.sh (beside it: ingot.gz, summ.py, resnet_beside_torch.py,
# torch_timing.py)
START=$(date +%s)
OUT=${OUT:-/tmp/s36e-out}; mkdir -p $OUT
X=/tmp/s36e; mkdir -p $X
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-165} - $(date +%s) + START )); }
D=$(cd "$(dirname "$0")" && pwd)
gunzip -c $D/ingot.gz > $X/ingot && chmod +x $X/ingot
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cudnn,os;print(os.path.join(nvidia.cudnn.__path__[0],"lib"))'):$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
python3 -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1
LOCK=$X/gpu.lock
(
  for ck in 1 0; do
    TORCH_BENCH_CHECKPOINT=$ck timeout $(left 150) python3 scripts/gpu_bench.py --models gpt2 --modes bf16 \
      --systems torch-compile-sdpa --steps 20 --warmup 5 --timeout 120 --json $X/g$ck.json > $X/g$ck.txt 2>&1
    echo "gpu_bench gpt2 TORCH_BENCH_CHECKPOINT=$ck rc=$? [t=$(( $(date +%s) - START )) s]"
  done
) > $X/laneG.txt 2>&1 &
G=$!
R="--depth 50 --side 224 --batch 128 --precision bf16 --lock $LOCK"
( cd $D; timeout $(left 150) python3 resnet_beside_torch.py $R --checkpoint-blocks > $X/r1.txt 2>&1; echo "rc=$? [t=$(( $(date +%s) - START )) s]" >> $X/r1.txt ) &
R1=$!
( cd $D; timeout $(left 150) python3 resnet_beside_torch.py $R > $X/r0.txt 2>&1; echo "rc=$? [t=$(( $(date +%s) - START )) s]" >> $X/r0.txt ) &
R0=$!
sleep 2
echo "== Ingot unfitted (main's build), each under the lock"
echo -n "ingot gpt2 bf16 AdamW 20 steps: "
flock $LOCK timeout 60 $X/ingot train --model gpt2 --device cuda --precision bf16 --steps 20 --json > $X/i_g.json 2>$X/i_g.err
echo -n "rc=$? "; python3 $D/summ.py < $X/i_g.json || tail -3 $X/i_g.err; t
echo -n "ingot resnet50 224 b128 bf16 cudnn SGD momentum 10 steps: "
INGOT_CONV=cudnn flock $LOCK timeout $(left 160) $X/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json > $X/i_r.json 2>$X/i_r.err
echo -n "rc=$? "; python3 $D/summ.py < $X/i_r.json || tail -3 $X/i_r.err; t
grep -h "fitted\|total" $X/i_g.err $X/i_r.err | head -4
wait $R1; wait $R0
echo "== resnet50 torch.compile checkpointed / plain"
grep -E "^\{|rc=|Error|error" $X/r1.txt | tail -4; grep -E "^\{|rc=|Error|error" $X/r0.txt | tail -4
wait $G
echo "== gpt2 lane"; cat $X/laneG.txt
for ck in 1 0; do python3 - $X/g$ck.json <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"{sys.argv[1]}: {e}")
for c in d["cells"]:
    r = c.get("result") or {}
    print(c["system"], c["mode"], "ok" if c.get("ok") else c.get("error"), "median_ms", r.get("median_ms"),
          "peak_bytes", r.get("peak_bytes"), "first/last loss", r.get("first_loss"), r.get("last_loss"),
          "notes", r.get("notes"), "cell_s", c.get("wall_seconds"))
PY
done
tail -5 $X/g1.txt $X/g0.txt
echo done; t
