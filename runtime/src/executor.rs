//! What a loaded step is, whatever runs it: the CPU's [`PlannedStep`] and the GPU's
//! [`CudaStep`] both hold a step graph, its memory plan and the one allocation every value
//! lives in, and a training session (the `ingot-trainer` crate) drives either through this trait.
//!
//! [`PlannedStep`]: crate::cpu::planned::PlannedStep
//! [`CudaStep`]: crate::cuda::CudaStep

use crate::error::ExecError;
use crate::tensor::Tensor;
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::{DType, Graph, LeafKind, NodeId, TensorType};
use ingot_compiler::plan::Location;
use ingot_compiler::plan::MemoryPlan;

/// `bytes` as the value of node `id`, which holds `holds` bytes: an error naming both sizes
/// when they differ (what every executor's `write_node_bytes` checks first).
pub fn node_bytes_fit(id: NodeId, holds: usize, bytes: &[u8]) -> Result<(), ExecError> {
    match bytes.len() == holds {
        true => Ok(()),
        false => Err(ExecError::Invalid {
            op: "write_node_bytes",
            reason: format!(
                "node %{} holds {holds} bytes, not {}",
                id.index(),
                bytes.len()
            ),
        }),
    }
}

pub trait StepExecutor {
    fn graph(&self) -> &Graph;
    fn plan(&self) -> &MemoryPlan;
    /// Copies `bytes` (the node's value, little-endian, exactly its planned size) into node
    /// `id`'s memory: its planned location in the one allocation ([`StepExecutor::write_at`]).
    /// Executors of several allocations (the ranks, each holding its own) write each rank's
    /// shard instead.
    fn write_node_bytes(&mut self, id: NodeId, bytes: &[u8]) -> Result<(), ExecError> {
        let at = self.plan().location(self.graph(), id);
        node_bytes_fit(id, at.bytes, bytes)?;
        self.write_at(at, bytes)
    }
    /// Copies `bytes` (exactly `at.bytes` of them) into the one allocation at `at`, a location
    /// of the plan; allocates nothing. Only executors of one allocation have it.
    fn write_at(&mut self, _at: Location, _bytes: &[u8]) -> Result<(), ExecError> {
        Err(ExecError::Invalid {
            op: "write_at",
            reason: "this executor holds one allocation per rank: write a node's value \
                     (write_node_bytes), which it cuts into the ranks' shards"
                .into(),
        })
    }
    /// The current value of node `id` (a leaf, or an output after a step), copied to the host.
    fn read_node(&self, id: NodeId) -> Result<Tensor, ExecError>;
    /// Runs one step; allocates nothing.
    fn step(&mut self) -> Result<(), ExecError>;
    /// Bytes of the one allocation.
    fn allocated_bytes(&self) -> usize;
    /// Where the step runs, in words ("cpu", "cuda:0 NVIDIA H100 80GB HBM3").
    fn device(&self) -> String;
    /// The host threads the step's kernels run on (the CPU backend); `None` for a device.
    fn threads(&self) -> Option<usize> {
        None
    }
    /// The device's own time for the last step, where the backend measures it (CUDA events);
    /// `None` where the caller's wall clock is the measure.
    fn last_step_device_seconds(&self) -> Option<f64> {
        None
    }

