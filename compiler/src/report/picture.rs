//! The plan as pictures.
//!
//! [`html`] writes one self-contained page (inline CSS, inline JavaScript, the plan's data as a
//! compact JSON island; nothing is fetched, so it opens offline): a curve of live bytes over the
//! schedule on top (stacked by kind, the peak marked), phase bands and layer names along the
//! axis, the placement chart below it (schedule position across, byte offset up, one rectangle
//! per storage) sharing the axis, zoom (wheel; shift+wheel zooms the placement's offsets) and
//! pan (drag) on both, hover and click on a buffer for its provenance, shape, dtype, size,
//! lifetime and offset, and a sortable table of every buffer live at the peak or at any position
//! clicked. Buffers too small to see are drawn at least one pixel wide and tall, and every
//! buffer is in the table, so none is lost.
//!
//! [`svg`] draws the placement chart alone as a static SVG (no script): one titled rectangle per
//! storage at least [`MIN_HEIGHT_PX`] tall (a caption counts the rest).
//!
//! Both are pure and deterministic: the same plan gives the same bytes. Every text is escaped.

use super::{human, storage_kinds, storage_provenance, BufferKind, Report};
use crate::autodiff::{Phase, LOSS};
use crate::ir::Graph;
use crate::plan::{MemoryPlan, Region, Storage};
use std::collections::HashMap;
use std::fmt::Write;

/// Width of the SVG's plotting area, in pixels.
pub const PLOT_WIDTH: f64 = 1000.0;
/// Height of the SVG's plotting area, in pixels.
pub const PLOT_HEIGHT: f64 = 600.0;
/// Storages drawn shorter than this are left out of the SVG.
pub const MIN_HEIGHT_PX: f64 = 0.25;

const LEFT: f64 = 90.0;
const TOP: f64 = 40.0;
const RIGHT: f64 = 20.0;
const BOTTOM: f64 = 110.0;

/// A kind's colour, the same in the SVG and the page.
pub fn colour(kind: BufferKind) -> &'static str {
    match kind {
        BufferKind::Parameter => "#4e79a7",
        BufferKind::OptimizerState => "#76b7b2",
        BufferKind::Input => "#59a14f",
        BufferKind::SavedActivation => "#f28e2b",
        BufferKind::Gradient => "#e15759",
        BufferKind::Temporary => "#bab0ac",
        BufferKind::Workspace => "#b07aa1",
    }
}

/// What the picture draws a storage as instead of its kind, where the fitter changed how the
/// value is kept: recomputed for the backward pass (`X (recomputed)`), or an offloaded leaf's
/// staging buffer (its value lives in host memory between its copies). Each has its own
/// colour and a legend entry, on pages that have such values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Recomputed,
    Offloaded,
}

impl Mark {
    pub const ALL: [Mark; 2] = [Mark::Recomputed, Mark::Offloaded];

    /// The legend's word.
    pub fn name(self) -> &'static str {
        match self {
            Mark::Recomputed => "recomputed",
            Mark::Offloaded => "offloaded",
        }
    }

    /// Its colour, apart from every kind's ([`colour`]).
    pub fn colour(self) -> &'static str {
        match self {
            Mark::Recomputed => "#edc948",
            Mark::Offloaded => "#9c755f",
        }
    }
}

/// Each storage's mark (by storage index), if any.
pub fn marks(g: &Graph, plan: &MemoryPlan) -> Vec<Option<Mark>> {
    let lv = &plan.liveness;
    let mut out: Vec<Option<Mark>> = lv
        .storages
        .iter()
        .map(|s| {
            (!s.workspace && g.origin(s.owner).label().ends_with("(recomputed)"))
                .then_some(Mark::Recomputed)
        })
        .collect();
    for o in &plan.offload {
        out[lv.storage_of[o.leaf.index()]] = Some(Mark::Offloaded);
    }
    out
}

/// The marks `marks` holds, in [`Mark::ALL`]'s order: the legend's extra entries.
fn marks_present(marks: &[Option<Mark>]) -> Vec<Mark> {
    Mark::ALL
        .into_iter()
        .filter(|m| marks.contains(&Some(*m)))
        .collect()
}

/// One rectangle of the SVG.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub storage: usize,
    pub kind: BufferKind,
    /// Drawn in the mark's colour rather than the kind's.
    pub mark: Option<Mark>,
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
    /// The tooltip, unescaped.
    pub title: String,
}

