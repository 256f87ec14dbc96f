//! A matrix product that packs into caller-provided memory and allocates nothing.
//!
//! [`gemm_ws`] computes `C ← α·A·B + β·C` for operands at arbitrary [`MatLayout`]s, like
//! [`super::matmul::gemm`], but its packing buffers are carved from a workspace slice the
//! caller passes in (in a training step: from the slab), so a call never touches the heap.
//! [`workspace_len`] says how long that slice must be; [`batched_matmul_ws`] runs a batch of
//! products through one workspace.
//!
//! # Algorithm
//! BLIS-style blocking. The columns of `C` are split into blocks of [`NC`], the reduction
//! dimension into blocks of [`KC`] and the rows into blocks of about [`MC`]. For each
//! `(column block, k block)` a `KC × NC` panel of `B` is packed into the workspace as
//! micro-panels of `NR` columns; for each row block an `MC × KC` block of `A` is packed as
//! micro-panels of `MR` rows; a register-blocked micro-kernel then multiplies one `A`
//! micro-panel by one `B` micro-panel into an `MR × NR` tile of `C`. Packing reads any strides
//! (a transposed operand is read in place), so every transpose combination runs at the same
//! speed. A `C` whose columns are contiguous (`row_stride == 1`) is handled by computing
//! `Cᵀ = Bᵀ·Aᵀ` instead, so the tile stores are contiguous when they can be, and so is a
//! narrow `C` whose transposed shape fills the tiles much better (`256 × 10` becomes `10 × 256`).
//!
//! The micro-kernel is chosen at run time from the CPU's features:
//!
//! | kernel | f32 tile | f64 tile | when |
//! |---|---|---|---|
//! | `avx512` | 12 × 32 | 12 × 16 | x86-64 with AVX-512F |
//! | `avx2+fma` | 6 × 16 | 6 × 8 | x86-64 with AVX2 and FMA |
//! | `portable` | 4 × 8 | 4 × 4 | everything else (plain Rust the compiler vectorizes) |
//!
//! Packing that transposes (the rows of a row-major `A`, the columns of a transposed `B`) moves
//! 8 × 8 blocks through AVX registers for f32; f64 packs one element at a time.
//!
//! Speed, single-threaded, against `matrixmultiply` (the [`mod@super::matmul`] path) with one
//! thread, f32: 95-100% on 1024³ and 256×784×1024 in every transpose combination (about
//! 115-125 GFLOP/s on the 2-vCPU development VM, 140-190 on the GPU hosts' Xeons), about 120% on
//! the narrow 256×1024×10, 85-90% on 64³; f64 about 110%. `cargo run --release -p
//! ingot-kernels --example gemm_speed` prints the comparison.
//!
//! The AVX-512 kernels use `std::arch` intrinsics stable since Rust 1.89.
//!
//! # Threads
//! Called inside a rayon pool (the CPU executor runs every step inside its own), a product
//! whose `m × NC × KC` panels are large enough spreads each panel over the pool's threads
//! (`panel_threaded`): the threads pack the panel of B together into the workspace, then each
//! task packs one `MC`-row block of A into a block on its own thread's stack (144 KiB for f32,
//! 288 KiB for f64) and multiplies it by a run of the shared panel's micro-panels. So the
//! workspace is the same as for one thread, and the threads wait for each other twice a panel
//! rather than once per block of rows (they used to share each block's tiles), which matters
//! most on a loaded machine, where any wait can be a descheduled thread's time slice. Outside
//! any pool it runs on the calling thread alone. Every element of `C` is still summed by one
//! micro-kernel call per `KC` block in the order below, so the result is bit-identical for
//! any number of threads.
//!
//! # Determinism
//! Every element of `C` is summed in one fixed order that depends only on `k`: the products
//! `A[i,p]·B[p,j]` of one `KC` block are accumulated in increasing `p`, starting from zero,
//! with a fused multiply-add; the block's sum `s` then updates `C` as `fma(α, s, β·C)` for the
//! first block and `fma(α, s, C)` for the later ones (`α·s` when `β = 0`). The order does not
//! depend on `m`, `n`, the strides or the tile shape, so the `avx512` and `avx2+fma` kernels give
//! bit-identical results, run to run and machine to machine. The `portable` kernel uses the same
//! order, fused where the target has hardware FMA at compile time (AArch64, or x86 built with
//! `+fma`) and therefore bit-identical to the others there; on other targets it multiplies and
//! adds separately and may differ in the last bits.
//!
//! # Workspace
//! [`workspace_len`] is a closed form in `m`, `k`, `n` and the element type, the same on every
//! machine (it is the maximum over all kernels, not just the one this CPU picks), so a memory
//! plan that reserves it is identical everywhere. It is bounded by the block sizes whatever the
//! matrix sizes: at most `(NC + MC)·KC` elements plus 64 bytes, 1.14 MiB for f32 and 2.28 MiB
//! for f64 (reached at 256×784×1024 and 1024³ alike).
//!
//! # Special values
//! When `β = 0`, `C` is not read (its old contents, NaN included, are ignored). When `α = 0` or
//! `k = 0`, `A` and `B` are not read and `C ← β·C`.

