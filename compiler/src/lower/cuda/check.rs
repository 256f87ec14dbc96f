//! A program is sound to run: its tables agree, every byte it touches lies inside the
//! allocation, and its dependency graph orders every conflicting pair.

use super::{DeviceOp, Program};
use crate::ir::NodeId;
use crate::lower::deps;
use crate::lower::offload::{check_copies, OffloadCopy};
use crate::lower::LowerError;
use crate::plan::{Location, MemoryPlan};

impl Program {
    /// The program is sound to run in an allocation of `total_bytes`: its tables agree with
    /// each other (one touch and one dependency list per operation, every kernel index names
    /// a kernel, kernel names are distinct, launch shapes are launchable), every byte range an
    /// operation touches lies inside the allocation, and the dependency graph orders every pair
    /// of operations that share a byte one of them writes ([`deps::check`]). The plan's
    /// validator already checks buffers; this checks the lowering's own arithmetic (GEMM
    /// extents, kernel arguments) against the same bound, so a mistake here (or a damaged file)
    /// is an error, not a wild write.
    pub fn check(&self, total_bytes: usize) -> Result<(), LowerError> {
        let invalid = |reason: String| LowerError::Invalid {
            op: "cuda lowering",
            reason,
        };
        if self.total_bytes != total_bytes {
            return Err(invalid(format!(
                "the program is for an allocation of {} bytes, the plan's is {total_bytes}",
                self.total_bytes
            )));
        }
        if self.touches.len() != self.ops.len() {
            return Err(invalid(format!(
                "{} touch lists for {} operations",
                self.touches.len(),
                self.ops.len()
            )));
        }
        let mut names = std::collections::HashSet::new();
        for k in &self.kernels {
            if !names.insert(k.name.as_str()) {
                return Err(invalid(format!("kernel {} appears twice", k.name)));
            }
            let (grid, block) = (k.launch.grid, k.launch.block);
            let threads = block.iter().map(|&b| b as u64).product::<u64>();
            if grid.contains(&0) || block.contains(&0) || threads > 1024 {
                return Err(invalid(format!(
                    "kernel {} has launch shape grid {grid:?} block {block:?}: every dimension \
                     must be at least 1 and a block at most 1024 threads",
                    k.name
                )));
            }
        }
        for op in self.all_ops() {
            if let DeviceOp::Launch { kernel, .. } = op {
                if *kernel >= self.kernels.len() {
                    return Err(invalid(format!(
                        "a launch of kernel {kernel}, but the program has {}",
                        self.kernels.len()
                    )));
                }
            }
        }
        self.check_bounds()?;
        let collectives: Vec<usize> = (0..self.ops.len())
            .filter(|&i| self.ops[i].is_collective())
            .collect();
        if let Some(w) = collectives
            .windows(2)
            .find(|w| !self.deps.get(w[1]).is_some_and(|d| d.contains(&w[0])))
        {
            return Err(invalid(format!(
                "collective {} does not wait for collective {} before it: the ranks could run \
                 their collectives in different orders",
                w[1], w[0]
            )));
        }
        // A touch outside the allocation would make the dependency check meaningless.
        let inside = |l: &Location| {
            l.offset
                .checked_add(l.bytes)
                .is_some_and(|e| e <= total_bytes)
        };
        if !self
            .touches
            .iter()
            .all(|t| t.reads.iter().chain(&t.writes).all(inside))
        {
            return Err(invalid(
                "a touched byte range falls outside the allocation".into(),
            ));
        }
        deps::check(&self.touches, &self.deps).map_err(invalid)
    }

    /// Offload copy `op` lies inside the allocation and the host region.
    fn check_copy_bounds(&self, op: &DeviceOp) -> Result<(), LowerError> {
        let Some(OffloadCopy {
            leaf,
            host,
            device: dev,
            bytes,
            ..
        }) = offload_copy(op)
        else {
            return Ok(());
        };
        let fits = |at: usize, len: usize| at.checked_add(bytes).is_some_and(|e| e <= len);
        if fits(dev, self.total_bytes) && fits(host, self.host_bytes) {
            return Ok(());
        }
        Err(LowerError::Invalid {
            op: "cuda lowering",
            reason: format!(
                "an offload copy of {leaf} ({bytes} bytes at {dev}, host {host}) falls outside \
                 the {} bytes of the allocation or the {} byte host region",
                self.total_bytes, self.host_bytes
            ),
        })
    }

