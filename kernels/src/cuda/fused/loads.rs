//! The loads stage of a reduction: where each load reads (the index spaces of the row and
//! reduce axes, each input's base at the row) and the register cache of the loads several
//! loops read.

use super::passes::Passes;
use super::space::{join, Space};
use super::Analysis;
use crate::cuda::guard::Guard;
use crate::cuda::{reg_type, CodegenError, Ix, Src};
use crate::fused::{Access, Inst};

/// The most registers a thread gives the output loop's prefetched loads
/// ([`Analysis::prefetched_loads`]).
pub(super) const PREFETCH_WORDS: usize = 16;

/// Where a reduction's loads read: the index space of the row axes (indexed by `row`) and of the
/// reduce axes (by `j`), over the stride vectors of the inputs the kernel reads and of the
/// outputs (contiguous). Along the reduce axes only full loads and full outputs have nonzero
/// strides; the others are 0 there and merge with anything.
pub(super) struct Spaces {
    ix: Ix,
    red_axis: Vec<bool>,
    /// Inputs that some emitted instruction loads.
    pub(super) used: Vec<bool>,
    /// Inputs that the loops over the row load (per element).
    pub(super) full_used: Vec<bool>,
    /// Input `m`'s stride vector in the spaces (`usize::MAX` where not used).
    pub(super) vec_of: Vec<usize>,
    /// The outputs' stride vector.
    pub(super) out_vec: usize,
    pub(super) row: Space,
    pub(super) red: Space,
}

impl Spaces {
    /// The index along domain axis `d` in row-level code (0 along the reduce axes).
    pub(super) fn row_axis(&self, d: usize) -> String {
        self.row.axis_var(d, self.ix)
    }

    /// The index along domain axis `d` inside a loop over the row.
    pub(super) fn any_axis(&self, d: usize) -> String {
        if self.red_axis[d] {
            self.red.axis_var(d, self.ix)
        } else {
            self.row.axis_var(d, self.ix)
        }
    }
}

/// The element indices the loads read at, once the row's bases are written: `row[m]` for
/// row-level loads of input `m` (its base), `full[m]` inside the loops over the row (its base
/// plus its term along the reduce axes), and the full outputs' base (`None` when 0).
pub(super) struct Addresses {
    pub(super) row: Vec<String>,
    pub(super) full: Vec<String>,
    pub(super) out_base: Option<String>,
}

