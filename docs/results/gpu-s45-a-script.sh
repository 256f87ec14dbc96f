#!/bin/bash
# Issue 48's GPU checks in one device call (session 45), in priority order, each item guarded by
# the time left (`left END`), so that the first items always finish:
# 1. resnet50 224 b128 bf16: torchvision under torch.compile channels_last, Ingot unfitted
#    (`ingot train ... --steps 20 --json | summ.py`), torch.compile NCHW, Ingot fitted (`ingot
#    run` of FITTED, compiled on the 2-core machine with --budget 4397284992), Ingot unfitted
#    again, and as an extra column torch.compile mode="reduce-overhead" channels_last.
# 2. The largest batch within 80 GiB: Ingot's (BIG, compiled with `--batch N --budget 80GiB`
#    for the N `ingot plan ... --max-batch` found; 3 steps, planned = measured) and PyTorch's
#    (resnet_beside_torch.py --find-max-batch: doubling then bisecting to 5% under
#    torch.cuda.set_per_process_memory_fraction, the batch axis dynamic).
# 3. Training from an image folder of generated JPEGs (make_image_folder.py, 1000 classes x
#    PER_CLASS) against the fixed batch (image_folder_bench.sh), resnet50 224 b128 bf16.
# 4. resnet50 b128 f32 and tf32, Ingot beside torch.compile channels_last.
# 5. resnet18 and resnet34 at 224 b128, bf16 / tf32 / f32, Ingot beside torch.compile
#    channels_last.
# Every PyTorch process starts compiling at once (its first step, outside any lock, the
# allocator's cache emptied after it) and then waits for a lock this script holds; the script
# releases one at a time, so every timed step (Ingot's and PyTorch's) runs alone on the GPU with
# no compile running beside it, once every compile is done (or at GATE seconds).
#
# usage (device machine, from the repository root, this folder carried as .device-bin/a):
#   END=545 bash .device-bin/a/scripts/issue48_bench.sh
# Environment: D (the folder holding ingot, r50f.ingot, r50max.ingot, max_batch.txt; default
# this script's ..), DEV=cpu with SIDE/BATCH/CLASSES/R50DEPTH small to test the logic on a
# machine without a GPU (PyTorch eager there), END (seconds), GATE (seconds).
S=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=${D:-$S/..}
X=${X:-/tmp/s45a-dev}; . "$S/device_prelude.sh"
END=${END:-545}; GATE=${GATE:-170}
DEV=${DEV:-cuda}; SIDE=${SIDE:-224}; BATCH=${BATCH:-128}; CLASSES=${CLASSES:-1000}
R50DEPTH=${R50DEPTH:-50}; PER_CLASS=${PER_CLASS:-3}; FOLDER_STEPS=${FOLDER_STEPS:-150}
# Carried compressed (xz): unpacked into $X.
for f in ingot r50f.ingot r50max.ingot; do
  [ -e "$D/$f" ] || [ ! -e "$D/$f.xz" ] || python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$D/$f.xz" "$X/$f"
  [ -e "$X/$f" ] && chmod +x "$X/$f" && eval "U_${f%%.*}=\$X/\$f"
done
INGOT=${INGOT:-${U_ingot:-$D/ingot}}; FITTED=${FITTED:-${U_r50f:-$D/r50f.ingot}}; BIG=${BIG:-${U_r50max:-$D/r50max.ingot}}
TORCH_FLAGS="--side $SIDE --batch $BATCH --classes $CLASSES"
SEARCH_FLAGS=""
[ "$DEV" = cpu ] && TORCH_FLAGS="$TORCH_FLAGS --device cpu --eager" && SEARCH_FLAGS="--cpu-bytes-per-sample ${CPU_BPS:-1000}"
export PYTHONPATH=$S:$PYTHONPATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null; nproc; t
echo "ingot: $(sha256sum "$INGOT" | cut -c1-16)"

declare -A LOCKFD PID
# tstart NAME NICE THREADS ARGS...: a PyTorch process compiling now, timing when released.
tstart() {
  local name=$1 nice=$2 threads=$3; shift 3
  local fd; exec {fd}>"$X/$name.lock"; flock "$fd"; LOCKFD[$name]=$fd
  TORCHINDUCTOR_COMPILE_THREADS=$threads nice -n "$nice" timeout "$(left "$END")" \
    python3 "$S/resnet_beside_torch.py" $TORCH_FLAGS "$@" --lock "$X/$name.lock" --ready "$X/$name.ready" \
    > "$X/$name.out" 2>&1 &
  PID[$name]=$!
}
alive() { kill -0 "${PID[$1]}" 2>/dev/null; }
# tready UNTIL NAMES...: wait until each NAME has compiled (or died), or `left` reaches UNTIL.
tready() {
  local until=$1; shift
  while [ "$(left "$END")" -gt "$until" ]; do
    local n busy=""
    for n in "$@"; do [ -e "$X/$n.ready" ] || ! alive "$n" || busy="$busy $n"; done
    [ -z "$busy" ] && return 0
    sleep 1
  done
  echo "still compiling at $(t):$busy"
}
# trun NAME: release NAME's lock, wait for it, print its result (or why there is none).
trun() {
  local n=$1
  flock -u "${LOCKFD[$n]}"
  wait "${PID[$n]}"; local rc=$?
  if grep -q '^{"system"' "$X/$n.out"; then
    echo "$n (compile $(cat "$X/$n.ready" 2>/dev/null | tr -d '\n') s): $(grep '^{"system"' "$X/$n.out" | tail -1)"
  else
    echo "$n: rc=$rc, no result:"; grep -v '^{"trial"' "$X/$n.out" | tail -4 | cut -c1-400
  fi
}
# tstop NAME: a PyTorch process whose turn did not come (time): stopped, said so.
tstop() { alive "$1" && kill "${PID[$1]}" 2>/dev/null; echo "$1: not timed (time)"; }
# irun LABEL TIMEOUT ARGS...: one Ingot run, its summary line (summ.py).
irun() {
  local l=$1 s=$2; shift 2
  echo -n "$l: "
  timeout "$s" "$INGOT" "$@" 2>"$X/run.err" | tee "$X/last.json" | python3 "$S/summ.py" || tail -3 "$X/run.err"
}

