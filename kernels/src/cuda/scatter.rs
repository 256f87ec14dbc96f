//! Scatter-add on the GPU: `scatter_add(ids [n], values [n, row_len]) -> out [rows, row_len]`
//! (the IR's `Op::ScatterAdd`; an embedding's gradient) as a program of launches: the
//! positions sorted by id, then each id's rows summed by one warp.
//!
//! **The sort.** An LSD radix sort of `(id, position)` by the id, 8 bits a pass (two passes
//! for gpt2's 50,304 rows): per pass a histogram of each tile of 1024 positions, one block's
//! exclusive scan of the histograms (digit-major, so a digit's slots follow in tile order),
//! and the scatter of each position to its slot. Each pass is stable: within a tile a
//! position's rank among its digit is counted by warp (`__match_any_sync`), then across the
//! tile's warps in order. So the sorted positions of an id are in increasing order. An id
//! outside `0..rows` is sorted as `rows`, past every real one, and skipped.
//!
//! **The sums.** A warp per sorted position and column panel (`32 × K` columns, `K` a lane,
//! coalesced); the warp at an id's first position sums the id's rows. A run of fewer than 32
//! positions (most ids) is summed whole by the first panel's warp, all of a row's loads
//! issued at once; a longer run (a frequent id) by one warp a panel, each reading the run's
//! positions 32 at a time and loading 8 rows before adding them. Either way a row's sum is
//! taken in position order in registers and stored once. Rows that no id names are not
//! written (the runtime zeroes the output before the program).
//!
//! **Why this shape.** Deterministic: each row's sum comes in the order of the ids'
//! positions, as the CPU adds them, so the result is the same on every run and equal to the
//! CPU's bit for bit. Atomic adds of the values would land in an order that varies from run to
//! run, and the embedding's gradient, and every parameter after it, would differ in their last
//! bits between two runs of the same step. The sort's atomics count integers in shared
//! memory, whose results do not depend on their order. Everything before the sums reads only
//! the ids, which a training step knows from its start, so it runs beside the forward pass;
//! the sums, on the step's critical tail after the last layer's backward pass, read each row
//! of `values` once and write each touched row of `out` once. The kernel this replaced walked
//! each id's positions from its first in chunks with one block a position: 92 µs for gpt2's
//! gradient on two ranks (16,384 positions) on an H100, most of it spent waiting on loads.

use super::emit::{
    c_type, finish, grid_for, literal, reads, signature, writes, Ix, Src, MAX_GRID_ELEMENTWISE,
};
use super::kernel::{CodegenError, CudaKernel, FusedArg, FusedLaunch, FusedProgram, Launch};
use super::ops::{check_ids, header};
use crate::DType;

/// Positions per tile of the sort: one a thread of a 1024-thread block.
const TILE: usize = 1024;
/// Bits of the id sorted per pass, and the digits they give.
const DIGIT_BITS: u32 = 8;
const DIGITS: usize = 1 << DIGIT_BITS;
/// Threads per block of the sums (eight warps).
const SUM_BLOCK: u32 = 256;
/// Most columns one lane sums in one panel (kept in registers): with 768 columns, six warps
/// share a row, so a frequent id's run is summed by six warps at once.
const MAX_PER_LANE: usize = 4;
/// Rows of a run each warp loads before adding them.
const BATCH: usize = 8;
/// Most columns one lane sums of a run shorter than a chunk, which one warp sums whole (rows
/// up to 1024 columns).
const MAX_WHOLE_PER_LANE: usize = 32;