impl Analysis<'_> {
    /// The index spaces of a reduction's loads (see [`Spaces`]).
    pub(super) fn spaces(&self, p: &Passes) -> Spaces {
        let k = self.k;
        let rank = k.domain.len();
        let row_axes: Vec<usize> = (0..rank).filter(|&d| !self.red_axis[d]).collect();
        let used = self.loaded_inputs(|i| p.needed[i] || p.emitted_full[i]);
        let full_used = self.loaded_inputs(|i| p.emitted_full[i]);
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
        let row = Space::new(&row_axes, &k.domain, &vectors, &self.pinned);
        let red = Space::new(&k.reduce_axes, &k.domain, &vectors, &self.pinned);
        Spaces {
            ix: self.ix,
            red_axis: self.red_axis.clone(),
            used,
            full_used,
            vec_of,
            out_vec,
            row,
            red,
        }
    }

    /// Per row: writes the row indices the loads, the full outputs and the row-level index
    /// instructions need, and each input's base at the row (`b{m}`, once a row rather than
    /// once an element; the outputs' is `bo`); returns the addresses built on them.
    pub(super) fn row_addresses(&self, src: &mut Src, p: &Passes, sp: &Spaces) -> Addresses {
        let (k, ix) = (self.k, self.ix);
        let t = ix.ty();
        let mut need = vec![false; sp.row.groups.len()];
        for (m, &u) in sp.used.iter().enumerate() {
            if u {
                sp.row.need(sp.vec_of[m], &mut need);
            }
        }
        if p.full_outputs {
            sp.row.need(sp.out_vec, &mut need);
        }
        for (inst, _) in k.body.iter().zip(&p.needed).filter(|(_, &n)| n) {
            if let Inst::Index { axis, .. } = *inst {
                sp.row.need_axis(axis, &mut need);
            }
        }
        sp.row.decompose(src, "row", ix, &need);
        let mut base: Vec<Option<String>> = vec![None; k.inputs.len()];
        for (m, &u) in sp.used.iter().enumerate() {
            if !u {
                continue;
            }
            let off = k.inputs[m].access.offset;
            base[m] = match sp.row.part(sp.vec_of[m], "row", ix) {
                Some(part) => {
                    let e = join((off != 0).then(|| ix.lit(off)), Some(part), ix);
                    src.line(format!("const {t} b{m} = {e};"));
                    Some(format!("b{m}"))
                }
                None => (off != 0).then(|| ix.lit(off)),
            };
        }
        let out_base = if p.full_outputs {
            sp.row.part(sp.out_vec, "row", ix).map(|part| {
                src.line(format!("const {t} bo = {part};"));
                "bo".to_string()
            })
        } else {
            None
        };
        // Row-level values read loads at their row base only.
        let row: Vec<String> = (0..k.inputs.len())
            .map(|m| join(base[m].clone(), None, ix))
            .collect();
        let full = (0..k.inputs.len())
            .map(|m| {
                if sp.full_used[m] {
                    join(base[m].clone(), sp.red.part(sp.vec_of[m], "j", ix), ix)
                } else {
                    row[m].clone()
                }
            })
            .collect();
        Addresses {
            row,
            full,
            out_base,
        }
    }

    /// The loads kept in registers (with `cache`, see [`Analysis::layout`]): those that
    /// several loops over the row read. The first loop that reads one stores it in `c{i}[u]`,
    /// the later loops read it there.
    pub(super) fn cached_loads(&self, p: &Passes, cache: bool) -> Vec<bool> {
        (0..self.k.body.len())
            .map(|i| cache && p.loop_uses[i] >= 2)
            .collect()
    }

    /// The loads of the output loop read from memory that are read before any of its stores,
    /// into registers (`c{i}[u]`, as cached loads), by a loop of their own: with the register
    /// cache (the loops unrolled over a thread's `per_thread` elements), the unguarded loads
    /// not already in registers, while they fit in [`PREFETCH_WORDS`] registers a thread.
    ///
    /// Why: an output may be written over an input (the plan reuses a dying input's buffer),
    /// and then a load the output loop issues after a store to the same row waits for that
    /// store. Measured on an H100 (session 9): gpt2's tf32 LayerNorm backward, three of whose
    /// seven full-size values are read only by the output loop and one of whose outputs is
    /// written over such an input, took 197 µs with its loads between the stores, 63 µs with
    /// them first, and 64 µs with the output written elsewhere. Rows too long for the cache
    /// keep their plain loop: reading four elements a thread ahead of their stores made gpt2's
    /// cross-entropy kernel (rows of 50304, its gradient written over the logits) slower
    /// (1.89 ms against 1.42 ms in bf16; the step 0.25 ms slower).
    pub(super) fn prefetched_loads(
        &self,
        p: &Passes,
        cache: bool,
        cached: &[bool],
        final_guards: Option<&[Option<Guard>]>,
        per_thread: usize,
    ) -> Vec<usize> {
        let Some(g) = final_guards.filter(|_| cache) else {
            return Vec::new();
        };
        let loads: Vec<usize> = (p.final_full.iter().copied())
            .filter(|&i| matches!(self.k.body[i], Inst::Load { .. }))
            .filter(|&i| !cached[i] && g[i].is_none())
            .collect();
        if loads.is_empty() || loads.len() * per_thread > PREFETCH_WORDS {
            return Vec::new();
        }
        loads
    }

    /// Declares the register arrays of the cached and the prefetched loads, `per_thread`
    /// elements each.
    pub(super) fn declare_cache(
        &self,
        src: &mut Src,
        cached: &[bool],
        prefetched: &[usize],
        per_thread: usize,
    ) {
        for i in (0..cached.len()).filter(|&i| cached[i]) {
            let why = if prefetched.contains(&i) {
                "read before the final loop writes"
            } else {
                "kept for the later passes"
            };
            src.line(format!(
                "{} c{i}[{per_thread}]; // %{i}, {why}",
                reg_type(self.dt[i])
            ));
        }
    }

    /// The reduce-axis index groups that the instructions `insts` of one loop over the row
    /// read (and, with `outputs`, the full outputs' addresses): a cached load already read in
    /// an earlier loop (`loaded`) needs none.
    pub(super) fn loop_need(
        &self,
        sp: &Spaces,
        insts: &[usize],
        outputs: bool,
        cached: &[bool],
        loaded: &[bool],
    ) -> Vec<bool> {
        let mut need = vec![false; sp.red.groups.len()];
        for &i in insts {
            match self.k.body[i] {
                Inst::Load { .. } if cached[i] && loaded[i] => {}
                Inst::Load { input } if sp.full_used[input] => {
                    sp.red.need(sp.vec_of[input], &mut need)
                }
                Inst::Index { axis, .. } if self.red_axis[axis] => {
                    sp.red.need_axis(axis, &mut need)
                }
                _ => {}
            }
        }
        if outputs {
            sp.red.need(sp.out_vec, &mut need);
        }
        need
    }

    /// Writes full instruction `i` inside a loop over the row (`at`: the input addresses and
    /// the axis indices there): a cached load is read from memory (and kept) the first time,
    /// from its registers after that; a guarded load only where its guard holds.
    pub(super) fn emit_full(
        &self,
        src: &mut Src,
        i: usize,
        at: (&[String], &dyn Fn(usize) -> String),
        guard: Option<Guard>,
        cached: &[bool],
        loaded: &mut [bool],
    ) -> Result<(), CodegenError> {
        let ty = reg_type(self.dt[i]);
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
}
