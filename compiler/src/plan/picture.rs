//! The plan as a picture: schedule position across, byte offset up, one rectangle per storage
//! from its first to its last live position, at its offset, as tall as its size, coloured by
//! what it holds. [`svg`] draws it alone; [`html`] puts it beside the report table in one
//! self-contained page (inline SVG and CSS, nothing fetched, no scripts).
//!
//! Both are pure and deterministic: the same plan gives the same bytes. Every text is escaped.
//! Storages less than [`MIN_HEIGHT_PX`] tall are not drawn (a caption counts them), which keeps
//! plans of thousands of buffers to a file of a few megabytes.

use super::report::{human, Report};
use super::{MemoryPlan, Region};
use crate::autodiff::{Phase, LOSS};
use crate::ir::{Graph, LeafKind, Op};
use std::fmt::Write;

/// Width of the plotting area, in pixels.
pub const PLOT_WIDTH: f64 = 1000.0;
/// Height of the plotting area, in pixels.
pub const PLOT_HEIGHT: f64 = 600.0;
/// Storages drawn shorter than this are left out.
pub const MIN_HEIGHT_PX: f64 = 0.25;

const LEFT: f64 = 90.0;
const TOP: f64 = 40.0;
const RIGHT: f64 = 20.0;
const BOTTOM: f64 = 110.0;

/// What a storage holds, for its colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Parameter,
    State,
    Input,
    SavedActivation,
    Gradient,
    Temporary,
    Workspace,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Parameter,
        Kind::State,
        Kind::Input,
        Kind::SavedActivation,
        Kind::Gradient,
        Kind::Temporary,
        Kind::Workspace,
    ];

    fn class(self) -> &'static str {
        match self {
            Kind::Parameter => "parameter",
            Kind::State => "state",
            Kind::Input => "input",
            Kind::SavedActivation => "saved_activation",
            Kind::Gradient => "gradient",
            Kind::Temporary => "temporary",
            Kind::Workspace => "workspace",
        }
    }

    fn colour(self) -> &'static str {
        match self {
            Kind::Parameter => "#4e79a7",
            Kind::State => "#76b7b2",
            Kind::Input => "#59a14f",
            Kind::SavedActivation => "#f28e2b",
            Kind::Gradient => "#e15759",
            Kind::Temporary => "#bab0ac",
            Kind::Workspace => "#b07aa1",
        }
    }
}

/// One rectangle of the picture.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub storage: usize,
    pub kind: Kind,
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

