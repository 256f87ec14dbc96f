//! How a step's convolutions run, chosen when the step is loaded ([`cudnn::ConvSetting`]):
//! by default a channels-last convolution, and an NCHW bf16 one over few channels in the room
//! cuDNN's fast algorithm asks, run through cuDNN and any other NCHW one as its im2col
//! fallback ([`route`]); a convolution through cuDNN takes the first deterministic algorithm
//! of cuDNN's heuristic order whose workspace fits the planned one ([`cudnn::choose`]), so the
//! choice is the same in every run of one executable on one GPU model and cuDNN version.
//! Timing the candidates and the fallback on the zeroed allocation is opt-in
//! (`INGOT_CONV_TIMING=1`); it times a channels-last depthwise convolution's direct kernels
//! against cuDNN's candidates too, by default route or through cuDNN ([`how`]).

use super::conv_route::{route, setting, Route};
use super::{CudaStep, Part};
use crate::cuda::cudnn;
use crate::error::ExecError;
use ingot_compiler::lower::cuda::{Conv, DeviceOp};

/// How loading settles one convolution ([`how`]).
#[derive(Clone, Debug, PartialEq, Eq)]
enum How {
    /// As its fallback (im2col + cuBLAS, or a depthwise one's direct kernels), for this reason.
    Fallback(String),
    /// Through cuDNN's first eligible algorithm in its heuristic order.
    Heuristic,
    /// The fastest of cuDNN's candidates and its fallback, timed (`INGOT_CONV_TIMING=1`).
    Timed,
}

