#!/bin/bash
# Session 33, call 2 (two H200s): test_cuda_random_graphs with room (it ran past call 1's 220 s);
# where resnet50's 224x224 bf16 step goes, im2col against cuDNN (issue 48); `ingot generate --onnx`
# on CUDA against the CPU, greedy, for transformers' GPT-2 (a small config and GPT-2 small's shape)
# exported by scripts/onnx_real_models/models.py (issue 50: the same tokens?).
# usage: bash docs/results/gpu-s33-call2-script.sh   (binaries from scripts/gpu_build.sh in .devbin/bins.tgz)
START=$(date +%s)
OUT=${OUT:-/tmp/s33-out}; mkdir -p $OUT
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-585} - $(date +%s) + START )); }
mkdir -p .devbin/x && tar xzf .devbin/bins.tgz -C .devbin/x
B=$PWD/.devbin/x
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))"):$LD_LIBRARY_PATH
export INGOT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
( CUDA_VISIBLE_DEVICES=1 timeout 450 $B/test_cuda_random_graphs --test-threads=1 > $OUT/random_graphs.txt 2>&1; echo "random graphs rc=$? at t=$(( $(date +%s) - START )) s" >> $OUT/random_graphs.txt ) &
RG=$!
( for m in gpt2 gpt2_124m; do BATCH=1 CUDA_VISIBLE_DEVICES=1 timeout 200 python3 scripts/onnx_real_models/models.py $m /tmp/s33/$m > $OUT/export_$m.txt 2>&1; done ) &
EX=$!
export CUDA_VISIBLE_DEVICES=0
M=resnet:depth=50,side=224,batch=128
echo "== resnet50 224 bf16 profile, im2col (default)"; t
timeout 150 $B/cuda_profile $M --precision bf16 --top 30 2>&1 | tail -45
echo "== the same, INGOT_CONV=cudnn"; t
INGOT_CONV=cudnn timeout 150 $B/cuda_profile $M --precision bf16 --top 20 2>&1 | tail -35
wait $EX; t; tail -2 $OUT/export_*.txt
for m in gpt2 gpt2_124m; do
  W=/tmp/s33/$m; [ -f $W/det.onnx ] || continue
  n=40; [ $m = gpt2_124m ] && n=16
  for d in cuda cpu; do
    echo "== generate --onnx $m on $d, greedy, $n tokens"; t
    timeout 120 $B/ingot generate --onnx $W/det.onnx --prompt "The plan " --tokens $n --temperature 0 --device $d --json > $OUT/gen_${m}_$d.json 2>$OUT/gen_${m}_$d.err || tail -5 $OUT/gen_${m}_$d.err
    tail -3 $OUT/gen_${m}_$d.err
  done
  python3 - $OUT/gen_${m}_cuda.json $OUT/gen_${m}_cpu.json <<'PY'
import json, sys
a, b = (json.loads(open(f).read().splitlines()[0]) for f in sys.argv[1:])
print("cuda tokens", a["tokens"]); print("cpu  tokens", b["tokens"]); print("equal:", a["tokens"] == b["tokens"])
PY
done
wait $RG; tail -8 $OUT/random_graphs.txt; t
echo done
