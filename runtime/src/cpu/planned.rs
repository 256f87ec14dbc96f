//! Planned execution on the CPU: one allocation when the step is loaded, then steps that
//! allocate nothing. Every value lives at the offset its [`MemoryPlan`] gives it inside that one
//! allocation; each node is computed by the same [`exec_node`] the reference interpreter uses, so
//! the two agree bit for bit.
//!
//! The step arrives lowered ([`ingot_compiler::lower::cpu`]): the executor follows the
//! program's instructions and decides nothing.
//!
//! # Safety argument
//! Kernels take typed slices. Slices into the one allocation are made from a raw pointer, and
//! they are sound because the step is an [`Executable`], which exists only with a plan the
//! independent validator ([`MemoryPlan::validate`]) accepted and a program checked against it
//! ([`ingot_compiler::lower::Program::check`]): a node's output never overlaps an operand it
//! reads, except for elementwise ops placed exactly on an operand, which the program runs in
//! place. For those, the aliased operand is copied a chunk at a time into a stack buffer, and
//! the op runs on the chunk, so no `&` and `&mut` slice ever cover the same byte.

use super::exec::{accumulate_product, exec_attention, exec_node, exec_node_with, Scratch};
use super::profile::Profile;
use super::threads::{default_threads, Base, Pool};
use crate::collective::{needs_collective, Collective};
use crate::error::ExecError;
use crate::tensor::{Tensor, View, ViewMut};
use ingot_compiler::exe::{Executable, StepPair};
use ingot_compiler::ir::{DType, Graph, Node, NodeId, Op, Shape, TensorType};
use ingot_compiler::lower::cpu::{Instr, Program};
use ingot_compiler::lower::{self, CopyIn, CopyOut, Target};
use ingot_compiler::plan::location::Location;
use ingot_compiler::plan::{MemoryPlan, ALIGNMENT};
use ingot_kernels::fused::cpu::Compiled;
use ingot_kernels::fused::{self, FusedKernel, KernelError};
use smallvec::SmallVec;
use std::time::Instant;

/// One block of the allocation: blocks make the base pointer 256-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(256))]
struct Block([u8; ALIGNMENT]);

/// Elements per chunk of an in-place elementwise op (the stack buffer holds one chunk of f64).
const CHUNK: usize = 2048;

#[repr(C, align(64))]
struct ChunkBuf([u8; CHUNK * 8]);

/// A step executable, loaded into one allocation; optionally with a forward-only evaluation
/// step planned into the same allocation ([`StepPair`]), run by [`PlannedStep::eval_step`].
pub struct PlannedStep {
    main: Part,
    eval: Option<Part>,
    memory: Vec<Block>,
    /// The host region of offloaded leaves ([`ingot_compiler::plan::offload`]): a separate
    /// allocation, standing in for a GPU's pinned host memory, that the step's copy
    /// instructions move them from and back to.
    host: Vec<Block>,
    /// This rank's end of the data-parallel group, for a step compiled for several ranks.
    collective: Option<Box<dyn Collective>>,
    /// The threads every kernel runs on.
    pool: Pool,
    /// Where the threads' scratch lies in `memory`, after the plan's bytes.
    slots: Slots,
}

/// Per-thread scratch for the pieces of fused kernels ([`fused::parts`]): `count` slots of
/// `bytes` each, from byte `at` of the allocation (after the plan's total), one per piece of a
/// kernel. Sized when the step is loaded; empty for one thread.
#[derive(Clone, Copy, Debug, Default)]
struct Slots {
    at: usize,
    bytes: usize,
    count: usize,
}

impl Slots {
    /// Slots for `threads` pieces, each the largest scratch any piece of `parts` needs, after
    /// `plan_bytes`; none when no kernel was cut.
    fn after(plan_bytes: usize, threads: usize, parts: &[&Part]) -> Slots {
        let need = parts.iter().map(|p| p.piece_scratch).max().unwrap_or(0);
        if need == 0 {
            return Slots::default();
        }
        Slots {
            at: plan_bytes.div_ceil(ALIGNMENT) * ALIGNMENT,
            bytes: need.div_ceil(ALIGNMENT) * ALIGNMENT,
            count: threads,
        }
    }

    /// Bytes of the allocation: the plan's, then the slots.
    fn end(&self, plan_bytes: usize) -> usize {
        if self.count == 0 {
            plan_bytes
        } else {
            self.at + self.bytes * self.count
        }
    }
}

/// Whether fused kernels run as programs made when the step is loaded
/// ([`fused::cpu::Compiled`], the same bits) where they can: yes, unless the environment sets
/// `INGOT_FUSED_INTERPRET=1`, which runs every fused kernel through the interpreter (to compare
/// the two, or to rule the programs out).
fn compile_fused() -> bool {
    std::env::var("INGOT_FUSED_INTERPRET").map_or(true, |v| v.trim() != "1")
}

/// Fused kernels with at least this many domain elements a piece are cut into pieces that run
/// on several threads; smaller ones cost less than waking the threads. That is for a body of
/// [`PIECE_BODY`] instructions or fewer; a longer body is more work an element, and its
/// pieces are as much fewer elements ([`min_piece`]).
const MIN_PIECE: usize = 16 * 1024;

/// The body length [`MIN_PIECE`] is for (an elementwise kernel of a few ops, an optimizer's
/// update).
const PIECE_BODY: usize = 12;

/// The fewest domain elements a piece of `k` holds: [`MIN_PIECE`] for a body of at most
/// [`PIECE_BODY`] instructions, as much less as the body is longer (a batch norm's backward
/// pass, 45 to 70 instructions and three passes an element, gets four to six times the
/// pieces), never under a eighth of it. Depends only on the kernel.
fn min_piece(k: &FusedKernel) -> usize {
    let body = k.body.len().max(PIECE_BODY);
    (MIN_PIECE * PIECE_BODY / body).max(MIN_PIECE / 8)
}

