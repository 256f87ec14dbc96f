#!/bin/bash
# Session 41, helper E's call (one H200, issue 46), run from the lead's checkout with
# .device-bin/e carried (bins.txz: new/ingot = branch s41-e, old/ingot = main at the session's
# start; r50_seed.py = scripts/onnx_real_models/r50_seed.py):
# 1. bench.sh for NEW on the U-Net: bf16 losses against PyTorch's, Ingot's step beside
#    torch.compile's, planned = measured, torch.compile's peak; then the U-Net's step, OLD and
#    NEW alternated (30 steps each, twice).
# 2. bench.sh for NEW on convnext_tiny (its plan is OLD's, byte for byte).
# 3. resnet50 on two other seeds' weights and batches (exported on the CPU while 1 runs):
#    Ingot bf16 (NEW) against torch bf16 and torch f32, as time allows.
X=/tmp/s41e; . scripts/device_prelude.sh
E=.device-bin/e; D=scripts/onnx_real_models; END=${END:-262}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $E/bins.txz $X
N=$X/new; O=$X/old
cp $E/r50_seed.py $D/r50_seed.py
( for s in 1 2; do nice -n 19 python3 $D/r50_seed.py export $s $X/r50s$s 2>&1 | grep -v -i 'warn\|deprecat' | tail -1; done > $X/seeds.txt 2>&1 ) & PS=$!
echo "== 1. bench.sh, NEW, unet $(t)"
MODELS="unet" WORK=$X/b BIN=$N/ingot bash $D/bench.sh 2>&1 | grep -v -i 'warn\|deprecat'
python3 -c "import json; d=json.load(open('$X/b/unet/torch_bf16.json')); print('unet torch.compile peak allocated', d['compile_peak_allocated'], 'B, reserved', d['compile_peak_reserved'], 'B')"
echo "-- U-Net, OLD and NEW alternated $(t)"
o=$X/b/unet
for r in 1 2; do for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 60 $B/ingot train --onnx $o/det.onnx --loss mse --device cuda --precision bf16 --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$o/err.txt | python3 $D/compare_bf16.py unet $o || tail -3 $o/err.txt
done; done
for b in O N; do eval B=\$$b; echo -n "$b plan: "; $B/ingot plan --onnx $o/det.onnx --loss mse --device cuda --precision bf16 | grep "total (one"; done
echo "== 2. bench.sh, NEW, convnext_tiny $(t)"
MODELS="convnext_tiny" WORK=$X/b BIN=$N/ingot bash $D/bench.sh 2>&1 | grep -v -i 'warn\|deprecat'
echo "== 3. resnet50, other seeds $(t)"
wait $PS; cat $X/seeds.txt
for s in 1 2; do
  [ "$(left $END)" -gt 45 ] || { echo "seed $s: not run (time)"; continue; }
  d=$X/r50s$s
  timeout $(( $(left $END) - 5 )) python3 $D/r50_seed.py torch $d 2>&1 | grep -v -i 'warn\|deprecat' | tail -1
  timeout $(( $(left $END) - 3 )) $N/ingot train --onnx $d/det.onnx --loss cross-entropy --device cuda --precision bf16 --init $d/state_dict.safetensors --data $d/batch.safetensors --optimizer sgd --lr 0.01 --steps 5 --json 2>$d/err.txt | python3 $D/r50_seed.py compare $d || tail -3 $d/err.txt
done
echo "done $(t)"
