//! CUDA C for the three ops that are not fused kernels: gather, scatter-add and concat (see
//! the IR's `Op::Gather`, `Op::ScatterAdd` and `Op::Concat`). Gather and concat are grid-stride
//! loops over the elements they write, block 256, grid `min(ceil(elements / 256), 132 * 32)`;
//! scatter-add is a program of three launches over a table of the ids (see
//! [`scatter_add_program`]).
//! Sizes are literals, with 32-bit index arithmetic when every extent is below 2^31.

use super::{
    c_type, finish, grid_for, literal, signature, CodegenError, CudaKernel, FusedArg, FusedLaunch,
    FusedProgram, Ix, Launch, Src, BLOCK, MAX_GRID_ELEMENTWISE,
};
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
        (format!("const {}*", c_type(table)), "table".to_string()),
        (format!("const {}*", c_type(ids)), "ids".to_string()),
        (format!("{}*", c_type(table)), "out".to_string()),
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

/// `scatter_add(ids [n], values [n, row_len]) -> out [rows, row_len]` (in the values' type, or
/// f32 for bf16 values, kept unrounded) as three launches
/// sharing a table of `rows` ids ([`scatter_add_scratch_bytes`], the node's planned workspace):
/// the table zeroed; [`scatter_add_marks`]; then [`scatter_add`]'s sums. The runtime zeroes
/// `out` before the first. Params per launch, in order: the table; ids, the table; ids, values,
/// the table, out.
///
/// Deterministic: each row's sum comes in the order of the ids' positions, as the CPU adds
/// them, so the result is the same on every run (and the CPU's, bit for bit). Atomic adds of
/// the values would be simpler, and the order in which they land varies from run to run: the
/// embedding's gradient, and every parameter after it, would then differ in its last bits
/// between two runs of the same step. The table's atomics are `max` and `or` of integers, whose
/// result does not depend on their order.
///
/// Linear in the positions for ids that appear once or a few times: a row's owner (its id's
/// first position) reads the table instead of scanning the positions before it, and scans only
/// up to its id's last position and only the groups of positions the id appears in. Before the
/// table, every position scanned all positions before it: gpt2's token embedding gradient on
/// two ranks (16,384 positions) took 2.6 times as long as on one (8,192).
pub fn scatter_add_program(
    ids: DType,
    values: DType,
    out: DType,
    rows: usize,
    row_len: usize,
    n: usize,
) -> Result<FusedProgram, CodegenError> {
    let sum = scatter_add(ids, values, out, rows, row_len, n)?;
    let bytes = scatter_table_bytes(rows, n)?;
    let table = FusedArg::Scratch { offset: 0, bytes };
    let zero = elementwise_loop(
        &format!("// ingot scatter_add table: {rows} rows' first position, end and groups, zeroed"),
        &[("unsigned*".to_string(), "table".to_string())],
        3 * rows,
        Ix::for_extents([3 * rows]),
        |src, _| src.line("table[e] = 0u;"),
    );
    let marks = scatter_add_marks(ids, rows, n)?;
    use FusedArg::{Input, Output};
    Ok(FusedProgram {
        launches: vec![
            FusedLaunch {
                kernel: zero,
                args: vec![table],
                reads: 0,
            },
            FusedLaunch {
                kernel: marks,
                args: vec![Input(0), table],
                reads: 1,
            },
            FusedLaunch {
                kernel: sum,
                args: vec![Input(0), Input(1), table, Output(0)],
                reads: 3,
            },
        ],
        scratch_bytes: bytes.next_multiple_of(256),
    })
}

/// Bytes of the table [`scatter_add_program`] keeps in its workspace for `rows` rows: three
/// `unsigned` per row, rounded up to 256 as the planner aligns buffers (saturating: a size
/// that overflows is refused when the program is generated).
pub fn scatter_add_scratch_bytes(rows: usize) -> usize {
    rows.saturating_mul(12).saturating_add(255) / 256 * 256
}

