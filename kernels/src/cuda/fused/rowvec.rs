//! Long rows several elements at a time: a row too long for the register cache is read from
//! memory in every loop over it, and there each thread reads four consecutive elements of a
//! load as one vector (16 bytes of f32), or eight where every vector is bf16 (16 bytes, two to
//! each 32-bit word), instead of one element, and writes its full outputs the same way.
//!
//! Why: such a loop keeps one load a thread in flight. GPT-2's cross-entropy kernel (8,192
//! rows of 50,304 logits, a block of 1,024 threads a row) moved 1.7 TB/s of bf16 that way on
//! an H200 (docs/benchmarks.md, session 10), far from the memory's 4.8: two bytes a thread
//! in flight do not cover the memory's latency. Four elements a thread carry four times the
//! bytes with the same number of loads.
//!
//! The thread's elements of a loop are then `4 jv .. 4 jv + 3` for `jv` from the thread's
//! index in steps of the threads along the row; each lane's body is written in its own scope
//! with `j` its element, as the plain loop's body, except that a load read as a vector takes
//! its lane of `l{m}` and a full output sets its lane of `r{j}`.

use super::guards::IndexGuard;
use super::layout::Layout;
use super::loops::THREAD_BLOCK;
use super::plan::{Lane, Plan, RowVectors};
use super::text::{mentions, without_unread_values};
use super::vec4::vec4_type;
use super::Analysis;
use crate::cuda::guard::Guard;
use crate::cuda::{widened, CodegenError, Src};
use crate::fused::{Access, Inst};
use crate::DType;

/// The components of a CUDA vector type, in order.
const COMPONENTS: [&str; 4] = ["x", "y", "z", "w"];

/// The lanes' bodies of one loop a vector at a time: as computed, and where the thread's whole
/// vector fails the loop's mask ([`Analysis::loop_mask`]; `masked`: the mask, and the lanes
/// written knowing its condition), so that a masked vector computes only what its known
/// condition leaves (the lanes of a causal softmax's masked vector compute one value, which
/// the compiler shares among them) and reads nothing.
pub(super) struct VectorLanes {
    pub(super) lanes: Vec<String>,
    pub(super) masked: Option<(IndexGuard, Vec<String>)>,
}

impl Plan {
    /// Elements a vector of the kernel's long-row loops (4 where it has none).
    pub(super) fn vector_width(&self) -> usize {
        self.vectors.as_ref().map_or(4, |v| v.width)
    }
}

