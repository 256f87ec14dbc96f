//! The sizes of one 2-d convolution ([`ConvGeometry`]), which pass of it a workspace is for
//! ([`Pass`]) and what can go wrong before a pass writes anything ([`ConvError`]): what the
//! im2col passes ([`super::conv`]), the one-pixel passes ([`super::conv_one_tap`]) and the
//! channels-last ones ([`super::conv_nhwc`]) share. A leaf, so those modules read it without
//! reading each other; [`super::conv`] re-exports it, and its paths are unchanged.

use super::gemm::GemmError;

/// The sizes of one convolution: `x [batch, in_ch, in_hw]`, `w [out_ch, in_ch/groups, kernel]`,
/// `y [batch, out_ch, out_hw]` (PyTorch's `conv2d` semantics: cross-correlation, symmetric zero
/// padding; NCHW, contiguous). Serializable because the CUDA executable's convolution
/// operations carry it as they are (`ingot_compiler::lower::cuda::Conv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvGeometry {
    pub batch: usize,
    pub in_ch: usize,
    pub in_hw: [usize; 2],
    pub out_ch: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub out_hw: [usize; 2],
}

/// Which pass a workspace is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward,
    GradInput,
    GradWeight,
}

impl ConvGeometry {
    /// The geometry of a conv of `x` dims `[N, C, H, W]` by weight dims `[O, C/g, kh, kw]`, or
    /// why they do not make one.
    pub fn new(
        x: [usize; 4],
        w: [usize; 4],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<ConvGeometry, String> {
        let [batch, in_ch, h, wd] = x;
        let [out_ch, cg, kh, kw] = w;
        if groups == 0 || in_ch % groups != 0 || out_ch % groups != 0 || in_ch / groups != cg {
            return Err(format!(
                "x has {in_ch} channels and w {out_ch} outputs of {cg} channels: not {groups} groups"
            ));
        }
        let mut out_hw = [0; 2];
        for i in 0..2 {
            let k = [kh, kw][i];
            let span = (k.checked_sub(1).ok_or("an empty kernel")?)
                .checked_mul(dilation[i])
                .and_then(|s| s.checked_add(1))
                .ok_or("the kernel span overflows")?;
            let padded = padding[i]
                .checked_mul(2)
                .and_then(|p| p.checked_add([h, wd][i]))
                .ok_or("the padded size overflows")?;
            if stride[i] == 0 || dilation[i] == 0 || padded < span {
                return Err(format!("the kernel does not fit axis {}", i + 2));
            }
            out_hw[i] = (padded - span) / stride[i] + 1;
        }
        Ok(ConvGeometry {
            batch,
            in_ch,
            in_hw: [h, wd],
            out_ch,
            kernel: [kh, kw],
            stride,
            padding,
            dilation,
            groups,
            out_hw,
        })
    }

    /// Elements of `x`, `w` and `y`.
    pub fn elements(&self) -> [usize; 3] {
        [
            self.batch * self.in_ch * self.in_hw[0] * self.in_hw[1],
            self.out_ch * (self.in_ch / self.groups.max(1)) * self.kernel[0] * self.kernel[1],
            self.batch * self.out_ch * self.out_hw[0] * self.out_hw[1],
        ]
    }

    /// Rows of the column buffer: `C/g · kh · kw`.
    pub fn col_rows(&self) -> usize {
        self.in_ch / self.groups * self.kernel[0] * self.kernel[1]
    }

    /// Output positions per image: `Ho · Wo`.
    pub fn positions(&self) -> usize {
        self.out_hw[0] * self.out_hw[1]
    }

    pub(crate) fn x_len(&self) -> usize {
        self.batch * self.in_ch * self.in_hw[0] * self.in_hw[1]
    }

    pub(crate) fn y_len(&self) -> usize {
        self.batch * self.out_ch * self.positions()
    }

    pub(crate) fn w_len(&self) -> usize {
        self.out_ch * self.col_rows()
    }
}

/// What can go wrong before anything is written.
#[derive(Debug, thiserror::Error)]
pub enum ConvError {
    #[error("conv2d: {what} has {len} elements, the geometry needs {need}")]
    WrongLength {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error(transparent)]
    Gemm(#[from] GemmError),
}
