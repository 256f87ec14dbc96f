//! Tile sizes: how many rows a block owns and how many rows of the other operand it streams
//! through shared memory per step, chosen per kernel, precision and head dim so that the
//! block's shared memory stays within the 48 KiB a block may declare statically.

use super::problem::AttentionPrecision;

/// Which kernel a tiling is for (the three that hold tiles in shared memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileKernel {
    /// Owns query rows; streams key and value tiles.
    Forward,
    /// Owns key rows (their dk, dv); streams query, dout, lse and delta tiles.
    Dkdv,
    /// Owns query rows (their dq); streams key and value tiles.
    Dq,
}

/// One kernel's tiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    /// Warps a block; each owns 16 of the block's rows.
    pub warps: usize,
    /// Rows the block owns: `16 · warps`.
    pub rows: usize,
    /// Rows of the streamed operand a step (a multiple of 16: the bf16 products' k).
    pub inner: usize,
    /// Copies of the streamed tiles the block holds: 2 for bf16 dkdv where they fit (the
    /// next query tile lands while the block computes with this one), else 1.
    pub copies: usize,
    /// Bytes of static shared memory the kernel declares.
    pub shared_bytes: usize,
}

/// The most static shared memory a block may declare.
pub const SHARED_LIMIT: usize = 48 * 1024;

/// Elements of padding at the end of each shared row: 16 bytes, so that the eight rows a
/// fragment load touches start in different banks (and rows stay 16-byte aligned).
pub(crate) fn pad(p: AttentionPrecision) -> usize {
    match p {
        AttentionPrecision::Bf16 => 8,
        AttentionPrecision::F32 | AttentionPrecision::Tf32 => 4,
    }
}

/// Bytes of one stored element.
pub(crate) fn element_bytes(p: AttentionPrecision) -> usize {
    match p {
        AttentionPrecision::Bf16 => 2,
        AttentionPrecision::F32 | AttentionPrecision::Tf32 => 4,
    }
}

/// Shared bytes of `kernel` with `rows` owned and `inner` streamed rows (see the kernels'
/// declarations: q/k/v/dout tiles of `head_dim + pad` a row, one probabilities tile, and for
/// dkdv the streamed rows' lse and delta, `copies` of each streamed tile).
pub(crate) fn shared_bytes(
    kernel: TileKernel,
    p: AttentionPrecision,
    head_dim: usize,
    (rows, inner, copies): (usize, usize, usize),
) -> usize {
    let ld = head_dim + pad(p);
    let es = element_bytes(p);
    match kernel {
        // q [rows], k, v [inner], p [rows × inner]
        TileKernel::Forward => (rows * ld + 2 * inner * ld + rows * (inner + pad(p))) * es,
        // k, v [rows], q, dout [inner] (copies), p [rows × inner], lse, delta [inner] (copies)
        TileKernel::Dkdv => {
            (2 * rows * ld + 2 * copies * inner * ld + rows * (inner + pad(p))) * es
                + 2 * copies * inner * 4
        }
        // q, dout [rows], k, v [inner], p [rows × inner]
        TileKernel::Dq => (2 * rows * ld + 2 * inner * ld + rows * (inner + pad(p))) * es,
    }
}

/// The first tiling in the kernel's preference list whose shared memory fits; `None` if none
/// fits (no supported head dim). Four warps of 16 rows where they fit, fewer elsewhere. The
/// orders follow the tilings measured on an H100 (GPT-2's B=8, H=12, T=1024, D=64 causal,
/// `attention_bench`, docs/benchmarks.md): bf16 forward 4 × 64 0.102 ms (4 × 32 0.103, 2 × 32
/// 0.113); bf16 dkdv 4 × 32 0.193 ms (4 × 64 0.204: 254 registers a thread); bf16 dq 4 × 32
/// 0.117, 4 × 64 0.119; tf32 dq 4 × 16 0.268 ms (2 × 32 0.284), tf32 dkdv 4 × 16 0.384 and
/// 2 × 32 0.386.
pub fn choose(kernel: TileKernel, p: AttentionPrecision, head_dim: usize) -> Option<Tiles> {
    const FORWARD: &[(usize, usize)] = &[
        (4, 64),
        (4, 32),
        (2, 64),
        (2, 32),
        (4, 16),
        (2, 16),
        (1, 16),
    ];
    const DKDV: &[(usize, usize)] = &[(4, 32), (4, 16), (2, 32), (2, 16), (1, 16)];
    const DQ: &[(usize, usize)] = &[
        (4, 64),
        (4, 32),
        (4, 16),
        (2, 64),
        (2, 32),
        (2, 16),
        (1, 16),
    ];
    let candidates = match kernel {
        TileKernel::Forward => FORWARD,
        TileKernel::Dkdv => DKDV,
        TileKernel::Dq => DQ,
    };
    candidates
        .iter()
        .find_map(|&(warps, inner)| tiling(kernel, p, head_dim, warps, inner))
}

/// The tiling of `warps` × `inner` if it fits in shared memory with one copy of the streamed
/// tiles, with two where the kernel is bf16 dkdv and they fit too (the choice of tiles is the
/// same as before there were two; the second copy only lets the next tile's copy overlap).
fn tiling(
    kernel: TileKernel,
    p: AttentionPrecision,
    head_dim: usize,
    warps: usize,
    inner: usize,
) -> Option<Tiles> {
    let rows = 16 * warps;
    let bytes = |copies| shared_bytes(kernel, p, head_dim, (rows, inner, copies));
    if bytes(1) > SHARED_LIMIT {
        return None;
    }
    let two =
        kernel == TileKernel::Dkdv && p == AttentionPrecision::Bf16 && bytes(2) <= SHARED_LIMIT;
    let copies = if two { 2 } else { 1 };
    Some(Tiles {
        warps,
        rows,
        inner,
        copies,
        shared_bytes: bytes(copies),
    })
}

/// The tiling of `warps` warps and `inner`-row steps, if it is one the kernels take (1 to 8
/// warps, a step of 16 to 128 rows by 16) and fits in shared memory: for measuring tilings
/// other than [`choose`]'s.
pub fn fixed(
    kernel: TileKernel,
    p: AttentionPrecision,
    head_dim: usize,
    warps: usize,
    inner: usize,
) -> Option<Tiles> {
    let ok = (1..=8).contains(&warps) && (16..=128).contains(&inner) && inner.is_multiple_of(16);
    ok.then(|| tiling(kernel, p, head_dim, warps, inner))
        .flatten()
}
