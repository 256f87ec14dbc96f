X=/tmp/lead2; source scripts/device_prelude.sh
L=.device-bin/lead2
for b in old new; do echo "== $b"; timeout 50 $L/cuda_profile_$b resnet18 --precision bf16 --top 12 2>&1 | grep -v "^ *$" | head -40; t; done
