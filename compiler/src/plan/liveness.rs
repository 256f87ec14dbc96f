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
use smallvec::SmallVec;
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

#[cfg(test)]
impl Storage {
    /// A slab storage of `bytes` owned by node 0, live over `start..end`, no workspace: what
    /// the planner's unit tests lay out by hand.
    pub(crate) fn in_slab(bytes: usize, start: usize, end: usize) -> Storage {
        Storage {
            region: Region::Slab,
            bytes,
            owner: NodeId(0),
            start,
            end,
            workspace: false,
        }
    }
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
    /// Bytes (0 for none): the least the kernel runs in.
    pub bytes: usize,
    /// Bytes the kernel runs faster in, when more than `bytes` (a convolution's column buffer
    /// for a chunk of several images rather than one): the planner grants up to this where
    /// the step's peak leaves room (`grow_workspaces`). 0, or at most `bytes`: no more.
    pub up_to: usize,
    /// The operand (by index) whose value alone fills the scratch, if one does: a scatter-add
    /// on the GPU sorts its ids there. The scratch is then live from where that value is
    /// made, so the launches that fill it can run as soon as it exists rather than at the
    /// node's turn, which is on the step's critical path. `None`: live only at the node.
    pub filled_from: Option<usize>,
    /// Bytes the workspace counts at in the peak that the other workspaces grow up to, when
    /// more than `bytes` (0: `bytes`): a least lowered below what the target's other
    /// workspaces were measured growing beside (a channels-last convolution, which only cuDNN
    /// runs, planned cuDNN's floor where its im2col column and cuBLAS's space were) keeps their
    /// growth ceiling, so lowering it never shrinks what another kernel runs in
    /// (`grow_workspaces`).
    pub ceiling_bytes: usize,
}

