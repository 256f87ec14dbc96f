#!/bin/bash
# Session 43, helper E's call (one H200, issue 46), run from the lead's checkout with
# .device-bin/e carried (bins.txz: new/ingot = branch s43-e, old/ingot = main at the session's
# start; dw.ir, a stem, a dense and two depthwise convolutions):
# 1. resnet50 exported as scripts/onnx_real_models/bench.sh exports it (models.py, deterministic,
#    batch 32: weights, batch, PyTorch's strict f32 losses);
# 2. bench.sh's row for NEW: beside_torch.py (PyTorch's bf16 autocast losses, torch.compile's
#    channels_last step and peak), NEW's 30 bf16 steps | compare_bf16.py, and the same 5 losses
#    against torch's strict f32 (r50_seed.py compare); NEW's 5 f32 steps against torch's strict
#    f32 (the graph); where the gap is over 1%, torch's own bf16 spread (channels_last against
#    NCHW, eager);
# 3. the imported resnet50 and the built-in resnet:depth=50,side=224,batch=32, bf16, SGD lr 0.01,
#    20 steps (`ingot run` of each compiled once), NEW and OLD alternated, two rounds (median
#    step, planned / measured), each convolution's path (INGOT_LOG=1);
# 4. dw.ir on CUDA bf16, INGOT_LOG=1, OLD and NEW (each convolution's path as logged), then NEW
#    with INGOT_CONV_TIMING=1 (the depthwise kernels timed against cuDNN's candidates).
X=/tmp/s43e; . scripts/device_prelude.sh
E=.device-bin/e; D=scripts/onnx_real_models; END=${END:-172}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $E/bins.txz $X
N=$X/new/ingot; O=$X/old/ingot; r=$X/resnet50; mkdir -p $r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
IMP="--onnx $r/det.onnx --loss cross-entropy --init $r/state_dict.safetensors --data $r/batch.safetensors"
SGD="--device cuda --optimizer sgd --lr 0.01"
echo "== 1. resnet50 exported as bench.sh does (batch 32) $(t)"
BATCH=32 DET_ONLY=1 timeout 60 python3 $D/models.py resnet50 $r 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -2
echo "== 2. bench.sh's resnet50 row, NEW $(t)"
timeout 110 python3 $D/beside_torch.py resnet50 $r 2>&1 | grep -v -i "warn\|deprecat" | tail -2
timeout 60 $N train $IMP $SGD --precision bf16 --steps 30 --json 2>$r/ingot.err > $r/ingot.json || tail -3 $r/ingot.err
python3 $D/compare_bf16.py resnet50 $r < $r/ingot.json | tee $X/row.txt
python3 -c "import json; a=json.load(open('$r/torch_losses.json')); b=json.load(open('$r/torch_bf16.json')); json.dump({'f32': a['losses'], 'bf16': b['bf16_losses']}, open('$r/torch.json', 'w'))"
python3 $D/r50_seed.py compare $r < $r/ingot.json
cp $r/torch.json $r/torch_bf16.json $OUT/ 2>/dev/null
echo "-- the graph: NEW f32 (tf32 off) against torch strict f32, 5 steps $(t)"
  timeout 40 $N train $IMP $SGD --precision f32 --steps 5 --json 2>$r/f32.err > $r/f32.json || tail -3 $r/f32.err
  python3 - $r <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from summ import read_run
r = sys.argv[1]
ing, _ = read_run(open(f"{r}/f32.json"))
t = json.load(open(f"{r}/torch.json"))["f32"]
d = [abs(a - b) / abs(b) for a, b in zip(ing[:5], t)]
print(f"ingot f32 {[round(v, 6) for v in ing[:5]]} torch f32 {[round(v, 6) for v in t]}: largest relative difference {max(d):.2e}")
PY
if grep -q OVER $X/row.txt && [ "$(left $END)" -gt 100 ]; then
  echo "-- torch's own bf16 spread: bf16 autocast eager, channels_last against NCHW $(t)"
  timeout 40 python3 - $r <<'PY' 2>&1 | grep -v -i "warn\|deprecat"
