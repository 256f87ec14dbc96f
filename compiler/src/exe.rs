//! Step executables on disk: a compiled training step (the fused step graph, its memory plan,
//! its leaves' layouts, the program lowered for its target, with its kernels' source, and its
//! report) written once by `ingot compile` and loaded by `ingot run` or `ingot inspect`,
//! without compiling or lowering again: the file is exactly what runs.
//!
//! The file is a 28-byte header and a JSON payload (docs/executable-format.md is the
//! specification):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | the magic bytes `INGOTEXE` |
//! | 8..12 | the format version, a little-endian u32 ([`VERSION`]) |
//! | 12..20 | the payload's length in bytes, a little-endian u64 |
//! | 20..28 | the payload's FNV-1a-64 checksum, a little-endian u64 |
//! | 28.. | the payload: one JSON object ([`Executable`], the graph in IR text form) |
//!
//! Reading checks each of these in that order, then parses the graph (the IR text parser runs
//! shape inference on every line), verifies it, checks that the plan's tables fit the graph,
//! runs the independent validator ([`MemoryPlan::validate`]) over the plan, and checks the
//! program against the plan before anything can run it. Every failure is an [`ExeError`] naming the file and what is wrong; no input,
//! however damaged, makes the reader panic.
//!
//! ```
//! use ingot_compiler::exe::{Executable, Target};
//! use ingot_compiler::pipeline;
//! let opts = pipeline::Options::for_target(Target::Cpu);
//! let compiled = ingot_models::compile_model("mlp", &opts).unwrap();
//! let exe = compiled.executable(Target::Cpu).unwrap();
//! let bytes = exe.to_bytes().unwrap();
//! let back = Executable::from_bytes(&bytes, "mlp.ingot").unwrap();
//! assert_eq!(back, exe);
//! ```

use crate::error::IrError;
use crate::ir::{text, Graph};
use crate::lower::{self, LowerError, Program};
use crate::plan::shared::{SharedError, SharedLayout};
use crate::plan::{align_up, MemoryPlan, Region, ALIGNMENT};
use crate::precision::Precision;
use crate::report::{BufferKind, Report};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The first eight bytes of every step executable.
pub const MAGIC: [u8; 8] = *b"INGOTEXE";

/// The format version this code writes and reads. Bumped on any change to the header or the
/// payload; a file of another version is refused with a message saying to recompile.
/// Version 3: the payload holds the lowered program (`program`) instead of kernel sources
/// that the runtime matched against a second lowering of its own. Version 4: the payload
/// holds the values of the step's constant leaves (`constants`, [`Constant`]).
pub const VERSION: u32 = 4;

/// Bytes before the payload: magic, version, length, checksum.
pub const HEADER_BYTES: usize = 28;

/// The longest step executable [`Executable::read`] reads (gpt2's is a few MiB): a longer file,
/// or a device that never ends, is an error instead of a read without end.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

pub use crate::lower::Target;

mod constants;
mod layout;
pub use constants::Constant;
pub use layout::{layouts, Layout};

/// A compiled training step, as stored in a step executable: exactly what runs.
///
/// An `Executable` is made only by lowering a validated plan ([`Executable::new`]) or by reading
/// a file that passes every check ([`Executable::from_bytes`]), and it cannot be changed after,
/// so a runtime loads it without validating anything again: its fields are read through
/// methods.
#[derive(Clone, Debug, PartialEq)]
pub struct Executable {
    model: String,
    precision: Precision,
    graph: Graph,
    plan: MemoryPlan,
    layouts: Vec<Layout>,
    program: Program,
    report: Report,
    constants: Vec<Constant>,
}

/// The payload as it is written: [`Executable`] with the graph in its text form.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    model: String,
    target: Target,
    precision: Precision,
    /// The version of the `ingot` that wrote the file (informative; [`VERSION`] decides).
    producer: String,
    /// The step graph in IR text form ([`text::print`]).
    graph: String,
    plan: MemoryPlan,
    layouts: Vec<Layout>,
    /// The lowered program of `target` ([`crate::lower`]).
    program: Program,
    report: Report,
    /// The constant leaves' values ([`Constant`]), in the order they were given.
    constants: Vec<constants::Record>,
}

