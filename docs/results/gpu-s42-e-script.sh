#!/bin/bash
# Session 42, helper E's call (one H200, issue 46), run from the lead's checkout with
# .device-bin/e carried (bins.txz: new/ingot = branch s42-e, old/ingot = main at the session's
# start, s41/ingot = main at session 41's start, before the late-slice copies; unet/ = the
# U-Net exported in session 40 at batch 32, 64x64: det.onnx, PyTorch's weights and batch):
# 1. the U-Net's 30-step bf16 run, S41 OLD NEW alternated twice (median step, planned /
#    measured, last loss), every convolution's cuDNN choice (INGOT_LOG=1) side by side;
# 2. resnet50 224 b128 bf16 (10 steps) and cnn bf16 (30 steps), the two plans of the list that
#    change besides the U-Net (resnet18's is OLD's byte for byte), OLD and NEW alternated,
#    and the convolutions whose choice differs;
# 3. as time allows, resnet50's export seed 0 (r50_seed.py): Ingot NEW bf16 against torch.
X=/tmp/s42e; . scripts/device_prelude.sh
E=.device-bin/e; D=scripts/onnx_real_models; END=${END:-190}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $E/bins.txz $X
N=$X/new/ingot; O=$X/old/ingot; S=$X/s41/ingot; U=$X/unet
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
choices() { grep "^step: convolution" "$1" | sed 's/^step: //' | sort -t% -k2 -n; }
echo "== 1. U-Net bf16, 30 steps, S41 OLD NEW alternated $(t)"
for r in 1 2; do for b in S O N; do eval B=\$$b
  echo -n "$b: "; INGOT_LOG=1 timeout 60 $B train --onnx $U/det.onnx --loss mse --device cuda --precision bf16 --init $U/state_dict.safetensors --data $U/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$X/unet-$b-$r.err | python3 scripts/summ.py || tail -3 $X/unet-$b-$r.err
done; done
for b in S O N; do choices $X/unet-$b-1.err > $OUT/unet-choices-$b.txt; done
echo "-- U-Net convolutions, OLD | NEW (S41 in unet-choices-S.txt)"
paste -d'|' $OUT/unet-choices-O.txt $OUT/unet-choices-N.txt
echo "== 2. resnet50 224 b128 and cnn, OLD NEW alternated $(t)"
for m in "resnet:depth=50,side=224,batch=128 10" "cnn 30"; do set -- $m
  for r in 1 2; do for b in O N; do eval B=\$$b
    [ "$(left $END)" -gt 40 ] || { echo "$1 $b: not run (time)"; continue; }
    echo -n "$1 $b: "; INGOT_LOG=1 timeout $(( $(left $END) - 10 )) $B train --model $1 --device cuda --precision bf16 --steps $2 --json 2>$X/${1:0:8}-$b-$r.err | python3 scripts/summ.py || tail -3 $X/${1:0:8}-$b-$r.err
  done; done
  [ -f $X/${1:0:8}-N-1.err ] && { choices $X/${1:0:8}-O-1.err > $X/co.txt; choices $X/${1:0:8}-N-1.err > $X/cn.txt
    echo "$1: $(wc -l < $X/cn.txt) convolution passes, $(diff $X/co.txt $X/cn.txt | grep -c '^>') choices differ:"; diff $X/co.txt $X/cn.txt | head -12; }
done
echo "== 3. resnet50 export seed 0, NEW bf16 against torch $(t)"
if [ "$(left $END)" -gt 75 ]; then
  cp $E/r50_seed.py $D/r50_seed.py 2>/dev/null
  d=$X/r50s0
  timeout $(( $(left $END) - 50 )) python3 $D/r50_seed.py export 0 $d 2>&1 | grep -v -i 'warn\|deprecat' | tail -1
  timeout $(( $(left $END) - 25 )) python3 $D/r50_seed.py torch $d 2>&1 | grep -v -i 'warn\|deprecat' | tail -1
  timeout $(( $(left $END) - 3 )) $N train --onnx $d/det.onnx --loss cross-entropy --device cuda --precision bf16 --init $d/state_dict.safetensors --data $d/batch.safetensors --optimizer sgd --lr 0.01 --steps 5 --json 2>$d/err.txt | python3 $D/r50_seed.py compare $d || tail -3 $d/err.txt
else echo "not run (time)"; fi
echo "done $(t)"
