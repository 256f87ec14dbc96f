//! Column reductions several rows a thread: where the kept innermost axis is contiguous in
//! every input the loop reads, a thread takes `W` consecutive rows (4, or 8 where every
//! vector is of bf16 or bools: 16 bytes) and reads one vector where it read one element.
//!
//! Why: a column reduction over channels-last data (a batch norm's statistics over
//! `[N, H, W]`, its weight and bias gradients, the partial sums of its data gradient) read
//! one 2-byte bf16 element a thread a load, 64 bytes a warp, and ran at about 2.3 TB/s on an
//! H200 where elementwise passes over the same tensors reach about 4 (docs/benchmarks.md,
//! session 36): two bytes a thread in flight do not cover the memory's latency.
//!
//! The kernel is the column strategy's, `X` threads across (each `W` rows) and `Y` along the
//! reduce axes: each thread sums its rows' terms at `j = threadIdx.y, threadIdx.y + Y, ...`
//! in order, one accumulator a row, then the `Y` partials of each row fold through shared
//! memory pairwise ([`Analysis::column_vector_fold`]). `X` threads across read a whole
//! 128-byte line of the narrowest vector input where the blocks are enough, and a block
//! holds 256 threads, up to 1024 where its blocks are few
//! ([`Analysis::column_vector_block`]): each row's sum is therefore folded from more,
//! shorter partials than one row a thread folds, and its rounding differs from it (within
//! the same f32 accumulation).
//!
//! Only single-pass kernels with row-level outputs go so (every reduction reads only the
//! elements, no reduction another's result, no full output): the statistics and gradients
//! above, and the partial and finishing kernels of split column reductions.

use super::expr::{accumulate, identity, reduce_op};
use super::layout::{FILL, MAX_SHARED};
use super::loads::{Addresses, Spaces};
use super::loops::THREAD_BLOCK;
use super::passes::Passes;
use super::rowvec::{lane_bits, vector_type};
use super::vec4::vec4_type;
use super::Analysis;
use crate::cuda::{
    grid_for, narrowed, reg_size, reg_type, rounded, signature, widened, CodegenError, Launch, Src,
    Strategy, MAX_GRID_ROWS,
};
use crate::fused::Inst;
use crate::DType;

/// Threads across a block at least (each `W` rows): a warp then reads at least 4 vectors
/// side by side (64 bytes of bf16 in eights), whole 32-byte sectors.
const MIN_ACROSS: usize = 4;
/// Bytes of the narrowest vector input that a block's threads across read side by side
/// where its blocks are enough: a whole 128-byte line, not half of one in each of two blocks.
const LINE: usize = 128;
/// Threads all blocks together should hold at least before a block takes more than 256:
/// 1,024 an SM of an H200's 132 (half of what an SM can hold), two blocks of 512 an SM.
const FILL_THREADS: usize = FILL * 512;

/// How a column reduction goes several rows a thread (see the module docs).
pub(super) struct ColumnVectors {
    /// The kept innermost axis (size > 1), along which a thread's rows lie.
    l: usize,
    /// Rows a thread: 4, or 8.
    width: usize,
    /// Input `m` is read a vector at a time (contiguous along `l`); the others (broadcast
    /// along `l`, or row-level) an element a lane.
    vector: Vec<bool>,
}

