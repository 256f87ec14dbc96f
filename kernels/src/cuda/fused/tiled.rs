//! The tiled elementwise strategy, for kernels that read an input transposed: a block stages
//! 32 x 32 tiles of those inputs through shared memory, so that both the reads (along the
//! input's contiguous axis `a`) and the writes (along the output's contiguous axis `d`) are
//! coalesced. The generator is split into the stages a reader follows: [`Tiling::new`] (the
//! strategy: tiles, launch, which inputs are staged), [`Tiling::loop_nest`] (the grid-stride
//! tile loop and the other axes' indices), [`Tiling::bases`] (each input's address at the
//! tile's other indices), [`Tiling::stage_guards`] (which staged loads need a guard),
//! [`Tiling::loads`] (the staging loop into shared memory) and [`Tiling::store`] (compute and
//! write along `d`); [`Analysis::elementwise_tiled`] strings them into the kernel's text.

use super::guards::IndexGuard;
use super::Analysis;
use crate::cuda::guard::{self, Guard};
use crate::cuda::{
    grid_for, narrowed, reg_type, signature, CodegenError, Ix, Launch, Src, MAX_GRID_ELEMENTWISE,
};
use crate::fused::{Access, Inst};

/// The strategy of one tiled kernel: the two tiled axes, the tile counts and the launch.
struct Tiling {
    ix: Ix,
    /// The axis contiguous in the transposed inputs (threads along it read them).
    a: usize,
    /// The axis contiguous in the outputs (threads along it write them).
    d: usize,
    na: usize,
    nd: usize,
    /// Tiles along `a` and along `d`.
    ta: usize,
    td: usize,
    /// The other axes longer than 1, outermost first: each tile is at one index of them.
    others: Vec<usize>,
    tiles: usize,
    grid: u32,
    launch: Launch,
    /// Inputs staged through shared memory: read, contiguous along `a` and strided along `d`.
    tiled: Vec<bool>,
}

impl Tiling {
    /// The strategy for tiling axes `a` and `d` of `s`'s kernel; `used` marks the inputs read.
    fn new(s: &Analysis, a: usize, d: usize, used: &[bool]) -> Tiling {
        let dims = &s.k.domain;
        let (na, nd) = (dims[a], dims[d]);
        let (ta, td) = (na.div_ceil(32), nd.div_ceil(32));
        let others: Vec<usize> = (0..dims.len())
            .filter(|&x| x != a && x != d && dims[x] > 1)
            .collect();
        let n_other: usize = others.iter().map(|&x| dims[x]).product();
        let tiles = n_other * ta * td;
        let grid = grid_for(tiles, 1, MAX_GRID_ELEMENTWISE);
        let launch = Launch {
            grid: [grid, 1, 1],
            block: [32, 8, 1],
            shared_bytes: 0,
        };
        let tiled =
            s.k.inputs
                .iter()
                .enumerate()
                .map(|(n, inp)| used[n] && inp.access.strides[a] == 1 && inp.access.strides[d] > 1)
                .collect();
        Tiling {
            ix: s.ix,
            a,
            d,
            na,
            nd,
            ta,
            td,
            others,
            tiles,
            grid,
            launch,
            tiled,
        }
    }

    fn any_tiled(&self) -> bool {
        self.tiled.iter().any(|&x| x)
    }

    /// Opens the grid-stride loop over tiles and declares the tile's position: `td`, `ta` and
    /// the index `i{x}` of every other axis, decomposed from the tile number (outermost axis
    /// undivided, so no modulo is spent on it).
    fn loop_nest(&self, src: &mut Src, dims: &[usize]) {
        let (ix, t) = (self.ix, self.ix.ty());
        let (ta, td) = (self.ta, self.td);
        src.open(format!(
            "for ({t} tile = blockIdx.x; tile < {}; tile += gridDim.x) {{",
            ix.lit(self.tiles)
        ));
        src.line(format!("const {t} td = tile % {};", ix.lit(td)));
        src.line(format!(
            "const {t} ta = (tile / {}) % {};",
            ix.lit(td),
            ix.lit(ta)
        ));
        if self.others.is_empty() {
            return;
        }
        src.line(format!("const {t} o = tile / {};", ix.lit(ta * td)));
        let mut inner = 1usize;
        let mut lines = Vec::new();
        for (q, &x) in self.others.iter().enumerate().rev() {
            let div = if inner == 1 {
                "o".to_string()
            } else {
                format!("o / {}", ix.lit(inner))
            };
            let e = if q == 0 {
                div
            } else if inner == 1 {
                format!("{div} % {}", ix.lit(dims[x]))
            } else {
                format!("({div}) % {}", ix.lit(dims[x]))
            };
            lines.push(format!("const {t} i{x} = {e};"));
            inner *= dims[x];
        }
        for l in lines.into_iter().rev() {
            src.line(l);
        }
    }

