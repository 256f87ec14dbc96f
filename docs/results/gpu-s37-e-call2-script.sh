#!/bin/bash
# Session 37, helper E, call 2 (one H200, issue 52): the bf16 attention kernels with cp.async
# (NEW, branch s37-e) against main at the session's start (OLD, /tmp/s37-old), alternating:
# the GPU attention test (f64 reference, bit for bit twice), `ingot train` of gpt2 and of
# gpt2-medium at batch 16 (bf16, SGD lr 0.01: median step, planned/measured bytes, losses,
# whose lists OLD and NEW must give to the bit), the per-kind profile of gpt2-medium's widths
# (4 layers, batch 16) with NEW, then, with the time left, the bf16 GPU tests and PyTorch's
# profile of the same 4 layers. Binaries in .device-bin/e/bins.tgz.
# usage: bash .device-bin/e/call2.sh
X=/tmp/e; source scripts/device_prelude.sh
B=$PWD/.device-bin/e
tar xzf $B/bins.tgz -C $X
export PYTHONPATH=$PWD/scripts
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cat > $X/summ.py <<'PY'
import json, sys, hashlib
rows = [json.loads(l) for l in sys.stdin if l.startswith('{')]
losses = [r['loss'] for r in rows if 'step' in r]
s = [r['summary'] for r in rows if 'summary' in r]
if not s:
    print(sys.argv[1], 'no summary'); sys.exit()
s = s[0]
h = hashlib.sha1(json.dumps(losses).encode()).hexdigest()[:12]
print(f"{sys.argv[1]}: median step {1e3 * s['median_step_seconds']:.3f} ms, planned {s['planned_bytes']}, measured {s['measured_bytes']}, "
      f"tflops {(s.get('tflops') or 0):.1f}, last loss {losses[-1]!r}, losses sha1 {h}")
PY
trn() {  # tag bin model steps [batch]
  timeout $(left 165) $X/$2/ingot train --model $3 ${5:+--batch $5} --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps $4 --json 2>/dev/null | python3 $X/summ.py "$1 $3${5:+ batch $5}"
}
echo "== 1. GPU attention test (NEW)"
gpu_test_lane 0 60 $X cuda_attention; cat $X/lane_tests.txt; t
echo "== 2. train, OLD/NEW alternating"
for r in 1 2; do
  [ "$(left 165)" -gt 25 ] || break
  for v in old new; do trn "round $r $v" $v gpt2 20; done; t
  [ "$(left 165)" -gt 40 ] || break
  for v in old new; do trn "round $r $v" $v gpt2-medium 12 16; done; t
  if [ $r = 1 ] && [ "$(left 165)" -gt 50 ]; then
    echo "== 3. cuda_profile NEW, gpt2-medium's widths, 4 layers, batch 16"
    M4="gpt:vocab=50304,d_model=1024,layers=4,heads=16,d_ff=4096,seq=1024,batch=16"
    timeout 30 $X/new/ingot compile --model "$M4" --device cuda --precision bf16 --optimizer sgd --lr 0.01 -o $X/m4.exe 2>&1 | tail -1
    timeout $(left 165) $X/new/cuda_profile $X/m4.exe --top 20 2>&1 | head -28; t
  fi
done
if [ -x $X/cuda_bf16 ] && [ "$(left 165)" -gt 30 ]; then
  echo "== 4. bf16 GPU tests (NEW): every gpt-mini kernel against the CPU"
  INGOT_REQUIRE_GPU=1 timeout $(left 165) $X/cuda_bf16 --test-threads=1 every_bf16_gpt_mini_kernel 2>&1 | grep -E "^test |test result|panicked" ; t
fi
if [ "$(left 165)" -gt 50 ]; then
  echo "== 5. torch.compile + SDPA + SGD, the same 4 layers"
  timeout $(left 165) python3 $B/torch_step_profile.py "gpt:vocab=50304,d_model=1024,layers=4,heads=16,d_ff=4096,seq=1024,batch=16" --top 12 2>&1 | grep -v -i warn | head -60; t
fi
echo done
