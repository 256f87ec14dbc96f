//! CUDA C for a fused kernel (see the module docs of [`crate::cuda`] for the strategies and
//! [`crate::fused`] for what a kernel means).
//!
//! Generation runs in two steps: [`Analysis`] classifies the instructions (row-level or full,
//! live, reduction stage) and picks the strategy; the emitters then write one statement per
//! instruction, named `v{index}`, in body order within each place it is computed:
//! - row-level instructions of stage `s` once per row (in registers), after the reductions of
//!   stage `s` are complete (stage 0: before the first pass);
//! - in pass `p` (one per reduction stage), the full instructions that the stage-`p`
//!   reductions need, at every element of the row; then the reductions are combined across the
//!   threads that share the row, and every thread gets the result;
//! - in the final pass, the full instructions that the full outputs need, stored at each
//!   element by the thread that computed it (each thread reads and writes only its own
//!   elements there, after a barrier that ends every earlier pass over the row).

use super::guard::{self, Guard, Need};
use super::{
    c_type, finish, grid_for, list, literal, signature, CodegenError, CudaKernel, Ix, Launch, Src,
    Strategy, Tuning, BLOCK, MAX_GRID_ELEMENTWISE, MAX_GRID_ROWS,
};
use crate::fused::check::operands;
use crate::fused::{Access, FusedKernel, Inst};
use crate::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};

mod tiled;

/// Fewer rows than this use the row strategy even when the innermost axis is kept.
const FEW_ROWS: usize = 64;
/// Blocks that fill an H100 twice over (132 SMs): fewer than this, and the row and column
/// strategies use bigger blocks.
const FILL: usize = 2 * 132;
/// Static shared memory a block may declare.
const MAX_SHARED: usize = 48 * 1024;
/// The most terms a thread adds one after another into one float sum: a thread whose share of
/// a row is longer sums it in blocks of this many terms, adds each block's sum into a second
/// accumulator, and that one into the thread's total every this many blocks (a cascade, as the
/// CPU's; see [`crate::cpu::reduce`]), so that f32 sums stay accurate at any length. Threads
/// with at most this many terms (every reduction of the reference models) keep the plain loop.
pub(crate) const THREAD_BLOCK: usize = 1024;

pub(super) fn strategy(k: &FusedKernel) -> Result<Strategy, CodegenError> {
    k.check()?;
    Ok(Analysis::new(k).strategy)
}

pub(super) fn generate(k: &FusedKernel) -> Result<CudaKernel, CodegenError> {
    generate_tuned(k, Tuning::default())
}

/// [`generate`] with some of its choices overridden (see [`Tuning`]).
pub(super) fn generate_tuned(k: &FusedKernel, tuning: Tuning) -> Result<CudaKernel, CodegenError> {
    k.check()?;
    let mut a = Analysis::new(k);
    a.tuning = tuning;
    a.tuning.row_threads = tuning
        .row_threads
        .filter(|t| t.is_power_of_two() && *t <= 1024);
    let (text, launch) = match a.strategy {
        Strategy::Elementwise => a.elementwise()?,
        Strategy::Rows | Strategy::Columns => a.reduction()?,
    };
    Ok(finish(text, launch))
}

/// What the generator knows about a checked kernel.
struct Analysis<'a> {
    k: &'a FusedKernel,
    dt: Vec<DType>,
    /// Row-level instructions (all of them in the elementwise case, where every value is
    /// computed per element).
    row: Vec<bool>,
    live: Vec<bool>,
    /// 0 for loads, constants and indices; a reduction's is its operand's plus one; an op's the
    /// largest of its operands'.
    stage: Vec<usize>,
    numel: usize,
    rows: usize,
    /// Elements per row (the product of the reduce axes).
    n: usize,
    red_axis: Vec<bool>,
    /// Axes that a live index instruction reads: never merged with their neighbours.
    pinned: Vec<bool>,
    strategy: Strategy,
    ix: Ix,
    /// Choices forced from outside (none by default).
    tuning: Tuning,
}