impl Analysis<'_> {
    /// Whether the column reduction goes several rows a thread, and how: column strategy,
    /// one pass and no full output, the innermost axis of size > 1 (kept) a multiple of the
    /// width, and every input the loop reads either contiguous along it (stride 1, a vector
    /// type, each row's first element aligned to the width: its offset and its other strides
    /// are multiples of it, buffers being 256-byte aligned) or broadcast along it (stride 0);
    /// and at most [`THREAD_BLOCK`] terms a thread.
    pub(super) fn column_vectors(&self, p: &Passes) -> Option<ColumnVectors> {
        let k = self.k;
        if self.strategy != Strategy::Columns
            || self.tuning.scalar_rows
            || self.tuning.column_rows.is_some()
            || p.passes != 1
            || p.full_outputs
            || self.n == 0
            || self.rows == 0
        {
            return None;
        }
        let dims = &k.domain;
        let l = (0..dims.len()).rev().find(|&d| dims[d] > 1)?;
        if self.red_axis[l] || !dims[l].is_multiple_of(4) {
            return None;
        }
        let full_used = self.loaded_inputs(|i| p.emitted_full[i]);
        let aligned = |m: usize, w: usize| {
            let a = &k.inputs[m].access;
            a.offset.is_multiple_of(w)
                && (0..dims.len()).all(|d| d == l || dims[d] == 1 || a.strides[d].is_multiple_of(w))
        };
        let mut vector = vec![false; k.inputs.len()];
        for (m, inp) in k.inputs.iter().enumerate() {
            if !full_used[m] {
                continue;
            }
            match inp.access.strides[l] {
                0 => {}
                1 if vec4_type(inp.dtype).is_some() && aligned(m, 4) => vector[m] = true,
                _ => return None,
            }
        }
        if !vector.iter().any(|&v| v) {
            return None;
        }
        let eight = |d: DType| d == DType::BF16 || d == DType::Bool;
        let wide = dims[l].is_multiple_of(8)
            && (k.inputs.iter().enumerate())
                .all(|(m, inp)| !vector[m] || (eight(inp.dtype) && aligned(m, 8)));
        let cv = ColumnVectors {
            l,
            width: if wide { 8 } else { 4 },
            vector,
        };
        // A thread's share longer than THREAD_BLOCK terms is summed in cascaded blocks by the
        // column strategy ([`super::loops`]), accurate at any length: such columns stay there.
        let (_, y) = self.column_vector_block(&cv, p.reds.len());
        (self.n.div_ceil(y) <= THREAD_BLOCK).then_some(cv)
    }

    /// The block `(X, Y)` of a kernel several rows a thread. `X` threads across read
    /// [`LINE`] bytes of the narrowest vector input side by side (8 threads of 8 bf16, 16 of
    /// 8 bools, 32 of 4 bools beside an f32), halved (down to [`MIN_ACROSS`]) while blocks
    /// of 1024 threads would hold fewer than [`FILL_THREADS`]; the block's threads (`X·Y`)
    /// are 256, doubled up to 1024 while the blocks together hold fewer than
    /// [`FILL_THREADS`]; `Y` is the rest, at most the row's length, halved while the fold's
    /// shared memory would pass [`MAX_SHARED`].
    ///
    /// Why: with 4 threads across (the column strategy's 32 divided by the width), a warp's
    /// row of bf16 read 64 bytes, each 128-byte line split between two blocks, and resnet50's
    /// statistics passes ran at 2.1 to 2.7 TB/s on an H200 (docs/benchmarks.md, session 37).
    fn column_vector_block(&self, cv: &ColumnVectors, reductions: usize) -> (usize, usize) {
        let groups = self.rows / cv.width;
        let narrowest = (self.k.inputs.iter().zip(&cv.vector))
            .filter(|&(_, &v)| v)
            .map(|(inp, _)| cv.width * inp.dtype.size())
            .min()
            .unwrap_or(16);
        let mut x = (LINE / narrowest).max(MIN_ACROSS);
        while x > MIN_ACROSS && groups.div_ceil(x) * 1024 < FILL_THREADS {
            x /= 2;
        }
        let units = groups.div_ceil(x);
        let mut threads = 256;
        while threads < 1024 && units * threads < FILL_THREADS {
            threads *= 2;
        }
        let mut y = (threads / x).min(self.n.next_power_of_two()).max(2);
        let widest = (self.k.body.iter().enumerate())
            .filter(|&(i, inst)| self.live[i] && matches!(inst, Inst::Reduce { .. }))
            .map(|(i, _)| reg_size(self.dt[i]))
            .max()
            .unwrap_or(4);
        while y > 2 && reductions * x * cv.width * y * widest > MAX_SHARED {
            y /= 2;
        }
        (x, y)
    }

    /// The kernel several rows a thread (see the module docs): per unit of `X·W` rows, the
    /// row-level values of each lane (`h{i}[q]`), the loop over the thread's elements (the
    /// vectors read once, each lane's terms in its own scope), the fold of each lane's
    /// partials, and each lane's row-level outputs.
    pub(super) fn column_vector_kernel(
        &self,
        p: &Passes,
        cv: &ColumnVectors,
    ) -> Result<(String, Launch), CodegenError> {
        let (ix, w) = (self.ix, cv.width);
        let t = ix.ty();
        let reds = &p.reds;
        let (x, y) = self.column_vector_block(cv, reds.len());
        let groups = self.rows / w;
        let units = groups.div_ceil(x);
        let launch = Launch {
            grid: [grid_for(units, 1, MAX_GRID_ROWS), 1, 1],
            block: [x as u32, y as u32, 1],
            shared_bytes: 0,
        };
        let sp = self.spaces(p);
        let mut src = Src::default();
        self.header(
            &mut src,
            &format!(
                "{} rows of {} elements, {w} rows a thread; 1 reduction pass",
                self.rows, self.n
            ),
            &launch,
        );
        src.open(signature((x * y) as u32, &self.params()));
        for &r in reds {
            let ty = reg_type(self.dt[r]);
            src.line(format!("__shared__ {ty} sm{r}[{y}][{}];", x * w));
        }
        src.open(format!(
            "for ({t} rb = blockIdx.x; rb < {units}; rb += gridDim.x) {{",
            units = ix.lit(units)
        ));
        src.line(format!("const {t} rr = rb * {} + threadIdx.x;", ix.lit(x)));
        src.line(format!("const bool ok = rr < {};", ix.lit(groups)));
        src.line(format!(
            "const {t} row = (ok ? rr : {}) * {};",
            ix.lit(groups - 1),
            ix.lit(w)
        ));
        let at = self.row_addresses(&mut src, p, &sp);
        self.column_row_values(&mut src, p, cv, &sp, &at, 0)?;
        for &r in reds {
            let (op, ty) = (reduce_op(&self.k.body[r]), self.dt[r]);
            for q in 0..w {
                src.line(format!("{} a{r}_{q} = {};", reg_type(ty), identity(op, ty)));
            }
        }
        self.column_vector_loop(&mut src, p, cv, &sp, &at, y)?;
        self.column_vector_fold(&mut src, reds, w, y);
        self.column_row_values(&mut src, p, cv, &sp, &at, 1)?;
        if units > launch.grid[0] as usize {
            src.line("__syncthreads(); // the next unit reuses the shared memory");
        }
        src.close();
        src.close();
        Ok((src.text, launch))
    }

    /// The index along axis `d` at lane `q` (`axis` gives lane 0's): `q` further along `l`.
    fn lane_axis(axis: String, d: usize, cv: &ColumnVectors, q: usize) -> String {
        if d == cv.l && q > 0 {
            format!("({axis} + {q}u)")
        } else {
            axis
        }
    }

    /// Input `m`'s element index at lane `q`, `at` lane 0's: `q` strides further along `l`.
    fn lane_address(&self, at: &str, m: usize, cv: &ColumnVectors, q: usize) -> String {
        let s = self.k.inputs[m].access.strides[cv.l] * q;
        if s == 0 {
            at.to_string()
        } else {
            format!("{at} + {}", self.ix.lit(s))
        }
    }

    /// The row-level values of stage `s` in each lane's scope. Stage 0 (before the loop):
    /// every needed one, kept in `h{i}[q]` for the loop and the later stage. Stage 1 (after
    /// the fold): each lane's reductions (`a{r}_{q}`, rounded once), the stage-0 values it
    /// reads back from `h`, its stage-1 values, and its row-level outputs, stored by the
    /// threads with `threadIdx.y == 0` of real rows.
    fn column_row_values(
        &self,
        src: &mut Src,
        p: &Passes,
        cv: &ColumnVectors,
        sp: &Spaces,
        at: &Addresses,
        s: usize,
    ) -> Result<(), CodegenError> {
        let k = self.k;
        let row_insts = |stage: usize| -> Vec<usize> {
            (0..k.body.len())
                .filter(|&i| {
                    p.needed[i]
                        && self.row[i]
                        && self.stage[i] == stage
                        && !matches!(k.body[i], Inst::Reduce { .. })
                })
                .collect()
        };
        let held = row_insts(0);
        if s == 0 {
            for &i in &held {
                src.line(format!("{} h{i}[{}];", reg_type(self.dt[i]), cv.width));
            }
        }
        for q in 0..cv.width {
            src.open("{");
            let addr: Vec<String> = (0..k.inputs.len())
                .map(|m| self.lane_address(&at.row[m], m, cv, q))
                .collect();
            let axis = |d: usize| Self::lane_axis(sp.row_axis(d), d, cv, q);
            if s == 0 {
                for &i in &held {
                    let e = self.expr(i, &addr, &axis)?;
                    src.line(format!("const {} v{i} = {e};", reg_type(self.dt[i])));
                    src.line(format!("h{i}[{q}] = v{i};"));
                }
            } else {
                for &i in &held {
                    src.line(format!("const {} v{i} = h{i}[{q}];", reg_type(self.dt[i])));
                }
                for &r in &p.reds {
                    let ty = self.dt[r];
                    let v = rounded(ty, format!("a{r}_{q}"));
                    src.line(format!("const {} v{r} = {v};", reg_type(ty)));
                }
                for i in row_insts(1) {
                    let e = self.expr(i, &addr, &axis)?;
                    src.line(format!("const {} v{i} = {e};", reg_type(self.dt[i])));
                }
                let stores: Vec<String> = (k.outputs.iter().enumerate())
                    .map(|(j, o)| {
                        let v = narrowed(k.output_dtype(j), format!("v{}", o.value));
                        format!("out{j}[row + {}] = {v};", self.ix.lit(q))
                    })
                    .collect();
                if !stores.is_empty() {
                    src.line(format!(
                        "if (ok && threadIdx.y == 0u) {{ {} }}",
                        stores.join(" ")
                    ));
                }
            }
            src.close();
        }
        Ok(())
    }

    /// The loop over the thread's elements: each input read as vectors once (`l{m}`, at lane
    /// 0's element), then each lane's full instructions in its own scope (row-level operands
    /// from `h`, vector loads from their lane) and its terms added to `a{r}_{q}`.
    fn column_vector_loop(
        &self,
        src: &mut Src,
        p: &Passes,
        cv: &ColumnVectors,
        sp: &Spaces,
        at: &Addresses,
        y: usize,
    ) -> Result<(), CodegenError> {
        let (k, ix) = (self.k, self.ix);
        let insts = &p.pass_full[0];
        src.open(format!(
            "for ({t} j = threadIdx.y; j < {n}; j += {y}) {{",
            t = ix.ty(),
            n = ix.lit(self.n),
            y = ix.lit(y)
        ));
        let none = vec![false; k.body.len()];
        let need = self.loop_need(sp, insts, false, &none, &none);
        sp.red.decompose(src, "j", ix, &need);
        for (m, inp) in k.inputs.iter().enumerate() {
            if cv.vector[m]
                && insts
                    .iter()
                    .any(|&i| matches!(k.body[i], Inst::Load { input } if input == m))
            {
                let vt = vector_type(inp.dtype, cv.width);
                src.line(format!(
                    "const {vt} l{m} = *reinterpret_cast<const {vt}*>(in{m} + ({}));",
                    at.full[m]
                ));
            }
        }
        let held: Vec<usize> = (0..k.body.len())
            .filter(|&i| p.needed[i] && self.row[i] && self.stage[i] == 0)
            .filter(|&i| !matches!(k.body[i], Inst::Reduce { .. }))
            .collect();
        for q in 0..cv.width {
            src.open("{");
            for &i in &held {
                src.line(format!("const {} v{i} = h{i}[{q}];", reg_type(self.dt[i])));
            }
            let addr: Vec<String> = (0..k.inputs.len())
                .map(|m| self.lane_address(&at.full[m], m, cv, q))
                .collect();
            let axis = |d: usize| Self::lane_axis(sp.any_axis(d), d, cv, q);
            for &i in insts {
                let ty = reg_type(self.dt[i]);
                let e = match k.body[i] {
                    Inst::Load { input } if cv.vector[input] => widened(
                        k.inputs[input].dtype,
                        lane_bits(cv.width, k.inputs[input].dtype, input, q),
                    ),
                    _ => self.expr(i, &addr, &axis)?,
                };
                src.line(format!("const {ty} v{i} = {e};"));
            }
            for &r in &p.reds {
                let Inst::Reduce { x, .. } = k.body[r] else {
                    continue;
                };
                let acc = format!("a{r}_{q}");
                let term = accumulate(reduce_op(&k.body[r]), self.dt[r], &acc, &format!("v{x}"));
                src.line(format!("{acc} = {term};"));
            }
            src.close();
        }
        src.close();
        Ok(())
    }

    /// Each lane's partials folded across `threadIdx.y` through shared memory, pairwise in
    /// `log2(Y)` rounds (row `y` takes in row `y + s`, `s` halving from `Y / 2`), so that a
    /// thread's part of the fold stays a few adds a lane however many threads share its rows
    /// (a chain over `Y` partials a lane, as the column strategy's fold, took the first
    /// measured kernels 2,048 dependent shared-memory adds a thread at `Y = 256`, eight lanes:
    /// resnet50's statistics ran at 0.55 TB/s); every thread gets its lanes' sums back in
    /// `a{r}_{q}`. `Y` is a power of two.
    fn column_vector_fold(&self, src: &mut Src, reds: &[usize], w: usize, y: usize) {
        for &r in reds {
            for q in 0..w {
                src.line(format!(
                    "sm{r}[threadIdx.y][threadIdx.x * {w}u + {q}u] = a{r}_{q};"
                ));
            }
        }
        src.line("__syncthreads();");
        src.open(format!("for (unsigned s = {}u; s > 0u; s >>= 1) {{", y / 2));
        src.open("if (threadIdx.y < s) {");
        for &r in reds {
            let op = reduce_op(&self.k.body[r]);
            for q in 0..w {
                let col = format!("threadIdx.x * {w}u + {q}u");
                let (at, other) = (
                    format!("sm{r}[threadIdx.y][{col}]"),
                    format!("sm{r}[threadIdx.y + s][{col}]"),
                );
                src.line(format!(
                    "{at} = {};",
                    accumulate(op, self.dt[r], &at, &other)
                ));
            }
        }
        src.close();
        src.line("__syncthreads();");
        src.close();
        for &r in reds {
            for q in 0..w {
                src.line(format!("a{r}_{q} = sm{r}[0][threadIdx.x * {w}u + {q}u];"));
            }
        }
    }
}
