//! Index spaces: a linear index over some of the domain's axes, split into per-axis indices only
//! where an address needs them. Every strategy addresses memory through these, so that merged
//! axes and literal strides are decided in one place.

use crate::cuda::{Ix, Src};

/// `a + b` of two optional index terms ("0" when both are absent).
pub(super) fn join(a: Option<String>, b: Option<String>, ix: Ix) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{a} + {b}"),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => ix.lit(0),
    }
}

/// Consecutive axes of one index space merged into one where every stride vector composes
/// across them (so one index along the merged axis addresses all of them).
pub(super) struct Group {
    /// The outermost original axis: names the index variable `i{axis}`.
    pub(super) axis: usize,
    pub(super) axes: Vec<usize>,
    pub(super) dim: usize,
    /// Per stride vector: the stride of the innermost axis.
    pub(super) strides: Vec<usize>,
    pub(super) pinned: bool,
}

/// A row-major index space over some of the domain's axes (those of size 1 dropped), indexed by
/// one linear variable.
pub(super) struct Space {
    /// Outer to inner.
    pub(super) groups: Vec<Group>,
}

impl Space {
    pub(super) fn new(
        axes: &[usize],
        dims: &[usize],
        vectors: &[Vec<usize>],
        pinned: &[bool],
    ) -> Space {
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
    pub(super) fn linear(&self, k: usize) -> Option<usize> {
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
    pub(super) fn part(&self, k: usize, lin: &str, ix: Ix) -> Option<String> {
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
    pub(super) fn need(&self, k: usize, need: &mut [bool]) {
        if self.linear(k).is_some() {
            return;
        }
        for (g, n) in self.groups.iter().zip(need.iter_mut()) {
            if g.strides[k] != 0 {
                *n = true;
            }
        }
    }

    pub(super) fn need_pinned(&self, pinned: &[bool], need: &mut [bool]) {
        for (g, n) in self.groups.iter().zip(need.iter_mut()) {
            if g.axes.iter().any(|&a| pinned[a]) {
                *n = true;
            }
        }
    }

    pub(super) fn need_axis(&self, axis: usize, need: &mut [bool]) {
        for (g, n) in self.groups.iter().zip(need.iter_mut()) {
            if g.axes.contains(&axis) {
                *n = true;
            }
        }
    }

    /// The index along domain axis `d` (an axis of size 1, or one outside this space, is 0).
    pub(super) fn axis_var(&self, d: usize, ix: Ix) -> String {
        match self.groups.iter().find(|g| g.axes.contains(&d)) {
            // A pinned axis is alone in its group.
            Some(g) => format!("i{}", g.axis),
            None => ix.lit(0),
        }
    }

    /// Writes `const T i{axis} = ...;` for every needed group, from the linear index `lin`.
    pub(super) fn decompose(&self, src: &mut Src, lin: &str, ix: Ix, need: &[bool]) {
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