/// The rectangles to draw, and how many storages were too small to.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub bars: Vec<Bar>,
    pub skipped: usize,
    pub positions: usize,
}

/// Escapes `s` for XML text and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// The phases of `g`'s nodes, as the report reckons them.
fn phases(g: &Graph) -> Vec<Phase> {
    crate::autodiff::phase::of_graph(g, g.outputs.get(LOSS).copied())
}

/// A storage's type: `f32[8,1024]`, or `u8[N]` for a workspace.
fn storage_type(g: &Graph, s: &Storage) -> (String, String) {
    if s.workspace {
        return ("u8".into(), format!("[{}]", s.bytes));
    }
    let ty = g.ty(s.owner);
    let dims: Vec<String> = ty.shape.dims().iter().map(|d| d.to_string()).collect();
    (ty.dtype.to_string(), format!("[{}]", dims.join(",")))
}

/// Lays the SVG out: one bar per storage tall enough to see, in storage order.
pub fn layout(g: &Graph, plan: &MemoryPlan) -> Layout {
    let lv = &plan.liveness;
    let positions = lv.order.len().max(1);
    let ph = phases(g);
    let kinds = storage_kinds(g, plan, Some(&ph));
    let marks = marks(g, plan);
    let total = plan.total_bytes.max(1) as f64;
    let sx = PLOT_WIDTH / positions as f64;
    let sy = PLOT_HEIGHT / total;
    let mut bars = Vec::new();
    let mut skipped = 0;
    for (i, s) in lv.storages.iter().enumerate() {
        let height = s.bytes as f64 * sy;
        if height < MIN_HEIGHT_PX {
            skipped += 1;
            continue;
        }
        let kind = kinds[i];
        let end = s.end.max(s.start + 1);
        let offset = plan.storage_offset[i];
        let (dtype, shape) = storage_type(g, s);
        let title = format!(
            "{} (%{} {})\n{}{} {} bytes ({}), {}\nlive [{}, {}), offset {}",
            storage_provenance(g, s),
            s.owner.0,
            g.node(s.owner).op.name(),
            dtype,
            shape,
            s.bytes,
            human(s.bytes),
            kind,
            s.start,
            end,
            offset
        );
        bars.push(Bar {
            storage: i,
            kind,
            mark: marks[i],
            x: LEFT + s.start as f64 * sx,
            y: TOP + PLOT_HEIGHT - (offset + s.bytes) as f64 * sy,
            width: (end - s.start) as f64 * sx,
            height,
            title,
        });
    }
    Layout {
        bars,
        skipped,
        positions,
    }
}

