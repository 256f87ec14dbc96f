//! How a step's convolutions run, chosen when the step is loaded: cuDNN's handle where
//! `INGOT_CONV=cudnn` asks for it, and for each convolution the fastest of cuDNN's
//! deterministic candidates and its im2col fallback, timed on the zeroed allocation.

use super::*;
use ingot_compiler::ir::ConvLayout;

/// Refuses a step with a channels-last convolution where no cuDNN handle was made: the im2col
/// fallback reads NCHW images, so such a convolution runs only through cuDNN.
pub(super) fn check_channels_last(programs: &[&Program], cudnn: bool) -> Result<(), ExecError> {
    let nhwc = programs
        .iter()
        .flat_map(|p| &p.ops)
        .find_map(|op| match op {
            DeviceOp::Conv(c) if c.layout == ConvLayout::Nhwc => Some(c.node),
            _ => None,
        });
    match nhwc {
        Some(node) if !cudnn => Err(ExecError::Device {
            what: format!("loading channels-last convolution node %{}", node.0),
            reason: format!(
                "the step was compiled with channels-last convolutions, which only cuDNN runs, \
                 and cuDNN is not in use: set {}=cudnn with cuDNN 9 installed, or compile the \
                 step without channels-last (for the CUDA target it is chosen only under \
                 {}=cudnn)",
                cudnn::CONV_PATH,
                cudnn::CONV_PATH
            ),
        }),
        _ => Ok(()),
    }
}

impl CudaStep {
    /// Chooses how each convolution runs, outside any capture, on the zeroed allocation (a
    /// convolution of zeros writes zeros): each of cuDNN's candidates ([`cudnn::candidates`])
    /// and the fallback run once (cuDNN and the fallback load their kernels now) and then are
    /// timed over three runs; the fastest is taken. The choice is kept for every later
    /// convolution of the same shape in the process ([`cudnn::remembered`]), which then runs
    /// without timing. Each choice (with its timings) is printed under `INGOT_LOG`.
    pub(super) fn choose_convolutions(&mut self) -> Result<(), ExecError> {
        if self.cudnn.is_none() {
            return Ok(());
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
                let (run, choice) = self.time_convolution(part, c);
                if run.is_none() && c.fallback.is_empty() {
                    return Err(ExecError::Device {
                        what: format!("choosing how convolution node %{} runs", c.node.0),
                        reason: format!(
                            "it is channels-last, which only cuDNN runs, and cuDNN gave no \
                             algorithm that runs it ({choice}); compile the step without \
                             channels-last convolutions (unset {})",
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

/// The CUDA program of `exe`; an error naming its target if it was lowered for another.
/// A cuDNN handle on `stream` for a program with convolutions where `INGOT_CONV=cudnn` asks
/// for it; `None` by default (the fallback) or where cuDNN does not load (said once on
/// stderr).
pub(super) fn cudnn_handle(stream: &CudaStream) -> Result<Option<cudnn::Handle>, ExecError> {
    let setting = cudnn::conv_path().map_err(|reason| ExecError::Device {
        what: "choosing the convolutions' path".into(),
        reason,
    })?;
    if setting == cudnn::ConvSetting::Im2col {
        return Ok(None);
    }
    let handle = cudnn::load().and_then(|lib| {
        let h = cudnn::Handle::new(lib, stream)?;
        if cudnn::logging() {
            cudnn::say_once(
                "loaded",
                &format!("cuDNN {} loaded from {}", lib.version, lib.path),
            );
        }
        Ok(h)
    });
    match handle {
        Ok(h) => Ok(Some(h)),
        Err(e) => {
            cudnn::say_once(
                "missing",
                &format!("warning: convolutions run as im2col + cuBLAS GEMMs, not cuDNN: {e}"),
            );
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_compiler::lower::Target;
    use ingot_compiler::pipeline::{self, Options};

    /// The CUDA program of the cnn's step, channels-last where asked.
    fn program(channels_last: bool) -> Program {
        let m = ingot_models::by_name("cnn").unwrap();
        let opts = Options {
            channels_last,
            ..Options::for_target(Target::Cuda)
        };
        let exe = pipeline::compile(&m, &opts)
            .unwrap()
            .executable(Target::Cuda)
            .unwrap();
        match exe.program() {
            ingot_compiler::lower::Program::Cuda(p) => p.clone(),
            _ => panic!("a CUDA program"),
        }
    }

    #[test]
    fn a_channels_last_step_without_cudnn_is_refused_naming_the_convolution_and_the_fix() {
        let nhwc = program(true);
        let e = check_channels_last(&[&nhwc], false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("channels-last convolution node %") && e.contains("INGOT_CONV=cudnn"),
            "{e}"
        );
        check_channels_last(&[&nhwc], true).unwrap();
        check_channels_last(&[&program(false)], false).unwrap();
    }
}