/// How convolution `c` is settled under `setting`, with a cuDNN handle where `loaded`, and
/// `timing` asked for: its [`route`]; under timing, a convolution routed to cuDNN, and one
/// routed to its direct depthwise kernels (channels-last with a fallback: cuDNN's candidates
/// are timed against them, as an NCHW one's against im2col under `INGOT_CONV=cudnn`).
fn how(setting: cudnn::ConvSetting, c: &Conv, loaded: bool, timing: bool) -> How {
    let direct = matches!(
        cudnn::ConvPath::fallback(c, String::new()),
        cudnn::ConvPath::Direct { .. }
    );
    match route(setting, c) {
        (Route::Im2col, _) if timing && loaded && direct => How::Timed,
        (Route::Im2col, why) => How::Fallback(why.into()),
        (Route::Cudnn, _) if !loaded => How::Fallback("cuDNN not loaded".into()),
        (Route::Cudnn, _) if timing => How::Timed,
        (Route::Cudnn, _) => How::Heuristic,
    }
}

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
                let (run, choice) = match how(setting, c, loaded, timing) {
                    How::Fallback(why) => (None, fallback(c, why)),
                    How::Timed => self.time_convolution(part, c),
                    How::Heuristic => self.heuristic_choice(c),
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
    fn heuristic_choice(&self, c: &Conv) -> (Option<cudnn::ConvRun>, cudnn::ConvChoice) {
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
            Err(reason) => (None, fallback(c, reason)),
        }
    }

    /// How convolution `c` of `part` runs: the remembered choice for its shape, else the
    /// fastest of cuDNN's candidates and the fallback, timed ([`Self::choose_convolutions`]).
    fn time_convolution(
        &self,
        part: &Part,
        c: &Conv,
    ) -> (Option<cudnn::ConvRun>, cudnn::ConvChoice) {
        let h = self.cudnn.as_ref().expect("a cuDNN handle");
        let choice = |path: cudnn::ConvPath, timings: String| cudnn::ConvChoice {
            node: c.node,
            pass: c.pass,
            path,
            timings,
        };
        let fallback = |reason: String, timings: String| {
            (None, choice(cudnn::ConvPath::fallback(c, reason), timings))
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
        // The fallback: im2col + cuBLAS, or a depthwise one's direct kernels; a channels-last
        // convolution but a depthwise one has none to time.
        let own_name = cudnn::ConvPath::fallback_name(c);
        let own = match c.fallback.is_empty() {
            true => Err("the convolution is channels-last".to_string()),
            false => time(&|| {
                for op in &c.fallback {
                    self.enqueue_on(part, op, s).map_err(|e| e.to_string())?;
                }
                Ok(())
            }),
        };
        let mut timings = vec![match &own {
            Ok(ms) => format!("{own_name} {ms:.3} ms"),
            Err(e) => format!("{own_name} failed ({e})"),
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
        match (best, own.ok()) {
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

/// The choice of running convolution `c` as its fallback ([`cudnn::ConvPath::fallback`]), and
/// why.
fn fallback(c: &Conv, reason: String) -> cudnn::ConvChoice {
    cudnn::ConvChoice {
        node: c.node,
        pass: c.pass,
        path: cudnn::ConvPath::fallback(c, reason),
        timings: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudnn::{ConvPath, ConvSetting as S};
    use ingot_compiler::autodiff::optim::Optimizer;
    use ingot_compiler::ir::{Conv2d, ConvLayout, DType, Graph, Init};
    use ingot_compiler::lower::Target;
    use ingot_compiler::model::Model;
    use ingot_compiler::pipeline::{self, Options};
    use ingot_compiler::precision::Precision;

    /// The convolution passes of a bf16 CUDA step compiled channels-last from `x [4, 3, 16,
    /// 16] -> conv 3→16 (the stem: NCHW) -> conv 16→16 (channels-last, cuDNN only) ->
    /// depthwise 3x3 (channels-last, its direct kernels)`, as (stem, dense, depthwise) passes.
    fn passes() -> (Vec<Conv>, Vec<Conv>, Vec<Conv>) {
        let mut g = Graph::new();
        let x = g.input("x", [4, 3, 16, 16], DType::F32).unwrap();
        let init = Init::Normal { std: 0.2 };
        let w0 = g.parameter("w0", [16, 3, 3, 3], DType::F32, init).unwrap();
        let w1 = g.parameter("w1", [16, 16, 3, 3], DType::F32, init).unwrap();
        let w2 = g.parameter("w2", [16, 1, 3, 3], DType::F32, init).unwrap();
        let conv = |groups: usize| Conv2d {
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups,
            layout: Default::default(),
        };
        let h = g.conv2d(x, w0, conv(1)).unwrap();
        let h = g.conv2d(h, w1, conv(1)).unwrap();
        let o = g.conv2d(h, w2, conv(16)).unwrap();
        let l = g.sum_all(o).unwrap();
        g.set_output(ingot_compiler::autodiff::LOSS, l).unwrap();
        let m = Model::new("depthwise", g, Optimizer::Sgd { lr: 1e-3 });
        let opts = Options {
            precision: Some(Precision::Bf16),
            channels_last: true.into(),
            ..Options::for_target(Target::Cuda)
        };
        let exe = pipeline::compile(&m, &opts)
            .unwrap()
            .executable(Target::Cuda)
            .unwrap();
        let ingot_compiler::lower::Program::Cuda(p) = exe.program() else {
            panic!("a CUDA program")
        };
        let convs: Vec<Conv> = (p.ops.iter())
            .filter_map(|op| match op {
                DeviceOp::Conv(c) => Some(c.clone()),
                _ => None,
            })
            .collect();
        let of = |f: &dyn Fn(&Conv) -> bool| -> Vec<Conv> {
            convs.iter().filter(|c| f(c)).cloned().collect()
        };
        let out = (
            of(&|c| c.layout == ConvLayout::Nchw),
            of(&|c| c.layout == ConvLayout::Nhwc && c.dims.groups == 1),
            of(&|c| c.dims.groups > 1),
        );
        // The stem's filter gradient at least (its data gradient is not needed), the other two
        // convolutions' three passes each.
        assert!(!out.0.is_empty(), "{convs:?}");
        assert_eq!((out.1.len(), out.2.len()), (3, 3), "{convs:?}");
        out
    }

    #[test]
    fn a_depthwise_convolutions_fallback_is_named_as_its_direct_kernels_not_im2col() {
        let (stem, dense, depthwise) = passes();
        for c in &depthwise {
            assert_eq!(c.layout, ConvLayout::Nhwc);
            assert!(!c.fallback.is_empty());
            let choice = fallback(c, c.default_route().reason().into());
            let shown = choice.to_string();
            assert!(
                matches!(choice.path, ConvPath::Direct { .. })
                    && shown.contains("direct depthwise kernels (channels-last depthwise")
                    && !shown.contains("im2col"),
                "{shown}"
            );
            assert_eq!(ConvPath::fallback_name(c), "direct");
        }
        for c in &stem {
            let shown = fallback(c, "NCHW".into()).to_string();
            assert!(shown.contains("im2col + cuBLAS (NCHW)"), "{shown}");
            assert_eq!(ConvPath::fallback_name(c), "im2col");
        }
        for c in &dense {
            assert!(c.fallback.is_empty());
            assert_eq!(ConvPath::fallback_name(c), "none");
        }
    }

    #[test]
    fn under_conv_timing_a_depthwise_convolution_is_timed_against_cudnn_and_otherwise_runs_direct()
    {
        let (stem, dense, depthwise) = passes();
        let fell_back = |h: How, word: &str| matches!(&h, How::Fallback(w) if w.contains(word));
        for c in &depthwise {
            // Timing times its direct kernels against cuDNN's candidates, by default route
            // and through cuDNN alike; without timing the default runs them untimed.
            assert_eq!(how(S::Auto, c, true, true), How::Timed);
            assert_eq!(how(S::Cudnn, c, true, true), How::Timed);
            assert!(fell_back(how(S::Auto, c, true, false), "depthwise"));
            assert_eq!(how(S::Cudnn, c, true, false), How::Heuristic);
            // Nothing to time against without cuDNN.
            assert!(fell_back(how(S::Auto, c, false, true), "depthwise"));
        }
        for c in &dense {
            assert_eq!(how(S::Auto, c, true, true), How::Timed);
            assert_eq!(how(S::Auto, c, true, false), How::Heuristic);
            assert!(fell_back(how(S::Auto, c, false, true), "not loaded"));
        }
        for c in &stem {
            // An NCHW one routed to im2col stays untimed by default, as before.
            assert!(fell_back(how(S::Auto, c, true, true), "NCHW"));
            assert_eq!(how(S::Cudnn, c, true, true), How::Timed);
        }
    }
}
