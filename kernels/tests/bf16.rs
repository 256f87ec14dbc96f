//! bf16 rounding on store, checked against an independent bit-level reference (nearest value,
//! ties to the even significand), and that the CUDA generator takes bf16 kernels.

use ingot_kernels::dtype::{bf16, bf16_from_f64, quantize_bf16, round_bf16};
use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::{cuda, BinaryOp, DType};
use proptest::prelude::*;

/// The bf16 nearest to the finite or infinite `x` (not NaN), by exact comparison of the two
/// bf16 neighbours around it, ties to the one whose last significand bit is 0. Values past the
/// largest finite bf16 round to infinity from the midpoint to 2^128 on, as IEEE 754 says.
fn reference(x: f64) -> u16 {
    assert!(!x.is_nan());
    let sign = if x.is_sign_negative() { 0x8000u16 } else { 0 };
    let a = x.abs();
    // The largest bf16 magnitude <= a (walks the 32768 magnitudes by bisection).
    let (mut lo, mut hi) = (0u16, 0x7f80u16);
    if bf16::from_bits(hi).to_f64() <= a {
        return sign | 0x7f80;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if bf16::from_bits(mid).to_f64() <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let below = bf16::from_bits(lo).to_f64();
    // The next magnitude up; above the largest finite one, 2^128 stands for infinity.
    let above = if hi == 0x7f80 {
        2f64.powi(128)
    } else {
        bf16::from_bits(hi).to_f64()
    };
    // Exact: both differences are of values within a factor of two (or of a tiny a).
    let (dl, dh) = (a - below, above - a);
    let pick = if dl < dh || (dl == dh && lo % 2 == 0) {
        lo
    } else {
        hi
    };
    sign | pick
}

#[test]
fn ties_round_to_the_even_bf16() {
    // 1 + 2^-8 lies halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): down.
    assert_eq!(round_bf16(f32::from_bits(0x3f80_8000)).to_bits(), 0x3f80);
    // Halfway between 0x3f81 (odd) and 0x3f82: up.
    assert_eq!(round_bf16(f32::from_bits(0x3f81_8000)).to_bits(), 0x3f82);
    // Just past a tie: up; just below: down.
    assert_eq!(round_bf16(f32::from_bits(0x3f80_8001)).to_bits(), 0x3f81);
    assert_eq!(round_bf16(f32::from_bits(0x3f80_7fff)).to_bits(), 0x3f80);
    // Negative ties mirror the positive ones.
    assert_eq!(round_bf16(f32::from_bits(0xbf80_8000)).to_bits(), 0xbf80);
    assert_eq!(round_bf16(f32::from_bits(0xbf81_8000)).to_bits(), 0xbf82);
    // The largest finite f32 is past the midpoint above the largest bf16: infinity.
    assert_eq!(round_bf16(f32::MAX).to_bits(), 0x7f80);
    // A subnormal tie: 0x0000_8000 is halfway between 0 and the smallest bf16 subnormal.
    assert_eq!(round_bf16(f32::from_bits(0x0000_8000)).to_bits(), 0x0000);
    assert_eq!(round_bf16(f32::from_bits(0x0001_8000)).to_bits(), 0x0002);
    assert!(round_bf16(f32::NAN).is_nan());
}

#[test]
fn from_f64_rounds_once_where_truncating_first_would_misround() {
    // Just above the tie 1 + 2^-8 by far less than an f32 ulp: the nearest bf16 is 0x3f81.
    // (Rounding to f32 first lands on the tie, which then goes to even: 0x3f80.)
    let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    assert_eq!(bf16_from_f64(x).to_bits(), 0x3f81);
    assert_eq!(bf16_from_f64(x).to_bits(), reference(x));
    assert_eq!(bf16_from_f64(-x).to_bits(), reference(-x));
    assert_eq!(bf16_from_f64(1e300).to_bits(), 0x7f80);
    assert_eq!(bf16_from_f64(-1e-300).to_bits(), 0x8000);
    assert!(bf16_from_f64(f64::NAN).is_nan());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Rounding on store (`half::bf16::from_f32`, which every executor uses) is round to
    /// nearest even, for every kind of f32: normal, subnormal, huge, ties.
    #[test]
    fn rounding_an_f32_on_store_is_round_to_nearest_even(bits in any::<u32>(), tie in any::<bool>()) {
        // Half the cases are exact ties (the low 16 bits 0x8000).
        let bits = if tie { (bits & 0xffff_0000) | 0x8000 } else { bits };
        let x = f32::from_bits(bits);
        prop_assume!(!x.is_nan());
        prop_assert_eq!(round_bf16(x).to_bits(), reference(x as f64), "{:08x}", bits);
        // The lane value executors keep is that bf16, widened.
        prop_assert_eq!(quantize_bf16(x).to_bits(), (reference(x as f64) as u32) << 16);
    }

    /// `bf16_from_f64` (constants, conversions from f64 and integers) rounds once, to nearest
    /// even, from any f64.
    #[test]
    fn rounding_an_f64_is_round_to_nearest_even(bits in any::<u64>(), near_tie in any::<bool>(), dust in 1u64..1 << 28) {
        // Near ties: an f32 tie plus or minus a little below an f32 ulp.
        let x = if near_tie {
            let t = f32::from_bits(((bits as u32) & 0x7fff_0000) | 0x8000) as f64;
            let ulp = t * 2f64.powi(-60);
            if bits & 1 == 0 { t + ulp * dust as f64 } else { t - ulp * dust as f64 }
        } else {
            f64::from_bits(bits)
        };
        prop_assume!(!x.is_nan());
        prop_assert_eq!(bf16_from_f64(x).to_bits(), reference(x), "{:e}", x);
    }
}

/// A one-input elementwise kernel over `n` elements of `dtype`: `x + x`, stored.
fn doubling(dtype: DType, n: usize) -> FusedKernel {
    FusedKernel {
        domain: vec![n],
        reduce_axes: vec![],
        inputs: vec![Input {
            dtype,
            len: n,
            access: Access::contiguous(&[n]),
        }],
        body: vec![Inst::Load { input: 0 }, Inst::binary(BinaryOp::Add, 0, 0)],
        outputs: vec![Output { value: 1 }],
    }
}

#[test]
fn the_cuda_generator_takes_bf16_kernels_and_ops() {
    // (What the text says is checked in tests/cuda_bf16.rs.)
    let k = cuda::fused(&doubling(DType::BF16, 8)).unwrap();
    assert!(k.source.contains("ig_round(v0 + v0)"), "{}", k.source);
    // A kernel that only converts to bf16 inside.
    let mut k = doubling(DType::F32, 8);
    k.body.push(Inst::Convert {
        x: 1,
        to: DType::BF16,
    });
    k.body.push(Inst::Convert {
        x: 2,
        to: DType::F32,
    });
    k.outputs[0].value = 3;
    assert!(cuda::fused(&k).unwrap().source.contains("ig_to_bf16(v1)"));
    assert!(cuda::gather(DType::BF16, DType::I64, 4, 2, 3).is_ok());
    assert!(cuda::scatter_add_program(DType::I64, DType::BF16, DType::BF16, 4, 2, 3).is_ok());
    assert!(cuda::concat(DType::BF16, 2, &[1, 2]).is_ok());
}

#[test]
fn a_fused_bf16_kernel_on_the_cpu_rounds_its_result_and_stores_two_bytes() {
    // x + x is exact in bf16 (a power-of-two scaling); x * 1.00390625 (1 + 2^-8) is a tie for
    // odd significands and rounds to even.
    let xs: Vec<bf16> = [1.0f32, 1.0078125, -3.5, 0.0]
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_bits().to_ne_bytes()).collect();
    let mut k = doubling(DType::BF16, 4);
    k.body.push(Inst::Const {
        value: 1.00390625,
        dtype: DType::BF16,
    });
    k.body.push(Inst::binary(BinaryOp::Mul, 0, 2));
    k.outputs.push(Output { value: 3 });
    let out = ingot_kernels::fused::cpu::run_buffers(&k, &[&bytes]).unwrap();
    let read = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f32())
            .collect()
    };
    assert_eq!(out[0].len(), 8, "bf16 outputs are 2 bytes an element");
    assert_eq!(read(&out[0]), vec![2.0, 2.015625, -7.0, 0.0]);
    // The constant 1 + 2^-8 is itself a tie in bf16: it rounds to 1 (even), so x * 1 = x.
    assert_eq!(read(&out[1]), vec![1.0, 1.0078125, -3.5, 0.0]);
}

#[test]
fn an_infinite_or_nan_constant_survives_the_kernel_descriptions_json() {
    use ingot_kernels::fused::Inst;
    for value in [f64::INFINITY, f64::NEG_INFINITY, -0.0, 1.5, f64::MAX] {
        let inst = Inst::Const {
            value,
            dtype: ingot_kernels::DType::F32,
        };
        let json = serde_json::to_string(&inst).unwrap();
        let back: Inst = serde_json::from_str(&json).unwrap();
        let Inst::Const { value: got, .. } = back else {
            panic!("{json}")
        };
        assert_eq!(got.to_bits(), value.to_bits(), "{json}");
    }
    let nan = serde_json::to_string(&Inst::Const {
        value: f64::NAN,
        dtype: ingot_kernels::DType::F32,
    })
    .unwrap();
    assert!(nan.contains("\"nan\""), "{nan}");
    let bad = serde_json::from_str::<Inst>(r#"{"Const":{"value":"lots","dtype":"F32"}}"#);
    assert!(bad.unwrap_err().to_string().contains("\"lots\""));
}