/// The plan's placement chart as a standalone SVG document.
pub fn svg(g: &Graph, plan: &MemoryPlan, report: &Report) -> String {
    let lay = layout(g, plan);
    let width = LEFT + PLOT_WIDTH + RIGHT;
    let height = TOP + PLOT_HEIGHT + BOTTOM;
    let total = plan.total_bytes.max(1) as f64;
    let sy = PLOT_HEIGHT / total;
    let sx = PLOT_WIDTH / lay.positions as f64;
    let mut o = String::with_capacity(256 * lay.bars.len() + 4096);
    o.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(
        o,
        "<title>memory plan: {} in {} ({} total)</title>",
        escape(&report.model),
        report.precision,
        human(plan.total_bytes)
    );
    o.push_str("<style>rect.buf:hover { stroke: #000; stroke-width: 1; }</style>\n");
    let _ = writeln!(
        o,
        "<rect x=\"{LEFT:.0}\" y=\"{TOP:.0}\" width=\"{PLOT_WIDTH:.0}\" height=\"{PLOT_HEIGHT:.0}\" \
         fill=\"#fafafa\" stroke=\"#999\"/>"
    );
    o.push_str("<g class=\"buffers\" stroke=\"none\">\n");
    for b in &lay.bars {
        let _ = writeln!(
            o,
            "<rect class=\"buf {}{}\" x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{:.2}\" \
             fill=\"{}\"><title>{}</title></rect>",
            b.kind,
            b.mark.map_or(String::new(), |m| format!(" {}", m.name())),
            b.x,
            b.y,
            b.width,
            b.height,
            b.mark.map_or(colour(b.kind), Mark::colour),
            escape(&b.title)
        );
    }
    o.push_str("</g>\n");
    let base_y = TOP + PLOT_HEIGHT - plan.slab_base as f64 * sy;
    let _ = writeln!(
        o,
        "<line x1=\"{LEFT:.0}\" y1=\"{base_y:.2}\" x2=\"{:.0}\" y2=\"{base_y:.2}\" stroke=\"#555\" \
         stroke-dasharray=\"4 3\"/>",
        LEFT + PLOT_WIDTH
    );
    let _ = writeln!(
        o,
        "<text x=\"{:.0}\" y=\"{:.2}\" text-anchor=\"end\" fill=\"#555\">slab starts</text>",
        LEFT + PLOT_WIDTH - 4.0,
        base_y - 3.0
    );
    let px = LEFT + (plan.peak_position as f64 + 0.5) * sx;
    let _ = writeln!(
        o,
        "<line class=\"peak\" x1=\"{px:.2}\" y1=\"{TOP:.0}\" x2=\"{px:.2}\" y2=\"{:.0}\" \
         stroke=\"#d00\" stroke-width=\"1.5\"><title>peak at position {}</title></line>",
        TOP + PLOT_HEIGHT,
        plan.peak_position
    );
    let anchor = if px > LEFT + PLOT_WIDTH / 2.0 {
        "end"
    } else {
        "start"
    };
    let _ = writeln!(
        o,
        "<text x=\"{px:.2}\" y=\"{:.0}\" text-anchor=\"{anchor}\" fill=\"#d00\">peak: position {} \
         ({}), {} live in the slab</text>",
        TOP - 8.0,
        plan.peak_position,
        escape(&report.peak_label()),
        human(plan.load_bytes)
    );
    let axis_y = TOP + PLOT_HEIGHT;
    for i in 0..=4 {
        let bytes = (plan.total_bytes as f64 * i as f64 / 4.0).round() as usize;
        let y = axis_y - bytes as f64 * sy;
        let _ = writeln!(
            o,
            "<text x=\"{:.0}\" y=\"{:.2}\" text-anchor=\"end\">{}</text>",
            LEFT - 6.0,
            y + 4.0,
            human(bytes)
        );
    }
    for i in 0..=4 {
        let p = lay.positions * i / 4;
        let x = LEFT + p as f64 * sx;
        let _ = writeln!(
            o,
            "<text x=\"{x:.2}\" y=\"{:.0}\" text-anchor=\"middle\">{p}</text>",
            axis_y + 16.0
        );
    }
    let _ = writeln!(
        o,
        "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"middle\">schedule position ({} ops, {} schedule, {})</text>",
        LEFT + PLOT_WIDTH / 2.0,
        axis_y + 34.0,
        lay.positions,
        escape(&report.schedule),
        report.precision
    );
    let _ = writeln!(
        o,
        "<text transform=\"translate(14 {:.0}) rotate(-90)\" text-anchor=\"middle\">byte offset</text>",
        TOP + PLOT_HEIGHT / 2.0
    );
    let ly = axis_y + 56.0;
    let mut lx = LEFT;
    let shown: Vec<Option<Mark>> = lay.bars.iter().map(|b| b.mark).collect();
    let entries = (BufferKind::ALL.iter().map(|&k| (k.name(), colour(k)))).chain(
        marks_present(&shown)
            .into_iter()
            .map(|m| (m.name(), m.colour())),
    );
    for (label, fill) in entries {
        let _ = writeln!(
            o,
            "<rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"12\" height=\"12\" fill=\"{fill}\"/>\
             <text x=\"{:.0}\" y=\"{ly:.0}\">{label}</text>",
            ly - 10.0,
            lx + 16.0
        );
        lx += 28.0 + 7.0 * label.len() as f64;
    }
    let _ = writeln!(
        o,
        "<text x=\"{LEFT:.0}\" y=\"{:.0}\" fill=\"#555\">{} buffers drawn, {} under {} px tall \
         not drawn (the HTML page shows every one); total {} ({} bytes)</text>",
        ly + 24.0,
        lay.bars.len(),
        lay.skipped,
        MIN_HEIGHT_PX,
        human(plan.total_bytes),
        plan.total_bytes
    );
    o.push_str("</svg>\n");
    o
}

