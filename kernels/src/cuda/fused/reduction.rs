//! The row and column strategies: [`Analysis::reduction`] strings the stages of a reduction
//! kernel together, in the order their text appears: strategy ([`Analysis::passes`],
//! [`Analysis::shape`]), index spaces ([`Analysis::spaces`]), the header and the fold's shared
//! memory, the loop nest over rows ([`Analysis::row_loop`]), the row's bases
//! ([`Analysis::row_addresses`]), guards and the register cache, then one loop over the row a
//! pass ([`Analysis::pass`]) with the row-level values each pass makes available
//! ([`Analysis::row_values`]), the output loop ([`Analysis::store_full`]), the row-level
//! stores, and the text stage.
//!
//! Each stage is its own function so that a change to one (say, how a pass is blocked) can be
//! read and tested without the others; the stages share only what [`Plan`] records.

use super::expr::{accumulate, identity, reduce_op};
use super::layout::Layout;
use super::loops::Elements;
use super::passes::{OnlineSum, Passes};
use super::plan::{Lane, Plan};
use super::text::text_without_unread_row;
use super::Analysis;
use crate::cuda::guard::{self, Guard};
use crate::cuda::{literal, reg_type, rounded, signature, CodegenError, Launch, Src};
use crate::fused::Inst;
use crate::{DType, ReduceOp};

