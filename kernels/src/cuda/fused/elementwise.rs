//! The elementwise strategy: one grid-stride loop over the domain's elements, each thread
//! computing the whole body at its element. Kernels that can go four elements a thread are
//! handed to [`super::vec4`], transposing ones to [`super::tiled`]; this module holds the plain
//! loop and the choice between the three.

use super::space::{join, Space};
use super::Analysis;
use crate::cuda::guard;
use crate::cuda::{
    grid_for, narrowed, reg_type, signature, CodegenError, Launch, Src, BLOCK, MAX_GRID_ELEMENTWISE,
};
use crate::fused::Access;

/// Transposing elementwise kernels go through shared-memory tiles when they have at least
/// this many elements and both tile axes at least this size.
pub(super) const TILE_MIN_NUMEL: usize = 1 << 16;
pub(super) const TILE_MIN_DIM: usize = 16;

/// The index space of an elementwise loop: the linear index `e` over some dims, addressing each
/// read input through its stride vector and the outputs through theirs (contiguous).
pub(super) struct Flat {
    pub(super) space: Space,
    /// Input `n`'s stride vector in `space` (`usize::MAX` where it is not read).
    pub(super) vec_of: Vec<usize>,
    pub(super) out_vec: usize,
}

impl Analysis<'_> {
    /// The elementwise strategy's choice: 32 × 32 tiles for a transposing kernel
    /// ([`Analysis::transpose_axes`]), four elements a thread where every access allows
    /// ([`Analysis::vec4_inputs`]), the plain loop otherwise.
    pub(super) fn elementwise(&self) -> Result<(String, Launch), CodegenError> {
        let k = self.k;
        if self.numel == 0 || k.outputs.is_empty() {
            return Ok(self.empty());
        }
        let used = self.loaded_inputs(|_| true);
        if let Some((a, d)) = self.transpose_axes(&used) {
            return self.elementwise_tiled(a, d, &used);
        }
        if let Some((l, vector)) = self
            .vec4_inputs(&used)
            .filter(|_| !self.tuning.scalar_elementwise)
        {
            return self.elementwise_vec4(l, &used, &vector);
        }
        self.elementwise_plain(&used)
    }

    /// The plain loop: a grid-stride loop over the domain, one element a thread; the body in
    /// guard order (a guard's condition before the loads it guards), then the stores.
    fn elementwise_plain(&self, used: &[bool]) -> Result<(String, Launch), CodegenError> {
        let (k, ix) = (self.k, self.ix);
        let f = self.flat(&k.domain, used, |n| k.inputs[n].access.strides.clone());
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
        self.open_grid_loop(&mut src, self.numel);
        self.decompose_for_loads(&mut src, &f, used);
        let addr = self.flat_addresses(&f, used, |n| k.inputs[n].access.offset);
        let axis = |d: usize| f.space.axis_var(d, ix);
        let (per_element, insts, g) = self.elementwise_guards();
        for i in guard::order(&k.body, &per_element, &insts, &g) {
            let e = self.guarded(self.expr(i, &addr, &axis)?, i, g[i]);
            src.line(format!("const {} v{i} = {e};", reg_type(self.dt[i])));
        }
        let out_addr = join(None, f.space.part(f.out_vec, "e", ix), ix);
        for (j, o) in k.outputs.iter().enumerate() {
            let v = narrowed(k.output_dtype(j), format!("v{}", o.value));
            src.line(format!("out{j}[{out_addr}] = {v};"));
        }
        src.close();
        src.close();
        Ok((src.text, launch))
    }

    /// The index space of the linear index over `dims`, with `strides(n)` the stride vector of
    /// read input `n` (see [`Flat`]).
    pub(super) fn flat(
        &self,
        dims: &[usize],
        used: &[bool],
        strides: impl Fn(usize) -> Vec<usize>,
    ) -> Flat {
        let all: Vec<usize> = (0..dims.len()).collect();
        let mut vectors = Vec::new();
        let mut vec_of = vec![usize::MAX; used.len()];
        for n in (0..used.len()).filter(|&n| used[n]) {
            vec_of[n] = vectors.len();
            vectors.push(strides(n));
        }
        let out_vec = vectors.len();
        vectors.push(Access::contiguous(dims).strides);
        Flat {
            space: Space::new(&all, dims, &vectors, &self.pinned),
            vec_of,
            out_vec,
        }
    }

    /// Opens the grid-stride loop of the linear index `e` over `count` iterations.
    pub(super) fn open_grid_loop(&self, src: &mut Src, count: usize) {
        let ix = self.ix;
        src.open(format!(
            "for ({t} e = {start}; e < {count}; e += {stride}) {{",
            t = ix.ty(),
            start = ix.global_thread(BLOCK),
            count = ix.lit(count),
            stride = ix.grid_stride(BLOCK),
        ));
    }

    /// The index each read input is read at, `offset(n)` plus its term at `e` (empty for the
    /// inputs not read).
    pub(super) fn flat_addresses(
        &self,
        f: &Flat,
        used: &[bool],
        offset: impl Fn(usize) -> usize,
    ) -> Vec<String> {
        let ix = self.ix;
        (0..used.len())
            .map(|n| {
                if !used[n] {
                    return String::new();
                }
                let off = offset(n);
                join(
                    (off != 0).then(|| ix.lit(off)),
                    f.space.part(f.vec_of[n], "e", ix),
                    ix,
                )
            })
            .collect()
    }

    /// Writes the indices of the linear index `e` that the used inputs' loads and the live
    /// index instructions read.
    pub(super) fn decompose_for_loads(&self, src: &mut Src, f: &Flat, used: &[bool]) {
        let mut need = vec![false; f.space.groups.len()];
        for (n, &u) in used.iter().enumerate() {
            if u {
                f.space.need(f.vec_of[n], &mut need);
            }
        }
        f.space.need_pinned(&self.pinned, &mut need);
        f.space.decompose(src, "e", self.ix, &need);
    }

    /// The axes `(a, d)` of a transposing elementwise kernel worth tiling: `d` is the
    /// innermost axis of size > 1 (along which outputs are contiguous), and some live load
    /// is contiguous along `a` instead (stride 1 there, another stride along `d`), so that no
    /// mapping of threads reads it and writes the outputs coalesced.
    pub(super) fn transpose_axes(&self, used: &[bool]) -> Option<(usize, usize)> {
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
}
