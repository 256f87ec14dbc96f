//! bf16 in the CUDA generator, checked on the host: the prelude's rounding helpers, compiled by
//! the host's C++ compiler and run, give `half`'s bits (and `bf16_from_f64`'s for doubles and
//! integers); the generated text holds bf16 in `unsigned short` memory and float registers, and
//! rounds exactly where the CPU's fused executor does (every bf16 index, unary and binary
//! result and every conversion to bf16; a bf16 reduction once, after its threads combine).

use ingot_kernels::cuda::{self, Strategy, PRELUDE_BF16};
use ingot_kernels::dtype::{bf16, bf16_from_f64};
use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::{BinaryOp, DType, ReduceOp, UnaryOp};
use ingot_testkit::cxx;
use ingot_testkit::kernel_builder::KernelBuilder as B;
use ingot_testkit::text::assert_mentions;

// ---------------------------------------------------------------------------------------------
// The prelude's helpers, run on the host.

/// The includes of the host program of the bf16 helpers (the CUDA built-ins they use, the bit
/// casts, are [`cxx::CUDA_ON_HOST`]'s).
const HOST_SHIM: &str = r#"#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
"#;

/// Reads records from stdin and writes the helpers' results to stdout: mode `f` reads u32 bit
/// patterns and writes `ig_bf16_bits(x)` and `ig_narrow(ig_round(x))` (u16 each); mode `e`
/// reads u32 bit patterns and writes `ig_exp_formula(x)`'s bits (u32); mode `d`
/// reads f64s and writes `ig_to_bf16(x)`'s float bits (u32); mode `i` reads i64s and writes
/// `ig_to_bf16((long long)x)` and `ig_to_bf16((int)x)` (u32 each).
const HOST_MAIN: &str = r#"
int main(int argc, char** argv) {
  const char mode = argv[1][0];
  if (mode == 'f') {
    unsigned u;
    while (std::fread(&u, 4, 1, stdin) == 1) {
      const float x = __uint_as_float(u);
      const unsigned short a = ig_bf16_bits(x), b = ig_narrow(ig_round(x));
      std::fwrite(&a, 2, 1, stdout);
      std::fwrite(&b, 2, 1, stdout);
    }
  } else if (mode == 'e') {
    unsigned u;
    while (std::fread(&u, 4, 1, stdin) == 1) {
      const unsigned a = __float_as_uint(ig_exp_formula(__uint_as_float(u)));
      std::fwrite(&a, 4, 1, stdout);
    }
  } else if (mode == 'd') {
    double x;
    while (std::fread(&x, 8, 1, stdin) == 1) {
      const unsigned a = __float_as_uint(ig_to_bf16(x));
      std::fwrite(&a, 4, 1, stdout);
    }
  } else {
    long long x;
    while (std::fread(&x, 8, 1, stdin) == 1) {
      const unsigned a = __float_as_uint(ig_to_bf16(x));
      const unsigned b = __float_as_uint(ig_to_bf16((int)x));
      std::fwrite(&a, 4, 1, stdout);
      std::fwrite(&b, 4, 1, stdout);
    }
  }
  return argc > 1 ? 0 : 1;
}
"#;

/// Builds the helpers' host program; `None` (after saying so) without a C++ compiler.
fn helpers_program() -> Option<std::path::PathBuf> {
    let cxx = cxx::host_cxx_or_skip()?;
    let src = format!(
        "{HOST_SHIM}{}using std::fabs;\n{PRELUDE_BF16}{HOST_MAIN}",
        cxx::CUDA_ON_HOST
    );
    // No -ffast-math: IEEE arithmetic, as NVRTC's defaults give for these operations.
    let flags = ["-std=c++17", "-O2", "-Wall", "-Werror"];
    let exe = cxx::compile(cxx, "ingot_cuda_bf16", "helpers.cpp", &src, &flags)
        .unwrap_or_else(|e| panic!("the bf16 prelude does not compile on the host: {e}"));
    Some(exe)
}

