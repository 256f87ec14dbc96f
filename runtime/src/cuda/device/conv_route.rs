//! Which path each convolution of a step takes, from the `INGOT_CONV` setting and the
//! convolution as the executable holds it ([`route`]; by default [`Conv::default_route`]), and the cuDNN handle a step needs for it ([`cudnn_handle`]); a step
//! whose channels-last convolutions cannot run is refused at load ([`check_channels_last`]).
//! What runs on the device to choose an algorithm is `conv_choice`'s.

use crate::cuda::cudnn;
use crate::error::ExecError;
use cudarc::driver::CudaStream;
use ingot_compiler::ir::{ConvLayout, NodeId};
use ingot_compiler::lower::cuda::{Conv, DeviceOp, Program};

/// Where one convolution runs, from the setting and the convolution alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// Through cuDNN (its fallback, where it has one, if cuDNN takes none of its algorithms).
    Cudnn,
    /// As its fallback: im2col + cuBLAS.
    Im2col,
}

/// Where convolution `c` runs under `setting`, and why: by default where the executable says
/// ([`Conv::default_route`]: channels-last convolutions through cuDNN, the only path that runs
/// them; an NCHW bf16 one over few channels through cuDNN where its planned workspace holds
/// the room cuDNN's fast algorithm asks; other NCHW ones as im2col + cuBLAS, which cuDNN's
/// heuristic order did not beat in NCHW: session 29, its first NCHW algorithms 1.0x to 7x
/// the fallback's time on resnet50's convolutions, the step 6.6x); `INGOT_CONV=cudnn` sends
/// every one to cuDNN, `INGOT_CONV=im2col` none (a channels-last step is refused there by
/// [`check_channels_last`]).
pub(super) fn route(setting: cudnn::ConvSetting, c: &Conv) -> (Route, &'static str) {
    use cudnn::ConvSetting as S;
    match setting {
        S::Cudnn => (Route::Cudnn, "INGOT_CONV=cudnn"),
        S::Im2col => (Route::Im2col, "INGOT_CONV=im2col"),
        S::Auto => {
            let r = c.default_route();
            let path = if r.cudnn() {
                Route::Cudnn
            } else {
                Route::Im2col
            };
            (path, r.reason())
        }
    }
}

/// The convolutions' setting, as an error of loading where it is misspelt.
pub(super) fn setting() -> Result<cudnn::ConvSetting, ExecError> {
    cudnn::conv_path().map_err(|reason| ExecError::Device {
        what: "choosing the convolutions' path".into(),
        reason,
    })
}

/// The first channels-last convolution of `programs` that only cuDNN runs (one with no
/// fallback: a depthwise one has its direct kernels), if any.
fn first_nhwc(programs: &[&Program]) -> Option<NodeId> {
    programs
        .iter()
        .flat_map(|p| &p.ops)
        .find_map(|op| match op {
            DeviceOp::Conv(c) if c.layout == ConvLayout::Nhwc && c.fallback.is_empty() => {
                Some(c.node)
            }
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

/// A cuDNN handle on `stream` where a convolution of `programs` runs through cuDNN
/// ([`route`]): by default only for a step with channels-last convolutions or a few-channel
/// bf16 one in its cuDNN room, under
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
        .any(|op| matches!(op, DeviceOp::Conv(c) if route(setting, c).0 == Route::Cudnn));
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
    fn by_default_channels_last_convolutions_run_through_cudnn_and_nchw_ones_as_the_executable_says(
    ) {
        use cudnn::ConvSetting as S;
        // The cnn's step compiled channels-last: its first convolution (one input channel)
        // keeps NCHW and, f32, runs as im2col; the second (32) runs through cuDNN.
        let p = program(true);
        let routes: Vec<(ConvLayout, Route)> = (p.ops.iter())
            .filter_map(|op| match op {
                DeviceOp::Conv(c) => Some((c.layout, route(S::Auto, c).0)),
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
        for op in &p.ops {
            let DeviceOp::Conv(c) = op else { continue };
            // The default follows the executable's own account of each convolution.
            let (r, why) = route(S::Auto, c);
            assert_eq!(r == Route::Cudnn, c.default_route().cudnn(), "{why}");
            assert_eq!(why, c.default_route().reason());
            // The settings override it, whatever the layout.
            assert_eq!(route(S::Cudnn, c).0, Route::Cudnn);
            assert_eq!(route(S::Im2col, c).0, Route::Im2col);
        }
        // A few-channel NCHW bf16 convolution whose room is large goes to cuDNN by default
        // where its workspace holds the room; the same with one byte less of workspace, in
        // f32, or over a small batch (a small room: the cnn's own, measured slower through
        // cuDNN) stays im2col.
        use ingot_compiler::lower::cuda::conv::{cudnn_few_channel_room, LARGE_ROOM};
        let nchw = (p.ops.iter())
            .find_map(|op| match op {
                DeviceOp::Conv(c) if c.layout == ConvLayout::Nchw => Some(c.clone()),
                _ => None,
            })
            .expect("an NCHW convolution");
        let mut bf16 = nchw.clone();
        bf16.dtype = ingot_compiler::ir::DType::BF16;
        let small = cudnn_few_channel_room(&bf16.dims, ConvLayout::Nchw, 2);
        assert!(small > 0 && small <= LARGE_ROOM, "{small}");
        bf16.workspace.bytes = 2 * LARGE_ROOM;
        assert_eq!(route(S::Auto, &bf16).0, Route::Im2col);
        bf16.dims.batch = 4096;
        let room = cudnn_few_channel_room(&bf16.dims, ConvLayout::Nchw, 2);
        assert!(room > LARGE_ROOM, "{room}");
        bf16.workspace.bytes = room;
        assert_eq!(route(S::Auto, &bf16).0, Route::Cudnn);
        bf16.workspace.bytes = room - 1;
        assert_eq!(route(S::Auto, &bf16).0, Route::Im2col);
        let mut f32 = bf16.clone();
        f32.dtype = nchw.dtype;
        f32.workspace.bytes = 2 * room;
        assert_eq!(route(S::Auto, &f32).0, Route::Im2col);
        assert_eq!(first_nhwc(&[&program(false)]), None);
        assert!(first_nhwc(&[&p]).is_some());
    }

    /// A step whose channels-last convolutions are all depthwise (each with its direct
    /// kernels as fallback) needs no cuDNN: found on an H200 (session 42), where such a step
    /// was refused at load for want of a cuDNN handle nothing asked for.
    #[test]
    fn a_step_whose_channels_last_convolutions_all_have_direct_kernels_loads_without_cudnn() {
        let mut p = program(true);
        assert!(check_channels_last(&[&p], false).is_err());
        let stand_in = (p.ops.iter())
            .find_map(|op| match op {
                DeviceOp::Launch { kernel, .. } => Some(*kernel),
                _ => None,
            })
            .expect("a launch");
        for op in p.ops.iter_mut() {
            if let DeviceOp::Conv(c) = op {
                if c.layout == ConvLayout::Nhwc {
                    c.fallback = vec![DeviceOp::Launch {
                        node: c.node,
                        kernel: stand_in,
                        args: Default::default(),
                    }];
                }
            }
        }
        assert_eq!(first_nhwc(&[&p]), None);
        check_channels_last(&[&p], false).unwrap();
    }
}
