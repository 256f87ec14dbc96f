//! Liveness over a schedule: which storage each value lives in, and from when to when.
//!
//! One mechanism covers every case of sharing: a value either gets storage of its own or takes
//! over the storage of one of its operands.
//! - a `reshape` (or `stop_gradient`) is a view: it always shares its operand's storage;
//! - an elementwise op whose operand dies at that op, with the same byte size, writes over it,
//!   and so does a fused kernel's output over an input the kernel reads only at the output's
//!   own index ([`ingot_kernels::FusedKernel::can_write_over`]);
//! - output `i` of an all-reduce (data parallelism's gradient bucket) is written over
//!   operand `i` when that operand dies there;
//! - the new value of a parameter or optimizer state is written over the old one when every
//!   other reader of the old value has run (the scheduler orders them so).
//!
//! A storage's lifetime is the half-open interval of schedule positions `[def, last read + 1)`;
//! a value named as a step output lives to the end of the step. A fused kernel's extra outputs
//! ([`Op::Result`] nodes) are defined where their kernel runs, wherever the result node itself
//! is scheduled.

use crate::ir::{DType, Graph, NodeId, Op};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Where a storage lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Region {
    /// Parameters, optimizer state and inputs: they outlive the step.
    Resident,
    /// Everything the step makes and drops.
    Slab,
}

/// A run of bytes some values live in, one after another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Storage {
    pub region: Region,
    pub bytes: usize,
    /// The node whose value first lives here.
    pub owner: NodeId,
    /// First schedule position at which it holds a value.
    pub start: usize,
    /// One past the last schedule position at which it is read (or the step's length).
    pub end: usize,
    /// Scratch space of the owner's kernel (a library's workspace), live while it runs (and
    /// from where the operand that fills it is made, [`WorkspaceNeed::filled_from`]).
    pub workspace: bool,
}

/// The result of liveness analysis: the schedule, and each node's storage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Liveness {
    pub order: Vec<NodeId>,
    /// Schedule position of each node.
    pub position: Vec<usize>,
    /// Storage index of each node's value.
    pub storage_of: Vec<usize>,
    pub storages: Vec<Storage>,
    /// Updates whose new value could not be written in place: copied over the target at the end.
    pub copies: Vec<(NodeId, NodeId)>,
    /// Storage index of each node's kernel workspace, for kernels that need one.
    pub workspace_of: Vec<Option<usize>>,
}

/// The scratch space a node's kernel needs on the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceNeed {
    /// Bytes (0 for none).
    pub bytes: usize,
    /// The operand (by index) whose value alone fills the scratch, if one does: a scatter-add
    /// on the GPU sorts its ids there. The scratch is then live from where that value is
    /// made, so the launches that fill it can run as soon as it exists rather than at the
    /// node's turn, which is on the step's critical path. `None`: live only at the node.
    pub filled_from: Option<usize>,
}

impl WorkspaceNeed {
    /// Scratch live only while the node's kernel runs.
    pub fn at_node(bytes: usize) -> WorkspaceNeed {
        WorkspaceNeed {
            bytes,
            filled_from: None,
        }
    }
}

/// The schedule position from which value `x` (living in `region`) exists: the step's start
/// for one that outlives the step (an input), else where its kernel writes it.
pub fn made_at(g: &Graph, position: &[usize], region: Region, x: NodeId) -> usize {
    match region {
        Region::Resident => 0,
        Region::Slab => position[g.writer(x).index()],
    }
}

/// The scratch space a node's kernel needs on the target.
pub type WorkspaceFn = fn(&Graph, NodeId) -> WorkspaceNeed;

