#!/usr/bin/env bash
# What one change to the generated code of gpt2's plain-attention softmax kernels would buy,
# measured before it is built into the generator (session 13: the division, docs/benchmarks.md).
# Timing only: a variant's numbers are not checked here (cuda_kernels checks what the generator
# makes). On a GPU machine with nvcc, from the repository root:
#
#   target/release/examples/kernel_dump gpt2:bf16 "[8, 12, 1024, 1024]" --no-fuse-attention --cu .devbin/cu
#   VARIANTS="base full fexp" bash scripts/kernel_experiment/run.sh .devbin/cu OUT.txt
#
# Variants: base (as generated); ieee (IEEE division, `/`); fdiv (__fdividef); full
# (div.full.f32, what the generator writes for bf16 kernels since session 13); mark (IEEE
# division through a reciprocal per call with a range fallback); fexp (__expf); cvt
# (cvt.rn.bf16.f32 for the bf16 rounding, NaN kept as before); all (fdiv, fexp and cvt). A
# division variant first writes every `ig_fdiv(a, b)` as `a / b`. Also prints each build's SASS
# line count. Session 13's table was measured on the kernels of commit 0faaf1c (before the
# generator's division changed), where `base` is IEEE division.
set -u
cu=$(cd "$1" && pwd); out=$(realpath -m "$2"); cd "$(dirname "$0")"
work=$(mktemp -d)
fwd=$(grep -l "float\* out0, float\* out1, unsigned short\* out2)" "$cu"/*.cu | head -1)
bwd=$(grep -L "float\* out0, float\* out1, unsigned short\* out2)" "$cu"/*.cu | head -1)
ieee='s/ig_fdiv\((v[0-9]+), (v[0-9]+)\)/\1 \/ \2/'
fdiv='s/const float (v[0-9]+) = (v[0-9]+) \/ (v[0-9]+);/const float \1 = __fdividef(\2, \3);/'
full='s/const float (v[0-9]+) = (v[0-9]+) \/ (v[0-9]+);/const float \1 = ig_div_full(\2, \3);/'
mark='s/const float (v[0-9]+) = (v[0-9]+) \/ (v[0-9]+);/const float \1 = ig_div_m(\2, \3);/'
cvt() { python3 - "$1" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
s = s.replace("  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);",
              '  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;')
open(p, "w").write(s)
PY
}
helpers='__device__ __forceinline__ float ig_div_full(float a, float b) { float q; asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b)); return q; }
__device__ __forceinline__ float ig_div_m(float x, float s) { const float r = __frcp_rn(s); const float q0 = x * r; const float e = fmaf(-s, q0, x); const float q = fmaf(e, r, q0); const float ax = fabsf(x), as = fabsf(s); if (ax <= 0x1p80f \&\& ax >= 0x1p-80f \&\& as <= 0x1p40f \&\& as >= 0x1p-40f) return q; return x / s; }'
for which in fwd bwd; do
  if [ $which = fwd ]; then f=$fwd; def=-DFWD; else f=$bwd; def=; fi
  [ -n "$f" ] || { echo "no $which kernel in $cu" >&2; continue; }
  name=$(basename "$f" .cu)
  th=$(grep -oE "__launch_bounds__\(([0-9]+)\)" "$f" | grep -oE "[0-9]+" | head -1)
  for v in ${VARIANTS:-base ieee fdiv full mark fexp cvt all}; do
    k=$work/k_${which}_$v.cu
    cp "$f" "$k"
    # The helpers go before the kernel (after the prelude).
    python3 - "$k" "$helpers" <<'PY'
import sys
p, h = sys.argv[1], sys.argv[2].replace("\\&", "&")
s = open(p).read(); at = s.index('extern "C" __global__')
open(p, "w").write(s[:at] + h + "\n" + s[at:])
PY
    case $v in
      ieee) sed -i -E "$ieee" "$k";;
      fdiv) sed -i -E "$ieee" "$k"; sed -i -E "$fdiv" "$k";;
      full) sed -i -E "$ieee" "$k"; sed -i -E "$full" "$k";;
      mark) sed -i -E "$ieee" "$k"; sed -i -E "$mark" "$k";;
      fexp) sed -i 's/expf(/__expf(/g' "$k";;
      cvt) cvt "$k";;
      all) sed -i -E "$ieee" "$k"; sed -i -E "$fdiv" "$k"; sed -i 's/expf(/__expf(/g' "$k"; cvt "$k";;
    esac
    exe=$work/h_${which}_$v
    nvcc -O3 -arch=sm_90 $def -DKFILE="\"$k\"" -DKNAME=$name -DTHREADS=$th -DKLABEL="\"$which\"" \
      -DVARIANT="\"$v\"" -o "$exe" harness.cu 2>&1 | grep -v warning | head -5
    "$exe" | tee -a "$out"
    cuobjdump -sass "$exe" | grep -cE "^\s+/\*[0-9a-f]{4}\*/" | sed "s/^/  sass lines: /" | tee -a "$out"
  done
done
rm -rf "$work"
