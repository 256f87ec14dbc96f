//! Printing: a graph as its text form, one node a line (see the [grammar](super)).

use super::header::{MAGIC, VERSION};
use crate::ir::graph::Graph;
use crate::ir::op::{AttentionLayout, Axes, Init, LeafKind, Op};
use std::fmt::Write as _;

/// The text form of `g`; [`parse()`](super::parse()) reads it back into an equal graph.
pub fn print(g: &Graph) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{MAGIC} {VERSION}");
    for (i, n) in g.nodes().iter().enumerate() {
        let _ = write!(s, "%{i} = {}", n.op.name());
        if !n.inputs.is_empty() {
            s.push('(');
            for (k, x) in n.inputs.iter().enumerate() {
                if k > 0 {
                    s.push_str(", ");
                }
                let _ = write!(s, "{x}");
            }
            s.push(')');
        }
        write_attrs(&mut s, &n.op);
        let _ = writeln!(s, " : {}", n.ty);
    }
    for (name, id) in &g.outputs {
        let _ = writeln!(s, "output {} = {id}", quote(name));
    }
    for u in &g.updates {
        let _ = writeln!(s, "update {} = {}", u.target, u.value);
    }
    s
}

fn write_attrs(s: &mut String, op: &Op) {
    let list = |axes: &Axes| {
        let items: Vec<String> = axes.iter().map(|a| a.to_string()).collect();
        format!("[{}]", items.join(","))
    };
    let _ = match op {
        Op::Leaf { kind, name, init } => {
            let _ = write!(s, " {}", quote(name));
            if *kind != LeafKind::Input || *init != Init::Zeros {
                let _ = write!(s, " init=");
                match init {
                    Init::Zeros => s.push_str("zeros"),
                    Init::Ones => s.push_str("ones"),
                    Init::Normal { std } => {
                        let _ = write!(s, "normal({})", float(*std));
                    }
                    Init::Uniform { bound } => {
                        let _ = write!(s, "uniform({})", float(*bound));
                    }
                    Init::Ids { bound } => {
                        let _ = write!(s, "ids({bound})");
                    }
                }
            }
            Ok(())
        }
        Op::Full { value } => write!(s, " value={}", float(*value)),
        Op::Iota { axis } => write!(s, " axis={axis}"),
        Op::Transpose { perm } => write!(s, " perm={}", list(perm)),
        Op::Slice { axis, start, end } => write!(s, " axis={axis} start={start} end={end}"),
        Op::Concat { axis } => write!(s, " axis={axis}"),
        Op::Reduce { axes, .. } => write!(s, " axes={}", list(axes)),
        Op::ScatterAdd { rows } => write!(s, " rows={rows}"),
        Op::MatMul { ta, tb } | Op::MatMulAcc { ta, tb } => {
            let _ = match (ta, tb) {
                (false, false) => Ok(()),
                _ => write!(s, " ta={ta} tb={tb}"),
            };
            Ok(())
        }
        Op::Result { index } => write!(s, " index={index}"),
        Op::AllReduce { ranks } | Op::AllGather { ranks } | Op::ReduceScatter { ranks } => {
            write!(s, " ranks={ranks}")
        }
        Op::Dropout { p, salt } => write!(s, " p={} salt={salt}", float(*p)),
        Op::Attention {
            causal,
            scale,
            layout,
        }
        | Op::AttentionGrad {
            causal,
            scale,
            layout,
        } => {
            // The default layout is not written, so heads-layout text reads as it always has.
            match layout {
                AttentionLayout::Heads => write!(s, " causal={causal} scale={}", float(*scale)),
                l => write!(
                    s,
                    " causal={causal} scale={} layout={}",
                    float(*scale),
                    l.name()
                ),
            }
        }
        Op::Fused(k) => write!(
            s,
            " {}",
            quote(&serde_json::to_string(k).expect("a kernel serializes"))
        ),
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Broadcast
        | Op::Reshape
        | Op::Gather
        | Op::StopGradient
        | Op::Convert => Ok(()),
        Op::Window(w) => {
            w.write_attrs(s);
            Ok(())
        }
    };
}

/// An f64 in its shortest form that parses back to the same bits (NaN as `nan`).
fn float(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else {
        format!("{v:?}")
    }
}

/// A string in double quotes, with `"`, `\` and control characters escaped.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
