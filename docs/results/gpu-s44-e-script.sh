#!/bin/bash
# Session 44, helper E's call (one H200, issue 46), run from the lead's checkout with
# .device-bin/e carried (bins.txz: new/ingot = branch s44-e, old/ingot = main at the session's
# start; f32_real.py = scripts/onnx_real_models/f32_real.py; fx/ = the pad fixtures;
# device_prelude.sh):
# 0. in the background, pinned to cores 8-15 and without the GPU: resnet18 (batch 8, 224),
#    GPT-2 124M and BERT base (sequence 128, batch 4) exported at their real widths
#    (f32_real.py export: weights, batch; a ResNet's zero_init_residual weights beside);
# 1. first, on cores 0-7: resnet50 exported at batch 32 as bench.sh exports it (no GPU), then the
#    imported resnet50 and the built-in resnet:depth=50,side=224,batch=32, bf16, SGD lr 0.01,
#    each compiled once by NEW, run 20 steps by NEW and OLD alternated, two rounds (median step,
#    planned / measured);
# 2. resnet18 (plain and zero_init_residual), GPT-2 124M, BERT base: PyTorch strict f32 (TF32
#    off) 5 SGD steps, then NEW `--precision f32` 5 steps from the same weights and batch;
# 3. the dynamo exporter here: onnxscript's version; the pad fixtures on CUDA (NEW, f32, 5
#    steps) against PyTorch's CPU losses; resnet18, GPT-2 and BERT (small configs) exported with
#    dynamo=True at onnx's newest opset, `ingot onnx check` (NEW) on each.
X=/tmp/s44e; . .device-bin/e/device_prelude.sh
E=.device-bin/e; END=${END:-222}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $E/bins.txz $X
N=$X/new/ingot; O=$X/old/ingot; R=$X/resnet50; F="python3 $E/f32_real.py"
if command -v taskset >/dev/null; then P0="taskset -c 0-7"; P1="taskset -c 8-15"; else P0=""; P1=""; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
python3 -c "import torch, torchvision, transformers, onnx; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'onnx', onnx.__version__, 'newest opset', onnx.defs.onnx_opset_version())" 2>&1 | tail -1
python3 -c "import onnxscript; print('onnxscript', onnxscript.__version__)" 2>&1 | tail -1
# 0. the exports for part 2, beside part 1 on other cores, no GPU
( export CUDA_VISIBLE_DEVICES=
  BATCH=8 $P1 $F export resnet18 $X/resnet18
  BATCH=4 $P1 $F export gpt2_124m $X/gpt2_124m
  BATCH=4 $P1 $F export bert_base $X/bert_base
  echo "exports done $(t)" ) > $X/exports.log 2>&1 &
EXP=$!
echo "== 1. imported resnet50 against the built-in, bf16, batch 32, 20 steps $(t)"
CUDA_VISIBLE_DEVICES= BATCH=32 $P0 timeout 60 $F export resnet50 $R 2>&1 | grep -v -i "warn\|deprecat" | tail -1
SGD="--device cuda --optimizer sgd --lr 0.01"
$P0 $N compile --onnx $R/det.onnx --loss cross-entropy $SGD --precision bf16 -o $X/imported.ingot 2>&1 | tail -1
$P0 $N compile --model resnet:depth=50,side=224,batch=32 $SGD --precision bf16 -o $X/built-in.ingot 2>&1 | tail -1
echo "compiled $(t)"
for round in 1 2; do for b in N O; do eval B=\$$b
  for m in imported built-in; do
    [ "$(left $END)" -gt 95 ] || { echo "$m $b round $round: not run (time)"; continue; }
    case $m in imported) data="--init $R/state_dict.safetensors --data $R/batch.safetensors";; *) data="";; esac
    echo -n "$m $b round $round: "
    $P0 timeout 40 $B run $X/$m.ingot --device cuda $data --steps 20 --json 2>$X/$m-$b-$round.err | python3 scripts/summ.py || tail -3 $X/$m-$b-$round.err
  done