use super::matmul::{batch_item, GemmScalar, MatLayout, Trans};
use super::par::{pool_threads, SendPtr};
use kernel::{Kernel, AVX2_F32, AVX2_F64, AVX512_F32, AVX512_F64, PORTABLE_F32, PORTABLE_F64};
use std::any::TypeId;
use std::ops::{Add, Mul};

/// Columns of `C` (and of the packed `B` panel) handled per outer block.
pub const NC: usize = 1024;
/// Length of the reduction (`k`) block: each element's sum is split into blocks of `KC` terms.
pub const KC: usize = 256;
/// Rows of `C` (and of the packed `A` block) per block, rounded down to the kernel's tile height.
pub const MC: usize = 144;

/// Why [`gemm_ws`] or [`batched_matmul_ws`] refused to run. Building one never allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GemmError {
    /// An operand's layout addresses an element past the end of its slice.
    #[error(
        "gemm: {operand} ({rows}x{cols} at {layout:?}) reaches index {}, but its slice has {len} elements; pass a longer slice or fix the layout",
        reach.map_or_else(|| "beyond usize::MAX".to_string(), |r| r.to_string())
    )]
    OutOfBounds {
        operand: &'static str,
        rows: usize,
        cols: usize,
        layout: MatLayout,
        /// The largest index the layout addresses (`None`: it overflows `usize`).
        reach: Option<usize>,
        len: usize,
    },
    /// `C`'s strides make two of its elements share an index.
    #[error("gemm: C's layout {layout:?} makes elements of a {rows}x{cols} matrix share an index; give C distinct elements")]
    AliasedOutput {
        rows: usize,
        cols: usize,
        layout: MatLayout,
    },
    /// The workspace slice is shorter than [`workspace_len`] asks for.
    #[error("gemm: the workspace has {len} elements, but a {m}x{k}x{n} product needs {need} (workspace_len)")]
    WorkspaceTooSmall {
        m: usize,
        k: usize,
        n: usize,
        need: usize,
        len: usize,
    },
    /// A batched operand's slice does not have the length its shape needs.
    #[error("batched matmul: {operand} has {len} elements, but [{batch}, {rows}, {cols}] needs {}",
        need.map_or_else(|| "more than usize::MAX".to_string(), |r| r.to_string()))]
    WrongLength {
        operand: &'static str,
        batch: usize,
        rows: usize,
        cols: usize,
        need: Option<usize>,
        len: usize,
    },
    /// The element type is neither `f32` nor `f64`.
    #[error("gemm: element type {0} is not supported (only f32 and f64)")]
    UnsupportedType(&'static str),
}

/// Tile shapes `(MR, NR)` of every kernel for one element type, whether or not this build or
/// CPU can run it: the workspace bound covers all of them so that it is machine-independent.
/// The kernels are built from these shapes, so the table and the kernels cannot disagree.
const F32_TILES: [(usize, usize); 3] = [AVX512_F32, AVX2_F32, PORTABLE_F32];
const F64_TILES: [(usize, usize); 3] = [AVX512_F64, AVX2_F64, PORTABLE_F64];
/// The packed panels start on a 64-byte boundary inside the workspace; this many bytes of
/// slack let any 4- or 8-byte-aligned slice reach one.
const ALIGN: usize = 64;

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Elements of workspace the packed panels take for an `m × k × n` product with tiles `mr × nr`
/// (`m`, `n` as the driver sees them, after any transposition).
fn packed_len(m: usize, k: usize, n: usize, mr: usize, nr: usize) -> usize {
    let kc = k.min(KC);
    let nc = round_up(n.min(NC / nr * nr), nr);
    let mc = round_up(m.min(MC / mr * mr), mr);
    (nc + mc) * kc
}

