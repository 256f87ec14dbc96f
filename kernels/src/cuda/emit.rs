//! The pieces of CUDA C text every generator writes with: C types and conversions of a dtype,
//! literals, index arithmetic, parameters and signatures, grid sizes, an indenting line writer,
//! and [`finish`], which names a kernel by the hash of its text.

use super::kernel::{CudaKernel, Launch};
use crate::dtype::DType;
use std::fmt::Write as _;

/// The name-placeholder generators write; [`finish`] replaces it with the hash-derived name.
pub(crate) const NAME: &str = "@KERNEL@";

/// 64-bit FNV-1a.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Names a kernel whose text uses [`NAME`] for its entry point: the name is the hash of that
/// text, so it depends on nothing but the function.
pub(crate) fn finish(text: String, launch: Launch) -> CudaKernel {
    let name = format!("ingot_{:016x}", fnv1a64(text.as_bytes()));
    CudaKernel {
        source: text.replace(NAME, &name),
        name,
        launch,
    }
}

/// A kernel parameter `name`, a pointer to elements of `d` that the kernel only reads: the
/// `(type, name)` pair the kernel builders take.
pub(crate) fn reads(d: DType, name: &str) -> (String, String) {
    (format!("const {}*", c_type(d)), name.to_string())
}

/// A kernel parameter `name`, a pointer to elements of `d` that the kernel writes.
pub(crate) fn writes(d: DType, name: &str) -> (String, String) {
    (format!("{}*", c_type(d)), name.to_string())
}

/// The C type of a dtype in memory (pointers, shared tiles of raw elements).
pub(crate) fn c_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::Bool => "unsigned char",
        // The 16 bits, with no dependency on `cuda_bf16.h` (see the module docs, "# bf16").
        DType::BF16 => "unsigned short",
    }
}

/// The C type of a value of dtype `d` in a register: the memory type, but `float` for bf16
/// (a bf16 value is held as the float it widens to).
pub(crate) fn reg_type(d: DType) -> &'static str {
    match d {
        DType::BF16 => "float",
        _ => c_type(d),
    }
}

/// Bytes of a register value of dtype `d` (a bf16 value is a float): what shared memory and
/// register budgets count.
pub(crate) fn reg_size(d: DType) -> usize {
    match d {
        DType::BF16 => 4,
        _ => d.size(),
    }
}

/// The register value of `d` read from the memory expression `e` (bf16 widens).
pub(crate) fn widened(d: DType, e: String) -> String {
    match d {
        DType::BF16 => format!("ig_widen({e})"),
        _ => e,
    }
}

/// The memory value of `d` that the register expression `v` stores (bf16 narrows: exact, as a
/// bf16 register is rounded already).
pub(crate) fn narrowed(d: DType, v: String) -> String {
    match d {
        DType::BF16 => format!("ig_narrow({v})"),
        _ => v,
    }
}

/// `e`, a float expression, as the value of an instruction of dtype `d`: rounded to the
/// nearest bf16 where `d` is bf16, unchanged otherwise.
pub(crate) fn rounded(d: DType, e: String) -> String {
    match d {
        DType::BF16 => format!("ig_round({e})"),
        _ => e,
    }
}

/// The C type and literal suffix of index arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ix {
    pub wide: bool,
}

impl Ix {
    /// 32-bit when every extent is below 2^31, else 64-bit.
    pub(crate) fn for_extents(extents: impl IntoIterator<Item = usize>) -> Ix {
        Ix {
            wide: extents.into_iter().any(|e| e as u128 >= 1u128 << 31),
        }
    }
    pub(crate) fn ty(self) -> &'static str {
        if self.wide {
            "unsigned long long"
        } else {
            "unsigned"
        }
    }
    pub(crate) fn lit(self, v: usize) -> String {
        if self.wide {
            format!("{v}ull")
        } else {
            format!("{v}u")
        }
    }
    /// `blockIdx.x * block + threadIdx.x`, in this width.
    pub(crate) fn global_thread(self, block: u32) -> String {
        if self.wide {
            format!("(unsigned long long)blockIdx.x * {block}ull + threadIdx.x")
        } else {
            format!("blockIdx.x * {block}u + threadIdx.x")
        }
    }
    /// `gridDim.x * block`, in this width.
    pub(crate) fn grid_stride(self, block: u32) -> String {
        if self.wide {
            format!("(unsigned long long)gridDim.x * {block}ull")
        } else {
            format!("gridDim.x * {block}u")
        }
    }
}