impl Analysis<'_> {
    /// Which accesses of a row-strategy kernel go a vector at a time: rows a multiple of 4
    /// long, and either a block a row with at most [`THREAD_BLOCK`] elements a thread read from
    /// memory in every loop (longer shares sum in blocks, element by element) or, with the
    /// register cache, a block or a group of lanes a row with a whole number of vectors a
    /// thread (the rows a multiple of the vector times the threads). An input is read as vectors
    /// if the loops read it contiguously along the row (stride 1 over the reduce axes' one
    /// linear index), its type has a vector ([`vec4_type`]: f32, i32, bool, bf16) and each
    /// row's first element is a multiple of 4 (its offset and row strides are; buffers are
    /// 256-byte aligned, so the vector is aligned). The full outputs are written as vectors
    /// when all have a vector type and are contiguous along the row the same way.
    ///
    /// Why the cached rows too: their unrolled loops read one element a thread a load, and
    /// two bytes a thread do not cover the memory's latency. GPT-2's causal softmax over
    /// `[8, 12, 1024, 1024]` bf16 scores moved about 1.4 TB/s so on an H100 (session 11's
    /// profile: 273 µs forward, 426 µs backward).
    pub(super) fn row_vectors(&self, plan: &Plan) -> Option<RowVectors> {
        let k = self.k;
        let cache = plan.shape.cache;
        // A block a row; or, cached, a group of lanes a row (several rows a block).
        let t = match plan.shape.lay {
            Layout::Block { t } => t,
            Layout::Group { w, .. } if cache => w,
            _ => return None,
        };
        // A whole number of vectors of `w` a thread, with the register cache.
        let runs = |w: usize| !cache || self.n.is_multiple_of(w * t as usize);
        if self.tuning.scalar_rows
            || !self.n.is_multiple_of(4)
            || !runs(4)
            || (!cache && self.n.div_ceil(t as usize) > THREAD_BLOCK)
        {
            return None;
        }
        let sp = &plan.sp;
        // Each row's first element a multiple of `w` elements.
        let aligned_to = |w: usize, a: &Access| {
            a.offset.is_multiple_of(w)
                && (0..k.domain.len())
                    .all(|d| self.red_axis[d] || k.domain[d] == 1 || a.strides[d].is_multiple_of(w))
        };
        let aligned = |a: &Access| aligned_to(4, a);
        let inputs: Vec<bool> = (k.inputs.iter().enumerate())
            .map(|(m, inp)| {
                sp.full_used[m]
                    && vec4_type(inp.dtype).is_some()
                    && sp.red.linear(sp.vec_of[m]) == Some(1)
                    && aligned(&inp.access)
            })
            .collect();
        let full: Vec<usize> = (0..k.outputs.len())
            .filter(|&j| !self.row[k.outputs[j].value])
            .collect();
        let outputs = plan.p.full_outputs
            && full.iter().all(|&j| vec4_type(k.output_dtype(j)).is_some())
            && sp.red.linear(sp.out_vec) == Some(1)
            && aligned(&Access::contiguous(&k.domain));
        if !inputs.iter().any(|&v| v) && !outputs {
            return None;
        }
        // Eight elements a vector where every vector is of bf16 (16 bytes) or of bools (8, a
        // mask beside bf16 scores) and aligned so.
        let aligned8 = |a: &Access| aligned_to(8, a);
        let eight = |d: DType| d == DType::BF16 || d == DType::Bool;
        let wide = self.n.is_multiple_of(8)
            && runs(8)
            && (k.inputs.iter().zip(&inputs))
                .all(|(inp, &v)| !v || (eight(inp.dtype) && aligned8(&inp.access)))
            && (!outputs
                || (full.iter().all(|&j| k.output_dtype(j) == DType::BF16)
                    && aligned8(&Access::contiguous(&k.domain))));
        let width = if wide { 8 } else { 4 };
        Some(RowVectors {
            inputs,
            outputs,
            width,
        })
    }

    /// How the loop over `insts` (loop `p`'s guards) reads each input: as vectors where
    /// [`Analysis::row_vectors`] allows it and the loop loads it from memory (not from the
    /// register cache, `loaded`), unguarded, or guarded where the rows are cached (a long
    /// row's guarded loads pick single elements, the cross-entropy's target logit, and stay
    /// scalar).
    ///
    /// A guarded load read as a vector reads every element: measured on an H200 (session 12),
    /// GPT-2's causal softmax over `[8, 12, 1024, 1024]` bf16 scores took 306 µs forward and
    /// 407 µs backward with each vector read by the first lane whose mask let it through (the
    /// scores' load waiting for the mask's), 285 and 376 µs with every vector read beside the
    /// mask.
    pub(super) fn loop_vectors(
        &self,
        plan: &Plan,
        insts: &[usize],
        p: usize,
        loaded: &[bool],
    ) -> Vec<bool> {
        let mut v = vec![false; self.k.inputs.len()];
        if let Some(rv) = &plan.vectors {
            for &i in insts {
                let Inst::Load { input } = self.k.body[i] else {
                    continue;
                };
                if !rv.inputs[input] || (plan.cached[i] && loaded[i]) {
                    continue;
                }
                if plan.guards[p][i].is_none() || plan.shape.cache {
                    v[input] = true;
                }
            }
        }
        v
    }

    /// The vectors of the loop over `insts` (loop `p`'s guards) that may be skipped: for each
    /// input read as vectors (`vectors`) whose loads there share one guard with literals
    /// computed from indices alone ([`Analysis::index_only_guard`]), those literals and the
    /// instructions that compute them. A thread reads such a vector only where some lane's
    /// literals hold: the masked half of a causal softmax's rows is not read at all, and no
    /// load waits for another (a mask read from memory would make the scores' load wait).
    pub(super) fn vector_skips(
        &self,
        plan: &Plan,
        insts: &[usize],
        p: usize,
        vectors: &[bool],
    ) -> Vec<Option<IndexGuard>> {
        let k = self.k;
        (0..k.inputs.len())
            .map(|m| {
                if !vectors[m] {
                    return None;
                }
                let mut guards = (insts.iter())
                    .filter(|&&i| matches!(k.body[i], Inst::Load { input } if input == m))
                    .map(|&i| plan.guards[p][i]);
                let first = guards.next()??;
                if guards.any(|g| g != Some(first)) {
                    return None;
                }
                self.index_only_guard(first)
            })
            .collect()
    }

    /// The mask of the loop over `insts` (loop `p`'s guards), if it has one: a guard of some
    /// load there (read from memory or from the register cache) whose literals computed from
    /// indices alone are one, `v{c} == w`, with the instructions that compute it. A vector all
    /// of whose lanes fail it is written apart ([`VectorLanes::masked`]): there every such
    /// load is its guarded 0 and `v{c}` is `!w`, so the lanes compute what is left.
    pub(super) fn loop_mask(&self, plan: &Plan, insts: &[usize], p: usize) -> Option<IndexGuard> {
        if plan.el.vector <= 1 {
            return None;
        }
        (insts.iter())
            .filter(|&&i| matches!(self.k.body[i], Inst::Load { .. }))
            .filter_map(|&i| self.index_only_guard(plan.guards[p][i]?))
            .find(|(g, _)| g.literals().len() == 1)
    }

    /// Writes the lines that set `flag` (whether some lane of the thread's vector passes
    /// `guard`: `k{m}` for a skipped input `m`, `km` for the loop's mask) from each lane's
    /// literals of `guard`, the instructions `closure` computing them.
    fn write_vector_skip(
        &self,
        src: &mut Src,
        plan: &Plan,
        flag: &str,
        (guard, closure): &IndexGuard,
    ) -> Result<(), CodegenError> {
        let (ix, t) = (self.ix, self.ix.ty());
        let full: Vec<usize> = closure.iter().copied().filter(|&i| !self.row[i]).collect();
        let none = vec![None; self.k.body.len()];
        let cond: Vec<String> = (guard.literals().iter())
            .map(|&(c, w)| if w { format!("v{c}") } else { format!("!v{c}") })
            .collect();
        src.line(format!("bool {flag} = false;"));
        for q in 0..plan.vector_width() {
            src.open("{");
            src.line(format!("const {t} j = jb + {};", ix.lit(q)));
            let mut scratch = vec![false; self.k.body.len()];
            self.loop_insts(src, plan, &full, false, &none, &mut scratch, None)?;
            src.line(format!("{flag} = {flag} || ({});", cond.join(" && ")));
            src.close();
        }
        Ok(())
    }

    /// A loop over the row a vector at a time around the lanes' bodies `lanes` (written at
    /// depth `src.depth + 2`): reads a vector of each input `vectors` reads before the lanes
    /// and, with `outputs`, writes a vector of each full output after them; the lines `ends.0`
    /// come before the lanes, `ends.1` after them.
    /// With the register cache the loop is unrolled over the thread's vectors (`uv`), and each
    /// lane's cache index is `u` ([`super::loops::Elements`] maps it to the same element).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit_vector_loop(
        &self,
        src: &mut Src,
        plan: &Plan,
        vectors: &[bool],
        skips: &[Option<IndexGuard>],
        outputs: bool,
        lanes: &VectorLanes,
        ends: (&[String], &[String]),
    ) -> Result<(), CodegenError> {
        let (k, ix, t) = (self.k, self.ix, self.ix.ty());
        // The thread's index along the row, and the threads a row.
        let (me, threads, group) = match plan.shape.lay {
            Layout::Block { t } => ("threadIdx.x", t, false),
            Layout::Group { w, .. } => ("lane", w, true),
            Layout::Columns { .. } => return Ok(()),
        };
        let width = plan.vector_width();
        let vtype = |d: DType| vector_type(d, width);
        if plan.shape.cache {
            src.line("#pragma unroll");
            src.open(format!(
                "for (unsigned uv = 0u; uv < {}u; ++uv) {{",
                plan.el.per_thread / width
            ));
            src.line(format!(
                "const {t} jb = {} * {me} + uv * {};",
                ix.lit(width),
                ix.lit(width * threads as usize)
            ));
        } else {
            src.open(format!(
                "for ({t} jv = {me}; jv < {}; jv += {}) {{",
                ix.lit(self.n / width),
                ix.lit(threads as usize)
            ));
            src.line(format!("const {t} jb = {} * jv;", ix.lit(width)));
        }
        for (m, inp) in k.inputs.iter().enumerate() {
            if !vectors[m] {
                continue;
            }
            let (v, at) = (vtype(inp.dtype), at_jb(&plan.at.row[m]));
            let load = format!("*reinterpret_cast<const {v}*>(in{m} + ({at}))");
            match skips.get(m).and_then(Option::as_ref) {
                Some(skip) => {
                    self.write_vector_skip(src, plan, &format!("k{m}"), skip)?;
                    src.line(format!("{v} l{m} = {{}};"));
                    src.line(format!("if (k{m}) {{ l{m} = {load}; }}"));
                }
                None => src.line(format!("const {v} l{m} = {load};")),
            }
        }
        let full: Vec<usize> = (0..k.outputs.len())
            .filter(|&j| outputs && !self.row[k.outputs[j].value])
            .collect();
        for &j in &full {
            match width {
                8 => src.line(format!("unsigned short r{j}[8];")),
                _ => src.line(format!("{} r{j};", vtype(k.output_dtype(j)))),
            }
        }
        for l in ends.0 {
            src.line(l);
        }
        let write_lanes = |src: &mut Src, bodies: &[String]| {
            for (q, body) in bodies.iter().enumerate() {
                src.open("{");
                if plan.shape.cache && mentions(body, "u") {
                    src.line(format!("const unsigned u = uv * {width}u + {q}u;"));
                }
                if mentions(body, "j") {
                    let j = match q {
                        0 => "jb".to_string(),
                        q => format!("jb + {}", ix.lit(q)),
                    };
                    src.line(format!("const {t} j = {j};"));
                }
                src.text
                    .push_str(&indented(body, usize::from(lanes.masked.is_some())));
                src.close();
            }
        };
        match &lanes.masked {
            None => write_lanes(src, &lanes.lanes),
            Some((mask, masked)) => {
                self.write_vector_skip(src, plan, "km", mask)?;
                src.open("if (km) {");
                write_lanes(src, &lanes.lanes);
                src.close();
                src.line("else {");
                src.depth += 1;
                write_lanes(src, masked);
                src.close();
            }
        }
        for l in ends.1 {
            src.line(l);
        }
        let out = plan.at.out_base.clone().unwrap_or_else(|| "0".into());
        for &j in &full {
            let value = match width {
                8 => {
                    let pair = |w: usize| {
                        format!(
                            "(unsigned)r{j}[{}] | ((unsigned)r{j}[{}] << 16)",
                            2 * w,
                            2 * w + 1
                        )
                    };
                    format!(
                        "make_uint4({}, {}, {}, {})",
                        pair(0),
                        pair(1),
                        pair(2),
                        pair(3)
                    )
                }
                _ => format!("r{j}"),
            };
            let store = format!(
                "*reinterpret_cast<{v}*>(out{j} + ({})) = {value};",
                at_jb(&out),
                v = vtype(k.output_dtype(j))
            );
            // A group's row past the last (`ok` false) read the last row: it writes nothing.
            src.line(if group {
                format!("if (ok) {{ {store} }}")
            } else {
                store
            });
        }
        src.close();
        Ok(())
    }

    /// Lane `q` of input `input`'s vector `l{input}`, widened to its register type.
    fn vector_lane(&self, plan: &Plan, input: usize, q: usize) -> String {
        let dtype = self.k.inputs[input].dtype;
        widened(dtype, lane_bits(plan.vector_width(), dtype, input, q))
    }

    /// The lanes' bodies of a loop a vector at a time, `body(lane, loaded)` writing each: every
    /// lane starts from the cached loads the loop starts with (`loaded`; each lane caches its own
    /// element), and `loaded` ends as the lanes leave it. With the loop's mask (`mask`, one
    /// literal `v{c} == w`), the lanes again knowing that `v{c}` is `!w`
    /// ([`VectorLanes::masked`]).
    pub(super) fn vector_lanes(
        &self,
        plan: &Plan,
        vectors: &[bool],
        mask: Option<IndexGuard>,
        loaded: &mut [bool],
        mut body: impl FnMut(Lane, &mut [bool]) -> Result<String, CodegenError>,
    ) -> Result<VectorLanes, CodegenError> {
        let start = loaded.to_vec();
        let mut write = |known: Option<(usize, bool)>, loaded: &mut [bool]| {
            let mut lanes = Vec::new();
            let mut after = start.clone();
            for q in 0..plan.vector_width() {
                after.copy_from_slice(&start);
                let lane = Lane { q, vectors, known };
                lanes.push(body(lane, &mut after)?);
            }
            loaded.copy_from_slice(&after);
            Ok::<_, CodegenError>(lanes)
        };
        let lanes = write(None, loaded)?;
        let masked = match mask {
            Some(mask) => {
                let (c, w) = mask.0.literals()[0];
                let mut after = start.clone();
                let masked = write(Some((c, !w)), &mut after)?
                    .iter()
                    .map(|body| without_unread_values(body))
                    .collect();
                // Both bodies must leave the same loads cached (a kept-out load caches its 0),
                // or the loops after would not know which to read.
                (after == loaded).then_some((mask, masked))
            }
            None => None,
        };
        Ok(VectorLanes { lanes, masked })
    }

    /// The line load `i` of `input`, read as a vector, becomes in lane `q`: its element (with
    /// a guard, where the guard holds, 0 elsewhere, as a guarded scalar load).
    pub(super) fn vector_load_line(
        &self,
        plan: &Plan,
        i: usize,
        input: usize,
        q: usize,
        guard: Option<Guard>,
    ) -> String {
        let ty = crate::cuda::reg_type(self.dt[i]);
        let e = self.guarded(self.vector_lane(plan, input, q), i, guard);
        format!("const {ty} v{i} = {e};")
    }

    /// The line that sets lane `q` of full output `j`'s vector to `v` (a memory value).
    pub(super) fn vector_store_line(&self, plan: &Plan, j: usize, q: usize, v: &str) -> String {
        match plan.vector_width() {
            8 => format!("r{j}[{q}] = {v};"),
            _ => format!("r{j}.{} = {v};", COMPONENTS[q]),
        }
    }
}