/// Elements (not bytes) of workspace that [`gemm_ws`] needs for an `m × k × n` product of `T`s;
/// [`batched_matmul_ws`] needs the same for each of its products and reuses it. Multiply by
/// `size_of::<T>()` for bytes ([`workspace_bytes`]).
///
/// An upper bound that depends only on `m`, `k`, `n` and `T`, never on the CPU: the maximum over
/// every kernel and both orientations, plus 64 bytes so the panels can start cache-line aligned.
/// Zero when the product has no work (`m`, `k` or `n` is zero). Bounded by the block sizes: at
/// most `(NC + MC)·KC` elements plus 64 bytes: 1.14 MiB for f32, 2.28 MiB for f64.
pub fn workspace_len<T: GemmScalar>(m: usize, k: usize, n: usize) -> usize {
    if m == 0 || k == 0 || n == 0 {
        return 0;
    }
    let size = std::mem::size_of::<T>().max(1);
    let tiles = if TypeId::of::<T>() == TypeId::of::<f32>() {
        &F32_TILES
    } else {
        &F64_TILES
    };
    let packed = tiles
        .iter()
        .map(|&(mr, nr)| packed_len(m, k, n, mr, nr).max(packed_len(n, k, m, mr, nr)))
        .max()
        .unwrap_or(0);
    packed + ALIGN.div_ceil(size)
}

/// [`workspace_len`] in bytes.
pub fn workspace_bytes<T: GemmScalar>(m: usize, k: usize, n: usize) -> usize {
    workspace_len::<T>(m, k, n) * std::mem::size_of::<T>()
}

/// The name of the micro-kernel this CPU runs (`"avx512"`, `"avx2+fma"` or `"portable"`).
pub fn kernel_name() -> &'static str {
    Isa::detect().name()
}

/// `C ← α·op(A)·op(B) + β·C` for an `m × k` matrix `A`, a `k × n` matrix `B` and an `m × n`
/// matrix `C`, each at its own [`MatLayout`] (any non-negative strides; a transposed operand is
/// just a layout with its strides swapped, read in place). The packing buffers are carved from
/// `ws`, which must hold at least [`workspace_len::<T>(m, k, n)`](workspace_len) elements (its
/// contents on entry do not matter; on return they are scratch). Makes no heap allocation.
///
/// Summation order is fixed for given sizes (see the [module docs](self#determinism)).
///
/// # Errors
/// Before touching anything: an operand layout reaching outside its slice
/// ([`GemmError::OutOfBounds`]), a `C` layout whose elements alias ([`GemmError::AliasedOutput`]),
/// a workspace shorter than [`workspace_len`] ([`GemmError::WorkspaceTooSmall`]), or an element
/// type other than `f32`/`f64` ([`GemmError::UnsupportedType`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm_ws<T: GemmScalar>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    la: MatLayout,
    b: &[T],
    lb: MatLayout,
    beta: T,
    c: &mut [T],
    lc: MatLayout,
    ws: &mut [T],
) -> Result<(), GemmError> {
    let operands = Operands {
        a,
        la,
        b,
        lb,
        c,
        lc,
    };
    gemm_on(m, k, n, alpha, operands, beta, ws, pool_threads())
}

/// [`gemm_ws`] on the calling thread alone, inside a pool or not: for a caller that spreads
/// its own units of work over the pool's threads (a convolution's lanes, each running its
/// products one after the other), where each product's panels spread over the threads too
/// would make every lane wait twice a panel for the others' tiles. The same sums in the same
/// order as [`gemm_ws`] (see [Threads](self#threads)), so the same bits.
///
/// # Errors
/// As [`gemm_ws`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_ws_alone<T: GemmScalar>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    la: MatLayout,
    b: &[T],
    lb: MatLayout,
    beta: T,
    c: &mut [T],
    lc: MatLayout,
    ws: &mut [T],
) -> Result<(), GemmError> {
    let operands = Operands {
        a,
        la,
        b,
        lb,
        c,
        lc,
    };
    gemm_on(m, k, n, alpha, operands, beta, ws, 1)
}

/// A product's three operands and their layouts, as [`gemm_ws`] takes them.
struct Operands<'a, T> {
    a: &'a [T],
    la: MatLayout,
    b: &'a [T],
    lb: MatLayout,
    c: &'a mut [T],
    lc: MatLayout,
}

/// [`gemm_ws`] with its panels spread over `threads` of the pool (1: this thread alone).
#[allow(clippy::too_many_arguments)]
fn gemm_on<T: GemmScalar>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    o: Operands<'_, T>,
    beta: T,
    ws: &mut [T],
    threads: usize,
) -> Result<(), GemmError> {
    let Operands {
        a,
        la,
        b,
        lb,
        c,
        lc,
    } = o;
    let isa = Isa::detect();
    if let (Some(a), Some(b), Some(c), Some(ws)) = (
        cast::<T, f32>(a),
        cast::<T, f32>(b),
        cast_mut::<T, f32>(c),
        cast_mut::<T, f32>(ws),
    ) {
        let (alpha, beta) = (cast_val::<T, f32>(alpha), cast_val::<T, f32>(beta));
        return gemm_typed_on::<f32>(m, k, n, alpha, a, la, b, lb, beta, c, lc, ws, isa, threads);
    }
    if let (Some(a), Some(b), Some(c), Some(ws)) = (
        cast::<T, f64>(a),
        cast::<T, f64>(b),
        cast_mut::<T, f64>(c),
        cast_mut::<T, f64>(ws),
    ) {
        let (alpha, beta) = (cast_val::<T, f64>(alpha), cast_val::<T, f64>(beta));
        return gemm_typed_on::<f64>(m, k, n, alpha, a, la, b, lb, beta, c, lc, ws, isa, threads);
    }
    Err(GemmError::UnsupportedType(std::any::type_name::<T>()))
}

