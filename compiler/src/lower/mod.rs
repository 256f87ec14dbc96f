//! Lowering: a planned step becomes the program one backend runs, with nothing left to decide
//! at load time. Every operation names the byte offsets it reads and writes inside the step's
//! one allocation; library calls carry their parameters and their planned workspace; kernels
//! carry their source and launch shape. The runtime only loads this program (compiles the
//! kernel sources, makes the allocation) and runs it.
//!
//! - [`cpu`]: the CPU backend's instructions (which node runs where, in place or not);
//! - [`cuda`]: the CUDA backend's device operations (kernel launches, cuBLAS GEMMs, memsets,
//!   copies), the kernels' CUDA C, and the dependency graph ([`deps`]) the runtime captures.
//!
//! Lowering is where the plan is validated ([`MemoryPlan::validate`], the independent checker):
//! a program is addresses, and addresses are only as good as the plan they come from. Nothing
//! after this stage validates again, except a reader of a step executable file, which cannot
//! trust its bytes.

pub mod cpu;
pub mod cuda;
pub mod deps;
mod error;
mod offload;
mod outputs;
mod scatter;
mod target;

pub use error::LowerError;
pub use offload::{CopyIn, CopyOut};
pub use outputs::unnamed_outputs;
pub use scatter::ScatterPart;
pub use target::Target;

use crate::ir::{Graph, NodeId};
use crate::plan::{MemoryPlan, PlanOptions};
use crate::precision::Precision;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// What runs each distinct attention of `g` on `target` under `precision`, one line per
/// distinct op and shape with its count (what `ingot plan` shows): the shape, mask and scale,
/// then on CUDA the arithmetic and the kernels' names (or why there is no kernel), on the CPU
/// the reference kernel.
pub fn attention_kernels(g: &Graph, target: Target, precision: Precision) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for id in g.ids() {
        let node = g.node(id);
        if !node.op.is_attention() {
            continue;
        }
        let types: SmallVec<[&crate::ir::TensorType; 6]> =
            node.inputs.iter().map(|&x| g.ty(x)).collect();
        let Ok(p) = crate::ir::attention_problem(&node.op, &types) else {
            continue;
        };
        let mask = if p.causal { "causal " } else { "" };
        let what = match p.layout {
            crate::ir::AttentionLayout::Packed => format!(
                "{} packed qkv {} {mask}scale {}",
                node.op.name(),
                types[0],
                p.scale
            ),
            layout => format!(
                "{}{} q {} k,v {} {mask}scale {}",
                node.op.name(),
                match layout {
                    crate::ir::AttentionLayout::Tokens => " tokens",
                    _ => "",
                },
                types[0],
                types[1].shape,
                p.scale
            ),
        };
        let how = match target {
            Target::Cpu => "cpu::attention (f32 arithmetic)".to_string(),
            Target::Cuda => {
                use ingot_kernels::cuda::attention as a;
                let s = cuda::kernel_shape(&p, precision);
                let names = if matches!(node.op, crate::ir::Op::Attention { .. }) {
                    a::forward(&s).map(|k| format!("forward {}", k.name))
                } else {
                    a::backward(&s).map(|b| {
                        format!(
                            "backward {} {} {}",
                            b.preprocess.name, b.dkdv.name, b.dq.name
                        )
                    })
                };
                match names {
                    Ok(n) => format!("cuda {:?}: {n}", s.precision),
                    Err(e) => format!("cuda {:?}: no kernel ({e})", s.precision),
                }
            }
        };
        lines.push(format!("{what} -> {how}"));
    }
    tally(lines)
}

