//! The run's summary: what it measured, beside what was planned.

use super::error::RunError;
use crate::record::StepTimes;
use crate::session::Session;
use ingot_runtime::cuda::CudaStep;

/// The summary's figures, in the order of the command line's `{"summary": ..}` line.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    pub device: String,
    /// CPU only: the threads every kernel of the step ran on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// The step's model FLOPs ([`ingot_compiler::flops::model`]: the matmul, convolution and
    /// attention FLOPs of the forward and backward passes, recomputation left out) over the
    /// median step time, in GFLOP/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
    /// The step's model FLOPs (on one rank).
    pub model_flops: u64,
    /// `model_flops` over the median step time, in TFLOP/s (of one GPU, with several).
    pub tflops: Option<f64>,
    /// The device's dense peak at the step's precision, TFLOP/s (`--peak-tflops`, or
    /// [`crate::flop_rate::PEAKS`]); absent for a device the table does not name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_tflops: Option<f64>,
    /// `tflops` over `peak_tflops`; absent without a peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_fraction: Option<f64>,
    /// Steps run (fewer than asked when a non-finite loss stopped the run).
    pub steps: u64,
    /// The step whose loss was NaN or infinite, where training stopped; absent when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub non_finite_loss_step: Option<u64>,
    /// The median of the steps' times, and of their wall-clock times: of every step of a run
    /// of up to [`StepTimes::WINDOW`] steps, of the last `median_of_last` steps of a longer one.
    pub median_step_seconds: Option<f64>,
    pub median_wall_seconds: Option<f64>,
    /// Present where the medians are of the last this many steps, not of all of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_of_last: Option<u64>,
    /// The plan's total: the one allocation's size, reported before launch (with a validation
    /// step, the total of the training and validation steps together).
    pub planned_bytes: usize,
    pub resident_bytes: usize,
    /// The training step's slab.
    pub slab_bytes: usize,
    /// With a validation step: how the one allocation divides between the two steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval: Option<ingot_compiler::plan::shared::SharedLayout>,
    /// Measured, beside `planned_bytes`. On a GPU: the drop in free device memory the
    /// allocation caused. On the CPU, where the process counts its heap
    /// ([`crate::host_memory`]; the `ingot` program does): the host bytes loading the step took,
    /// its one allocation (the plan's total and the threads' scratch) and its loaded program.
    pub measured_bytes: Option<usize>,
    /// GPU only: device memory in use before the allocation (CUDA context, cuBLAS, kernels).
    pub context_bytes: Option<usize>,
    /// GPU only: device memory the captured step graph took.
    pub graph_bytes: Option<usize>,
    /// GPU only: free device memory after the last step minus after the first (0: the steps
    /// allocated nothing).
    pub free_change_bytes: Option<i64>,
    /// Several GPUs: each GPU's change in free memory, rank 0 first (`free_change_bytes` is
    /// rank 0's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks_free_change_bytes: Option<Vec<i64>>,
    /// CPU only, where the process counts its heap, in a run of two steps or more: its live
    /// bytes after the last step minus as the first step left them (0: the run held no more
    /// memory at its end than after its first step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heap_change_bytes: Option<i64>,
    /// Data set runs: the loader's two staging buffers of x and y (page-locked on the GPU),
    /// allocated once before the first step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staging_bytes: Option<usize>,
    /// An offloaded step ([`ingot_compiler::plan::offload`]): the plan's host region, where
    /// the offloaded optimizer state lives between its copies; absent without offload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_bytes: Option<usize>,
    /// GPU only, an offloaded step: the page-locked host memory loading it took for that
    /// region (measured beside `host_bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_host_bytes: Option<usize>,
    /// Image folder runs: the images skipped because they could not be read or decoded (each
    /// named in a warning when it was met), in the training and validation folders.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped_images: Option<u64>,
}

/// The end of a run as its observer is told it: the summary, and what a reader of it needs
/// besides.
#[derive(Clone, Debug)]
pub struct Finished {
    pub summary: Summary,
    /// GPU only: the bytes asked of the driver for the one allocation.
    pub requested_bytes: Option<usize>,
    /// The data-parallel ranks the step runs on.
    pub data_ranks: usize,
}

/// The summary of a run of `steps` steps timed in `seconds` and `wall`, its FLOP rate from
/// `rate`.
#[allow(clippy::too_many_arguments)] // each is one figure of the run loop's own state
pub(super) fn finished(
    session: &Session,
    seconds: &StepTimes,
    wall: &StepTimes,
    steps: u64,
    free_after_first: Option<&[usize]>,
    non_finite_loss_step: Option<u64>,
    staged: bool,
    rate: &crate::flop_rate::FlopRate,
) -> Result<Finished, RunError> {
    let plan = session.exe().plan();
    let mem = session.cuda().map(|c| c.memory());
    // Per GPU: free memory now minus after the first step.
    let changes: Option<Vec<i64>> = match (free_on_gpus(session)?, free_after_first) {
        (Some(now), Some(first)) => Some(
            now.iter()
                .zip(first)
                .map(|(&n, &f)| n as i64 - f as i64)
                .collect(),
        ),
        _ => None,
    };
    let staging_bytes = staged
        .then(|| session.input_slots().ok())
        .flatten()
        .map(|s| 2 * (s[0].1 + s[1].1));
    let median = seconds.median().unwrap_or(0.0);
    let tflops = rate.tflops(median);
    let summary = Summary {
        device: session.exe().device(),
        threads: session.exe().threads(),
        gflops: tflops.map(|t| t * 1e3),
        model_flops: rate.model_flops,
        tflops,
        peak_tflops: rate.peak_tflops,
        peak_fraction: rate.fraction(median),
        steps,
        non_finite_loss_step,
        median_step_seconds: seconds.median(),
        median_wall_seconds: wall.median(),
        median_of_last: seconds.median_window(),
        planned_bytes: planned_total(session),
        resident_bytes: plan.resident_bytes,
        slab_bytes: plan.slab_bytes,
        eval: session.shared_layout(),
        measured_bytes: mem.map(|m| m.allocation).or(session.host_loaded_bytes()),
        context_bytes: mem.map(|m| m.before_allocation),
        graph_bytes: mem.map(|m| m.graph),
        free_change_bytes: changes.as_ref().and_then(|c| c.first().copied()),
        ranks_free_change_bytes: changes.filter(|c| c.len() > 1),
        heap_change_bytes: None,
        staging_bytes,
        host_bytes: Some(plan.host_bytes).filter(|&b| b > 0),
        pinned_host_bytes: mem.map(|m| m.pinned_host).filter(|&b| b > 0),
        skipped_images: None,
    };
    Ok(Finished {
        summary,
        requested_bytes: mem.map(|m| m.requested),
        data_ranks: session.exe().data_ranks(),
    })
}

/// Free device memory on each GPU the session runs on, rank 0 first (`None` on the CPU).
pub(super) fn free_on_gpus(session: &Session) -> Result<Option<Vec<usize>>, RunError> {
    let gpus = session.cuda_ranks();
    if gpus.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        gpus.into_iter()
            .map(CudaStep::free_memory)
            .collect::<Result<Vec<_>, _>>()?,
    ))
}

/// The one allocation's planned size: the training step's plan total, or with a validation
/// step, the two steps' shared total.
pub fn planned_total(session: &Session) -> usize {
    session
        .shared_layout()
        .map_or(session.exe().plan().total_bytes, |l| l.total_bytes)
}