/// A batch of products `C_i = op(A_i)·op(B_i)` (plus the old `C_i` when `accumulate`), for `i`
/// in `0..batch`, like [`super::matmul::batched_matmul`] but packing into `ws`, which must hold
/// [`workspace_len::<T>(m, k, n)`](workspace_len) elements and is reused by every product.
/// `C` is row-major `[batch, m, n]`; `A` is row-major `[batch, m, k]` for [`Trans::N`] or
/// `[batch, k, m]` for [`Trans::T`] (read transposed in place); likewise `B` is `[batch, k, n]`
/// or `[batch, n, k]`. Makes no heap allocation.
///
/// # Errors
/// [`GemmError::WrongLength`] if a slice does not have exactly the length its shape needs, and
/// the errors of [`gemm_ws`]; nothing is written when it fails.
#[allow(clippy::too_many_arguments)]
pub fn batched_matmul_ws<T: GemmScalar>(
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    ta: Trans,
    b: &[T],
    tb: Trans,
    c: &mut [T],
    accumulate: bool,
    ws: &mut [T],
) -> Result<(), GemmError> {
    for (operand, rows, cols, len) in [
        ("A", m, k, a.len()),
        ("B", k, n, b.len()),
        ("C", m, n, c.len()),
    ] {
        let need = batch.checked_mul(rows).and_then(|x| x.checked_mul(cols));
        if need != Some(len) {
            return Err(GemmError::WrongLength {
                operand,
                batch,
                rows,
                cols,
                need,
                len,
            });
        }
    }
    let need = workspace_len::<T>(m, k, n);
    if ws.len() < need {
        return Err(GemmError::WorkspaceTooSmall {
            m,
            k,
            n,
            need,
            len: ws.len(),
        });
    }
    let beta = if accumulate { T::ONE } else { T::ZERO };
    for i in 0..batch {
        let [la, lb, lc] = batch_item(ta, tb, [m, k, n], i);
        // The lengths were checked above, so these layouts fit and only a bug could fail here.
        gemm_ws(m, k, n, T::ONE, a, la, b, lb, beta, c, lc, ws)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Type dispatch: `GemmScalar` is the crate's f32/f64 trait; the kernels need arithmetic, so the
// public functions downcast to the concrete type (sound: `T: 'static` and the TypeIds match).

fn cast<T: 'static, U: 'static>(x: &[T]) -> Option<&[U]> {
    if TypeId::of::<T>() == TypeId::of::<U>() {
        // SAFETY: T and U are the same type.
        Some(unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<U>(), x.len()) })
    } else {
        None
    }
}

fn cast_mut<T: 'static, U: 'static>(x: &mut [T]) -> Option<&mut [U]> {
    if TypeId::of::<T>() == TypeId::of::<U>() {
        // SAFETY: T and U are the same type.
        Some(unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast::<U>(), x.len()) })
    } else {
        None
    }
}

fn cast_val<T: Copy + 'static, U: Copy + 'static>(x: T) -> U {
    assert_eq!(TypeId::of::<T>(), TypeId::of::<U>());
    // SAFETY: T and U are the same type (asserted).
    unsafe { std::mem::transmute_copy(&x) }
}

/// The element types the kernels are written for.
trait Elem: GemmScalar + Add<Output = Self> + Mul<Output = Self> {
    /// Tile shapes, indexed by [`Isa`].
    const TILES: [(usize, usize); 3];
    /// `a·b + c`, fused when the target has hardware FMA at compile time (see the module docs).
    fn fma(a: Self, b: Self, c: Self) -> Self;
    /// The blocked product with the given kernel family.
    ///
    /// # Safety
    /// As [`drive`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(isa: Isa, p: &Problem<Self>);
}

/// Whether `Elem::fma` fuses: only where it compiles to one instruction.
const HW_FMA: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

/// `Elem` for a float type from its tile shapes and its kernels (AVX-512, AVX2, portable): the
/// f32 and f64 impls differ only in these names.
macro_rules! elem {
    ($t:ty, $tiles:expr, $avx512:ty, $avx2:ty, $portable:expr) => {
        impl Elem for $t {
            const TILES: [(usize, usize); 3] = $tiles;
            #[inline(always)]
            fn fma(a: $t, b: $t, c: $t) -> $t {
                if HW_FMA {
                    a.mul_add(b, c)
                } else {
                    a * b + c
                }
            }
            unsafe fn run(isa: Isa, p: &Problem<$t>) {
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => drive::<$t, $avx512>(p),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => drive::<$t, $avx2>(p),
                    _ => drive::<$t, Portable<{ $portable.0 }, { $portable.1 }>>(p),
                }
            }
        }
    };
}

