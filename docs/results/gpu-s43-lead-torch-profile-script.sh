source scripts/device_prelude.sh
t; nvidia-smi --query-gpu=name,driver_version --format=csv
python3 scripts/torch_resnet_profile.py --depth 50 --side 224 --batch 128 --steps 3 --top 70 > $OUT/torch-resnet50-profile.txt 2>&1; echo rc=$?
t; tail -80 $OUT/torch-resnet50-profile.txt