impl<'a> Analysis<'a> {
    /// `k` must check.
    fn new(k: &'a FusedKernel) -> Analysis<'a> {
        let rank = k.domain.len();
        let dims = &k.domain;
        let mut red_axis = vec![false; rank];
        for &a in &k.reduce_axes {
            red_axis[a] = true;
        }
        let numel = dims.iter().fold(1usize, |n, &d| n.saturating_mul(d));
        let rows = (0..rank)
            .filter(|&d| !red_axis[d])
            .fold(1usize, |n, d| n.saturating_mul(dims[d]));
        let n = k
            .reduce_axes
            .iter()
            .fold(1usize, |n, &a| n.saturating_mul(dims[a]));
        // Every reduce axis of size 1: a reduction is a copy, the kernel elementwise.
        let elementwise = k.reduce_axes.is_empty() || n == 1;
        let dt = k.dtypes();
        let row = if elementwise {
            vec![true; k.body.len()]
        } else {
            k.row_levels()
        };
        let mut live = vec![false; k.body.len()];
        for o in &k.outputs {
            live[o.value] = true;
        }
        for i in (0..k.body.len()).rev() {
            if live[i] {
                let (ops, c) = operands(&k.body[i]);
                for &o in &ops[..c] {
                    live[o] = true;
                }
            }
        }
        let mut stage = vec![0usize; k.body.len()];
        for (i, inst) in k.body.iter().enumerate() {
            let (ops, c) = operands(inst);
            let s = ops[..c].iter().map(|&o| stage[o]).max().unwrap_or(0);
            stage[i] = match inst {
                Inst::Reduce { .. } if !elementwise => s + 1,
                _ => s,
            };
        }
        let mut pinned = vec![false; rank];
        for (i, inst) in k.body.iter().enumerate() {
            if let Inst::Index { axis, .. } = *inst {
                if live[i] {
                    pinned[axis] = true;
                }
            }
        }
        let strategy = if elementwise {
            Strategy::Elementwise
        } else {
            match (0..rank).rev().find(|&d| dims[d] > 1) {
                Some(d) if red_axis[d] => Strategy::Rows,
                _ if rows < FEW_ROWS => Strategy::Rows,
                _ => Strategy::Columns,
            }
        };
        let ix = Ix::for_extents(
            [numel, rows]
                .into_iter()
                .chain(k.inputs.iter().map(|x| x.len)),
        );
        Analysis {
            k,
            dt,
            row,
            live,
            stage,
            numel,
            rows,
            n,
            red_axis,
            pinned,
            strategy,
            ix,
            tuning: Tuning::default(),
        }
    }

    fn params(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        for (n, inp) in self.k.inputs.iter().enumerate() {
            p.push((format!("const {}*", c_type(inp.dtype)), format!("in{n}")));
        }
        for j in 0..self.k.outputs.len() {
            p.push((
                format!("{}*", c_type(self.k.output_dtype(j))),
                format!("out{j}"),
            ));
        }
        p
    }

    fn header(&self, src: &mut Src, what: &str, launch: &Launch) {
        src.line(format!(
            "// ingot fused kernel ({}): domain {}, reduce axes {}; {what}",
            self.strategy.name(),
            list(&self.k.domain),
            list(&self.k.reduce_axes),
        ));
        src.line(format!(
            "// launch: grid [{},{},{}], block [{},{},{}]",
            launch.grid[0],
            launch.grid[1],
            launch.grid[2],
            launch.block[0],
            launch.block[1],
            launch.block[2]
        ));
    }

    /// A kernel with nothing to compute (an empty domain, no rows, no outputs).
    fn empty(&self) -> (String, Launch) {
        let launch = Launch {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_bytes: 0,
        };
        let mut src = Src::default();
        self.header(&mut src, "nothing to compute", &launch);
        src.open(signature(32, &self.params()));
        src.line("// every output is empty");
        src.close();
        (src.text, launch)
    }

    /// Live loads: one stride vector per input they read (in input order).
    fn loaded_inputs(&self, pred: impl Fn(usize) -> bool) -> Vec<bool> {
        let mut used = vec![false; self.k.inputs.len()];
        for (i, inst) in self.k.body.iter().enumerate() {
            if let Inst::Load { input } = *inst {
                if self.live[i] && pred(i) {
                    used[input] = true;
                }
            }
        }
        used
    }

    fn has_full_outputs(&self) -> bool {
        self.k.outputs.iter().any(|o| !self.row[o.value])
    }

    // -----------------------------------------------------------------------------------------
    // Elementwise.

    fn elementwise(&self) -> Result<(String, Launch), CodegenError> {
        let k = self.k;
        if self.numel == 0 || k.outputs.is_empty() {
            return Ok(self.empty());
        }
        let ix = self.ix;
        let all: Vec<usize> = (0..k.domain.len()).collect();
        let used = self.loaded_inputs(|_| true);
        if let Some((a, d)) = self.transpose_axes(&used) {
            return self.elementwise_tiled(a, d, &used);
        }
        let contiguous = Access::contiguous(&k.domain).strides;
        let mut vectors = Vec::new();
        let mut vec_of = vec![usize::MAX; k.inputs.len()];
        for (n, inp) in k.inputs.iter().enumerate() {
            if used[n] {
                vec_of[n] = vectors.len();
                vectors.push(inp.access.strides.clone());
            }
        }
        let out_vec = vectors.len();
        vectors.push(contiguous);
        if let Some((l, vector)) = self
            .vec4_inputs(&used)
            .filter(|_| !self.tuning.scalar_elementwise)
        {
            return self.elementwise_vec4(l, &used, &vector);
        }
        let space = Space::new(&all, &k.domain, &vectors, &self.pinned);

        let launch = Launch {
            grid: [
                grid_for(self.numel, BLOCK as usize, MAX_GRID_ELEMENTWISE),
                1,
                1,
            ],
            block: [BLOCK, 1, 1],
            shared_bytes: 0,
        };
        let mut src = Src::default();
        self.header(&mut src, &format!("{} elements", self.numel), &launch);
        src.open(signature(BLOCK, &self.params()));
        src.open(format!(
            "for ({t} e = {start}; e < {numel}; e += {stride}) {{",
            t = ix.ty(),
            start = ix.global_thread(BLOCK),
            numel = ix.lit(self.numel),
            stride = ix.grid_stride(BLOCK),
        ));
        self.decompose_for_loads(&mut src, &space, &used, &vec_of);
        let addr: Vec<String> = (0..k.inputs.len())
            .map(|n| {
                if !used[n] {
                    return String::new();
                }
                let off = k.inputs[n].access.offset;
                join(
                    (off != 0).then(|| ix.lit(off)),
                    space.part(vec_of[n], "e", ix),
                    ix,
                )
            })
            .collect();
        let axis = |d: usize| space.axis_var(d, ix);
        let (per_element, insts, g) = self.elementwise_guards();
        for i in guard::order(&k.body, &per_element, &insts, &g) {
            let e = self.guarded(self.expr(i, &addr, &axis)?, i, g[i]);
            src.line(format!("const {} v{i} = {e};", c_type(self.dt[i])));
        }
        let out_addr = join(None, space.part(out_vec, "e", ix), ix);
        for (j, o) in k.outputs.iter().enumerate() {
            src.line(format!("out{j}[{out_addr}] = v{};", o.value));
        }
        src.close();
        src.close();
        Ok((src.text, launch))
    }

    /// Writes the indices of the linear index `e` that the used inputs' loads (`vec_of[n]`: input
    /// `n`'s stride vector in `space`) and the live index instructions read.
    fn decompose_for_loads(&self, src: &mut Src, space: &Space, used: &[bool], vec_of: &[usize]) {
        let mut need = vec![false; space.groups.len()];
        for (n, &u) in used.iter().enumerate() {
            if u {
                space.need(vec_of[n], &mut need);
            }
        }
        space.need_pinned(&self.pinned, &mut need);
        space.decompose(src, "e", self.ix, &need);
    }

    /// Whether the elementwise kernel goes four elements a thread through 4-element vector
    /// loads and stores: `Some((l, vector))`, `l` the innermost axis of size > 1, `vector[n]`
    /// whether input `n` is read four elements at a time (the others read one element for
    /// all four). The four elements `4e .. 4e + 3` of the linear index are consecutive along
    /// `l` when its size is a multiple of 4; then every output is a vector at `e`, and a load
    /// is one if it is contiguous along `l` (stride 1) and its element address at `4e` is a
    /// multiple of 4 (its offset and other strides are: buffers are 256-byte aligned, so the
    /// vector is aligned too), or one element if it is broadcast along `l` (stride 0). Vectors
    /// are of f32, i32 or bool (float4, int4, uchar4); a load of another type must be
    /// broadcast along `l`.
    fn vec4_inputs(&self, used: &[bool]) -> Option<(usize, Vec<bool>)> {
        let k = self.k;
        let dims = &k.domain;
        let l = (0..dims.len()).rev().find(|&d| dims[d] > 1)?;
        if !dims[l].is_multiple_of(4) || self.numel < VEC4_MIN_NUMEL {
            return None;
        }
        if !(0..k.outputs.len()).all(|j| vec4_type(k.output_dtype(j)).is_some()) {
            return None;
        }
        let mut vector = vec![false; k.inputs.len()];
        for (n, inp) in k.inputs.iter().enumerate() {
            if !used[n] {
                continue;
            }
            let a = &inp.access;
            match a.strides[l] {
                0 => {}
                1 if vec4_type(inp.dtype).is_some()
                    && a.offset % 4 == 0
                    && (0..dims.len()).all(|d| d == l || dims[d] == 1 || a.strides[d] % 4 == 0) =>
                {
                    vector[n] = true
                }
                _ => return None,
            }
        }
        Some((l, vector))
    }

    /// The elementwise kernel four elements a thread (see [`Analysis::vec4_inputs`]): a
    /// grid-stride loop over the domain with axis `l` counted in fours; each iteration reads a
    /// vector of every input read that way, computes the body once per element in its own
    /// scope, and writes a vector of each output. A thread reads and writes only its own four
    /// elements, reads first.
    fn elementwise_vec4(
        &self,
        l: usize,
        used: &[bool],
        vector: &[bool],
    ) -> Result<(String, Launch), CodegenError> {
        let k = self.k;
        let ix = self.ix;
        let quads = self.numel / 4;
        let all: Vec<usize> = (0..k.domain.len()).collect();
        // The domain in fours along l; strides in vectors (of the inputs read as vectors) or
        // in elements (the others).
        let mut dims = k.domain.clone();
        dims[l] /= 4;
        let mut vectors = Vec::new();
        let mut vec_of = vec![usize::MAX; k.inputs.len()];
        for (n, inp) in k.inputs.iter().enumerate() {
            if used[n] {
                vec_of[n] = vectors.len();
                let mut s = inp.access.strides.clone();
                if vector[n] {
                    for (d, x) in s.iter_mut().enumerate() {
                        *x = if d == l { 1 } else { *x / 4 };
                    }
                }
                vectors.push(s);
            }
        }
        let out_vec = vectors.len();
        vectors.push(Access::contiguous(&dims).strides);
        let space = Space::new(&all, &dims, &vectors, &self.pinned);
        let launch = Launch {
            grid: [grid_for(quads, BLOCK as usize, MAX_GRID_ELEMENTWISE), 1, 1],
            block: [BLOCK, 1, 1],
            shared_bytes: 0,
        };
        let mut src = Src::default();
        self.header(
            &mut src,
            &format!("{} elements, 4 a thread along axis {l}", self.numel),
            &launch,
        );
        src.open(signature(BLOCK, &self.params()));
        src.open(format!(
            "for ({t} e = {start}; e < {quads}; e += {stride}) {{",
            t = ix.ty(),
            start = ix.global_thread(BLOCK),
            quads = ix.lit(quads),
            stride = ix.grid_stride(BLOCK),
        ));
        self.decompose_for_loads(&mut src, &space, used, &vec_of);
        // Addresses: in vectors for the vector loads, in elements for the others.
        let addr: Vec<String> = (0..k.inputs.len())
            .map(|n| {
                if !used[n] {
                    return String::new();
                }
                let off = k.inputs[n].access.offset / if vector[n] { 4 } else { 1 };
                join(
                    (off != 0).then(|| ix.lit(off)),
                    space.part(vec_of[n], "e", ix),
                    ix,
                )
            })
            .collect();
        for (n, inp) in k.inputs.iter().enumerate() {
            if vector[n] {
                src.line(format!(
                    "const {v} l{n} = reinterpret_cast<const {v}*>(in{n})[{}];",
                    addr[n],
                    v = vec4_type(inp.dtype).unwrap_or("float4")
                ));
            }
        }
        for j in 0..k.outputs.len() {
            let v = vec4_type(k.output_dtype(j)).unwrap_or("float4");
            src.line(format!("{v} r{j};"));
        }
        for (q, lane) in ["x", "y", "z", "w"].into_iter().enumerate() {
            src.open("{");
            let axis = |d: usize| {
                let x = space.axis_var(d, ix);
                if d != l {
                    x
                } else if q == 0 {
                    format!("(4u * {x})")
                } else {
                    format!("(4u * {x} + {q}u)")
                }
            };
            for i in 0..k.body.len() {
                if !self.live[i] {
                    continue;
                }
                let ty = c_type(self.dt[i]);
                match k.body[i] {
                    Inst::Load { input } if vector[input] => {
                        src.line(format!("const {ty} v{i} = l{input}.{lane};"))
                    }
                    _ => {
                        let e = self.expr(i, &addr, &axis)?;
                        src.line(format!("const {ty} v{i} = {e};"));
                    }
                }
            }
            for (j, o) in k.outputs.iter().enumerate() {
                src.line(format!("r{j}.{lane} = v{};", o.value));
            }
            src.close();
        }
        let out_addr = join(None, space.part(out_vec, "e", ix), ix);
        for j in 0..k.outputs.len() {
            src.line(format!(
                "reinterpret_cast<{}*>(out{j})[{out_addr}] = r{j};",
                vec4_type(k.output_dtype(j)).unwrap_or("float4")
            ));
        }
        src.close();
        src.close();
        Ok((src.text, launch))
    }

    /// The axes `(a, d)` of a transposing elementwise kernel worth tiling: `d` is the
    /// innermost axis of size > 1 (along which outputs are contiguous), and some live load
    /// is contiguous along `a` instead (stride 1 there, another stride along `d`), so that no
    /// mapping of threads reads it and writes the outputs coalesced.
    fn transpose_axes(&self, used: &[bool]) -> Option<(usize, usize)> {
        let dims = &self.k.domain;
        let d = (0..dims.len()).rev().find(|&x| dims[x] > 1)?;
        if self.numel < TILE_MIN_NUMEL || dims[d] < TILE_MIN_DIM {
            return None;
        }
        self.k.inputs.iter().enumerate().find_map(|(n, inp)| {
            let s = &inp.access.strides;
            if !used[n] || s[d] <= 1 {
                return None;
            }
            (0..dims.len())
                .find(|&a| a != d && s[a] == 1 && dims[a] >= TILE_MIN_DIM)
                .map(|a| (a, d))
        })
    }

    // -----------------------------------------------------------------------------------------
    // Reductions: the row and column strategies.

    fn reduction(&self) -> Result<(String, Launch), CodegenError> {
        let k = self.k;
        let row_outputs = k.outputs.iter().any(|o| self.row[o.value]);
        if self.rows == 0 || k.outputs.is_empty() || (self.n == 0 && !row_outputs) {
            return Ok(self.empty());
        }
        let ix = self.ix;
        let rank = k.domain.len();
        let (n, rows) = (self.n, self.rows);
        let nb = body_len(k);

        let Passes {
            reds,
            passes,
            full_outputs,
            pass_full,
            final_full,
            emitted_full,
            needed,
            loop_uses,
        } = self.passes();

        // Launch shape, and whether the loads several loops read are kept in registers.
        let (lay, cache) = self.layout(reds.len(), &loop_uses);
        let (bx, by) = match lay {
            Layout::Columns { x, y } => (x, y),
            Layout::Group { w, g } => (w * g, 1),
            Layout::Block { t } => (t, 1),
        };
        let threads = bx * by;
        // Rows a block takes at a time.
        let per_block = match lay {
            Layout::Columns { x, .. } => x as usize,
            Layout::Group { g, .. } => g as usize,
            Layout::Block { .. } => 1,
        };
        let units = rows.div_ceil(per_block);
        let grid = grid_for(units, 1, MAX_GRID_ROWS);
        let launch = Launch {
            grid: [grid, 1, 1],
            block: [bx, by, 1],
            shared_bytes: 0,
        };
        let loops = units > grid as usize;
        let combine = n > 0 && passes > 0;
        let mut shared = 0usize;
        for &r in &reds {
            let per = match lay {
                Layout::Columns { x, y } => (x * y) as usize,
                Layout::Block { t } => (t / 32) as usize,
                Layout::Group { .. } => 0,
            };
            shared += per * self.dt[r].size();
        }
        if combine && shared > MAX_SHARED {
            return Err(CodegenError::SharedMemory {
                bytes: shared,
                reductions: reds.len(),
            });
        }

        // Index spaces: the row axes (indexed by `row`) and the reduce axes (by `j`).
        let row_axes: Vec<usize> = (0..rank).filter(|&d| !self.red_axis[d]).collect();
        let red_axes: Vec<usize> = k.reduce_axes.clone();
        let used = self.loaded_inputs(|i| needed[i] || emitted_full[i]);
        let full_used = self.loaded_inputs(|i| emitted_full[i]);
        let mut vectors = Vec::new();
        let mut vec_of = vec![usize::MAX; k.inputs.len()];
        for (m, inp) in k.inputs.iter().enumerate() {
            if used[m] {
                vec_of[m] = vectors.len();
                vectors.push(inp.access.strides.clone());
            }
        }
        let out_vec = vectors.len();
        vectors.push(Access::contiguous(&k.domain).strides);
        let row_space = Space::new(&row_axes, &k.domain, &vectors, &self.pinned);
        // Along the reduce axes only full loads and full outputs have nonzero strides; the
        // others are 0 there and merge with anything.
        let red_space = Space::new(&red_axes, &k.domain, &vectors, &self.pinned);

        let mut src = Src::default();
        let what = format!(
            "{rows} rows of {n} elements; {passes} reduction pass{}{}",
            if passes == 1 { "" } else { "es" },
            if full_outputs {
                ", then the outputs"
            } else {
                ""
            }
        );
        self.header(&mut src, &what, &launch);
        src.open(signature(threads, &self.params()));
        let t = ix.ty();
        if combine {
            for &r in &reds {
                let ty = c_type(self.dt[r]);
                match lay {
                    Layout::Columns { x, y } => {
                        src.line(format!("__shared__ {ty} sm{r}[{y}][{x}];"))
                    }
                    Layout::Block { t } => src.line(format!("__shared__ {ty} sm{r}[{}];", t / 32)),
                    Layout::Group { .. } => {}
                }
            }
            if let Layout::Block { .. } = lay {
                src.line("const unsigned lane = threadIdx.x & 31u;");
                src.line("const unsigned warp = threadIdx.x >> 5;");
            }
        }
        let row_line = self.row_loop(&mut src, lay, units);

        // Per row: the row indices, each input's row base, the row-level values of stage 0.
        let mut need = vec![false; row_space.groups.len()];
        for (m, &u) in used.iter().enumerate() {
            if u {
                row_space.need(vec_of[m], &mut need);
            }
        }
        if full_outputs {
            row_space.need(out_vec, &mut need);
        }
        for (inst, _) in k.body.iter().zip(&needed).filter(|(_, &n)| n) {
            if let Inst::Index { axis, .. } = *inst {
                row_space.need_axis(axis, &mut need);
            }
        }
        row_space.decompose(&mut src, "row", ix, &need);
        let mut base: Vec<Option<String>> = vec![None; k.inputs.len()];
        for (m, &u) in used.iter().enumerate() {
            if !u {
                continue;
            }
            let off = k.inputs[m].access.offset;
            base[m] = match row_space.part(vec_of[m], "row", ix) {
                Some(p) => {
                    let e = join((off != 0).then(|| ix.lit(off)), Some(p), ix);
                    src.line(format!("const {t} b{m} = {e};"));
                    Some(format!("b{m}"))
                }
                None => (off != 0).then(|| ix.lit(off)),
            };
        }
        let out_base = if full_outputs {
            row_space.part(out_vec, "row", ix).map(|p| {
                src.line(format!("const {t} bo = {p};"));
                "bo".to_string()
            })
        } else {
            None
        };
        // Row-level values read loads at their row base only.
        let row_addr: Vec<String> = (0..k.inputs.len())
            .map(|m| join(base[m].clone(), None, ix))
            .collect();
        let full_addr: Vec<String> = (0..k.inputs.len())
            .map(|m| {
                if full_used[m] {
                    join(base[m].clone(), red_space.part(vec_of[m], "j", ix), ix)
                } else {
                    row_addr[m].clone()
                }
            })
            .collect();
        let row_axis = |d: usize| row_space.axis_var(d, ix);
        let any_axis = |d: usize| {
            if self.red_axis[d] {
                red_space.axis_var(d, ix)
            } else {
                row_space.axis_var(d, ix)
            }
        };
        let (start, step) = match lay {
            Layout::Columns { y, .. } => ("threadIdx.y", y),
            Layout::Group { w, .. } => ("lane", w),
            Layout::Block { t } => ("threadIdx.x", t),
        };
        let loop_head = format!(
            "for ({t} j = {start}; j < {n}; j += {step}) {{",
            n = ix.lit(n),
            step = ix.lit(step as usize)
        );
        // Loads that several loops over the row read are kept in registers (see `layout`): the
        // first loop that reads one stores it in `c{i}[u]`, later loops read it there. The loops
        // are then unrolled, `u` counting the thread's elements, so that every index into
        // `c{i}` is a compile-time constant and the arrays live in registers.
        let per_thread = n.div_ceil(step as usize);
        let cached: Vec<usize> = if cache {
            (0..nb).filter(|&i| loop_uses[i] >= 2).collect()
        } else {
            Vec::new()
        };
        let mut is_cached = vec![false; nb];
        for &i in &cached {
            is_cached[i] = true;
        }
        // Guarded loads, per loop (passes first, then the outputs): where each full value is
        // needed. A cached load is read once for all the loops, so its guard covers them all.
        let mut loop_sets: Vec<(&[usize], Vec<usize>)> = (1..=passes)
            .map(|p| {
                let roots = reds
                    .iter()
                    .filter(|&&r| self.stage[r] == p)
                    .filter_map(|&r| match k.body[r] {
                        Inst::Reduce { x, .. } => Some(x),
                        _ => None,
                    })
                    .collect();
                (&pass_full[p - 1][..], roots)
            })
            .collect();
        if full_outputs {
            let roots = k.outputs.iter().map(|o| o.value).collect();
            loop_sets.push((&final_full[..], roots));
        }
        let mut needs: Vec<Vec<Need>> = loop_sets
            .iter()
            .map(|(insts, roots)| guard::demand(&k.body, &self.row, insts, roots))
            .collect();
        for &i in &cached {
            let all = needs.iter().fold(Need::Never, |a, nd| a.join(nd[i]));
            for nd in &mut needs {
                if nd[i] != Need::Never {
                    nd[i] = all;
                }
            }
        }
        let guards: Vec<Vec<Option<Guard>>> = loop_sets
            .iter()
            .zip(&needs)
            .map(|((insts, _), nd)| {
                if self.tuning.unguarded_loads {
                    vec![None; nb]
                } else {
                    guard::guards(&k.body, &self.row, insts, nd)
                }
            })
            .collect();
        let mut loaded = vec![false; nb];
        let ragged = cache && n % step as usize != 0;
        // The loop over the thread's elements of the row around `body` (written one level
        // deeper, two with the check for a ragged row).
        let body_depth = |src: &Src| src.depth + 1 + usize::from(ragged);
        let emit_loop = |src: &mut Src, body: &str| {
            if cache {
                src.line("#pragma unroll");
                src.open(format!("for (unsigned u = 0u; u < {per_thread}u; ++u) {{"));
                if ragged || mentions(body, "j") {
                    src.line(format!(
                        "const {t} j = {start} + u * {};",
                        ix.lit(step as usize)
                    ));
                }
                if ragged {
                    src.open(format!("if (j < {}) {{", ix.lit(n)));
                }
            } else {
                src.open(&loop_head);
            }
            src.text.push_str(body);
            if ragged {
                src.close();
            }
            src.close();
        };
        if cache {
            for &i in &cached {
                src.line(format!(
                    "{} c{i}[{per_thread}]; // %{i}, kept for the later passes",
                    c_type(self.dt[i])
                ));
            }
        }
        // The reduce indices the instructions of a loop need.
        let loop_need = |insts: &[usize], outputs: bool, loaded: &[bool]| {
            let mut need = vec![false; red_space.groups.len()];
            for &i in insts {
                match self.k.body[i] {
                    // A cached load read in an earlier loop needs no index.
                    Inst::Load { .. } if is_cached[i] && loaded[i] => {}
                    Inst::Load { input } if full_used[input] => {
                        red_space.need(vec_of[input], &mut need)
                    }
                    Inst::Index { axis, .. } if self.red_axis[axis] => {
                        red_space.need_axis(axis, &mut need)
                    }
                    _ => {}
                }
            }
            if outputs {
                red_space.need(out_vec, &mut need);
            }
            need
        };

        for s in 0..=passes {
            if s > 0 {
                let p = s;
                let these: Vec<usize> = reds
                    .iter()
                    .copied()
                    .filter(|&r| self.stage[r] == p)
                    .collect();
                let names: Vec<String> = these.iter().map(|r| format!("%{r}")).collect();
                src.line(format!("// pass {p}: {}", names.join(", ")));
                if n == 0 {
                    for &r in these.iter().filter(|&&r| needed[r]) {
                        let (op, ty) = (reduce_op(&k.body[r]), self.dt[r]);
                        src.line(format!("const {} v{r} = {};", c_type(ty), identity(op, ty)));
                    }
                } else {
                    for &r in &these {
                        let (op, ty) = (reduce_op(&k.body[r]), self.dt[r]);
                        src.line(format!("{} a{r} = {};", c_type(ty), identity(op, ty)));
                    }
                    // Float sums over more than THREAD_BLOCK terms a thread are blocked.
                    let blocked_sums: Vec<usize> = these
                        .iter()
                        .copied()
                        .filter(|&r| {
                            reduce_op(&k.body[r]) == ReduceOp::Sum && self.dt[r].is_float()
                        })
                        .collect();
                    let blocked = !cache
                        && !blocked_sums.is_empty()
                        && n.div_ceil(step as usize) > THREAD_BLOCK;
                    let mut b = Src {
                        text: String::new(),
                        depth: body_depth(&src) + usize::from(blocked),
                    };
                    let insts = &pass_full[p - 1];
                    red_space.decompose(&mut b, "j", ix, &loop_need(insts, false, &loaded));
                    let g = &guards[p - 1];
                    for i in guard::order(&k.body, &self.row, insts, g) {
                        let at = (&full_addr[..], &any_axis as &dyn Fn(usize) -> String);
                        self.emit_full(&mut b, i, at, g[i], &is_cached, &mut loaded)?;
                    }
                    for &r in &these {
                        let Inst::Reduce { x, .. } = k.body[r] else {
                            continue;
                        };
                        let acc = if blocked && blocked_sums.contains(&r) {
                            format!("s{r}")
                        } else {
                            format!("a{r}")
                        };
                        b.line(format!(
                            "{acc} = {};",
                            accumulate(reduce_op(&k.body[r]), self.dt[r], &acc, &format!("v{x}"))
                        ));
                    }
                    if blocked {
                        self.emit_blocked_loop(&mut src, &blocked_sums, n, start, step, &b.text);
                    } else {
                        emit_loop(&mut src, &b.text);
                    }
                    self.fold(&mut src, lay, &these);
                    for &r in &these {
                        src.line(format!("const {} v{r} = a{r};", c_type(self.dt[r])));
                    }
                }
            }
            // Row-level values of this stage.
            for (i, inst) in k.body.iter().enumerate() {
                if needed[i] && self.stage[i] == s && !matches!(inst, Inst::Reduce { .. }) {
                    let e = self.expr(i, &row_addr, &row_axis)?;
                    src.line(format!("const {} v{i} = {e};", c_type(self.dt[i])));
                }
            }
        }

        if full_outputs {
            if let (Layout::Group { .. }, true) = (lay, combine) {
                // The shuffles ended the passes; this orders their reads before the writes.
                src.line("__syncwarp();");
            }
            src.line("// the full outputs");
            let mut b = Src {
                text: String::new(),
                depth: body_depth(&src),
            };
            red_space.decompose(&mut b, "j", ix, &loop_need(&final_full, true, &loaded));
            let g = &guards[passes];
            for i in guard::order(&k.body, &self.row, &final_full, g) {
                let at = (&full_addr[..], &any_axis as &dyn Fn(usize) -> String);
                self.emit_full(&mut b, i, at, g[i], &is_cached, &mut loaded)?;
            }
            let out_addr = join(out_base.clone(), red_space.part(out_vec, "j", ix), ix);
            for (j, o) in k.outputs.iter().enumerate() {
                if !self.row[o.value] {
                    if !matches!(lay, Layout::Block { .. }) {
                        b.line(format!("if (ok) {{ out{j}[{out_addr}] = v{}; }}", o.value));
                    } else {
                        b.line(format!("out{j}[{out_addr}] = v{};", o.value));
                    }
                }
            }
            emit_loop(&mut src, &b.text);
        }
        self.store_rows(&mut src, lay);
        if combine && loops && !matches!(lay, Layout::Group { .. }) {
            src.line("__syncthreads(); // the next row reuses the shared memory");
        }
        src.close();
        src.close();
        Ok((text_without_unread_row(src.text, row_line), launch))
    }

    /// The loop-nest stage of a reduction: opens the grid-stride loop over rows (blocks: one
    /// row a block) or over units of rows (columns and groups: several rows a block, each
    /// thread's row clamped to the last so that every thread reaches the block's barriers;
    /// `ok` says whether it is real). Returns where the line defining `row` from the clamped
    /// slot starts, so the text stage can drop it when nothing reads `row`.
    fn row_loop(&self, src: &mut Src, lay: Layout, units: usize) -> Option<usize> {
        let (ix, rows) = (self.ix, self.rows);
        let t = ix.ty();
        let mut row_line = None;
        match lay {
            Layout::Block { .. } => {
                src.open(format!(
                    "for ({t} row = blockIdx.x; row < {rows}; row += gridDim.x) {{",
                    rows = ix.lit(rows)
                ));
            }
            Layout::Columns { x, .. } | Layout::Group { g: x, .. } => {
                if let Layout::Group { w, .. } = lay {
                    src.line(format!("const unsigned lane = threadIdx.x & {}u;", w - 1));
                }
                src.open(format!(
                    "for ({t} rb = blockIdx.x; rb < {units}; rb += gridDim.x) {{",
                    units = ix.lit(units)
                ));
                let slot = match lay {
                    Layout::Group { w, .. } => format!("threadIdx.x / {w}u"),
                    _ => "threadIdx.x".to_string(),
                };
                src.line(format!(
                    "const {t} rr = rb * {} + {slot};",
                    ix.lit(x as usize)
                ));
                src.line(format!("const bool ok = rr < {};", ix.lit(rows)));
                row_line = Some(src.text.len());
                src.line(format!("const {t} row = ok ? rr : {};", ix.lit(rows - 1)));
            }
        }
        row_line
    }

    /// The strategy stage of a reduction: which instructions each pass over the row and the
    /// final output loop compute, and which row-level values are read. Reductions whose operand
    /// needs an earlier reduction's result run in a later pass, so a softmax takes two passes
    /// (max, then the sum of exponentials) plus the output loop.
    fn passes(&self) -> Passes {
        let k = self.k;
        let n = self.n;
        let nb = body_len(k);
        let reds: Vec<usize> = (0..nb)
            .filter(|&i| self.live[i] && matches!(k.body[i], Inst::Reduce { .. }))
            .collect();
        let passes = reds.iter().map(|&r| self.stage[r]).max().unwrap_or(0);
        let full_outputs = self.has_full_outputs() && n > 0;
        // Full instructions each pass needs (pass p at index p - 1; the final pass last).
        let mut pass_full: Vec<Vec<usize>> = Vec::new();
        for p in 1..=passes {
            let roots: Vec<usize> = reds
                .iter()
                .filter(|&&r| self.stage[r] == p)
                .map(|&r| match k.body[r] {
                    Inst::Reduce { x, .. } => x,
                    _ => r,
                })
                .collect();
            pass_full.push(self.full_closure(&roots));
        }
        let final_full = if full_outputs {
            let roots: Vec<usize> = k
                .outputs
                .iter()
                .map(|o| o.value)
                .filter(|&v| !self.row[v])
                .collect();
            self.full_closure(&roots)
        } else {
            Vec::new()
        };

        // The row-level values something reads: the row-level outputs, the operands of the full
        // instructions the loops compute and of the reductions; with empty rows, a reduction is
        // its identity and reads nothing.
        let mut emitted_full = vec![false; nb];
        if n > 0 {
            for &i in pass_full.iter().flatten().chain(&final_full) {
                emitted_full[i] = true;
            }
        }
        let mut needed = vec![false; nb];
        for o in &k.outputs {
            if self.row[o.value] {
                needed[o.value] = true;
            }
        }
        for i in (0..nb).rev() {
            let reads = emitted_full[i]
                || (needed[i] && !(n == 0 && matches!(k.body[i], Inst::Reduce { .. })));
            if reads || (n > 0 && reds.contains(&i)) {
                let (ops, c) = operands(&k.body[i]);
                for &o in &ops[..c] {
                    if self.row[o] {
                        needed[o] = true;
                    }
                }
            }
        }

        // Loads the loops over the row read, and how many of the loops read each.
        let mut loop_uses = vec![0usize; nb];
        if n > 0 {
            for &i in pass_full.iter().flatten().chain(&final_full) {
                if matches!(k.body[i], Inst::Load { .. }) {
                    loop_uses[i] += 1;
                }
            }
        }
        Passes {
            reds,
            passes,
            full_outputs,
            pass_full,
            final_full,
            emitted_full,
            needed,
            loop_uses,
        }
    }

    /// The fold stage of a reduction pass: combines the partials `a{r}` of the threads that
    /// share a row into every thread's `a{r}`, through shared memory across `threadIdx.y`
    /// (columns), through shuffles within a group of lanes (groups), or through shuffles then
    /// shared memory across warps (blocks). Each thread sums its own elements first (in the
    /// loop) so that only one partial a thread crosses threads.
    fn fold(&self, src: &mut Src, lay: Layout, these: &[usize]) {
        let k = self.k;
        match lay {
            Layout::Columns { y, .. } => {
                for &r in these {
                    src.line(format!("sm{r}[threadIdx.y][threadIdx.x] = a{r};"));
                }
                src.line("__syncthreads();");
                for &r in these {
                    let op = reduce_op(&k.body[r]);
                    src.line(format!("a{r} = sm{r}[0][threadIdx.x];"));
                    src.line(format!(
                        "for (unsigned y = 1u; y < {y}u; ++y) {{ a{r} = {}; }}",
                        accumulate(
                            op,
                            self.dt[r],
                            &format!("a{r}"),
                            &format!("sm{r}[y][threadIdx.x]")
                        )
                    ));
                }
            }
            Layout::Group { w, .. } => {
                for &r in these {
                    src.line(format!(
                        "a{r} = {}(a{r}, {w});",
                        lanes_fn(reduce_op(&k.body[r]))
                    ));
                }
            }
            Layout::Block { t } => {
                for &r in these {
                    src.line(format!(
                        "a{r} = {}(a{r}, 32);",
                        lanes_fn(reduce_op(&k.body[r]))
                    ));
                }
                let writes: Vec<String> = these
                    .iter()
                    .map(|r| format!("sm{r}[warp] = a{r};"))
                    .collect();
                src.line(format!("if (lane == 0u) {{ {} }}", writes.join(" ")));
                src.line("__syncthreads();");
                let warps = t / 32;
                for &r in these {
                    let op = reduce_op(&k.body[r]);
                    src.line(format!("a{r} = sm{r}[0];"));
                    if warps > 1 {
                        src.line(format!(
                            "for (unsigned w = 1u; w < {warps}u; ++w) {{ a{r} = {}; }}",
                            accumulate(op, self.dt[r], &format!("a{r}"), &format!("sm{r}[w]"))
                        ));
                    }
                }
            }
        }
    }

    /// The store stage of the row-level outputs: one thread of each row writes them at `row`
    /// (the row's first thread; with several rows a block, only rows that exist: `ok`).
    fn store_rows(&self, src: &mut Src, lay: Layout) {
        let k = self.k;
        let row_stores: Vec<String> = k
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| self.row[o.value])
            .map(|(j, o)| format!("out{j}[row] = v{};", o.value))
            .collect();
        if !row_stores.is_empty() {
            let cond = match lay {
                Layout::Columns { .. } => "ok && threadIdx.y == 0u",
                Layout::Group { .. } => "ok && lane == 0u",
                Layout::Block { .. } => "threadIdx.x == 0u",
            };
            src.line(format!("if ({cond}) {{ {} }}", row_stores.join(" ")));
        }
    }