/// The program of [`scatter_add`](self): the sort's launches, each reading only the ids (or
/// the previous pass's sorted keys) and the scratch; the runs found in the sorted keys; then
/// the sums, the only launches that read the values. Params per launch, in order: hist (ids
/// or keys, histograms); scan (histograms); place (ids or keys and positions, histograms, keys
/// out, positions out); zero (counts); runs (keys, short runs, long runs, counts); the short
/// runs' sums, absent for rows over 1024 columns, and the long runs' (keys, positions, runs,
/// counts, values, out). The runtime zeroes `out` before the first.
pub fn scatter_add_program(
    ids: DType,
    values: DType,
    out: DType,
    rows: usize,
    row_len: usize,
    n: usize,
) -> Result<FusedProgram, CodegenError> {
    check_ids("scatter_add", ids)?;
    check_values(values, out)?;
    let s = Scratch::of(rows, n)?;
    let mut launches = Vec::new();
    for pass in 0..s.passes {
        let shift = pass * DIGIT_BITS;
        let (from, to) = (s.sorted(pass.wrapping_sub(1)), s.sorted(pass));
        let source = match pass {
            0 => Source::Ids(ids),
            _ => Source::Sorted,
        };
        let src_args = match pass {
            0 => vec![FusedArg::Input(0)],
            _ => vec![from.0, from.1],
        };
        launches.push(FusedLaunch {
            kernel: histogram(source, rows, n, shift),
            args: [vec![src_args[0]], vec![s.hist]].concat(),
            reads: 1,
        });
        launches.push(FusedLaunch {
            kernel: scan(n),
            args: vec![s.hist],
            reads: 0,
        });
        launches.push(FusedLaunch {
            kernel: place(source, rows, n, shift),
            args: [src_args.clone(), vec![s.hist, to.0, to.1]].concat(),
            reads: src_args.len() + 1,
        });
    }
    let (keys, pos) = s.sorted(s.passes - 1);
    let sums = Sums::new(values, out, rows, row_len, n)?;
    launches.push(FusedLaunch {
        kernel: zero_counts(),
        args: vec![s.counts],
        reads: 0,
    });
    launches.push(FusedLaunch {
        kernel: sums.runs(),
        args: vec![keys, s.short, s.long, s.counts],
        reads: 1,
    });
    // Each sum kernel reads the sorted keys and positions, its list of runs, the counts and
    // the values, and writes the output.
    let sum = |kernel, runs| FusedLaunch {
        kernel,
        args: vec![
            keys,
            pos,
            runs,
            s.counts,
            FusedArg::Input(1),
            FusedArg::Output(0),
        ],
        reads: 5,
    };
    launches.extend(sums.short_runs().map(|k| sum(k, s.short)));
    launches.push(sum(sums.long_runs(), s.long));
    Ok(FusedProgram {
        launches,
        scratch_bytes: s.bytes,
    })
}

/// One scatter-add's types and sizes, as the kernel check and the tests hold it: `n` ids of
/// type `ids` pick, among `rows` rows of `row_len` elements, the row each of the `n` rows of
/// `values` is added into; the sums are stored as `out` (the values' type, or f32 for bf16
/// values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScatterAdd {
    pub ids: DType,
    pub values: DType,
    pub out: DType,
    pub rows: usize,
    pub row_len: usize,
    pub n: usize,
}

impl ScatterAdd {
    /// The scatter-add of ids, values and sums of these types and of `[rows, row_len, n]`
    /// (types, then sizes: as the tests list their cases).
    pub fn of(
        (ids, values, out): (DType, DType, DType),
        [rows, row_len, n]: [usize; 3],
    ) -> ScatterAdd {
        ScatterAdd {
            ids,
            values,
            out,
            rows,
            row_len,
            n,
        }
    }

    /// Its program ([`scatter_add_program`]).
    pub fn program(&self) -> Result<FusedProgram, CodegenError> {
        let s = self;
        scatter_add_program(s.ids, s.values, s.out, s.rows, s.row_len, s.n)
    }
}

/// Bytes of scratch [`scatter_add_program`] keeps in the node's planned workspace for `rows`
/// rows and `n` positions: two buffers of sorted keys and positions (`4 n` bytes each, the
/// passes alternate between them) and the histograms (`4 · 256` bytes a tile of 1024
/// positions), each region 256-byte aligned. Saturating: a size that overflows is refused when
/// the program is generated.
pub fn scatter_add_scratch_bytes(rows: usize, n: usize) -> usize {
    Scratch::of(rows, n).map_or(usize::MAX, |s| s.bytes)
}

