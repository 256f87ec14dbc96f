#!/bin/bash
# Session 31, call 1 (one H200). NEW = main with the matmul alignment pass (compiler/src/align.rs,
# release build, .devbin/ingot). Session 29 measured the step before the pass (call 6).
#  1. gpt2's shape with transformers' vocabulary (50257) and the padded one (50304) alternating,
#     bf16 and tf32, SGD lr 0.01, 20 steps.
#  2. transformers' GPT-2 small imported (seq 1024, batch 8, bf16) beside torch.compile + SDPA (bench.sh),
#     then the built-in gpt2 and the import alternating (SGD, 30 steps).
#  3. ingot generate on CUDA: a small GPT trained 300 steps on the README's bytes (CUDA, f32), then
#     greedy tokens from the decode step (KV cache), the whole window, and the CPU: the same text?
#  4. issue 49's table: scripts/cpu_bench.sh (Ingot beside PyTorch eager and torch.compile on the
#     host's cores, f32) with NEW.
# usage: bash docs/results/gpu-s31-call1-script.sh   (writes nothing outside /tmp and $OUT)
START=$(date +%s)
NEW=$PWD/.devbin/ingot
S=$PWD/scripts
OUT=${OUT:-/tmp/s31-out}; mkdir -p $OUT
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
G="d_model=768,layers=12,heads=12,d_ff=3072,seq=1024,batch=8"
echo "== 1. odd vocabulary: 50257 and 50304 alternating, SGD lr 0.01, 20 steps"
for p in bf16 tf32; do for i in 1 2; do for v in 50257 50304; do
  echo -n "$p vocab $v: "; timeout 90 $NEW train --model gpt:vocab=$v,$G --optimizer sgd --lr 0.01 --device cuda --precision $p --steps 20 --json 2>$OUT/v$v-$p.err | python3 $S/summ.py || tail -3 $OUT/v$v-$p.err
done; done; done; t
echo "== 2. transformers' GPT-2 small imported, bf16, beside torch.compile + SDPA (NEW)"
WORK=/tmp/s31 BUDGET_S=200 MODELS="gpt2_124m" BIN=$NEW bash $S/onnx_real_models/bench.sh 2>&1 | grep -v "^done"; t
if [ -f /tmp/s31/gpt2_124m/det.onnx ]; then
  for i in 1 2; do
    echo -n "built-in gpt2 (vocab 50304, untied): "; timeout 100 $NEW train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json 2>$OUT/g2.err | python3 $S/summ.py || tail -3 $OUT/g2.err
    echo -n "imported GPT-2: "; timeout 100 $NEW train --onnx /tmp/s31/gpt2_124m/det.onnx --loss cross-entropy --device cuda --precision bf16 --init /tmp/s31/gpt2_124m/state_dict.safetensors --data /tmp/s31/gpt2_124m/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$OUT/g2i.err | python3 $S/summ.py || tail -3 $OUT/g2i.err
  done; t
fi
echo "== 3. generate on CUDA"
M="gpt:vocab=256,d_model=128,layers=4,heads=4,d_ff=512,seq=128,batch=16"
$NEW data bytes README.md /tmp/readme.bin >/dev/null
timeout 120 $NEW train --model $M --dataset /tmp/readme.bin --steps 300 --device cuda --save /tmp/gen.safetensors --json 2>$OUT/gen-train.err | python3 $S/summ.py
for mode in "--device cuda" "--device cuda --whole-window" "--device cpu" "--device cuda --precision bf16"; do
  echo "-- generate $mode:"; timeout 60 $NEW generate --model $M --init /tmp/gen.safetensors --prompt "The plan " --tokens 200 --seed 0 $mode --json 2>$OUT/gen.err > $OUT/gen-$(echo $mode | tr -c 'a-z0-9' _).json || tail -3 $OUT/gen.err
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(repr(d['text'][:120]))" $OUT/gen-$(echo $mode | tr -c 'a-z0-9' _).json
  tail -2 $OUT/gen.err
done
python3 - $OUT <<'PY'
import json, glob, sys
runs = {f: json.load(open(f))["tokens"] for f in sorted(glob.glob(sys.argv[1] + "/gen-*.json"))}
ref = runs.get(sys.argv[1] + "/gen-__device_cpu_.json")
for f, toks in runs.items():
    same = sum(a == b for a, b in zip(toks, ref)) if ref else None
    print(f.split("/")[-1], "tokens", len(toks), "equal to the CPU's at", same)
PY
t
if left 480; then
echo "== 4. CPU: Ingot beside PyTorch on the host's cores (cpu_bench.sh, NEW)"
OUT_DIR=$OUT/cpu_bench BIN=$NEW timeout $(( 590 - $(date +%s) + START )) bash $S/cpu_bench.sh --steps 10 --warmup 2 2>&1 | tail -5
cat $OUT/cpu_bench/*.md 2>/dev/null; t
fi
echo "done"