/// Lays the plan out: one bar per storage tall enough to see, in storage order.
pub fn layout(g: &Graph, plan: &MemoryPlan) -> Layout {
    let lv = &plan.liveness;
    let positions = lv.order.len().max(1);
    let phases = crate::autodiff::phase::of_graph(g, g.outputs.get(LOSS).copied());
    // The schedule position after which no forward op runs (as the report reckons it).
    let forward_end = g
        .ids()
        .filter(|id| phases[id.index()] == Phase::Forward && !g.node(*id).op.is_leaf())
        .map(|id| lv.position[id.index()])
        .max()
        .unwrap_or(0);
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
        let op = &g.node(s.owner).op;
        let kind = if s.workspace {
            Kind::Workspace
        } else {
            match (s.region, op) {
                (Region::Resident, Op::Leaf { kind, .. }) => match kind {
                    LeafKind::Parameter => Kind::Parameter,
                    LeafKind::State => Kind::State,
                    LeafKind::Input => Kind::Input,
                },
                (Region::Resident, _) => Kind::State,
                (Region::Slab, _) => match phases[s.owner.index()] {
                    Phase::Backward => Kind::Gradient,
                    Phase::Forward if s.end > forward_end + 1 => Kind::SavedActivation,
                    _ => Kind::Temporary,
                },
            }
        };
        let end = s.end.max(s.start + 1);
        let offset = plan.storage_offset[i];
        let ty = g.ty(s.owner);
        let shape = ty
            .shape
            .dims()
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let name = match op {
            Op::Leaf { name, .. } => format!(" {name:?}"),
            _ => String::new(),
        };
        let title = format!(
            "%{}{} {} {}[{}]\n{} bytes ({}), {}\nlive [{}, {}), offset {}",
            s.owner.0,
            name,
            if s.workspace { "workspace" } else { op.name() },
            ty.dtype,
            shape,
            s.bytes,
            human(s.bytes),
            kind.class(),
            s.start,
            end,
            offset
        );
        bars.push(Bar {
            storage: i,
            kind,
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

/// The plan as a standalone SVG document.
pub fn svg(g: &Graph, plan: &MemoryPlan, report: &Report) -> String {
    draw(g, plan, report, true)
}

/// One self-contained HTML page: the picture beside the report table.
pub fn html(g: &Graph, plan: &MemoryPlan, report: &Report) -> String {
    let mut o = String::new();
    let model = escape(&report.model);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>memory plan: {model}</title>\n<style>\n\
         body {{ font-family: sans-serif; margin: 16px; color: #222; }}\n\
         .page {{ display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }}\n\
         pre {{ font-size: 12px; background: #f6f6f6; padding: 12px; margin: 0; }}\n\
         rect.buf:hover {{ stroke: #000; stroke-width: 1; }}\n\
         </style>\n</head>\n<body>\n<h1>memory plan: {model}</h1>\n\
         <p>Schedule position across, byte offset up; hover a buffer for its node, op, shape, \
         size and lifetime.</p>\n<div class=\"page\">\n<div>\n"
    );
    o.push_str(&draw(g, plan, report, false));
    let _ = write!(
        o,
        "</div>\n<pre class=\"report\">{}</pre>\n</div>\n</body>\n</html>\n",
        escape(&report.table())
    );
    o
}

fn draw(g: &Graph, plan: &MemoryPlan, report: &Report, standalone: bool) -> String {
    let lay = layout(g, plan);
    let width = LEFT + PLOT_WIDTH + RIGHT;
    let height = TOP + PLOT_HEIGHT + BOTTOM;
    let total = plan.total_bytes.max(1) as f64;
    let sy = PLOT_HEIGHT / total;
    let sx = PLOT_WIDTH / lay.positions as f64;
    let mut o = String::with_capacity(256 * lay.bars.len() + 4096);
    if standalone {
        o.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    }
    let _ = writeln!(
        o,
        "<svg{} width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" \
         font-family=\"sans-serif\" font-size=\"12\">",
        if standalone {
            " xmlns=\"http://www.w3.org/2000/svg\""
        } else {
            ""
        }
    );
    let _ = writeln!(
        o,
        "<title>memory plan: {} ({} total)</title>",
        escape(&report.model),
        human(plan.total_bytes)
    );
    if standalone {
        o.push_str("<style>rect.buf:hover { stroke: #000; stroke-width: 1; }</style>\n");
    }
    let _ = writeln!(
        o,
        "<rect x=\"{LEFT:.0}\" y=\"{TOP:.0}\" width=\"{PLOT_WIDTH:.0}\" height=\"{PLOT_HEIGHT:.0}\" \
         fill=\"#fafafa\" stroke=\"#999\"/>"
    );
    o.push_str("<g class=\"buffers\" stroke=\"none\">\n");
    for b in &lay.bars {
        let _ = writeln!(
            o,
            "<rect class=\"buf {}\" x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{:.2}\" \
             fill=\"{}\"><title>{}</title></rect>",
            b.kind.class(),
            b.x,
            b.y,
            b.width,
            b.height,
            b.kind.colour(),
            escape(&b.title)
        );
    }
    o.push_str("</g>\n");
    // Where the resident region ends and the slab begins.
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
    // The peak.
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
        escape(&report.peak_op),
        human(plan.load_bytes)
    );
    // Axes.
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
        "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"middle\">schedule position ({} ops, {} schedule)</text>",
        LEFT + PLOT_WIDTH / 2.0,
        axis_y + 34.0,
        lay.positions,
        escape(&report.schedule)
    );
    let _ = writeln!(
        o,
        "<text transform=\"translate(14 {:.0}) rotate(-90)\" text-anchor=\"middle\">byte offset</text>",
        TOP + PLOT_HEIGHT / 2.0
    );
    // Legend.
    let ly = axis_y + 56.0;
    let mut lx = LEFT;
    for k in Kind::ALL {
        let label = k.class().replace('_', " ");
        let _ = writeln!(
            o,
            "<rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{:.0}\" y=\"{ly:.0}\">{label}</text>",
            ly - 10.0,
            k.colour(),
            lx + 16.0
        );
        lx += 28.0 + 7.0 * label.len() as f64;
    }
    let _ = writeln!(
        o,
        "<text x=\"{LEFT:.0}\" y=\"{:.0}\" fill=\"#555\">{} buffers drawn, {} under {} px tall \
         not drawn; total {} ({} bytes)</text>",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{self, Compiled, Options};

    fn mlp() -> Compiled {
        pipeline::compile_model("mlp", &Options::default()).unwrap()
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
        // Every buffer rect holds a title (the other title-bearing element is the peak line).
        let bufs_with_title = doc
            .lines()
            .filter(|l| l.starts_with("<rect class=\"buf ") && l.contains("<title>%"))
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

    #[test]
    fn the_html_is_self_contained_and_embeds_the_table() {
        let c = mlp();
        let page = html(&c.graph, &c.plan, &c.report);
        assert!(!page.contains("http://") && !page.contains("https://"));
        assert!(!page.contains("<script") && !page.contains("src="));
        assert!(page.contains(&escape(&c.report.table())));
        assert!(page.contains("<pre class=\"report\">"));
        let body = &page[page.find("<html").unwrap()..];
        well_formed(body.replace("<meta charset=\"utf-8\">", "").as_str()).unwrap();
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
    }
}
