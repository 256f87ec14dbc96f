//! The report before launch: what the step will allocate, the lower bound it is measured
//! against, and what holds the peak. Printed as a table or as a versioned JSON document.
//!
//! The presentation of a plan, after [`crate::plan`] made it: [`picture`] draws the slab over
//! the schedule as one HTML page, and [`diff`] compares two reports.

mod bytes;
pub mod diff;
pub mod offload;
pub mod picture;

pub use bytes::human;
pub use offload::OffloadReport;

use crate::autodiff::Phase;
use crate::ir::{Graph, LeafKind, NodeId, Op};
use crate::plan::{MemoryPlan, Region, Storage};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Version of the JSON document; bumped on any incompatible change (2: buffers carry their
/// provenance, kinds have one spelling, resident kinds and `by_provenance` were added).
pub const REPORT_VERSION: u32 = 2;

/// What a buffer holds. One spelling everywhere (the text report, the JSON, the plan page):
/// [`BufferKind::name`], which is also its JSON form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// A trainable parameter (resident).
    Parameter,
    /// Optimizer state (resident).
    OptimizerState,
    /// A step input (resident).
    Input,
    /// A forward value kept alive past the forward pass, for the backward pass.
    SavedActivation,
    /// A value of the backward pass: a derivative.
    Gradient,
    /// Anything else: forward values that die in the forward pass, optimizer temporaries,
    /// masks and indices the backward pass computes.
    Temporary,
    /// Scratch space of a kernel or library (the CPU matmul's packing space, cuBLAS's
    /// workspace) carved from the slab.
    Workspace,
}

impl BufferKind {
    pub const ALL: [BufferKind; 7] = [
        BufferKind::Parameter,
        BufferKind::OptimizerState,
        BufferKind::Input,
        BufferKind::SavedActivation,
        BufferKind::Gradient,
        BufferKind::Temporary,
        BufferKind::Workspace,
    ];

    /// The kind's one spelling (also its JSON form).
    pub fn name(self) -> &'static str {
        match self {
            BufferKind::Parameter => "parameter",
            BufferKind::OptimizerState => "optimizer_state",
            BufferKind::Input => "input",
            BufferKind::SavedActivation => "saved_activation",
            BufferKind::Gradient => "gradient",
            BufferKind::Temporary => "temporary",
            BufferKind::Workspace => "workspace",
        }
    }
}

impl std::fmt::Display for BufferKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kind of every storage of `plan` (by storage index).
///
/// A slab value is a gradient when autodiff made it to differentiate the loss, and its
/// provenance records exactly that: every node autodiff appends is named `X (backward)`, and
/// rewriting and fusion keep the name. The data flow alone cannot tell: a value that only the
/// backward pass reads (a ReLU mask, a LayerNorm statistic a forward kernel writes beside its
/// output, an activation recomputed for the backward, `X (recomputed)`) lies outside the loss's
/// cone just as a gradient does, and was counted as one before. So: a float value whose
/// provenance is a backward one is a gradient; any other value written during the forward part
/// of the schedule and outliving it is a saved activation; everything else (the optimizer's
/// values, a value recomputed during the backward pass and dropped there) is a temporary. Where a node has no provenance (a graph built without it), a value
/// the backward pass computes after the last forward op is taken for a gradient. Without phases
/// every slab value is a temporary.
pub fn storage_kinds(g: &Graph, plan: &MemoryPlan, phases: Option<&[Phase]>) -> Vec<BufferKind> {
    let lv = &plan.liveness;
    let forward_end = forward_end(g, plan, phases);
    lv.storages
        .iter()
        .map(|s| {
            if s.workspace {
                return BufferKind::Workspace;
            }
            // A leaf's storage is its kind's, resident or (offloaded) staged in the slab.
            if s.region == Region::Resident || g.node(s.owner).op.is_leaf() {
                return match &g.node(s.owner).op {
                    Op::Leaf {
                        kind: LeafKind::Parameter,
                        ..
                    } => BufferKind::Parameter,
                    Op::Leaf {
                        kind: LeafKind::Input,
                        ..
                    } => BufferKind::Input,
                    _ => BufferKind::OptimizerState,
                };
            }
            let Some(ph) = phases else {
                return BufferKind::Temporary;
            };
            let phase = ph[s.owner.index()];
            if phase == Phase::Optimizer {
                return BufferKind::Temporary;
            }
            let derivative = match g.origin(s.owner).primary() {
                Some(p) => p.ends_with(" (backward)"),
                None => phase == Phase::Backward && s.start > forward_end,
            };
            if derivative && g.ty(s.owner).dtype.is_float() {
                BufferKind::Gradient
            } else if s.start <= forward_end && s.end > forward_end + 1 {
                BufferKind::SavedActivation
            } else {
                BufferKind::Temporary
            }
        })
        .collect()
}