impl WorkspaceNeed {
    /// Scratch live only while the node's kernel runs.
    pub fn at_node(bytes: usize) -> WorkspaceNeed {
        WorkspaceNeed {
            bytes,
            up_to: 0,
            filled_from: None,
            ceiling_bytes: 0,
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
        let mut last_read = last_reads(g, &position, &def, n);
        collective_operands_read_until_used(g, &position, &kernel_outputs, &mut last_read);
        let update_target = update_targets(g);

        let mut placing = Placing {
            g,
            kernel_outputs: &kernel_outputs,
            update_target: &update_target,
            storages: Vec::new(),
            storage_of: vec![usize::MAX; g.len()],
            holds_output: Vec::new(),
            members_read: Vec::new(),
            facts: KernelFacts::default(),
        };
        for &id in order {
            // Decisions are taken where the value is written (its kernel's position).
            placing.place(id, def[id.index()], last_read[id.index()], n);
        }
        let Placing {
            mut storages,
            storage_of,
            ..
        } = placing;
        let copies = update_copies(g, &storage_of, &mut storages, n);
        let (workspace_of, needs) = workspace.map_or_else(
            || (vec![None; g.len()], Vec::new()),
            |ws| add_workspaces(g, order, &position, &storage_of, &mut storages, ws),
        );
        for s in &mut storages {
            if s.region == Region::Resident {
                s.start = 0;
                s.end = n;
            }
        }
        if workspace.is_some() {
            let wanted: Vec<(usize, usize)> = needs.iter().map(|&(s, w)| (s, w.up_to)).collect();
            let lowered: Vec<(usize, usize)> = (needs.iter())
                .filter(|(_, w)| w.ceiling_bytes > w.bytes)
                .map(|&(s, w)| (s, w.ceiling_bytes))
                .collect();
            grow_workspaces(&mut storages, &wanted, &lowered, n);
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

/// The last position each value is read at (its definition `def` if never); outputs are read
/// at the step's end, `n`.
fn last_reads(g: &Graph, position: &[usize], def: &[usize], n: usize) -> Vec<usize> {
    let mut last_read: Vec<usize> = def.to_vec();
    for id in g.ids() {
        for &x in g.reads(id) {
            last_read[x.index()] = last_read[x.index()].max(position[id.index()]);
        }
    }
    for &o in g.outputs.values() {
        last_read[o.index()] = n;
    }
    last_read
}

/// An all-gather runs on a stream of its own and reads its operand until it is done,
/// which only the gathered value's readers are sure to follow: the operand lives until
/// the first of them. Freed at the gather's launch, its bytes would go to the next
/// kernels, and each would wait for the whole gather (an embedding's rows at the end of
/// the backward pass: the first layer's last gradients and the sum's index behind them).
/// A reduce-scatter's operands are the same (its outputs are buffers of their own, and
/// its result nodes are only names of them, not readers).
fn collective_operands_read_until_used(
    g: &Graph,
    position: &[usize],
    kernel_outputs: &[SmallVec<[NodeId; 1]>],
    last_read: &mut [usize],
) {
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
        crate::ir::Users::default()
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
}

/// For each node, the leaf its value updates (the first update naming it), if any.
fn update_targets(g: &Graph) -> Vec<Option<NodeId>> {
    let mut t = vec![None; g.len()];
    for u in &g.updates {
        if t[u.value.index()].is_none() {
            t[u.value.index()] = Some(u.target);
        }
    }
    t
}

/// The storages made so far while walking the schedule, and which one each value lives in.
struct Placing<'a> {
    g: &'a Graph,
    kernel_outputs: &'a [SmallVec<[NodeId; 1]>],
    update_target: &'a [Option<NodeId>],
    storages: Vec<Storage>,
    storage_of: Vec<usize>,
    holds_output: Vec<bool>,
    /// The latest last read among the values placed in each storage so far.
    members_read: Vec<usize>,
    facts: KernelFacts,
}

impl Placing<'_> {
    /// Places value `id`, written at position `p` and last read at `last_read`, in a storage
    /// it takes over or in a new one, and extends that storage's lifetime.
    fn place(&mut self, id: NodeId, p: usize, last_read: usize, n: usize) {
        let g = self.g;
        let node = g.node(id);
        let bytes = node.ty.bytes();
        let s = match self.reuse(id, p, bytes) {
            Some(s) => s,
            None => {
                let region = if node.op.is_leaf() {
                    Region::Resident
                } else {
                    Region::Slab
                };
                self.storages.push(Storage {
                    region,
                    bytes,
                    owner: id,
                    start: p,
                    end: p + 1,
                    workspace: false,
                });
                self.storages.len() - 1
            }
        };
        self.storage_of[id.index()] = s;
        if self.holds_output.len() < self.storages.len() {
            self.holds_output.push(false);
            self.members_read.push(0);
        }
        // A new value not written over its leaf is copied there at the step's end: it is
        // read then, like an output, so no later value may take its storage.
        let copied =
            self.update_target[id.index()].is_some_and(|t| self.storage_of[t.index()] != s);
        let read_until = if copied { n } else { last_read };
        self.members_read[s] = self.members_read[s].max(read_until);
        self.holds_output[s] |= read_until == n;
        let st = &mut self.storages[s];
        st.end = st.end.max((read_until + 1).min(n));
    }

    /// The storage value `id` (`bytes`, written at `p`) takes over, if one: its operand's for
    /// a view, an all-reduce's operand, the leaf it updates, or an operand dying here.
    fn reuse(&mut self, id: NodeId, p: usize, bytes: usize) -> Option<usize> {
        let g = self.g;
        let node = g.node(id);
        if node.op.is_leaf() {
            None
        } else if node.op.is_alias() {
            Some(self.storage_of[node.inputs[0].index()])
        } else if let Op::AllReduce { .. } = g.node(g.writer(id)).op {
            self.all_reduce_reuse(id, p, bytes)
        } else if let Some(t) =
            self.update_target[id.index()].filter(|&t| self.writes_over_leaf(id, t, p))
        {
            Some(self.storage_of[t.index()])
        } else {
            self.operand_reuse(id, p, bytes)
        }
    }

    /// Output `i` of an all-reduce is written over operand `i` when that operand dies here;
    /// otherwise it gets storage of its own and the operand is copied in first (the
    /// collective then works in place on the outputs).
    fn all_reduce_reuse(&self, id: NodeId, p: usize, bytes: usize) -> Option<usize> {
        let g = self.g;
        let w = g.writer(id);
        let i = match g.node(id).op {
            Op::Result { index } => index,
            _ => 0,
        };
        let s = self.storage_of[g.node(w).inputs[i].index()];
        let st = &self.storages[s];
        (st.region == Region::Slab
            && st.bytes == bytes
            && st.end == p + 1
            && !self.holds_output[s]
            && !self.kernel_outputs[w.index()]
                .iter()
                .any(|&o| o != id && self.storage_of[o.index()] == s))
        .then_some(s)
    }

    /// The new value `id` of leaf `t` may be written over t when no other node reads t's
    /// bytes after `p` (every value placed in t's storage so far is last read no later than
    /// `p`), and its kernel reads t only at its own index.
    fn writes_over_leaf(&mut self, id: NodeId, t: NodeId, p: usize) -> bool {
        let g = self.g;
        let st = self.storage_of[t.index()];
        self.storages[st].region == Region::Resident
            && g.ty(id).bytes() == self.storages[st].bytes
            && self.members_read[st] <= p
            && writes_over_safely(g, &self.storage_of, &mut self.facts, id, st)
    }

    /// The storage of an operand of `id`'s kernel that dies at `p`, of `bytes`, which the
    /// kernel may write `id` over.
    fn operand_reuse(&mut self, id: NodeId, p: usize, bytes: usize) -> Option<usize> {
        let g = self.g;
        let Placing {
            kernel_outputs,
            storages,
            storage_of,
            holds_output,
            facts,
            ..
        } = self;
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
                && writes_over_safely(g, storage_of, facts, id, s)
                // Two outputs of one kernel never share a storage.
                && !kernel_outputs[g.writer(id).index()].iter().any(|&o| {
                    o != id && storage_of[o.index()] == s
                })
            })
    }
}

