//! How a step's convolutions run, chosen when the step is loaded ([`cudnn::ConvSetting`]):
//! by default a channels-last convolution runs through cuDNN and an NCHW one as its im2col
//! fallback ([`route`]); a convolution through cuDNN takes the first deterministic algorithm
//! of cuDNN's heuristic order whose workspace fits the planned one ([`cudnn::choose`]), so the
//! choice is the same in every run of one executable on one GPU model and cuDNN version.
//! Timing the candidates and the fallback on the zeroed allocation is opt-in
//! (`INGOT_CONV_TIMING=1`).

use super::*;
use ingot_compiler::ir::ConvLayout;

/// Where one convolution runs, from the setting and its layout alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// Through cuDNN (its fallback, where it has one, if cuDNN takes none of its algorithms).
    Cudnn,
    /// As its fallback: im2col + cuBLAS.
    Im2col,
}

/// Where a convolution of `layout` runs under `setting`: the default sends channels-last
/// convolutions to cuDNN (the only path that runs them) and keeps NCHW ones on im2col +
/// cuBLAS, which cuDNN's heuristic order did not beat in NCHW (session 29: its first NCHW
/// algorithms 1.0x to 7x the fallback's time on resnet50's convolutions, the step 6.6x);
/// `INGOT_CONV=cudnn` sends every one to cuDNN, `INGOT_CONV=im2col` none.
pub(super) fn route(setting: cudnn::ConvSetting, layout: ConvLayout) -> Route {
    use cudnn::ConvSetting as S;
    match (setting, layout) {
        (S::Cudnn, _) | (_, ConvLayout::Nhwc) => Route::Cudnn,
        (S::Auto | S::Im2col, ConvLayout::Nchw) => Route::Im2col,
    }
}

/// The convolutions' setting, as an error of loading where it is misspelt.
fn setting() -> Result<cudnn::ConvSetting, ExecError> {
    cudnn::conv_path().map_err(|reason| ExecError::Device {
        what: "choosing the convolutions' path".into(),
        reason,
    })
}

/// The first channels-last convolution of `programs`, if any.
fn first_nhwc(programs: &[&Program]) -> Option<NodeId> {
    programs
        .iter()
        .flat_map(|p| &p.ops)
        .find_map(|op| match op {
            DeviceOp::Conv(c) if c.layout == ConvLayout::Nhwc => Some(c.node),
            _ => None,
        })
}

/// What a user does about a channels-last step that cannot run here.
fn ways_out() -> String {
    format!(
        "either install cuDNN 9 ({}), or compile the step again with {}=im2col (or `--conv \
         im2col`), which stores its convolutions NCHW and runs them as im2col + cuBLAS",
        cudnn::CUDNN.install_hint,
        cudnn::CONV_PATH
    )
}

/// Refuses a step with a channels-last convolution where no cuDNN handle was made: the im2col
/// fallback reads NCHW images, so such a convolution runs only through cuDNN.
pub(super) fn check_channels_last(programs: &[&Program], cudnn: bool) -> Result<(), ExecError> {
    match first_nhwc(programs) {
        Some(node) if !cudnn => Err(ExecError::Device {
            what: format!("loading channels-last convolution node %{}", node.0),
            reason: format!(
                "the step was compiled with channels-last convolutions, which only cuDNN \
                 ({}) runs, and cuDNN is not in use here ({}=im2col); unset {} to run it \
                 through cuDNN, or {}",
                cudnn::CUDNN.file,
                cudnn::CONV_PATH,
                cudnn::CONV_PATH,
                ways_out()
            ),
        }),
        _ => Ok(()),
    }
}