impl Liveness {
    /// Runs the analysis for `order`, which must be a valid schedule of `g`. `workspace` says
    /// how much scratch each node's kernel needs; each gets a storage live at its node, and
    /// from where the operand that fills it is made when one does
    /// ([`WorkspaceNeed::filled_from`]).
    pub fn analyse(g: &Graph, order: &[NodeId], workspace: Option<WorkspaceFn>) -> Liveness {
        let n = order.len();
        let mut position = vec![0; g.len()];
        for (p, &id) in order.iter().enumerate() {
            position[id.index()] = p;
        }
        let kernel_outputs = g.kernel_outputs();
        // Where each value is written: its kernel's position.
        let def: Vec<usize> = g.ids().map(|id| position[g.writer(id).index()]).collect();
        // The last position each value is read at; outputs are read at the step's end.
        let mut last_read: Vec<usize> = def.clone();
        for id in g.ids() {
            for &x in g.reads(id) {
                last_read[x.index()] = last_read[x.index()].max(position[id.index()]);
            }
        }
        for &o in g.outputs.values() {
            last_read[o.index()] = n;
        }
        // An all-gather runs on a stream of its own and reads its operand until it is done,
        // which only the gathered value's readers are sure to follow: the operand lives until
        // the first of them. Freed at the gather's launch, its bytes would go to the next
        // kernels, and each would wait for the whole gather (an embedding's rows at the end of
        // the backward pass: the first layer's last gradients and the sum's index behind them).
        // A reduce-scatter's operands are the same (its outputs are buffers of their own, and
        // its result nodes are only names of them, not readers).
        let gathers: Vec<NodeId> = g
            .ids()
            .filter(|&id| {
                matches!(
                    g.node(id).op,
                    Op::AllGather { .. } | Op::ReduceScatter { .. }
                )
            })
            .collect();
        let users = if gathers.is_empty() {
            Vec::new()
        } else {
            g.users()
        };
        for id in gathers {
            let first = kernel_outputs[id.index()]
                .iter()
                .flat_map(|&o| crate::schedule::readers_through_views(g, &users, o))
                .filter(|&r| !g.node(r).op.is_alias() && g.writer(r) != id)
                .map(|r| position[r.index()])
                .min();
            if let Some(first) = first {
                for &x in &g.node(id).inputs {
                    last_read[x.index()] = last_read[x.index()].max(first);
                }
            }
        }
        let update_target: Vec<Option<NodeId>> = {
            let mut t = vec![None; g.len()];
            for u in &g.updates {
                if t[u.value.index()].is_none() {
                    t[u.value.index()] = Some(u.target);
                }
            }
            t
        };

        let mut storages: Vec<Storage> = Vec::new();
        let mut storage_of = vec![usize::MAX; g.len()];
        let mut copies = Vec::new();
        let mut holds_output: Vec<bool> = Vec::new();
        // The latest last read among the values placed in each storage so far.
        let mut members_read: Vec<usize> = Vec::new();
        let mut rows = OutputRows::default();
        for &id in order {
            let node = g.node(id);
            let bytes = node.ty.bytes();
            // Decisions are taken where the value is written (its kernel's position).
            let p = def[id.index()];
            let reuse = if node.op.is_leaf() {
                None
            } else if node.op.is_alias() {
                Some(storage_of[node.inputs[0].index()])
            } else if let Op::AllReduce { .. } = g.node(g.writer(id)).op {
                // Output `i` of an all-reduce is written over operand `i` when that operand
                // dies here; otherwise it gets storage of its own and the operand is copied in
                // first (the collective then works in place on the outputs).
                let w = g.writer(id);
                let i = match node.op {
                    Op::Result { index } => index,
                    _ => 0,
                };
                let s = storage_of[g.node(w).inputs[i].index()];
                let st = &storages[s];
                (st.region == Region::Slab
                    && st.bytes == bytes
                    && st.end == p + 1
                    && !holds_output[s]
                    && !kernel_outputs[w.index()]
                        .iter()
                        .any(|&o| o != id && storage_of[o.index()] == s))
                .then_some(s)
            } else if let Some(t) = update_target[id.index()].filter(|&t| {
                // The new value of leaf t may be written over t when no other node reads
                // t's bytes after p (every value placed in t's storage so far is last read
                // no later than p), and its kernel reads t only at its own index.
                let st = storage_of[t.index()];
                storages[st].region == Region::Resident
                    && g.ty(id).bytes() == storages[st].bytes
                    && members_read[st] <= p
                    && writes_over_safely(g, &storage_of, &mut rows, id, st)
            }) {
                Some(storage_of[t.index()])
            } else {
                g.reads(g.writer(id))
                    .iter()
                    .map(|x| storage_of[x.index()])
                    .find(|&s| {
                        let st = &storages[s];
                        // The cheap tests first: the kernel's operand scan is asked only of
                        // a storage that dies here at the right size (a kernel reading
                        // thousands of values would otherwise scan them for each one).
                        st.region == Region::Slab
                        && st.bytes == bytes
                        && st.end == p + 1
                        && !holds_output[s]
                        && writes_over_safely(g, &storage_of, &mut rows, id, s)
                        // Two outputs of one kernel never share a storage.
                        && !kernel_outputs[g.writer(id).index()].iter().any(|&o| {
                            o != id && storage_of[o.index()] == s
                        })
                    })
            };
            let s = match reuse {
                Some(s) => s,
                None => {
                    let region = if node.op.is_leaf() {
                        Region::Resident
                    } else {
                        Region::Slab
                    };
                    storages.push(Storage {
                        region,
                        bytes,
                        owner: id,
                        start: p,
                        end: p + 1,
                        workspace: false,
                    });
                    storages.len() - 1
                }
            };
            storage_of[id.index()] = s;
            if holds_output.len() < storages.len() {
                holds_output.push(false);
                members_read.push(0);
            }
            // A new value not written over its leaf is copied there at the step's end: it is
            // read then, like an output, so no later value may take its storage.
            let copied = update_target[id.index()].is_some_and(|t| storage_of[t.index()] != s);
            let read_until = if copied { n } else { last_read[id.index()] };
            members_read[s] = members_read[s].max(read_until);
            holds_output[s] |= read_until == n;
            let st = &mut storages[s];
            st.end = st.end.max((read_until + 1).min(n));
        }
        for u in &g.updates {
            if storage_of[u.value.index()] != storage_of[u.target.index()] {
                copies.push((u.value, u.target));
                // The value must survive until the copy at the step's end.
                let s = storage_of[u.value.index()];
                storages[s].end = n;
            }
        }
        let mut workspace_of = vec![None; g.len()];
        if let Some(ws) = workspace {
            for (p, &id) in order.iter().enumerate() {
                let WorkspaceNeed { bytes, filled_from } = ws(g, id);
                if bytes > 0 {
                    // Held from where the operand is made.
                    let start =
                        (filled_from.and_then(|i| g.node(id).inputs.get(i))).map_or(p, |&x| {
                            made_at(g, &position, storages[storage_of[x.index()]].region, x).min(p)
                        });
                    storages.push(Storage {
                        region: Region::Slab,
                        bytes,
                        owner: id,
                        start,
                        end: p + 1,
                        workspace: true,
                    });
                    workspace_of[id.index()] = Some(storages.len() - 1);
                }
            }
        }
        for s in &mut storages {
            if s.region == Region::Resident {
                s.start = 0;
                s.end = n;
            }
        }
        Liveness {
            order: order.to_vec(),
            position,
            storage_of,
            storages,
            copies,
            workspace_of,
        }
    }
}

