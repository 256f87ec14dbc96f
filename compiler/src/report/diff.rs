//! What changed between two memory plans (`ingot plan --diff OLD.json NEW.json`): the totals,
//! and the buffers that appeared, disappeared, grew or shrank, keyed by provenance and kind
//! ([`Report::by_provenance`]) rather than by node id, so that two compiler versions, whose node
//! ids differ, still compare layer by layer. Meant for CI logs when a plan snapshot fails.

use super::{human, BufferKind, Report, SourceBytes, REPORT_VERSION};
use std::collections::BTreeMap;
use std::fmt::{self, Write};

/// A figure before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub what: &'static str,
    pub old: usize,
    pub new: usize,
}

/// The buffers of one provenance and kind, before and after (0 bytes and 0 buffers where
/// absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceChange {
    pub provenance: String,
    pub kind: BufferKind,
    pub old_bytes: usize,
    pub new_bytes: usize,
    pub old_buffers: usize,
    pub new_buffers: usize,
}

/// Every difference between two plan reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanDiff {
    pub old_model: String,
    pub new_model: String,
    /// Totals that differ (total, resident, slab, LOAD, peak, buffers count).
    pub totals: Vec<Change>,
    /// The op at the peak, when it moved (provenance, then `%id op`).
    pub peak_op: Option<(String, String)>,
    /// Sources present only in the new plan.
    pub appeared: Vec<SourceChange>,
    /// Sources present only in the old plan.
    pub disappeared: Vec<SourceChange>,
    /// Sources whose bytes or buffer count went up.
    pub grew: Vec<SourceChange>,
    /// Sources whose bytes or buffer count went down.
    pub shrank: Vec<SourceChange>,
}

/// Why two documents cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{what} is not a plan report (`ingot plan --json`): {reason}")]
    NotAReport { what: String, reason: String },
    #[error("{what} is a version {found} plan report; this ingot compares version {REPORT_VERSION} (rerun `ingot plan --json` with this ingot)")]
    Version { what: String, found: u32 },
}

/// Reads a plan report (`ingot plan --json`) for [`diff`]; `what` names it in errors.
pub fn read_report(what: &str, json: &str) -> Result<Report, DiffError> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| DiffError::NotAReport {
        what: what.into(),
        reason: e.to_string(),
    })?;
    let found = v
        .get("version")
        .and_then(|x| x.as_u64())
        .ok_or_else(|| DiffError::NotAReport {
            what: what.into(),
            reason: "it has no \"version\" field".into(),
        })?;
    if found != REPORT_VERSION as u64 {
        return Err(DiffError::Version {
            what: what.into(),
            found: found.min(u32::MAX as u64) as u32,
        });
    }
    serde_json::from_value(v).map_err(|e| DiffError::NotAReport {
        what: what.into(),
        reason: e.to_string(),
    })
}