    /// `stride * var`, or nothing for stride 0.
    fn term(&self, s: usize, var: String) -> Option<String> {
        match s {
            0 => None,
            1 => Some(var),
            s => Some(format!("{} * {var}", self.ix.lit(s))),
        }
    }

    /// The address of `offset` plus the other axes' terms, or `None` when it is 0.
    fn part(&self, strides: &[usize], offset: usize) -> Option<String> {
        let mut terms: Vec<String> = Vec::new();
        if offset != 0 {
            terms.push(self.ix.lit(offset));
        }
        terms.extend(
            self.others
                .iter()
                .filter_map(|&x| self.term(strides[x], format!("i{x}"))),
        );
        (!terms.is_empty()).then(|| terms.join(" + "))
    }

    /// Declares each read input's base address at the tile's other indices (`b{n}`) and the
    /// outputs' (`bo`), once per tile rather than once per element; returns their names
    /// (`None` where the base is 0), inputs first, then the outputs' base.
    fn bases(
        &self,
        src: &mut Src,
        s: &Analysis,
        used: &[bool],
        contiguous: &[usize],
    ) -> (Vec<Option<String>>, Option<String>) {
        let (k, t) = (s.k, self.ix.ty());
        let mut base: Vec<Option<String>> = vec![None; k.inputs.len()];
        for (n, inp) in k.inputs.iter().enumerate() {
            if used[n] {
                base[n] = self.part(&inp.access.strides, inp.access.offset).map(|p| {
                    src.line(format!("const {t} b{n} = {p};"));
                    format!("b{n}")
                });
            }
        }
        let out_base = self.part(contiguous, 0).map(|p| {
            src.line(format!("const {t} bo = {p};"));
            "bo".to_string()
        });
        (base, out_base)
    }

    /// The full address: a base plus the terms along `a` and `d`.
    fn addr(&self, strides: &[usize], base: &Option<String>) -> String {
        let (a, d) = (self.a, self.d);
        let mut terms: Vec<String> = base.iter().cloned().collect();
        terms.extend(self.term(strides[a], format!("i{a}")));
        terms.extend(self.term(strides[d], format!("i{d}")));
        if terms.is_empty() {
            self.ix.lit(0)
        } else {
            terms.join(" + ")
        }
    }

    /// The condition that the thread's element lies inside the domain (tiles at the edge
    /// overhang it).
    fn in_range(&self) -> String {
        let (a, d, ix) = (self.a, self.d, self.ix);
        format!("i{a} < {} && i{d} < {}", ix.lit(self.na), ix.lit(self.nd))
    }

    /// The index expression of axis `x` at the thread's element (0 for axes of size 1).
    fn axis(&self, x: usize) -> String {
        if x == self.a || x == self.d || self.others.contains(&x) {
            format!("i{x}")
        } else {
            self.ix.lit(0)
        }
    }

    /// Guarded loads, as in the plain elementwise loop. A tiled input is staged only where its
    /// loads' guard holds: the guard of all its loads when they share one and it depends on
    /// indices alone, with the instructions that compute its condition (they are computed
    /// again in the staging loop, which has no other values). `None`: stage unguarded.
    fn stage_guards(
        &self,
        s: &Analysis,
        insts: &[usize],
        g: &[Option<Guard>],
    ) -> Vec<Option<IndexGuard>> {
        let k = s.k;
        (0..k.inputs.len())
            .map(|n| {
                if !self.tiled[n] {
                    return None;
                }
                let mut loads = insts
                    .iter()
                    .filter(|&&i| matches!(k.body[i], Inst::Load { input } if input == n));
                let first = g[*loads.next()?]?;
                if loads.any(|&i| g[i] != Some(first)) {
                    return None;
                }
                s.index_only_guard(first)
            })
            .collect()
    }

    /// The staging loop: threads along `a` read each tiled input into its shared tile
    /// (coalesced, as `a` is the input's contiguous axis), then the block synchronises.
    fn loads(
        &self,
        src: &mut Src,
        s: &Analysis,
        base: &[Option<String>],
        stage_guard: &[Option<IndexGuard>],
    ) -> Result<(), CodegenError> {
        if !self.any_tiled() {
            return Ok(());
        }
        let (k, t, a, d) = (s.k, self.ix.ty(), self.a, self.d);
        src.open("for (unsigned q = threadIdx.y; q < 32u; q += 8u) {");
        src.line(format!("const {t} i{a} = ta * 32u + threadIdx.x;"));
        src.line(format!("const {t} i{d} = td * 32u + q;"));
        src.open(format!("if ({}) {{", self.in_range()));
        let mut written = vec![false; k.body.len()];
        for (n, inp) in k.inputs.iter().enumerate() {
            if !self.tiled[n] {
                continue;
            }
            let load = s.load_expr(n, &self.addr(&inp.access.strides, &base[n]));
            let e = match &stage_guard[n] {
                None => load,
                Some((guard, closure)) => {
                    for &i in closure {
                        if !std::mem::replace(&mut written[i], true) {
                            let e = s.expr(i, &[], &|x| self.axis(x))?;
                            src.line(format!("const {} v{i} = {e};", reg_type(s.dt[i])));
                        }
                    }
                    s.guarded(load, s.input_load(n), Some(*guard))
                }
            };
            src.line(format!("t{n}[q][threadIdx.x] = {e};"));
        }
        src.close();
        src.close();
        src.line("__syncthreads();");
        Ok(())
    }