elem!(f32, F32_TILES, x86::Avx512F32, x86::Avx2F32, PORTABLE_F32);
elem!(f64, F64_TILES, x86::Avx512F64, x86::Avx2F64, PORTABLE_F64);

/// A kernel family, chosen once per call from the CPU's features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    Avx512 = 0,
    Avx2 = 1,
    Portable = 2,
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            // std caches the answers, so this is a couple of atomic loads, no allocation.
            if std::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2+fma",
            Isa::Portable => "portable",
        }
    }

    /// Whether this CPU can run the family.
    #[cfg(test)]
    fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            }
            Isa::Portable => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

/// Whether to compute `Cᵀ = Bᵀ·Aᵀ` rather than `C = A·B` with `mr × nr` tiles: when `C`'s
/// columns are contiguous and its rows are not (so the tile stores are contiguous), unless that
/// wastes much more of the tiles on padding; or when `C` is row-major but the transposed shape
/// wastes much less (a narrow `C`, such as `n = 10` with 32-wide tiles).
fn transpose_pays(m: usize, n: usize, lc: MatLayout, (mr, nr): (usize, usize)) -> bool {
    let padded = |m: usize, n: usize| round_up(m, mr) as f64 * round_up(n, nr) as f64;
    let (straight, transposed) = (padded(m, n), padded(n, m));
    let rows_contiguous = lc.col_stride == 1 || n == 1;
    let cols_contiguous = lc.row_stride == 1 || m == 1;
    match (rows_contiguous, cols_contiguous) {
        (true, false) => transposed < 0.75 * straight,
        (false, true) => transposed < 1.33 * straight,
        _ => transposed < straight,
    }
}

/// The largest index a `rows × cols` matrix at `l` addresses (`Ok(None)`: it is empty;
/// `Err(())`: the index overflows `usize`).
fn reach(l: MatLayout, rows: usize, cols: usize) -> Result<Option<usize>, ()> {
    if rows == 0 || cols == 0 {
        return Ok(None);
    }
    (rows - 1)
        .checked_mul(l.row_stride)
        .and_then(|r| {
            (cols - 1)
                .checked_mul(l.col_stride)
                .and_then(|c| r.checked_add(c))
        })
        .and_then(|x| x.checked_add(l.offset))
        .map(Some)
        .ok_or(())
}

fn check_fits(
    operand: &'static str,
    len: usize,
    layout: MatLayout,
    rows: usize,
    cols: usize,
) -> Result<(), GemmError> {
    match reach(layout, rows, cols) {
        Ok(None) => Ok(()),
        Ok(Some(r)) if r < len => Ok(()),
        Ok(Some(r)) => Err(GemmError::OutOfBounds {
            operand,
            rows,
            cols,
            layout,
            reach: Some(r),
            len,
        }),
        Err(()) => Err(GemmError::OutOfBounds {
            operand,
            rows,
            cols,
            layout,
            reach: None,
            len,
        }),
    }
}

/// One product, validated, as raw pointers and strides (in elements) for the driver.
struct Problem<E> {
    m: usize,
    k: usize,
    n: usize,
    alpha: E,
    a: *const E,
    ars: usize,
    acs: usize,
    b: *const E,
    brs: usize,
    bcs: usize,
    beta: E,
    c: *mut E,
    crs: usize,
    ccs: usize,
    /// 64-byte aligned, with room for the packed panels of every kernel.
    ws: *mut E,
    /// Elements from `ws` to the end of the workspace slice.
    ws_len: usize,
    /// Threads of the pool the panels may spread over (1: the calling thread alone).
    threads: usize,
}

/// [`gemm_typed_on`] on the pool's threads (the tests' entry: one kernel family, any pool).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
fn gemm_typed<E: Elem>(
    m: usize,
    k: usize,
    n: usize,
    alpha: E,
    a: &[E],
    la: MatLayout,
    b: &[E],
    lb: MatLayout,
    beta: E,
    c: &mut [E],
    lc: MatLayout,
    ws: &mut [E],
    isa: Isa,
) -> Result<(), GemmError> {
    let threads = pool_threads();
    gemm_typed_on(m, k, n, alpha, a, la, b, lb, beta, c, lc, ws, isa, threads)
}