    /// Writes each `(input, bytes)` straight into the input's planned slot, then runs one step;
    /// allocates nothing, so a run over a data set stays as flat as one on a fixed batch.
    /// `bytes` is the node's value (little-endian, exactly its planned size), as a data loader's
    /// staging buffer holds it. On the CPU each is a copy into the allocation; on CUDA an
    /// asynchronous copy queued on the step's stream ahead of the step (from page-locked memory
    /// it overlaps nothing else and needs no staging by the driver): the borrow of `bytes` lasts
    /// until the step, and so the copy, has finished.
    fn step_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        for &(id, bytes) in inputs {
            self.write_node_bytes(id, bytes)?;
        }
        self.step()
    }

    /// How many data-parallel ranks share each batch: a batch input written for all of them
    /// is this many times one rank's slot, cut into shards ([`crate::collective::ranks`]).
    fn data_ranks(&self) -> usize {
        1
    }

    /// For one process of a job of several (`ingot train --torchrun`): this rank and the
    /// number of ranks. The process then reads only its own shard of each batch
    /// (the trainer's `data::shard::ShardBatches`), one rank's slot.
    fn data_shard(&self) -> Option<(usize, usize)> {
        None
    }

    /// The value of a scalar of `dtype` (f32, f64 or bf16) at `at` in the allocation, as f64,
    /// after the last step: read into a few bytes on the stack, allocating nothing (the loss of
    /// every step is read this way).
    fn read_scalar(&self, at: Location, dtype: DType) -> Result<f64, ExecError>;

    /// Copies `out.len()` bytes of the allocation, from `at.offset` and within `at` (a location
    /// of the plan), into `out`, after the last step: a slice of an output read into a buffer
    /// the caller allocated once (a language model's logits at one position, token after
    /// token). Only executors of one allocation have it.
    fn read_at(&self, _at: Location, _out: &mut [u8]) -> Result<(), ExecError> {
        Err(ExecError::Invalid {
            op: "read_at",
            reason: "this executor holds one allocation per rank: read a node's value \
                     (read_node)"
                .into(),
        })
    }

    /// The forward-only evaluation step loaded beside this one in the same allocation
    /// ([`ingot_compiler::exe::StepPair`]), if any.
    fn eval_executable(&self) -> Option<&Executable> {
        None
    }

    /// Writes each `(input, bytes)` of the evaluation step into its planned slot, then runs the
    /// evaluation step on the current parameters, as [`StepExecutor::step_with_inputs`] runs
    /// the training step; an error when no evaluation step was loaded.
    fn eval_with_inputs(&mut self, _inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        Err(ExecError::Invalid {
            op: "eval",
            reason: "no evaluation step was loaded with this step".into(),
        })
    }

    /// The leaf named `name`.
    fn leaf_id(&self, name: &str) -> Result<NodeId, ExecError> {
        self.graph().leaf(name).ok_or_else(|| ExecError::Invalid {
            op: "leaf",
            reason: format!("the step has no leaf named {name:?}"),
        })
    }

    /// The type of the values [`StepExecutor::write_leaf`] takes and
    /// [`StepExecutor::read_leaf`] gives for leaf `id`: the graph's, except where several
    /// ranks each hold rows of the leaf (a sharded optimizer's) and the executor presents the
    /// whole of it ([`crate::cpu::ranks::CpuRanks`]).
    fn leaf_type(&self, id: NodeId) -> TensorType {
        self.graph().ty(id).clone()
    }

    /// Writes a leaf's value (parameter, optimizer state or input) into its resident bytes; a
    /// value of another type than [`StepExecutor::leaf_type`] is an error naming the leaf and
    /// both types.
    fn write_leaf(&mut self, name: &str, value: &Tensor) -> Result<(), ExecError> {
        let id = self.leaf_id(name)?;
        let ty = self.leaf_type(id);
        if value.ty != ty {
            return Err(ExecError::Invalid {
                op: "write_leaf",
                reason: format!("{name:?} is {ty}, the value given is {}", value.ty),
            });
        }
        let bytes = value.to_le_bytes();
        // A whole value of a leaf the ranks hold rows of: each rank's planned bytes, per rank.
        let own = self.graph().ty(id).shape.numel();
        let parts = match own {
            0 => 1,
            n => ty.shape.numel() / n,
        };
        let planned = self.plan().location(self.graph(), id).bytes * parts;
        if bytes.len() != planned {
            return Err(ExecError::Invalid {
                op: "write_leaf",
                reason: format!("{name:?} holds {planned} bytes, the value {}", bytes.len()),
            });
        }
        self.write_node_bytes(id, &bytes)
    }

    /// The current value of a leaf.
    fn read_leaf(&self, name: &str) -> Result<Tensor, ExecError> {
        self.read_node(self.leaf_id(name)?)
    }

    /// The value of a named output after the last step.
    fn read_output(&self, name: &str) -> Result<Tensor, ExecError> {
        let id = *self
            .graph()
            .outputs
            .get(name)
            .ok_or_else(|| ExecError::Invalid {
                op: "read_output",
                reason: format!("the step has no output named {name:?}"),
            })?;
        self.read_node(id)
    }

    /// Names of the leaves of one kind, in graph order.
    fn leaf_names(&self, kind: LeafKind) -> Vec<String> {
        let g = self.graph();
        g.leaves(kind)
            .into_iter()
            .filter_map(|id| g.leaf_name(id).map(str::to_string))
            .collect()
    }
}

/// The f64 value of the scalar of `dtype` held little-endian at the start of `bytes`.
pub fn scalar_from_le(bytes: &[u8], dtype: DType) -> Result<f64, ExecError> {
    let get = |n: usize| {
        bytes.get(..n).ok_or_else(|| ExecError::Invalid {
            op: "read_scalar",
            reason: format!("{} bytes for a {dtype} scalar", bytes.len()),
        })
    };
    Ok(match dtype {
        DType::F32 => f32::from_le_bytes(get(4)?.try_into().expect("4 bytes")) as f64,
        DType::F64 => f64::from_le_bytes(get(8)?.try_into().expect("8 bytes")),
        DType::BF16 => half::bf16::from_le_bytes(get(2)?.try_into().expect("2 bytes")).to_f64(),
        other => {
            return Err(ExecError::Invalid {
                op: "read_scalar",
                reason: format!("a scalar of {other} is not a loss"),
            })
        }
    })
}
