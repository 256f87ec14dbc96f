#!/bin/bash
# Session 40, the lead's first call, on two H200s, main at its start (2219ce8):
# 1. issue 47's last GPU checks: test_cuda_ranks and test_cuda_nccl (both GPUs), then
#    test_cuda_random_graphs to its end on GPU 0 (INGOT_REQUIRE_GPU=1, one test thread);
# 2. beside it on GPU 1, issue 46's table rows for the imported transformers (gpt2, bert), which
#    nothing in this session changes: bench.sh's export, PyTorch's bf16 losses and torch.compile
#    step and memory, then Ingot's 30 bf16 steps from the same weights and batch.
# usage: END=570 bash docs/results/gpu-s40-early-script.sh  (.device-bin/lead/early.txz)
X=/tmp/s40e; . scripts/device_prelude.sh
END=${END:-570}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/lead/early.txz $X
N=$X/bin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
echo "== two-GPU tests"
for tb in test_cuda_ranks test_cuda_nccl; do
  s=$(date +%s)
  INGOT_REQUIRE_GPU=1 timeout 150 $N/$tb --test-threads=1 > $X/$tb.txt 2>&1
  echo "$tb rc=$? $(( $(date +%s) - s )) s: $(grep -E '^test result' $X/$tb.txt | tail -1)"
  grep -E "FAILED|panicked" $X/$tb.txt | head -5; cp $X/$tb.txt $OUT/
done; t
gpu_test_lane 0 $(( END - 10 )) $N test_cuda_random_graphs & P0=$!
( export CUDA_VISIBLE_DEVICES=1; MODELS="gpt2 bert" BUDGET_S=$(( $(left $END) - 150 )) WORK=$X/bench BIN=$N/ingot \
    bash scripts/onnx_real_models/bench.sh > $OUT/table-transformers.txt 2>&1 ) & P1=$!
wait $P1; echo "== table rows (GPU 1)"; cat $OUT/table-transformers.txt; t
wait $P0; echo "== random graphs (GPU 0)"; cat $X/lane_tests.txt; cp $X/test_cuda_random_graphs.txt $OUT/ 2>/dev/null; t
echo done