impl Analysis<'_> {
    /// The kernel of the row or column strategy (see the module docs for the stage order).
    pub(super) fn reduction(&self) -> Result<(String, Launch), CodegenError> {
        let k = self.k;
        let row_outputs = k.outputs.iter().any(|o| self.row[o.value]);
        if self.rows == 0 || k.outputs.is_empty() || (self.n == 0 && !row_outputs) {
            return Ok(self.empty());
        }
        let p = self.passes();
        if let Some(cv) = self.column_vectors(&p) {
            return self.column_vector_kernel(&p, &cv);
        }
        let shape = self.shape(&p)?;
        let sp = self.spaces(&p);

        let mut src = Src::default();
        self.header(&mut src, &self.summary(&p), &shape.launch);
        src.open(signature(shape.threads, &self.params()));
        if shape.combine {
            self.declare_fold(&mut src, shape.lay, &p.reds);
        }
        let row_line = self.row_loop(&mut src, shape.lay, shape.units);
        let at = self.row_addresses(&mut src, &p, &sp);
        let el = Elements::new(self.ix, self.n, shape.lay, shape.cache);
        let mut cached = self.cached_loads(&p, shape.cache);
        let guards = self.loop_guards(&p, &cached);
        let final_guards = p.full_outputs.then(|| &guards[p.passes][..]);
        let prefetched =
            self.prefetched_loads(&p, shape.cache, &cached, final_guards, el.per_thread);
        for &i in &prefetched {
            cached[i] = true;
        }
        self.declare_cache(&mut src, &cached, &prefetched, el.per_thread);
        let online = match self.online_sums(&p) {
            o if !shape.cache && !el.blocks(&o.iter().map(|o| o.sum).collect::<Vec<_>>()) => o,
            _ => Vec::new(),
        };
        let mut plan = Plan {
            p,
            shape,
            sp,
            at,
            el,
            cached,
            prefetched,
            guards,
            online,
            vectors: None,
        };
        plan.vectors = self.row_vectors(&plan);
        if let (Some(v), true) = (&plan.vectors, plan.shape.cache) {
            plan.el.in_vectors(v.width);
        }

        let mut loaded = vec![false; k.body.len()];
        for s in 0..=plan.p.passes {
            if s > 0 {
                self.pass(&mut src, &plan, s, &mut loaded)?;
            }
            self.row_values(&mut src, &plan, s)?;
        }
        if plan.p.full_outputs {
            self.store_full(&mut src, &plan, &mut loaded)?;
        }
        self.store_rows(&mut src, shape.lay);
        if shape.combine && shape.loops && !matches!(shape.lay, Layout::Group { .. }) {
            src.line("__syncthreads(); // the next row reuses the shared memory");
        }
        src.close();
        src.close();
        Ok((text_without_unread_row(src.text, row_line), shape.launch))
    }

    /// The header's description of a reduction kernel: rows, row length, passes.
    fn summary(&self, p: &Passes) -> String {
        let (rows, n, passes) = (self.rows, self.n, p.passes);
        format!(
            "{rows} rows of {n} elements; {passes} reduction pass{}{}",
            if passes == 1 { "" } else { "es" },
            if p.full_outputs {
                ", then the outputs"
            } else {
                ""
            }
        )
    }

    /// Pass `p` over the row: each thread folds its elements' terms of the stage-`p`
    /// reductions into `a{r}` (float sums over long shares in blocks, see
    /// [`super::loops::THREAD_BLOCK`]), then the fold stage combines the threads' partials so
    /// that every thread of the row gets `v{r}`. With empty rows each reduction is its
    /// identity, and nothing loops.
    fn pass(
        &self,
        src: &mut Src,
        plan: &Plan,
        p: usize,
        loaded: &mut [bool],
    ) -> Result<(), CodegenError> {
        let k = self.k;
        let these: Vec<usize> = (plan.p.reds.iter().copied())
            .filter(|&r| self.stage[r] == p)
            .collect();
        let names: Vec<String> = these.iter().map(|r| format!("%{r}")).collect();
        src.line(format!("// pass {p}: {}", names.join(", ")));
        if self.n == 0 {
            for &r in these.iter().filter(|&&r| plan.p.needed[r]) {
                let (op, ty) = (reduce_op(&k.body[r]), self.dt[r]);
                src.line(format!(
                    "const {} v{r} = {};",
                    reg_type(ty),
                    identity(op, ty)
                ));
            }
            return Ok(());
        }
        let taken = |o: &&OnlineSum| these.contains(&o.sum);
        if plan.online.iter().any(|o| taken(&o)) {
            // Every sum of this pass was taken in the first: each thread's, relative to its
            // own running maximum `o{max}`, is brought to the row's maximum before they combine.
            // A row whose maximum is -inf sums exp(-inf - -inf): NaN, as the CPU's does.
            let (ninf, nan) = (
                literal(f64::NEG_INFINITY, DType::F32),
                literal(f64::NAN, DType::F32),
            );
            for o in &plan.online {
                let (s, m) = (o.sum, o.max);
                let rescale = self.f32_exp(&format!("o{m} - v{m}"));
                src.line(format!(
                    "if (v{m} == {ninf}) {{ a{s} = {nan}; }} \
                     else if (o{m} != v{m}) {{ a{s} = a{s} * {rescale}; }}"
                ));
            }
        } else {
            let feeds: Vec<&OnlineSum> = (plan.online.iter())
                .filter(|o| these.contains(&o.max))
                .collect();
            for &r in these.iter().chain(feeds.iter().map(|o| &o.sum)) {
                let (op, ty) = (reduce_op(&k.body[r]), self.dt[r]);
                src.line(format!("{} a{r} = {};", reg_type(ty), identity(op, ty)));
            }
            let float_sums: Vec<usize> = (these.iter().copied())
                .filter(|&r| reduce_op(&k.body[r]) == ReduceOp::Sum && self.dt[r].is_float())
                .collect();
            let blocked: &[usize] = if plan.el.blocks(&float_sums) {
                &float_sums
            } else {
                &[]
            };
            let insts = &plan.p.pass_full[p - 1];
            let vectors = self.loop_vectors(plan, insts, p - 1, loaded);
            let mask = self.loop_mask(plan, insts, p - 1);
            if blocked.is_empty() && (vectors.iter().any(|&v| v) || mask.is_some()) {
                let skips = self.vector_skips(plan, insts, p - 1, &vectors);
                let lanes = self.vector_lanes(plan, &vectors, mask, loaded, |lane, loaded| {
                    self.pass_body(src, plan, p, &these, blocked, loaded, Some(lane))
                })?;
                let (head, tail) = self.online_per_vector(plan, &these);
                let ends = (&head[..], &tail[..]);
                self.emit_vector_loop(src, plan, &vectors, &skips, false, &lanes, ends)?;
            } else {
                let body = self.pass_body(src, plan, p, &these, blocked, loaded, None)?;
                if blocked.is_empty() {
                    plan.el.emit(src, &body);
                } else {
                    self.emit_blocked_loop(src, &plan.el, blocked, &body);
                }
            }
            for o in feeds {
                // The thread's own running maximum, before the threads combine theirs.
                src.line(format!("const float o{m} = a{m};", m = o.max));
            }
        }
        self.fold(src, plan.shape.lay, &these);
        for &r in &these {
            // A bf16 reduction accumulates in f32 and rounds once, finished.
            let ty = self.dt[r];
            let v = rounded(ty, format!("a{r}"));
            src.line(format!("const {} v{r} = {v};", reg_type(ty)));
        }
        Ok(())
    }

    /// The body of pass `p`'s loop over the row: the reduce indices it needs, its full
    /// instructions, and each reduction's term folded into its accumulator (`s{r}`, the
    /// block's sum, for the `blocked` float sums; `a{r}` otherwise). With `lane`, the body of
    /// one lane of a loop a vector at a time ([`Analysis::emit_vector_loop`]).
    #[allow(clippy::too_many_arguments)]
    fn pass_body(
        &self,
        src: &Src,
        plan: &Plan,
        p: usize,
        these: &[usize],
        blocked: &[usize],
        loaded: &mut [bool],
        lane: Option<Lane>,
    ) -> Result<String, CodegenError> {
        let k = self.k;
        let mut b = match lane {
            Some(_) => Src {
                text: String::new(),
                depth: src.depth + 2,
            },
            None => plan.el.body(src, usize::from(!blocked.is_empty())),
        };
        let insts = &plan.p.pass_full[p - 1];
        self.loop_insts(
            &mut b,
            plan,
            insts,
            false,
            &plan.guards[p - 1],
            loaded,
            lane,
        )?;
        let ninf = literal(f64::NEG_INFINITY, DType::F32);
        for o in plan.online.iter().filter(|o| these.contains(&o.max)) {
            let (s, m, x) = (o.sum, o.max, o.x);
            if let Some(Lane { q: lane, .. }) = lane {
                // A vector at a time: its terms are taken together after its lanes
                // ([`Analysis::online_per_vector`]).
                b.line(format!("ox{s}[{lane}] = v{x};"));
                continue;
            }
            // Before the maximum takes the term: the sum so far is relative to the old one.
            let (rescale, term) = (
                self.f32_exp(&format!("a{m} - mn")),
                self.f32_exp(&format!("v{x} - mn")),
            );
            b.line(format!(
                "{{ const float mn = ig_keep_max(a{m}, v{x}); \
                 if (mn != a{m}) {{ a{s} = a{s} * {rescale}; }} \
                 a{s} = a{s} + (mn == {ninf} ? 0.0f : {term}); }}"
            ));
        }
        for &r in these {
            let Inst::Reduce { x, .. } = k.body[r] else {
                continue;
            };
            let acc = if blocked.contains(&r) {
                format!("s{r}")
            } else {
                format!("a{r}")
            };
            let term = accumulate(reduce_op(&k.body[r]), self.dt[r], &acc, &format!("v{x}"));
            b.line(format!("{acc} = {term};"));
        }
        Ok(b.text)
    }

    /// The online sums of a pass a vector at a time: before the lanes, each sum's old
    /// maximum (`om{s}`) and an array for the lanes' terms (`ox{s}`); after them (the maximum
    /// now has the vector's terms), the sum brought to the new maximum once and the lanes'
    /// exponentials added, instead of a rescale check and an exponential chained through every
    /// element.
    fn online_per_vector(&self, plan: &Plan, these: &[usize]) -> (Vec<String>, Vec<String>) {
        let ninf = literal(f64::NEG_INFINITY, DType::F32);
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        let width = plan.vector_width();
        for o in plan.online.iter().filter(|o| these.contains(&o.max)) {
            let (s, m) = (o.sum, o.max);
            head.push(format!("float ox{s}[{width}]; const float om{s} = a{m};"));
            // The lanes' exponentials added pairwise, a tree of independent sums.
            let mut terms: Vec<String> = (0..width)
                .map(|q| self.f32_exp(&format!("ox{s}[{q}] - a{m}")))
                .collect();
            while terms.len() > 1 {
                terms = terms
                    .chunks(2)
                    .map(|c| format!("({} + {})", c[0], c[1]))
                    .collect();
            }
            let rescale = self.f32_exp(&format!("om{s} - a{m}"));
            tail.push(format!(
                "if (a{m} != om{s}) {{ a{s} = a{s} * {rescale}; }} \
                 if (a{m} != {ninf}) {{ a{s} = a{s} + {}; }}",
                terms[0]
            ));
        }
        (head, tail)
    }

    /// Writes the start of one loop over the row's body: the reduce indices that `insts` (and,
    /// with `outputs`, the full outputs' addresses) need, then `insts` in guard order (a
    /// guard's condition before the loads it guards). With `lane` (its index, and how the loop
    /// reads each input), a load of an input read as vectors takes its lane of the vector
    /// (where its guard holds, if it has one), unless the register cache already holds it.
    /// A lane that knows a condition's value ([`Lane::known`]) takes it as a constant, and
    /// every load that condition's value keeps out is its guarded 0, read from nowhere.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn loop_insts(
        &self,
        b: &mut Src,
        plan: &Plan,
        insts: &[usize],
        outputs: bool,
        g: &[Option<Guard>],
        loaded: &mut [bool],
        lane: Option<Lane>,
    ) -> Result<(), CodegenError> {
        let need = self.loop_need(&plan.sp, insts, outputs, &plan.cached, loaded);
        plan.sp.red.decompose(b, "j", self.ix, &need);
        let any_axis = |d: usize| plan.sp.any_axis(d);
        let known = lane.and_then(|l| l.known);
        for i in guard::order(&self.k.body, &self.row, insts, g) {
            if let Some((c, value)) = known {
                if i == c {
                    b.line(format!("const unsigned char v{c} = {}u;", u8::from(value)));
                    continue;
                }
                let kept_out = |g: &Guard| g.literals().iter().any(|&(x, w)| x == c && w != value);
                if matches!(self.k.body[i], Inst::Load { .. }) && g[i].is_some_and(|g| kept_out(&g))
                {
                    let (ty, zero) = (reg_type(self.dt[i]), literal(0.0, self.dt[i]));
                    b.line(format!("const {ty} v{i} = {zero};"));
                    if plan.cached[i] && !loaded[i] {
                        b.line(format!("c{i}[u] = v{i};"));
                        loaded[i] = true;
                    }
                    continue;
                }
            }
            if let (
                Some(Lane {
                    q: lane, vectors, ..
                }),
                Inst::Load { input },
            ) = (lane, &self.k.body[i])
            {
                if vectors[*input] && !(plan.cached[i] && loaded[i]) {
                    b.line(self.vector_load_line(plan, i, *input, lane, g[i]));
                    if plan.cached[i] {
                        b.line(format!("c{i}[u] = v{i};"));
                        loaded[i] = true;
                    }
                    continue;
                }
            }
            let at = (&plan.at.full[..], &any_axis as &dyn Fn(usize) -> String);
            self.emit_full(b, i, at, g[i], &plan.cached, loaded)?;
        }
        Ok(())
    }

    /// The row-level values of stage `s` (computed once a row, in every thread of the row,
    /// after the reductions of stage `s` are complete), read at the row's bases.
    fn row_values(&self, src: &mut Src, plan: &Plan, s: usize) -> Result<(), CodegenError> {
        let row_axis = |d: usize| plan.sp.row_axis(d);
        for (i, inst) in self.k.body.iter().enumerate() {
            if plan.p.needed[i] && self.stage[i] == s && !matches!(inst, Inst::Reduce { .. }) {
                let e = self.expr(i, &plan.at.row, &row_axis)?;
                src.line(format!("const {} v{i} = {e};", reg_type(self.dt[i])));
            }
        }
        Ok(())
    }
}
