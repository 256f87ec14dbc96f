#!/bin/bash
# Session 26, call C: the merged tree on one H200. Parts in order of need, each under a
# timeout, skipped once the call's time is spent. OLD = main before the session's merges
# (the binary of calls A and B), NEW = the merged tree.
START=$(date +%s)
OLD=$PWD/.devbin/ingot_old
NEW=$PWD/.devbin/ingot
S=$PWD/scripts
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== 1. gpt2 bf16, old and new alternating (the first run of each compiles its kernels)"
for r in 1 2; do for b in OLD NEW; do
  s=$(date +%s); printf "%s run %s: " $b $r
  timeout 120 ${!b} train --model gpt2 --device cuda --precision bf16 --steps 30 --json 2>/tmp/gpt2.err | python3 $S/summ.py || tail -3 /tmp/gpt2.err
  echo "   wall $(( $(date +%s) - s )) s"
done; done; t
echo "== 2. efficientnet_b0 imported, batch 32, bf16, new binary: cold then warm PTX cache"
BATCH=32 DET_ONLY=1 timeout 100 python3 $S/onnx_real_models/models.py efficientnet_b0 /tmp/eff 2>&1 | grep -v -i "warn\|deprecat" | tail -1
for k in cold warm; do
  s=$(date +%s); printf "%s: " $k
  INGOT_CACHE_DIR=/tmp/ptx-eff timeout 150 $NEW train --onnx /tmp/eff/det.onnx --loss cross-entropy --device cuda --precision bf16 --init /tmp/eff/state_dict.safetensors --data /tmp/eff/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>/tmp/eff.err | tee /tmp/eff-$k.json | python3 $S/summ.py || tail -3 /tmp/eff.err
  python3 -c "import json,sys; print('   first losses', [round(json.loads(l)['loss'],6) for l in open('/tmp/eff-$k.json') if l.startswith('{') and '\"loss\"' in l][:5])"
  echo "   wall $(( $(date +%s) - s )) s"
done; t
if left 330; then
echo "== 3. built-in resnet50 224, batch 128, bf16: ingot, then torchvision + torch.compile channels_last"
timeout 120 $NEW train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 30 --json 2>/tmp/r50.err | python3 $S/summ.py || tail -3 /tmp/r50.err
timeout 150 python3 $S/resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16 2>&1 | grep "^{" ; t
fi
if left 400; then
echo "== 4. resnet50 224 batch 128 bf16 from an image folder of generated JPEGs (1000 classes x 3, ~400x350) against its fixed batch, 16 threads"
timeout 60 python3 $S/make_image_folder.py /tmp/imgs1k --classes 1000 --per-class 3 2>&1 | tail -1
INGOT=$NEW WARMUP=30 timeout 150 bash $S/image_folder_bench.sh resnet:depth=50,side=224,batch=128,classes=1000 /tmp/imgs1k 150 -- --device cuda --precision bf16 2>&1 | tail -4; t
fi
if left 470; then
echo "== 5. imported resnet50 (torchvision export), batch 128, bf16"
BATCH=128 DET_ONLY=1 timeout 100 python3 $S/onnx_real_models/models.py resnet50 /tmp/r50i 2>&1 | grep -v -i "warn\|deprecat" | tail -1
timeout 100 $NEW train --onnx /tmp/r50i/det.onnx --loss cross-entropy --device cuda --precision bf16 --init /tmp/r50i/state_dict.safetensors --data /tmp/r50i/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>/tmp/r50i.err | python3 $S/summ.py || tail -3 /tmp/r50i.err; t
fi
echo "done"; t
