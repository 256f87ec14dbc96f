//! How a step's convolutions run, chosen when the step is loaded ([`cudnn::ConvSetting`]):
//! by default a channels-last convolution, and an NCHW bf16 one over few channels in the room
//! cuDNN's fast algorithm asks, run through cuDNN and any other NCHW one as its im2col
//! fallback ([`route`]); a convolution through cuDNN takes the first deterministic algorithm
//! of cuDNN's heuristic order whose workspace fits the planned one ([`cudnn::choose`]), so the
//! choice is the same in every run of one executable on one GPU model and cuDNN version.
//! Timing the candidates and the fallback on the zeroed allocation is opt-in
//! (`INGOT_CONV_TIMING=1`).

use super::conv_route::{route, setting, Route};
use super::{CudaStep, Part};
use crate::cuda::cudnn;
use crate::error::ExecError;
use ingot_compiler::ir::ConvLayout;
use ingot_compiler::lower::cuda::DeviceOp;

impl CudaStep {
    /// Chooses how each convolution runs, outside any capture, on the zeroed allocation (a
    /// convolution of zeros writes zeros): its [`route`], and through cuDNN the first
    /// eligible algorithm in cuDNN's heuristic order ([`cudnn::choose`]), run once so that
    /// cuDNN loads its kernels now. Under `INGOT_CONV_TIMING=1` the eligible algorithms and
    /// the fallback are timed instead and the fastest taken ([`Self::time_convolution`]).
    /// Each choice is printed under `INGOT_LOG`. A step that loaded no cuDNN handle (none of
    /// its convolutions routes there) records every convolution as its fallback, with why, so
    /// that its choices are as complete as a step's through cuDNN.
    pub(super) fn choose_convolutions(&mut self) -> Result<(), ExecError> {
        let loaded = self.cudnn.is_some();
        let setting = setting()?;
        let timing = loaded && cudnn::timing();
        if timing {
            cudnn::say_once(
                "timing",
                &format!(
                    "{}: timing each convolution's cuDNN algorithms and fallback at load and \
                     keeping the fastest; another run may choose otherwise and compute other bits",
                    cudnn::CONV_TIMING
                ),
            );
        }
        for eval in [false, true] {
            let part = match (eval, &self.eval) {
                (false, _) => &self.main,
                (true, Some(e)) => e,
                (true, None) => break,
            };
            let mut chosen = Vec::new();
            for op in &part.program.ops {
                let DeviceOp::Conv(c) = op else {
                    continue;
                };
                let (run, choice) = match route(setting, c) {
                    (Route::Im2col, why) => (None, im2col(c, why.into())),
                    (Route::Cudnn, _) if !loaded => (None, im2col(c, "cuDNN not loaded".into())),
                    (Route::Cudnn, _) if timing => self.time_convolution(part, c),
                    (Route::Cudnn, _) => self.heuristic_choice(c),
                };
                if run.is_none() && c.fallback.is_empty() {
                    return Err(ExecError::Device {
                        what: format!("choosing how convolution node %{} runs", c.node.0),
                        reason: format!(
                            "it is channels-last, which only cuDNN runs, and cuDNN gave no \
                             algorithm that runs it ({choice}); compile the step again with \
                             {}=im2col",
                            cudnn::CONV_PATH
                        ),
                    });
                }
                if cudnn::logging() {
                    let which = if eval { "eval step" } else { "step" };
                    eprintln!("{which}: {choice}");
                }
                chosen.push((c.node, run, choice));
            }
            let part = if eval {
                self.eval.as_mut().expect("an eval step")
            } else {
                &mut self.main
            };
            for (node, run, choice) in chosen {
                if let Some(run) = run {
                    part.convs.insert(node, run);
                }
                part.conv_choices.push(choice);
            }
        }
        Ok(())
    }

    /// Convolution `c` through cuDNN's first eligible algorithm ([`cudnn::choose`]), run once
    /// here (cuDNN loads its kernels outside the capture); its fallback, and why, where cuDNN
    /// takes none or the run fails.
    fn heuristic_choice(
        &self,
        c: &ingot_compiler::lower::cuda::Conv,
    ) -> (Option<cudnn::ConvRun>, cudnn::ConvChoice) {
        let h = self.cudnn.as_ref().expect("a cuDNN handle");
        let run = cudnn::choose(h, c).and_then(|run| {
            // SAFETY: the program's check put every byte of `c` inside the allocation at
            // `self.base`; the stream is the handle's.
            unsafe { run.enqueue(h, c, self.base) }?;
            self.stream.synchronize().map_err(|e| e.to_string())?;
            Ok(run)
        });
        match run {
            Ok(run) => {
                let choice = run.choice.clone();
                (Some(run), choice)
            }
            Err(reason) => (None, im2col(c, reason)),
        }
    }