#[allow(clippy::too_many_arguments)]
fn gemm_typed_on<E: Elem>(
    m: usize,
    k: usize,
    n: usize,
    alpha: E,
    a: &[E],
    la: MatLayout,
    b: &[E],
    lb: MatLayout,
    beta: E,
    c: &mut [E],
    lc: MatLayout,
    ws: &mut [E],
    isa: Isa,
    threads: usize,
) -> Result<(), GemmError> {
    check_fits("A", a.len(), la, m, k)?;
    check_fits("B", b.len(), lb, k, n)?;
    check_fits("C", c.len(), lc, m, n)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let distinct = m == 1 && (n == 1 || lc.col_stride > 0)
        || n == 1 && lc.row_stride > 0
        || lc.col_stride > 0 && lc.row_stride >= n.saturating_mul(lc.col_stride)
        || lc.row_stride > 0 && lc.col_stride >= m.saturating_mul(lc.row_stride);
    if !distinct {
        return Err(GemmError::AliasedOutput {
            rows: m,
            cols: n,
            layout: lc,
        });
    }
    let need = workspace_len::<E>(m, k, n);
    if ws.len() < need {
        return Err(GemmError::WorkspaceTooSmall {
            m,
            k,
            n,
            need,
            len: ws.len(),
        });
    }
    if k == 0 || alpha == E::ZERO {
        // C ← β·C, without reading A or B (nor C when β = 0).
        for i in 0..m {
            for j in 0..n {
                let x = &mut c[lc.offset + i * lc.row_stride + j * lc.col_stride];
                *x = if beta == E::ZERO { E::ZERO } else { *x * beta };
            }
        }
        return Ok(());
    }
    // `align_offset` may in principle decline (usize::MAX); then the panels are just unaligned.
    let skip = match ws.as_ptr().align_offset(ALIGN) {
        s if s < ALIGN.div_ceil(std::mem::size_of::<E>()) => s,
        _ => 0,
    };
    let mut p = Problem {
        m,
        k,
        n,
        alpha,
        a: a[la.offset..].as_ptr(),
        ars: la.row_stride,
        acs: la.col_stride,
        b: b[lb.offset..].as_ptr(),
        brs: lb.row_stride,
        bcs: lb.col_stride,
        beta,
        c: c[lc.offset..].as_mut_ptr(),
        crs: lc.row_stride,
        ccs: lc.col_stride,
        ws: ws[skip..].as_mut_ptr(),
        ws_len: ws.len() - skip,
        threads,
    };
    if transpose_pays(m, n, lc, E::TILES[isa as usize]) {
        // Compute Cᵀ = Bᵀ·Aᵀ instead. The sums are the same sums in the same order, so the
        // result is bit-identical either way.
        p = Problem {
            m: n,
            n: m,
            a: p.b,
            ars: p.bcs,
            acs: p.brs,
            b: p.a,
            brs: p.acs,
            bcs: p.ars,
            crs: p.ccs,
            ccs: p.crs,
            ..p
        };
    }
    // SAFETY: every element the layouts address lies in its slice (checked above), C's elements
    // are distinct, C cannot overlap A, B or ws (it is the only &mut), and ws holds at least
    // workspace_len elements, of which at most ALIGN bytes are skipped for alignment; the rest
    // covers the packed panels of every kernel (workspace_len is the maximum over all tiles
    // and both orientations).
    unsafe { E::run(isa, &p) };
    Ok(())
}

/// The five loops around the micro-kernel.
///
/// # Safety
/// `p` describes a valid product (every addressed element in bounds, C not aliased) with
/// `m, n, k > 0`, and `p.ws` has room for `packed_len(m, k, n, K::MR, K::NR)` elements.
unsafe fn drive<E: Elem, K: Kernel<E>>(p: &Problem<E>) {
    let mc_max = MC / K::MR * K::MR;
    let nc_max = NC / K::NR * K::NR;
    let kc_max = p.k.min(KC);
    debug_assert!(packed_len(p.m, p.k, p.n, K::MR, K::NR) <= p.ws_len);
    let bpack = p.ws;
    let apack = p.ws.add(round_up(p.n.min(nc_max), K::NR) * kc_max);
    let threads = p.threads;
    let mut jc = 0;
    while jc < p.n {
        let nc = nc_max.min(p.n - jc);
        let mut pc = 0;
        while pc < p.k {
            let kc = KC.min(p.k - pc);
            // Later k blocks add to what the earlier ones left in C.
            let beta = if pc == 0 { p.beta } else { E::ONE };
            let panel = Panel {
                jc,
                nc,
                pc,
                kc,
                beta,
            };
            if threads > 1 && p.m * nc * kc >= PARALLEL_WORK && p.m * nc > K::MR * K::NR {
                panel_threaded::<E, K>(p, panel, bpack, threads);
            } else {
                pack_b::<E, K>(
                    kc,
                    nc,
                    p.b.add(pc * p.brs + jc * p.bcs),
                    p.brs,
                    p.bcs,
                    bpack,
                );
                let mut ic = 0;
                while ic < p.m {
                    let mc = mc_max.min(p.m - ic);
                    pack_a::<E, K>(
                        mc,
                        kc,
                        p.a.add(ic * p.ars + pc * p.acs),
                        p.ars,
                        p.acs,
                        apack,
                    );
                    block_tiles::<E, K>(p, panel, ic, mc, apack, bpack, 0..nc.div_ceil(K::NR));
                    ic += mc_max;
                }
            }
            pc += KC;
        }
        jc += nc_max;
    }
}