    /// The program's offload copies are exactly `plan`'s: its host region the plan's, one copy
    /// in and one out per offloaded leaf, each between the leaf's home and its staging buffer,
    /// and no offload on a program of several data-parallel ranks (each rank's copies of its
    /// shard have not run on several GPUs yet: refused rather than run untried).
    pub fn check_offload(&self, g: &crate::ir::Graph, plan: &MemoryPlan) -> Result<(), LowerError> {
        let invalid = |reason: String| LowerError::Invalid {
            op: "offload",
            reason,
        };
        if self.host_bytes != plan.host_bytes {
            return Err(invalid(format!(
                "the program's host region is {} bytes, the plan's {}",
                self.host_bytes, plan.host_bytes
            )));
        }
        if !plan.offload.is_empty() && self.ops.iter().any(DeviceOp::is_collective) {
            return Err(invalid(format!(
                "the plan keeps {} leaves in host memory, and a step of several data-parallel \
                 ranks does not run offload's copies on CUDA yet; train on one GPU, or raise \
                 --budget so that the step fits without offload",
                plan.offload.len()
            )));
        }
        let copies = self.ops.iter().filter_map(offload_copy);
        let staging =
            |leaf: NodeId| (leaf.index() < g.len()).then(|| plan.location(g, leaf).offset);
        check_copies(plan, copies, staging).map_err(invalid)?;
        Ok(())
    }

    /// A GEMM's bias epilogue ([`super::gemm::Epilogue`]) rides on one plain call, and its
    /// bias and its fallback's launch lie inside the allocation.
    /// Whether `bytes` bytes at `offset` lie inside the allocation.
    fn fits(&self, offset: usize, bytes: usize) -> bool {
        offset
            .checked_add(bytes)
            .is_some_and(|end| end <= self.total_bytes)
    }

    /// The error for `what`, which falls outside the allocation.
    fn outside(&self, what: String) -> LowerError {
        LowerError::Invalid {
            op: "cuda lowering",
            reason: format!(
                "{what} falls outside the {} bytes of the allocation",
                self.total_bytes
            ),
        }
    }

    /// The first of a launch's byte-offset arguments `args` past the allocation's end (an
    /// empty allocation still takes offset 0), if any.
    fn stray_arg(&self, args: &[usize]) -> Option<usize> {
        args.iter().copied().find(|&a| a >= self.total_bytes.max(1))
    }

    fn check_epilogue(&self, whole: &super::gemm::Gemm) -> Result<(), LowerError> {
        let Some(e) = &whole.epilogue else {
            return Ok(());
        };
        let bytes = whole.m * e.bias_dtype.size();
        let node = whole.node.index();
        if whole.split.is_some() || whole.batch != 1 || whole.accumulate {
            return Err(LowerError::Invalid {
                op: "cuda lowering",
                reason: format!(
                    "matmul node %{node} has a bias epilogue on a split, batched or accumulating \
                         GEMM: only one plain call takes one"
                ),
            });
        }
        if !self.fits(e.bias, bytes) {
            return Err(self.outside(format!(
                "matmul node %{node}: its bias, {bytes} bytes at {}",
                e.bias
            )));
        }
        if e.kernel >= self.kernels.len() {
            return Err(self.outside(format!(
                "matmul node %{node}: its epilogue's fallback kernel {}",
                e.kernel
            )));
        }
        if let Some(a) = self.stray_arg(&e.args) {
            return Err(self.outside(format!(
                "an argument of node %{} (matmul node %{node}'s epilogue) at {a}",
                e.node.index()
            )));
        }
        let Some(r) = &e.round else {
            return Ok(());
        };
        if r.kernel >= self.kernels.len() {
            return Err(self.outside(format!(
                "matmul node %{node}: its bias's rounding kernel {}",
                r.kernel
            )));
        }
        if let Some(a) = self.stray_arg(&r.args) {
            return Err(self.outside(format!(
                "an argument of matmul node %{node}'s bias rounding at {a}"
            )));
        }
        // The rounded bias lies in the tail of the GEMM's own workspace.
        let w = whole.workspace;
        if e.bias < w.offset || e.bias + bytes > w.offset + w.bytes {
            return Err(LowerError::Invalid {
                op: "cuda lowering",
                reason: format!(
                    "matmul node %{node}: its rounded bias, {bytes} bytes at {}, lies outside \
                     its workspace ({} bytes at {})",
                    e.bias, w.bytes, w.offset
                ),
            });
        }
        Ok(())
    }

