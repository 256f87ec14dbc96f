#!/bin/bash
# Session 41, helper G (issue 51): resnet50 224 b128 bf16 fitted to PyTorch's checkpointed
# peak P = 2,916,900,864 B and to 0.75 P = 2,187,675,648 B, OLD (main at the session's start)
# against NEW (branch s41-g: the fitter's elementwise candidates), executables compiled on the
# 2-core machine (`ingot compile --model resnet:depth=50,side=224,batch=128 --device cuda
# --precision bf16 [--budget B] -o E`, each binary its own), run here alternated with
# `ingot run E --device cuda --steps 10 --json`, the unfitted step beside them.
# usage: bash .device-bin/g/gpu-s41-g-script.sh  (files in .device-bin/g/: g.txz, device_prelude.sh)
X=/tmp/s41g; D=.device-bin/g; . $D/device_prelude.sh
END=${END:-200}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $D/g.txz $X
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
run() { # label, binary, executable: one JSON summary line per run
  local l=$1 b=$2 e=$3
  [ "$(left $END)" -gt 25 ] || { echo "$l: not run (time)"; return; }
  echo -n "$l: "
  timeout $(( $(left $END) - 5 )) $X/$b run $X/exe/$e --device cuda --steps 10 --json > $X/$l.json 2>$X/$l.err
  echo "rc=$? $(python3 $D/summ.py < $X/$l.json 2>/dev/null || tail -2 $X/$l.err)"
  cp $X/$l.json $OUT/ 2>/dev/null
}
run none-N new new-none.ingot; t
for round in 1 2; do
  run P-O$round old old-2916900864.ingot
  run P-N$round new new-2916900864.ingot
  run 75-O$round old old-2187675648.ingot
  run 75-N$round new new-2187675648.ingot
  t
done
run none-O old old-none.ingot; t
echo done