done; done
echo "== 2. f32 at real size against PyTorch's strict f32, 5 steps $(t)"
wait $EXP; cat $X/exports.log | grep -v -i "warn\|deprecat\|eos_token" | tail -4
for spec in "resnet18 8 " "resnet18 8 --zir" "gpt2_124m 4 " "bert_base 4 "; do
  set -- $spec; name=$1; b=$2; zir=${3:-}; o=$X/$name
  [ "$(left $END)" -gt 25 ] || { echo "$name $zir: not run (time)"; continue; }
  case $name in
    bert*) extra="--loss cross-entropy --input-value attention_mask=1 --input-value token_type_ids=0";;
    *) extra="--loss cross-entropy";;
  esac
  sd=$o/state_dict${zir:+_zir}.safetensors
  BATCH=$b timeout 40 $F torch $name $o $zir 2>&1 | grep -v -i "warn\|deprecat\|eos_token" | tail -1
  timeout $(( $(left $END) - 10 )) $N train --onnx $o/det.onnx $extra $SGD --precision f32 --init $sd --data $o/batch.safetensors --steps 5 --json 2>$o/f32${zir:+_zir}.err > $o/f32${zir:+_zir}.json || tail -3 $o/f32${zir:+_zir}.err
  BATCH=$b $F compare $name $o $zir < $o/f32${zir:+_zir}.json
done
echo "== 3. the pad fixtures on CUDA (NEW, f32, 5 steps) $(t)"
for f in pad dynamo_pad; do
  [ "$(left $END)" -gt 12 ] || { echo "$f: not run (time)"; continue; }
  d=$E/fx/$f
  timeout 20 $N train --onnx $d/model.onnx --loss cross-entropy --device cuda --precision f32 --optimizer sgd --lr 0.1 --init $d/init.safetensors --data $d/batch.safetensors --steps 5 --json 2>$X/$f.err > $X/$f.json || tail -2 $X/$f.err
  python3 - $X/$f.json $d/losses.json $f <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from summ import read_run
ing, _ = read_run(open(sys.argv[1])); t = json.load(open(sys.argv[2]))["losses"]
d = max(abs(a - b) / abs(b) for a, b in zip(ing[:5], t)) if len(ing) >= 5 else float("nan")
print(f"{sys.argv[3]}: CUDA f32 {[round(v, 6) for v in ing[:5]]} against PyTorch's CPU {[round(v, 6) for v in t]}: largest relative difference {d:.2e}")
PY
done
echo "== 3. dynamo=True exports at the newest opset, ingot onnx check $(t)"
for name in resnet18 gpt2 bert; do
  [ "$(left $END)" -gt 15 ] || { echo "$name dynamo: not run (time)"; continue; }
  case $name in bert) extra="--loss cross-entropy --input-value attention_mask=1 --input-value token_type_ids=0 --class-axis last";; gpt2) extra="--loss cross-entropy --class-axis last";; *) extra="--loss cross-entropy";; esac
  CUDA_VISIBLE_DEVICES= BATCH=2 SEQ=32 timeout $(( $(left $END) - 8 )) $F export $name $X/dyn_$name --dynamo > $X/dyn_$name.log 2>&1; echo "$name: export rc=$? $(grep -i "error\|exported" $X/dyn_$name.log | tail -1 | cut -c1-300)"
  [ -f $X/dyn_$name/dynamo.onnx ] && python3 -c "import onnx,sys; m=onnx.load(sys.argv[1], load_external_data=False); print('opsets', [(o.domain, o.version) for o in m.opset_import], 'ops', sorted({n.op_type for n in m.graph.node}))" $X/dyn_$name/dynamo.onnx
  [ -f $X/dyn_$name/dynamo.onnx ] && timeout 20 $N onnx check $X/dyn_$name/dynamo.onnx $extra 2>&1 | tail -6
done
echo "done $(t)"