/// Values of any type but bool; the sum is stored in the values' type, or (bf16 values) in
/// f32, unrounded.
fn check_values(values: DType, out: DType) -> Result<(), CodegenError> {
    if values == DType::Bool {
        return Err(CodegenError::Unsupported {
            op: "scatter_add",
            what: "values",
            dtype: values,
        });
    }
    if out != values && (values, out) != (DType::BF16, DType::F32) {
        return Err(CodegenError::Unsupported {
            op: "scatter_add",
            what: "result",
            dtype: out,
        });
    }
    Ok(())
}

/// Where the program's scratch lies.
struct Scratch {
    /// Radix passes: enough digits for the ids `0..=rows` (`rows` stands for an id out of
    /// range).
    passes: u32,
    /// Keys and positions of buffer 0 and buffer 1.
    buffers: [(FusedArg, FusedArg); 2],
    hist: FusedArg,
    /// The first sorted slot of each id's run: short runs, long runs, and their counts.
    short: FusedArg,
    long: FusedArg,
    counts: FusedArg,
    bytes: usize,
}

impl Scratch {
    fn of(rows: usize, n: usize) -> Result<Scratch, CodegenError> {
        let too_large = || CodegenError::TooLarge {
            op: "scatter_add",
            sizes: vec![rows, n],
        };
        // Positions and ids (with `rows` for out of range) are `unsigned`.
        if n >= u32::MAX as usize || rows >= u32::MAX as usize {
            return Err(too_large());
        }
        let bits = usize::BITS - rows.leading_zeros();
        let passes = bits.div_ceil(DIGIT_BITS).max(1);
        let words = |k: usize| (k * 4).next_multiple_of(256);
        let hist_bytes = words(DIGITS * n.div_ceil(TILE));
        let mut at = 0usize;
        let mut region = |bytes: usize| {
            let r = FusedArg::Scratch { offset: at, bytes };
            at += words(bytes / 4);
            r
        };
        let buffers = [
            (region(4 * n), region(4 * n)),
            (region(4 * n), region(4 * n)),
        ];
        let hist = region(hist_bytes);
        let (short, long, counts) = (region(4 * n), region(4 * n), region(8));
        Ok(Scratch {
            passes,
            buffers,
            hist,
            short,
            long,
            counts,
            bytes: at,
        })
    }

    /// The keys and positions pass `pass` writes (pass `u32::MAX`, before the first, is never
    /// read: the first pass reads the ids).
    fn sorted(&self, pass: u32) -> (FusedArg, FusedArg) {
        self.buffers[(pass % 2) as usize]
    }
}

/// What a pass reads: the ids themselves (the first pass, positions `0..n` in order), or the
/// keys and positions the pass before sorted.
#[derive(Clone, Copy)]
enum Source {
    Ids(DType),
    Sorted,
}

impl Source {
    /// Params of the pass's input.
    fn params(self) -> Vec<(String, String)> {
        match self {
            Source::Ids(ids) => vec![reads(ids, "ids")],
            Source::Sorted => vec![
                ("const unsigned*".to_string(), "keys_in".to_string()),
                ("const unsigned*".to_string(), "pos_in".to_string()),
            ],
        }
    }

    /// Lines defining `key` (the id, or `rows` for one out of range) at position `p`.
    fn key(self, src: &mut Src, rows: usize) {
        match self {
            Source::Ids(_) => {
                src.line("const long long id = (long long)ids[p];");
                src.line(format!(
                    "key = id >= 0ll && id < {rows}ll ? (unsigned)id : {rows}u;"
                ));
            }
            Source::Sorted => src.line("key = keys_in[p];"),
        }
    }

    fn position(self) -> &'static str {
        match self {
            Source::Ids(_) => "p",
            Source::Sorted => "pos_in[p]",
        }
    }
}

fn tiles(n: usize) -> usize {
    n.div_ceil(TILE)
}

fn tile_launch(n: usize) -> Launch {
    Launch {
        grid: [tiles(n).max(1) as u32, 1, 1],
        block: [TILE as u32, 1, 1],
        shared_bytes: 0,
    }
}