/// One `kc × nc` panel of B (columns from `jc`, reduction terms from `pc`) and the `β` its
/// products update C with.
#[derive(Clone, Copy)]
struct Panel<E> {
    jc: usize,
    nc: usize,
    pc: usize,
    kc: usize,
    beta: E,
}

/// The micro-tiles of the `mc` rows of C from `ic` (their A block packed at `apack`) and the
/// micro-panels `panels` of the panel's B (packed at `bpack`): column panel by column panel,
/// row tile by row tile.
///
/// # Safety
/// As [`drive`]; `apack` holds the packed `mc × kc` block and `bpack` the packed panel.
unsafe fn block_tiles<E: Elem, K: Kernel<E>>(
    p: &Problem<E>,
    w: Panel<E>,
    ic: usize,
    mc: usize,
    apack: *const E,
    bpack: *const E,
    panels: std::ops::Range<usize>,
) {
    for jp in panels {
        let jr = jp * K::NR;
        let nr = K::NR.min(w.nc - jr);
        for ir in (0..mc).step_by(K::MR) {
            K::tile(
                w.kc,
                apack.add(ir * w.kc),
                bpack.add(jr * w.kc),
                p.c.add((ic + ir) * p.crs + (w.jc + jr) * p.ccs),
                p.crs,
                p.ccs,
                K::MR.min(mc - ir),
                nr,
                p.alpha,
                w.beta,
            );
        }
    }
}

/// A packed `MC × KC` block of A on a thread's stack, cache-line aligned.
#[repr(C, align(64))]
struct StackBlock<E>([E; MC * KC]);

/// One panel of the product on the pool's threads: the panel of B is packed once, its
/// micro-panels split over the threads; then tasks of (a block of `MC` rows, a run of B's
/// micro-panels), about three a thread, each pack their rows of A into a block on their own
/// stack and multiply it by their micro-panels. Two waits a panel, however many row blocks,
/// so a thread the machine's load delays holds the others back twice a panel, not at every
/// block. Every tile is the one micro-kernel call the serial path makes, so the bits are too.
///
/// # Safety
/// As [`drive`].
unsafe fn panel_threaded<E: Elem, K: Kernel<E>>(
    p: &Problem<E>,
    w: Panel<E>,
    bpack: *mut E,
    threads: usize,
) {
    use rayon::prelude::*;
    let mc_max = MC / K::MR * K::MR;
    let panels = w.nc.div_ceil(K::NR);
    let packers = threads.min(panels);
    let pack = |t: usize| {
        let (p0, p1) = (panels * t / packers, panels * (t + 1) / packers);
        let (j0, j1) = (p0 * K::NR, (p1 * K::NR).min(w.nc));
        if j0 < j1 {
            pack_b::<E, K>(
                w.kc,
                j1 - j0,
                p.b.add(w.pc * p.brs + (w.jc + j0) * p.bcs),
                p.brs,
                p.bcs,
                bpack.add(j0 * w.kc),
            );
        }
    };
    let shared = SendPtr(&pack);
    // SAFETY (of the packers run on other threads): each packs its own micro-panels, whole
    // ones (runs start at multiples of NR), into its own part of the workspace, and reads only
    // B, which nothing writes; the captures stay valid until the loop returns.
    (0..packers)
        .into_par_iter()
        .for_each(|t| (*shared.get())(t));
    let row_blocks = p.m.div_ceil(mc_max);
    let runs = (3 * threads).div_ceil(row_blocks).clamp(1, panels);
    let task = |t: usize| {
        let (rb, run) = (t / runs, t % runs);
        let ic = rb * mc_max;
        let mc = mc_max.min(p.m - ic);
        let mut block = std::mem::MaybeUninit::<StackBlock<E>>::uninit();
        let apack = block.as_mut_ptr().cast::<E>();
        // The packed block holds round_up(mc, MR)·kc ≤ MC·KC elements, all written here
        // (padding rows included), and the tiles read no others.
        pack_a::<E, K>(
            mc,
            w.kc,
            p.a.add(ic * p.ars + w.pc * p.acs),
            p.ars,
            p.acs,
            apack,
        );
        let range = panels * run / runs..panels * (run + 1) / runs;
        block_tiles::<E, K>(p, w, ic, mc, apack, bpack, range);
    };
    let shared = SendPtr(&task);
    // SAFETY (of the tasks run on other threads): each writes the tiles of its own rows and
    // micro-panels of C (distinct elements, checked in gemm_typed) and its own stack block,
    // and reads A and the packed panel, which no task writes; the captures are plain pointers
    // and sizes, valid until the loop returns.
    (0..row_blocks * runs)
        .into_par_iter()
        .for_each(|t| (*shared.get())(t));
}