/// A step executable that cannot be written or read: the file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", .path.display())]
pub struct ExeError {
    pub path: PathBuf,
    pub problem: Problem,
}

/// What is wrong with a step executable.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("cannot read it: {0}")]
    Read(std::io::Error),
    #[error("cannot write it: {0}")]
    Write(std::io::Error),
    #[error("not an Ingot step executable: it starts with {found}, not the magic bytes \"INGOTEXE\"; make one with `ingot compile --model NAME -o FILE`")]
    Magic { found: String },
    #[error("it is a step executable of format version {found}, but this ingot reads version {supported}; recompile it with this ingot (`ingot compile --model NAME -o FILE`)")]
    Version { found: u32, supported: u32 },
    #[error("truncated: {0}; copy it again or recompile it")]
    Truncated(String),
    #[error("corrupted: the payload's FNV-1a-64 checksum is {computed:016x}, but the header says {stored:016x}; copy it again or recompile it")]
    Checksum { stored: u64, computed: u64 },
    #[error("corrupted: {0}; copy it again or recompile it")]
    Corrupt(String),
    #[error("the payload cannot be encoded: {0}")]
    Encode(String),
    #[error("the step graph does not parse or verify: {0}")]
    Graph(IrError),
    #[error("the memory plan does not fit the step graph: {0}; recompile it")]
    Plan(String),
    #[error("its program does not fit its plan: {0}; recompile it")]
    Program(String),
}

impl ExeError {
    fn new(path: &Path, problem: Problem) -> ExeError {
        ExeError {
            path: path.to_path_buf(),
            problem,
        }
    }
}

/// FNV-1a, 64 bits: the payload's checksum (it detects accidental damage, not tampering).
pub use crate::files::fnv1a64;

impl Executable {
    /// The executable of `graph` planned by `plan` for `target`, compiled in `report.precision`:
    /// the plan validated and the step lowered ([`lower::lower`]).
    /// `pipeline::Compiled::executable` calls this with the parts the pipeline made; `report`
    /// must be the plan's ([`Report::new`]).
    pub fn new(
        model: &str,
        graph: Graph,
        plan: MemoryPlan,
        report: Report,
        target: Target,
    ) -> Result<Executable, LowerError> {
        let precision = report.precision;
        let program = lower::lower(&graph, &plan, target, precision)?;
        Ok(Executable {
            model: model.to_string(),
            precision,
            layouts: layouts(&graph, &plan),
            graph,
            plan,
            program,
            report,
            constants: Vec::new(),
        })
    }

    /// The executable carrying `constants`: the values of state leaves the step reads and
    /// never writes (an imported model's exporter-made constants), which a session writes
    /// into their leaves when it loads the step. Each must name a distinct state leaf and
    /// hold exactly its bytes; what does not is an error naming the constant.
    pub fn with_constants(mut self, constants: Vec<Constant>) -> Result<Executable, String> {
        constants::check(&self.layouts, &constants)?;
        self.constants = constants;
        Ok(self)
    }

    /// The constant leaves' values ([`Executable::with_constants`]).
    pub fn constants(&self) -> &[Constant] {
        &self.constants
    }

    /// [`Executable::new`] with the plan's report made here ([`Report::new`], without the
    /// phases a full compile knows): for a graph planned outside the pipeline.
    pub fn from_plan(
        model: &str,
        graph: Graph,
        plan: MemoryPlan,
        target: Target,
    ) -> Result<Executable, LowerError> {
        let report = Report::new(model, &graph, &plan, None);
        Executable::new(model, graph, plan, report, target)
    }

    /// The model's name (`mlp`, `gpt:...`, or an IR file's path).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The target the step was planned and lowered for.
    pub fn target(&self) -> Target {
        self.program.target()
    }

    /// The precision the step was compiled in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The step graph that is planned and run: rewritten and fused.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// Every leaf of the graph, in graph order.
    pub fn layouts(&self) -> &[Layout] {
        &self.layouts
    }