/// Each tile's count of each digit (bits `shift..shift + 8` of the key), stored digit-major:
/// `hist[d · tiles + tile]`.
fn histogram(source: Source, rows: usize, n: usize, shift: u32) -> CudaKernel {
    let launch = tile_launch(n);
    let tiles = tiles(n);
    let mut params = source.params();
    params.truncate(1);
    params.push(("unsigned*".to_string(), "hist".to_string()));
    let mut src = Src::default();
    header(
        &mut src,
        &format!(
            "// ingot scatter_add sort: histogram of bits {shift}.. of {n} ids into {rows} rows, \
             tiles of {TILE}"
        ),
        launch,
    );
    src.open(signature(TILE as u32, &params));
    src.line(format!("__shared__ unsigned h[{DIGITS}];"));
    src.line(format!("if (threadIdx.x < {DIGITS}u) h[threadIdx.x] = 0u;"));
    src.line("__syncthreads();");
    src.line(format!(
        "const unsigned p = blockIdx.x * {TILE}u + threadIdx.x;"
    ));
    src.open(format!("if (p < {n}u) {{"));
    src.line("unsigned key;");
    source.key(&mut src, rows);
    src.line(format!(
        "atomicAdd(&h[(key >> {shift}u) & {}u], 1u);",
        DIGITS - 1
    ));
    src.close();
    src.line("__syncthreads();");
    src.line(format!(
        "if (threadIdx.x < {DIGITS}u) hist[threadIdx.x * {tiles}u + blockIdx.x] = h[threadIdx.x];"
    ));
    src.close();
    finish(src.text, launch)
}

/// The exclusive prefix sum of the histograms, in place, by one block: each thread sums a
/// contiguous stretch, the block scans the stretches' sums, and each thread writes its
/// stretch's prefixes.
fn scan(n: usize) -> CudaKernel {
    let launch = Launch {
        grid: [1, 1, 1],
        block: [TILE as u32, 1, 1],
        shared_bytes: 0,
    };
    let m = DIGITS * tiles(n);
    let per = m.div_ceil(TILE).max(1);
    let params = [("unsigned*".to_string(), "hist".to_string())];
    let mut src = Src::default();
    header(
        &mut src,
        &format!("// ingot scatter_add sort: exclusive scan of {m} counts"),
        launch,
    );
    src.open(signature(TILE as u32, &params));
    src.line(format!("__shared__ unsigned part[{TILE}];"));
    src.line(format!("const unsigned lo = threadIdx.x * {per}u;"));
    src.line(format!(
        "const unsigned hi = lo + {per}u < {m}u ? lo + {per}u : {m}u;"
    ));
    src.line("unsigned s = 0u;");
    src.line("for (unsigned i = lo; i < hi; ++i) s += hist[i];");
    src.line("part[threadIdx.x] = s;");
    src.line("__syncthreads();");
    src.open(format!(
        "for (unsigned off = 1u; off < {TILE}u; off <<= 1) {{"
    ));
    src.line("const unsigned v = threadIdx.x >= off ? part[threadIdx.x - off] : 0u;");
    src.line("__syncthreads();");
    src.line("part[threadIdx.x] += v;");
    src.line("__syncthreads();");
    src.close();
    src.line("unsigned run = threadIdx.x > 0u ? part[threadIdx.x - 1u] : 0u;");
    src.open("for (unsigned i = lo; i < hi; ++i) {");
    src.line("const unsigned v = hist[i];");
    src.line("hist[i] = run;");
    src.line("run += v;");
    src.close();
    src.close();
    finish(src.text, launch)
}