/// Multiply-adds a panel (all rows of C against one `kc × nc` panel of B) must hold before
/// it is spread over threads: below it, waking the pool's threads costs more than the tiles
/// take (about 25 µs of one core).
const PARALLEL_WORK: usize = 1 << 20;

/// Packs the `kc × nc` block of B at `src` (strides `rs`, `cs`) as micro-panels of `NR`
/// columns, `kc` rows of `NR` values each, zero-padding the last panel's missing columns.
///
/// # Safety
/// The block's elements are readable, `dst` has room for `round_up(nc, NR)·kc` elements.
unsafe fn pack_b<E: Elem, K: Kernel<E>>(
    kc: usize,
    nc: usize,
    src: *const E,
    rs: usize,
    cs: usize,
    dst: *mut E,
) {
    let nr = K::NR;
    let mut jp = 0;
    while jp < nc {
        let w = nr.min(nc - jp);
        let d = dst.add(jp * kc);
        let s = src.add(jp * cs);
        if cs == 1 && w == nr {
            for q in 0..kc {
                std::ptr::copy_nonoverlapping(s.add(q * rs), d.add(q * nr), nr);
            }
        } else {
            if w < nr {
                for q in 0..kc {
                    for j in w..nr {
                        *d.add(q * nr + j) = E::ZERO;
                    }
                }
            }
            if rs == 1 {
                // Each column of B is contiguous.
                K::pack_lines(s, cs, w, kc, d, nr);
            } else {
                for q in 0..kc {
                    for j in 0..w {
                        *d.add(q * nr + j) = *s.add(q * rs + j * cs);
                    }
                }
            }
        }
        jp += nr;
    }
}

/// Packs the `mc × kc` block of A at `src` (strides `rs`, `cs`) as micro-panels of `MR` rows,
/// `kc` columns of `MR` values each, zero-padding the last panel's missing rows.
///
/// # Safety
/// The block's elements are readable, `dst` has room for `round_up(mc, MR)·kc` elements.
unsafe fn pack_a<E: Elem, K: Kernel<E>>(
    mc: usize,
    kc: usize,
    src: *const E,
    rs: usize,
    cs: usize,
    dst: *mut E,
) {
    let mr = K::MR;
    let mut ip = 0;
    while ip < mc {
        let h = mr.min(mc - ip);
        let d = dst.add(ip * kc);
        let s = src.add(ip * rs);
        if cs == 1 {
            // Each row of A is contiguous.
            K::pack_lines(s, rs, h, kc, d, mr);
        } else {
            for q in 0..kc {
                for i in 0..h {
                    *d.add(q * mr + i) = *s.add(i * rs + q * cs);
                }
            }
        }
        if h < mr {
            for q in 0..kc {
                for i in h..mr {
                    *d.add(q * mr + i) = E::ZERO;
                }
            }
        }
        ip += mr;
    }
}

/// The plain-Rust kernel (`MR × NR` accumulators in arrays the compiler keeps in vector
/// registers), for CPUs without AVX2.
struct Portable<const MR: usize, const NR: usize>;

impl<E: Elem, const MR: usize, const NR: usize> Kernel<E> for Portable<MR, NR> {
    const MR: usize = MR;
    const NR: usize = NR;
    #[inline(never)]
    unsafe fn tile(
        kc: usize,
        a: *const E,
        b: *const E,
        c: *mut E,
        rsc: usize,
        csc: usize,
        mr: usize,
        nr: usize,
        alpha: E,
        beta: E,
    ) {
        let mut acc = [[E::ZERO; NR]; MR];
        for q in 0..kc {
            let av = &*a.add(q * MR).cast::<[E; MR]>();
            let bv = &*b.add(q * NR).cast::<[E; NR]>();
            for i in 0..MR {
                for j in 0..NR {
                    acc[i][j] = E::fma(av[i], bv[j], acc[i][j]);
                }
            }
        }
        for (i, row) in acc.iter().enumerate().take(mr) {
            for (j, &s) in row.iter().enumerate().take(nr) {
                let x = c.add(i * rsc + j * csc);
                *x = if beta == E::ZERO {
                    alpha * s
                } else {
                    E::fma(alpha, s, *x * beta)
                };
            }
        }
    }
}

mod kernel;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;