    /// The lowered program: what the runtime runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Lowers the graph again and compares the result with the stored program: a file made
    /// by this compiler holds exactly what it lowers today. Debug builds check this on every
    /// read; `ingot inspect --check` on request.
    pub fn check_program(&self) -> Result<(), LowerError> {
        let again = lower::lower(&self.graph, &self.plan, self.target(), self.precision)?;
        if again != self.program {
            return Err(LowerError::Invalid {
                op: "program",
                reason: format!(
                    "the stored {} program differs from the one this compiler lowers from the \
                     same graph and plan; recompile it with this ingot",
                    self.target()
                ),
            });
        }
        Ok(())
    }

    /// The file's bytes: header and payload. The same executable always gives the same bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ExeError> {
        let payload = Payload {
            model: self.model.clone(),
            target: self.target(),
            precision: self.precision,
            producer: format!("ingot {}", env!("CARGO_PKG_VERSION")),
            graph: text::print(&self.graph),
            plan: self.plan.clone(),
            layouts: self.layouts.clone(),
            program: self.program.clone(),
            report: self.report.clone(),
            constants: constants::encode(&self.constants),
        };
        let json = serde_json::to_vec(&payload)
            .map_err(|e| ExeError::new(Path::new("<memory>"), Problem::Encode(e.to_string())))?;
        let mut out = Vec::with_capacity(HEADER_BYTES + json.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&fnv1a64(&json).to_le_bytes());
        out.extend_from_slice(&json);
        Ok(out)
    }

    /// Writes the executable to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), ExeError> {
        let path = path.as_ref();
        let bytes = self
            .to_bytes()
            .map_err(|e| ExeError::new(path, e.problem))?;
        crate::files::write_atomically(path, &bytes)
            .map_err(|e| ExeError::new(path, Problem::Write(e)))
    }

    /// Reads and checks the executable at `path` ([`Executable::from_bytes`]).
    pub fn read(path: impl AsRef<Path>) -> Result<Executable, ExeError> {
        let path = path.as_ref();
        let bytes = crate::files::read_capped(path, MAX_FILE_BYTES)
            .map_err(|e| ExeError::new(path, Problem::Read(e)))?;
        Executable::from_bytes(&bytes, path)
    }

    /// Reads an executable from its bytes; `path` names the file in errors. Checks, in order:
    /// the magic bytes, the version, the length, the checksum; then parses the payload and the
    /// graph, verifies the graph, checks that the plan fits it and validates the plan with the
    /// independent validator, checks that the layouts and the report agree with the plan, and
    /// checks the program against the plan ([`Program::check`]: every address inside the
    /// allocation, every conflicting pair of operations ordered). Debug builds also lower the
    /// step again and compare ([`Executable::check_program`]).
    pub fn from_bytes(bytes: &[u8], path: impl AsRef<Path>) -> Result<Executable, ExeError> {
        let path = path.as_ref();
        let fail = |problem: Problem| ExeError::new(path, problem);
        let json = open(bytes).map_err(fail)?;
        let p: Payload = serde_json::from_slice(json).map_err(|e| {
            fail(Problem::Corrupt(format!(
                "the payload is not a step executable's JSON: {e}"
            )))
        })?;
        let graph = text::parse(&p.graph).map_err(|e| fail(Problem::Graph(e)))?;
        graph.verify().map_err(|e| fail(Problem::Graph(e)))?;
        check_plan(&graph, &p.plan).map_err(|e| fail(Problem::Plan(e)))?;
        p.plan
            .validate(&graph)
            .map_err(|e| fail(Problem::Plan(e.to_string())))?;
        if p.program.target() != p.target {
            return Err(fail(Problem::Corrupt(format!(
                "it is a {} executable holding a {} program",
                p.target,
                p.program.target()
            ))));
        }
        p.program
            .check(&graph, &p.plan)
            .map_err(|e| fail(Problem::Program(e.to_string())))?;
        if p.report.precision != p.precision {
            return Err(fail(Problem::Corrupt(format!(
                "it says precision {} but its report says {}",
                p.precision, p.report.precision
            ))));
        }
        let constants = constants::decode(p.constants).map_err(|e| fail(Problem::Corrupt(e)))?;
        let exe = Executable {
            model: p.model,
            precision: p.precision,
            graph,
            plan: p.plan,
            layouts: p.layouts,
            program: p.program,
            report: p.report,
            constants,
        };
        exe.check_tables().map_err(|e| fail(Problem::Corrupt(e)))?;
        constants::check(&exe.layouts, &exe.constants).map_err(|e| fail(Problem::Corrupt(e)))?;
        if cfg!(debug_assertions) {
            exe.check_program()
                .map_err(|e| fail(Problem::Program(e.to_string())))?;
        }
        Ok(exe)
    }

    /// The layouts and the report say what the plan says.
    fn check_tables(&self) -> Result<(), String> {
        if self.layouts != layouts(&self.graph, &self.plan) {
            return Err("the leaf layouts disagree with the memory plan".into());
        }
        check_report(&self.model, &self.graph, &self.plan, &self.report)
    }
}