/// The differences from `old` to `new`.
pub fn diff(old: &Report, new: &Report) -> PlanDiff {
    let figures = |r: &Report| {
        [
            ("total", r.total_bytes),
            ("resident", r.resident_bytes),
            ("slab", r.slab_bytes),
            ("lower bound (LOAD)", r.lower_bound_bytes),
            ("slab buffers", r.slab_buffers),
        ]
    };
    let totals = figures(old)
        .into_iter()
        .zip(figures(new))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((what, a), (_, b))| Change {
            what,
            old: a,
            new: b,
        })
        .collect();
    let peak = |r: &Report| r.peak_label();
    let peak_op = (old.peak_provenance != new.peak_provenance).then(|| (peak(old), peak(new)));
    type Key = (String, BufferKind);
    let index = |r: &Report| -> BTreeMap<Key, SourceBytes> {
        let mut m: BTreeMap<Key, SourceBytes> = BTreeMap::new();
        for s in &r.by_provenance {
            m.entry((s.provenance.clone(), s.kind))
                .and_modify(|e| {
                    e.bytes += s.bytes;
                    e.buffers += s.buffers;
                })
                .or_insert_with(|| s.clone());
        }
        m
    };
    let (a, b) = (index(old), index(new));
    let mut out = PlanDiff {
        old_model: old.model.clone(),
        new_model: new.model.clone(),
        totals,
        peak_op,
        appeared: Vec::new(),
        disappeared: Vec::new(),
        grew: Vec::new(),
        shrank: Vec::new(),
    };
    let change = |k: &Key, x: Option<&SourceBytes>, y: Option<&SourceBytes>| SourceChange {
        provenance: k.0.clone(),
        kind: k.1,
        old_bytes: x.map_or(0, |s| s.bytes),
        new_bytes: y.map_or(0, |s| s.bytes),
        old_buffers: x.map_or(0, |s| s.buffers),
        new_buffers: y.map_or(0, |s| s.buffers),
    };
    let keys: std::collections::BTreeSet<&Key> = a.keys().chain(b.keys()).collect();
    for k in keys {
        let (x, y) = (a.get(k), b.get(k));
        let c = change(k, x, y);
        match (x, y) {
            (None, Some(_)) => out.appeared.push(c),
            (Some(_), None) => out.disappeared.push(c),
            _ if (c.new_bytes, c.new_buffers) > (c.old_bytes, c.old_buffers) => out.grew.push(c),
            _ if (c.new_bytes, c.new_buffers) < (c.old_bytes, c.old_buffers) => out.shrank.push(c),
            _ => {}
        }
    }
    // Largest change first, then by name: the lines a reader wants are on top.
    let by_size = |v: &mut Vec<SourceChange>| {
        v.sort_by(|x, y| {
            let d = |c: &SourceChange| c.new_bytes.abs_diff(c.old_bytes);
            d(y).cmp(&d(x))
                .then_with(|| (&x.provenance, x.kind).cmp(&(&y.provenance, y.kind)))
        })
    };
    by_size(&mut out.appeared);
    by_size(&mut out.disappeared);
    by_size(&mut out.grew);
    by_size(&mut out.shrank);
    out
}

impl PlanDiff {
    /// True when the plans are the same as far as the report can tell.
    pub fn is_empty(&self) -> bool {
        self.totals.is_empty()
            && self.peak_op.is_none()
            && self.appeared.is_empty()
            && self.disappeared.is_empty()
            && self.grew.is_empty()
            && self.shrank.is_empty()
    }
}

/// `+1.50 MiB` / `-512 B`.
fn signed(old: usize, new: usize) -> String {
    if new >= old {
        format!("+{}", human(new - old))
    } else {
        format!("-{}", human(old - new))
    }
}

fn section(
    o: &mut String,
    title: &str,
    rows: &[SourceChange],
    bytes_of: fn(&SourceChange) -> String,
) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(o, "{title} ({}):", rows.len());
    let header = [
        "provenance".to_string(),
        "kind".into(),
        "buffers".into(),
        "bytes".into(),
    ];
    let table: Vec<[String; 4]> = rows
        .iter()
        .take(ROWS_LISTED)
        .map(|c| {
            let buffers =
                if c.old_buffers == c.new_buffers || c.old_buffers == 0 || c.new_buffers == 0 {
                    c.new_buffers.max(c.old_buffers).to_string()
                } else {
                    format!("{} -> {}", c.old_buffers, c.new_buffers)
                };
            [
                c.provenance.clone(),
                c.kind.to_string(),
                buffers,
                bytes_of(c),
            ]
        })
        .collect();
    o.push_str(&super::columns(&header, &table, &[2, 3]));
    if rows.len() > ROWS_LISTED {
        let rest = &rows[ROWS_LISTED..];
        let bytes: usize = rest.iter().map(|c| c.new_bytes.abs_diff(c.old_bytes)).sum();
        let _ = writeln!(
            o,
            "  ... and {} more ({} changed in all)",
            rest.len(),
            human(bytes)
        );
    }
}

/// Rows listed per section (largest changes first); the rest are counted.
pub const ROWS_LISTED: usize = 25;

