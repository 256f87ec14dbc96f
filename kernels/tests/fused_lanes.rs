//! The CPU executor's lane buffers stop at the kernel's domain (issue 53): a fused kernel over
//! 64 elements took 1,024 lanes (8 KiB a lane buffer) when its body was short, scratch that
//! nothing read and that the planner reserved in the slab; a deep chain of f32[8, 8] layers
//! planned more fused than unfused because of it. Lanes are now the smallest power of two
//! (at least 16) that covers the domain, when that is fewer than the body allows; every chunk
//! keeps its length, so the values do not change.

use ingot_kernels::fused::cpu::{self, Compiled};
use ingot_kernels::fused::sample::chain;

/// The chain's values computed one element at a time, and each row's max.
fn reference(ops: usize, x: &[f32], row: usize) -> (Vec<f32>, Vec<f32>) {
    let full: Vec<f32> = x
        .iter()
        .map(|&x| (0..ops).fold(x, |v, o| if o % 2 == 0 { v * 0.75 } else { v + 0.5 }))
        .collect();
    let maxes = full
        .chunks(row)
        .map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max))
        .collect();
    (full, maxes)
}

fn bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_short_kernel_over_64_elements_takes_a_fraction_of_the_scratch_it_takes_over_4096() {
    // 13 instructions: the body alone would allow 624 lanes; 64 elements need 64.
    let (small, large) = (
        cpu::scratch_bytes(&chain(10, &[64], false)),
        cpu::scratch_bytes(&chain(10, &[4096], false)),
    );
    assert!(small > 0 && large > 0);
    assert!(
        small * 3 < large,
        "over 64 elements {small} bytes of scratch, over 4,096 elements {large}"
    );
    // Past the body's own limit the domain changes nothing.
    assert_eq!(
        cpu::scratch_bytes(&chain(10, &[2048], false)),
        large,
        "2,048 and 4,096 elements both take the body's 624 lanes"
    );
}

#[test]
fn kernels_over_small_domains_compute_the_values_of_one_element_at_a_time() {
    for (dims, reduce) in [
        (vec![1], false),
        (vec![7], false),
        (vec![64], false),
        (vec![100], false),
        (vec![1000], false),
        (vec![8, 8], true),
        (vec![3, 100], true),
        (vec![5, 17], true),
    ] {
        let k = chain(9, &dims, reduce);
        let len: usize = dims.iter().product();
        let x: Vec<f32> = (0..len).map(|i| (i as f32 - 40.0) / 3.0).collect();
        let (full, maxes) = reference(9, &x, *dims.last().unwrap());
        let out = cpu::run_buffers(&k, &[&bytes(&x)]).expect("the kernel runs");
        let got = floats(&out[0]);
        for (i, (g, w)) in got.iter().zip(&full).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{dims:?}: element {i}");
        }
        if reduce {
            assert_eq!(floats(&out[1]), maxes, "{dims:?}: row maxima");
        }
        // The compiled program still fits in the scratch the planner reserves.
        let c = Compiled::new(&k).expect("an f32 kernel of this shape is compiled");
        assert!(c.scratch_bytes() <= cpu::scratch_bytes(&k), "{dims:?}");
    }
}