/// The schedule position after which no forward op runs (0 without phases).
pub fn forward_end(g: &Graph, plan: &MemoryPlan, phases: Option<&[Phase]>) -> usize {
    phases.map_or(0, |ph| {
        g.ids()
            .filter(|id| ph[id.index()] == Phase::Forward && !g.node(*id).op.is_leaf())
            .map(|id| plan.liveness.position[id.index()])
            .max()
            .unwrap_or(0)
    })
}

/// Where storage `s` came from, in the user's words: its owner's provenance (the first source
/// of a fused kernel's), `workspace of ...` for a workspace, or the op's name when the origin
/// is unknown. Node ids are not part of it, so it survives recompiles.
pub fn storage_provenance(g: &Graph, s: &Storage) -> String {
    let base = match g.origin(s.owner).primary() {
        Some(p) => p.to_string(),
        None => g.node(s.owner).op.name().to_string(),
    };
    if s.workspace {
        format!("workspace of {base}")
    } else {
        base
    }
}

/// A buffer's type as the IR text form spells it: `f32[8,1024]`, `f32[]` for a scalar; a
/// workspace is raw bytes, `u8[N]`.
pub fn type_label(dtype: &str, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("{dtype}[{}]", dims.join(","))
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResidentBytes {
    pub parameters: usize,
    pub optimizer_state: usize,
    /// The weights' bf16 copies ([`crate::autodiff::copies`]), counted apart from the
    /// optimizer state they are leaves beside.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub weight_copies: usize,
    pub inputs: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One buffer live at the peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakBuffer {
    /// Where it came from ([`storage_provenance`]): the layer, `... (backward)`,
    /// `update of ...`, `workspace of ...`.
    #[serde(default)]
    pub provenance: String,
    /// Every source a fused kernel fused, when more than one (in order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fused: Vec<String>,
    pub node: u32,
    pub op: String,
    /// The buffer's element type; `u8` for a workspace (raw bytes).
    pub dtype: String,
    /// The buffer's shape; `[bytes]` for a workspace.
    pub shape: Vec<usize>,
    pub bytes: usize,
    pub kind: BufferKind,
    pub lifetime: [usize; 2],
}

impl PeakBuffer {
    /// `f32[8,1024]`.
    pub fn type_label(&self) -> String {
        type_label(&self.dtype, &self.shape)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KindBytes {
    pub saved_activation: usize,
    pub gradient: usize,
    pub temporary: usize,
    pub workspace: usize,
}

/// The buffers of one provenance and kind, together: what `ingot plan --diff` compares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceBytes {
    pub provenance: String,
    pub kind: BufferKind,
    /// How many storages.
    pub buffers: usize,
    /// Their bytes, summed (unaligned).
    pub bytes: usize,
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
    /// Op running at the peak (`%id name`).
    pub peak_op: String,
    /// Where the op running at the peak came from.
    #[serde(default)]
    pub peak_provenance: String,
    /// Live slab bytes at the peak, by kind.
    pub peak_by_kind: KindBytes,
    /// The largest buffers live at the peak, largest first.
    pub peak_buffers: Vec<PeakBuffer>,
    /// Values that write over a dying operand instead of taking new bytes.
    pub in_place_ops: usize,
    /// Slab storages (after in-place sharing).
    pub slab_buffers: usize,
    /// Every storage, resident and slab, grouped by provenance and kind, in order of first
    /// appearance (resident first, then by schedule position).
    #[serde(default)]
    pub by_provenance: Vec<SourceBytes>,
    /// What the plan keeps in host memory (offload), if anything: then `total_bytes` is the
    /// device's bytes and this says the host's and the copies'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadReport>,
    /// The step's model FLOPs ([`crate::flops::model`]: the forward and backward products of
    /// every micro-batch, without the products recomputed for the backward pass), counted on
    /// the graph as compiled, whose nodes still say which are recomputed copies: what a run's
    /// FLOP rate is reckoned from, kept here because the graph an executable file holds has
    /// no provenance to tell a copy from its original. `None` in a report written before it
    /// was kept (then a reader counts the graph's products, copies included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_flops: Option<u64>,
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
            weight_copies: 0,
            inputs: 0,
        };
        for id in g.ids() {
            if plan.offload.iter().any(|o| o.leaf == id) {
                // Not resident: its home is in the host region.
                continue;
            }
            if let Op::Leaf { kind, .. } = &g.node(id).op {
                let b = crate::plan::align_up(g.ty(id).bytes());
                match kind {
                    LeafKind::Parameter => resident.parameters += b,
                    LeafKind::State if crate::autodiff::copies::is_copy(g, id) => {
                        resident.weight_copies += b
                    }
                    LeafKind::State => resident.optimizer_state += b,
                    LeafKind::Input => resident.inputs += b,
                }
            }
        }
        let kinds = storage_kinds(g, plan, phases);
        let t = plan.peak_position;
        let mut live: Vec<PeakBuffer> = Vec::new();
        let mut by_kind = KindBytes {
            saved_activation: 0,
            gradient: 0,
            temporary: 0,
            workspace: 0,
        };
        for (i, s) in lv.storages.iter().enumerate() {
            if !(s.region == Region::Slab && s.start <= t && t < s.end.max(s.start + 1)) {
                continue;
            }
            let kind = kinds[i];
            match kind {
                BufferKind::SavedActivation => by_kind.saved_activation += s.bytes,
                BufferKind::Gradient => by_kind.gradient += s.bytes,
                BufferKind::Workspace => by_kind.workspace += s.bytes,
                _ => by_kind.temporary += s.bytes,
            }
            let ty = g.ty(s.owner);
            let (dtype, shape) = if s.workspace {
                ("u8".to_string(), vec![s.bytes])
            } else {
                (ty.dtype.to_string(), ty.shape.dims().to_vec())
            };
            let sources = g.origin(s.owner).sources();
            live.push(PeakBuffer {
                provenance: storage_provenance(g, s),
                fused: if sources.len() > 1 && !s.workspace {
                    sources.iter().map(|x| x.to_string()).collect()
                } else {
                    Vec::new()
                },
                node: s.owner.0,
                op: g.node(s.owner).op.name().to_string(),
                dtype,
                shape,
                bytes: s.bytes,
                kind,
                lifetime: [s.start, s.end],
            });
        }
        live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.node.cmp(&b.node)));
        live.truncate(PEAK_BUFFERS_LISTED);
        let peak_node = lv.order.get(t).copied();
        let peak_op = peak_node
            .map(|id| format!("{id} {}", g.node(id).op.name()))
            .unwrap_or_default();
        let peak_provenance = peak_node
            .and_then(|id| g.origin(id).primary().map(str::to_string))
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
            peak_provenance,
            peak_by_kind: by_kind,
            peak_buffers: live,
            in_place_ops,
            slab_buffers: lv
                .storages
                .iter()
                .filter(|s| s.region == Region::Slab)
                .count(),
            by_provenance: by_provenance(g, plan, &kinds),
            model_flops: Some(crate::flops::model(g)),
            offload: OffloadReport::of(g, plan),
        }
    }

    /// The op running at the peak: `fc2 (backward) (%29 matmul)`, provenance first.
    pub fn peak_label(&self) -> String {
        if self.peak_provenance.is_empty() {
            self.peak_op.clone()
        } else {
            format!("{} ({})", self.peak_provenance, self.peak_op)
        }
    }

    /// The report as a plain-text table.
    pub fn table(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "memory plan for {} in {} ({} ops, {} kernels, {} schedule)",
            crate::error::printable(&self.model),
            self.precision,
            self.ops,
            self.kernels,
            self.schedule
        );
        let row = |o: &mut String, k: &str, v: usize| {
            let _ = writeln!(o, "  {k:<34} {:>16}  {:>10}", v, human(v));
        };
        row(&mut o, "total (one allocation)", self.total_bytes);
        row(&mut o, "resident", self.resident_bytes);
        row(&mut o, "  parameter", self.resident.parameters);
        row(&mut o, "  optimizer_state", self.resident.optimizer_state);
        if self.resident.weight_copies > 0 {
            row(
                &mut o,
                "  weight_copies (bf16)",
                self.resident.weight_copies,
            );
        }
        row(&mut o, "  input", self.resident.inputs);
        row(&mut o, "slab", self.slab_bytes);
        if let Some(off) = &self.offload {
            row(&mut o, "host (offloaded optimizer state)", off.host_bytes);
        }
        row(&mut o, "lower bound (LOAD)", self.lower_bound_bytes);
        let _ = writeln!(
            o,
            "  {:<34} {:>16.4}",
            "slab / LOAD", self.slab_over_lower_bound
        );
        let _ = writeln!(
            o,
            "peak at schedule position {} ({}), live slab bytes by kind:",
            self.peak_position,
            crate::error::printable(&self.peak_label())
        );
        row(
            &mut o,
            "  saved_activation",
            self.peak_by_kind.saved_activation,
        );
        row(&mut o, "  gradient", self.peak_by_kind.gradient);
        row(&mut o, "  temporary", self.peak_by_kind.temporary);
        row(&mut o, "  workspace", self.peak_by_kind.workspace);
        let _ = writeln!(o, "largest buffers live at the peak:");
        let header = [
            "provenance".to_string(),
            "node".into(),
            "op".into(),
            "kind".into(),
            "type".into(),
            "size".into(),
            "live".into(),
        ];
        let rows: Vec<[String; 7]> = self
            .peak_buffers
            .iter()
            .map(|b| {
                let mut prov = b.provenance.clone();
                if b.fused.len() > 1 {
                    let _ = write!(prov, " +{}", b.fused.len() - 1);
                }
                [
                    prov,
                    format!("%{}", b.node),
                    b.op.clone(),
                    b.kind.name().to_string(),
                    b.type_label(),
                    human(b.bytes),
                    format!("[{}, {})", b.lifetime[0], b.lifetime[1]),
                ]
            })
            .collect();
        o.push_str(&columns(&header, &rows, &[5]));
        let _ = writeln!(
            o,
            "in-place ops: {}, slab buffers: {}",
            self.in_place_ops, self.slab_buffers
        );
        if let Some(off) = &self.offload {
            let _ = writeln!(
                o,
                "{}; device {} ({} bytes), host {} ({} bytes); copies by schedule position:",
                off.line(),
                human(self.total_bytes),
                self.total_bytes,
                human(off.host_bytes),
                off.host_bytes
            );
            for line in off.schedule_lines(8) {
                let _ = writeln!(o, "{line}");
            }
        }
        o
    }
}

