//! Index maps: how a kernel's domain indices reach the elements of a value it computes inline.
//!
//! Inside a fused kernel every value is evaluated at domain index `i`. A view op between the
//! kernel's root and a value changes which element of that value is meant: a transpose permutes
//! coordinates, a broadcast pins them to 0, a slice shifts them, a reshape re-splits them. Each
//! value is therefore evaluated under a [`Map`], and a map that reaches a buffer becomes that
//! input's affine [`Access`]. View ops never cost memory or a kernel this way.

use ingot_kernels::fused::Access;
use smallvec::SmallVec;

/// An affine function of the domain index: `offset + Σ coef · i[axis]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Affine {
    pub offset: usize,
    /// `(domain axis, coefficient)`, sorted by axis, coefficients nonzero.
    pub terms: SmallVec<[(usize, usize); 2]>,
}

impl Affine {
    fn constant(offset: usize) -> Affine {
        Affine {
            offset,
            terms: SmallVec::new(),
        }
    }

    fn axis(a: usize) -> Affine {
        Affine {
            offset: 0,
            terms: smallvec::smallvec![(a, 1)],
        }
    }

    fn scaled(&self, k: usize) -> Affine {
        Affine {
            offset: self.offset * k,
            terms: self
                .terms
                .iter()
                .filter(|_| k != 0)
                .map(|&(a, c)| (a, c * k))
                .collect(),
        }
    }

    fn plus(&self, other: &Affine) -> Affine {
        let mut terms = self.terms.clone();
        for &(a, c) in &other.terms {
            match terms.iter_mut().find(|(b, _)| *b == a) {
                Some(t) => t.1 += c,
                None => terms.push((a, c)),
            }
        }
        terms.sort();
        Affine {
            offset: self.offset + other.offset,
            terms,
        }
    }
}

/// Which element of a value (shaped `dims`) a domain index means.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Map {
    /// One affine coordinate per axis of the value.
    Coords(SmallVec<[Affine; 4]>),
    /// Only the value's row-major linear index is affine (after a reshape that splits an
    /// axis): enough to load a contiguous buffer, not to take further views.
    Linear(Affine),
    /// After a reshape that splits some axes: the row-major linear index is affine, and so is
    /// the coordinate of every axis that was not split (`None`: a split axis, whose coordinate
    /// is a division and a remainder). Enough to load a contiguous buffer, and to see through a
    /// broadcast that pins every split axis (a LayerNorm gain `[d]` broadcast to `[b, t, d]`
    /// and read as `[b·t, d]` by the linear layer after it), which then needs no buffer.
    ///
    /// `groups` holds each split group of axes (`start..end`) with its row-major index within
    /// the group, which is affine: a broadcast that keeps a whole group (a row statistic
    /// `[b, t, 1]` broadcast to `[b, t, d]` and read as `[b·t, d]`) is seen through too.
    Split {
        linear: Affine,
        coords: SmallVec<[Option<Affine>; 4]>,
        groups: Vec<(usize, usize, Affine)>,
    },
}

fn row_major(dims: &[usize]) -> SmallVec<[usize; 4]> {
    let mut s: SmallVec<[usize; 4]> = smallvec::smallvec![0; dims.len()];
    let mut k = 1;
    for d in (0..dims.len()).rev() {
        s[d] = k;
        k *= dims[d];
    }
    s
}

impl Map {
    /// The identity on a domain of rank `rank`.
    pub fn identity(rank: usize) -> Map {
        Map::Coords((0..rank).map(Affine::axis).collect())
    }

    /// True if this is the identity on a domain of `rank` axes.
    pub fn is_identity(&self, rank: usize) -> bool {
        *self == Map::identity(rank)
    }

    /// The row-major linear index of the value's element, as an affine function.
    pub fn linear(&self, dims: &[usize]) -> Affine {
        match self {
            Map::Linear(l) | Map::Split { linear: l, .. } => l.clone(),
            Map::Coords(c) => {
                let rm = row_major(dims);
                c.iter()
                    .zip(&rm)
                    .fold(Affine::constant(0), |acc, (x, &s)| acc.plus(&x.scaled(s)))
            }
        }
    }