    /// The loop over a thread's elements of the row with its float sums `sums` blocked (see
    /// [`THREAD_BLOCK`]): `body` adds each term into `s{r}`, the block's sum, which goes into
    /// `m{r}` at the end of the block; every THREAD_BLOCK blocks `m{r}` goes into `a{r}`.
    fn emit_blocked_loop(
        &self,
        src: &mut Src,
        sums: &[usize],
        n: usize,
        start: &str,
        step: u32,
        body: &str,
    ) {
        let (ix, t) = (self.ix, self.ix.ty());
        let span = (step as usize).saturating_mul(THREAD_BLOCK);
        src.line(format!(
            "// float sums in blocks of {THREAD_BLOCK} terms a thread, cascaded (accurate at any length)"
        ));
        for &r in sums {
            let ty = self.dt[r];
            src.line(format!("{} m{r} = {};", c_type(ty), literal(0.0, ty)));
        }
        src.line("unsigned nb = 0u;");
        src.open(format!(
            "for ({t} jb = {start}; jb < {n}; jb += {span}) {{",
            n = ix.lit(n),
            span = ix.lit(span)
        ));
        src.line(format!(
            "const {t} je = {n} - jb > {span} ? jb + {span} : {n};",
            n = ix.lit(n),
            span = ix.lit(span)
        ));
        for &r in sums {
            let ty = self.dt[r];
            src.line(format!("{} s{r} = {};", c_type(ty), literal(0.0, ty)));
        }
        src.open(format!(
            "for ({t} j = jb; j < je; j += {}) {{",
            ix.lit(step as usize)
        ));
        src.text.push_str(body);
        src.close();
        let flush: Vec<String> = sums
            .iter()
            .map(|r| format!("m{r} = m{r} + s{r};"))
            .collect();
        src.line(flush.join(" "));
        let up: Vec<String> = sums
            .iter()
            .map(|&r| format!("a{r} = a{r} + m{r}; m{r} = {};", literal(0.0, self.dt[r])))
            .collect();
        src.line(format!(
            "if (++nb == {THREAD_BLOCK}u) {{ {} nb = 0u; }}",
            up.join(" ")
        ));
        src.close();
        let last: Vec<String> = sums
            .iter()
            .map(|r| format!("a{r} = a{r} + m{r};"))
            .collect();
        src.line(last.join(" "));
    }