/// The table's bytes; an error when they, or a position, do not fit the table's `unsigned`s.
fn scatter_table_bytes(rows: usize, n: usize) -> Result<usize, CodegenError> {
    let too_large = || CodegenError::TooLarge {
        op: "scatter_add",
        sizes: vec![rows, n],
    };
    if n >= u32::MAX as usize {
        return Err(too_large());
    }
    rows.checked_mul(12)
        .filter(|b| b.checked_add(255).is_some())
        .ok_or_else(too_large)
}

/// Positions per bit of a row's groups word: 32 groups cover the positions.
fn scatter_group(n: usize) -> usize {
    n.div_ceil(32).max(1)
}

/// The table's marks of every id in `0..rows` at its positions: for row `r`, `table[r]` is
/// `n` minus its first position, `table[rows + r]` its last position plus one, and bit `b` of
/// `table[2 rows + r]` is set when it appears at a position in `b·G..(b+1)·G` (`G` =
/// `ceil(n / 32)`). 0 everywhere for an id that does not appear. Params: ids, table (zeroed).
pub fn scatter_add_marks(ids: DType, rows: usize, n: usize) -> Result<CudaKernel, CodegenError> {
    check_ids("scatter_add", ids)?;
    scatter_table_bytes(rows, n)?;
    let ix = Ix::for_extents([n, 3 * rows]);
    let params = [
        (format!("const {}*", c_type(ids)), "ids".to_string()),
        ("unsigned*".to_string(), "table".to_string()),
    ];
    let what = format!(
        "// ingot scatter_add marks: the first position, end and groups of {n} {} ids into {rows} rows",
        ids.name()
    );
    let group = scatter_group(n);
    Ok(elementwise_loop(&what, &params, n, ix, |src, _| {
        src.line("const long long id = (long long)ids[e];");
        src.line(format!("if (id < 0ll || id >= {rows}ll) continue;"));
        src.line(format!("atomicMax(table + id, (unsigned)({n}ull - e));"));
        src.line(format!(
            "atomicMax(table + {rows}ll + id, (unsigned)(e + 1u));"
        ));
        src.line(format!(
            "atomicOr(table + {}ll + id, 1u << (unsigned)(e / {}));",
            2 * rows,
            ix.lit(group)
        ));
    }))
}

