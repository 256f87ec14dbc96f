//! Loops compiled for the widest vector instructions the CPU has, chosen when they run.
//!
//! The workspace is built for baseline x86-64 (SSE2), so a loop the compiler vectorises works
//! on 4 f32 lanes at a time even on a CPU with AVX-512 (16 lanes, and twice the registers).
//! [`widest`] runs a [`Wide`] job inside a function compiled with AVX-512 or AVX2 enabled,
//! whichever this CPU has (looked up once, then one load and a branch a call), so the loops
//! of the job use the wide registers. A job's `run` must be `#[inline(always)]`, and so must
//! every function of its loops: only code inlined into the wrapper is compiled with its
//! features (a closure would not do: its body, called from three wrappers, may stay out of
//! line and run on the baseline's vectors).
//!
//! # The same bits
//! Enabling the features changes which instructions compute each IEEE operation, never the
//! operations or their order: Rust never contracts a multiply and an add into a fused
//! multiply-add nor reassociates float sums, with or without FMA available, and `mul_add` is
//! one rounding either way. So a job computes the same bits at every [`Level`]; the tests of
//! its callers compare the levels.

use std::sync::atomic::{AtomicU8, Ordering};

/// A job to run at the widest [`Level`]: `run` is `#[inline(always)]` in every implementation
/// (see the [module docs](self)).
pub trait Wide {
    type Out;
    fn run(self) -> Self::Out;
}

/// The vector instructions a job may be compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// The build's baseline (SSE2 on x86-64; whatever the target has elsewhere).
    Base,
    /// x86-64 with AVX2 and FMA (256-bit vectors).
    Avx2,
    /// x86-64 with AVX-512 F, BW, DQ and VL (512-bit vectors).
    Avx512,
}

/// The detected level (0: not looked up yet; else `Level as u8 + 1`).
static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The widest level this CPU runs.
pub fn level() -> Level {
    match LEVEL.load(Ordering::Relaxed) {
        1 => Level::Base,
        2 => Level::Avx2,
        3 => Level::Avx512,
        _ => {
            let l = detect();
            LEVEL.store(l as u8 + 1, Ordering::Relaxed);
            l
        }
    }
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
            return Level::Avx512;
        }
        if has!("avx2") && has!("fma") {
            return Level::Avx2;
        }
    }
    Level::Base
}

/// Runs `job` compiled for the widest level this CPU has.
#[inline(always)]
pub fn widest<W: Wide>(job: W) -> W::Out {
    at(level(), job)
}

/// Runs `job` compiled for `level`, or for the baseline if this CPU lacks it (the tests run
/// both to compare their bits).
#[inline(always)]
pub fn at<W: Wide>(want: Level, job: W) -> W::Out {
    #[cfg(target_arch = "x86_64")]
    {
        let have = level();
        if want == Level::Avx512 && have == Level::Avx512 {
            // SAFETY: the CPU has the features the function is compiled with (detected).
            return unsafe { x86::avx512(job) };
        }
        if want == Level::Avx2 && have != Level::Base {
            // SAFETY: as above (a CPU with the AVX-512 level has AVX2 and FMA too).
            return unsafe { x86::avx2(job) };
        }
    }
    let _ = want;
    job.run()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Wide;

    /// # Safety
    /// The CPU has AVX-512 F, BW, DQ and VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(super) unsafe fn avx512<W: Wide>(job: W) -> W::Out {
        job.run()
    }

    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2<W: Wide>(job: W) -> W::Out {
        job.run()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sum and products in a loop the compiler vectorises: the kind of job widened.
    struct Job<'a>(&'a [f32], &'a mut [f32]);
    impl Wide for Job<'_> {
        type Out = f32;
        #[inline(always)]
        fn run(self) -> f32 {
            for (o, &x) in self.1.iter_mut().zip(self.0) {
                *o = x * 1.1 + x * x - 0.3 / (x + 2.0);
            }
            self.1.iter().fold(0.0, |a, &x| a + x)
        }
    }

    #[test]
    fn a_job_gives_the_same_bits_at_every_level() {
        let x: Vec<f32> = (0..1037).map(|i| (i as f32 * 0.731).sin() * 3.0).collect();
        let mut base = vec![0.0; x.len()];
        let s = at(Level::Base, Job(&x, &mut base));
        for l in [Level::Avx2, Level::Avx512] {
            let mut o = vec![0.0; x.len()];
            let t = at(l, Job(&x, &mut o));
            assert_eq!(s.to_bits(), t.to_bits(), "{l:?} sum");
            assert!(o.iter().zip(&base).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