/// Each position of a tile to its slot: the digit's start for the tile (the scanned
/// histograms), plus the positions of its digit in earlier warps of the tile, plus those in
/// earlier lanes of its warp. Stable, so a pass keeps the order of the pass before among equal
/// digits.
fn place(source: Source, rows: usize, n: usize, shift: u32) -> CudaKernel {
    let launch = tile_launch(n);
    let tiles = tiles(n);
    let warps = TILE / 32;
    let mut params = source.params();
    params.push(("const unsigned*".to_string(), "hist".to_string()));
    params.push(("unsigned*".to_string(), "keys_out".to_string()));
    params.push(("unsigned*".to_string(), "pos_out".to_string()));
    let mut src = Src::default();
    header(
        &mut src,
        &format!(
            "// ingot scatter_add sort: place {n} ids into {rows} rows by bits {shift}.., stable"
        ),
        launch,
    );
    src.open(signature(TILE as u32, &params));
    src.line(format!("__shared__ unsigned cnt[{warps}][{DIGITS}];"));
    src.line(format!(
        "for (unsigned i = threadIdx.x; i < {}u; i += {TILE}u) cnt[i / {DIGITS}u][i % {DIGITS}u] = 0u;",
        warps * DIGITS
    ));
    src.line("__syncthreads();");
    src.line("const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;");
    src.line(format!(
        "const unsigned p = blockIdx.x * {TILE}u + threadIdx.x;"
    ));
    src.line(format!("const bool valid = p < {n}u;"));
    src.line("unsigned key = 0u, pos = 0u;");
    src.open("if (valid) {");
    source.key(&mut src, rows);
    src.line(format!("pos = {};", source.position()));
    src.close();
    src.line(format!(
        "const unsigned d = valid ? (key >> {shift}u) & {}u : {DIGITS}u;",
        DIGITS - 1
    ));
    src.line("const unsigned peers = __match_any_sync(0xffffffffu, d);");
    src.line("const unsigned below = peers & ((1u << lane) - 1u);");
    src.line("if (valid && below == 0u) cnt[warp][d] = __popc(peers);");
    src.line("__syncthreads();");
    src.open(format!("if (threadIdx.x < {DIGITS}u) {{"));
    src.line("unsigned run = 0u;");
    src.open(format!("for (unsigned w = 0u; w < {warps}u; ++w) {{"));
    src.line("const unsigned c = cnt[w][threadIdx.x];");
    src.line("cnt[w][threadIdx.x] = run;");
    src.line("run += c;");
    src.close();
    src.close();
    src.line("__syncthreads();");
    src.open("if (valid) {");
    src.line(format!(
        "const unsigned slot = hist[d * {tiles}u + blockIdx.x] + cnt[warp][d] + __popc(below);"
    ));
    src.line("keys_out[slot] = key;");
    src.line("pos_out[slot] = pos;");
    src.close();
    src.close();
    finish(src.text, launch)
}

/// The run-finding and summing kernels of one scatter-add.
struct Sums {
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
    /// Columns a lane sums of a short run's whole row (`None`: rows too long to sum whole, so
    /// every run is summed by panels).
    whole: Option<usize>,
    /// Columns a lane sums in one panel of a long run, and the panels of a row.
    per_lane: usize,
    panels: usize,
}

impl Sums {
    fn new(
        values: DType,
        out: DType,
        rows: usize,
        row_len: usize,
        n: usize,
    ) -> Result<Sums, CodegenError> {
        let too_large = || CodegenError::TooLarge {
            op: "scatter_add",
            sizes: vec![rows, row_len, n],
        };
        let per_lane = row_len.div_ceil(32).clamp(1, MAX_PER_LANE);
        let panels = row_len.div_ceil(32 * per_lane).max(1);
        let items = n.checked_mul(panels).ok_or_else(too_large)?;
        let values_len = n.checked_mul(row_len).ok_or_else(too_large)?;
        let out_len = rows.checked_mul(row_len).ok_or_else(too_large)?;
        let vt = c_type(values);
        Ok(Sums {
            ix: Ix::for_extents([items, values_len, out_len]),
            vt,
            at: match values {
                DType::I32 => "unsigned",
                DType::I64 => "unsigned long long",
                DType::BF16 => "float",
                _ => vt,
            },
            values,
            out,
            rows,
            row_len,
            n,
            whole: Some(row_len.div_ceil(32).max(1)).filter(|&w| w <= MAX_WHOLE_PER_LANE),
            per_lane,
            panels,
        })
    }