/// The layer a provenance belongs to, for the axis's layer names: `blocks.3` for
/// `blocks.3.attn.qkv (backward)`, `fc1` for `fc1.weight`, `update` for `update of ...`.
pub fn layer_of(provenance: &str) -> &str {
    let p = provenance.strip_suffix(" (backward)").unwrap_or(provenance);
    if p.starts_with("update of ") || p == "optimizer" {
        return "update";
    }
    let mut parts = p.splitn(3, '.');
    let first = parts.next().unwrap_or(p);
    match parts.next() {
        Some(second) if second.chars().all(|c| c.is_ascii_digit()) && !second.is_empty() => {
            &p[..first.len() + 1 + second.len()]
        }
        _ => first,
    }
}

/// Strings of the page's data, each stored once and referred to by index.
#[derive(Default)]
struct Strings {
    list: Vec<String>,
    index: HashMap<String, usize>,
}

impl Strings {
    fn id(&mut self, s: &str) -> usize {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), self.list.len() - 1);
        self.list.len() - 1
    }
}

/// Runs of equal values over positions: `[start, end, value]`.
fn runs(values: &[usize]) -> Vec<[usize; 3]> {
    let mut out: Vec<[usize; 3]> = Vec::new();
    for (p, &v) in values.iter().enumerate() {
        match out.last_mut() {
            Some(r) if r[2] == v => r[1] = p + 1,
            _ => out.push([p, p + 1, v]),
        }
    }
    out
}