/// Rows as aligned columns (two spaces apart, indented by two); the columns in `right` are
/// right-aligned. Trailing spaces are trimmed. Cells print through
/// [`crate::error::printable`] (a name's control characters escaped), padded by hand: a
/// format width is limited to 65,535, and a name may be longer.
pub fn columns<const N: usize>(
    header: &[String; N],
    rows: &[[String; N]],
    right: &[usize],
) -> String {
    let cells: Vec<[std::borrow::Cow<'_, str>; N]> = std::iter::once(header)
        .chain(rows)
        .map(|r| std::array::from_fn(|k| crate::error::printable(&r[k])))
        .collect();
    let mut width = [0usize; N];
    for r in &cells {
        for (k, c) in r.iter().enumerate() {
            width[k] = width[k].max(c.chars().count());
        }
    }
    let mut o = String::new();
    for r in &cells {
        let mut line = String::from(" ");
        for (k, c) in r.iter().enumerate() {
            line.push(' ');
            let pad = " ".repeat(width[k] - c.chars().count());
            if right.contains(&k) {
                line.push_str(&pad);
                line.push_str(c);
            } else {
                line.push_str(c);
                line.push_str(&pad);
            }
            if k + 1 < N {
                line.push(' ');
            }
        }
        o.push_str(line.trim_end());
        o.push('\n');
    }
    o
}

/// Every storage grouped by (provenance, kind), in order of first appearance: resident
/// storages in graph order, then slab storages by start position.
fn by_provenance(g: &Graph, plan: &MemoryPlan, kinds: &[BufferKind]) -> Vec<SourceBytes> {
    let lv = &plan.liveness;
    let mut order: Vec<usize> = (0..lv.storages.len()).collect();
    order.sort_by_key(|&i| {
        let s = &lv.storages[i];
        (s.region == Region::Slab, s.start, i)
    });
    let mut out: Vec<SourceBytes> = Vec::new();
    let mut index: std::collections::HashMap<(String, BufferKind), usize> = Default::default();
    for i in order {
        let s = &lv.storages[i];
        let key = (storage_provenance(g, s), kinds[i]);
        match index.get(&key) {
            Some(&k) => {
                out[k].buffers += 1;
                out[k].bytes += s.bytes;
            }
            None => {
                index.insert(key.clone(), out.len());
                out.push(SourceBytes {
                    provenance: key.0,
                    kind: key.1,
                    buffers: 1,
                    bytes: s.bytes,
                });
            }
        }
    }
    out
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
    use crate::pipeline::{self, Compiled, Options};

    /// mlp planned for the CPU (its matmuls' workspaces included).
    fn mlp_cpu() -> Compiled {
        crate::models::compile_model("mlp", &Options::for_target(crate::lower::Target::Cpu))
            .unwrap()
    }

    #[test]
    fn a_name_longer_than_a_format_width_or_holding_escape_codes_prints_escaped_without_panic() {
        // A name of 70,000 characters and one that would clear the screen: the model's name
        // heads the table, and any name can be a cell of its columns.
        let long = "w".repeat(70_000);
        let text = format!(
            "ingot-ir 1\n\
             %0 = parameter \"{long}\" init=zeros : f32[64]\n\
             %1 = parameter \"evil\\u{{1b}}[2J\" init=zeros : f32[64]\n\
             %2 = input \"x\" : f32[64]\n\
             %3 = mul(%0, %1) : f32[64]\n\
             %4 = mul(%3, %2) : f32[64]\n\
             %5 = reduce_sum(%4) axes=[0] : f32[1]\n\
             %6 = reshape(%5) : f32[]\n\
             output \"loss\" = %6\n"
        );
        let model = crate::model::Model::from_ir_text("names\x1b[31m.ir", &text).unwrap();
        let c = pipeline::compile(&model, &Options::for_target(crate::lower::Target::Cpu)).unwrap();
        let table = c.report.table();
        assert!(
            !table.contains('\x1b'),
            "no escape character reaches the terminal"
        );
        assert!(table.contains("names\\u{1b}[31m.ir"), "{}", &table[..200]);
        let rows = crate::report::columns(
            &["name".to_string(), "n".to_string()],
            &[
                [long.clone(), "1".into()],
                ["evil\x1b[2J".into(), "22".into()],
            ],
            &[1],
        );
        let lines: Vec<&str> = rows.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].starts_with(&format!("  {long}")) && lines[1].ends_with(" 1"));
        assert!(lines[2].starts_with("  evil\\u{1b}[2J") && lines[2].ends_with("22"));
        assert_eq!(
            lines[1].chars().count(),
            lines[2].chars().count(),
            "columns align"
        );
    }

    #[test]
    fn a_workspace_row_names_whose_workspace_it_is_and_is_typed_as_bytes() {
        let c = mlp_cpu();
        let w = c
            .report
            .peak_buffers
            .iter()
            .find(|b| b.kind == BufferKind::Workspace)
            .expect("a matmul workspace is live at mlp's peak");
        assert!(
            w.provenance.starts_with("workspace of fc") && w.provenance.ends_with(" (backward)"),
            "{}",
            w.provenance
        );
        assert_eq!(
            (w.dtype.as_str(), w.shape.as_slice()),
            ("u8", &[w.bytes][..])
        );
        let row = c.report.table();
        let line = row.lines().find(|l| l.contains("workspace of")).unwrap();
        assert!(line.contains(&format!("u8[{}]", w.bytes)), "{line}");
    }

    #[test]
    fn a_gradient_is_what_autodiff_made_and_a_value_only_the_backward_reads_is_not_one() {
        let c = mlp_cpu();
        let g = &c.graph;
        let phases = crate::autodiff::phase::of_graph(g, g.outputs.get("loss").copied());
        let kinds = storage_kinds(g, &c.plan, Some(&phases));
        let lv = &c.plan.liveness;
        let mut outside_the_cone = 0;
        for (i, s) in lv.storages.iter().enumerate() {
            let prov = g.origin(s.owner).label();
            if kinds[i] == BufferKind::Gradient {
                assert!(
                    prov.contains("(backward)"),
                    "storage {i} ({prov}) is a gradient"
                );
                assert!(g.ty(s.owner).dtype.is_float());
            }
            // Values outside the loss's cone that autodiff did not make: the relu masks (bool)
            // and the activations recomputed for the backward pass.
            if s.region == Region::Slab
                && !s.workspace
                && phases[s.owner.index()] == Phase::Backward
                && !prov.contains("(backward)")
            {
                outside_the_cone += 1;
                assert_ne!(kinds[i], BufferKind::Gradient, "{prov} is not a gradient");
            }
        }
        assert!(outside_the_cone > 0, "mlp has such values (its relu masks)");
        // A GPT recomputes its LayerNorm outputs for the backward pass: those are not
        // gradients either.
        let c = crate::models::compile_model(
            "gpt:vocab=16,d_model=8,layers=2,heads=2,d_ff=16,seq=4,batch=2",
            &Options::for_target(crate::lower::Target::Cpu),
        )
        .unwrap();
        let g = &c.graph;
        let phases = crate::autodiff::phase::of_graph(g, g.outputs.get("loss").copied());
        let kinds = storage_kinds(g, &c.plan, Some(&phases));
        let recomputed: Vec<usize> = (0..c.plan.liveness.storages.len())
            .filter(|&i| {
                g.origin(c.plan.liveness.storages[i].owner)
                    .label()
                    .ends_with("(recomputed)")
            })
            .collect();
        assert!(!recomputed.is_empty(), "the GPT recomputes something");
        assert!(recomputed.iter().all(|&i| kinds[i] != BufferKind::Gradient));
    }

    #[test]
    fn without_provenance_a_value_computed_before_the_backward_starts_is_not_a_gradient() {
        let c = mlp_cpu();
        let mut g = c.graph.clone();
        for id in g.ids().collect::<Vec<_>>() {
            g.set_origin(id, crate::ir::Origin::none());
        }
        let phases = crate::autodiff::phase::of_graph(&g, g.outputs.get("loss").copied());
        let kinds = storage_kinds(&g, &c.plan, Some(&phases));
        let end = forward_end(&g, &c.plan, Some(&phases));
        for (i, s) in c.plan.liveness.storages.iter().enumerate() {
            if kinds[i] == BufferKind::Gradient {
                assert!(s.start > end, "storage {i} written at {} <= {end}", s.start);
            }
        }
        assert!(kinds.contains(&BufferKind::Gradient));
    }

    #[test]
    fn each_kind_has_one_spelling_in_the_text_the_json_and_the_page() {
        for k in BufferKind::ALL {
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.name())
            );
            assert_eq!(k.to_string(), k.name());
        }
        let c = mlp_cpu();
        let text = c.report.table();
        for b in &c.report.peak_buffers {
            assert!(text.contains(&format!("  {}  ", b.kind.name())), "{text}");
        }
        for banned in [
            "Gradient",
            "SavedActivation",
            "saved activations",
            "optimizer state ",
        ] {
            assert!(!text.contains(banned), "{banned:?} in {text}");
        }
    }

    #[test]
    fn the_buffer_table_is_aligned_in_columns() {
        let text = mlp_cpu().report.table();
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("largest buffers"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .collect();
        assert!(rows.len() >= 3, "{text}");
        // The size column is right-aligned: every row's size ends at the same column, and the
        // lifetime starts at the same column.
        let header = rows[0];
        let live_at: Vec<usize> = rows[1..].iter().map(|r| r.rfind('[').unwrap()).collect();
        assert!(
            live_at.iter().all(|&x| Some(x) == header.find("live")),
            "{text}"
        );
        let size_end: Vec<usize> = rows[1..].iter().map(|r| r.find(" [").unwrap()).collect();
        assert!(size_end.windows(2).all(|w| w[0] == w[1]), "{text}");
        assert!(
            header.contains("provenance") && header.contains("kind") && header.contains("size")
        );
    }

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