    /// A sum kernel's first lines: what it adds into what (` of f32` where the sums are stored
    /// in another type than the values', bf16 rows summed into f32), and `how`.
    fn sum_header(&self, src: &mut Src, how: &str, launch: Launch) {
        let into = match self.out == self.values {
            true => String::new(),
            false => format!(" of {}", self.out.name()),
        };
        let what = format!(
            "// ingot scatter_add: {} rows of {} {} added into {} rows{into}, in position order: {how}",
            self.n,
            self.row_len,
            self.values.name(),
            self.rows,
        );
        header(src, &what, launch);
    }

    /// Finds each id's run in the sorted keys: its first slot goes to the short list (fewer
    /// than 32 positions, summed whole) or the long list, each slot in the list by a
    /// warp-aggregated atomic count. The lists' order varies from run to run; each run's sum
    /// does not (one warp sums it, in position order). Params: keys, short, long, counts.
    fn runs(&self) -> CudaKernel {
        let (rows, n) = (self.rows, self.n);
        let launch = Launch {
            grid: [grid_for(n, SUM_BLOCK as usize, MAX_GRID_ELEMENTWISE), 1, 1],
            block: [SUM_BLOCK, 1, 1],
            shared_bytes: 0,
        };
        let params = [
            ("const unsigned*".to_string(), "keys".to_string()),
            ("unsigned*".to_string(), "short_runs".to_string()),
            ("unsigned*".to_string(), "long_runs".to_string()),
            ("unsigned*".to_string(), "counts".to_string()),
        ];
        let mut src = Src::default();
        header(
            &mut src,
            &format!(
                "// ingot scatter_add runs: the first slot of each of {n} sorted ids' runs into {rows} rows, short or long"
            ),
            launch,
        );
        src.open(signature(SUM_BLOCK, &params));
        src.line("const unsigned lane = threadIdx.x % 32u;");
        // Whole warps go round the loop together (the ballots need every lane).
        src.open(format!(
            "for (unsigned p0 = blockIdx.x * {SUM_BLOCK}u; p0 < {n}u; p0 += gridDim.x * {SUM_BLOCK}u) {{"
        ));
        src.line("const unsigned p = p0 + threadIdx.x;");
        src.line(format!("const unsigned id = p < {n}u ? keys[p] : {rows}u;"));
        src.line(format!(
            "const bool first = id < {rows}u && (p == 0u || keys[p - 1u] != id);"
        ));
        let long = match self.whole {
            Some(_) => format!("first && p + 31u < {n}u && keys[p + 31u] == id"),
            None => "first".to_string(),
        };
        src.line(format!("const bool is_long = {long};"));
        src.line("const bool is_short = first && !is_long;");
        for (list, flag, k) in [("short_runs", "is_short", 0), ("long_runs", "is_long", 1)] {
            src.line(format!(
                "const unsigned {list}_m = __ballot_sync(0xffffffffu, {flag});"
            ));
            src.open(format!("if ({list}_m != 0u) {{"));
            src.line(format!(
                "const unsigned leader = (unsigned)__ffs({list}_m) - 1u;"
            ));
            src.line(format!(
                "unsigned base = 0u; if (lane == leader) base = atomicAdd(counts + {k}, (unsigned)__popc({list}_m));"
            ));
            src.line("base = __shfl_sync(0xffffffffu, base, (int)leader);");
            src.line(format!(
                "if ({flag}) {list}[base + (unsigned)__popc({list}_m & ((1u << lane) - 1u))] = p;"
            ));
            src.close();
        }
        src.close();
        src.close();
        finish(src.text, launch)
    }

