#!/bin/bash
# Session 44, the lead's final call on one H200: the merged tree (NEW: main with branches
# s44-a..f and the lead's commits) against main at the session's start (OLD, 58aa6b4).
# - resnet50 224 b128 bf16 OLD and NEW alternating, two rounds, and NEW fitted to 0.75x the
#   torch.compile peak of session 43 (--budget 4397284992, compiled on the 2-core machine,
#   `ingot run`), beside torchvision under torch.compile (channels_last and NCHW; bf16 autocast,
#   cudnn.benchmark; scripts/resnet_beside_torch.py) in the same call: issue 48's step and
#   memory ratios. The torch programs compile while Ingot runs; every timed run holds one flock.
# - gpt2 and resnet18 bf16 OLD and NEW alternating.
# - The 1.3B GPT bf16 AdamW at --budget 16GiB (offload), compiled here by NEW (issue 51).
# - GPU tests of what changed, INGOT_REQUIRE_GPU=1, while time is left.
# usage: END=440 bash docs/results/gpu-s44-final-script.sh  (.device-bin/final/final.txz)
X=/tmp/s44f; . scripts/device_prelude.sh
END=${END:-440}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/final/final.txz $X
N=$X/new; O=$X/old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
LOCK=$X/gpu.lock; : > $LOCK
for m in cl nchw; do f=""; [ $m = nchw ] && f=--nchw
  ( timeout $(left 300) python3 scripts/resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16 $f \
      --lock $LOCK > $X/torch-$m.txt 2>&1; echo "rc=$? [t=$(( $(date +%s) - START )) s]" >> $X/torch-$m.txt ) &
  eval P_$m=$!
done
# issue 46: resnet50 at real size in f32 from torchvision's zero_init_residual start, exported
# on the CPU beside the timings (f32_real.py, as helper E's call ran resnet18, GPT-2 and BERT)
( CUDA_VISIBLE_DEVICES= BATCH=8 taskset -c 8-15 timeout 150 python3 scripts/onnx_real_models/f32_real.py \
    export resnet50 $X/r50x > $X/r50x-export.log 2>&1; echo "export rc=$?" >> $X/r50x-export.log ) &
EXP=$!
run() { # label, timeout, binary, args...: one summary line, under the lock
  local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; flock $LOCK timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err
}
R50="--model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json"
echo "== resnet50 224 b128 bf16, 10 steps, round 1"
run "resnet50 O" 60 $O/ingot train $R50
run "resnet50 N" 60 $N/ingot train $R50
run "resnet50@0.75torch N" 60 $N/ingot run $N/r50f.ingot --device cuda --steps 10 --json
t
echo "== gpt2 bf16 SGD lr 0.01, 20 steps"
for b in O N O N; do eval B=\$$b
  run "gpt2 $b" 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json
done; t
echo "== resnet18 (CIFAR) bf16, 30 steps"
for b in O N O N; do eval B=\$$b
  run "resnet18 $b" 30 $B/ingot train --model resnet18 --device cuda --precision bf16 --steps 30 --json
done; t
echo "== resnet50 round 2"
run "resnet50 O" 60 $O/ingot train $R50
run "resnet50 N" 60 $N/ingot train $R50
run "resnet50@0.75torch N" 60 $N/ingot run $N/r50f.ingot --device cuda --steps 10 --json
t
echo "== resnet50 f32 at 224, batch 8, zero_init_residual, 5 steps: Ingot against PyTorch's strict f32"
wait $EXP; grep -v -i "warn\|deprecat" $X/r50x-export.log | tail -2
o=$X/r50x; F="python3 scripts/onnx_real_models/f32_real.py"
BATCH=8 flock $LOCK timeout 90 $F torch resnet50 $o --zir 2>&1 | grep -v -i "warn\|deprecat" | tail -1
flock $LOCK timeout 90 $N/ingot train --onnx $o/det.onnx --loss cross-entropy --device cuda --optimizer sgd --lr 0.01 \
  --precision f32 --init $o/state_dict_zir.safetensors --data $o/batch.safetensors --steps 5 --json 2>$o/f32.err > $o/f32.json || tail -3 $o/f32.err
BATCH=8 $F compare resnet50 $o --zir < $o/f32.json
t
wait $P_cl; echo "== torch.compile channels_last"; grep -E "^\{|rc=|Error|peak|median" $X/torch-cl.txt | tail -3
wait $P_nchw; echo "== torch.compile NCHW"; grep -E "^\{|rc=|Error|peak|median" $X/torch-nchw.txt | tail -3
t
echo "== the 1.3B GPT bf16 AdamW at 16 GiB (offload), NEW, 5 steps"
run "gpt13@16GiB N" 90 $N/ingot run $N/gpt13-16.ingot --device cuda --steps 5 --json
t
echo "== GPU tests"
gpu_test_lane 0 $((END-10)) $N cuda_attention cuda_channels_last
cat $X/lane_tests.txt; t; echo done