/// The updates whose new value does not live in its target's storage: copied over the target
/// at the step's end, so the value's storage lives until then.
fn update_copies(
    g: &Graph,
    storage_of: &[usize],
    storages: &mut [Storage],
    n: usize,
) -> Vec<(NodeId, NodeId)> {
    let mut copies = Vec::new();
    for u in &g.updates {
        if storage_of[u.value.index()] != storage_of[u.target.index()] {
            copies.push((u.value, u.target));
            // The value must survive until the copy at the step's end.
            let s = storage_of[u.value.index()];
            storages[s].end = n;
        }
    }
    copies
}

/// The peak may grow by 1/`GROWTH_SLACK` of itself for workspaces that run faster in more
/// bytes: a few KiB of column buffer is not worth running a small net's convolutions an
/// image at a time.
const GROWTH_SLACK: usize = 64;

/// And by 1 MiB, however small the step: a small net's convolutions are bound by launches.
const MIN_GROWTH_SLACK: usize = 1 << 20;

/// Grants each workspace that runs faster in more bytes (`wanted`: storage index and
/// [`WorkspaceNeed::up_to`], in schedule order) what the step's peak leaves room for over its
/// lifetime. The peak with every workspace at its least is the least those workspaces allow,
/// so it stays the peak (within 1/[`GROWTH_SLACK`]): a workspace at the peak keeps about its
/// least bytes (a convolution there runs an image or a few at a time), one elsewhere grows
/// into the room below the peak, up to what it asks for. A plan never needs more than with
/// every workspace at its `up_to`. In schedule order, so the same step gets the same grants
/// on every machine.
///
/// `lowered` (storage index and [`WorkspaceNeed::ceiling_bytes`]) are workspaces whose least
/// was lowered below what the others grew beside: the others grow first, up to the ceiling of
/// the peak with the lowered ones at `ceiling_bytes` (so a lower floor elsewhere never runs an
/// im2col convolution in smaller chunks); then the lowered ones, into the room under the
/// larger of the peak with every workspace at its least and the peak the others' grants
/// reached, with no slack: their least runs (a cuDNN-only convolution's deterministic
/// algorithm needs no more), so they take only bytes the plan has anyway. With none lowered,
/// one pass as before.
pub(crate) fn grow_workspaces(
    storages: &mut [Storage],
    wanted: &[(usize, usize)],
    lowered: &[(usize, usize)],
    n: usize,
) {
    if wanted.iter().all(|&(s, up_to)| up_to <= storages[s].bytes) {
        return;
    }
    let mut live = live_bytes(storages, n);
    let least_peak = live.iter().copied().max().unwrap_or(0);
    let ceiling = with_slack(least_peak);
    let is_lowered = |s: usize| lowered.iter().any(|&(l, _)| l == s);
    let others: Vec<(usize, usize)> = (wanted.iter().copied())
        .filter(|&(s, _)| !is_lowered(s))
        .collect();
    let mine: Vec<(usize, usize)> = (wanted.iter().copied())
        .filter(|&(s, _)| is_lowered(s))
        .collect();
    if mine.is_empty() && lowered.is_empty() {
        grant(storages, &mut live, &others, ceiling, n);
        return;
    }
    let mut kept = live.clone();
    for &(s, bytes) in lowered {
        let st = &storages[s];
        let extra = bytes.saturating_sub(st.bytes);
        for l in &mut kept[st.start.min(n)..st.end.min(n)] {
            *l += extra;
        }
    }
    let kept_ceiling = with_slack(kept.iter().copied().max().unwrap_or(0));
    grant(storages, &mut live, &others, kept_ceiling, n);
    let reached = live.iter().copied().max().unwrap_or(0);
    grant(storages, &mut live, &mine, least_peak.max(reached), n);
}