/// One piece of a fused kernel: the kernel over its slice of the domain, and its outputs'
/// byte offsets in the allocation (the inputs are the whole kernel's); or, for a kernel that
/// [`fused::parts`] cannot cut (a batch norm's reduction with full outputs), the whole kernel
/// and a range of its program's rows ([`Compiled::run_rows`]).
struct PieceRun {
    kernel: FusedKernel,
    outputs: Vec<usize>,
    /// The piece's program, where it has one ([`fused::cpu::Compiled`]).
    compiled: Option<Compiled>,
    /// The rows of `compiled` this piece runs, when it is a range of rows.
    rows: Option<std::ops::Range<usize>>,
}

/// The pieces of the fused kernel `k` (whose outputs are at `outputs`) for `threads`: slices
/// of its domain ([`fused::parts::cut`]), else ranges of its program's rows; `None` when it
/// runs whole.
fn pieces_of(
    k: &FusedKernel,
    outputs: &[usize],
    threads: usize,
    compile: bool,
) -> Option<Vec<PieceRun>> {
    let min = min_piece(k);
    if let Some(ps) = fused::parts::cut(k, threads, min) {
        return Some(
            ps.into_iter()
                .map(|p| PieceRun {
                    outputs: outputs
                        .iter()
                        .zip(&p.output_start)
                        .enumerate()
                        .map(|(j, (&at, &start))| at + start * k.output_dtype(j).size())
                        .collect(),
                    compiled: if compile {
                        Compiled::new(&p.kernel)
                    } else {
                        None
                    },
                    kernel: p.kernel,
                    rows: None,
                })
                .collect(),
        );
    }
    let c = if compile {
        Compiled::new(k)?
    } else {
        return None;
    };
    let ranges = c.row_ranges(k, threads, min)?;
    Some(
        ranges
            .into_iter()
            .map(|r| PieceRun {
                kernel: k.clone(),
                outputs: outputs.to_vec(),
                compiled: Some(c.clone()),
                rows: Some(r),
            })
            .collect(),
    )
}

/// One loaded program: its executable, its instructions, and each node's bytes.
struct Part {
    exe: Executable,
    program: Program,
    location: Vec<Location>,
    /// The chunk-sized versions of in-place nodes (full chunk, and the last partial one are
    /// built on the fly from these without allocating).
    chunk_node: Vec<Option<Node>>,
    /// The values each node's kernel writes (an attention's result nodes besides its own).
    kernel_outputs: Vec<SmallVec<[NodeId; 1]>>,
    /// Per instruction: a fused kernel's pieces, when it is cut to run on several threads.
    pieces: Vec<Option<Vec<PieceRun>>>,
    /// Per instruction: a fused kernel's program, where it has one; the interpreter runs
    /// the others.
    compiled: Vec<Option<Compiled>>,
    /// The largest scratch a piece needs (0: no kernel was cut).
    piece_scratch: usize,
    /// Time per instruction, with `INGOT_CPU_PROFILE=1` ([`super::profile`]).
    profile: Option<Profile>,
}

impl Drop for Part {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            eprint!("{}", p.report(self.exe.graph(), &self.program.instrs));
        }
    }
}

/// Bytes the host can give without swapping: `MemAvailable` of /proc/meminfo (Linux), or
/// `None` where it cannot be read (then only the allocation itself can refuse).
pub fn available_host_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses, before anything is allocated, a plan larger than the host memory `available`,
/// naming the plan's sizes: the allocator would abort the process, or the machine swap.
fn refuse_beyond_host_memory(plan: &MemoryPlan, available: Option<usize>) -> Result<(), ExecError> {
    match available {
        Some(free) if plan.total_bytes > free => Err(ExecError::Invalid {
            op: "allocation",
            reason: format!(
                "the plan needs {} bytes ({} resident + {} slab) in one allocation, but the host has {} bytes available (MemAvailable in /proc/meminfo); lower the batch size, sequence length or model dimensions",
                plan.total_bytes, plan.resident_bytes, plan.slab_bytes, free
            ),
        }),
        _ => Ok(()),
    }
}

/// `bytes` of zeroed memory as whole aligned blocks, allocated fallibly: a size the allocator
/// cannot give is an error naming it, not an abort.
fn zeroed_blocks(bytes: usize) -> Result<Vec<Block>, ExecError> {
    let blocks = bytes.div_ceil(ALIGNMENT);
    let mut memory = Vec::new();
    memory
        .try_reserve_exact(blocks)
        .map_err(|e| ExecError::Invalid {
            op: "allocation",
            reason: format!("cannot allocate the plan's {bytes} bytes on the host: {e}"),
        })?;
    // Within the reserved capacity: no reallocation.
    memory.resize(blocks, Block([0; ALIGNMENT]));
    Ok(memory)
}

impl PlannedStep {
    /// Loads a CPU executable: makes the step's one allocation (zeroed), refusing a plan larger
    /// than the host's available memory before allocating.
    ///
    /// Runs on [`default_threads`] threads (1 unless the program or `INGOT_THREADS` says
    /// otherwise); [`PlannedStep::with_threads`] chooses.
    pub fn new(exe: Executable) -> Result<PlannedStep, ExecError> {
        PlannedStep::with_threads(exe, default_threads())
    }