/// Checks the header and returns the payload.
fn open(bytes: &[u8]) -> Result<&[u8], Problem> {
    let head = &bytes[..bytes.len().min(MAGIC.len())];
    if head.is_empty() || head != &MAGIC[..head.len()] {
        return Err(Problem::Magic {
            found: describe_start(head),
        });
    }
    if bytes.len() < HEADER_BYTES {
        // The magic (or what there is of it) is right: a file cut short inside its header.
        let what = if bytes.len() < 12 {
            "its version"
        } else {
            "the header"
        };
        return Err(Problem::Truncated(format!(
            "it ends after {} bytes, inside {what} (a step executable starts with a {HEADER_BYTES}-byte header)",
            bytes.len()
        )));
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    let version = u32_at(8);
    if version != VERSION {
        return Err(Problem::Version {
            found: version,
            supported: VERSION,
        });
    }
    let (length, stored) = (u64_at(12), u64_at(20));
    let got = (bytes.len() - HEADER_BYTES) as u64;
    if got < length {
        return Err(Problem::Truncated(format!(
            "the header says the payload is {length} bytes, but only {got} follow it"
        )));
    }
    if got > length {
        return Err(Problem::Corrupt(format!(
            "{} bytes follow the {length}-byte payload the header announces",
            got - length
        )));
    }
    let payload = &bytes[HEADER_BYTES..];
    let computed = fnv1a64(payload);
    if computed != stored {
        return Err(Problem::Checksum { stored, computed });
    }
    Ok(payload)
}

/// The first bytes of a file, for an error message: as text when they are printable.
fn describe_start(head: &[u8]) -> String {
    if head.is_empty() {
        return "nothing (the file is empty)".to_string();
    }
    if head.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("{:?}", String::from_utf8_lossy(head))
    } else {
        let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
        format!("the bytes {}", hex.join(" "))
    }
}