    /// Writes full instruction `i` inside a loop over the row (`at`: the input addresses and
    /// the axis indices there): a cached load is read from memory (and kept) the first time,
    /// from its registers after that; a guarded load only where its guard holds.
    fn emit_full(
        &self,
        src: &mut Src,
        i: usize,
        at: (&[String], &dyn Fn(usize) -> String),
        guard: Option<Guard>,
        cached: &[bool],
        loaded: &mut [bool],
    ) -> Result<(), CodegenError> {
        let ty = c_type(self.dt[i]);
        if cached[i] && loaded[i] {
            src.line(format!("const {ty} v{i} = c{i}[u];"));
            return Ok(());
        }
        let e = self.guarded(self.expr(i, at.0, at.1)?, i, guard);
        src.line(format!("const {ty} v{i} = {e};"));
        if cached[i] {
            src.line(format!("c{i}[u] = v{i};"));
            loaded[i] = true;
        }
        Ok(())
    }

    /// The literals of `guard` whose conditions are computed from indices and constants alone,
    /// with the instructions that compute them (body order); `None` if no literal is.
    fn index_only_guard(&self, guard: Guard) -> Option<(Guard, Vec<usize>)> {
        let body = &self.k.body;
        let closure_of = |c: usize| -> Option<Vec<usize>> {
            let mut seen = vec![false; body.len()];
            let mut stack = vec![c];
            while let Some(i) = stack.pop() {
                if std::mem::replace(&mut seen[i], true) {
                    continue;
                }
                if matches!(body[i], Inst::Load { .. } | Inst::Reduce { .. }) {
                    return None;
                }
                let (ops, n) = operands(&body[i]);
                stack.extend_from_slice(&ops[..n]);
            }
            Some((0..body.len()).filter(|&i| seen[i]).collect())
        };
        let mut closure = Vec::new();
        let conj = guard.retain(|c| match closure_of(c) {
            Some(cl) => {
                closure.extend(cl);
                true
            }
            None => false,
        })?;
        closure.sort_unstable();
        closure.dedup();
        Some((conj, closure))
    }