    /// [`PlannedStep::new`] on `threads` threads (a rayon pool held by the step; none for 1).
    /// The results are the same bits for any count. With several threads the allocation also
    /// holds one scratch slot per thread for the pieces of fused kernels, after the plan's
    /// bytes ([`PlannedStep::thread_scratch_bytes`]).
    pub fn with_threads(exe: Executable, threads: usize) -> Result<PlannedStep, ExecError> {
        let pool = Pool::new(threads)?;
        let main = Part::load(exe, threads)?;
        let plan_bytes = main.exe.plan().total_bytes;
        let slots = Slots::after(plan_bytes, threads, &[&main]);
        // The plan's own sizes name what is too large; the threads' scratch is small beside it
        // (and its allocation is fallible too).
        refuse_beyond_host_memory(main.exe.plan(), available_host_memory())?;
        let memory = zeroed_blocks(slots.end(plan_bytes))?;
        let host = zeroed_blocks(main.exe.plan().host_bytes)?;
        Ok(PlannedStep {
            main,
            eval: None,
            memory,
            host,
            collective: None,
            pool,
            slots,
        })
    }

    /// Loads a training step and its evaluation step into one allocation of the pair's size
    /// ([`StepPair::allocation_bytes`]: the larger plan total, not the sum). [`PlannedStep::step`]
    /// runs the training step, [`PlannedStep::eval_step`] the evaluation step, over the same
    /// parameters.
    pub fn pair(pair: StepPair) -> Result<PlannedStep, ExecError> {
        PlannedStep::pair_with_threads(pair, default_threads())
    }

    /// [`PlannedStep::pair`] on `threads` threads, as [`PlannedStep::with_threads`].
    pub fn pair_with_threads(pair: StepPair, threads: usize) -> Result<PlannedStep, ExecError> {
        let pool = Pool::new(threads)?;
        let bytes = pair.allocation_bytes();
        let (train, eval, _) = pair.into_parts();
        let main = Part::load(train, threads)?;
        let eval = Part::load(eval, threads)?;
        let slots = Slots::after(bytes, threads, &[&main, &eval]);
        let mut whole = main.exe.plan().clone();
        whole.total_bytes = bytes;
        refuse_beyond_host_memory(&whole, available_host_memory())?;
        let memory = zeroed_blocks(slots.end(bytes))?;
        let host = zeroed_blocks(main.exe.plan().host_bytes)?;
        Ok(PlannedStep {
            main,
            eval: Some(eval),
            memory,
            host,
            collective: None,
            pool,
            slots,
        })
    }

    /// Of the training step's fused kernels, how many run as programs made at load
    /// ([`fused::cpu::Compiled`]), and how many there are: `(compiled, fused)`.
    pub fn compiled_kernels(&self) -> (usize, usize) {
        let fused = self
            .main
            .program
            .instrs
            .iter()
            .filter(|i| matches!(i, Instr::Fused { .. }))
            .count();
        let compiled = self.main.compiled.iter().filter(|c| c.is_some()).count();
        (compiled, fused)
    }

    /// Runs every fused kernel through the interpreter from now on, as with
    /// `INGOT_FUSED_INTERPRET=1`: the reference that the programs are held to.
    pub fn interpret_fused(&mut self) {
        for part in std::iter::once(&mut self.main).chain(self.eval.as_mut()) {
            part.compiled.iter_mut().for_each(|c| *c = None);
            // Ranges of a program's rows have no interpreted form: their kernels run whole.
            for ps in &mut part.pieces {
                if ps.iter().flatten().any(|p| p.rows.is_some()) {
                    *ps = None;
                }
            }
            for p in part.pieces.iter_mut().flatten().flatten() {
                p.compiled = None;
            }
        }
    }

    /// The threads the step runs on.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Bytes of the allocation that hold the threads' scratch (after the plan's total; 0 on
    /// one thread or when no fused kernel is large enough to be cut).
    pub fn thread_scratch_bytes(&self) -> usize {
        self.slots.bytes * self.slots.count
    }

    /// A graph planned outside the pipeline (`plan` made with the CPU target's options), made a
    /// CPU executable by the compiler ([`Executable::from_plan`]: validated and lowered there)
    /// and loaded.
    pub fn from_plan(graph: Graph, plan: MemoryPlan) -> Result<PlannedStep, ExecError> {
        PlannedStep::new(Executable::from_plan("step", graph, plan, Target::Cpu)?)
    }

    /// The executable this step runs.
    pub fn executable(&self) -> &Executable {
        &self.main.exe
    }

    /// The evaluation step loaded beside it ([`PlannedStep::pair`]), if any.
    pub fn eval_executable(&self) -> Option<&Executable> {
        self.eval.as_ref().map(|p| &p.exe)
    }

    pub fn graph(&self) -> &Graph {
        self.main.exe.graph()
    }

    pub fn plan(&self) -> &MemoryPlan {
        self.main.exe.plan()
    }

    /// Bytes of the one allocation (the plan's total, rounded up to whole 256-byte blocks, plus
    /// [`PlannedStep::thread_scratch_bytes`]).
    pub fn allocated_bytes(&self) -> usize {
        self.memory.len() * ALIGNMENT
    }

    /// Bytes of the host region the offloaded leaves live in (0 without offload).
    pub fn host_bytes(&self) -> usize {
        self.host.len() * ALIGNMENT
    }

    fn read(&self, id: NodeId) -> Result<Tensor, ExecError> {
        let ty = self.main.exe.graph().ty(id).clone();
        if let Some(h) = self.home(id) {
            return Tensor::from_le_bytes(
                ty,
                &host_bytes(&self.host)[h.offset..h.offset + h.bytes],
            );
        }
        let l = self.main.location[id.index()];
        Tensor::from_le_bytes(ty, &self.bytes()[l.offset..l.offset + l.bytes])
    }

