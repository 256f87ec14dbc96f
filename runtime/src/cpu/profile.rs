//! Where a CPU step's time goes, op by op: with `INGOT_CPU_PROFILE=1` in the environment, a
//! loaded step times every instruction of every step it runs and, when it is dropped, prints
//! to stderr the costliest kinds of op (by name and shapes) with their total time, calls and
//! share of the steps' time, then the whole step's time summed by kind (every row, not only
//! those printed: [`kind`]). Off by default: a step then reads no clock. The counters are
//! made when the step is loaded, so a profiled step still allocates nothing per step.

use ingot_compiler::ir::{Graph, Op};
use ingot_compiler::lower::cpu::Instr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Rows of the printed table.
const ROWS: usize = 40;

/// Nanoseconds spent in each instruction of a program, summed over the steps run.
pub(crate) struct Profile {
    nanos: Vec<AtomicU64>,
    steps: AtomicU64,
}

impl Profile {
    /// Counters for a program of `instrs` instructions when `INGOT_CPU_PROFILE=1`, else none.
    pub(crate) fn from_env(instrs: usize) -> Option<Profile> {
        let on = std::env::var("INGOT_CPU_PROFILE").is_ok_and(|v| v.trim() == "1");
        on.then(|| Profile {
            nanos: (0..instrs).map(|_| AtomicU64::new(0)).collect(),
            steps: AtomicU64::new(0),
        })
    }

    /// Adds the time since `since` to instruction `k`.
    pub(crate) fn add(&self, k: usize, since: Instant) {
        let ns = since.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.nanos[k].fetch_add(ns, Ordering::Relaxed);
    }

    /// Counts one step run.
    pub(crate) fn step_done(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
    }

    /// The table: instructions grouped by op name and operand and result shapes, costliest
    /// first, in ms per step.
    pub(crate) fn report(&self, g: &Graph, instrs: &[Instr]) -> String {
        let steps = self.steps.load(Ordering::Relaxed).max(1) as f64;
        let mut rows: Vec<(String, u64, usize)> = Vec::new();
        let mut index = std::collections::HashMap::new();
        for (k, i) in instrs.iter().enumerate() {
            let label = label(g, i);
            let ns = self.nanos[k].load(Ordering::Relaxed);
            let r = *index.entry(label.clone()).or_insert_with(|| {
                rows.push((label, 0, 0));
                rows.len() - 1
            });
            rows[r].1 += ns;
            rows[r].2 += 1;
        }
        let total: u64 = rows.iter().map(|r| r.1).sum();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let ms = |ns: u64| ns as f64 / 1e6 / steps;
        let mut out = format!(
            "CPU step profile: {} steps, {:.1} ms a step in {} instructions\n{:>10} {:>6} {:>5}  op\n",
            steps,
            ms(total),
            instrs.len(),
            "ms/step",
            "share",
            "count"
        );
        for (label, ns, count) in rows.iter().take(ROWS) {
            out += &format!(
                "{:>10.2} {:>5.1}% {:>5}  {label}\n",
                ms(*ns),
                100.0 * *ns as f64 / total.max(1) as f64,
                count
            );
        }
        // Every row, summed by kind, in the order of `KINDS`.
        let mut by_kind = [(0u64, 0usize); KINDS.len()];
        for (label, ns, count) in &rows {
            let k = kind(label);
            by_kind[k].0 += ns;
            by_kind[k].1 += count;
        }
        out += &format!(
            "{:>10} {:>6} {:>5}  kind (all {} rows)\n",
            "ms/step",
            "share",
            "count",
            rows.len()
        );
        for (name, (ns, count)) in KINDS.iter().zip(by_kind) {
            out += &format!(
                "{:>10.2} {:>5.1}% {:>5}  {name}\n",
                ms(ns),
                100.0 * ns as f64 / total.max(1) as f64,
                count
            );
        }
        out
    }
}

/// The kinds a profile's rows are summed by ([`kind`]).
const KINDS: [&str; 8] = [
    "convolutions, forward",
    "convolutions, input gradients",
    "convolutions, weight gradients",
    "fused, with reductions",
    "fused, elementwise",
    "matmuls",
    "pooling",
    "the rest",
];

/// The index in [`KINDS`] of a row labelled `label` (`name operand shapes -> shape`): a
/// fused kernel with reduce axes is "with reductions" (its reduction may be over axes of
/// size 1), one without is elementwise.
fn kind(label: &str) -> usize {
    let name = label.split_whitespace().next().unwrap_or("");
    match name {
        "conv2d" | "conv2d_nhwc" => 0,
        n if n.starts_with("conv") && n.contains("grad_input") => 1,
        n if n.starts_with("conv") && n.contains("grad_weight") => 2,
        _ if label.starts_with("fused(") && !label.contains("reduce [])") => 3,
        _ if label.starts_with("fused(") => 4,
        n if n.contains("matmul") => 5,
        n if n.contains("pool") => 6,
        _ => 7,
    }
}

/// An instruction's op name with its operands' and result's shapes (`[128,64,8,8]`).
fn label(g: &Graph, i: &Instr) -> String {
    let node = g.node(i.node());
    let name = match (&node.op, i) {
        (Op::Fused(k), _) => format!("fused(domain {:?}, reduce {:?})", k.domain, k.reduce_axes),
        (_, Instr::CopyIn { .. }) => "copy_in".into(),
        (_, Instr::CopyOut { .. }) => "copy_out".into(),
        (op, _) => op.name().to_string(),
    };
    let shape = |dims: &[usize]| {
        let d: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
        format!("[{}]", d.join(","))
    };
    let ins: Vec<String> = node
        .inputs
        .iter()
        .take(3)
        .map(|&x| shape(g.ty(x).shape.dims()))
        .collect();
    format!(
        "{name} {} -> {}",
        ins.join(" "),
        shape(node.ty.shape.dims())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_rows_sum_by_kind_from_their_labels() {
        let k = |l: &str| KINDS[kind(l)];
        assert_eq!(
            k("conv2d [128,3,32,32] [64,3,7,7] -> [128,64,16,16]"),
            KINDS[0]
        );
        assert_eq!(
            k("conv2d_grad_input [128,64,8,8] [64,64,3,3] -> [128,64,8,8]"),
            KINDS[1]
        );
        assert_eq!(
            k("conv2d_grad_weight [128,64,8,8] [128,64,8,8] -> [64,64,3,3]"),
            KINDS[2]
        );
        let red = "fused(domain [128, 256, 2, 2], reduce [0, 2, 3]) [128,256,2,2] -> [1,256,1,1]";
        assert_eq!(k(red), KINDS[3]);
        let flat = "fused(domain [128, 256, 2, 2], reduce []) [128,256,2,2] -> [128,256,2,2]";
        assert_eq!(k(flat), KINDS[4]);
        assert_eq!(
            k("max_pool2d_grad [128,64,16,16] [128,64,8,8] -> [128,64,16,16]"),
            KINDS[6]
        );
        assert_eq!(k("matmul [128,512] [512,10] -> [128,10]"), KINDS[5]);
        assert_eq!(k("copy_in [128,10] -> [128,10]"), KINDS[7]);
    }
}