import json, sys, torch, torch.nn.functional as F
from safetensors.torch import load_file
sys.path[:0] = ["scripts/onnx_real_models", "scripts"]
from models import LR, build
r = sys.argv[1]
sd, b = load_file(f"{r}/state_dict.safetensors"), load_file(f"{r}/batch.safetensors")
x, y = b["x"].cuda(), b["y"].cuda()
torch.backends.cudnn.benchmark = True
m = build("resnet50", True); m.load_state_dict(sd); m = m.cuda().train().to(memory_format=torch.channels_last)
xc = x.contiguous(memory_format=torch.channels_last)
opt = torch.optim.SGD(m.parameters(), lr=LR); ls = []
for _ in range(5):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        l = F.cross_entropy(m(xc), y)
    l.backward(); opt.step(); ls.append(l.item())
t = json.load(open(f"{r}/torch.json"))
for k in ("bf16", "f32"):
    d = max(abs(a - c) / abs(c) for a, c in zip(ls, t[k]))
    print(f"torch bf16 channels_last {[round(v, 5) for v in ls]}: largest relative difference to torch {k} (NCHW) {d:.2e}")
PY
fi
echo "== 3. imported resnet50 against the built-in resnet:depth=50,side=224,batch=32, bf16, 20 steps $(t)"
# Each compiled once here by NEW (NEW's compiler is OLD's), then run by each binary.
$N compile --onnx $r/det.onnx --loss cross-entropy $SGD --precision bf16 -o $X/imported.ingot 2>&1 | tail -1
$N compile --model resnet:depth=50,side=224,batch=32 $SGD --precision bf16 -o $X/built-in.ingot 2>&1 | tail -1
for round in 1 2; do for b in N O; do eval B=\$$b
  for m in imported built-in; do
    [ "$(left $END)" -gt 20 ] || { echo "$m $b round $round: not run (time)"; continue; }
    case $m in imported) data="--init $r/state_dict.safetensors --data $r/batch.safetensors";; *) data="";; esac
    echo -n "$m $b: "
    INGOT_LOG=1 timeout $(( $(left $END) - 10 )) $B run $X/$m.ingot --device cuda $data --steps 20 --json 2>$X/$m-$b-$round.err | python3 scripts/summ.py || tail -3 $X/$m-$b-$round.err
  done
done; done
for m in imported built-in; do [ -f $X/$m-N-1.err ] && grep "^step: convolution" $X/$m-N-1.err | sed 's/^step: convolution %[0-9]* //; s/, workspace.*//' | sort | uniq -c | sort -rn > $OUT/r50-$m-choices.txt && echo "$m: $(grep -c '^step: convolution' $X/$m-N-1.err) convolution passes; $(head -c 600 $OUT/r50-$m-choices.txt | tr '\n' ';')"; done
echo "== 4. dw.ir, CUDA bf16, 3 steps, INGOT_LOG=1 $(t)"
for b in O N; do eval B=\$$b
  [ "$(left $END)" -gt 8 ] || { echo "$b: not run (time)"; continue; }
  INGOT_LOG=1 timeout 20 $B train --model-file $E/dw.ir --device cuda --precision bf16 --steps 3 --json 2>$OUT/dw-$b.err | python3 scripts/summ.py
  echo "$b: $(grep -c 'direct depthwise kernels' $OUT/dw-$b.err) logged as direct depthwise kernels, $(grep -c 'im2col + cuBLAS' $OUT/dw-$b.err) as im2col + cuBLAS, $(grep -c ': cuDNN ' $OUT/dw-$b.err) through cuDNN"
done
[ "$(left $END)" -gt 8 ] && { INGOT_LOG=1 INGOT_CONV_TIMING=1 timeout 20 $N train --model-file $E/dw.ir --device cuda --precision bf16 --steps 3 --json 2>$OUT/dw-N-timing.err | python3 scripts/summ.py
  echo "N timed: $(grep -c 'timed: direct' $OUT/dw-N-timing.err) convolutions with the direct kernels timed, $(grep -c 'timed: none' $OUT/dw-N-timing.err) with no fallback"; grep "^step:" $OUT/dw-N-timing.err | cut -c1-260; }
echo "done $(t)"