    /// The access of a contiguous buffer shaped `dims` under this map, for a domain of
    /// `rank` axes.
    pub fn access(&self, dims: &[usize], rank: usize) -> Access {
        let l = self.linear(dims);
        let mut strides = vec![0; rank];
        for &(a, c) in &l.terms {
            strides[a] = c;
        }
        Access {
            offset: l.offset,
            strides,
        }
    }

    /// The map of a broadcast's operand (shaped `src`, right-aligned to `dst`).
    pub fn through_broadcast(&self, src: &[usize], dst: &[usize]) -> Option<Map> {
        if let Map::Split { coords, groups, .. } = self {
            if src != dst && !groups.is_empty() {
                return Self::split_through_broadcast(coords, groups, src, dst);
            }
        }
        let c: SmallVec<[Option<Affine>; 4]> = match self {
            Map::Coords(c) => c.iter().cloned().map(Some).collect(),
            Map::Split { coords, .. } if src != dst => coords.clone(),
            _ => return (src == dst).then(|| self.clone()),
        };
        let lead = dst.len() - src.len();
        src.iter()
            .enumerate()
            .map(|(a, &d)| {
                if d == 1 && dst[a + lead] != 1 {
                    Some(Affine::constant(0))
                } else {
                    c[a + lead].clone()
                }
            })
            .collect::<Option<_>>()
            .map(Map::Coords)
    }

    /// [`Map::through_broadcast`] of a split map: every split group must be pinned whole (its
    /// coordinates are 0) or kept whole (the operand has the same group, with the same index).
    fn split_through_broadcast(
        coords: &[Option<Affine>],
        groups: &[(usize, usize, Affine)],
        src: &[usize],
        dst: &[usize],
    ) -> Option<Map> {
        let lead = dst.len() - src.len();
        let pinned = |a: usize| a < lead || (src[a - lead] == 1 && dst[a] != 1);
        let mut out: SmallVec<[Option<Affine>; 4]> = (0..src.len())
            .map(|a| {
                if pinned(a + lead) {
                    Some(Affine::constant(0))
                } else {
                    coords[a + lead].clone()
                }
            })
            .collect();
        let mut kept: Vec<(usize, usize, Affine)> = Vec::new();
        for (start, end, index) in groups {
            if (*start..*end).all(pinned) {
                continue;
            }
            if !(*start..*end).all(|a| a >= lead && src[a - lead] == dst[a]) {
                return None;
            }
            for c in &mut out[start - lead..end - lead] {
                *c = None;
            }
            kept.push((start - lead, end - lead, index.clone()));
        }
        if kept.is_empty() {
            return out.into_iter().collect::<Option<_>>().map(Map::Coords);
        }
        // Every axis outside the kept groups needs its coordinate; the linear index is theirs
        // and each group's index, at the stride of the group's last axis.
        let rm = row_major(src);
        let mut linear = Affine::constant(0);
        for (a, c) in out.iter().enumerate() {
            if kept.iter().any(|(s, e, _)| (*s..*e).contains(&a)) {
                continue;
            }
            linear = linear.plus(&c.as_ref()?.scaled(rm[a]));
        }
        for (_, end, index) in &kept {
            linear = linear.plus(&index.scaled(rm[end - 1]));
        }
        Some(Map::Split {
            linear,
            coords: out,
            groups: kept,
        })
    }

    /// The map of a transpose's operand: output axis `i` is operand axis `perm[i]`.
    pub fn through_transpose(&self, perm: &[usize]) -> Option<Map> {
        let Map::Coords(c) = self else { return None };
        let mut out: SmallVec<[Affine; 4]> = smallvec::smallvec![Affine::constant(0); perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            out[p] = c[i].clone();
        }
        Some(Map::Coords(out))
    }