impl fmt::Display for PlanDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut o = String::new();
        if self.old_model == self.new_model {
            let _ = writeln!(o, "memory plan of {}: old -> new", self.old_model);
        } else {
            let _ = writeln!(
                o,
                "memory plan: {} (old) -> {} (new)",
                self.old_model, self.new_model
            );
        }
        if self.is_empty() {
            o.push_str("no differences\n");
            return f.write_str(&o);
        }
        if !self.totals.is_empty() {
            let header = ["".to_string(), "old".into(), "new".into(), "change".into()];
            let rows: Vec<[String; 4]> = self
                .totals
                .iter()
                .map(|c| {
                    let count = c.what == "slab buffers";
                    let show = |v: usize| if count { v.to_string() } else { human(v) };
                    let change = if count {
                        format!("{:+}", c.new as i64 - c.old as i64)
                    } else {
                        let pct = if c.old == 0 {
                            String::new()
                        } else {
                            format!(" ({:+.1}%)", (c.new as f64 / c.old as f64 - 1.0) * 100.0)
                        };
                        format!("{}{pct}", signed(c.old, c.new))
                    };
                    [c.what.to_string(), show(c.old), show(c.new), change]
                })
                .collect();
            o.push_str(&super::columns(&header, &rows, &[1, 2, 3]));
        }
        if let Some((a, b)) = &self.peak_op {
            let _ = writeln!(o, "the peak moved: {a} -> {b}");
        }
        section(&mut o, "buffers that appeared", &self.appeared, |c| {
            human(c.new_bytes)
        });
        section(&mut o, "buffers that disappeared", &self.disappeared, |c| {
            human(c.old_bytes)
        });
        // A source that grew or shrank: its bytes before and after, and the change.
        let resized = |c: &SourceChange| {
            format!(
                "{} -> {} ({})",
                human(c.old_bytes),
                human(c.new_bytes),
                signed(c.old_bytes, c.new_bytes)
            )
        };
        section(&mut o, "buffers that grew", &self.grew, resized);
        section(&mut o, "buffers that shrank", &self.shrank, resized);
        f.write_str(&o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Options;

    fn report(spec: &str) -> Report {
        crate::models::compile_model(spec, &Options::default())
            .unwrap()
            .report
    }

    #[test]
    fn a_plan_compared_with_itself_has_no_differences() {
        let r = report("mlp");
        let d = diff(&r, &r);
        assert!(d.is_empty(), "{d}");
        assert!(d.to_string().contains("no differences"));
    }

    #[test]
    fn a_longer_sequence_grows_the_buffers_of_every_layer_by_provenance() {
        let small = report("gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2");
        let big = report("gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=16,batch=2");
        let d = diff(&small, &big);
        assert!(!d.is_empty());
        assert!(
            d.totals.iter().any(|c| c.what == "total" && c.new > c.old),
            "{d}"
        );
        // The attention of block 0 grows (its scores are seq x seq), named by provenance.
        assert!(
            d.grew
                .iter()
                .any(|c| c.provenance.starts_with("blocks.0.attn") && c.new_bytes > c.old_bytes),
            "{d}"
        );
        let text = d.to_string();
        assert!(text.contains("buffers that grew"), "{text}");
        assert!(
            !text.contains('%') || text.contains("the peak moved"),
            "keyed by provenance, not node ids: {text}"
        );
    }

    #[test]
    fn a_layer_added_appears_and_a_layer_removed_disappears() {
        let one = report("gpt:vocab=64,d_model=32,layers=1,heads=4,d_ff=64,seq=8,batch=2");
        let two = report("gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2");
        let d = diff(&one, &two);
        assert!(
            d.appeared
                .iter()
                .any(|c| c.provenance == "blocks.1.fc.weight" && c.kind == BufferKind::Parameter),
            "{d}"
        );
        let back = diff(&two, &one);
        assert!(
            back.disappeared
                .iter()
                .any(|c| c.provenance == "blocks.1.fc.weight"),
            "{back}"
        );
        assert!(back.to_string().contains("buffers that disappeared"));
    }

    #[test]
    fn a_document_of_another_version_or_not_a_report_is_refused_by_name() {
        let e = read_report("old.json", r#"{"version": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("old.json") && e.contains("version 1"), "{e}");
        let e = read_report("x.json", "[1, 2]").unwrap_err().to_string();
        assert!(
            e.contains("x.json") && e.contains("not a plan report"),
            "{e}"
        );
        let r = report("mlp");
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(read_report("mlp.json", &json).unwrap(), r);
    }
}