/// The plan's tables have one entry per node of `g`, every index in them is in range, every
/// byte range lies inside the allocation (computed without overflow), and the totals add up:
/// what [`MemoryPlan::validate`] and the runtimes take for granted before the validator proves
/// the rest.
fn check_plan(g: &Graph, p: &MemoryPlan) -> Result<(), String> {
    if p.total_bytes > isize::MAX as usize - ALIGNMENT {
        return Err(format!(
            "its total of {} bytes is more than any allocation",
            p.total_bytes
        ));
    }
    let lv = &p.liveness;
    let n = g.len();
    let s = lv.storages.len();
    for (what, len) in [
        ("schedule", lv.order.len()),
        ("position table", lv.position.len()),
        ("storage table", lv.storage_of.len()),
        ("workspace table", lv.workspace_of.len()),
    ] {
        if len != n {
            return Err(format!("its {what} has {len} entries for {n} nodes"));
        }
    }
    if p.storage_offset.len() != s {
        return Err(format!(
            "{} storage offsets for {s} storages",
            p.storage_offset.len()
        ));
    }
    for (pos, id) in lv.order.iter().enumerate() {
        if id.index() >= n || lv.position[id.index()] != pos {
            return Err(format!(
                "schedule position {pos} holds {id}, which the position table does not put there"
            ));
        }
    }
    for (i, &st) in lv.storage_of.iter().enumerate() {
        if st >= s {
            return Err(format!("%{i} lives in storage {st}, but there are {s}"));
        }
    }
    for (i, w) in lv.workspace_of.iter().enumerate() {
        if let Some(w) = *w {
            if w >= s || !lv.storages[w].workspace {
                return Err(format!(
                    "the workspace of %{i} is storage {w}, which is not a workspace"
                ));
            }
        }
    }
    for &(v, t) in &lv.copies {
        if v.index() >= n || t.index() >= n {
            return Err(format!("a copy names {v} -> {t}, outside the graph"));
        }
    }
    let end_of =
        |offset: usize, bytes: usize, what: &dyn Fn() -> String| match offset.checked_add(bytes) {
            Some(end) if end <= p.total_bytes => Ok(end),
            _ => Err(format!(
                "{} at offset {offset} ({bytes} bytes) lies outside the {}-byte allocation",
                what(),
                p.total_bytes
            )),
        };
    for id in g.ids() {
        end_of(
            p.storage_offset[lv.storage_of[id.index()]],
            g.ty(id).bytes(),
            &|| format!("{id}"),
        )?;
    }
    let mut resident = 0usize;
    let mut slab_end = 0usize;
    for (i, st) in lv.storages.iter().enumerate() {
        if st.owner.index() >= n {
            return Err(format!(
                "storage {i} is owned by {}, outside the graph",
                st.owner
            ));
        }
        let offset = p.storage_offset[i];
        let end = end_of(offset, st.bytes, &|| format!("storage {i}"))?;
        if !offset.is_multiple_of(ALIGNMENT) {
            return Err(format!(
                "storage {i} is at offset {offset}, not a multiple of {ALIGNMENT}"
            ));
        }
        match st.region {
            Region::Resident => resident = resident.saturating_add(align_up(st.bytes)),
            Region::Slab => {
                if offset < p.slab_base {
                    return Err(format!("slab storage {i} lies before the slab"));
                }
                slab_end = slab_end.max(align_up(end) - p.slab_base);
            }
        }
    }
    check_lifetimes(g, p)?;
    let sums = p.resident_bytes == resident
        && p.slab_base == align_up(p.resident_bytes)
        && p.slab_bytes == slab_end
        && p.slab_base.checked_add(p.slab_bytes) == Some(p.total_bytes)
        && p.load_bytes <= p.slab_bytes
        && p.peak_position <= n;
    if !sums {
        return Err(format!(
            "its totals do not add up (resident {}, slab {} at {}, total {})",
            p.resident_bytes, p.slab_bytes, p.slab_base, p.total_bytes
        ));
    }
    Ok(())
}

/// Every storage's lifetime `[start, end)` is a non-empty part of the schedule that covers each
/// value living in it, from where its kernel writes it to its last read (a step output and a
/// value copied over its update target: to the end); a resident storage spans the whole step
/// and a workspace ends at its owner's position (and starts there, or earlier when filled
/// ahead of it). The report and the picture read these
/// lifetimes, and the validator does not (it recomputes liveness), so they are checked here.
fn check_lifetimes(g: &Graph, p: &MemoryPlan) -> Result<(), String> {
    let lv = &p.liveness;
    let n = lv.order.len();
    for (i, st) in lv.storages.iter().enumerate() {
        if st.start >= st.end || st.end > n {
            return Err(format!(
                "storage {i} (owned by {}) lives [{}, {}), which is not a non-empty part of the {n}-position schedule",
                st.owner, st.start, st.end
            ));
        }
        if st.region == Region::Resident && (st.start != 0 || st.end != n) {
            return Err(format!(
                "resident storage {i} (owned by {}) lives [{}, {}), not the whole step [0, {n})",
                st.owner, st.start, st.end
            ));
        }
        let at = lv.position[st.owner.index()];
        // A workspace is held at its node, and may be held from earlier (filled ahead of it).
        if st.workspace && (st.start > at || st.end != at + 1) {
            return Err(format!(
                "workspace storage {i} lives [{}, {}), but its owner {} runs at position {at}",
                st.start, st.end, st.owner
            ));
        }
    }
    let mut last_read: Vec<usize> = g
        .ids()
        .map(|id| lv.position[g.writer(id).index()])
        .collect();
    for id in g.ids() {
        for &x in g.reads(id) {
            last_read[x.index()] = last_read[x.index()].max(lv.position[id.index()]);
        }
    }
    for &o in g.outputs.values() {
        last_read[o.index()] = n;
    }
    for &(v, _) in &lv.copies {
        last_read[v.index()] = n;
    }
    for id in g.ids() {
        let s = lv.storage_of[id.index()];
        let st = &lv.storages[s];
        // An offloaded leaf is on the device from its copy in.
        let def = match p.offload.iter().find(|o| o.leaf == id) {
            Some(o) => o.copy_in_before,
            None => lv.position[g.writer(id).index()],
        };
        let until = (last_read[id.index()] + 1).min(n);
        if def < st.start || until > st.end {
            return Err(format!(
                "{id} is written at position {def} and read until {until}, outside the lifetime [{}, {}) of its storage {s}",
                st.start, st.end
            ));
        }
    }
    Ok(())
}