/// The kernels of `g`'s loss head, one line per distinct kernel with its count (what `ingot
/// plan` shows beside the attention kernels): the fused kernels that read the head's logits,
/// the outputs of the library calls (the head's matrix products, one per chunk of a head in
/// chunks) the loss depends on through fused kernels alone. Each line says its domain and
/// reduction, whether it writes over the logits in place (the loss's gradient written over
/// them) and on CUDA its launches.
pub fn loss_kernels(g: &Graph, plan: &MemoryPlan, target: Target) -> Vec<String> {
    use crate::fuse::{kind, Kind};
    use crate::ir::Op;
    let Some(&loss) = g.outputs.get(crate::autodiff::LOSS) else {
        return Vec::new();
    };
    // The head's products: the library calls reached from the loss through other nodes.
    let mut heads: Vec<NodeId> = Vec::new();
    let mut seen = vec![false; g.len()];
    let mut stack = vec![loss];
    while let Some(x) = stack.pop() {
        if std::mem::replace(&mut seen[x.index()], true) {
            continue;
        }
        match (&g.node(x).op, kind(g.node(x))) {
            (Op::MatMul { .. } | Op::MatMulAcc { .. }, _) => heads.push(x),
            // An extra output of a fused kernel: the kernel computed it.
            (Op::Result { .. }, _) => stack.push(g.node(x).inputs[0]),
            (_, Kind::Library | Kind::Leaf) => {}
            _ => stack.extend(g.node(x).inputs.iter().copied()),
        }
    }
    let base = |x: NodeId| crate::fuse::select::base(g, x);
    let mut lines: Vec<String> = Vec::new();
    for id in g.ids() {
        let Op::Fused(k) = &g.node(id).op else {
            continue;
        };
        let Some(&logits) = g
            .node(id)
            .inputs
            .iter()
            .find(|&&x| heads.contains(&base(x)))
        else {
            continue;
        };
        // Any of its outputs (the loss's gradient) written where the logits are.
        let at = plan.location(g, base(logits)).offset;
        let in_place = std::iter::once(id)
            .chain((1..k.outputs.len()).filter_map(|i| g.result_of(id, i)))
            .any(|o| plan.location(g, o).offset == at);
        let what = format!(
            "fused {:?} reduce {:?} in {} out {}{}",
            k.domain,
            k.reduce_axes,
            k.inputs.len(),
            k.outputs.len(),
            if in_place {
                ", written over the logits"
            } else {
                ""
            }
        );
        let how = match target {
            Target::Cpu => "cpu fused kernel".to_string(),
            Target::Cuda => match ingot_kernels::cuda::fused_program(k) {
                Ok(p) => {
                    let l: Vec<String> = p
                        .launches
                        .iter()
                        .map(|l| {
                            format!(
                                "{} grid {:?} block {:?}",
                                l.kernel.name, l.kernel.launch.grid, l.kernel.launch.block
                            )
                        })
                        .collect();
                    format!("cuda {}", l.join(", "))
                }
                Err(e) => format!("cuda: no kernel ({e})"),
            },
        };
        lines.push(format!("{what} -> {how}"));
    }
    tally(lines)
}

/// Each distinct line once, in the order first seen, with how many times it came
/// (`"  12 x line"`).
fn tally(lines: Vec<String>) -> Vec<String> {
    let mut counted: Vec<(String, usize)> = Vec::new();
    for line in lines {
        match counted.iter_mut().find(|(l, _)| *l == line) {
            Some((_, n)) => *n += 1,
            None => counted.push((line, 1)),
        }
    }
    counted
        .into_iter()
        .map(|(l, n)| format!("{n:>4} x {l}"))
        .collect()
}

impl Target {
    /// Scratch bytes node `id`'s kernel or library call needs on this target.
    pub fn workspace_bytes(self) -> fn(&Graph, NodeId) -> usize {
        match self {
            Target::Cpu => cpu::workspace_bytes,
            Target::Cuda => cuda::workspace_bytes,
        }
    }

    /// The attention shapes this target's fused kernels cover: every shape on the CPU; on CUDA
    /// those the kernel generator builds in every precision ([`cuda::attention_supported`]).
    /// Recognition fuses only these, so a step never reaches lowering with an attention its
    /// target cannot run.
    pub fn attention_supported(self) -> crate::recognize::Supported {
        match self {
            Target::Cpu => crate::recognize::any_shape,
            Target::Cuda => cuda::attention_supported,
        }
    }

    /// The row alignment, in elements, that matrix products are padded to on this target
    /// ([`crate::align`]): CUDA's tensor-core GEMMs want rows on 16-byte boundaries, and 64
    /// elements also fill whole tiles; the CPU's GEMM has no such need.
    pub fn matmul_alignment(self) -> Option<usize> {
        match self {
            Target::Cpu => None,
            Target::Cuda => Some(64),
        }
    }

