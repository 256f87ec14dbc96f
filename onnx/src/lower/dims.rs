//! The shape arithmetic that lowering and constant folding share: axes counted from the end,
//! and the result dims of Reshape, Squeeze, Transpose, Expand and Split from their input dims
//! and attributes. Pure functions of numbers (what a Slice keeps needs the graph's constants:
//! `Lower::slice_picks`).

use crate::attrs::Attrs;
use crate::value::broadcast_dims;

/// The lowering's result (`super::R`): an error is the message naming what is wrong.
type R<T> = std::result::Result<T, String>;

/// `axis` counted from the end where negative, checked against `rank`.
pub(super) fn norm_axis(axis: i64, rank: usize) -> R<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a as usize >= rank.max(1) && !(rank == 0 && a == 0) {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(a as usize)
}

/// Every axis of `axes` normalized ([`norm_axis`]), sorted, none repeated.
pub(super) fn norm_axes(axes: &[i64], rank: usize) -> R<Vec<usize>> {
    let mut out: Vec<usize> = axes.iter().map(|&a| norm_axis(a, rank)).collect::<R<_>>()?;
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("axes {axes:?} repeat an axis"));
    }
    Ok(out)
}

/// Reshape's target: `0` keeps the input's size (allowzero=0), `-1` takes what is left.
pub fn reshape_dims(input: &[usize], spec: &[i64]) -> R<Vec<usize>> {
    let total: usize = input.iter().product();
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            0 => out.push(*input.get(i).ok_or_else(|| {
                format!("shape {spec:?}: 0 at axis {i} copies an axis the input {input:?} lacks")
            })?),
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            s if s > 0 => out.push(s as usize),
            _ => return Err(format!("shape {spec:?} is not a valid Reshape target")),
        }
    }
    if let Some(i) = infer {
        let known: usize = out.iter().product();
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!("cannot reshape {input:?} to {spec:?}"));
        }
        out[i] = total / known;
    }
    if out.iter().product::<usize>() != total {
        return Err(format!(
            "cannot reshape {input:?} ({total} elements) to {spec:?}"
        ));
    }
    Ok(out)
}

pub(super) fn squeeze_dims(op: &str, d: &[usize], axes: Option<&[i64]>) -> R<Vec<usize>> {
    if op == "Squeeze" {
        let axes = match axes {
            Some(a) => norm_axes(a, d.len())?,
            None => (0..d.len()).filter(|&i| d[i] == 1).collect(),
        };
        if let Some(&a) = axes.iter().find(|&&a| d[a] != 1) {
            return Err(format!("cannot squeeze axis {a} of size {}", d[a]));
        }
        Ok(d.iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &s)| s)
            .collect())
    } else {
        let axes = axes.ok_or("needs axes")?;
        let r = d.len() + axes.len();
        let axes = norm_axes(axes, r)?;
        let mut it = d.iter();
        Ok((0..r)
            .map(|i| {
                if axes.contains(&i) {
                    1
                } else {
                    *it.next().unwrap_or(&1)
                }
            })
            .collect())
    }
}

pub(super) fn transpose_perm(perm: Option<Vec<i64>>, r: usize) -> R<Vec<usize>> {
    match perm {
        None => Ok((0..r).rev().collect()),
        Some(p) => {
            let p: Vec<usize> = p.iter().map(|&a| norm_axis(a, r)).collect::<R<_>>()?;
            let mut s = p.clone();
            s.sort_unstable();
            if s != (0..r).collect::<Vec<_>>() {
                return Err(format!("perm {p:?} is not a permutation of {r} axes"));
            }
            Ok(p)
        }
    }
}

pub(super) fn expand_dims(d: &[usize], shape: &[i64]) -> R<Vec<usize>> {
    if shape.iter().any(|&s| s < 0) {
        return Err(format!("shape {shape:?} has a negative size"));
    }
    let s: Vec<usize> = shape.iter().map(|&x| x as usize).collect();
    broadcast_dims(d, &s).ok_or_else(|| format!("{d:?} does not broadcast to {shape:?}"))
}

pub(super) fn split_sizes(
    split: Option<Vec<i64>>,
    at: &Attrs,
    outputs: usize,
    size: usize,
) -> R<Vec<usize>> {
    let split = split.or_else(|| at.ints("split"));
    if let Some(s) = split {
        if s.iter().any(|&x| x < 0) || s.iter().sum::<i64>() as usize != size {
            return Err(format!(
                "split {s:?} does not add up to the axis size {size}"
            ));
        }
        return Ok(s.iter().map(|&x| x as usize).collect());
    }
    let parts = if at.has("num_outputs") {
        at.int("num_outputs", 1) as usize
    } else {
        outputs
    };
    if parts == 0 {
        return Err("splits into no parts".into());
    }
    let chunk = size.div_ceil(parts);
    Ok((0..parts)
        .map(|i| chunk.min(size.saturating_sub(i * chunk)))
        .collect())
}