    /// The short runs' sums: a warp a run, over the whole row, every row's loads issued at once.
    /// Params: keys, pos, short runs, counts, values, out. `None` when rows are too long to sum
    /// whole.
    fn short_runs(&self) -> Option<CudaKernel> {
        let whole = self.whole?;
        let (ix, vt) = (self.ix, self.vt);
        let (n, row_len) = (self.n, self.row_len);
        let t = ix.ty();
        let launch = Launch {
            grid: [
                grid_for(n, SUM_BLOCK as usize / 32, MAX_GRID_ELEMENTWISE),
                1,
                1,
            ],
            block: [SUM_BLOCK, 1, 1],
            shared_bytes: 0,
        };
        let mut src = Src::default();
        self.sum_header(&mut src, "runs of under 32 positions, a warp a run", launch);
        src.open(signature(SUM_BLOCK, &self.sum_params("short_runs")));
        src.line("const unsigned lane = threadIdx.x % 32u;");
        src.line("const unsigned runs = counts[0];");
        src.open(format!(
            "for (unsigned r = (blockIdx.x * {SUM_BLOCK}u + threadIdx.x) / 32u; r < runs; r += gridDim.x * {}u) {{",
            SUM_BLOCK / 32
        ));
        src.line("const unsigned s = short_runs[r];");
        src.line("const unsigned id = keys[s];");
        src.line("const unsigned t = s + lane;");
        src.line(format!("const bool in = t < {n}u && keys[t] == id;"));
        src.line("const unsigned q = in ? pos[t] : 0u;");
        // The run's slots are consecutive: the lanes in it are a prefix.
        src.line("const int count = __popc(__ballot_sync(0xffffffffu, in));");
        self.zero_acc(&mut src, whole);
        src.open("for (int j = 0; j < count; ++j) {");
        src.line(format!(
            "const {vt}* v = values + ({t})__shfl_sync(0xffffffffu, q, j) * {};",
            ix.lit(row_len)
        ));
        src.line(format!("{vt} x[{whole}];"));
        src.line("#pragma unroll");
        src.open(format!("for (int k = 0; k < {whole}; ++k) {{"));
        src.line(format!("const {t} c = lane + ({t})k * 32u;"));
        src.line(format!("x[k] = c < {} ? v[c] : ({vt})0;", ix.lit(row_len)));
        src.close();
        src.line("#pragma unroll");
        src.line(format!(
            "for (int k = 0; k < {whole}; ++k) acc[k] += {};",
            self.term("x[k]")
        ));
        src.close();
        self.store(&mut src, whole, "0u");
        src.close();
        src.close();
        Some(finish(src.text, launch))
    }

    /// The long runs' sums: a warp a run and panel of `32 × K` columns, reading the run's
    /// positions 32 at a time and loading 8 rows before adding them (a frequent id waits on
    /// memory once a batch, not once a row). Params: keys, pos, long runs, counts, values, out.
    fn long_runs(&self) -> CudaKernel {
        let (ix, vt) = (self.ix, self.vt);
        let (n, row_len, per_lane, panels) = (self.n, self.row_len, self.per_lane, self.panels);
        let t = ix.ty();
        let panel = 32 * per_lane;
        let launch = Launch {
            grid: [
                grid_for(n * panels, SUM_BLOCK as usize / 32, MAX_GRID_ELEMENTWISE),
                1,
                1,
            ],
            block: [SUM_BLOCK, 1, 1],
            shared_bytes: 0,
        };
        let mut src = Src::default();
        let which = match self.whole {
            Some(_) => "runs of 32 positions or more",
            None => "every run",
        };
        let how = format!("{which}, a warp a run and panel of {panel} columns");
        self.sum_header(&mut src, &how, launch);
        src.open(signature(SUM_BLOCK, &self.sum_params("long_runs")));
        src.line("const unsigned lane = threadIdx.x % 32u;");
        src.line(format!(
            "const {t} items = ({t})counts[1] * {};",
            ix.lit(panels)
        ));
        src.open(format!(
            "for ({t} item = ({}) / 32u; item < items; item += {}) {{",
            ix.global_thread(SUM_BLOCK),
            ix.grid_stride(SUM_BLOCK / 32)
        ));
        src.line(format!(
            "const unsigned r = (unsigned)(item / {});",
            ix.lit(panels)
        ));
        src.line(format!(
            "const {t} c0 = (item - ({t})r * {}) * {};",
            ix.lit(panels),
            ix.lit(panel)
        ));
        src.line("const unsigned s = long_runs[r];");
        src.line("const unsigned id = keys[s];");
        self.zero_acc(&mut src, per_lane);
        src.open("for (unsigned t0 = s;; t0 += 32u) {");
        src.line("const unsigned t = t0 + lane;");
        src.line(format!("const bool in = t < {n}u && keys[t] == id;"));
        src.line("const unsigned q = in ? pos[t] : 0u;");
        src.line("const int count = __popc(__ballot_sync(0xffffffffu, in));");
        src.open(format!("for (int j0 = 0; j0 < count; j0 += {BATCH}) {{"));
        src.line(format!("{vt} x[{BATCH}][{per_lane}];"));
        src.line("#pragma unroll");
        src.open(format!("for (int b = 0; b < {BATCH}; ++b) {{"));
        src.line("const unsigned qb = __shfl_sync(0xffffffffu, q, (j0 + b) & 31);");
        src.line(format!(
            "const {vt}* v = values + ({t})qb * {};",
            ix.lit(row_len)
        ));
        src.line("#pragma unroll");
        src.open(format!("for (int k = 0; k < {per_lane}; ++k) {{"));
        src.line(format!("const {t} c = c0 + lane + ({t})k * 32u;"));
        src.line(format!(
            "x[b][k] = j0 + b < count && c < {} ? v[c] : ({vt})0;",
            ix.lit(row_len)
        ));
        src.close();
        src.close();
        src.line("#pragma unroll");
        src.open(format!("for (int b = 0; b < {BATCH}; ++b) {{"));
        src.line("if (j0 + b >= count) break;");
        src.line("#pragma unroll");
        src.line(format!(
            "for (int k = 0; k < {per_lane}; ++k) acc[k] += {};",
            self.term("x[b][k]")
        ));
        src.close();
        src.close();
        src.line("if (count < 32) break;");
        src.close();
        self.store(&mut src, per_lane, "c0");
        src.close();
        src.close();
        finish(src.text, launch)
    }

