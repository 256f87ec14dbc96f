export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))" 2>/dev/null):$LD_LIBRARY_PATH
for t in cuda_depthwise; do
INGOT_REQUIRE_GPU=1 timeout 60 .device-bin/dbg/$t --test-threads=1 --nocapture 2>&1 | cut -c1-2500 | tee $OUT/$t.txt | grep -E "^test |test result|panicked|step [0-9]" | head -30
done