    /// The guards of a loop that computes every value per element (the elementwise kernels):
    /// no value is row-level, the loop holds the live instructions, the outputs are its roots.
    /// Returns the row-level flags, the loop's instructions and each load's guard.
    fn elementwise_guards(&self) -> (Vec<bool>, Vec<usize>, Vec<Option<Guard>>) {
        let k = self.k;
        let per_element = vec![false; k.body.len()];
        let insts: Vec<usize> = (0..k.body.len()).filter(|&i| self.live[i]).collect();
        let roots: Vec<usize> = k.outputs.iter().map(|o| o.value).collect();
        let g = if self.tuning.unguarded_loads {
            vec![None; k.body.len()]
        } else {
            let need = guard::demand(&k.body, &per_element, &insts, &roots);
            guard::guards(&k.body, &per_element, &insts, &need)
        };
        (per_element, insts, g)
    }

    /// The first live load instruction of input `n` (its dtype is the input's).
    fn input_load(&self, n: usize) -> usize {
        (0..self.k.body.len())
            .find(|&i| self.live[i] && matches!(self.k.body[i], Inst::Load { input } if input == n))
            .expect("a staged input has a live load")
    }

    /// Expression `e` of instruction `i`, read only where `guard` holds (0 elsewhere).
    fn guarded(&self, e: String, i: usize, guard: Option<Guard>) -> String {
        match guard {
            None => e,
            Some(g) => {
                let zero = literal(0.0, self.dt[i]);
                match g.literals() {
                    [(c, true)] => format!("v{c} ? {e} : {zero}"),
                    [(c, false)] => format!("v{c} ? {zero} : {e}"),
                    lits => {
                        let cond: Vec<String> = lits
                            .iter()
                            .map(|&(c, w)| if w { format!("v{c}") } else { format!("!v{c}") })
                            .collect();
                        format!("({}) ? {e} : {zero}", cond.join(" && "))
                    }
                }
            }
        }
    }