    fn sum_params(&self, list: &str) -> Vec<(String, String)> {
        vec![
            ("const unsigned*".to_string(), "keys".to_string()),
            ("const unsigned*".to_string(), "pos".to_string()),
            ("const unsigned*".to_string(), list.to_string()),
            ("const unsigned*".to_string(), "counts".to_string()),
            (format!("const {}*", self.vt), "values".to_string()),
            writes(self.out, "out"),
        ]
    }

    /// `acc[k]`, `k < lanes`, zeroed.
    fn zero_acc(&self, src: &mut Src, k: usize) {
        let at = self.at;
        src.line(format!("{at} acc[{k}];"));
        src.line("#pragma unroll");
        src.line(format!(
            "for (int k = 0; k < {k}; ++k) acc[k] = ({at}){};",
            literal(0.0, self.values)
        ));
    }

    /// A value of `values` widened to the sum's type.
    fn term(&self, x: &str) -> String {
        match self.values {
            DType::BF16 => format!("ig_widen({x})"),
            _ => format!("({}){x}", self.at),
        }
    }

    /// Stores `acc[k]` at column `c0 + lane + 32 k` of the id's row, each sum once.
    fn store(&self, src: &mut Src, k: usize, c0: &str) {
        let (ix, t) = (self.ix, self.ix.ty());
        let sum = match self.out {
            DType::BF16 => "ig_bf16_bits(acc[k])".to_string(),
            out => format!("({})acc[k]", c_type(out)),
        };
        src.line(format!(
            "const {t} row = ({t})id * {};",
            ix.lit(self.row_len)
        ));
        src.line("#pragma unroll");
        src.open(format!("for (int k = 0; k < {k}; ++k) {{"));
        src.line(format!("const {t} c = {c0} + lane + ({t})k * 32u;"));
        src.line(format!(
            "if (c < {}) out[row + c] = {sum};",
            ix.lit(self.row_len)
        ));
        src.close();
    }
}

/// Zeroes the two run counts. Params: counts.
fn zero_counts() -> CudaKernel {
    let launch = Launch {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
    };
    let mut src = Src::default();
    header(&mut src, "// ingot scatter_add runs: counts zeroed", launch);
    src.open(signature(
        32,
        &[("unsigned*".to_string(), "counts".to_string())],
    ));
    src.line("if (threadIdx.x < 2u) counts[threadIdx.x] = 0u;");
    src.close();
    finish(src.text, launch)
}