    /// Every byte range an operation touches lies inside the allocation.
    pub(super) fn check_bounds(&self) -> Result<(), LowerError> {
        for op in self.all_ops() {
            match op {
                DeviceOp::Conv(c) => {
                    let [x, w, y] = c.tensors();
                    let named = [("x", x), ("w", w), ("y", y), ("workspace", c.workspace)];
                    if let Some((what, l)) =
                        named.iter().find(|(_, l)| !self.fits(l.offset, l.bytes))
                    {
                        return Err(self.outside(format!(
                            "convolution node %{}: its {what}, {} bytes at {}",
                            c.node.index(),
                            l.bytes,
                            l.offset
                        )));
                    }
                    // The fallback runs in the convolution's place, in one chain: launches
                    // and GEMMs of this node only.
                    if let Some(op) = c.fallback.iter().find(|op| {
                        !matches!(op, DeviceOp::Launch { .. } | DeviceOp::Gemm(_))
                            || op.node() != Some(c.node)
                    }) {
                        return Err(LowerError::Invalid {
                            op: "cuda lowering",
                            reason: format!(
                                "the fallback of convolution node %{} holds {op:?}: only the \
                                 node's launches and GEMMs may stand in for it",
                                c.node.index()
                            ),
                        });
                    }
                }
                DeviceOp::Launch { node, args, .. } => {
                    if let Some(a) = self.stray_arg(args) {
                        return Err(
                            self.outside(format!("an argument of node %{} at {a}", node.index()))
                        );
                    }
                }
                DeviceOp::Gemm(whole) => {
                    if let Some(sp) = whole.split {
                        let free = if sp.second { whole.n } else { whole.m };
                        if sp.at == 0 || sp.at >= free {
                            return Err(self.outside(format!(
                                "matmul node %{}: a split at {} of {free}",
                                whole.node.index(),
                                sp.at,
                            )));
                        }
                    }
                    let calls = whole.calls();
                    // A call with nothing to multiply would write zeros, not leave bytes.
                    if calls.len() > 1 && calls.iter().any(|c| c.m == 0 || c.n == 0 || c.k == 0) {
                        return Err(self.outside(format!(
                            "matmul node %{}: a split leaves a call empty",
                            whole.node.index(),
                        )));
                    }
                    for gm in &calls {
                        // A column-major `rows × cols` matrix of `e`-byte elements with leading
                        // dimension `ld`, `batch` times at `stride` elements apart, spans this
                        // many bytes.
                        let span =
                            |e: usize, stride: usize, rows: usize, cols: usize, ld: usize| {
                                if rows == 0 || cols == 0 || gm.batch == 0 {
                                    return 0;
                                }
                                ((gm.batch - 1) * stride + (cols - 1) * ld + rows) * e
                            };
                        // cuBLAS's first operand is m×k (k×m transposed); its second k×n (n×k).
                        let (fr, fc) = if gm.trans_first {
                            (gm.k, gm.m)
                        } else {
                            (gm.m, gm.k)
                        };
                        let (sr, sc) = if gm.trans_second {
                            (gm.n, gm.k)
                        } else {
                            (gm.k, gm.n)
                        };
                        let (eo, e) = (gm.operand_dtype().size(), gm.dtype.size());
                        let checks = [
                            (gm.first, span(eo, gm.stride_first, fr, fc, gm.ld_first)),
                            (gm.second, span(eo, gm.stride_second, sr, sc, gm.ld_second)),
                            (gm.out, span(e, gm.stride_out, gm.m, gm.n, gm.ld_out)),
                            (gm.workspace.offset, gm.workspace.bytes),
                        ];
                        if let Some((o, b)) = checks.iter().find(|(o, b)| !self.fits(*o, *b)) {
                            return Err(self.outside(format!(
                                "matmul node %{}: {b} bytes at {o}",
                                gm.node.index()
                            )));
                        }
                    }
                    self.check_epilogue(whole)?;
                }
                DeviceOp::Zero { offset, bytes } => {
                    if !self.fits(*offset, *bytes) {
                        return Err(self.outside(format!("a memset of {bytes} bytes at {offset}")));
                    }
                }
                DeviceOp::Copy { from, to, bytes } => {
                    if !self.fits(*from, *bytes) || !self.fits(*to, *bytes) {
                        return Err(self.outside(format!("a copy of {bytes} bytes {from} -> {to}")));
                    }
                }
                DeviceOp::CopyIn { .. } | DeviceOp::CopyOut { .. } => self.check_copy_bounds(op)?,
                DeviceOp::AllGather {
                    node,
                    from,
                    to,
                    bytes,
                    ranks,
                } => {
                    let all = bytes.checked_mul(*ranks).unwrap_or(usize::MAX);
                    if !self.fits(*from, *bytes) || !self.fits(*to, all) {
                        return Err(self.outside(format!(
                            "the all-gather of node %{}: {bytes} bytes at {from} into {to}",
                            node.index()
                        )));
                    }
                    if *from < to + all && *to < from + bytes {
                        return Err(self.outside(format!(
                            "the all-gather of node %{} onto its own operand",
                            node.index()
                        )));
                    }
                }
                DeviceOp::AllReduce {
                    node,
                    offset,
                    bytes,
                    ..
                } => {
                    if !self.fits(*offset, *bytes) {
                        return Err(self.outside(format!(
                            "the all-reduce of node %{}: {bytes} bytes at {offset}",
                            node.index()
                        )));
                    }
                }
                DeviceOp::ReduceScatter {
                    node, parts, ranks, ..
                } => {
                    // The parts run together: each output apart from every operand and from
                    // the other outputs.
                    let sent = |p: &crate::lower::ScatterPart| p.bytes.saturating_mul(*ranks);
                    if let Some(p) = parts
                        .iter()
                        .find(|p| !self.fits(p.from, sent(p)) || !self.fits(p.to, p.bytes))
                    {
                        return Err(self.outside(format!(
                            "the reduce-scatter of node %{}: {} bytes at {} into {}",
                            node.index(),
                            sent(p),
                            p.from,
                            p.to
                        )));
                    }
                    let apart = |a: usize, an: usize, b: usize, bn: usize| {
                        an == 0 || bn == 0 || a + an <= b || b + bn <= a
                    };
                    for (j, o) in parts.iter().enumerate() {
                        if parts.iter().any(|x| !apart(o.to, o.bytes, x.from, sent(x)))
                            || parts[j + 1..]
                                .iter()
                                .any(|o2| !apart(o.to, o.bytes, o2.to, o2.bytes))
                        {
                            return Err(LowerError::Invalid {
                                op: "cuda lowering",
                                reason: format!(
                                    "output {j} of the reduce-scatter of node %{} is placed over \
                                     an operand or another output",
                                    node.index()
                                ),
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Operation `op` as the offload check reads a copy; `None` for any other operation.
fn offload_copy(op: &DeviceOp) -> Option<OffloadCopy> {
    match *op {
        DeviceOp::CopyIn(c) => Some(c.into()),
        DeviceOp::CopyOut(c) => Some(c.into()),
        _ => None,
    }
}