impl CudaStep {
    /// Chooses how each convolution runs, outside any capture, on the zeroed allocation (a
    /// convolution of zeros writes zeros): its [`route`], and through cuDNN the first
    /// eligible algorithm in cuDNN's heuristic order ([`cudnn::choose`]), run once so that
    /// cuDNN loads its kernels now. Under `INGOT_CONV_TIMING=1` the eligible algorithms and
    /// the fallback are timed instead and the fastest taken ([`Self::time_convolution`]).
    /// Each choice is printed under `INGOT_LOG`.
    pub(super) fn choose_convolutions(&mut self) -> Result<(), ExecError> {
        if self.cudnn.is_none() {
            return Ok(());
        }
        let setting = setting()?;
        let timing = cudnn::timing();
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
                let (run, choice) = match route(setting, c.layout) {
                    Route::Im2col => (None, im2col(c, "NCHW: the default runs it so".into())),
                    Route::Cudnn if timing => self.time_convolution(part, c),
                    Route::Cudnn => self.heuristic_choice(c),
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

/// A cuDNN handle on `stream` where a convolution of `programs` runs through cuDNN
/// ([`route`]): by default only for a step with channels-last convolutions, under
/// `INGOT_CONV=cudnn` for any with convolutions; `None` otherwise. Where cuDNN does not load,
/// a step with channels-last convolutions is refused, naming the library and the ways out; an
/// NCHW step runs its fallback (said once on stderr).
pub(super) fn cudnn_handle(
    stream: &CudaStream,
    programs: &[&Program],
) -> Result<Option<cudnn::Handle>, ExecError> {
    let setting = setting()?;
    let nhwc = first_nhwc(programs);
    let wanted = programs
        .iter()
        .flat_map(|p| &p.ops)
        .any(|op| matches!(op, DeviceOp::Conv(c) if route(setting, c.layout) == Route::Cudnn));
    // A channels-last step under INGOT_CONV=im2col is refused by `check_channels_last`.
    if !wanted || setting == cudnn::ConvSetting::Im2col {
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
    match (handle, nhwc) {
        (Ok(h), _) => Ok(Some(h)),
        (Err(e), Some(node)) => Err(ExecError::Device {
            what: format!("loading channels-last convolution node %{}", node.0),
            reason: format!(
                "the step was compiled with channels-last convolutions, which only cuDNN ({}) \
                 runs, and cuDNN does not load here: {e}; {}",
                cudnn::CUDNN.file,
                ways_out()
            ),
        }),
        (Err(e), None) => {
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
            channels_last: channels_last.into(),
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
            e.contains("channels-last convolution node %")
                && e.contains("libcudnn.so.9")
                && e.contains("INGOT_CONV=im2col"),
            "{e}"
        );
        check_channels_last(&[&nhwc], true).unwrap();
        check_channels_last(&[&program(false)], false).unwrap();
    }

    #[test]
    fn by_default_channels_last_convolutions_run_through_cudnn_and_nchw_ones_as_im2col() {
        use cudnn::ConvSetting as S;
        assert_eq!(route(S::Auto, ConvLayout::Nhwc), Route::Cudnn);
        assert_eq!(route(S::Auto, ConvLayout::Nchw), Route::Im2col);
        assert_eq!(route(S::Cudnn, ConvLayout::Nchw), Route::Cudnn);
        assert_eq!(route(S::Cudnn, ConvLayout::Nhwc), Route::Cudnn);
        assert_eq!(route(S::Im2col, ConvLayout::Nchw), Route::Im2col);
        // The cnn's step compiled channels-last: its first convolution (one input channel)
        // keeps NCHW and runs as im2col, the second (32) runs through cuDNN.
        let p = program(true);
        let routes: Vec<(ConvLayout, Route)> = (p.ops.iter())
            .filter_map(|op| match op {
                DeviceOp::Conv(c) => Some((c.layout, route(S::Auto, c.layout))),
                _ => None,
            })
            .collect();
        assert!(
            routes.contains(&(ConvLayout::Nchw, Route::Im2col)),
            "{routes:?}"
        );
        assert!(
            routes.contains(&(ConvLayout::Nhwc, Route::Cudnn)),
            "{routes:?}"
        );
        assert_eq!(first_nhwc(&[&program(false)]), None);
        assert!(first_nhwc(&[&p]).is_some());
    }
}