    /// The map of a slice's operand.
    pub fn through_slice(&self, axis: usize, start: usize) -> Option<Map> {
        let Map::Coords(c) = self else { return None };
        let mut out = c.clone();
        out[axis] = out[axis].plus(&Affine::constant(start));
        Some(Map::Coords(out))
    }

    /// The map of a reshape's operand (shaped `src`; the reshape gives `dst`). Axes that the
    /// reshape only merges keep affine coordinates; axes it splits lose theirs
    /// ([`Map::Split`]); where the shapes do not pair up at all, only the linear index stays.
    pub fn through_reshape(&self, src: &[usize], dst: &[usize]) -> Map {
        if src == dst {
            return self.clone();
        }
        let c = match self {
            Map::Coords(c) => c,
            // A reshape keeps the row-major order, so the linear index passes through.
            Map::Linear(l) | Map::Split { linear: l, .. } => return Map::Linear(l.clone()),
        };
        // Walk both shapes, pairing groups of axes with equal products (size-1 axes join
        // whichever group is open). A group with one source axis and any number of
        // destination axes is a merge: the source coordinate is affine in the destination's.
        let mut out: SmallVec<[Option<Affine>; 4]> = SmallVec::new();
        let mut groups: Vec<(usize, usize, Affine)> = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < src.len() || j < dst.len() {
            let (si, dj) = (i, j);
            let (mut ps, mut pd) = (1usize, 1usize);
            if i < src.len() {
                ps *= src[i];
                i += 1;
            }
            if j < dst.len() {
                pd *= dst[j];
                j += 1;
            }
            while ps != pd {
                if ps < pd && i < src.len() {
                    ps *= src[i];
                    i += 1;
                } else if j < dst.len() {
                    pd *= dst[j];
                    j += 1;
                } else {
                    return Map::Linear(self.linear(dst));
                }
            }
            let src_axes = si..i;
            let dst_axes = dj..j;
            let real_src: Vec<usize> = src_axes.clone().filter(|&a| src[a] != 1).collect();
            // The group's row-major index, the same on both sides of the reshape.
            let rm = row_major(&dst[dst_axes.clone()]);
            let merged = dst_axes
                .clone()
                .zip(&rm)
                .fold(Affine::constant(0), |acc, (b, &s)| {
                    acc.plus(&c[b].scaled(s))
                });
            if real_src.len() > 1 {
                // A split: each real source axis's coordinate is a division and a remainder.
                groups.push((src_axes.start, src_axes.end, merged));
                out.extend(src_axes.map(|a| (src[a] == 1).then(|| Affine::constant(0))));
                continue;
            }
            for a in src_axes {
                out.push(Some(if src[a] == 1 {
                    Affine::constant(0)
                } else {
                    merged.clone()
                }));
            }
        }
        match out
            .iter()
            .cloned()
            .collect::<Option<SmallVec<[Affine; 4]>>>()
        {
            Some(c) => Map::Coords(c),
            None => Map::Split {
                linear: self.linear(dst),
                coords: out,
                groups,
            },
        }
    }

    /// The coordinate along `axis`, if the map has coordinates.
    pub fn coord(&self, axis: usize) -> Option<&Affine> {
        match self {
            Map::Coords(c) => c.get(axis),
            Map::Split { coords, .. } => coords.get(axis).and_then(Option::as_ref),
            Map::Linear(_) => None,
        }
    }
}

/// Checks, independently of the kernel's own [`ingot_kernels::FusedKernel::check`] and of the
/// lengths it declares, that every load of every fused kernel of `g` stays inside the value it
/// reads, for every index of the kernel's domain (and, for a load that is the same along every
/// reduce axis, for every row, since row-level values are computed per row even where a reduce
/// axis has size 0). Accesses are affine with nonnegative strides, so the largest element read
/// is at the domain's last corner: `offset + Σ strides[d]·(domain[d] − 1)`, computed in `u128`.
///
/// Run on every fused step before it is planned, so that a wrong index map is refused at
/// compile time, naming the kernel, never becomes an out-of-bounds read at the first step.
pub fn check_loads(g: &crate::ir::Graph) -> Result<(), crate::error::IrError> {
    for id in g.ids() {
        let n = g.node(id);
        let crate::ir::Op::Fused(k) = &n.op else {
            continue;
        };
        let sizes: Vec<usize> = n.inputs.iter().map(|&x| g.ty(x).shape.numel()).collect();
        kernel_loads_fit(k, &sizes).map_err(|reason| {
            crate::error::IrError::Invalid(format!(
                "fused kernel {id} (domain {:?}, reduce axes {:?}) {reason}: a bug in fusion's \
                 index maps; please report it with the model",
                k.domain, k.reduce_axes
            ))
        })?;
    }
    Ok(())
}

