//! The elementwise strategy: one grid-stride loop over the domain's elements, each thread
//! computing the whole body at its element. Kernels that can go four elements a thread are
//! handed to [`super::vec4`], transposing ones to [`super::tiled`]; this module holds the plain
//! loop and the choice between the three.

use super::space::{join, Space};
use super::Analysis;
use crate::cuda::guard;
use crate::cuda::{
    c_type, grid_for, signature, CodegenError, Launch, Src, BLOCK, MAX_GRID_ELEMENTWISE,
};
use crate::fused::Access;

/// Transposing elementwise kernels go through shared-memory tiles when they have at least
/// this many elements and both tile axes at least this size.
pub(super) const TILE_MIN_NUMEL: usize = 1 << 16;
pub(super) const TILE_MIN_DIM: usize = 16;

impl Analysis<'_> {
    pub(super) fn elementwise(&self) -> Result<(String, Launch), CodegenError> {
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
    pub(super) fn decompose_for_loads(
        &self,
        src: &mut Src,
        space: &Space,
        used: &[bool],
        vec_of: &[usize],
    ) {
        let mut need = vec![false; space.groups.len()];
        for (n, &u) in used.iter().enumerate() {
            if u {
                space.need(vec_of[n], &mut need);
            }
        }
        space.need_pinned(&self.pinned, &mut need);
        space.decompose(src, "e", self.ix, &need);
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