/// The report's rows say what the plan says: every figure the report derives from the graph and
/// the plan alone is recomputed and compared, and the peak rows are the storages live at the
/// peak. Which rows are saved activations, gradients or temporaries depends on the phases of the
/// compile (not stored), so only their sum is checked.
fn check_report(model: &str, g: &Graph, p: &MemoryPlan, r: &Report) -> Result<(), String> {
    let e = Report::new(model, g, p, None);
    let fields = [
        ("version", r.version == e.version),
        ("model", r.model == e.model),
        ("ops", r.ops == e.ops),
        ("kernels", r.kernels == e.kernels),
        ("schedule", r.schedule == e.schedule),
        ("total_bytes", r.total_bytes == e.total_bytes),
        ("resident_bytes", r.resident_bytes == e.resident_bytes),
        ("resident", r.resident == e.resident),
        ("slab_bytes", r.slab_bytes == e.slab_bytes),
        (
            "lower_bound_bytes",
            r.lower_bound_bytes == e.lower_bound_bytes,
        ),
        (
            "slab_over_lower_bound",
            (r.slab_over_lower_bound - e.slab_over_lower_bound).abs()
                <= 1e-9 * e.slab_over_lower_bound.abs().max(1.0),
        ),
        ("peak_position", r.peak_position == e.peak_position),
        ("peak_op", r.peak_op == e.peak_op),
        ("in_place_ops", r.in_place_ops == e.in_place_ops),
        ("slab_buffers", r.slab_buffers == e.slab_buffers),
        ("offload", r.offload == e.offload),
        (
            "peak_by_kind",
            r.peak_by_kind.workspace == e.peak_by_kind.workspace
                && r.peak_by_kind
                    .saved_activation
                    .checked_add(r.peak_by_kind.gradient)
                    .and_then(|x| x.checked_add(r.peak_by_kind.temporary))
                    == Some(
                        e.peak_by_kind.saved_activation
                            + e.peak_by_kind.gradient
                            + e.peak_by_kind.temporary,
                    ),
        ),
    ];
    if let Some((field, _)) = fields.iter().find(|(_, ok)| !ok) {
        return Err(format!(
            "the report's {field} disagrees with the memory plan"
        ));
    }
    // The graph read back has no provenance, so its count takes recomputed products in too:
    // the model's FLOPs can be fewer, never more.
    if let (Some(kept), Some(most)) = (r.model_flops, e.model_flops) {
        if kept > most {
            return Err(format!(
                "the report's model_flops {kept} is more than the {most} FLOPs of the graph's products"
            ));
        }
    }
    if r.peak_buffers.len() != e.peak_buffers.len() {
        return Err(format!(
            "the report lists {} buffers live at the peak, but the plan has {} to list",
            r.peak_buffers.len(),
            e.peak_buffers.len()
        ));
    }
    for (row, (a, b)) in r.peak_buffers.iter().zip(&e.peak_buffers).enumerate() {
        let workspace = |k: BufferKind| k == BufferKind::Workspace;
        let same = a.node == b.node
            && a.op == b.op
            && a.dtype == b.dtype
            && a.shape == b.shape
            && a.bytes == b.bytes
            && a.lifetime == b.lifetime
            && workspace(a.kind) == workspace(b.kind);
        if !same {
            return Err(format!(
                "row {row} of the report's peak buffers (%{} {} {} bytes, live {:?}) disagrees with the plan (%{} {} {} bytes, live {:?})",
                a.node, a.op, a.bytes, a.lifetime, b.node, b.op, b.bytes, b.lifetime
            ));
        }
    }
    Ok(())
}

