//! A convolution pass as one device operation for cuDNN ([`Conv`]): its geometry, dtype,
//! compute type and pass, the byte offsets of its three tensors and of its planned workspace,
//! and the im2col / col2im launches and cuBLAS GEMMs that compute the same pass, kept inside
//! the operation as its fallback.
//!
//! The lowering cannot know whether the machine that loads the step has cuDNN, nor which of
//! cuDNN's algorithms suit its GPU; both are settled when the step is loaded (the runtime's
//! `cuda::cudnn`): cuDNN's heuristics, keeping the first deterministic algorithm whose
//! workspace fits the planned one, else the fallback. The workspace is planned exactly as the
//! fallback needs it (`super::window`: at least one image's column buffer and cuBLAS's
//! workspace, up to a chunk's where the step's peak leaves room), so both paths run in what
//! the plan holds and nothing is allocated at run time; cuDNN's implicit-GEMM algorithms need
//! none of it, the others get up to the whole of it. A convolution over fewer than 8 input
//! channels (a stem) may grow further, into room for the padded copies cuDNN's fast
//! algorithms make of it ([`cudnn_few_channel_room`]).

// `Conv` holds its fallback's `DeviceOp`s and `DeviceOp::Conv` holds a `Conv`: the two types
// are defined together in the program's format (`program.rs`), and named here as well.
pub use super::program::{Conv, ConvPass};
use super::program::{DeviceOp, Program};
use crate::ir::ConvLayout;
use ingot_kernels::cpu::conv::ConvGeometry;

/// The input channels (of one group) cuDNN's tensor-core kernels read a pixel at a time: a
/// convolution over fewer is run by cuDNN on a copy of its input padded to this many.
pub const CUDNN_CHANNEL_PAD: usize = 8;

/// The workspace in which cuDNN runs a convolution over few input channels (fewer than
/// [`CUDNN_CHANNEL_PAD`], one group: an image model's stem) by its fast algorithm; 0 for any
/// other convolution, which needs nothing of the kind.
///
/// Measured on an H200 with cuDNN 9.19 (session 39, `runtime/examples/conv_probe.rs`) for
/// resnet50's stem (x `[128, 3, 224, 224]` bf16, w `[64, 3, 7, 7]`, stride 2, padding 3): the
/// heuristics' first deterministic filter-gradient algorithm (`ALGO_1`) asks 314,453,136 bytes
/// in NCHW and runs in 1.00 ms; within the 54.7 MB the im2col fallback was planned it gets a
/// variant of 37,728 bytes that runs in 4.88 ms. Its bytes are, to the byte, the input copied
/// channels-last and padded to 8 channels (102,760,448 + 50,192), `dy` copied channels-last
/// (205,520,896: none in a channels-last convolution, which asks 108,932,240) and 61 f32 copies
/// of the padded filter (6,121,600) for its split sums; the forward asks the same less the
/// split sums (308,331,536 NCHW: 1.39 ms against 1.51 ms in 588 bytes; 102,810,640
/// channels-last: 0.97 ms against 1.56). So this asks the input padded, the output copied
/// where the convolution is NCHW, 64 f32 copies of the padded filter and 1 MiB, for every
/// pass; the planner grants it only where the step's peak leaves room
/// ([`crate::plan::WorkspaceNeed::up_to`]), and the runtime's choice stays cuDNN's first
/// deterministic algorithm that fits what was granted.
pub fn cudnn_few_channel_room(geo: &ConvGeometry, layout: ConvLayout, e: usize) -> usize {
    if geo.groups != 1 || geo.in_ch >= CUDNN_CHANNEL_PAD {
        return 0;
    }
    let [h, w] = geo.in_hw;
    let padded_input = geo.batch * h * w * CUDNN_CHANNEL_PAD * e;
    let output_copy = match layout {
        ConvLayout::Nchw => geo.batch * geo.out_ch * geo.positions() * e,
        ConvLayout::Nhwc => 0,
    };
    let padded_filter = geo.out_ch * CUDNN_CHANNEL_PAD * geo.kernel[0] * geo.kernel[1];
    padded_input + output_copy + 64 * padded_filter * 4 + (1 << 20)
}

/// Where a convolution pass runs when the step is loaded with the default setting (the
/// runtime's `INGOT_CONV` unset), and why: a function of the executable alone
/// ([`Conv::default_route`]), so every run of one executable routes alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DefaultRoute {
    /// Channels-last: only cuDNN runs it (it has no fallback).
    ChannelsLast,
    /// Channels-last and depthwise, with Ingot's direct kernels as its fallback
    /// (`super::depthwise`): they run it. Measured on an H200 (session 42, docs/benchmarks.md):
    /// the imported convnext_tiny's 7x7 depthwise convolutions through cuDNN's first
    /// deterministic algorithms took most of its step.
    Depthwise,
    /// NCHW over fewer than [`CUDNN_CHANNEL_PAD`] input channels (a stem), bf16, whose
    /// [`cudnn_few_channel_room`] is more than an im2col chunk's largest workspace
    /// ([`LARGE_ROOM`]) and whose planned workspace holds it: cuDNN's fast algorithm runs in it
    /// (session 39: resnet50's stem 1.38 + 1.00 ms through cuDNN against 1.51 + 4.88 ms in the
    /// im2col chunk's workspace; docs/benchmarks.md).
    FewChannelsInRoom,
    /// Any other NCHW convolution: its fallback, im2col + cuBLAS, which cuDNN's NCHW
    /// algorithms did not beat (session 29).
    Im2col,
}