/// Threads per block of the elementwise loops.
pub(crate) const BLOCK: u32 = 256;
/// Grid cap of the elementwise loops: 32 blocks per SM of a 132-SM H100 (four waves of
/// resident blocks); the grid-stride loop covers the rest.
pub(crate) const MAX_GRID_ELEMENTWISE: usize = 132 * 32;
/// Grid cap of the row and column strategies (a grid-stride loop over rows covers the rest).
pub(crate) const MAX_GRID_ROWS: usize = 1 << 20;

/// `min(ceil(work / per_block), cap)`, at least 1.
pub(crate) fn grid_for(work: usize, per_block: usize, cap: usize) -> u32 {
    let blocks = work.div_ceil(per_block.max(1));
    blocks.clamp(1, cap) as u32
}

/// A literal of `dtype` with the value `v` converted as Rust's `as` does (`value as f32`,
/// saturating float-to-integer, nonzero to bool), exact for every value (NaN and infinities
/// included).
pub(crate) fn literal(v: f64, dtype: DType) -> String {
    match dtype {
        DType::F32 => {
            let x = v as f32;
            if x.is_finite() {
                format!("{x:?}f")
            } else {
                format!("__int_as_float((int)0x{:08x}u)", x.to_bits())
            }
        }
        DType::F64 => {
            if v.is_finite() {
                format!("{v:?}")
            } else {
                format!("__longlong_as_double((long long)0x{:016x}ull)", v.to_bits())
            }
        }
        DType::I32 => {
            let x = v as i32;
            if x == i32::MIN {
                "(-2147483647 - 1)".to_string()
            } else {
                format!("{x}")
            }
        }
        DType::I64 => {
            let x = v as i64;
            if x == i64::MIN {
                "(-9223372036854775807ll - 1ll)".to_string()
            } else {
                format!("{x}ll")
            }
        }
        DType::Bool => {
            if v != 0.0 {
                "(unsigned char)1".to_string()
            } else {
                "(unsigned char)0".to_string()
            }
        }
        // The register value: the float of the nearest bf16 (rounded once from the f64).
        DType::BF16 => literal(
            f64::from(crate::dtype::bf16_from_f64(v).to_f32()),
            DType::F32,
        ),
    }
}

/// A small line writer with indentation.
#[derive(Default)]
pub(crate) struct Src {
    pub text: String,
    pub depth: usize,
}

impl Src {
    pub(crate) fn line(&mut self, s: impl AsRef<str>) {
        for _ in 0..self.depth {
            self.text.push_str("  ");
        }
        self.text.push_str(s.as_ref());
        self.text.push('\n');
    }
    /// Opens a block: writes `s` (which should end with `{`) and indents.
    pub(crate) fn open(&mut self, s: impl AsRef<str>) {
        self.line(s);
        self.depth += 1;
    }
    pub(crate) fn close(&mut self) {
        self.depth = self.depth.saturating_sub(1);
        self.line("}");
    }
}

/// The signature line of a kernel: `extern "C" __global__ void __launch_bounds__(T) NAME(...) {`.
pub(crate) fn signature(threads: u32, params: &[(String, String)]) -> String {
    let mut s = format!("extern \"C\" __global__ void __launch_bounds__({threads}) {NAME}(");
    for (i, (ty, name)) in params.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{ty} {name}");
    }
    s.push_str(") {");
    s
}

/// `[a,b,c]`.
pub(crate) fn list(xs: &[usize]) -> String {
    let mut s = String::from("[");
    for (i, x) in xs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{x}");
    }
    s.push(']');
    s
}