# Every PyTorch compile at once: item 1's first (nice 0, 4 compile threads), the rest below it.
R="--depth $R50DEPTH"
tstart t1cl 0 4 $R --precision bf16
tstart t1nchw 0 4 $R --precision bf16 --nchw
if [ "$DEV" = cuda ]; then tstart t1ro 0 4 $R --precision bf16 --mode reduce-overhead; fi
tstart t2max 5 2 $R --precision bf16 --find-max-batch --limit-gib "${LIMIT_GIB:-80}" \
  --search-start "${SEARCH_START:-256}" --search-seconds "${SEARCH_S:-110}" $SEARCH_FLAGS
tstart t4f32 10 2 $R --precision f32
tstart t4tf32 10 2 $R --precision tf32
for d in 18 34; do for p in bf16 tf32 f32; do tstart "t5r${d}$p" 10 2 --depth $d --precision $p; done; done
# The image folder meanwhile, on the CPU at the lowest priority.
mkdir -p "$X/imgs"
nice -n 19 python3 "$S/make_image_folder.py" "$X/imgs" --classes "$CLASSES" --per-class "$PER_CLASS" \
  > "$X/imgs.txt" 2>&1 &
IMGS=$!
ALL="t1cl t1nchw ${PID[t1ro]:+t1ro} t2max t4f32 t4tf32 t5r18bf16 t5r18tf32 t5r18f32 t5r34bf16 t5r34tf32 t5r34f32"
tready $((END - GATE)) t1cl t1nchw ${PID[t1ro]:+t1ro} t2max $ALL; t
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null; uptime

SPEC="resnet:depth=$R50DEPTH,side=$SIDE,batch=$BATCH,classes=$CLASSES"
R50="--model $SPEC --device $DEV --precision bf16 --steps 20 --json"
echo "== 1. resnet50 $SIDE b$BATCH bf16, alternated"
trun t1cl
irun "ingot unfitted" 90 train $R50
trun t1nchw
irun "ingot fitted (ingot run $(basename "$FITTED"))" 90 run "$FITTED" --device "$DEV" --steps 20 --json
irun "ingot unfitted" 90 train $R50
if [ -n "${PID[t1ro]}" ]; then trun t1ro; fi
t

echo "== 2. the largest batch within ${LIMIT_GIB:-80} GiB"
cat "$D/max_batch.txt" 2>/dev/null
if [ "$(left "$END")" -gt 60 ]; then
  trun t2max
  if [ -e "$BIG" ]; then
    irun "ingot at its largest batch (ingot run $(basename "$BIG"), 3 steps)" $(( $(left "$END") - 5 )) \
      run "$BIG" --device "$DEV" --steps 3 --json
    grep -o '"loss":[^,]*' "$X/last.json" | tr '\n' ' '; echo
  fi
else tstop t2max; fi
t

echo "== 3. an image folder against the fixed batch"
wait $IMGS; cat "$X/imgs.txt"; uptime
if [ "$(left "$END")" -gt 70 ]; then
  INGOT=$INGOT WARMUP=${FOLDER_WARMUP:-30} timeout $(( $(left "$END") - 5 )) \
    bash "$S/image_folder_bench.sh" "$SPEC" "$X/imgs" "$FOLDER_STEPS" -- --device "$DEV" --precision bf16
else echo "not run (time)"; fi
t

echo "== 4. resnet50 b$BATCH f32 and tf32"
for p in f32 tf32; do
  if [ "$(left "$END")" -gt 30 ]; then
    trun "t4$p"
    irun "ingot $p" $(( $(left "$END") - 5 )) train --model "$SPEC" --device "$DEV" --precision $p --steps 20 --json
  else tstop "t4$p"; fi
done; t

echo "== 5. resnet18 and resnet34 at $SIDE b$BATCH"
for d in 18 34; do for p in bf16 tf32 f32; do
  if [ "$(left "$END")" -gt 20 ]; then
    trun "t5r$d$p"
    irun "ingot resnet$d $p" $(( $(left "$END") - 5 )) train \
      --model "resnet:depth=$d,side=$SIDE,batch=$BATCH,classes=$CLASSES" --device "$DEV" --precision $p --steps 20 --json
  else tstop "t5r$d$p"; fi
done; done
t
for n in $ALL; do alive "$n" && kill "${PID[$n]}" 2>/dev/null; done
cp "$X"/*.out "$OUT/" 2>/dev/null; echo done