/// [`check_loads`] for one kernel whose input `n` is a value of `sizes[n]` elements.
pub fn kernel_loads_fit(k: &ingot_kernels::FusedKernel, sizes: &[usize]) -> Result<(), String> {
    if sizes.len() != k.inputs.len() {
        return Err(format!(
            "has {} inputs but is given {} values",
            k.inputs.len(),
            sizes.len()
        ));
    }
    let rank = k.domain.len();
    let empty = |skip_reduce: bool| {
        k.domain
            .iter()
            .enumerate()
            .any(|(d, &n)| n == 0 && !(skip_reduce && k.reduce_axes.contains(&d)))
    };
    for (i, (inp, &size)) in k.inputs.iter().zip(sizes).enumerate() {
        let s = &inp.access.strides;
        if s.len() != rank {
            return Err(format!(
                "input {i} has {} strides for a rank-{rank} domain",
                s.len()
            ));
        }
        let row_level = k.reduce_axes.iter().all(|&a| s.get(a) == Some(&0));
        // Read at all: some index of the domain exists (or, for a row-level load, some row).
        let read = !empty(false) || (row_level && !empty(true));
        if !read {
            continue;
        }
        let reach = k
            .domain
            .iter()
            .zip(s)
            .fold(inp.access.offset as u128, |r, (&n, &st)| {
                r + (n.saturating_sub(1) as u128) * st as u128
            });
        if reach >= size as u128 {
            return Err(format!(
                "input {i} reads element {reach} of a value of {size} elements (offset {}, \
                 strides {s:?})",
                inp.access.offset
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(
        domain: Vec<usize>,
        offset: usize,
        strides: Vec<usize>,
    ) -> ingot_kernels::FusedKernel {
        use ingot_kernels::fused::{Input, Inst, Output};
        ingot_kernels::FusedKernel {
            reduce_axes: vec![],
            inputs: vec![Input {
                dtype: ingot_kernels::DType::F32,
                len: 24,
                access: Access { offset, strides },
            }],
            body: vec![Inst::Load { input: 0 }],
            outputs: vec![Output { value: 0 }],
            domain,
        }
    }

    #[test]
    fn a_load_past_its_value_is_refused_and_one_inside_is_not() {
        // The slice of the issue: [4, 1, 2] of a [4, 3, 2] value at offset 4.
        let k = kernel(vec![4, 1, 2], 4, vec![6, 2, 1]);
        assert_eq!(kernel_loads_fit(&k, &[24]), Ok(()));
        // The same access on a value of 23 elements reads element 23.
        let e = kernel_loads_fit(&k, &[23]).unwrap_err();
        assert!(
            e.contains("input 0 reads element 23 of a value of 23"),
            "{e}"
        );
        // An empty domain reads nothing.
        assert_eq!(
            kernel_loads_fit(&kernel(vec![4, 0, 2], 99, vec![6, 2, 1]), &[1]),
            Ok(())
        );
    }

    #[test]
    fn every_kernel_of_the_reference_models_loads_inside_its_inputs() {
        for m in ["mlp", "gpt-mini"] {
            let c = crate::models::compile_model(m, &Default::default()).unwrap();
            check_loads(&c.graph).unwrap();
        }
    }

    #[test]
    fn a_transposed_broadcast_load_gets_permuted_and_zero_strides() {
        // out [4, 3] = transpose(broadcast(x [3, 1] -> [3, 4]))
        let m = Map::identity(2);
        let t = m.through_transpose(&[1, 0]).unwrap();
        let b = t.through_broadcast(&[3, 1], &[3, 4]).unwrap();
        assert_eq!(
            b.access(&[3, 1], 2),
            Access {
                offset: 0,
                strides: vec![0, 1]
            }
        );
    }

    #[test]
    fn a_merging_reshape_keeps_coordinates_and_a_splitting_one_goes_linear() {
        // [2, 3, 4] viewed as [6, 4]: operand coordinates from [6, 4] need a split -> linear.
        let m = Map::identity(2);
        let split = m.through_reshape(&[2, 3, 4], &[6, 4]);
        assert!(matches!(split, Map::Split { .. }));
        assert_eq!(
            split.coord(2),
            Some(&Affine::axis(1)),
            "the unsplit axis keeps its coordinate"
        );
        assert_eq!(split.coord(0), None);
        assert_eq!(split.access(&[2, 3, 4], 2).strides, vec![4, 1]);
        // [6, 4] viewed as [2, 3, 4]: the operand's axis 0 is 3·i0 + i1.
        let m = Map::identity(3);
        let merge = m.through_reshape(&[6, 4], &[2, 3, 4]);
        assert_eq!(merge.access(&[6, 4], 3).strides, vec![12, 4, 1]);
        assert!(matches!(merge, Map::Coords(_)));
    }

    #[test]
    fn a_broadcast_that_pins_every_split_axis_is_read_with_zero_strides() {
        // A gain [4] broadcast to [2, 3, 4] and read as [6, 4]: the split axes are pinned.
        let m = Map::identity(2).through_reshape(&[2, 3, 4], &[6, 4]);
        let b = m.through_broadcast(&[4], &[2, 3, 4]).unwrap();
        assert_eq!(b.access(&[4], 2).strides, vec![0, 1]);
        // A [2, 1, 4] operand keeps the split axis 0: no affine access exists.
        assert_eq!(m.through_broadcast(&[2, 1, 4], &[2, 3, 4]), None);
        // Neither a transpose nor a slice sees through a split.
        assert_eq!(m.through_transpose(&[1, 0, 2]), None);
        assert_eq!(m.through_slice(2, 1), None);
    }

    #[test]
    fn a_broadcast_that_keeps_a_whole_split_group_is_read_through_the_groups_index() {
        // A row statistic [2, 3, 1] broadcast to [2, 3, 4] and read as [6, 4]: element
        // (r, c) of the domain is row r of the statistic, whatever (r / 3, r % 3) are.
        let m = Map::identity(2).through_reshape(&[2, 3, 4], &[6, 4]);
        let b = m.through_broadcast(&[2, 3, 1], &[2, 3, 4]).unwrap();
        let a = b.access(&[2, 3, 1], 2);
        assert_eq!((a.offset, a.strides.clone()), (0, vec![1, 0]));
        // Checked against the definition at every domain index.
        for r in 0..6 {
            for c in 0..4 {
                let (i0, i1) = (r / 3, r % 3);
                let want = i0 * 3 + i1; // row-major index of (i0, i1, 0) in [2, 3, 1]
                assert_eq!(a.offset + a.strides[0] * r + a.strides[1] * c, want);
            }
        }
        // Keeping only part of the group (a [2, 1, 1] operand) has no affine access.
        assert_eq!(m.through_broadcast(&[2, 1, 1], &[2, 3, 4]), None);
        // A [1, 3, 4] operand pins axis 0 of the group but keeps axis 1: refused too.
        assert_eq!(m.through_broadcast(&[3, 4], &[2, 3, 4]), None);
    }

    #[test]
    fn a_slice_offsets_the_access() {
        let m = Map::identity(2).through_slice(1, 5).unwrap();
        let a = m.access(&[3, 16], 2);
        assert_eq!(a.offset, 5);
        assert_eq!(a.strides, vec![16, 1]);
    }
}
