# Sourced at the top of a device script (docs/results/gpu-*-script.sh), so that each script
# holds only what it measures: START and the log (everything to $OUT/log.txt, which the device
# tool brings back), the scratch folder $X (set X before sourcing to name it), `t` (seconds
# since the start), `left N` (seconds left of N), cuDNN on the library path, and
# `gpu_test_lane`. A script that sources this must not `wait` without a pid: bash would
# wait for the tee too (`wait $PID` for each background job).
START=$(date +%s)
OUT=${OUT:-/tmp/device-out}; mkdir -p "$OUT"
X=${X:-/tmp/device-aux}; mkdir -p "$X"
exec > >(tee -a "$OUT/log.txt") 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-500} - $(date +%s) + START )); }
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))" 2>/dev/null):$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1

# gpu_test_lane GPU END DIR TEST...: each test binary DIR/TEST on GPU alone, one test thread,
# INGOT_REQUIRE_GPU=1, until `left END` runs out; one summary line a binary (its failures
# after it) in $X/lane_tests.txt. Run it in the background and `wait` its pid.
gpu_test_lane() {
  local gpu=$1 end=$2 dir=$3; shift 3
  for tb in "$@"; do
    [ "$(left "$end")" -gt 20 ] || { echo "$tb: not run (time)"; continue; }
    local s; s=$(date +%s)
    CUDA_VISIBLE_DEVICES=$gpu INGOT_REQUIRE_GPU=1 timeout "$(left "$end")" "$dir/$tb" --test-threads=1 > "$X/$tb.txt" 2>&1
    echo "$tb rc=$? $(( $(date +%s) - s )) s: $(grep -E '^test result' "$X/$tb.txt" | tail -1)"
    grep -E "FAILED|panicked" "$X/$tb.txt" | head -5
  done > "$X/lane_tests.txt" 2>&1
}