fn run(exe: &std::path::Path, mode: &str, input: Vec<u8>) -> Vec<u8> {
    let out = cxx::run_fed(exe, &[mode], input);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn the_prelude_rounds_to_bf16_exactly_as_half_does_nan_and_ties_included() {
    let Some(exe) = helpers_program() else { return };
    // Every sign, exponent and high mantissa, with low halves around the tie (and NaNs of
    // every payload the high half gives, quiet and signalling).
    let lows = [
        0u32, 1, 0x3fff, 0x4000, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000, 0xffff,
    ];
    let xs: Vec<u32> = (0..=0xffffu32)
        .flat_map(|h| lows.iter().map(move |&l| (h << 16) | l))
        .collect();
    let input: Vec<u8> = xs.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let out = run(&exe, "f", input);
    assert_eq!(out.len(), xs.len() * 4);
    for (i, &x) in xs.iter().enumerate() {
        let want = bf16::from_f32(f32::from_bits(x)).to_bits();
        let a = u16::from_ne_bytes([out[4 * i], out[4 * i + 1]]);
        let b = u16::from_ne_bytes([out[4 * i + 2], out[4 * i + 3]]);
        assert_eq!(a, want, "ig_bf16_bits({x:#010x})");
        assert_eq!(b, want, "ig_narrow(ig_round({x:#010x}))");
    }
}

/// The device's exp in bf16 kernels (`ig_exp`) is `ig_exp_formula`, `2^{x log2(e)}` by
/// `ex2.approx`; on the host the 2^ is exp2f, so this checks what the product's rounding costs:
/// over every 61st f32 bit pattern from -104 to 88.7 (where e^x is a normal or subnormal f32),
/// the error against f64's exp is at most 2^-23 (1 + |x|) of it (1.2 times 2^-24 (1 + |x|)
/// measured) plus a subnormal's spacing; e^0 = 1, e^-inf = 0, e^inf = inf, NaN kept, inf from 88.73 on. On the device
/// `ex2.approx` adds at most 2 ulp; the GPU tests hold bf16 steps to the CPU's.
#[test]
fn the_bf16_kernels_exp_formula_costs_at_most_its_products_rounding() {
    let Some(exe) = helpers_program() else { return };
    let mut xs: Vec<f32> = Vec::new();
    let mut bits: u32 = 0;
    while bits < 0x7f80_0000 {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            if (-104.0..=88.7).contains(&x) {
                xs.push(x);
            }
        }
        bits += 61;
    }
    let edges = [
        0.0f32,
        -0.0,
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::NAN,
        88.73,
        1e30,
    ];
    xs.extend(edges);
    let input: Vec<u8> = xs.iter().flat_map(|x| x.to_bits().to_ne_bytes()).collect();
    let out = run(&exe, "e", input);
    assert_eq!(out.len(), xs.len() * 4);
    let got: Vec<f32> = out
        .chunks(4)
        .map(|c| f32::from_bits(u32::from_ne_bytes(c.try_into().unwrap())))
        .collect();
    let n = xs.len() - edges.len();
    for (&x, &y) in xs[..n].iter().zip(&got) {
        let want = (x as f64).exp();
        let err = (y as f64 - want).abs();
        // The product's rounding, as a relative error, and a subnormal's spacing.
        let bound = want * (1.0 + x.abs() as f64) * 2f64.powi(-23) + f32::from_bits(1) as f64;
        assert!(err <= bound, "exp({x:e}) = {y:e}, want {want:e}");
    }
    let e = &got[n..];
    assert_eq!(e[0], 1.0);
    assert_eq!(e[1], 1.0);
    assert_eq!(e[2].to_bits(), 0);
    assert_eq!(e[3], f32::INFINITY);
    assert!(e[4].is_nan());
    assert_eq!(e[5], f32::INFINITY);
    assert_eq!(e[6], f32::INFINITY);
}