    /// The full instructions `roots` need (themselves included where full), in body order.
    fn full_closure(&self, roots: &[usize]) -> Vec<usize> {
        let nb = body_len(self.k);
        let mut mark = vec![false; nb];
        for &r in roots {
            if !self.row[r] {
                mark[r] = true;
            }
        }
        for i in (0..nb).rev() {
            if mark[i] {
                let (ops, c) = operands(&self.k.body[i]);
                for &o in &ops[..c] {
                    if !self.row[o] {
                        mark[o] = true;
                    }
                }
            }
        }
        (0..nb).filter(|&i| mark[i]).collect()
    }

    /// The launch layout of a reduction kernel, and whether the loops over the row keep the
    /// loads that several of them read in registers (`loop_uses[i]`: how many loops read
    /// load `i`).
    ///
    /// The row strategy's default layout (a group of up to 32 lanes per short row, a block per
    /// long row, see [`row_threads`]) is kept when caching is not wanted (no load is read by
    /// several loops) or fits it: the cached loads within [`CACHE_WORDS`] registers a thread,
    /// and at most [`CACHE_SPLIT_MAX`] elements a thread, or [`CACHE_PER_THREAD`] when every
    /// load the loops read is cached (a short softmax). Otherwise the row gets more threads:
    /// with plenty of rows ([`ROW_THREADS_PLENTY`] threads in all), the fewest whose cached
    /// values take at most half of [`CACHE_WORDS`]; otherwise
    /// the fewest (a power of two, up to 1024) that leave each thread at most
    /// [`CACHE_SPLIT_PER_THREAD`] elements (at most [`CACHE_SPLIT_MAX`] with 1024), the cached
    /// loads within [`CACHE_WORDS`]; the loads read by one loop only are then read from memory
    /// in the unrolled loops, a few at a time. Rows too long for that (more than 8192
    /// elements, or fewer with many loads) read memory in every loop.
    ///
    /// Measured on an H200 (GPT-2's rows of 768 and 1024): GPT-2's attention backward (two
    /// cached loads, rows of 1024) takes 838 µs with 32 lanes and nothing cached, 1150 µs with
    /// 64 threads (16 elements each: 114 registers), 748 with 128, 662 with 256, 930 with 512;
    /// LayerNorms over 768 are 30-45% faster with 128 or 256 threads (equal) than with 32
    /// lanes, 10-25% slower with 512.
    fn layout(&self, reductions: usize, loop_uses: &[usize]) -> (Layout, bool) {
        let n = self.n;
        if self.strategy == Strategy::Columns {
            let (x, y) = self.column_block(reductions);
            return (Layout::Columns { x, y }, false);
        }
        let with = |t: u32| {
            if t <= 32 {
                // A group of lanes of one warp per row, several rows a block.
                let w = t.min(n.next_power_of_two().clamp(1, 32) as u32);
                Layout::Group { w, g: 256 / w }
            } else {
                Layout::Block { t }
            }
        };
        let default = match self.tuning.row_threads {
            Some(t) => with(t),
            None if n <= GROUP_MAX_N => with(32),
            None => Layout::Block {
                t: row_threads(n, self.rows),
            },
        };
        let steps = |lay: Layout| match lay {
            Layout::Group { w, .. } => w as usize,
            Layout::Block { t } => t as usize,
            Layout::Columns { y, .. } => y as usize,
        };
        let in_loops = loop_uses.iter().filter(|&&u| u > 0).count();
        let multi: Vec<usize> = (0..loop_uses.len())
            .filter(|&i| loop_uses[i] >= 2)
            .collect();
        if multi.is_empty() {
            return (default, false);
        }
        let all = multi.len() == in_loops;
        let words: usize = multi.iter().map(|&i| self.dt[i].size().div_ceil(4)).sum();
        let fits = |t: usize| {
            let per = n.div_ceil(t);
            per * words <= CACHE_WORDS && (per <= CACHE_SPLIT_MAX || all && per <= CACHE_PER_THREAD)
        };
        let t0 = steps(default);
        if self.tuning.row_threads.is_some() {
            return (default, fits(t0));
        }
        // Cached as it is, with few elements a thread: keep it. With many (a row of 1024 in one
        // warp holds 32 a lane), more threads per row measured faster (gpt2's attention
        // softmax: 309 µs in one warp, about 220 with 64 or more threads, on an H200).
        if fits(t0) && n.div_ceil(t0) <= CACHE_SPLIT_MAX {
            return (default, true);
        }
        // Where rows are plenty, the fewest threads whose values take at most half the
        // registers: the GPU is full anyway, and fewer threads a row combine faster. On an H200,
        // gpt2's attention softmax (98304 rows of 1024, one cached load) takes 227 µs with 64
        // threads, 276 with 256; its backward (two loads) 282 with 128 and 280 with 256.
        let mut t = t0 * 2;
        while t <= 1024 {
            let per = n.div_ceil(t);
            // Loads read by one loop only are read in the unrolled loops: as many in flight.
            let in_flight = all || per <= CACHE_SPLIT_MAX;
            if per * words <= CACHE_WORDS / 2
                && in_flight
                && self.rows.saturating_mul(t) >= ROW_THREADS_PLENTY
            {
                return (with(t as u32), true);
            }
            t *= 2;
        }
        let mut t = t0 * 2;
        while t <= 1024 {
            let per = n.div_ceil(t);
            let most = if t == 1024 {
                CACHE_SPLIT_MAX
            } else {
                CACHE_SPLIT_PER_THREAD
            };
            if per <= most && per * words <= CACHE_WORDS {
                return (with(t as u32), true);
            }
            t *= 2;
        }
        (default, false)
    }

