//! The report before launch: what the step will allocate, the lower bound it is measured
//! against, and what holds the peak. Printed as a table or as a versioned JSON document.

use super::{MemoryPlan, Region};
use crate::autodiff::Phase;
use crate::ir::{Graph, LeafKind, NodeId, Op};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Version of the JSON document; bumped on any incompatible change.
pub const REPORT_VERSION: u32 = 1;

/// What a slab value is to the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// A forward value kept alive for the backward pass.
    SavedActivation,
    /// A value of the backward pass.
    Gradient,
    /// Anything else: forward values dropped in the forward pass, optimizer temporaries.
    Temporary,
    /// Scratch space of a library (cuBLAS) carved from the slab.
    Workspace,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResidentBytes {
    pub parameters: usize,
    pub optimizer_state: usize,
    pub inputs: usize,
}

/// One buffer live at the peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakBuffer {
    pub node: u32,
    pub op: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: usize,
    pub kind: BufferKind,
    pub lifetime: [usize; 2],
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KindBytes {
    pub saved_activation: usize,
    pub gradient: usize,
    pub temporary: usize,
    pub workspace: usize,
}

/// The report: everything a user needs to know before launching a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub version: u32,
    pub model: String,
    /// The precision the step was compiled in (`f32`, `tf32`, `bf16`); each buffer's own dtype
    /// is in its row.
    #[serde(default)]
    pub precision: crate::precision::Precision,
    pub ops: usize,
    /// Kernel launches per step: every node but leaves, views and fused kernels' extra results.
    pub kernels: usize,
    pub schedule: String,
    pub total_bytes: usize,
    pub resident_bytes: usize,
    pub resident: ResidentBytes,
    pub slab_bytes: usize,
    pub lower_bound_bytes: usize,
    /// slab / LOAD: 1.0 is a perfect packing.
    pub slab_over_lower_bound: f64,
    pub peak_position: usize,
    /// Op running at the peak.
    pub peak_op: String,
    /// Live slab bytes at the peak, by kind.
    pub peak_by_kind: KindBytes,
    /// The largest buffers live at the peak, largest first.
    pub peak_buffers: Vec<PeakBuffer>,
    /// Values that write over a dying operand instead of taking new bytes.
    pub in_place_ops: usize,
    /// Slab storages (after in-place sharing).
    pub slab_buffers: usize,
}

/// True for nodes that run a kernel when the step executes.
pub fn launches(g: &Graph, id: NodeId) -> bool {
    let op = &g.node(id).op;
    !(op.is_leaf() || op.is_alias() || matches!(op, Op::Result { .. }))
}

/// How many of the largest peak buffers a report lists.
pub const PEAK_BUFFERS_LISTED: usize = 8;

