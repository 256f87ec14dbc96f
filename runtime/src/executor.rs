//! What a loaded step is, whatever runs it: the CPU's [`PlannedStep`] and the GPU's
//! [`CudaStep`] both hold a step graph, its memory plan and the one allocation every value
//! lives in, and a [`Session`](crate::session::Session) drives either through this trait.
//!
//! [`PlannedStep`]: crate::cpu::planned::PlannedStep
//! [`CudaStep`]: crate::cuda::CudaStep

use crate::error::ExecError;
use crate::tensor::Tensor;
use ingot_compiler::ir::{Graph, LeafKind, NodeId};
use ingot_compiler::plan::MemoryPlan;

pub trait StepExecutor {
    fn graph(&self) -> &Graph;
    fn plan(&self) -> &MemoryPlan;
    /// Copies `bytes` (the node's value, little-endian, exactly its planned size) into node
    /// `id`'s memory.
    fn write_node_bytes(&mut self, id: NodeId, bytes: &[u8]) -> Result<(), ExecError>;
    /// The current value of node `id` (a leaf, or an output after a step), copied to the host.
    fn read_node(&self, id: NodeId) -> Result<Tensor, ExecError>;
    /// Runs one step; allocates nothing.
    fn step(&mut self) -> Result<(), ExecError>;
    /// Bytes of the one allocation.
    fn allocated_bytes(&self) -> usize;
    /// Where the step runs, in words ("cpu", "cuda:0 NVIDIA H100 80GB HBM3").
    fn device(&self) -> String;
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

    /// The leaf named `name`.
    fn leaf_id(&self, name: &str) -> Result<NodeId, ExecError> {
        self.graph().leaf(name).ok_or_else(|| ExecError::Invalid {
            op: "leaf",
            reason: format!("the step has no leaf named {name:?}"),
        })
    }

    /// Writes a leaf's value (parameter, optimizer state or input) into its resident bytes; a
    /// value of another type is an error naming the leaf and both types.
    fn write_leaf(&mut self, name: &str, value: &Tensor) -> Result<(), ExecError> {
        let id = self.leaf_id(name)?;
        let ty = self.graph().ty(id);
        if value.ty != *ty {
            return Err(ExecError::Invalid {
                op: "write_leaf",
                reason: format!("{name:?} is {ty}, the value given is {}", value.ty),
            });
        }
        let bytes = value.to_le_bytes();
        let planned = self.plan().location(self.graph(), id).bytes;
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