#[test]
fn the_prelude_converts_doubles_and_integers_to_bf16_as_the_cpu_does() {
    let Some(exe) = helpers_program() else { return };
    // Doubles at, just above and just below each bf16 tie (where rounding through f32 once
    // more would go wrong), exact bf16 values, and the specials.
    let mut xs: Vec<f64> = vec![
        0.0,
        -0.0,
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e300,
        -1e300,
        1e-300,
        f64::MAX,
        f64::MIN_POSITIVE,
        3.3895313892515355e38, // bf16's largest finite value
        3.3961775292304135e38, // the midpoint above it
    ];
    for h in (0..=0xffffu32).step_by(3) {
        let tie = f32::from_bits((h << 16) | 0x8000) as f64;
        if !tie.is_finite() {
            continue;
        }
        let d = tie.abs() * 2f64.powi(-40);
        xs.extend([tie, tie + d, tie - d, f32::from_bits(h << 16) as f64]);
    }
    let input: Vec<u8> = xs.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let out = run(&exe, "d", input);
    for (i, &x) in xs.iter().enumerate() {
        let got = f32::from_bits(u32::from_ne_bytes(
            out[4 * i..4 * i + 4].try_into().unwrap(),
        ));
        let want = bf16_from_f64(x).to_f32();
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "ig_to_bf16({x:e}) = {got:e}, the CPU gives {want:e}"
        );
    }
    // Integers: through f64 as the CPU executor converts them (exact below 2^53).
    let is: Vec<i64> = vec![
        0,
        1,
        -1,
        255,
        257,
        (1 << 24) + 1,
        i32::MAX as i64,
        i32::MIN as i64,
        (1i64 << 53) + 1,
        i64::MAX,
        i64::MIN,
        123_456_789,
        -987_654_321,
    ];
    let input: Vec<u8> = is.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let out = run(&exe, "i", input);
    for (n, &x) in is.iter().enumerate() {
        let word = |k: usize| f32::from_bits(u32::from_ne_bytes(out[k..k + 4].try_into().unwrap()));
        assert_eq!(word(8 * n), bf16_from_f64(x as f64).to_f32(), "i64 {x}");
        let x32 = x as i32;
        assert_eq!(
            word(8 * n + 4),
            bf16_from_f64(x32 as f64).to_f32(),
            "i32 {x32}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The generated text.

fn input(dtype: DType, dims: &[usize], strides: &[usize]) -> Input {
    let reach: usize = strides
        .iter()
        .zip(dims)
        .map(|(s, d)| s * d.saturating_sub(1))
        .sum();
    Input {
        dtype,
        len: reach + 1,
        access: Access {
            offset: 0,
            strides: strides.to_vec(),
        },
    }
}

fn kernel(
    domain: &[usize],
    reduce: &[usize],
    inputs: Vec<Input>,
    body: Vec<Inst>,
    outs: &[usize],
) -> FusedKernel {
    let k = FusedKernel {
        domain: domain.to_vec(),
        reduce_axes: reduce.to_vec(),
        inputs,
        body,
        outputs: outs.iter().map(|&value| Output { value }).collect(),
    };
    k.check().unwrap();
    k
}

/// The statement that defines `v{i}` in `src` (the first).
fn def(src: &str, i: usize) -> &str {
    let key = format!(" v{i} = ");
    src.lines()
        .find(|l| l.contains(&key) && l.trim_start().starts_with("const "))
        .unwrap_or_else(|| panic!("no v{i} in\n{src}"))
        .trim()
}

#[test]
fn a_bf16_elementwise_kernel_widens_loads_rounds_every_op_and_narrows_stores() {
    use BinaryOp::*;
    // y = tanh(x * c + b) with x bf16, b f32 cast to bf16, c a bf16 constant; also the index
    // along the last axis as bf16, and x converted to f32 and back.
    let n = 4096;
    let k = kernel(
        &[8, n],
        &[],
        vec![
            input(DType::BF16, &[8, n], &[n, 1]),
            input(DType::F32, &[8, n], &[0, 1]),
        ],
        vec![
            Inst::Load { input: 0 }, // 0
            Inst::Load { input: 1 }, // 1
            Inst::Convert {
                x: 1,
                to: DType::BF16,
            }, // 2
            Inst::Const {
                value: 0.1,
                dtype: DType::BF16,
            }, // 3
            Inst::binary(Mul, 0, 3), // 4
            Inst::binary(Add, 4, 2), // 5
            Inst::unary(UnaryOp::Tanh, 5), // 6
            Inst::Index {
                axis: 1,
                dtype: DType::BF16,
            }, // 7
            Inst::binary(Max, 6, 7), // 8
            Inst::Convert {
                x: 8,
                to: DType::F32,
            }, // 9
        ],
        &[8, 9],
    );
    let c = cuda::fused(&k).unwrap();
    let s = &c.source;
    assert!(
        s.contains(
            "(const unsigned short* in0, const float* in1, unsigned short* out0, float* out1)"
        ),
        "{s}"
    );
    assert_eq!(def(s, 0), "const float v0 = ig_widen(in0[e]);");
    assert_eq!(def(s, 2), "const float v2 = ig_to_bf16(v1);");
    // 0.1 is 0.10009765625 in bf16: the constant is the rounded value.
    assert_eq!(def(s, 3), "const float v3 = 0.100097656f;");
    assert_eq!(def(s, 4), "const float v4 = ig_round(v0 * v3);");
    assert_eq!(def(s, 5), "const float v5 = ig_round(v4 + v2);");
    assert_eq!(def(s, 6), "const float v6 = ig_round(tanhf(v5));");
    assert!(
        def(s, 7).ends_with("= ig_round((float)i1);"),
        "{}",
        def(s, 7)
    );
    assert_eq!(def(s, 8), "const float v8 = ig_round(ig_max(v6, v7));");
    assert_eq!(def(s, 9), "const float v9 = ig_to_f32(v8);");
    assert!(s.contains("out0[e] = ig_narrow(v8);"), "{s}");
    assert!(s.contains("out1[e] = v9;"), "{s}");
    assert!(!s.contains("__nv_bfloat16") && !s.contains("#include"));
}

#[test]
fn a_bf16_sum_accumulates_in_float_and_rounds_once_after_the_threads_combine() {
    // Row sums of a bf16 [64, 3000] (a block per row) and the rows' max, stored bf16, plus
    // each element minus its row's sum, bf16.
    let (r, n) = (64, 3000);
    let mut b = B::new(&[r, n], &[1]);
    let x = b.input(DType::BF16, &[n, 1]);
    let x = b.load(x);
    let (sum, max) = (b.sum(x), b.max(x));
    let d = b.sub(x, sum);
    let k = b.outputs(&[sum, max, d]).done();
    assert_eq!(cuda::strategy(&k).unwrap(), Strategy::Rows);
    let s = cuda::fused(&k).unwrap().source;
    assert!(s.contains("float a1 = 0.0f;"), "{s}");
    assert!(s.contains("__shared__ float sm1["), "{s}");
    // Terms are added unrounded; the finished sum is rounded once.
    assert!(s.contains("= s1 + v0;") || s.contains("= a1 + v0;"), "{s}");
    assert!(
        !s.contains("ig_round(a1 + ") && !s.contains("ig_round(s1"),
        "{s}"
    );
    assert_eq!(def(&s, 1), "const float v1 = ig_round(a1);");
    assert_eq!(def(&s, 2), "const float v2 = ig_round(a2);");
    assert!(s.contains("out0[row] = ig_narrow(v1);"), "{s}");
    assert!(s.contains("= ig_narrow(v3);"), "{s}");
}

#[test]
fn a_bf16_column_sum_and_a_bf16_transpose_keep_float_registers() {
    // Bias gradient: sum over rows of a bf16 [4096, 768] into f32 and into bf16.
    let (m, d) = (4096, 768);
    let mut b = B::new(&[m, d], &[0]);
    let x = b.input(DType::BF16, &[d, 1]);
    let x = b.load(x);
    let wide = b.to(x, DType::F32);
    let (into_f32, into_bf16) = (b.sum(wide), b.sum(x));
    let k = b.outputs(&[into_f32, into_bf16]).done();
    assert_eq!(cuda::strategy(&k).unwrap(), Strategy::Columns);
    let s = cuda::fused(&k).unwrap().source;
    assert!(s.contains("__shared__ float sm3["), "{s}");
    // Eight columns a thread (kernels/src/cuda/fused/colvec.rs): lane 0's sums are `a{r}_0`.
    assert!(s.contains("8 rows a thread"), "{s}");
    assert_eq!(def(&s, 2), "const float v2 = a2_0;");
    assert_eq!(def(&s, 3), "const float v3 = ig_round(a3_0);");
    // A transposing copy of bf16 goes through float tiles and stores 2 bytes.
    let (a, b) = (512, 2048);
    let k = kernel(
        &[a, b],
        &[],
        vec![input(DType::BF16, &[a, b], &[1, a])],
        vec![Inst::Load { input: 0 }],
        &[0],
    );
    let s = cuda::fused(&k).unwrap().source;
    assert!(s.contains("__shared__ float t0[32][33];"), "{s}");
    assert!(s.contains("= ig_widen(in0["), "{s}");
    assert!(s.contains("= ig_narrow(v0);"), "{s}");
}

#[test]
fn a_large_bf16_elementwise_kernel_goes_four_elements_a_thread_through_8_byte_vectors() {
    // As f32 kernels of this size do: one ushort4 load and store a thread, each lane widened,
    // computed and rounded as in the plain loop, then narrowed.
    let n = 1 << 22;
    let k = kernel(
        &[n],
        &[],
        vec![input(DType::BF16, &[n], &[1])],
        vec![Inst::Load { input: 0 }, Inst::binary(BinaryOp::Add, 0, 0)],
        &[1],
    );
    let s = cuda::fused(&k).unwrap().source;
    assert!(
        s.contains("const ushort4 l0 = reinterpret_cast<const ushort4*>(in0)["),
        "{s}"
    );
    for lane in ["x", "y", "z", "w"] {
        assert!(s.contains(&format!("= ig_widen(l0.{lane});")), "{s}");
        assert!(s.contains(&format!("r0.{lane} = ig_narrow(v1);")), "{s}");
    }
    assert!(s.contains("ig_round(v0 + v0)"), "{s}");
    assert!(s.contains("reinterpret_cast<ushort4*>(out0)["), "{s}");
    // A bf16 load that is not aligned to four elements keeps the plain loop.
    let mut odd = k.clone();
    odd.inputs[0].access.offset = 2;
    odd.inputs[0].len = n + 2;
    let s = cuda::fused(&odd).unwrap().source;
    assert!(!s.contains("ushort4"), "{s}");
}

#[test]
fn bf16_gather_concat_move_two_bytes_and_scatter_add_sums_in_float() {
    let g = cuda::gather(DType::BF16, DType::I32, 100, 64, 10)
        .unwrap()
        .source;
    assert!(g.contains("const unsigned short* table"), "{g}");
    assert!(g.contains(": (unsigned short)0;"), "{g}");
    let c = cuda::concat(DType::BF16, 4, &[3, 5]).unwrap().source;
    assert_mentions(&c, &["const unsigned short* in1", "unsigned short* out"]);
    let p = cuda::scatter_add_program(DType::I64, DType::BF16, DType::BF16, 100, 64, 10).unwrap();
    let s = &p.launches[p.launches.len() - 2].kernel.source;
    assert!(s.contains("float acc["), "{s}");
    assert!(s.contains("acc[k] += ig_widen(x[k]);"), "{s}");
    assert!(s.contains("out[row + c] = ig_bf16_bits(acc[k]);"), "{s}");
}

#[test]
fn f32_modules_do_not_carry_the_bf16_helpers() {
    let f = cuda::fused(&kernel(
        &[8],
        &[],
        vec![input(DType::F32, &[8], &[1])],
        vec![Inst::Load { input: 0 }],
        &[0],
    ))
    .unwrap();
    assert_eq!(cuda::prelude_for([&f]), cuda::PRELUDE);
    let b = cuda::gather(DType::BF16, DType::I32, 4, 4, 4).unwrap();
    let s = cuda::scatter_add_program(DType::I32, DType::BF16, DType::BF16, 4, 4, 4)
        .unwrap()
        .launches
        .pop()
        .unwrap()
        .kernel;
    assert_eq!(
        cuda::prelude_for([&f, &b]),
        cuda::PRELUDE,
        "a gather only moves bits"
    );
    assert_eq!(
        cuda::prelude_for([&f, &s]),
        format!("{}{PRELUDE_BF16}", cuda::PRELUDE)
    );
}

// ---------------------------------------------------------------------------------------------
// Generated elementwise kernels, run on the host.

/// Host definitions of what the generated elementwise kernels use (a grid-stride loop needs no
/// barrier, so its threads can run one after another): thread indices as globals set before
/// each call, the bit casts, and the saturating conversions as the device defines them.
const EMU_SHIM: &str = r#"#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <climits>
#include <cstdlib>
#include <vector>
#include <utility>
#include <math.h>
"#;

/// The rest of the shim, after [`cxx::CUDA_ON_HOST`].
const EMU_SHIM_REST: &str = r#"struct ig_uint3 { unsigned x, y, z; };
static ig_uint3 threadIdx, blockIdx, blockDim, gridDim;
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(4) uchar4 { unsigned char x, y, z, w; };
static int __float2int_rz(float x) { return x >= 2147483648.0f ? INT_MAX : x < -2147483648.0f ? INT_MIN : (int)x; }
static int __double2int_rz(double x) { return x >= 2147483648.0 ? INT_MAX : x < -2147483648.0 ? INT_MIN : (int)x; }
static long long __float2ll_rz(float x) { return x >= 9223372036854775808.0f ? LLONG_MAX : x < -9223372036854775808.0f ? LLONG_MIN : (long long)x; }
static long long __double2ll_rz(double x) { return x >= 9223372036854775808.0 ? LLONG_MAX : x < -9223372036854775808.0 ? LLONG_MIN : (long long)x; }
template <typename T> T __shfl_xor_sync(unsigned, T, int, int = 32);
void __syncthreads();
void __syncwarp(unsigned = 0xffffffffu);
template <typename... P, std::size_t... I>
static void call_with(void (*f)(P...), void** b, std::index_sequence<I...>) { f(static_cast<P>(b[I])...); }
template <typename... P> static void call(void (*f)(P...), void** b) { call_with(f, b, std::index_sequence_for<P...>{}); }
"#;

const EMU_MAIN: &str = r#"
static unsigned long long read_u64() { unsigned long long v = 0; if (std::fread(&v, 8, 1, stdin) != 1) std::exit(3); return v; }
int main(int argc, char** argv) {
  (void)argc;
  const int which = std::atoi(argv[1]);
  const unsigned long long ins = read_u64(), outs = read_u64();
  std::vector<std::vector<unsigned char>> bufs;
  for (unsigned long long i = 0; i < ins + outs; ++i) {
    std::vector<unsigned char> b(read_u64() + 16, 0xFF);
    if (i < ins && b.size() > 16 && std::fread(b.data(), 1, b.size() - 16, stdin) != b.size() - 16) return 4;
    bufs.push_back(std::move(b));
  }
  std::vector<void*> ptrs;
  for (auto& b : bufs) ptrs.push_back(b.data());
  const unsigned grid = (unsigned)read_u64(), block = (unsigned)read_u64();
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  for (unsigned g = 0; g < grid; ++g) {
    for (unsigned t = 0; t < block; ++t) {
      blockIdx = {g, 0, 0};
      threadIdx = {t, 0, 0};
      KERNELS[which](ptrs.data());
    }
  }
  for (unsigned long long i = ins; i < ins + outs; ++i) std::fwrite(bufs[i].data(), 1, bufs[i].size() - 16, stdout);
  return 0;
}
"#;

/// Deterministic buffer contents: floats anywhere in [-4, 4] (so that conversions to bf16
/// round), some of them specials; integers small; bools 0 or 1.
fn emu_fill(dtype: DType, len: usize, seed: u64) -> Vec<u8> {
    let mut next = ingot_kernels::fused::random::xorshift(seed);
    let mut out = Vec::with_capacity(len * dtype.size());
    for _ in 0..len {
        let r = next();
        let f = if r.is_multiple_of(50) {
            [f64::NAN, f64::INFINITY, -0.0, 1e30, 3.0e38][(r >> 8) as usize % 5]
        } else {
            ((r >> 11) as f64 / (1u64 << 53) as f64) * 8.0 - 4.0
        };
        let i = (r >> 20) as i64 % 41 - 20;
        match dtype {
            DType::F32 => out.extend((f as f32).to_ne_bytes()),
            DType::F64 => out.extend(f.to_ne_bytes()),
            DType::I32 => out.extend((i as i32).to_ne_bytes()),
            DType::I64 => out.extend(i.to_ne_bytes()),
            DType::Bool => out.push((r & 1) as u8),
            DType::BF16 => out.extend(bf16::from_f32(f as f32).to_bits().to_ne_bytes()),
        }
    }
    out
}

/// Equal bits, or both NaN (arithmetic NaNs' payloads are the host's either way, but a NaN
/// the kernel makes and one it loads may differ).
fn same_values(dtype: DType, a: &[u8], b: &[u8]) -> Option<usize> {
    let s = dtype.size();
    (0..a.len() / s).find(|&i| {
        let (x, y) = (&a[i * s..(i + 1) * s], &b[i * s..(i + 1) * s]);
        let nan = match dtype {
            DType::F32 => {
                f32::from_ne_bytes(x.try_into().unwrap()).is_nan()
                    && f32::from_ne_bytes(y.try_into().unwrap()).is_nan()
            }
            DType::F64 => {
                f64::from_ne_bytes(x.try_into().unwrap()).is_nan()
                    && f64::from_ne_bytes(y.try_into().unwrap()).is_nan()
            }
            DType::BF16 => {
                bf16::from_bits(u16::from_ne_bytes([x[0], x[1]])).is_nan()
                    && bf16::from_bits(u16::from_ne_bytes([y[0], y[1]])).is_nan()
            }
            _ => false,
        };
        x != y && !nan
    })
}

/// bf16 versions (every f32 made bf16) of random elementwise kernels: the generated CUDA C,
/// compiled for the host and run thread by thread, stores the bits the CPU's fused executor
/// stores (the host's expf, tanhf and logf are the ones both use here, and the host compiler
/// fuses no multiply-add), NaNs matching NaNs.
#[test]
fn generated_bf16_elementwise_kernels_run_on_the_host_give_the_cpu_executors_bits() {
    use ingot_kernels::fused::{cpu, random};
    let Some(cxx) = cxx::host_cxx_or_skip() else {
        return;
    };
    let opts = random::Options {
        max_elements: 1 << 14,
        ..random::Options::wide()
    };
    let mut picked = Vec::new();
    for seed in 0..3000u64 {
        let k = random::as_bf16(&random::kernel(seed, &opts));
        // Kernels that store bf16 (and so round, or carry, bf16 values to memory).
        if k.check().is_err() || !(0..k.outputs.len()).any(|j| k.output_dtype(j) == DType::BF16) {
            continue;
        }
        if cuda::strategy(&k).unwrap() != Strategy::Elementwise {
            continue;
        }
        let c = cuda::fused(&k).unwrap();
        if c.source.contains("__shared__")
            || picked
                .iter()
                .any(|(_, p): &(FusedKernel, cuda::CudaKernel)| p.name == c.name)
        {
            continue;
        }
        picked.push((k, c));
        if picked.len() == 120 {
            break;
        }
    }
    assert!(
        picked.len() >= 60,
        "{} bf16 elementwise kernels",
        picked.len()
    );
    let head = format!(
        "{EMU_SHIM}{}{EMU_SHIM_REST}{}{PRELUDE_BF16}typedef void (*Runner)(void**);\n",
        cxx::CUDA_ON_HOST,
        cuda::PRELUDE
    );
    let kernels = picked.iter().map(|(_, c)| c);
    let exe = cxx::Emu::build(cxx, "ingot_cuda_bf16_emu", &head, kernels, EMU_MAIN)
        .unwrap_or_else(|e| panic!("the emulation does not compile: {e}"))
        .exe;
    let dir = exe.parent().unwrap().to_path_buf();
    let mut bad = Vec::new();
    for (n, (k, c)) in picked.iter().enumerate() {
        let inputs: Vec<Vec<u8>> = k
            .inputs
            .iter()
            .enumerate()
            .map(|(i, inp)| emu_fill(inp.dtype, inp.len, n as u64 * 31 + i as u64))
            .collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        let want = cpu::run_buffers(k, &refs).unwrap();
        let mut stdin = Vec::new();
        stdin.extend((inputs.len() as u64).to_ne_bytes());
        stdin.extend((want.len() as u64).to_ne_bytes());
        for b in inputs.iter().chain(&want) {
            stdin.extend((b.len() as u64).to_ne_bytes());
            if inputs.iter().any(|i| std::ptr::eq(i, b)) {
                stdin.extend(b);
            }
        }
        stdin.extend((c.launch.grid[0] as u64).to_ne_bytes());
        stdin.extend((c.launch.block[0] as u64).to_ne_bytes());
        let got = run(&exe, &n.to_string(), stdin);
        let mut at = 0;
        for (j, w) in want.iter().enumerate() {
            let g = &got[at..at + w.len()];
            at += w.len();
            if let Some(i) = same_values(k.output_dtype(j), g, w) {
                bad.push(format!(
                    "{}: out{j} differs at {i}\n{k}\n{}",
                    c.name, c.source
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        bad.is_empty(),
        "{} of {} kernels differ:\n{}",
        bad.len(),
        picked.len(),
        bad.join("\n")
    );
}

/// Bytes of the `__shared__` arrays a kernel declares (`float` or `double` arrays of one or
/// two dimensions).
fn shared_bytes(src: &str) -> usize {
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("__shared__ "))
        .map(|decl| {
            let elem = if decl.starts_with("double") || decl.starts_with("long long") {
                8
            } else {
                4
            };
            decl.split('[')
                .skip(1)
                .map(|d| d.split(']').next().unwrap().parse::<usize>().unwrap())
                .product::<usize>()
                * elem
        })
        .sum()
}

#[test]
fn bf16_reductions_size_their_shared_memory_as_floats() {
    // Sixteen bf16 column sums: their partials are floats in shared memory, and the layout
    // counts them so (2-byte partials would give twice the rows and overflow 48 KiB).
    let (m, d) = (4096, 768);
    let mut body = vec![Inst::Load { input: 0 }];
    let mut outs = Vec::new();
    for c in 0..16 {
        body.push(Inst::Const {
            value: c as f64,
            dtype: DType::BF16,
        });
        body.push(Inst::binary(BinaryOp::Add, 0, body.len() - 1));
        body.push(Inst::Reduce {
            op: ReduceOp::Sum,
            x: body.len() - 1,
        });
        outs.push(body.len() - 1);
    }
    let k = kernel(
        &[m, d],
        &[0],
        vec![input(DType::BF16, &[m, d], &[d, 1])],
        body,
        &outs,
    );
    let s = cuda::fused(&k).unwrap().source;
    assert!(s.contains("__shared__ float sm"), "{s}");
    let bytes = shared_bytes(&s);
    assert!(bytes <= 48 * 1024, "{bytes} bytes of shared memory:\n{s}");
}