impl Report {
    pub fn new(model: &str, g: &Graph, plan: &MemoryPlan, phases: Option<&[Phase]>) -> Report {
        let lv = &plan.liveness;
        let mut resident = ResidentBytes {
            parameters: 0,
            optimizer_state: 0,
            inputs: 0,
        };
        for id in g.ids() {
            if let Op::Leaf { kind, .. } = &g.node(id).op {
                let b = super::align_up(g.ty(id).bytes());
                match kind {
                    LeafKind::Parameter => resident.parameters += b,
                    LeafKind::State => resident.optimizer_state += b,
                    LeafKind::Input => resident.inputs += b,
                }
            }
        }
        // The schedule position after which no forward op runs.
        let forward_end = phases.map_or(0, |ph| {
            g.ids()
                .filter(|id| ph[id.index()] == Phase::Forward && !g.node(*id).op.is_leaf())
                .map(|id| lv.position[id.index()])
                .max()
                .unwrap_or(0)
        });
        let kind_of = |owner: NodeId, end: usize| -> BufferKind {
            match phases {
                Some(ph) if ph[owner.index()] == Phase::Backward => BufferKind::Gradient,
                Some(ph) if ph[owner.index()] == Phase::Forward => {
                    if end > forward_end + 1 {
                        BufferKind::SavedActivation
                    } else {
                        BufferKind::Temporary
                    }
                }
                _ => BufferKind::Temporary,
            }
        };
        let t = plan.peak_position;
        let mut live: Vec<PeakBuffer> = Vec::new();
        let mut by_kind = KindBytes {
            saved_activation: 0,
            gradient: 0,
            temporary: 0,
            workspace: 0,
        };
        for s in lv
            .storages
            .iter()
            .filter(|s| s.region == Region::Slab && s.start <= t && t < s.end.max(s.start + 1))
        {
            let kind = if s.workspace {
                BufferKind::Workspace
            } else {
                kind_of(s.owner, s.end)
            };
            match kind {
                BufferKind::SavedActivation => by_kind.saved_activation += s.bytes,
                BufferKind::Gradient => by_kind.gradient += s.bytes,
                BufferKind::Temporary => by_kind.temporary += s.bytes,
                BufferKind::Workspace => by_kind.workspace += s.bytes,
            }
            let ty = g.ty(s.owner);
            live.push(PeakBuffer {
                node: s.owner.0,
                op: g.node(s.owner).op.name().to_string(),
                dtype: ty.dtype.to_string(),
                shape: ty.shape.dims().to_vec(),
                bytes: s.bytes,
                kind,
                lifetime: [s.start, s.end],
            });
        }
        live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.node.cmp(&b.node)));
        live.truncate(PEAK_BUFFERS_LISTED);
        let peak_op = lv
            .order
            .get(t)
            .map(|&id| format!("{id} {}", g.node(id).op.name()))
            .unwrap_or_default();
        let in_place_ops = g
            .ids()
            .filter(|&id| {
                let n = g.node(id);
                !n.op.is_leaf()
                    && !n.op.is_alias()
                    && lv.storages[lv.storage_of[id.index()]].owner != id
            })
            .count();
        Report {
            precision: Default::default(),
            version: REPORT_VERSION,
            model: model.to_string(),
            ops: g.len(),
            kernels: g.ids().filter(|&id| launches(g, id)).count(),
            schedule: format!("{:?}", plan.strategy),
            total_bytes: plan.total_bytes,
            resident_bytes: plan.resident_bytes,
            resident,
            slab_bytes: plan.slab_bytes,
            lower_bound_bytes: plan.load_bytes,
            slab_over_lower_bound: if plan.load_bytes == 0 {
                1.0
            } else {
                plan.slab_bytes as f64 / plan.load_bytes as f64
            },
            peak_position: t,
            peak_op,
            peak_by_kind: by_kind,
            peak_buffers: live,
            in_place_ops,
            slab_buffers: lv
                .storages
                .iter()
                .filter(|s| s.region == Region::Slab)
                .count(),
        }
    }

    /// The report as a plain-text table.
    pub fn table(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "memory plan for {} in {} ({} ops, {} kernels, {} schedule)",
            self.model, self.precision, self.ops, self.kernels, self.schedule
        );
        let row = |o: &mut String, k: &str, v: usize| {
            let _ = writeln!(o, "  {k:<34} {:>16}  {}", v, human(v));
        };
        row(&mut o, "total (one allocation)", self.total_bytes);
        row(&mut o, "resident", self.resident_bytes);
        row(&mut o, "  parameters", self.resident.parameters);
        row(&mut o, "  optimizer state", self.resident.optimizer_state);
        row(&mut o, "  inputs", self.resident.inputs);
        row(&mut o, "slab", self.slab_bytes);
        row(&mut o, "lower bound (LOAD)", self.lower_bound_bytes);
        let _ = writeln!(
            o,
            "  {:<34} {:>16.4}",
            "slab / LOAD", self.slab_over_lower_bound
        );
        let _ = writeln!(
            o,
            "peak at schedule position {} ({}), live slab bytes by kind:",
            self.peak_position, self.peak_op
        );
        row(
            &mut o,
            "  saved activations",
            self.peak_by_kind.saved_activation,
        );
        row(&mut o, "  gradients", self.peak_by_kind.gradient);
        row(&mut o, "  temporaries", self.peak_by_kind.temporary);
        row(&mut o, "  workspace", self.peak_by_kind.workspace);
        let _ = writeln!(o, "largest buffers live at the peak:");
        for b in &self.peak_buffers {
            let shape = b
                .shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let kind = format!("{:?}", b.kind);
            let _ = writeln!(
                o,
                "  %{:<6} {:<12} {}[{}] {:>14} {:<16} live [{}, {})",
                b.node,
                b.op,
                b.dtype,
                shape,
                human(b.bytes),
                kind,
                b.lifetime[0],
                b.lifetime[1]
            );
        }
        let _ = writeln!(
            o,
            "in-place ops: {}, slab buffers: {}",
            self.in_place_ops, self.slab_buffers
        );
        o
    }
}

/// Bytes in binary units with two decimals ("1.50 MiB").
pub fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Parses sizes like `16GiB`, `512MiB`, `1.5GB`, `4096`: binary units for `KiB`..`TiB`,
/// decimal for `KB`..`TB`, bytes when no unit is given.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!(
            "{s:?} is not a size: expected a number then an optional unit such as 512MiB or 16GiB"
        )
    })?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?}; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"
            ))
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > usize::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes.round() as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5 KiB"), Ok(1536));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("7b"), Ok(7));
    }

    #[test]
    fn a_size_without_a_number_or_with_an_unknown_unit_is_refused() {
        assert!(parse_size("MiB").unwrap_err().contains("not a size"));
        assert!(parse_size("3 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("").is_err());
        assert!(parse_size("1e999GiB").is_err());
    }

    #[test]
    fn human_sizes_use_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human(3 << 30), "3.00 GiB");
    }
}
