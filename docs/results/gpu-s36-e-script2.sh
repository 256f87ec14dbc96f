#!/bin/bash
# Session 36, helper E, device call 2 (one H200), issue 51: Ingot fitted to PyTorch's own
# checkpointed peak P and to 0.75 P, beside PyTorch with torch.utils.checkpoint around every
# block, gpt2 bf16 batch 8 and resnet50 224 bf16 batch 128, in one call.
#  P (call 1, torch.cuda.max_memory_allocated): gpt2 3,329,787,904 bytes; resnet50 2,916,900,864.
#  Ingot: executables compiled on the 2-core machine (`ingot compile --device cuda --precision
#  bf16 [--budget B]`, resnet50 with INGOT_CONV=cudnn and cuDNN loadable, so planned
#  channels-last as on the GPU), run here with `ingot run E --device cuda --steps N --json`:
#  g0/r0 unfitted, gP/rP at P, g75/r75 at 0.75 P; rk4: resnet50 in 4 micro-batches by hand
#  (`--accumulate 4`, no budget: 1.77 GiB planned, under both of resnet50's budgets), in case
#  the fitted ones are not compiled in time (the fitter takes minutes of CPU on resnet50).
#  PyTorch: gpu_bench.py torch-compile-sdpa (AdamW lr 3e-4 wd 0.01, as Ingot's gpt2) with
#  TORCH_BENCH_CHECKPOINT=1; resnet_beside_torch.py --checkpoint-blocks (SGD lr 0.1 momentum 0.9
#  wd 5e-4, as Ingot's resnet). Both compile while Ingot runs; every timed run (theirs and
#  Ingot's) holds one flock, so no two time their steps at once.
# usage: bash .device-bin/e/script2.sh (beside it: ingot.gz, summ.py, the python scripts, exe/)
START=$(date +%s)
OUT=${OUT:-/tmp/s36e-out}; mkdir -p $OUT
X=/tmp/s36e; mkdir -p $X/s
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-165} - $(date +%s) + START )); }
D=$(cd "$(dirname "$0")" && pwd)
gunzip -c $D/ingot.gz > $X/ingot && chmod +x $X/ingot
cp scripts/*.py $X/s/ && cp $D/*.py $X/s/   # the lead's scripts, this branch's over them
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cudnn,os;print(os.path.join(nvidia.cudnn.__path__[0],"lib"))'):$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1 INGOT_CACHE_DIR=$X/ptx
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
LOCK=$X/gpu.lock; : > $LOCK
( cd $X/s; TORCH_BENCH_CHECKPOINT=1 TORCH_BENCH_LOCK=$LOCK timeout $(left 150) python3 gpu_bench.py --models gpt2 \
    --modes bf16 --systems torch-compile-sdpa --steps 20 --warmup 5 --timeout 145 --json $X/g1.json > $X/g1.txt 2>&1
  echo "gpu_bench rc=$? [t=$(( $(date +%s) - START )) s]" >> $X/g1.txt ) &
G=$!
( cd $X/s; timeout $(left 150) python3 resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16 \
    --checkpoint-blocks --lock $LOCK > $X/r1.txt 2>&1; echo "rc=$? [t=$(( $(date +%s) - START )) s]" >> $X/r1.txt ) &
R=$!
# An executable not compiled on the 2-core machine in time (resnet50's fits take it minutes) is
# compiled here, in the background, from the start: `ingot compile --budget` as there.
mkdir -p $X/exe; cp $D/exe/*.ingot $X/exe/
M=resnet:depth=50,side=224,batch=128
for nb in rP:2916900864 r75:2187675648; do n=${nb%:*}
  [ -f $X/exe/$n.ingot ] && continue
  echo "$n: compiled here (not carried)"
  ( INGOT_CONV=cudnn timeout $(left 130) $X/ingot compile --model $M --device cuda --precision bf16 \
      --budget ${nb#*:} -o $X/exe/$n.part > $X/$n.compile 2>&1 && mv $X/exe/$n.part $X/exe/$n.ingot
    echo "$n compile rc=$? [t=$(( $(date +%s) - START )) s]" >> $X/$n.compile ) > /dev/null 2>&1 &
  BG="$BG $!"
done
run() { # run NAME STEPS [wait]: one Ingot executable under the lock
  local n=$1 s=$2 c=(); [ ${n:0:1} = r ] && c=(INGOT_CONV=cudnn)
  [ "$3" = wait ] && while [ ! -f $X/exe/$n.ingot ] && [ $(left) -gt 30 ]; do sleep 2; done
  [ -f $X/exe/$n.ingot ] || { echo "$n: not run (its compile has not finished)"; return; }
  echo -n "$n: "; env "${c[@]}" flock $LOCK timeout $(left 162) $X/ingot run $X/exe/$n.ingot --device cuda --steps $s --json > $X/$n.json 2> $X/$n.err
  echo -n "rc=$? "; python3 $D/summ.py < $X/$n.json || tail -3 $X/$n.err; }
echo "== Ingot, round 1 (while PyTorch compiles)"
for n in g0 gP g75; do run $n 20; done; t
for n in r0 rk4 rP r75; do run $n 10; done; t
wait $R; echo "== PyTorch resnet50, every block checkpointed"; grep -E "^\{|rc=|Error" $X/r1.txt | tail -3
wait $G; echo "== PyTorch gpt2, every block checkpointed"; tail -1 $X/g1.txt; t
echo "== Ingot, round 2 (after PyTorch's timed steps), while time is left"
for n in gP rk4 g75 r0 g0 rP r75; do [ $(left) -gt 25 ] && { s=20; [ ${n:0:1} = r ] && s=10; run $n $s wait; }; done; t
python3 - $X/g1.json <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"{sys.argv[1]}: {e}")
for c in d["cells"]:
    r = c.get("result") or {}
    print(c["system"], c["mode"], "ok" if c.get("ok") else c.get("error"), "median_ms", r.get("median_ms"),
          "event_median_ms", r.get("event_median_ms"), "peak_bytes", r.get("peak_bytes"),
          "first/last loss", r.get("first_loss"), r.get("last_loss"), "notes", r.get("notes"), "cell_s", c.get("wall_seconds"))
PY
for n in rP r75; do [ -f $X/$n.compile ] && grep -h "fitted to\|rc=\|wrote" $X/$n.compile | cut -c1-400; done
for p in $BG; do kill $p 2>/dev/null; done  # a compile still running (its own processes only)
echo done; t