/// Per fused kernel, [`ingot_kernels::FusedKernel::output_rows`] and `output_dtypes`, computed
/// once: asking the kernel output by output walks its body each time (quadratic for thousands
/// of outputs).
#[derive(Default)]
struct OutputRows(HashMap<NodeId, (Vec<bool>, Vec<DType>)>);

impl OutputRows {
    fn of(&mut self, g: &Graph, kernel: NodeId) -> &(Vec<bool>, Vec<DType>) {
        self.0
            .entry(kernel)
            .or_insert_with(|| match &g.node(kernel).op {
                Op::Fused(k) => (k.output_rows(), k.output_dtypes()),
                _ => Default::default(),
            })
    }
}

/// True when the kernel writing `v` may write it over storage `s`: every operand it reads from
/// `s` is read only at `v`'s own index. That holds for any operand of an elementwise op, for
/// the inputs a fused kernel's description allows ([`ingot_kernels::FusedKernel::can_write_over`]),
/// and for the accumulator `c` (operand 0, never `a` or `b`) of a `matmul_acc`, which the
/// GEMM adds its product into; one operand slot read any other way (the same buffer loaded
/// transposed, say) forbids it.
fn writes_over_safely(
    g: &Graph,
    storage_of: &[usize],
    rows: &mut OutputRows,
    v: NodeId,
    s: usize,
) -> bool {
    let writer = g.writer(v);
    let node = g.node(writer);
    let output = match g.node(v).op {
        Op::Result { index } => index,
        _ => 0,
    };
    node.inputs
        .iter()
        .enumerate()
        .filter(|(_, x)| storage_of[x.index()] == s)
        .all(|(i, _)| match &node.op {
            Op::Fused(k) => {
                let (r, d) = rows.of(g, writer);
                match (r.get(output), d.get(output)) {
                    (Some(&row), Some(&dtype)) => k.can_write_over_with(i, output, row, dtype),
                    _ => false,
                }
            }
            Op::MatMulAcc { .. } => i == 0,
            op => op.is_elementwise(),
        })
}