    /// Block shape `(X, Y)` of the column strategy: X rows side by side (32, or down to 8 when
    /// that leaves fewer than [`COLUMN_BLOCKS`] blocks; 8 four-byte values still fill a 32-byte
    /// sector), Y threads along each row (256 threads a block, 1024 when blocks are few).
    fn column_block(&self, reductions: usize) -> (u32, u32) {
        let mut x = 32usize;
        while x > 8 && self.rows.div_ceil(x) < COLUMN_BLOCKS {
            x /= 2;
        }
        if let Some(forced) = self.tuning.column_rows {
            if forced.is_power_of_two() && forced <= 32 {
                x = forced as usize;
            }
        }
        let threads = if self.rows.div_ceil(x) < FILL {
            1024
        } else {
            256
        };
        let mut y = (threads / x).min(self.n.next_power_of_two()).max(2);
        let widest = (0..self.k.body.len())
            .filter(|&i| self.live[i] && matches!(self.k.body[i], Inst::Reduce { .. }))
            .map(|i| self.dt[i].size())
            .max()
            .unwrap_or(4);
        while y > 2 && reductions * x * y * widest > MAX_SHARED {
            y /= 2;
        }
        (x as u32, y as u32)
    }

    // -----------------------------------------------------------------------------------------
    // Expressions.

    /// The right-hand side of instruction `i`: `addr[n]` is the element index input `n` is read
    /// at, `axis(d)` the domain index along axis `d`.
    fn expr(
        &self,
        i: usize,
        addr: &[String],
        axis: &dyn Fn(usize) -> String,
    ) -> Result<String, CodegenError> {
        let v = |j: usize| format!("v{j}");
        let dt = self.dt[i];
        let unsupported = |op: &'static str, dtype: DType| CodegenError::Unsupported {
            op,
            what: "an operand",
            dtype,
        };
        Ok(match self.k.body[i] {
            Inst::Load { input } => format!("in{input}[{}]", addr[input]),
            Inst::Const { value, dtype } => literal(value, dtype),
            Inst::Index { axis: d, dtype } => {
                let x = axis(d);
                match dtype {
                    DType::F32 => format!("(float){x}"),
                    DType::F64 => format!("(double){x}"),
                    DType::I32 => format!("(int){x}"),
                    DType::I64 => format!("(long long){x}"),
                    DType::Bool => format!("(unsigned char)({x} != 0)"),
                    DType::BF16 => return Err(unsupported("index", dtype)),
                }
            }
            Inst::Unary { op, x } => {
                let (x, d) = (v(x), dt);
                match (op, d) {
                    (UnaryOp::Neg, DType::F32 | DType::F64) => format!("-{x}"),
                    (UnaryOp::Neg, DType::I32 | DType::I64) => format!("ig_neg({x})"),
                    (UnaryOp::Exp, DType::F32) => format!("expf({x})"),
                    (UnaryOp::Exp, DType::F64) => format!("exp({x})"),
                    (UnaryOp::Log, DType::F32) => format!("logf({x})"),
                    (UnaryOp::Log, DType::F64) => format!("log({x})"),
                    (UnaryOp::Sqrt, DType::F32) => format!("sqrtf({x})"),
                    (UnaryOp::Sqrt, DType::F64) => format!("sqrt({x})"),
                    (UnaryOp::Tanh, DType::F32) => format!("tanhf({x})"),
                    (UnaryOp::Tanh, DType::F64) => format!("tanh({x})"),
                    (UnaryOp::Recip, DType::F32) => format!("1.0f / {x}"),
                    (UnaryOp::Recip, DType::F64) => format!("1.0 / {x}"),
                    _ => return Err(unsupported(op.name(), d)),
                }
            }
            Inst::Binary { op, a, b } => {
                let (a, b, d) = (v(a), v(b), dt);
                let float = d.is_float();
                match (op, d) {
                    (BinaryOp::Add, _) if float => format!("{a} + {b}"),
                    (BinaryOp::Sub, _) if float => format!("{a} - {b}"),
                    (BinaryOp::Mul, _) if float => format!("{a} * {b}"),
                    (BinaryOp::Div, _) if float => format!("{a} / {b}"),
                    (BinaryOp::Add, DType::I32 | DType::I64) => format!("ig_add({a}, {b})"),
                    (BinaryOp::Sub, DType::I32 | DType::I64) => format!("ig_sub({a}, {b})"),
                    (BinaryOp::Mul, DType::I32 | DType::I64) => format!("ig_mul({a}, {b})"),
                    // The prelude's float overloads propagate NaN (fmaxf/fminf drop it).
                    (BinaryOp::Max, DType::F32 | DType::F64 | DType::I32 | DType::I64) => {
                        format!("ig_max({a}, {b})")
                    }
                    (BinaryOp::Min, DType::F32 | DType::F64 | DType::I32 | DType::I64) => {
                        format!("ig_min({a}, {b})")
                    }
                    _ => return Err(unsupported(op.name(), d)),
                }
            }
            Inst::Compare { op, a, b } => {
                let c = match op {
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                    CmpOp::Eq => "==",
                    CmpOp::Ne => "!=",
                };
                format!("(unsigned char)({} {c} {})", v(a), v(b))
            }
            Inst::Select { cond, a, b } => format!("{} ? {} : {}", v(cond), v(a), v(b)),
            Inst::Convert { x, to } => {
                let f = match to {
                    DType::F32 => "ig_to_f32",
                    DType::F64 => "ig_to_f64",
                    DType::I32 => "ig_to_i32",
                    DType::I64 => "ig_to_i64",
                    DType::Bool => "ig_to_bool",
                    DType::BF16 => return Err(unsupported("convert", to)),
                };
                format!("{f}({})", v(x))
            }
            // Only in the elementwise case (every reduce axis of size 1): a copy.
            Inst::Reduce { x, .. } => v(x),
        })
    }
}

/// The text stage of a reduction: the kernel's text without the line that defines `row` from
/// the clamped slot (at byte `row_line`) when nothing after it reads `row`, so that the
/// compiler is not asked to keep an unused value.
fn text_without_unread_row(mut text: String, row_line: Option<usize>) -> String {
    if let Some(at) = row_line {
        let end = at + text[at..].find('\n').map_or(0, |e| e + 1);
        if !mentions(&text[end..], "row") {
            text.replace_range(at..end, "");
        }
    }
    text
}

/// Whether `text` uses the identifier `word`.
fn mentions(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back().is_none_or(|c| !ident(c));
        let after = text[i + word.len()..]
            .chars()
            .next()
            .is_none_or(|c| !ident(c));
        before && after
    })
}

fn body_len(k: &FusedKernel) -> usize {
    k.body.len()
}

fn reduce_op(inst: &Inst) -> ReduceOp {
    match *inst {
        Inst::Reduce { op, .. } => op,
        _ => ReduceOp::Sum,
    }
}

/// The starting value of a reduction: 0, or the lowest value for max.
fn identity(op: ReduceOp, d: DType) -> String {
    match op {
        ReduceOp::Sum => literal(0.0, d),
        ReduceOp::Max => literal(f64::NEG_INFINITY, d),
    }
}

/// `acc` with the term `t` folded in.
fn accumulate(op: ReduceOp, d: DType, acc: &str, t: &str) -> String {
    match op {
        ReduceOp::Sum if d.is_float() => format!("{acc} + {t}"),
        ReduceOp::Sum => format!("ig_add({acc}, {t})"),
        ReduceOp::Max => format!("ig_keep_max({acc}, {t})"),
    }
}

/// Elementwise kernels of at least this many elements may go four elements a thread. Measured
/// on an H200: 20-28% faster at 6.3M and 25M elements (GPT-2's head copies and MLP
/// activations), 3% at 38.6M (its embedding's AdamW), but 1-3% slower at 0.8M to 2.4M and on
/// tiny kernels (fewer, longer threads where there is less to hide latency with).
const VEC4_MIN_NUMEL: usize = 1 << 22;