    /// The scratch each node needs on this target, and what fills it
    /// ([`crate::plan::WorkspaceNeed`]): on CUDA a scatter-add's sorted ids, from its ids.
    pub fn workspace_need(self) -> crate::plan::WorkspaceFn {
        match self {
            Target::Cpu => |g, id| crate::plan::WorkspaceNeed::at_node(cpu::workspace_bytes(g, id)),
            Target::Cuda => cuda::workspace_need,
        }
    }

    /// Planner options for this target: its workspaces planned in the slab (on the CPU grown
    /// into the slab's free bytes where they run faster in more).
    pub fn plan_options(self) -> PlanOptions {
        PlanOptions {
            workspace: Some(self.workspace_need()),
            workspace_room: self.workspace_room(),
            ..Default::default()
        }
    }

    /// The bytes each node's workspace runs fastest in, granted from the slab bytes free
    /// around it once the offsets are solved ([`crate::plan::room`]): on the CPU a
    /// convolution's lanes ([`cpu::workspace_room`]). CUDA grows its convolutions' chunks
    /// under the step's peak instead (`WorkspaceNeed::up_to`).
    pub fn workspace_room(self) -> Option<crate::plan::room::WorkspaceRoomFn> {
        match self {
            Target::Cpu => Some(cpu::workspace_room),
            Target::Cuda => None,
        }
    }
}

/// A lowered step: the program of the backend it was lowered for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Program {
    Cpu(cpu::Program),
    Cuda(cuda::Program),
}

impl Program {
    /// The backend this program runs on.
    pub fn target(&self) -> Target {
        match self {
            Program::Cpu(_) => Target::Cpu,
            Program::Cuda(_) => Target::Cuda,
        }
    }

    /// A short text account of the program, stable across machines ([`cpu::Program::summary`],
    /// [`cuda::Program::summary`]).
    pub fn summary(&self) -> String {
        match self {
            Program::Cpu(p) => p.summary(),
            Program::Cuda(p) => p.summary(),
        }
    }

    /// Checks the program against the (validated) plan of `g`: every address lies inside the
    /// allocation, every kernel index and launch shape is sound, and (CUDA) the dependency
    /// graph orders every pair of operations that share a byte one of them writes. Lowering
    /// checks this of what it makes; a reader of a step executable checks it of what it reads,
    /// so that no file, however damaged, makes the runtime write outside its allocation.
    pub fn check(&self, g: &Graph, plan: &MemoryPlan) -> Result<(), LowerError> {
        match self {
            Program::Cpu(p) => p.check(g, plan),
            Program::Cuda(p) => {
                p.check(plan.total_bytes)?;
                p.check_offload(g, plan)
            }
        }
    }
}

/// Lowers `g` under `plan` for `target`, in `precision` (which decides the library calls'
/// math: TF32 tensor cores for f32 products under `tf32`). Validates the plan first with the
/// independent checker: lowering turns it into raw addresses that the runtime trusts.
pub fn lower(
    g: &Graph,
    plan: &MemoryPlan,
    target: Target,
    precision: Precision,
) -> Result<Program, LowerError> {
    if precision == Precision::Tf32 && target == Target::Cpu {
        return Err(LowerError::Precision { precision, target });
    }
    plan.validate(g)?;
    check_workspaces(g, plan, target)?;
    Ok(match target {
        Target::Cpu => Program::Cpu(cpu::lower(g, plan)?),
        Target::Cuda => {
            let p = cuda::lower(g, plan, precision)?;
            p.check_offload(g, plan)?;
            Program::Cuda(p)
        }
    })
}

/// The plan gives every node at least the scratch space `target`'s kernel needs there; a plan
/// made for another target (or by another version of the compiler) does not.
fn check_workspaces(g: &Graph, plan: &MemoryPlan, target: Target) -> Result<(), LowerError> {
    let needs = target.workspace_bytes();
    for id in g.ids() {
        let need = needs(g, id);
        let planned = plan.workspace(id).map_or(0, |w| w.bytes);
        if planned < need {
            return Err(LowerError::at(
                g,
                id,
                LowerError::Workspace {
                    target,
                    planned,
                    need,
                },
            ));
        }
    }
    Ok(())
}