/// `peak` and the slack workspaces may grow it by: a 1/[`GROWTH_SLACK`] of it, at least
/// [`MIN_GROWTH_SLACK`].
fn with_slack(peak: usize) -> usize {
    peak + (peak / GROWTH_SLACK).max(MIN_GROWTH_SLACK)
}

/// Slab bytes live at each position `0..=n`: a running sum of the storages' starts and ends.
fn live_bytes(storages: &[Storage], n: usize) -> Vec<usize> {
    let mut delta = vec![0isize; n + 1];
    for s in storages.iter().filter(|s| s.region == Region::Slab) {
        delta[s.start.min(n)] += s.bytes as isize;
        delta[s.end.min(n)] -= s.bytes as isize;
    }
    let mut live = vec![0usize; n + 1];
    let mut sum = 0isize;
    for (l, d) in live.iter_mut().zip(&delta) {
        sum += d;
        *l = sum as usize;
    }
    live
}

/// Grows each of `wanted` (in order) into the room under `ceiling` over its lifetime, up to
/// what it asks for, counting each grant in `live`.
fn grant(
    storages: &mut [Storage],
    live: &mut [usize],
    wanted: &[(usize, usize)],
    ceiling: usize,
    n: usize,
) {
    for &(i, up_to) in wanted {
        let s = &storages[i];
        if up_to <= s.bytes {
            continue;
        }
        let (start, end) = (s.start.min(n), s.end.min(n));
        let busiest = live[start..end].iter().copied().max().unwrap_or(ceiling);
        let room = (ceiling - busiest.min(ceiling)) / 256 * 256;
        let extra = (up_to - s.bytes).min(room);
        if extra == 0 {
            continue;
        }
        storages[i].bytes += extra;
        for l in &mut live[start..end] {
            *l += extra;
        }
    }
}