/// The CUDA vector type of four elements of `d`, where 16- or 4-byte vectors exist.
fn vec4_type(d: DType) -> Option<&'static str> {
    match d {
        DType::F32 => Some("float4"),
        DType::I32 => Some("int4"),
        DType::Bool => Some("uchar4"),
        DType::F64 | DType::I64 | DType::BF16 => None,
    }
}

/// Transposing elementwise kernels go through shared-memory tiles when they have at least
/// this many elements and both tile axes at least this size.
const TILE_MIN_NUMEL: usize = 1 << 16;
const TILE_MIN_DIM: usize = 16;

/// Register caching of loads across passes: at most this many elements per thread when every
/// load the loops read is cached, and this many 32-bit registers per thread for all the cached
/// loads together.
const CACHE_PER_THREAD: usize = 32;
const CACHE_WORDS: usize = 32;
/// Elements per thread when the row gets more threads so that its loads fit in registers
/// (see `Analysis::layout`): at most this many, or [`CACHE_SPLIT_MAX`] with 1024 threads a
/// row; and at most `CACHE_SPLIT_MAX` whenever some loads the loops read are not cached
/// (those are read from memory in the unrolled loops: more would keep too many loads in
/// flight).
const CACHE_SPLIT_PER_THREAD: usize = 4;
const CACHE_SPLIT_MAX: usize = 8;

/// Threads (rows × threads a row) that count as plenty: a row-strategy kernel with at least
/// this many may give each thread more elements (see `Analysis::layout`).
const ROW_THREADS_PLENTY: usize = 1 << 21;

/// The column strategy puts as many rows side by side in a block (32 down to 8) as leave at
/// least this many blocks. Measured on an H200 (GPT-2's bias gradients, 8192 rows summed):
/// 768 columns take 11.4 µs with 16 a block (48 blocks), 14.1 with 8, 15.5 with 32; 2304
/// columns 28.3 µs with 32, 30.5 with 8; 3072 columns 31.6 µs with 32, 36.3 with 8.
const COLUMN_BLOCKS: usize = 48;

/// Rows of at most this many elements get a group of lanes of one warp, not a block.
const GROUP_MAX_N: usize = 1024;

/// What a reduction's passes compute (see [`Analysis::passes`]).
struct Passes {
    /// The live reductions, in body order.
    reds: Vec<usize>,
    /// How many passes over the row: the largest reduction stage.
    passes: usize,
    /// Whether some output is per element (written by a final loop over the row).
    full_outputs: bool,
    /// The full (per element) instructions each pass computes (pass p at index p - 1).
    pass_full: Vec<Vec<usize>>,
    /// The full instructions the final output loop computes.
    final_full: Vec<usize>,
    /// Full instructions some loop computes.
    emitted_full: Vec<bool>,
    /// Row-level values something reads.
    needed: Vec<bool>,
    /// How many of the loops over the row read each load (more than one: worth caching).
    loop_uses: Vec<usize>,
}

/// How the threads of a block map onto rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Row strategy, long rows: one block of `t` threads per row.
    Block { t: u32 },
    /// Row strategy, short rows: `w` lanes of one warp per row (a power of two up to 32), `g`
    /// rows a block; partials combine by shuffles alone.
    Group { w: u32, g: u32 },
    /// Column strategy: `x` rows side by side, `y` threads along each.
    Columns { x: u32, y: u32 },
}

/// The prelude's lane reduction for `op`.
fn lanes_fn(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "ig_lanes_sum",
        ReduceOp::Max => "ig_lanes_max",
    }
}

/// Threads per block of the row strategy: the row's length rounded up to a power of two,
/// between 32 and 256; 1024 for long rows when there are too few rows to fill the GPU.
fn row_threads(n: usize, rows: usize) -> u32 {
    if n >= 4096 && rows < FILL || n >= 16384 {
        return 1024;
    }
    n.next_power_of_two().clamp(32, 256) as u32
}

/// `a + b` of two optional index terms ("0" when both are absent).
fn join(a: Option<String>, b: Option<String>, ix: Ix) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{a} + {b}"),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => ix.lit(0),
    }
}

// ---------------------------------------------------------------------------------------------
// Index spaces.

/// Consecutive axes of one index space merged into one where every stride vector composes
/// across them (so one index along the merged axis addresses all of them).
struct Group {
    /// The outermost original axis: names the index variable `i{axis}`.
    axis: usize,
    axes: Vec<usize>,
    dim: usize,
    /// Per stride vector: the stride of the innermost axis.
    strides: Vec<usize>,
    pinned: bool,
}

/// A row-major index space over some of the domain's axes (those of size 1 dropped), indexed by
/// one linear variable.
struct Space {
    /// Outer to inner.
    groups: Vec<Group>,
}

impl Space {
    fn new(axes: &[usize], dims: &[usize], vectors: &[Vec<usize>], pinned: &[bool]) -> Space {
        let mut groups: Vec<Group> = Vec::new(); // inner to outer while building
        for &a in axes.iter().rev() {
            if dims[a] == 1 {
                continue;
            }
            if let Some(g) = groups.last_mut() {
                let composes = !pinned[a]
                    && !g.pinned
                    && vectors
                        .iter()
                        .zip(&g.strides)
                        .all(|(v, &s)| s.checked_mul(g.dim) == Some(v[a]));
                if composes {
                    g.axes.insert(0, a);
                    g.axis = a;
                    g.dim = g.dim.saturating_mul(dims[a]);
                    continue;
                }
            }
            groups.push(Group {
                axis: a,
                axes: vec![a],
                dim: dims[a],
                strides: vectors.iter().map(|v| v[a]).collect(),
                pinned: pinned[a],
            });
        }
        groups.reverse();
        Space { groups }
    }

    /// `Some(c)` if vector `k` addresses the space as `c ×` its linear index.
    fn linear(&self, k: usize) -> Option<usize> {
        let mut contig = 1usize;
        let mut c: Option<usize> = None;
        for g in self.groups.iter().rev() {
            let s = g.strides[k];
            match c {
                None => c = Some(s),
                Some(c) => {
                    if c.checked_mul(contig) != Some(s) {
                        return None;
                    }
                }
            }
            contig = contig.saturating_mul(g.dim);
        }
        Some(c.unwrap_or(0))
    }

    /// The element-index term of vector `k` over this space (`None` when it is 0).
    fn part(&self, k: usize, lin: &str, ix: Ix) -> Option<String> {
        if let Some(c) = self.linear(k) {
            return match c {
                0 => None,
                1 => Some(lin.to_string()),
                c => Some(format!("{} * {lin}", ix.lit(c))),
            };
        }
        let terms: Vec<String> = self
            .groups
            .iter()
            .filter(|g| g.strides[k] != 0)
            .map(|g| match g.strides[k] {
                1 => format!("i{}", g.axis),
                s => format!("{} * i{}", ix.lit(s), g.axis),
            })
            .collect();
        Some(terms.join(" + "))
    }

    /// Marks the groups vector `k` needs the index of.
    fn need(&self, k: usize, need: &mut [bool]) {
        if self.linear(k).is_some() {
            return;
        }
        for (g, n) in self.groups.iter().zip(need.iter_mut()) {
            if g.strides[k] != 0 {
                *n = true;
            }
        }
    }

    fn need_pinned(&self, pinned: &[bool], need: &mut [bool]) {
        for (g, n) in self.groups.iter().zip(need.iter_mut()) {
            if g.axes.iter().any(|&a| pinned[a]) {
                *n = true;
            }
        }
    }

    fn need_axis(&self, axis: usize, need: &mut [bool]) {
        for (g, n) in self.groups.iter().zip(need.iter_mut()) {
            if g.axes.contains(&axis) {
                *n = true;
            }
        }
    }

    /// The index along domain axis `d` (an axis of size 1, or one outside this space, is 0).
    fn axis_var(&self, d: usize, ix: Ix) -> String {
        match self.groups.iter().find(|g| g.axes.contains(&d)) {
            // A pinned axis is alone in its group.
            Some(g) => format!("i{}", g.axis),
            None => ix.lit(0),
        }
    }

    /// Writes `const T i{axis} = ...;` for every needed group, from the linear index `lin`.
    fn decompose(&self, src: &mut Src, lin: &str, ix: Ix, need: &[bool]) {
        for (gi, g) in self.groups.iter().enumerate() {
            if !need[gi] {
                continue;
            }
            let inner: usize = self.groups[gi + 1..]
                .iter()
                .fold(1usize, |n, g| n.saturating_mul(g.dim));
            let q = if inner == 1 {
                lin.to_string()
            } else {
                format!("{lin} / {}", ix.lit(inner))
            };
            let e = if gi == 0 {
                q
            } else if inner == 1 {
                format!("{q} % {}", ix.lit(g.dim))
            } else {
                format!("({q}) % {}", ix.lit(g.dim))
            };
            src.line(format!("const {} i{} = {e};", ix.ty(), g.axis));
        }
    }
}