/// The page's data as one JSON document (compact arrays; strings by index).
fn page_data(g: &Graph, plan: &MemoryPlan, report: &Report) -> String {
    let lv = &plan.liveness;
    let n = lv.order.len();
    let ph = phases(g);
    let kinds = storage_kinds(g, plan, Some(&ph));
    // A marked storage is drawn as its mark, an entry after the kinds.
    let marks = marks(g, plan);
    let present = marks_present(&marks);
    let mut st = Strings::default();
    // Each buffer: [provenance, kind (or mark, after the kinds), dtype, shape, bytes, start,
    // end, offset, node, op, fused].
    let mut buffers = Vec::with_capacity(lv.storages.len());
    let mut by_dtype: std::collections::BTreeMap<String, usize> = Default::default();
    for (i, s) in lv.storages.iter().enumerate() {
        let (dtype, shape) = storage_type(g, s);
        *by_dtype.entry(dtype.clone()).or_default() += s.bytes;
        let (start, end) = if s.region == Region::Resident {
            (0, n.max(1))
        } else {
            (s.start, s.end.max(s.start + 1))
        };
        let sources = g.origin(s.owner).sources();
        let fused = if sources.len() > 1 && !s.workspace {
            st.id(&g.origin(s.owner).label())
        } else {
            st.id("")
        };
        buffers.push(serde_json::json!([
            st.id(&storage_provenance(g, s)),
            match marks[i] {
                Some(m) =>
                    BufferKind::ALL.len() + present.iter().position(|&p| p == m).unwrap_or(0),
                None => BufferKind::ALL
                    .iter()
                    .position(|k| *k == kinds[i])
                    .unwrap_or(0),
            },
            st.id(&dtype),
            st.id(&shape),
            s.bytes,
            start,
            end,
            plan.storage_offset[i],
            s.owner.0,
            st.id(g.node(s.owner).op.name()),
            fused
        ]));
    }
    // Each position: [provenance, op, node].
    let positions: Vec<serde_json::Value> = lv
        .order
        .iter()
        .map(|&id| {
            let prov = g
                .origin(id)
                .primary()
                .map_or_else(|| g.node(id).op.name().to_string(), str::to_string);
            serde_json::json!([st.id(&prov), st.id(g.node(id).op.name()), id.0])
        })
        .collect();
    let phase_names = ["forward", "backward", "update"];
    // The band shows the schedule's parts: up to the last forward op, the forward pass (kernels
    // only the backward reads but that run in it included), then backward and update.
    let forward_end = super::forward_end(g, plan, Some(&ph));
    let phase_of: Vec<usize> = lv
        .order
        .iter()
        .enumerate()
        .map(|(p, &id)| match ph[id.index()] {
            _ if p <= forward_end => 0,
            Phase::Optimizer => 2,
            _ => 1,
        })
        .collect();
    // A position of unknown provenance continues the layer before it; the leaves (which the
    // schedule lists first) are grouped by what they are.
    let mut layer_of_pos: Vec<usize> = Vec::with_capacity(n);
    for &id in &lv.order {
        let prev = layer_of_pos.last().copied();
        if let crate::ir::Op::Leaf { kind, .. } = &g.node(id).op {
            layer_of_pos.push(st.id(match kind {
                crate::ir::LeafKind::Parameter => "parameters",
                crate::ir::LeafKind::State => "optimizer state",
                crate::ir::LeafKind::Input => "inputs",
            }));
            continue;
        }
        match (g.origin(id).primary(), prev) {
            (None, Some(p)) => layer_of_pos.push(p),
            (prov, _) => layer_of_pos.push(st.id(layer_of(prov.unwrap_or("")))),
        }
    }
    let doc = serde_json::json!({
        "model": report.model,
        "precision": report.precision.name(),
        "schedule": report.schedule,
        "total": plan.total_bytes,
        "resident": plan.resident_bytes,
        "slab_base": plan.slab_base,
        "slab": plan.slab_bytes,
        "load": plan.load_bytes,
        "peak": plan.peak_position,
        "positions": n,
        "kinds": (BufferKind::ALL.iter().map(|k| k.name()))
            .chain(present.iter().map(|m| m.name()))
            .collect::<Vec<_>>(),
        "colours": (BufferKind::ALL.iter().map(|&k| colour(k)))
            .chain(present.iter().map(|m| m.colour()))
            .collect::<Vec<_>>(),
        "dtypes": by_dtype,
        "phase_names": phase_names,
        "phases": runs(&phase_of),
        "layers": runs(&layer_of_pos),
        "ops": positions,
        "buffers": buffers,
        "strings": st.list,
    });
    // `<`, `>` and `&` occur only inside JSON strings, where `\u003c` means the same: the data
    // can then never end the script element or open a comment, whatever a name holds.
    doc.to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// The page's script: drawing, zoom and pan, hover, click and the table (plain JavaScript).
const SCRIPT: &str = include_str!("picture.js");

/// One self-contained HTML page: the live-bytes curve, the placement chart, the table of live
/// buffers and the report (see the module docs).
pub fn html(g: &Graph, plan: &MemoryPlan, report: &Report) -> String {
    let mut o = String::new();
    let model = escape(&report.model);
    let dtypes: Vec<String> = {
        let mut m: std::collections::BTreeMap<String, usize> = Default::default();
        for s in &plan.liveness.storages {
            *m.entry(storage_type(g, s).0).or_default() += 1;
        }
        m.into_iter()
            .map(|(k, v)| format!("{k} \u{d7}{v}"))
            .collect()
    };
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>memory plan: {model}</title>\n<style>\n{CSS}</style>\n</head>\n<body>\n\
         <h1>memory plan: {model}</h1>\n\
         <p class=\"summary\">precision <b id=\"precision\">{prec}</b> &#183; total <b>{total}</b> \
         (resident {resident}, slab {slab}, LOAD {load}) &#183; peak at position {peak} ({peak_op}) \
         &#183; {schedule} schedule &#183; buffers by dtype: {dtypes}</p>\n\
         <p class=\"help\">Wheel: zoom the schedule axis (shift+wheel: the placement's offsets); \
         drag: pan; hover a buffer for its details, click it (or a position on the curve) to pin it \
         and list what is live there; click a column heading to sort.\n\
         <button id=\"reset\">reset zoom</button> <button id=\"gopeak\">go to the peak</button></p>\n\
         <div id=\"legend\"></div>\n\
         <canvas id=\"curve\" height=\"300\"></canvas>\n\
         <canvas id=\"placement\" height=\"420\"></canvas>\n\
         <div id=\"tip\"></div>\n\
         <div class=\"lower\"><div id=\"details\">click a buffer for its details</div>\n\
         <div id=\"tablebox\"><p id=\"tablehead\"></p><table id=\"live\"><thead></thead><tbody></tbody></table></div></div>\n\
         <h2>report</h2>\n<pre class=\"report\">{table}</pre>\n\
         <script type=\"application/json\" id=\"plan-data\">{data}</script>\n\
         <script>\n{SCRIPT}</script>\n</body>\n</html>\n",
        prec = report.precision,
        total = human(report.total_bytes),
        resident = human(report.resident_bytes),
        slab = human(report.slab_bytes),
        load = human(report.lower_bound_bytes),
        peak = report.peak_position,
        peak_op = escape(&report.peak_label()),
        schedule = escape(&report.schedule),
        dtypes = escape(&dtypes.join(", ")),
        table = escape(&report.table()),
        data = page_data(g, plan, report),
    );
    o
}

