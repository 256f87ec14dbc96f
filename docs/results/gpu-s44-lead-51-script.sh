#!/bin/bash
# Session 44, the lead: issue 51's GPU check on today's tree (main 58aa6b4), one H200.
# gpt2 bf16 batch 8 and resnet50 224 bf16 batch 128 fitted to PyTorch's checkpointed peak P and
# to 0.75 P (session 36: gpt2 P = 3,329,787,904 B, resnet50 P = 2,916,900,864 B), beside
# PyTorch's gpt2 with torch.utils.checkpoint around every block under torch.compile + SDPA in
# the same call (resnet50's checkpointed step: session 43's final call, 35.17 ms).
# Executables compiled on the 2-core machine: `ingot compile --model M --device cuda
# --precision bf16 --budget B -o E`; run with `ingot run E --device cuda --steps N --json`.
# Every timed run holds one flock, so no two time their steps at once.
# usage: bash docs/results/gpu-s44-lead-51-script.sh  (.device-bin/lead51: ingot.xz, *.ingot)
X=/tmp/s44l; . scripts/device_prelude.sh
D=.device-bin/lead51
xz -dc $D/ingot.xz > $X/ingot && chmod +x $X/ingot
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
LOCK=$X/gpu.lock; : > $LOCK
( TORCH_BENCH_CHECKPOINT=1 TORCH_BENCH_LOCK=$LOCK timeout $(left 200) python3 scripts/gpu_bench.py --models gpt2 \
    --modes bf16 --systems torch-compile-sdpa --steps 20 --warmup 5 --timeout 190 --json $X/g1.json > $X/g1.txt 2>&1
  echo "gpu_bench rc=$?" >> $X/g1.txt ) &
G=$!
run() { # label, steps, args...
  local l=$1 s=$2; shift 2
  echo -n "$l: "; flock $LOCK timeout $(left 215) $X/ingot "$@" --steps $s --json > $X/$l.json 2> $X/$l.err
  echo -n "rc=$? "; python3 scripts/summ.py < $X/$l.json || tail -3 $X/$l.err; }
echo "== Ingot round 1 (PyTorch compiling)"
run g0 20 train --model gpt2 --device cuda --precision bf16
run gP 20 run $D/g2p.ingot --device cuda
run gQ 20 run $D/g2q.ingot --device cuda
run rQ 10 run $D/r50q.ingot --device cuda
t
wait $G; echo "== PyTorch gpt2, every block checkpointed"; tail -2 $X/g1.txt
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
          "last loss", r.get("last_loss"))
PY
t
echo "== Ingot round 2"
[ $(left 215) -gt 20 ] && run gP2 20 run $D/g2p.ingot --device cuda
[ $(left 215) -gt 20 ] && run rQ2 10 run $D/r50q.ingot --device cuda
[ $(left 215) -gt 20 ] && run gQ2 20 run $D/g2q.ingot --device cuda
for l in rQ gQ; do python3 -c "
import json,sys
for line in open(sys.argv[1]):
    try: d=json.loads(line)
    except Exception: continue
    if 'loss' in d and 'step' in d: print(sys.argv[2], d['step'], d['loss'])
" $X/$l.json $l | tr '\n' ' '; echo; done
t; echo done