    /// Where offloaded leaf `id` lives between steps: its home in the host region (its
    /// device location is only a staging buffer, live while the step uses it).
    fn home(&self, id: NodeId) -> Option<Location> {
        self.main
            .exe
            .plan()
            .offload
            .iter()
            .find(|o| o.leaf == id)
            .map(|o| o.host)
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the blocks are plain bytes, contiguous in the vector.
        unsafe {
            std::slice::from_raw_parts(
                self.memory.as_ptr() as *const u8,
                self.memory.len() * ALIGNMENT,
            )
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `self` is borrowed mutably.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.memory.as_mut_ptr() as *mut u8,
                self.memory.len() * ALIGNMENT,
            )
        }
    }

    /// Runs one step: every node in schedule order, then the end-of-step copies of updates that
    /// could not be written in place. Allocates nothing on the heap (for ops with at most eight
    /// operands of rank at most eight), except inside matmul when its library does.
    pub fn step(&mut self) -> Result<(), ExecError> {
        let len = self.memory.len() * ALIGNMENT;
        let base = Base(self.memory.as_mut_ptr() as *mut u8);
        let host = (
            Base(self.host.as_mut_ptr() as *mut u8),
            self.host.len() * ALIGNMENT,
        );
        let (main, slots) = (&self.main, self.slots);
        let collective = self.collective.as_deref_mut();
        self.pool
            .install(move || main.run(base.get(), len, host, collective, slots))
    }

    /// The data-parallel ranks the step was compiled for (1 for a step without all-reduce).
    pub fn ranks(&self) -> usize {
        self.main
            .program
            .instrs
            .iter()
            .find_map(Instr::ranks)
            .unwrap_or(1)
    }

    /// Gives the step this rank's end of its data-parallel group; a group of another size than
    /// the step was compiled for is an error.
    pub fn set_collective(&mut self, c: Box<dyn Collective>) -> Result<(), ExecError> {
        if c.ranks() != self.ranks() {
            return Err(needs_collective(self.ranks(), Some(c.ranks())));
        }
        self.collective = Some(c);
        Ok(())
    }

    /// Runs the evaluation step loaded with [`PlannedStep::pair`] on the current parameters;
    /// an error if there is none. Allocates nothing, as [`PlannedStep::step`].
    pub fn eval_step(&mut self) -> Result<(), ExecError> {
        let len = self.memory.len() * ALIGNMENT;
        let base = Base(self.memory.as_mut_ptr() as *mut u8);
        let host = (
            Base(self.host.as_mut_ptr() as *mut u8),
            self.host.len() * ALIGNMENT,
        );
        let (eval, slots) = (self.eval.as_ref().ok_or_else(no_eval)?, self.slots);
        self.pool
            .install(move || eval.run(base.get(), len, host, None, slots))
    }
}

fn no_eval() -> ExecError {
    ExecError::Invalid {
        op: "eval",
        reason: "no evaluation step was loaded with this step".into(),
    }
}

impl Part {
    fn load(exe: Executable, threads: usize) -> Result<Part, ExecError> {
        let lower::Program::Cpu(program) = exe.program().clone() else {
            return Err(ExecError::Invalid {
                op: "load",
                reason: format!(
                    "the executable was lowered for {}, not the CPU; compile it with --device cpu",
                    exe.target()
                ),
            });
        };
        debug_assert_eq!(exe.target(), Target::Cpu);
        let (graph, plan) = (exe.graph(), exe.plan());
        let location: Vec<Location> = graph.ids().map(|id| plan.location(graph, id)).collect();
        let mut chunk_node = vec![None; graph.len()];
        for i in &program.instrs {
            if let Instr::InPlace { node: id } = *i {
                let node = graph.node(id);
                if let Op::MatMulAcc { .. } = node.op {
                    // Added into its accumulator's bytes at once, not chunk by chunk.
                    continue;
                }
                let mut n = node.clone();
                n.ty = TensorType::new(Shape::new(&[CHUNK]), node.ty.dtype);
                chunk_node[id.index()] = Some(n);
            }
        }
        let kernel_outputs = graph.kernel_outputs();
        let mut pieces = Vec::with_capacity(program.instrs.len());
        let mut piece_scratch = 0;
        let compile = compile_fused();
        let mut compiled = Vec::with_capacity(program.instrs.len());
        for i in &program.instrs {
            let cut = match i {
                Instr::Fused { node, outputs, .. } if threads > 1 => match &graph.node(*node).op {
                    Op::Fused(k) => pieces_of(k, outputs, threads, compile),
                    _ => None,
                },
                _ => None,
            };
            if let Some(ps) = &cut {
                for p in ps {
                    piece_scratch = piece_scratch.max(fused::cpu::scratch_bytes(&p.kernel));
                }
            }
            pieces.push(cut);
            compiled.push(match i {
                Instr::Fused { node, .. } if compile => match &graph.node(*node).op {
                    Op::Fused(k) => Compiled::new(k),
                    _ => None,
                },
                _ => None,
            });
        }
        Ok(Part {
            profile: Profile::from_env(program.instrs.len()),
            exe,
            program,
            location,
            chunk_node,
            kernel_outputs,
            pieces,
            piece_scratch,
            compiled,
        })
    }

    /// Runs the pieces of a cut fused kernel, each on a thread of the pool with its own scratch
    /// slot; they write disjoint ranges of the kernel's outputs.
    fn run_pieces(
        base: *mut u8,
        len: usize,
        pieces: &[PieceRun],
        inputs: &[usize],
        slots: Slots,
    ) -> Result<(), KernelError> {
        use rayon::prelude::*;
        debug_assert!(pieces.len() <= slots.count);
        let base = Base(base);
        pieces.par_iter().enumerate().try_for_each(|(i, p)| {
            // SAFETY: the pieces of one kernel write disjoint bytes: each its own range of the
            // kernel's outputs ([`fused::parts`]: a row-major slice along the outermost axis)
            // and its own scratch slot (inside the allocation: `slots.end` bytes were
            // allocated); an input a piece writes over (in place) is read only at the piece's
            // own indices, and every other byte the pieces touch is only read. No other slice
            // of the allocation is alive while they run: the step waits for all of them.
            let mem = unsafe { std::slice::from_raw_parts_mut(base.get(), len) };
            let scratch = slots.at + i * slots.bytes;
            match (&p.compiled, &p.rows) {
                (Some(c), Some(rows)) => {
                    c.run_rows(&p.kernel, mem, inputs, &p.outputs, scratch, rows.clone())
                }
                (Some(c), None) => c.run(&p.kernel, mem, inputs, &p.outputs, scratch),
                (None, None) => fused::cpu::run(&p.kernel, mem, inputs, &p.outputs, scratch),
                (None, Some(_)) => {
                    Err(KernelError::Internal("a range of rows without its program"))
                }
            }
        })
    }

