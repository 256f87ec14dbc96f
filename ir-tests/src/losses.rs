//! The losses of a compiled step over CPU steps, as bits: what the tests of a compile that
//! must not change a number (padding, recomputation, segments) compare, written once.

use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline::Compiled;
use ingot_trainer::session::{Device, Session};

/// The bits of the loss of each of `steps` CPU steps of `c`, its leaves drawn from `seed`.
pub fn cpu_loss_bits(c: &Compiled, seed: u64, steps: usize) -> Vec<u64> {
    let exe = c.executable(Target::Cpu).unwrap();
    let mut s = Session::from_executable(exe, seed, Device::Cpu).unwrap();
    (0..steps)
        .map(|_| s.step().unwrap().loss.to_bits())
        .collect()
}

/// The losses of `steps` CPU steps of a session of `m` (the default pipeline), its leaves
/// drawn from `seed`.
pub fn session_losses(m: &Model, seed: u64, steps: usize) -> Vec<f64> {
    let mut s = Session::new(m, seed).unwrap();
    (0..steps).map(|_| s.step().unwrap().loss).collect()
}