/// `body` with `levels` more levels of indentation on each line (a lane inside the branches
/// of a masked loop).
fn indented(body: &str, levels: usize) -> String {
    if levels == 0 {
        return body.to_string();
    }
    let pad = "  ".repeat(levels);
    body.lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_string()
            } else {
                format!("{pad}{l}\n")
            }
        })
        .collect()
}

/// The element index `base + jb` (the vector loop's first element of the thread's vector).
fn at_jb(base: &str) -> String {
    match base {
        "0" => "jb".to_string(),
        base => format!("{base} + jb"),
    }
}

/// Lane `q` of the vector `l{input}` of `width` elements of `dtype`, as its bits in memory
/// (to be widened): eight bf16 are two to each 32-bit component of an `uint4`, the first in
/// its low half; eight bools four to each component of an `uint2`, the first in its lowest
/// byte; four elements a component each.
pub(super) fn lane_bits(width: usize, dtype: DType, input: usize, q: usize) -> String {
    match (width, dtype) {
        (8, DType::Bool) => format!(
            "(unsigned char)((l{input}.{} >> {}u) & 0xffu)",
            COMPONENTS[q / 4],
            8 * (q % 4)
        ),
        (8, _) if q.is_multiple_of(2) => {
            format!("(unsigned short)(l{input}.{} & 0xffffu)", COMPONENTS[q / 2])
        }
        (8, _) => format!("(unsigned short)(l{input}.{} >> 16)", COMPONENTS[q / 2]),
        _ => format!("l{input}.{}", COMPONENTS[q]),
    }
}

/// The CUDA type of a vector of `width` elements of `d` in memory: [`vec4_type`]'s, or
/// eight bf16 as an `uint4`, eight bools as an `uint2`.
pub(super) fn vector_type(d: DType, width: usize) -> &'static str {
    match (width, d) {
        (8, DType::Bool) => "uint2",
        (8, _) => "uint4",
        _ => vec4_type(d).unwrap_or("float4"),
    }
}