/// Why a training step and an evaluation step cannot be paired in one allocation.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    /// The evaluation step's plan could not be re-based onto the training step's
    /// ([`crate::plan::shared::rebase`]).
    #[error("the evaluation step cannot share the training step's allocation: {0}")]
    Shared(#[from] SharedError),
    /// The re-based evaluation step could not be lowered (its program did not check).
    #[error("lowering the evaluation step: {0}")]
    Lower(#[from] LowerError),
}

/// A training step and a forward-only evaluation step of the same model, planned into one
/// allocation ([`crate::plan::shared`]): they share the resident parameters at the same offsets,
/// and their transient regions overlap because they never run at the same time. A runtime
/// loads both programs against one allocation of [`StepPair::allocation_bytes`].
///
/// Made only by [`StepPair::new`], which re-bases, validates and lowers the evaluation step
/// (the training step is an [`Executable`] already), so, as for an [`Executable`], a runtime
/// loads it without checking anything again. Not a file format: a pair lives in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct StepPair {
    train: Executable,
    eval: Executable,
    layout: SharedLayout,
}

impl StepPair {
    /// Pairs `train` with the forward-only step `eval_graph`, planned on its own as `eval_plan`
    /// for the same target (by the pipeline, as any step): the plan is re-based into `train`'s
    /// allocation, validated, and the step lowered for `train`'s target, named `eval_name`.
    pub fn new(
        train: Executable,
        eval_name: &str,
        eval_graph: Graph,
        eval_plan: &MemoryPlan,
    ) -> Result<StepPair, PairError> {
        let (plan, layout) =
            crate::plan::shared::rebase(train.graph(), train.plan(), &eval_graph, eval_plan)?;
        let mut report = Report::new(eval_name, &eval_graph, &plan, None);
        report.precision = train.precision();
        let eval = Executable::new(eval_name, eval_graph, plan, report, train.target())?;
        Ok(StepPair {
            train,
            eval,
            layout,
        })
    }

    /// The training step (its own plan, unchanged).
    pub fn train(&self) -> &Executable {
        &self.train
    }

    /// The evaluation step, re-based into the training step's allocation.
    pub fn eval(&self) -> &Executable {
        &self.eval
    }

    /// How the one allocation divides between the two steps.
    pub fn layout(&self) -> SharedLayout {
        self.layout
    }

    /// Bytes of the one allocation both steps run in: the larger of the two plans' totals.
    pub fn allocation_bytes(&self) -> usize {
        self.train
            .plan()
            .total_bytes
            .max(self.eval.plan().total_bytes)
    }

