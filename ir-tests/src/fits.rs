//! The fitter's options as the fit tests write them: every step off, and the test turns on the
//! steps it is about (`FitOptions { recompute: true, ..fit_none(budget) }`), so each test says
//! only what it fits with.

use ingot_compiler::fit::FitOptions;

/// Options that fit `budget` with no step on (no recomputation, accumulation or offload) and
/// micro-batches of one sample at the least.
pub fn fit_none(budget: usize) -> FitOptions {
    FitOptions {
        budget,
        recompute: false,
        accumulate: false,
        min_micro_batch: 1,
        offload: false,
    }
}