    /// How convolution `c` of `part` runs: the remembered choice for its shape, else the
    /// fastest of cuDNN's candidates and the fallback, timed ([`Self::choose_convolutions`]).
    fn time_convolution(
        &self,
        part: &Part,
        c: &ingot_compiler::lower::cuda::Conv,
    ) -> (Option<cudnn::ConvRun>, cudnn::ConvChoice) {
        let h = self.cudnn.as_ref().expect("a cuDNN handle");
        let choice = |path: cudnn::ConvPath, timings: String| cudnn::ConvChoice {
            node: c.node,
            pass: c.pass,
            path,
            timings,
        };
        let fallback = |reason: String, timings: String| {
            (None, choice(cudnn::ConvPath::Im2col { reason }, timings))
        };
        let candidates = match cudnn::candidates(h, c) {
            Ok(v) => v,
            Err(reason) => return fallback(reason, String::new()),
        };
        if let Some(known) = cudnn::remembered(c) {
            return match candidates.into_iter().find(|r| Some(r.algo()) == known) {
                Some(run) => {
                    let path = run.choice.path.clone();
                    (Some(run), choice(path, String::new()))
                }
                None => fallback(
                    "faster when a convolution of this shape was timed".into(),
                    String::new(),
                ),
            };
        }
        // Milliseconds a run of `f` takes: one run (loading its kernels), then three timed.
        let time = |f: &dyn Fn() -> Result<(), String>| -> Result<f32, String> {
            let sync = || self.stream.synchronize().map_err(|e| e.to_string());
            f()?;
            sync()?;
            self.start.record(&self.stream).map_err(|e| e.to_string())?;
            for _ in 0..3 {
                f()?;
            }
            self.stop.record(&self.stream).map_err(|e| e.to_string())?;
            sync()?;
            let ms = self
                .start
                .elapsed_ms(&self.stop)
                .map_err(|e| e.to_string())?;
            Ok(ms / 3.0)
        };
        let s = self.stream.cu_stream();
        // A channels-last convolution has no fallback to time ([`ConvLayout::Nhwc`]).
        let im2col = match c.layout {
            ConvLayout::Nhwc => Err("none: the convolution is channels-last".to_string()),
            ConvLayout::Nchw => time(&|| {
                for op in &c.fallback {
                    self.enqueue_on(part, op, s).map_err(|e| e.to_string())?;
                }
                Ok(())
            }),
        };
        let mut timings = vec![match &im2col {
            Ok(ms) => format!("im2col {ms:.3} ms"),
            Err(e) => format!("im2col failed ({e})"),
        }];
        let mut best: Option<(f32, cudnn::ConvRun)> = None;
        for run in candidates {
            let name = match &run.choice.path {
                cudnn::ConvPath::Cudnn { algo, .. } => algo.clone(),
                _ => String::new(),
            };
            // SAFETY: the program's check put every byte of `c` inside the allocation at
            // `self.base`; the stream is the handle's.
            let timed = time(&|| unsafe { run.enqueue(h, c, self.base) });
            match timed {
                Ok(ms) => {
                    timings.push(format!("{name} {ms:.3} ms"));
                    if best.as_ref().is_none_or(|(b, _)| ms < *b) {
                        best = Some((ms, run));
                    }
                }
                Err(e) => timings.push(format!("{name} failed ({e})")),
            }
        }
        let timings = timings.join(", ");
        let im2col = im2col.ok();
        match (best, im2col) {
            (Some((ms, run)), f) if f.is_none_or(|f| ms < f) => {
                cudnn::remember(c, Some(run.algo()));
                let path = run.choice.path.clone();
                (Some(run), choice(path, timings))
            }
            (None, _) => fallback("every cuDNN algorithm failed to run".into(), timings),
            _ => {
                cudnn::remember(c, None);
                fallback("faster than cuDNN's algorithms".into(), timings)
            }
        }
    }
}

/// The choice of running convolution `c` as its fallback, and why.
fn im2col(c: &ingot_compiler::lower::cuda::Conv, reason: String) -> cudnn::ConvChoice {
    cudnn::ConvChoice {
        node: c.node,
        pass: c.pass,
        path: cudnn::ConvPath::Im2col { reason },
        timings: String::new(),
    }
}