    /// The two steps, apart.
    pub fn into_parts(self) -> (Executable, Executable, SharedLayout) {
        (self.train, self.eval, self.layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_reference_values() {
        // From the FNV reference test suite.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn the_header_is_checked_field_by_field() {
        let payload = b"{}";
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(&VERSION.to_le_bytes());
        file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        file.extend_from_slice(&fnv1a64(payload).to_le_bytes());
        file.extend_from_slice(payload);
        assert_eq!(open(&file).unwrap(), payload);
        assert!(matches!(open(b""), Err(Problem::Magic { .. })));
        assert!(matches!(open(b"INGOT"), Err(Problem::Truncated(_))));
        assert!(matches!(open(b"PK\x03\x04"), Err(Problem::Magic { .. })));
        assert!(matches!(open(&file[..27]), Err(Problem::Truncated(_))));
        assert!(matches!(open(&file[..29]), Err(Problem::Truncated(_))));
        let mut longer = file.clone();
        longer.push(b' ');
        assert!(matches!(open(&longer), Err(Problem::Corrupt(_))));
        let mut v2 = file.clone();
        v2[8] = 2;
        assert!(matches!(
            open(&v2),
            Err(Problem::Version {
                found: 2,
                supported: VERSION
            })
        ));
        let mut flipped = file.clone();
        flipped[28] ^= 1;
        assert!(matches!(open(&flipped), Err(Problem::Checksum { .. })));
    }

    /// The mlp's step executable for the CPU, as `ingot compile` makes it.
    fn mlp() -> Executable {
        let model = crate::models::by_name("mlp").unwrap();
        let opts = crate::pipeline::Options::for_target(Target::Cpu);
        let compiled = crate::pipeline::compile(&model, &opts).unwrap();
        compiled.executable(Target::Cpu).unwrap()
    }

    /// What reading `exe`'s bytes says (the bytes are well formed: header and checksum match).
    fn refusal(exe: &Executable) -> String {
        match Executable::from_bytes(&exe.to_bytes().unwrap(), "crafted.ingot") {
            Ok(_) => panic!("a crafted executable was accepted"),
            Err(e) => e.to_string(),
        }
    }

    /// A slab storage and a value living in it that is read after the storage's first position.
    fn read_later(exe: &Executable) -> (usize, usize) {
        let lv = &exe.plan.liveness;
        (0..lv.storages.len())
            .find_map(|i| {
                let st = &lv.storages[i];
                (st.region == Region::Slab && !st.workspace && st.end > st.start + 1)
                    .then_some((i, st.start))
            })
            .expect("the mlp has a slab value read after its kernel runs")
    }

    #[test]
    fn a_genuine_executable_reads_back_as_written() {
        let exe = mlp();
        let back = Executable::from_bytes(&exe.to_bytes().unwrap(), "mlp.ingot").unwrap();
        assert_eq!(back, exe);
    }

    #[test]
    fn a_storage_that_starts_after_it_ends_is_refused_naming_it() {
        let mut exe = mlp();
        let (i, _) = read_later(&exe);
        let st = &mut exe.plan.liveness.storages[i];
        (st.start, st.end) = (st.end, st.start);
        let e = refusal(&exe);
        assert!(
            e.contains(&format!("storage {i} ")) && e.contains("non-empty"),
            "{e}"
        );
    }

    #[test]
    fn a_storage_that_ends_past_the_schedule_is_refused_naming_it() {
        let mut exe = mlp();
        let n = exe.plan.liveness.order.len();
        let (i, _) = read_later(&exe);
        exe.plan.liveness.storages[i].end = n + 5;
        let e = refusal(&exe);
        assert!(
            e.contains(&format!("storage {i} ")) && e.contains(&format!("{n}-position")),
            "{e}"
        );
    }

    #[test]
    fn a_storage_lifetime_shorter_than_its_value_is_refused_naming_the_value() {
        let mut exe = mlp();
        let (i, start) = read_later(&exe);
        exe.plan.liveness.storages[i].end = start + 1;
        let e = refusal(&exe);
        assert!(
            e.contains("read until") && e.contains(&format!("its storage {i}")),
            "{e}"
        );
    }

    #[test]
    fn a_resident_storage_that_does_not_span_the_step_is_refused() {
        let mut exe = mlp();
        let lv = &mut exe.plan.liveness;
        let i = (0..lv.storages.len())
            .find(|&i| lv.storages[i].region == Region::Resident)
            .unwrap();
        lv.storages[i].start = 1;
        let e = refusal(&exe);
        assert!(e.contains(&format!("resident storage {i} ")), "{e}");
    }

    #[test]
    fn a_report_row_that_disagrees_with_the_plan_is_refused_naming_the_row() {
        let mut exe = mlp();
        assert!(exe.report.peak_buffers.len() >= 2);
        exe.report.peak_buffers[1].bytes += 256;
        let e = refusal(&exe);
        assert!(e.contains("row 1 of the report's peak buffers"), "{e}");

        let mut exe = mlp();
        exe.report.peak_buffers[0].lifetime[1] += 1;
        assert!(refusal(&exe).contains("row 0"));

        let mut exe = mlp();
        exe.report.peak_buffers.pop();
        assert!(refusal(&exe).contains("buffers live at the peak"));
    }

    #[test]
    fn a_report_figure_that_disagrees_with_the_plan_is_refused_naming_the_field() {
        let mut exe = mlp();
        exe.report.in_place_ops += 1;
        assert!(refusal(&exe).contains("in_place_ops"));
        let mut exe = mlp();
        exe.report.peak_by_kind.gradient += 4;
        assert!(refusal(&exe).contains("peak_by_kind"));
        let mut exe = mlp();
        exe.report.resident.inputs += 256;
        assert!(refusal(&exe).contains("resident"));
    }
}