    /// Runs this program over the allocation at `base` (`len` bytes, at least its plan's total),
    /// with the host region of offloaded leaves at `host` (`(pointer, bytes)`).
    fn run(
        &self,
        base: *mut u8,
        len: usize,
        host: (Base, usize),
        mut collective: Option<&mut (dyn Collective + 'static)>,
        slots: Slots,
    ) -> Result<(), ExecError> {
        debug_assert!(len >= self.exe.plan().total_bytes);
        for k in 0..self.program.instrs.len() {
            let started = self.profile.as_ref().map(|_| Instant::now());
            self.run_instr(k, base, len, host, &mut collective, slots)?;
            if let (Some(p), Some(t)) = (&self.profile, started) {
                p.add(k, t);
            }
        }
        for c in &self.program.copies {
            // SAFETY: both ranges lie inside the allocation (checked); `copy` allows overlap.
            unsafe { std::ptr::copy(base.add(c.from), base.add(c.to), c.bytes) };
        }
        if let Some(p) = &self.profile {
            p.step_done();
        }
        Ok(())
    }

    /// Runs instruction `k` of the program (as [`Part::run`]).
    fn run_instr(
        &self,
        k: usize,
        base: *mut u8,
        len: usize,
        host: (Base, usize),
        collective: &mut Option<&mut (dyn Collective + 'static)>,
        slots: Slots,
    ) -> Result<(), ExecError> {
        match &self.program.instrs[k] {
            Instr::AllReduce {
                node,
                copies,
                offset,
                bytes,
                dtype,
                ranks,
            } => {
                let c = joining(collective, *ranks)?;
                for c in copies {
                    // SAFETY: checked program: both ranges lie inside the allocation; an
                    // operand never overlaps another member's output (validated plan).
                    unsafe { std::ptr::copy(base.add(c.from), base.add(c.to), c.bytes) };
                }
                // SAFETY: the region lies inside the allocation (checked program) and no
                // other slice of it is alive during the call.
                let region = unsafe { std::slice::from_raw_parts_mut(base.add(*offset), *bytes) };
                c.all_reduce_sum(region, *dtype)
                    .map_err(|e| at(*node, self.exe.graph().node(*node), e))?;
            }
            Instr::AllGather {
                node,
                from,
                to,
                bytes,
                ranks,
            } => {
                let c = joining(collective, *ranks)?;
                // SAFETY: both ranges lie inside the allocation and apart (checked
                // program); no other slice of it is alive during the call.
                let (send, recv) = unsafe {
                    (
                        std::slice::from_raw_parts(base.add(*from), *bytes),
                        std::slice::from_raw_parts_mut(base.add(*to), bytes * ranks),
                    )
                };
                c.all_gather(send, recv)
                    .map_err(|e| at(*node, self.exe.graph().node(*node), e))?;
            }
            Instr::ReduceScatter {
                node,
                parts,
                dtype,
                ranks,
            } => {
                let c = joining(collective, *ranks)?;
                for p in parts {
                    // SAFETY: every operand and output lies inside the allocation, and
                    // each output apart from every operand and the other outputs (checked
                    // program); no other slice of it is alive during the call.
                    let (send, recv) = unsafe {
                        (
                            std::slice::from_raw_parts(base.add(p.from), p.bytes * ranks),
                            std::slice::from_raw_parts_mut(base.add(p.to), p.bytes),
                        )
                    };
                    c.reduce_scatter_sum(send, recv, *dtype)
                        .map_err(|e| at(*node, self.exe.graph().node(*node), e))?;
                }
            }
            Instr::CopyIn(CopyIn {
                host: h, to, bytes, ..
            }) => {
                check_host(*h, *bytes, host.1)?;
                // SAFETY: the host range lies inside the host region (checked just now),
                // the device range inside the allocation (checked program); the two are
                // separate allocations, and no slice of either is alive.
                unsafe {
                    std::ptr::copy_nonoverlapping(host.0.get().add(*h), base.add(*to), *bytes)
                };
            }
            Instr::CopyOut(CopyOut {
                from,
                host: h,
                bytes,
                ..
            }) => {
                check_host(*h, *bytes, host.1)?;
                // SAFETY: as for the copy in.
                unsafe {
                    std::ptr::copy_nonoverlapping(base.add(*from), host.0.get().add(*h), *bytes)
                };
            }
            Instr::Exec { node } => self.exec(base, *node)?,
            Instr::InPlace { node } => self.exec_in_place(base, *node)?,
            Instr::Fused {
                node,
                inputs,
                outputs,
                scratch,
            } => {
                let Op::Fused(kernel) = &self.exe.graph().node(*node).op else {
                    unreachable!("fused instructions are made for fused nodes")
                };
                let ran = match &self.pieces[k] {
                    Some(pieces) => Part::run_pieces(base, len, pieces, inputs, slots),
                    None => {
                        // SAFETY: no other slice of the allocation is alive during the
                        // call; the kernel reads and writes through this one, at offsets
                        // the validated plan gives (in place only where the kernel allows).
                        let mem = unsafe { std::slice::from_raw_parts_mut(base, len) };
                        match &self.compiled[k] {
                            Some(c) => c.run(kernel, mem, inputs, outputs, *scratch),
                            None => fused::cpu::run(kernel, mem, inputs, outputs, *scratch),
                        }
                    }
                };
                ran.map_err(|e| {
                    at(
                        *node,
                        self.exe.graph().node(*node),
                        ExecError::Invalid {
                            op: "fused",
                            reason: e.to_string(),
                        },
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Views of the operands `xs` in the allocation at `base`, and their types. The caller
    /// vouches that none overlaps what the node writes.
    fn operands(
        &self,
        base: *mut u8,
        xs: &[NodeId],
    ) -> (SmallVec<[View<'_>; 8]>, SmallVec<[&TensorType; 8]>) {
        let g = self.exe.graph();
        let mut inputs = SmallVec::new();
        let mut types = SmallVec::new();
        for &x in xs {
            let (l, ty) = (self.location[x.index()], g.ty(x));
            // SAFETY: validated plan: every value lies inside the allocation; the caller
            // vouches that no slice written during the node overlaps it.
            inputs.push(unsafe { view(base.add(l.offset), ty.dtype, ty.shape.numel()) });
            types.push(ty);
        }
        (inputs, types)
    }

    /// Node `id`'s planned workspace in the allocation at `base`, if it has one.
    fn scratch(&self, base: *mut u8, id: NodeId) -> Scratch<'_> {
        match self.exe.plan().workspace(id) {
            // SAFETY: validated plan: the workspace lies inside the allocation and overlaps
            // neither the operands nor the output of this node.
            Some(w) => Scratch::Given(unsafe {
                std::slice::from_raw_parts_mut(base.add(w.offset), w.bytes)
            }),
            None => Scratch::Allocate,
        }
    }

    fn exec(&self, base: *mut u8, id: NodeId) -> Result<(), ExecError> {
        let node = self.exe.graph().node(id);
        // Validated plan: the operands do not overlap the output (this node is not in place).
        let (inputs, types) = self.operands(base, &node.inputs);
        let scratch = self.scratch(base, id);
        if node.op.is_attention() {
            let g = self.exe.graph();
            let mut outs: SmallVec<[Option<ViewMut<'_>>; 3]> = SmallVec::new();
            for &o in &self.kernel_outputs[id.index()] {
                let index = match g.node(o).op {
                    Op::Result { index } => index,
                    _ => 0,
                };
                while outs.len() < index {
                    // An output no result node names: the kernel writes it into its scratch.
                    outs.push(None);
                }
                let (l, ty) = (self.location[o.index()], g.ty(o));
                // SAFETY: validated plan: each output lies inside the allocation and overlaps
                // no operand, no other output and no workspace of this node.
                outs.push(Some(unsafe {
                    view_mut(base.add(l.offset), ty.dtype, ty.shape.numel())
                }));
            }
            // out and lse, or one gradient per forward operand.
            let all = match node.op {
                Op::Attention { .. } => 2,
                _ => node.inputs.len() - 3,
            };
            while outs.len() < all {
                outs.push(None);
            }
            return exec_attention(node, &inputs, &types, &mut outs, scratch)
                .map_err(|e| at(id, node, e));
        }
        let l = self.location[id.index()];
        // SAFETY: as above.
        let out = unsafe { view_mut(base.add(l.offset), node.ty.dtype, node.ty.shape.numel()) };
        exec_node_with(node, &inputs, &types, out, scratch).map_err(|e| at(id, node, e))
    }

    /// A `matmul_acc` whose result the plan placed over its accumulator `c`: the GEMM adds
    /// the product into those bytes (which hold `c`), reading `a` and `b` from elsewhere.
    fn accumulate_in_place(&self, base: *mut u8, id: NodeId) -> Result<(), ExecError> {
        let g = self.exe.graph();
        let node = g.node(id);
        // Checked program: `a` and `b` do not overlap the result (only `c` is under it).
        let (inputs, types) = self.operands(base, &node.inputs[1..]);
        let scratch = self.scratch(base, id);
        let l = self.location[id.index()];
        // SAFETY: the result lies inside the allocation; no other live slice covers it.
        let out = unsafe { view_mut(base.add(l.offset), node.ty.dtype, node.ty.shape.numel()) };
        accumulate_product(node, &inputs, &types, out, scratch).map_err(|e| at(id, node, e))
    }

    fn exec_in_place(&self, base: *mut u8, id: NodeId) -> Result<(), ExecError> {
        let node = self.exe.graph().node(id);
        if let Op::MatMulAcc { .. } = node.op {
            return self.accumulate_in_place(base, id);
        }
        let full = self.chunk_node[id.index()]
            .as_ref()
            .expect("in-place nodes have a chunk node");
        let here = self.location[id.index()];
        let n = node.ty.shape.numel();
        // Bytes per element of the operand placed on the output (the one copied aside).
        let esize = node
            .inputs
            .iter()
            .find(|x| self.location[x.index()] == here)
            .map(|&x| self.exe.graph().ty(x).dtype.size())
            .ok_or_else(|| {
                at(
                    id,
                    node,
                    ExecError::Invalid {
                        op: "in place",
                        reason: "no operand is placed on the output".into(),
                    },
                )
            })?;
        let mut stash = ChunkBuf([0; CHUNK * 8]);
        let mut start = 0;
        while start < n {
            let len = CHUNK.min(n - start);
            let last;
            let chunk = if len == CHUNK {
                full
            } else {
                let mut partial = full.clone();
                partial.ty.shape.0[0] = len;
                last = partial;
                &last
            };
            // The aliased operand's chunk, copied aside before the output chunk is written.
            // SAFETY: the chunk lies inside the aliased operand, which lies inside the allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    base.add(here.offset + start * esize),
                    stash.0.as_mut_ptr(),
                    len * esize,
                )
            };
            let mut inputs: SmallVec<[View<'_>; 8]> = SmallVec::new();
            let mut types: SmallVec<[TensorType; 8]> = SmallVec::new();
            for &x in &node.inputs {
                let ty = self.exe.graph().ty(x);
                let l = self.location[x.index()];
                let size = ty.dtype.size();
                let v = if l == here {
                    // SAFETY: an operand placed on the output is read from the stash, which
                    // holds this chunk's `len` elements of it, copied above.
                    unsafe { view(stash.0.as_ptr() as *mut u8, ty.dtype, len) }
                } else {
                    // SAFETY: any other operand does not overlap the output (validated) and
                    // has the output's length, so the chunk's `len` elements from `start` lie
                    // inside its planned bytes.
                    unsafe { view(base.add(l.offset + start * size), ty.dtype, len) }
                };
                inputs.push(v);
                types.push(TensorType {
                    shape: chunk.ty.shape.clone(),
                    dtype: ty.dtype,
                });
            }
            let type_refs: SmallVec<[&TensorType; 8]> = types.iter().collect();
            // SAFETY: the output chunk lies inside the output; no live slice covers it.
            let out = unsafe {
                view_mut(
                    base.add(here.offset + start * node.ty.dtype.size()),
                    node.ty.dtype,
                    len,
                )
            };
            exec_node(chunk, &inputs, &type_refs, out).map_err(|e| at(id, node, e))?;
            start += len;
        }
        Ok(())
    }
}

/// An offload copy of `bytes` bytes at `at` lies inside the host region of `len` bytes.
fn check_host(at: usize, bytes: usize, len: usize) -> Result<(), ExecError> {
    match at.checked_add(bytes) {
        Some(end) if end <= len => Ok(()),
        _ => Err(ExecError::Invalid {
            op: "offload copy",
            reason: format!("{bytes} bytes at {at} lie outside the {len} byte host region"),
        }),
    }
}

/// The host region's blocks as bytes.
fn host_bytes(host: &[Block]) -> &[u8] {
    // SAFETY: the blocks are plain bytes, contiguous in the vector.
    unsafe { std::slice::from_raw_parts(host.as_ptr() as *const u8, host.len() * ALIGNMENT) }
}

fn at(id: NodeId, node: &Node, e: ExecError) -> ExecError {
    ExecError::AtNode {
        node: id.index(),
        op: node.op.name(),
        source: Box::new(e),
    }
}

/// A typed slice of `numel` elements at `p`.
///
/// # Safety
/// `p` must be aligned for `dtype` and point to `numel` initialised elements that nothing
/// writes while the slice lives.
unsafe fn view<'a>(p: *mut u8, dtype: DType, numel: usize) -> View<'a> {
    match dtype {
        DType::F32 => View::F32(std::slice::from_raw_parts(p as *const f32, numel)),
        DType::F64 => View::F64(std::slice::from_raw_parts(p as *const f64, numel)),
        DType::I32 => View::I32(std::slice::from_raw_parts(p as *const i32, numel)),
        DType::I64 => View::I64(std::slice::from_raw_parts(p as *const i64, numel)),
        DType::Bool => View::Bool(std::slice::from_raw_parts(p as *const u8, numel)),
        DType::BF16 => View::BF16(std::slice::from_raw_parts(p as *const half::bf16, numel)),
    }
}

/// A typed mutable slice of `numel` elements at `p`.
///
/// # Safety
/// As [`view`], and no other slice may cover these bytes while this one lives.
unsafe fn view_mut<'a>(p: *mut u8, dtype: DType, numel: usize) -> ViewMut<'a> {
    match dtype {
        DType::F32 => ViewMut::F32(std::slice::from_raw_parts_mut(p as *mut f32, numel)),
        DType::F64 => ViewMut::F64(std::slice::from_raw_parts_mut(p as *mut f64, numel)),
        DType::I32 => ViewMut::I32(std::slice::from_raw_parts_mut(p as *mut i32, numel)),
        DType::I64 => ViewMut::I64(std::slice::from_raw_parts_mut(p as *mut i64, numel)),
        DType::Bool => ViewMut::Bool(std::slice::from_raw_parts_mut(p, numel)),
        DType::BF16 => ViewMut::BF16(std::slice::from_raw_parts_mut(p as *mut half::bf16, numel)),
    }
}

impl crate::executor::StepExecutor for PlannedStep {
    fn graph(&self) -> &Graph {
        PlannedStep::graph(self)
    }

    fn plan(&self) -> &MemoryPlan {
        PlannedStep::plan(self)
    }

    fn write_node_bytes(&mut self, id: NodeId, bytes: &[u8]) -> Result<(), ExecError> {
        let Some(h) = self.home(id) else {
            let at = self.plan().location(self.graph(), id);
            crate::executor::node_bytes_fit(id, at.bytes, bytes)?;
            return self.write_at(at, bytes);
        };
        crate::executor::node_bytes_fit(id, h.bytes, bytes)?;
        // SAFETY: the home lies inside the host region (validated plan, region of its bytes).
        let region = unsafe {
            std::slice::from_raw_parts_mut(
                self.host.as_mut_ptr() as *mut u8,
                self.host.len() * ALIGNMENT,
            )
        };
        region[h.offset..h.offset + h.bytes].copy_from_slice(bytes);
        Ok(())
    }

    fn write_at(&mut self, at: Location, bytes: &[u8]) -> Result<(), ExecError> {
        let to = self
            .bytes_mut()
            .get_mut(at.offset..at.offset + bytes.len())
            .ok_or_else(|| ExecError::Invalid {
                op: "write_at",
                reason: format!(
                    "{} bytes at offset {} are outside the allocation",
                    bytes.len(),
                    at.offset
                ),
            })?;
        to.copy_from_slice(bytes);
        Ok(())
    }

    fn read_node(&self, id: NodeId) -> Result<Tensor, ExecError> {
        self.read(id)
    }

    fn read_scalar(&self, at: Location, dtype: DType) -> Result<f64, ExecError> {
        let bytes = self
            .bytes()
            .get(at.offset..at.offset + at.bytes)
            .ok_or_else(|| ExecError::Invalid {
                op: "read_scalar",
                reason: format!(
                    "bytes {}..{} lie outside the allocation",
                    at.offset,
                    at.offset + at.bytes
                ),
            })?;
        crate::executor::scalar_from_le(bytes, dtype)
    }

    fn read_at(&self, at: Location, out: &mut [u8]) -> Result<(), ExecError> {
        let from = self
            .bytes()
            .get(at.offset..at.offset + at.bytes)
            .and_then(|b| b.get(..out.len()))
            .ok_or_else(|| ExecError::Invalid {
                op: "read_at",
                reason: format!(
                    "{} bytes at offset {} are not inside {} bytes of the allocation",
                    out.len(),
                    at.offset,
                    at.bytes
                ),
            })?;
        out.copy_from_slice(from);
        Ok(())
    }

    fn eval_executable(&self) -> Option<&Executable> {
        PlannedStep::eval_executable(self)
    }

    fn eval_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        let len = self.memory.len() * ALIGNMENT;
        let base = self.memory.as_mut_ptr() as *mut u8;
        let eval = self.eval.as_ref().ok_or_else(no_eval)?;
        for &(id, bytes) in inputs {
            let l = *eval
                .location
                .get(id.index())
                .filter(|l| l.bytes == bytes.len())
                .ok_or_else(|| ExecError::Invalid {
                    op: "eval_with_inputs",
                    reason: format!(
                        "input %{} of the evaluation step does not hold {} bytes",
                        id.index(),
                        bytes.len()
                    ),
                })?;
            assert!(
                l.offset + l.bytes <= len,
                "validated plan: inside the allocation"
            );
            // SAFETY: the slot lies inside the allocation (asserted); no slice of it is alive.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(l.offset), l.bytes) };
        }
        let host = (
            Base(self.host.as_mut_ptr() as *mut u8),
            self.host.len() * ALIGNMENT,
        );
        let (base, slots) = (Base(base), self.slots);
        self.pool
            .install(move || eval.run(base.get(), len, host, None, slots))
    }

    fn step(&mut self) -> Result<(), ExecError> {
        PlannedStep::step(self)
    }

    fn allocated_bytes(&self) -> usize {
        PlannedStep::allocated_bytes(self)
    }

    fn device(&self) -> String {
        "cpu".into()
    }

    fn threads(&self) -> Option<usize> {
        Some(PlannedStep::threads(self))
    }
}

/// The step's collective, which must join `ranks` ranks (else the error saying what it has).
fn joining<'c>(
    collective: &'c mut Option<&mut (dyn Collective + 'static)>,
    ranks: usize,
) -> Result<&'c mut (dyn Collective + 'static), ExecError> {
    match collective.as_deref_mut() {
        Some(c) if c.ranks() == ranks => Ok(c),
        other => Err(needs_collective(ranks, other.map(|c| c.ranks()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel over `domain` of `body` instructions: a load and negations of it.
    fn chain(domain: &[usize], body: usize) -> FusedKernel {
        use ingot_kernels::fused::{Access, Input, Inst, Output};
        let mut insts = vec![Inst::Load { input: 0 }];
        for i in 1..body {
            insts.push(Inst::unary(ingot_kernels::UnaryOp::Neg, i - 1));
        }
        FusedKernel {
            domain: domain.to_vec(),
            reduce_axes: vec![],
            inputs: vec![Input {
                dtype: ingot_kernels::DType::F32,
                len: domain.iter().product(),
                access: Access::contiguous(domain),
            }],
            body: insts,
            outputs: vec![Output { value: body - 1 }],
        }
    }

    #[test]
    fn a_kernel_with_a_longer_body_is_cut_into_pieces_of_fewer_elements() {
        // resnet18's 2×2 batch norms: 131,072 elements. Twelve instructions an element give
        // pieces of 16,384 (8 of them); 45 (a batch norm's backward pass) fill 16 threads.
        let domain = [128, 256, 2, 2];
        let pieces = |body| pieces_of(&chain(&domain, body), &[0], 16, true).map(|p| p.len());
        assert_eq!(min_piece(&chain(&domain, 3)), MIN_PIECE);
        assert_eq!(min_piece(&chain(&domain, 12)), MIN_PIECE);
        assert_eq!(min_piece(&chain(&domain, 45)), MIN_PIECE * 12 / 45);
        assert_eq!(min_piece(&chain(&domain, 400)), MIN_PIECE / 8);
        assert_eq!(pieces(12), Some(8));
        assert_eq!(pieces(45), Some(16));
        // Too small to cut at any length.
        assert!(pieces_of(&chain(&[64, 16], 400), &[0], 16, true).is_none());
    }

    #[test]
    fn an_allocation_larger_than_the_address_space_is_an_error_naming_its_size() {
        let bytes = usize::MAX - 1000;
        let e = zeroed_blocks(bytes).err().expect("refused").to_string();
        assert!(e.contains(&bytes.to_string()), "{e}");
    }

    #[test]
    fn a_small_allocation_is_zeroed_and_whole_blocks() {
        let m = zeroed_blocks(300).unwrap();
        assert_eq!(m.len(), 2);
        assert!(m.iter().all(|b| b.0.iter().all(|&x| x == 0)));
    }

    #[test]
    fn host_memory_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(available_host_memory().is_some_and(|b| b > 0));
        }
    }
}
