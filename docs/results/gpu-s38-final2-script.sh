#!/bin/bash
# Session 38, the lead's second final call (the same two-H200 host, warm, the same binaries as
# gpu-s38-final-script.sh): the fuzz targets again from the corpora the first call grew
# (corpus1.txz), 6 workers each at nice 19, so that each target's CPU seconds over the two
# calls pass an hour; beside them the GPU tests the first call had no time for, two lanes.
# usage: END=140 bash docs/results/gpu-s38-final2-script.sh
X=/tmp/s38fin2; . scripts/device_prelude.sh
L=.device-bin/lead
unpack() { python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"; }
mkdir -p $X/new && unpack $L/new.txz $X/new && unpack $L/fuzz.txz $X && unpack $L/corpus1.txz $X/grown
for t in ir_text executable safetensors plan_validate fused_step; do cp -r $X/grown/$t/corpus/. $X/fuzzpack/corpus/$t/; done
N=$X/new; END=${END:-140}; W=${W:-6}
FUZZ_S=$(( $(left $END) - 12 ))
bash scripts/fuzz_run.sh $X/fuzzpack $W $FUZZ_S $X/fz
echo "fuzzing: 5 targets x $W workers, $FUZZ_S s, nice 19, from the grown corpora"; t
gpu_test_lane 0 $(( END - 6 )) $N test_cuda_kernels test_cuda_offload test_cuda_eval test_cuda_generate & A=$!
X0=$X; X=$X/l1; mkdir -p $X; gpu_test_lane 1 $(( END - 6 )) $N test_cuda_attention test_cuda_channels_last test_cuda_cudnn & B=$!
wait $A; wait $B; X=$X0
echo "== GPU tests (NEW)"; cat $X/lane_tests.txt $X/l1/lane_tests.txt; t
for p in $(cat $X/fz/pids); do while kill -0 $p 2>/dev/null; do sleep 2; done; done
echo "== fuzzing"; bash scripts/fuzz_run.sh --summary $X/fz; t; echo done
