X=/tmp/lead1; source scripts/device_prelude.sh
L=.device-bin/lead1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; t
echo "== cudnn_offers"
$L/cudnn_offers $L/*.exe > $X/offers.txt 2>&1; cp $X/offers.txt $OUT/offers.txt
grep "convolutions," $X/offers.txt; t
echo "== ingot run each executable, 10 steps (synthetic batch; the U-Net with PyTorch's weights and batch)"
for e in unet cnn resnet18 mobilenet_v3_small efficientnet_b0 convnext_tiny resnet_depth_18_side_224_batch_128 resnet_depth_50_side_224_batch_128; do
  [ $(left 140) -gt 15 ] || { echo "$e: not run (time)"; continue; }
  extra=""; [ $e = unet ] && extra="--init $L/state_dict.safetensors --data $L/batch.safetensors"
  echo -n "$e: "; timeout $(left 140) $L/ingot run $L/$e.exe --device cuda --steps 10 --json $extra 2>$X/err.txt | python3 scripts/summ.py || tail -2 $X/err.txt
done; t