/// The sums of [`scatter_add_program`], after [`scatter_add_marks`]: a block-stride loop over
/// the positions, in which the block of the position that owns a row (its id's first, from the
/// table) walks the positions from its own to its id's last in chunks of 2048, skipping the
/// groups the id does not appear in; each warp marks its matches in ballots, and every thread
/// adds the matching rows of `values` in position order into registers, `row_len / 256` columns
/// per thread (column panels of 2048 for longer rows), storing each sum once. Ids outside
/// `0..rows` are skipped. Params: ids, values, table, out. Values are f32, f64, i32, i64
/// (integers wrap) or bf16 (summed in f32, each sum rounded once, or stored in f32 when `out`
/// is f32); `out` is the values' type otherwise; ids i32 or i64.
pub fn scatter_add(
    ids: DType,
    values: DType,
    out: DType,
    rows: usize,
    row_len: usize,
    n: usize,
) -> Result<CudaKernel, CodegenError> {
    check_ids("scatter_add", ids)?;
    if values == DType::Bool {
        return Err(CodegenError::Unsupported {
            op: "scatter_add",
            what: "values",
            dtype: values,
        });
    }
    // The sum is stored in the values' type, or (bf16 values) in f32, unrounded.
    if out != values && (values, out) != (DType::BF16, DType::F32) {
        return Err(CodegenError::Unsupported {
            op: "scatter_add",
            what: "result",
            dtype: out,
        });
    }
    scatter_table_bytes(rows, n)?;
    let total = mul("scatter_add", &[n, row_len])?;
    let out_len = mul("scatter_add", &[rows, row_len])?;
    let s = Scatter::new(
        Ix::for_extents([total, out_len, n, 3 * rows]),
        values,
        out,
        rows,
        row_len,
        n,
    );
    let params = [
        (format!("const {}*", c_type(ids)), "ids".to_string()),
        (format!("const {}*", s.vt), "values".to_string()),
        ("const unsigned*".to_string(), "table".to_string()),
        (format!("{}*", c_type(out)), "out".to_string()),
    ];
    let launch = Launch {
        grid: [grid_for(n, 1, MAX_GRID_ELEMENTWISE), 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
    };
    let mut src = Src::default();
    let into = if out == values {
        String::new()
    } else {
        format!(" of {}", out.name())
    };
    src.line(format!(
        "// ingot scatter_add: {n} rows of {row_len} {} added into {rows} rows{into}, by {} ids, \
         in position order",
        values.name(),
        ids.name()
    ));
    src.line(format!(
        "// launch: grid [{},1,1], block [{},1,1]",
        launch.grid[0], launch.block[0]
    ));
    src.open(signature(BLOCK, &params));
    if total == 0 {
        src.line("// nothing to compute");
        src.close();
        return Ok(finish(src.text, launch));
    }
    s.owned_rows(&mut src);
    s.panels(&mut src);
    src.close();
    src.close();
    Ok(finish(src.text, launch))
}

/// Columns per thread in one panel of scatter-add's row (the panel is this many times the
/// block wide): the sums of a panel are kept in registers.
const PANEL_PER_THREAD: usize = 8;
/// Positions each thread of scatter-add checks per chunk: a chunk of 2048 positions costs one
/// barrier.
const SCAN_PER_THREAD: usize = 8;

/// The text parameters of one scatter-add kernel, and its stages: the loop over the positions
/// that own their id's row ([`Scatter::owned_rows`]), then per column panel the scan of the
/// later positions and the sums ([`Scatter::panels`]).
struct Scatter {
    ix: Ix,
    /// The values' C type, and the type they are summed in (integer sums wrap: they are kept
    /// unsigned, whose overflow C++ defines).
    vt: &'static str,
    at: &'static str,
    values: DType,
    out: DType,
    rows: usize,
    row_len: usize,
    n: usize,
    /// Columns a thread sums in one panel, and the panel's width.
    per_thread: usize,
    panel: usize,
}

impl Scatter {
    fn new(ix: Ix, values: DType, out: DType, rows: usize, row_len: usize, n: usize) -> Scatter {
        let vt = c_type(values);
        let at = match values {
            DType::I32 => "unsigned",
            DType::I64 => "unsigned long long",
            // bf16 values are summed in f32 and the sum rounded once (as the CPU does).
            DType::BF16 => "float",
            _ => vt,
        };
        let per_thread = row_len.div_ceil(BLOCK as usize).clamp(1, PANEL_PER_THREAD);
        Scatter {
            ix,
            vt,
            at,
            values,
            out,
            rows,
            row_len,
            n,
            per_thread,
            panel: per_thread * BLOCK as usize,
        }
    }

    /// Opens the block-stride loop over positions `p` and skips those whose id is out of
    /// range or appeared at an earlier position (that position owns the row; the table says
    /// which, the same for every thread of the block); defines `row`, the owned row's first
    /// element, `end`, the id's last position plus one, and `groups`, where it appears.
    fn owned_rows(&self, src: &mut Src) {
        let (ix, t) = (self.ix, self.ix.ty());
        let (rows, n) = (self.rows, self.n);
        src.line(format!(
            "__shared__ unsigned marks[{SCAN_PER_THREAD}][{}];",
            BLOCK / 32
        ));
        src.line("const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;");
        src.open(format!(
            "for ({t} p = blockIdx.x; p < {}; p += gridDim.x) {{",
            ix.lit(n)
        ));
        src.line("const long long id = (long long)ids[p];");
        src.line(format!("if (id < 0ll || id >= {rows}ll) continue;"));
        src.line(format!(
            "if (table[id] != (unsigned)({n}ull - p)) continue;"
        ));
        src.line(format!("const {t} end = ({t})table[{rows}ll + id];"));
        src.line(format!(
            "const unsigned groups = table[{}ll + id];",
            2 * rows
        ));
        src.line(format!(
            "const {t} row = ({t})id * {};",
            ix.lit(self.row_len)
        ));
    }

    /// The loop over the row's column panels: zeroes the panel's sums, walks the
    /// positions from `p` on in chunks (each warp marking its matches in a ballot, then every
    /// thread adding the marked rows in position order), and stores the sums once.
    fn panels(&self, src: &mut Src) {
        let (ix, t) = (self.ix, self.ix.ty());
        let (at, per_thread) = (self.at, self.per_thread);
        src.open(format!(
            "for ({t} c0 = 0; c0 < {}; c0 += {}) {{",
            ix.lit(self.row_len),
            ix.lit(self.panel)
        ));
        src.line(format!("{at} acc[{per_thread}];"));
        src.line(format!(
            "for (int k = 0; k < {per_thread}; ++k) acc[k] = ({at}){};",
            literal(0.0, self.values)
        ));
        let chunk = SCAN_PER_THREAD * BLOCK as usize;
        src.open(format!("for ({t} q0 = p; q0 < end;) {{"));
        src.open(format!("for (int i = 0; i < {SCAN_PER_THREAD}; ++i) {{"));
        src.line(format!(
            "const {t} q = q0 + ({t})i * {BLOCK}u + threadIdx.x;"
        ));
        src.line(
            "const unsigned m = __ballot_sync(0xffffffffu, q < end && (long long)ids[q] == id);",
        );
        src.line("if (lane == 0u) marks[i][warp] = m;");
        src.close();
        src.line("__syncthreads();");
        self.add_marked(src);
        src.line("__syncthreads(); // the next chunk reuses marks");
        // On to the next chunk, past the groups of positions without the id.
        src.line(format!("q0 += {};", ix.lit(chunk)));
        src.line(format!(
            "const unsigned g = (unsigned)(q0 / {});",
            ix.lit(scatter_group(self.n))
        ));
        src.line("if (g >= 32u || (groups >> g) == 0u) break;");
        src.line(format!(
            "const {t} next = ({t})(g + (unsigned)__ffs(groups >> g) - 1u) * {};",
            ix.lit(scatter_group(self.n))
        ));
        src.line("if (next > q0) q0 = next;");
        src.close();
        src.open(format!("for (int k = 0; k < {per_thread}; ++k) {{"));
        src.line(format!(
            "const {t} c = c0 + threadIdx.x + ({t})k * {BLOCK}u;"
        ));
        let sum = match self.out {
            DType::BF16 => "ig_bf16_bits(acc[k])".to_string(),
            out => format!("({})acc[k]", c_type(out)),
        };
        src.line(format!(
            "if (c < {}) out[row + c] = {sum};",
            ix.lit(self.row_len)
        ));
        src.close();
        src.close();
    }

    /// Adds the rows of `values` at the chunk's marked positions into the sums, in increasing
    /// position order: by `i`, then warp, then lane.
    fn add_marked(&self, src: &mut Src) {
        let (ix, t, vt) = (self.ix, self.ix.ty(), self.vt);
        src.open(format!("for (int i = 0; i < {SCAN_PER_THREAD}; ++i) {{"));
        src.open(format!(
            "for (unsigned w = 0u; w < {}u; ++w) {{",
            BLOCK / 32
        ));
        src.open("for (unsigned bits = marks[i][w]; bits != 0u; bits &= bits - 1u) {");
        src.line(format!(
            "const {vt}* v = values + (q0 + ({t})i * {BLOCK}u + w * 32u + (unsigned)(__ffs(bits) - 1)) * {};",
            ix.lit(self.row_len)
        ));
        src.open(format!("for (int k = 0; k < {}; ++k) {{", self.per_thread));
        src.line(format!(
            "const {t} c = c0 + threadIdx.x + ({t})k * {BLOCK}u;"
        ));
        let term = match self.values {
            DType::BF16 => "ig_widen(v[c])".to_string(),
            _ => format!("({})v[c]", self.at),
        };
        src.line(format!(
            "if (c < {}) acc[k] += {term};",
            ix.lit(self.row_len)
        ));
        src.close();
        src.close();
        src.close();
        src.close();
    }
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
        super::list(widths),
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

fn check_ids(op: &'static str, ids: DType) -> Result<(), CodegenError> {
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
    src.line(what);
    src.line(format!(
        "// launch: grid [{},1,1], block [{},1,1]",
        launch.grid[0], launch.block[0]
    ));
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