    /// The compute loop: threads along `d` read the staged tiles transposed (and the other
    /// inputs directly), compute the body in guard order and write every output, coalesced
    /// along `d`.
    #[allow(clippy::too_many_arguments)]
    fn store(
        &self,
        src: &mut Src,
        s: &Analysis,
        used: &[bool],
        base: &[Option<String>],
        out_base: &Option<String>,
        contiguous: &[usize],
        (per_element, insts, g): (&[bool], &[usize], &[Option<Guard>]),
    ) -> Result<(), CodegenError> {
        let (k, t, a, d) = (s.k, self.ix.ty(), self.a, self.d);
        src.open("for (unsigned q = threadIdx.y; q < 32u; q += 8u) {");
        src.line(format!("const {t} i{a} = ta * 32u + q;"));
        src.line(format!("const {t} i{d} = td * 32u + threadIdx.x;"));
        src.open(format!("if ({}) {{", self.in_range()));
        let addrs: Vec<String> = (0..k.inputs.len())
            .map(|n| {
                if used[n] && !self.tiled[n] {
                    self.addr(&k.inputs[n].access.strides, &base[n])
                } else {
                    String::new()
                }
            })
            .collect();
        for i in guard::order(&k.body, per_element, insts, g) {
            let ty = reg_type(s.dt[i]);
            match k.body[i] {
                Inst::Load { input } if self.tiled[input] => {
                    src.line(format!("const {ty} v{i} = t{input}[threadIdx.x][q];"))
                }
                _ => {
                    let e = s.guarded(s.expr(i, &addrs, &|x| self.axis(x))?, i, g[i]);
                    src.line(format!("const {ty} v{i} = {e};"));
                }
            }
        }
        let out_addr = self.addr(contiguous, out_base);
        for (j, o) in k.outputs.iter().enumerate() {
            let v = narrowed(k.output_dtype(j), format!("v{}", o.value));
            src.line(format!("out{j}[{out_addr}] = {v};"));
        }
        src.close();
        src.close();
        Ok(())
    }
}

impl Analysis<'_> {
    /// The elementwise kernel through 32 × 32 tiles of axes `(a, d)`: block (32, 8); the
    /// inputs contiguous along `a` are read with threads along `a` into shared memory, then
    /// every instruction is computed with threads along `d`, so that both the reads and the
    /// writes coalesce. The text, in stage order: header, shared tiles, tile loop, bases,
    /// staging, compute and store.
    pub(super) fn elementwise_tiled(
        &self,
        a: usize,
        d: usize,
        used: &[bool],
    ) -> Result<(String, Launch), CodegenError> {
        let k = self.k;
        let plan = Tiling::new(self, a, d, used);
        let contiguous = Access::contiguous(&k.domain).strides;
        let mut src = Src::default();
        self.header(
            &mut src,
            &format!(
                "{} elements in {} tiles of 32 x 32 along axes {a} and {d}",
                self.numel, plan.tiles
            ),
            &plan.launch,
        );
        src.open(signature(256, &self.params()));
        for (n, inp) in k.inputs.iter().enumerate() {
            if plan.tiled[n] {
                // A tile holds register values (a bf16 input's widened floats).
                src.line(format!("__shared__ {} t{n}[32][33];", reg_type(inp.dtype)));
            }
        }
        plan.loop_nest(&mut src, &k.domain);
        let (base, out_base) = plan.bases(&mut src, self, used, &contiguous);
        let (per_element, insts, g) = self.elementwise_guards();
        let stage_guard = plan.stage_guards(self, &insts, &g);
        plan.loads(&mut src, self, &base, &stage_guard)?;
        plan.store(
            &mut src,
            self,
            used,
            &base,
            &out_base,
            &contiguous,
            (&per_element, &insts, &g),
        )?;
        if plan.any_tiled() && plan.tiles > plan.grid as usize {
            src.line("__syncthreads(); // the next tile reuses the shared memory");
        }
        src.close();
        src.close();
        Ok((src.text, plan.launch))
    }
}
