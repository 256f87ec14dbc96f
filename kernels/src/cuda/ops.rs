//! CUDA C for the ops that are not fused kernels: gather, concat and dropout (see the IR's
//! `Op::Gather`, `Op::Concat` and `Op::Dropout`; scatter-add is [`super::scatter`]). Each is a
//! grid-stride loop over the elements it writes, block 256, grid
//! `min(ceil(elements / 256), 132 * 32)`.
//! Sizes are literals, with 32-bit index arithmetic when every extent is below 2^31.

use super::emit::{
    c_type, finish, grid_for, literal, reads, signature, writes, Ix, Src, BLOCK,
    MAX_GRID_ELEMENTWISE,
};
use super::kernel::{CodegenError, CudaKernel, Launch};
use crate::DType;

/// `gather(table [rows, row_len], ids [n]) -> out [n, row_len]`; an id outside `0..rows` gives
/// a zero row. Params: table, ids, out. Ids are i32 or i64.
pub fn gather(
    table: DType,
    ids: DType,
    rows: usize,
    row_len: usize,
    n: usize,
) -> Result<CudaKernel, CodegenError> {
    check_ids("gather", ids)?;
    let total = mul("gather", &[n, row_len])?;
    let table_len = mul("gather", &[rows, row_len])?;
    let ix = Ix::for_extents([total, table_len, n]);
    let params = [
        reads(table, "table"),
        reads(ids, "ids"),
        writes(table, "out"),
    ];
    let what = format!(
        "// ingot gather: {n} rows of {row_len} {} from a table of {rows} rows, by {} ids",
        table.name(),
        ids.name()
    );
    // A bf16 table's rows move as their 16 bits; a zero row is +0.0's bits.
    let zero = match table {
        DType::BF16 => "(unsigned short)0".to_string(),
        _ => literal(0.0, table),
    };
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        split(src, t, ix, row_len);
        src.line("const long long id = (long long)ids[r];");
        src.line(format!(
            "out[e] = id >= 0ll && id < {rows}ll ? table[({t})id * {} + c] : {zero};",
            ix.lit(row_len),
        ));
    }))
}

/// Concat along an axis: input `i` is `[outer, widths[i]]` (row-major; widths already
/// multiplied by the inner size), the output `[outer, Σ widths]`. Params: the inputs in order,
/// then out.
pub fn concat(dtype: DType, outer: usize, widths: &[usize]) -> Result<CudaKernel, CodegenError> {
    let too_large = || CodegenError::TooLarge {
        op: "concat",
        sizes: std::iter::once(outer)
            .chain(widths.iter().copied())
            .collect(),
    };
    let width = widths
        .iter()
        .try_fold(0usize, |a, &w| a.checked_add(w))
        .ok_or_else(too_large)?;
    let total = outer.checked_mul(width).ok_or_else(too_large)?;
    let ix = Ix::for_extents(
        std::iter::once(total).chain(widths.iter().map(|&w| outer.saturating_mul(w))),
    );
    let ty = c_type(dtype);
    let mut params: Vec<(String, String)> = widths
        .iter()
        .enumerate()
        .map(|(i, _)| (format!("const {ty}*"), format!("in{i}")))
        .collect();
    params.push((format!("{ty}*"), "out".to_string()));
    let what = format!(
        "// ingot concat: {} inputs of {outer} rows, widths {}, {}",
        widths.len(),
        super::emit::list(widths),
        dtype.name()
    );
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        src.line(format!("const {t} o = e / {};", ix.lit(width)));
        src.line(format!("const {t} c = e - o * {};", ix.lit(width)));
        let nonzero: Vec<usize> = (0..widths.len()).filter(|&i| widths[i] > 0).collect();
        let mut start = 0usize;
        let mut starts = vec![0usize; widths.len()];
        for (i, &w) in widths.iter().enumerate() {
            starts[i] = start;
            start += w;
        }
        for (q, &i) in nonzero.iter().enumerate() {
            let w = widths[i];
            let col = if starts[i] == 0 {
                "c".to_string()
            } else {
                format!("(c - {})", ix.lit(starts[i]))
            };
            let read = format!("out[e] = in{i}[o * {} + {col}];", ix.lit(w));
            let last = q + 1 == nonzero.len();
            let cond = format!("c < {}", ix.lit(starts[i] + w));
            let line = match (q, last) {
                (0, true) => format!("{{ {read} }}"),
                (0, false) => format!("if ({cond}) {{ {read} }}"),
                (_, false) => format!("else if ({cond}) {{ {read} }}"),
                (_, true) => format!("else {{ {read} }}"),
            };
            src.line(line);
        }
    }))
}