const CSS: &str = "body { font-family: sans-serif; margin: 12px 16px; color: #222; }
h1 { font-size: 20px; margin: 4px 0; } h2 { font-size: 16px; }
p.summary, p.help { font-size: 13px; margin: 4px 0; } p.help { color: #555; }
canvas { display: block; width: 100%; border: 1px solid #ccc; margin-top: 6px; cursor: crosshair; }
#legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
#legend i { display: inline-block; width: 11px; height: 11px; margin-right: 4px; vertical-align: -1px; }
#tip { position: fixed; display: none; background: #fffffa; border: 1px solid #888; padding: 4px 6px;
  font-size: 12px; pointer-events: none; white-space: pre; z-index: 2; }
.lower { display: flex; gap: 16px; align-items: flex-start; margin-top: 8px; }
#details { min-width: 300px; max-width: 380px; font-size: 12px; white-space: pre-wrap; background: #f6f6f6; padding: 8px; }
#tablebox { flex: 1; max-height: 420px; overflow: auto; }
#tablehead { font-size: 13px; margin: 0 0 4px 0; }
table { border-collapse: collapse; font-size: 12px; }
th { cursor: pointer; background: #eee; position: sticky; top: 0; text-align: left; }
th, td { padding: 2px 6px; border-bottom: 1px solid #e4e4e4; white-space: nowrap; }
td.num { text-align: right; } tr.sel td { background: #ffe9a8; } tbody tr { cursor: pointer; }
pre { font-size: 12px; background: #f6f6f6; padding: 12px; }
";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{Compiled, Options};

    fn mlp() -> Compiled {
        crate::models::compile_model("mlp", &Options::default()).unwrap()
    }

    /// A small well-formedness check: tags nest and close, attributes are quoted, entities are
    /// known, no stray `<` or `&` in text. Returns the element names in document order.
    fn well_formed(doc: &str) -> Result<Vec<String>, String> {
        let check_text = |t: &str| -> Result<(), String> {
            let mut rest = t;
            while let Some(i) = rest.find('&') {
                rest = &rest[i + 1..];
                let end = rest.find(';').ok_or("unterminated entity")?;
                let ent = &rest[..end];
                let ok = matches!(ent, "amp" | "lt" | "gt" | "quot" | "apos")
                    || (ent.starts_with('#') && ent[1..].parse::<u32>().is_ok());
                if !ok {
                    return Err(format!("unknown entity &{ent};"));
                }
            }
            if t.contains('>') {
                return Err("stray >".into());
            }
            Ok(())
        };
        let mut stack: Vec<String> = Vec::new();
        let mut names = Vec::new();
        let mut rest = doc;
        if let Some(r) = rest.strip_prefix("<?xml") {
            rest = &r[r.find("?>").ok_or("unterminated declaration")? + 2..];
        }
        while let Some(i) = rest.find('<') {
            check_text(&rest[..i])?;
            rest = &rest[i + 1..];
            let end = rest.find('>').ok_or("unterminated tag")?;
            let tag = &rest[..end];
            rest = &rest[end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                match stack.pop() {
                    Some(open) if open == name.trim() => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
                continue;
            }
            let self_closing = tag.ends_with('/');
            let tag = tag.trim_end_matches('/');
            let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
            let name = &tag[..name_end];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                return Err(format!("bad element name {name:?}"));
            }
            // Attributes: name="value" pairs.
            let mut attrs = tag[name_end..].trim();
            while !attrs.is_empty() {
                let eq = attrs
                    .find("=\"")
                    .ok_or(format!("unquoted attribute in <{tag}>"))?;
                let close = attrs[eq + 2..].find('"').ok_or("unterminated attribute")?;
                let value = &attrs[eq + 2..eq + 2 + close];
                if value.contains('<') {
                    return Err("< in attribute".into());
                }
                check_text(value)?;
                attrs = attrs[eq + 3 + close..].trim_start();
            }
            names.push(name.to_string());
            if !self_closing {
                stack.push(name.to_string());
            }
        }
        check_text(rest)?;
        if !stack.is_empty() {
            return Err(format!("unclosed {stack:?}"));
        }
        Ok(names)
    }

    #[test]
    fn the_svg_of_mlp_is_well_formed_with_one_titled_rect_per_drawn_buffer() {
        let c = mlp();
        let doc = svg(&c.graph, &c.plan, &c.report);
        let names = well_formed(&doc).unwrap();
        assert_eq!(names[0], "svg");
        let lay = layout(&c.graph, &c.plan);
        assert!(!lay.bars.is_empty());
        assert_eq!(lay.bars.len() + lay.skipped, c.plan.liveness.storages.len());
        let rects = doc.matches("<rect class=\"buf ").count();
        let titled = doc.matches("\"><title>").count();
        assert_eq!(rects, lay.bars.len());
        // Every buffer rect holds a title naming its provenance first, then its node id.
        let bufs_with_title = doc
            .lines()
            .filter(|l| {
                l.starts_with("<rect class=\"buf ") && l.contains("<title>") && l.contains(" (%")
            })
            .count();
        assert_eq!(bufs_with_title, lay.bars.len());
        assert!(titled >= lay.bars.len());
        assert!(doc.contains("class=\"peak\""));
        // Bars stay inside the plot.
        for b in &lay.bars {
            assert!(b.x >= LEFT - 1e-6 && b.x + b.width <= LEFT + PLOT_WIDTH + 1e-6);
            assert!(b.y >= TOP - 1e-6 && b.y + b.height <= TOP + PLOT_HEIGHT + 1e-6);
        }
    }

    /// The page without its scripts (whose JavaScript is not XML).
    fn without_scripts(page: &str) -> String {
        let mut out = String::new();
        let mut rest = page;
        while let Some(i) = rest.find("<script") {
            out.push_str(&rest[..i]);
            let end = rest[i..].find("</script>").expect("scripts close") + i + "</script>".len();
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn the_html_is_self_contained_and_embeds_the_table() {
        let c = mlp();
        let page = html(&c.graph, &c.plan, &c.report);
        assert!(!page.contains("http://") && !page.contains("https://"));
        assert!(
            !page.contains("src=") && !page.contains("href="),
            "nothing is fetched"
        );
        assert!(page.contains(&escape(&c.report.table())));
        assert!(page.contains("<pre class=\"report\">"));
        assert!(
            page.contains("data-ready"),
            "the script marks the page drawn"
        );
        let body = without_scripts(&page[page.find("<html").unwrap()..]);
        well_formed(body.replace("<meta charset=\"utf-8\">", "").as_str()).unwrap();
    }

    #[test]
    fn the_page_shows_the_precision_and_every_buffer_with_its_dtype() {
        // Planned for the CPU, so the matmuls' workspaces are in the plan too.
        let c =
            crate::models::compile_model("mlp", &Options::for_target(crate::lower::Target::Cpu))
                .unwrap();
        let page = html(&c.graph, &c.plan, &c.report);
        assert!(page.contains("precision <b id=\"precision\">f32</b>"));
        let start = page.find("id=\"plan-data\">").unwrap() + "id=\"plan-data\">".len();
        let end = start + page[start..].find("</script>").unwrap();
        let data: serde_json::Value = serde_json::from_str(&page[start..end]).unwrap();
        let buffers = data["buffers"].as_array().unwrap();
        // Every storage is in the data, however small: none is left out of the table.
        assert_eq!(buffers.len(), c.plan.liveness.storages.len());
        let strings = data["strings"].as_array().unwrap();
        let dtypes: std::collections::BTreeSet<&str> = buffers
            .iter()
            .map(|b| strings[b[2].as_u64().unwrap() as usize].as_str().unwrap())
            .collect();
        assert!(
            dtypes.contains("f32") && dtypes.contains("i64"),
            "{dtypes:?}"
        );
        // Provenance is there: the layers of the mlp and their backward passes.
        let provs: Vec<&str> = buffers
            .iter()
            .map(|b| strings[b[0].as_u64().unwrap() as usize].as_str().unwrap())
            .collect();
        assert!(provs.contains(&"fc1.weight"), "{provs:?}");
        assert!(provs.iter().any(|p| p.ends_with("(backward)")), "{provs:?}");
        assert!(
            provs.iter().any(|p| p.starts_with("workspace of ")),
            "{provs:?}"
        );
        assert_eq!(data["phase_names"][0], "forward");
    }

    #[test]
    fn layers_along_the_axis_group_a_block_and_its_backward() {
        assert_eq!(layer_of("blocks.3.attn.qkv (backward)"), "blocks.3");
        assert_eq!(layer_of("blocks.3"), "blocks.3");
        assert_eq!(layer_of("fc1.weight"), "fc1");
        assert_eq!(layer_of("update of fc1.weight"), "update");
        assert_eq!(layer_of(""), "");
    }

    #[test]
    fn the_picture_is_deterministic() {
        let a = mlp();
        let b = mlp();
        assert_eq!(
            svg(&a.graph, &a.plan, &a.report),
            svg(&b.graph, &b.plan, &b.report)
        );
        assert_eq!(
            html(&a.graph, &a.plan, &a.report),
            html(&b.graph, &b.plan, &b.report)
        );
    }

    /// The page's data island.
    fn page_json(page: &str) -> serde_json::Value {
        let start = page.find("id=\"plan-data\">").unwrap() + "id=\"plan-data\">".len();
        let end = start + page[start..].find("</script>").unwrap();
        serde_json::from_str(&page[start..end]).unwrap()
    }

    #[test]
    fn recomputed_and_offloaded_values_are_drawn_in_their_own_colours_with_a_legend() {
        // A GPT recomputes its LayerNorm outputs for the backward pass; with its AdamW moments
        // offloaded, their staging buffers are the offloaded values.
        let spec = "gpt:vocab=16,d_model=8,layers=2,heads=2,d_ff=16,seq=4,batch=2";
        let cpu = || Options::for_target(crate::lower::Target::Cpu);
        let plain = crate::models::compile_model(spec, &cpu()).unwrap();
        let mut opts = cpu();
        opts.plan.offload = crate::fit::offload::moments(&plain.graph);
        let c = crate::models::compile_model(spec, &opts).unwrap();
        let m = marks(&c.graph, &c.plan);
        let count = |k: Mark| m.iter().filter(|x| **x == Some(k)).count();
        assert_eq!(count(Mark::Offloaded), c.plan.offload.len());
        assert!(count(Mark::Recomputed) > 0, "the GPT recomputes something");
        let kinds: Vec<&str> = BufferKind::ALL.iter().map(|&k| colour(k)).collect();
        assert!(Mark::ALL.iter().all(|m| !kinds.contains(&m.colour())));
        let doc = svg(&c.graph, &c.plan, &c.report);
        well_formed(&doc).unwrap();
        let page = html(&c.graph, &c.plan, &c.report);
        let data = page_json(&page);
        for (i, mark) in Mark::ALL.into_iter().enumerate() {
            // The legend's entry, and rectangles in the mark's colour, classed by it.
            let (fill, name) = (mark.colour(), mark.name());
            assert!(
                doc.contains(&format!("fill=\"{fill}\"/>"))
                    && doc.contains(&format!(">{name}</text>")),
                "no legend entry for {name}"
            );
            let drawn = doc.matches(&format!("fill=\"{fill}\"><title>")).count();
            assert!(drawn > 0, "no {name} value drawn in its colour");
            assert!(
                doc.contains(&format!(" {name}\" x=")),
                "no rectangle classed {name}"
            );
            let k = BufferKind::ALL.len() + i;
            assert_eq!(data["kinds"][k], mark.name());
            assert_eq!(data["colours"][k], mark.colour());
            let in_data = data["buffers"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b[1] == k)
                .count();
            assert_eq!(in_data, count(mark), "{}", mark.name());
        }
        // A plan with neither has the kinds alone.
        let plain_mlp = mlp();
        assert!(marks(&plain_mlp.graph, &plain_mlp.plan)
            .iter()
            .all(Option::is_none));
        let data = page_json(&html(&plain_mlp.graph, &plain_mlp.plan, &plain_mlp.report));
        assert_eq!(
            data["kinds"].as_array().unwrap().len(),
            BufferKind::ALL.len()
        );
        let doc = svg(&plain_mlp.graph, &plain_mlp.plan, &plain_mlp.report);
        assert!(!doc.contains("offloaded") && !doc.contains(">recomputed<"));
    }

    #[test]
    fn names_with_markup_are_escaped() {
        assert_eq!(
            escape("a<b & \"c\" 'd'>"),
            "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;"
        );
        let mut c = mlp();
        c.report.model = "<evil & \"model\" 'x'>".into();
        c.report.peak_op = "<op>&".into();
        let doc = svg(&c.graph, &c.plan, &c.report);
        well_formed(&doc).unwrap();
        assert!(!doc.contains("<evil") && !doc.contains("<op>"));
        assert!(doc.contains("&lt;evil &amp; &quot;model&quot; &#39;x&#39;&gt;"));
        let page = html(&c.graph, &c.plan, &c.report);
        assert!(!page.contains("<evil") && page.contains("&lt;evil &amp;"));
        assert!(!page.contains("<op>"));
    }
}