/// A storage for each kernel's scratch space that `ws` asks for; the storage index per node,
/// and each storage's need in schedule order. `ws` is asked once per node (it was asked again
/// for the needs: on the CPU each fused kernel's interpreter layout was worked out twice).
fn add_workspaces(
    g: &Graph,
    order: &[NodeId],
    position: &[usize],
    storage_of: &[usize],
    storages: &mut Vec<Storage>,
    ws: WorkspaceFn,
) -> (Vec<Option<usize>>, Vec<(usize, WorkspaceNeed)>) {
    let mut workspace_of = vec![None; g.len()];
    let mut needs = Vec::new();
    for (p, &id) in order.iter().enumerate() {
        let need = ws(g, id);
        let WorkspaceNeed {
            bytes, filled_from, ..
        } = need;
        if bytes > 0 {
            // Held from where the operand is made.
            let start = (filled_from.and_then(|i| g.node(id).inputs.get(i))).map_or(p, |&x| {
                made_at(g, position, storages[storage_of[x.index()]].region, x).min(p)
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
            needs.push((storages.len() - 1, need));
        }
    }
    (workspace_of, needs)
}

/// A kernel's operand slots by the storage each reads.
type SlotsByStorage = HashMap<usize, SmallVec<[usize; 2]>>;

/// What placement asks of a kernel, computed once per kernel: asked output by output, each
/// walk would be repeated for every output (quadratic for kernels of thousands of outputs and
/// operands).
#[derive(Default)]
struct KernelFacts {
    /// Per fused kernel, [`ingot_kernels::FusedKernel::output_rows`] and `output_dtypes`.
    rows: HashMap<NodeId, (Vec<bool>, Vec<DType>)>,
    /// For the kernel placed last, its operand slots by the storage each reads; its operands
    /// are all placed before it, so the map holds while its outputs are placed.
    slots: Option<(NodeId, SlotsByStorage)>,
}

impl KernelFacts {
    fn rows(&mut self, g: &Graph, kernel: NodeId) -> &(Vec<bool>, Vec<DType>) {
        self.rows
            .entry(kernel)
            .or_insert_with(|| match &g.node(kernel).op {
                Op::Fused(k) => (k.output_rows(), k.output_dtypes()),
                _ => Default::default(),
            })
    }

    /// The operand slots of `kernel` that read storage `s`.
    fn slots_reading(
        &mut self,
        g: &Graph,
        storage_of: &[usize],
        kernel: NodeId,
        s: usize,
    ) -> SmallVec<[usize; 2]> {
        if self.slots.as_ref().is_none_or(|(k, _)| *k != kernel) {
            let mut by_storage: HashMap<usize, SmallVec<[usize; 2]>> = HashMap::new();
            for (i, x) in g.node(kernel).inputs.iter().enumerate() {
                by_storage.entry(storage_of[x.index()]).or_default().push(i);
            }
            self.slots = Some((kernel, by_storage));
        }
        let (_, by_storage) = self.slots.as_ref().expect("just filled");
        by_storage.get(&s).cloned().unwrap_or_default()
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
    facts: &mut KernelFacts,
    v: NodeId,
    s: usize,
) -> bool {
    let writer = g.writer(v);
    let node = g.node(writer);
    let output = match g.node(v).op {
        Op::Result { index } => index,
        _ => 0,
    };
    let slots = facts.slots_reading(g, storage_of, writer, s);
    slots.into_iter().all(|i| match &node.op {
        Op::Fused(k) => {
            let (r, d) = facts.rows(g, writer);
            match (r.get(output), d.get(output)) {
                (Some(&row), Some(&dtype)) => k.can_write_over_with(i, output, row, dtype),
                _ => false,
            }
        }
        Op::MatMulAcc { .. } => i == 0,
        op => op.is_elementwise(),
    })
}

#[cfg(test)]
mod tests {
    use super::{grow_workspaces, Storage};

    fn storage(bytes: usize, start: usize, end: usize, workspace: bool) -> Storage {
        Storage {
            workspace,
            ..Storage::in_slab(bytes, start, end)
        }
    }

    /// Two workspaces asking for up to 64 MiB: the one at the step's peak (beside 256 MiB of
    /// values) keeps its least 256 bytes but for the slack, a 64th of the peak; the one beside
    /// 1 MiB gets all it asks for, and so does one asking for little.
    #[test]
    fn a_workspace_grows_into_the_room_below_the_peak_and_one_at_the_peak_keeps_its_least() {
        let mib = 1 << 20;
        let mut storages = vec![
            storage(mib, 0, 2, false),
            storage(256 * mib, 2, 4, false),
            storage(256, 1, 2, true),
            storage(256, 3, 4, true),
            storage(256, 0, 1, true),
        ];
        let peak = 256 * mib + 256;
        grow_workspaces(
            &mut storages,
            &[(4, 512), (2, 64 * mib), (3, 64 * mib)],
            &[],
            4,
        );
        assert_eq!(storages[3].bytes, 256 + peak / 64 / 256 * 256);
        assert_eq!(storages[3].bytes, 256 + 4 * mib);
        assert_eq!(storages[2].bytes, 64 * mib);
        assert_eq!(storages[4].bytes, 512);
    }

    /// A workspace whose least was lowered (a channels-last convolution's cuDNN floor, 1 MiB
    /// where its im2col column held 64) leaves the others the ceiling they had: the one beside
    /// 4 MiB of values grows to 64 MiB + 4 MiB's slack above the old 68 MiB peak, as with no
    /// floor lowered; the lowered one grows only into what the plan then has anyway, with no
    /// slack of its own, and without the others' grants keeps its least.
    #[test]
    fn a_lowered_least_keeps_the_other_workspaces_ceiling_and_grows_into_no_new_bytes() {
        let mib = 1 << 20;
        let storages = || {
            vec![
                storage(4 * mib, 0, 2, false),
                storage(10 * mib, 2, 4, false),
                storage(mib, 1, 2, true),
                storage(mib, 3, 4, true),
            ]
        };
        // Storage 3 was planned 64 MiB before its floor was lowered to 1 MiB.
        let lowered = [(3, 64 * mib)];
        let mut s = storages();
        grow_workspaces(&mut s, &[(2, 128 * mib), (3, 128 * mib)], &lowered, 4);
        let old_peak = 10 * mib + 64 * mib;
        let kept_ceiling = old_peak + old_peak / 64 / 256 * 256;
        assert_eq!(s[2].bytes, kept_ceiling - 4 * mib);
        // The peak the others reached is storage 2's position: storage 3 fills up to it.
        assert_eq!(s[3].bytes, kept_ceiling - 10 * mib);
        // With no grant beside it, the lowered one keeps its least: the least peak is
        // 11 MiB at its own position, and no slack is given.
        let mut s = storages();
        grow_workspaces(&mut s, &[(2, mib), (3, 64 * mib)], &lowered, 4);
        assert_eq!(s[3].bytes, mib);
        // Not lowered, the same workspace takes a 64th of the peak (at least 1 MiB).
        let mut s = storages();
        grow_workspaces(&mut s, &[(2, mib), (3, 64 * mib)], &[], 4);
        assert_eq!(s[3].bytes, 2 * mib);
    }

    /// Where every workspace fits its ask, the plan is the one with every workspace at it.
    #[test]
    fn workspaces_that_all_fit_get_all_they_ask_for() {
        let mut storages = vec![storage(1 << 20, 0, 3, false), storage(256, 1, 2, true)];
        grow_workspaces(&mut storages, &[(1, 4096)], &[], 3);
        assert_eq!(storages[1].bytes, 4096);
    }
}