/// `dropout(x [n], seed []) -> out [n]` with probability `p` and salt `salt`: element `e` is
/// `x[e] · (1/(1 − p))` where the counter-based draw ([`crate::rng`]) of `(seed, salt, e)` is
/// at least `p` (as f32), else `x[e] · 0`. The draw is the host's, spelled in
/// `unsigned long long`, so the GPU drops exactly the elements the CPU drops; the product is
/// f32 (f64 for f64; bf16 widened to f32, multiplied, rounded once), as on the CPU. Params: x,
/// seed (one `long long`, the step's seed input), out. Out may be written over x.
pub fn dropout(dtype: DType, n: usize, p: f64, salt: u64) -> Result<CudaKernel, CodegenError> {
    if !matches!(dtype, DType::F32 | DType::F64 | DType::BF16) {
        return Err(CodegenError::Unsupported {
            op: "dropout",
            what: "x",
            dtype,
        });
    }
    let ix = Ix::for_extents([n]);
    let ty = c_type(dtype);
    let params = [
        (format!("const {ty}*"), "x".to_string()),
        ("const long long*".to_string(), "seed".to_string()),
        (format!("{ty}*"), "out".to_string()),
    ];
    let what = format!(
        "// ingot dropout: {n} {} elements, p {p:?}, salt {salt}",
        dtype.name()
    );
    let scale = crate::rng::keep_scale(p);
    let (keep, zero) = match dtype {
        DType::F64 => (literal(scale, DType::F64), "0.0".to_string()),
        _ => (literal(scale as f32 as f64, DType::F32), "0.0f".to_string()),
    };
    let threshold = literal(p as f32 as f64, DType::F32);
    let gamma = format!("0x{:016x}ull", crate::rng::GAMMA);
    let mix = |src: &mut Src, z: &str| {
        src.line(format!("{z} ^= {z} >> 30; {z} *= 0xbf58476d1ce4e5b9ull;"));
        src.line(format!("{z} ^= {z} >> 27; {z} *= 0x94d049bb133111ebull;"));
        src.line(format!("{z} ^= {z} >> 31;"));
    };
    Ok(elementwise_loop(&what, &params, n, ix, |src, _t| {
        // The key (the same for every element; recomputed per element, it is a few integer
        // ops against a memory-bound loop).
        src.line(format!("unsigned long long salt = {salt}ull + {gamma};"));
        mix(src, "salt");
        src.line("unsigned long long key = (unsigned long long)seed[0] ^ salt;");
        mix(src, "key");
        src.line(format!(
            "unsigned long long h = key + ((unsigned long long)e + 1ull) * {gamma};"
        ));
        mix(src, "h");
        src.line("const float u = (float)(h >> 40) * 5.9604644775390625e-8f;");
        let m = format!("(u >= {threshold} ? {keep} : {zero})");
        src.line(match dtype {
            DType::BF16 => format!("out[e] = ig_narrow(ig_round(ig_widen(x[e]) * {m}));"),
            _ => format!("out[e] = x[e] * {m};"),
        });
    }))
}

/// The first lines of a one-dimensional kernel: what it computes (a `//` comment line), then
/// its launch shape.
pub(crate) fn header(src: &mut Src, what: &str, launch: Launch) {
    src.line(what);
    src.line(format!(
        "// launch: grid [{},1,1], block [{},1,1]",
        launch.grid[0], launch.block[0]
    ));
}

pub(crate) fn check_ids(op: &'static str, ids: DType) -> Result<(), CodegenError> {
    match ids {
        DType::I32 | DType::I64 => Ok(()),
        _ => Err(CodegenError::Unsupported {
            op,
            what: "ids",
            dtype: ids,
        }),
    }
}

fn mul(op: &'static str, sizes: &[usize]) -> Result<usize, CodegenError> {
    sizes
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| CodegenError::TooLarge {
            op,
            sizes: sizes.to_vec(),
        })
}

/// `r` (the id's index) and `c` (the column) of the linear index `e` over `[_, row_len]`.
fn split(src: &mut Src, t: &str, ix: Ix, row_len: usize) {
    if row_len == 1 {
        src.line(format!("const {t} r = e;"));
        src.line(format!("const {t} c = {};", ix.lit(0)));
    } else {
        src.line(format!("const {t} r = e / {};", ix.lit(row_len)));
        src.line(format!("const {t} c = e - r * {};", ix.lit(row_len)));
    }
}

/// A kernel that runs `body` at every `e` in `0..total` (nothing when `total` is 0).
pub(crate) fn elementwise_loop(
    what: &str,
    params: &[(String, String)],
    total: usize,
    ix: Ix,
    body: impl FnOnce(&mut Src, &str),
) -> CudaKernel {
    let launch = Launch {
        grid: [grid_for(total, BLOCK as usize, MAX_GRID_ELEMENTWISE), 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
    };
    let mut src = Src::default();
    header(&mut src, what, launch);
    src.open(signature(BLOCK, params));
    if total > 0 {
        let t = ix.ty();
        src.open(format!(
            "for ({t} e = {}; e < {}; e += {}) {{",
            ix.global_thread(BLOCK),
            ix.lit(total),
            ix.grid_stride(BLOCK)
        ));
        body(&mut src, t);
        src.close();
    } else {
        src.line("// nothing to compute");
    }
    src.close();
    finish(src.text, launch)
}
