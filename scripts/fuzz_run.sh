#!/bin/bash
# Runs the five libFuzzer targets packed by scripts/fuzz_build.sh (PACK/bin/<target>, seeds in
# PACK/corpus/<target>/) as W workers each for S seconds, at nice 19 so that a GPU run beside
# them keeps its CPU; the corpora grow in OUT/<target>/corpus, crashes land in OUT/<target>/art.
# Each target's log ends with its rc and `times` (the user and system CPU seconds of its
# workers), which is what "an hour of a target" is counted in (issue 53): W workers for S
# seconds are W·S seconds of CPU only on an idle machine. Returns at once; wait for the pids
# listed in OUT/pids, then run `scripts/fuzz_run.sh --summary OUT`.
# TARGETS (a space-separated list) runs or summarizes some of the five only.
#   [TARGETS="fused_step"] scripts/fuzz_run.sh PACK W S OUT
#   [TARGETS="fused_step"] scripts/fuzz_run.sh --summary OUT
if [ "$1" = --summary ]; then
  O=$2
  for t in ${TARGETS:-ir_text executable safetensors plan_validate fused_step}; do
    runs=$(grep -h "^Done" "$O/$t"/fuzz-*.log 2>/dev/null | awk '{s+=$2} END {print s+0}')
    cpu=$(tail -1 "$O/$t/log.txt" | awk '{split($1,u,"m"); split($2,s,"m"); sub("s","",u[2]); sub("s","",s[2]); printf "%.0f", u[1]*60+u[2]+s[1]*60+s[2]}')
    echo "$t: $(ls "$O/$t"/fuzz-*.log 2>/dev/null | wc -l) workers, $runs runs, ${cpu} s of CPU ($(( cpu / 60 )) min), $(ls "$O/$t/art" | wc -l) crash files, corpus $(ls "$O/$t/corpus" | wc -l) inputs; $(grep '^rc=' "$O/$t/log.txt")"
    for a in $(ls "$O/$t/art" | head -3); do echo "  $a"; grep -h -A3 "panicked" "$O/$t"/fuzz-*.log | head -8; done
  done
  exit 0
fi
D=$1; W=$2; S=$3; O=$4; mkdir -p "$O"
for t in ${TARGETS:-ir_text executable safetensors plan_validate fused_step}; do
  mkdir -p "$O/$t/corpus" "$O/$t/art"; cp -r "$D/corpus/$t/." "$O/$t/corpus/" 2>/dev/null
  extra=""; [ $t = plan_validate ] && extra="-max_len=4096 -timeout=10"; [ $t = fused_step ] && extra="-timeout=20 -max_len=256"
  ( cd "$O/$t" && nice -n 19 "$D/bin/$t" corpus -workers="$W" -jobs="$W" -max_total_time="$S" -artifact_prefix=art/ $extra > log.txt 2>&1
    echo "rc=$?" >> log.txt; times >> log.txt ) &
  echo $! >> "$O/pids"
done