impl DefaultRoute {
    /// Whether the pass runs through cuDNN (where cuDNN loads and takes an algorithm).
    pub fn cudnn(self) -> bool {
        !matches!(self, DefaultRoute::Im2col | DefaultRoute::Depthwise)
    }

    /// Whether this is [`DefaultRoute::FewChannelsInRoom`].
    pub fn few_channels_in_room(self) -> bool {
        self == DefaultRoute::FewChannelsInRoom
    }

    /// Why, in a few words (the runtime's `INGOT_LOG` and `ingot inspect` print it).
    pub fn reason(self) -> &'static str {
        match self {
            DefaultRoute::ChannelsLast => "channels-last: only cuDNN runs it",
            DefaultRoute::Depthwise => "channels-last depthwise: Ingot's direct kernels",
            DefaultRoute::FewChannelsInRoom => {
                "NCHW over few channels, bf16, in the large room cuDNN's fast algorithm asks"
            }
            DefaultRoute::Im2col => "NCHW: the default runs it so",
        }
    }
}

/// The least [`cudnn_few_channel_room`] for which a few-channel NCHW convolution goes to
/// cuDNN by default: more than the largest workspace an im2col chunk is planned where one
/// image's columns fit the column budget (`workspace::COLUMN_BUDGET` and
/// `workspace::CUBLAS_WORKSPACE`, 32 MiB each; a test holds them equal). Measured on an H200 (session 40, docs/benchmarks.md), bf16, batch
/// 128, every such convolution through cuDNN against im2col: resnet50's stem at 224 (room
/// 315.8 MB) took the step from 31.11 to 29.24 ms; resnet18's CIFAR stem (3 channels at
/// 32x32, room 9.5 MB) 1.684 to 1.666 ms; the cnn's first layer (1 channel at 28x28, room
/// under 10 MB) 0.224 to 0.246 ms, slower. Below this bound cuDNN's padded copies cost about
/// what they save, so small stems keep im2col.
pub const LARGE_ROOM: usize = 64 << 20;

impl Conv {
    /// Where this pass runs by default ([`DefaultRoute`]): a channels-last one through cuDNN,
    /// but a depthwise one by its direct kernels (its fallback);
    /// an NCHW one over few input channels, in bf16, through cuDNN where the room cuDNN's fast
    /// algorithm asks ([`cudnn_few_channel_room`]) is large ([`LARGE_ROOM`]) and the plan
    /// granted it (where the step's peak left no room, cuDNN would run a slower variant, and
    /// im2col keeps the path it had); every other NCHW one as im2col + cuBLAS. f32 and tf32
    /// passes keep im2col: the room was measured for bf16 only.
    pub fn default_route(&self) -> DefaultRoute {
        if self.layout == ConvLayout::Nhwc {
            // A channels-last fallback is the depthwise kernels (no im2col reads NHWC).
            return match self.fallback.is_empty() {
                true => DefaultRoute::ChannelsLast,
                false => DefaultRoute::Depthwise,
            };
        }
        let room = cudnn_few_channel_room(&self.dims, self.layout, self.dtype.size());
        let bf16 = self.dtype == crate::ir::DType::BF16;
        if bf16 && room > LARGE_ROOM && self.workspace.bytes >= room {
            DefaultRoute::FewChannelsInRoom
        } else {
            DefaultRoute::Im2col
        }
    }
}

impl Program {
    /// How many convolution passes take each default route
    /// ([`super::conv::DefaultRoute`]), in words: "N through cuDNN (channels-last), M through
    /// cuDNN (NCHW over few channels, in its room), K as im2col + cuBLAS", naming only the
    /// routes taken.
    pub fn default_routes(&self) -> String {
        use DefaultRoute as R;
        let mut n = [0usize; 4];
        for op in self.ops.iter() {
            if let DeviceOp::Conv(c) = op {
                n[match c.default_route() {
                    R::ChannelsLast => 0,
                    R::FewChannelsInRoom => 1,
                    R::Im2col => 2,
                    R::Depthwise => 3,
                }] += 1;
            }
        }
        let words = [
            "through cuDNN (channels-last)",
            "through cuDNN (NCHW over few channels, in its room)",
            "as im2col + cuBLAS",
            "as direct depthwise kernels (channels-last)",
        ];
        let parts: Vec<String> = (n.iter().zip(words))
            .filter(|(k, _)| **k > 0)
            .map(|(k, w)| format!("{k} {w}"))
            .collect();
        match parts.is_empty() {
            true => "no convolutions".into(),
            false => parts.join(", "),
        }
    }
}
