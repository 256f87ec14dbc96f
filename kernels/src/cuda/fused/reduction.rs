//! The row and column strategies: [`Analysis::reduction`] strings the stages of a reduction
//! kernel together, in the order their text appears.

use super::expr::{accumulate, identity, reduce_op};
use super::layout::{Layout, MAX_SHARED};
use super::loops::THREAD_BLOCK;
use super::passes::Passes;
use super::space::{join, Space};
use super::text::{mentions, text_without_unread_row};
use super::{analysis::body_len, Analysis};
use crate::cuda::guard::{self, Guard, Need};
use crate::cuda::{c_type, grid_for, signature, CodegenError, Launch, Src, MAX_GRID_ROWS};
use crate::fused::{Access, Inst};
use crate::ReduceOp;

impl Analysis<'_> {
    pub(super) fn reduction(&self) -> Result<(String, Launch), CodegenError> {
        let k = self.k;
        let row_outputs = k.outputs.iter().any(|o| self.row[o.value]);
        if self.rows == 0 || k.outputs.is_empty() || (self.n == 0 && !row_outputs) {
            return Ok(self.empty());
        }
        let ix = self.ix;
        let rank = k.domain.len();
        let (n, rows) = (self.n, self.rows);
        let nb = body_len(k);

        let Passes {
            reds,
            passes,
            full_outputs,
            pass_full,
            final_full,
            emitted_full,
            needed,
            loop_uses,
        } = self.passes();

        // Launch shape, and whether the loads several loops read are kept in registers.
        let (lay, cache) = self.layout(reds.len(), &loop_uses);
        let (bx, by) = match lay {
            Layout::Columns { x, y } => (x, y),
            Layout::Group { w, g } => (w * g, 1),
            Layout::Block { t } => (t, 1),
        };
        let threads = bx * by;
        // Rows a block takes at a time.
        let per_block = match lay {
            Layout::Columns { x, .. } => x as usize,
            Layout::Group { g, .. } => g as usize,
            Layout::Block { .. } => 1,
        };
        let units = rows.div_ceil(per_block);
        let grid = grid_for(units, 1, MAX_GRID_ROWS);
        let launch = Launch {
            grid: [grid, 1, 1],
            block: [bx, by, 1],
            shared_bytes: 0,
        };
        let loops = units > grid as usize;
        let combine = n > 0 && passes > 0;
        let mut shared = 0usize;
        for &r in &reds {
            let per = match lay {
                Layout::Columns { x, y } => (x * y) as usize,
                Layout::Block { t } => (t / 32) as usize,
                Layout::Group { .. } => 0,
            };
            shared += per * self.dt[r].size();
        }
        if combine && shared > MAX_SHARED {
            return Err(CodegenError::SharedMemory {
                bytes: shared,
                reductions: reds.len(),
            });
        }

        // Index spaces: the row axes (indexed by `row`) and the reduce axes (by `j`).
        let row_axes: Vec<usize> = (0..rank).filter(|&d| !self.red_axis[d]).collect();
        let red_axes: Vec<usize> = k.reduce_axes.clone();
        let used = self.loaded_inputs(|i| needed[i] || emitted_full[i]);
        let full_used = self.loaded_inputs(|i| emitted_full[i]);
        let mut vectors = Vec::new();
        let mut vec_of = vec![usize::MAX; k.inputs.len()];
        for (m, inp) in k.inputs.iter().enumerate() {
            if used[m] {
                vec_of[m] = vectors.len();
                vectors.push(inp.access.strides.clone());
            }
        }
        let out_vec = vectors.len();
        vectors.push(Access::contiguous(&k.domain).strides);
        let row_space = Space::new(&row_axes, &k.domain, &vectors, &self.pinned);
        // Along the reduce axes only full loads and full outputs have nonzero strides; the
        // others are 0 there and merge with anything.
        let red_space = Space::new(&red_axes, &k.domain, &vectors, &self.pinned);

        let mut src = Src::default();
        let what = format!(
            "{rows} rows of {n} elements; {passes} reduction pass{}{}",
            if passes == 1 { "" } else { "es" },
            if full_outputs {
                ", then the outputs"
            } else {
                ""
            }
        );
        self.header(&mut src, &what, &launch);
        src.open(signature(threads, &self.params()));
        let t = ix.ty();
        if combine {
            for &r in &reds {
                let ty = c_type(self.dt[r]);
                match lay {
                    Layout::Columns { x, y } => {
                        src.line(format!("__shared__ {ty} sm{r}[{y}][{x}];"))
                    }
                    Layout::Block { t } => src.line(format!("__shared__ {ty} sm{r}[{}];", t / 32)),
                    Layout::Group { .. } => {}
                }
            }
            if let Layout::Block { .. } = lay {
                src.line("const unsigned lane = threadIdx.x & 31u;");
                src.line("const unsigned warp = threadIdx.x >> 5;");
            }
        }
        let row_line = self.row_loop(&mut src, lay, units);

        // Per row: the row indices, each input's row base, the row-level values of stage 0.
        let mut need = vec![false; row_space.groups.len()];
        for (m, &u) in used.iter().enumerate() {
            if u {
                row_space.need(vec_of[m], &mut need);
            }
        }
        if full_outputs {
            row_space.need(out_vec, &mut need);
        }
        for (inst, _) in k.body.iter().zip(&needed).filter(|(_, &n)| n) {
            if let Inst::Index { axis, .. } = *inst {
                row_space.need_axis(axis, &mut need);
            }
        }
        row_space.decompose(&mut src, "row", ix, &need);
        let mut base: Vec<Option<String>> = vec![None; k.inputs.len()];
        for (m, &u) in used.iter().enumerate() {
            if !u {
                continue;
            }
            let off = k.inputs[m].access.offset;
            base[m] = match row_space.part(vec_of[m], "row", ix) {
                Some(p) => {
                    let e = join((off != 0).then(|| ix.lit(off)), Some(p), ix);
                    src.line(format!("const {t} b{m} = {e};"));
                    Some(format!("b{m}"))
                }
                None => (off != 0).then(|| ix.lit(off)),
            };
        }
        let out_base = if full_outputs {
            row_space.part(out_vec, "row", ix).map(|p| {
                src.line(format!("const {t} bo = {p};"));
                "bo".to_string()
            })
        } else {
            None
        };
        // Row-level values read loads at their row base only.
        let row_addr: Vec<String> = (0..k.inputs.len())
            .map(|m| join(base[m].clone(), None, ix))
            .collect();
        let full_addr: Vec<String> = (0..k.inputs.len())
            .map(|m| {
                if full_used[m] {
                    join(base[m].clone(), red_space.part(vec_of[m], "j", ix), ix)
                } else {
                    row_addr[m].clone()
                }
            })
            .collect();
        let row_axis = |d: usize| row_space.axis_var(d, ix);
        let any_axis = |d: usize| {
            if self.red_axis[d] {
                red_space.axis_var(d, ix)
            } else {
                row_space.axis_var(d, ix)
            }
        };
        let (start, step) = match lay {
            Layout::Columns { y, .. } => ("threadIdx.y", y),
            Layout::Group { w, .. } => ("lane", w),
            Layout::Block { t } => ("threadIdx.x", t),
        };
        let loop_head = format!(
            "for ({t} j = {start}; j < {n}; j += {step}) {{",
            n = ix.lit(n),
            step = ix.lit(step as usize)
        );
        // Loads that several loops over the row read are kept in registers (see `layout`): the
        // first loop that reads one stores it in `c{i}[u]`, later loops read it there. The loops
        // are then unrolled, `u` counting the thread's elements, so that every index into
        // `c{i}` is a compile-time constant and the arrays live in registers.
        let per_thread = n.div_ceil(step as usize);
        let cached: Vec<usize> = if cache {
            (0..nb).filter(|&i| loop_uses[i] >= 2).collect()
        } else {
            Vec::new()
        };
        let mut is_cached = vec![false; nb];
        for &i in &cached {
            is_cached[i] = true;
        }
        // Guarded loads, per loop (passes first, then the outputs): where each full value is
        // needed. A cached load is read once for all the loops, so its guard covers them all.
        let mut loop_sets: Vec<(&[usize], Vec<usize>)> = (1..=passes)
            .map(|p| {
                let roots = reds
                    .iter()
                    .filter(|&&r| self.stage[r] == p)
                    .filter_map(|&r| match k.body[r] {
                        Inst::Reduce { x, .. } => Some(x),
                        _ => None,
                    })
                    .collect();
                (&pass_full[p - 1][..], roots)
            })
            .collect();
        if full_outputs {
            let roots = k.outputs.iter().map(|o| o.value).collect();
            loop_sets.push((&final_full[..], roots));
        }
        let mut needs: Vec<Vec<Need>> = loop_sets
            .iter()
            .map(|(insts, roots)| guard::demand(&k.body, &self.row, insts, roots))
            .collect();
        for &i in &cached {
            let all = needs.iter().fold(Need::Never, |a, nd| a.join(nd[i]));
            for nd in &mut needs {
                if nd[i] != Need::Never {
                    nd[i] = all;
                }
            }
        }
        let guards: Vec<Vec<Option<Guard>>> = loop_sets
            .iter()
            .zip(&needs)
            .map(|((insts, _), nd)| {
                if self.tuning.unguarded_loads {
                    vec![None; nb]
                } else {
                    guard::guards(&k.body, &self.row, insts, nd)
                }
            })
            .collect();
        let mut loaded = vec![false; nb];
        let ragged = cache && n % step as usize != 0;
        // The loop over the thread's elements of the row around `body` (written one level
        // deeper, two with the check for a ragged row).
        let body_depth = |src: &Src| src.depth + 1 + usize::from(ragged);
        let emit_loop = |src: &mut Src, body: &str| {
            if cache {
                src.line("#pragma unroll");
                src.open(format!("for (unsigned u = 0u; u < {per_thread}u; ++u) {{"));
                if ragged || mentions(body, "j") {
                    src.line(format!(
                        "const {t} j = {start} + u * {};",
                        ix.lit(step as usize)
                    ));
                }
                if ragged {
                    src.open(format!("if (j < {}) {{", ix.lit(n)));
                }
            } else {
                src.open(&loop_head);
            }
            src.text.push_str(body);
            if ragged {
                src.close();
            }
            src.close();
        };
        if cache {
            for &i in &cached {
                src.line(format!(
                    "{} c{i}[{per_thread}]; // %{i}, kept for the later passes",
                    c_type(self.dt[i])
                ));
            }
        }
        // The reduce indices the instructions of a loop need.
        let loop_need = |insts: &[usize], outputs: bool, loaded: &[bool]| {
            let mut need = vec![false; red_space.groups.len()];
            for &i in insts {
                match self.k.body[i] {
                    // A cached load read in an earlier loop needs no index.
                    Inst::Load { .. } if is_cached[i] && loaded[i] => {}
                    Inst::Load { input } if full_used[input] => {
                        red_space.need(vec_of[input], &mut need)
                    }
                    Inst::Index { axis, .. } if self.red_axis[axis] => {
                        red_space.need_axis(axis, &mut need)
                    }
                    _ => {}
                }
            }
            if outputs {
                red_space.need(out_vec, &mut need);
            }
            need
        };

        for s in 0..=passes {
            if s > 0 {
                let p = s;
                let these: Vec<usize> = reds
                    .iter()
                    .copied()
                    .filter(|&r| self.stage[r] == p)
                    .collect();
                let names: Vec<String> = these.iter().map(|r| format!("%{r}")).collect();
                src.line(format!("// pass {p}: {}", names.join(", ")));
                if n == 0 {
                    for &r in these.iter().filter(|&&r| needed[r]) {
                        let (op, ty) = (reduce_op(&k.body[r]), self.dt[r]);
                        src.line(format!("const {} v{r} = {};", c_type(ty), identity(op, ty)));
                    }
                } else {
                    for &r in &these {
                        let (op, ty) = (reduce_op(&k.body[r]), self.dt[r]);
                        src.line(format!("{} a{r} = {};", c_type(ty), identity(op, ty)));
                    }
                    // Float sums over more than THREAD_BLOCK terms a thread are blocked.
                    let blocked_sums: Vec<usize> = these
                        .iter()
                        .copied()
                        .filter(|&r| {
                            reduce_op(&k.body[r]) == ReduceOp::Sum && self.dt[r].is_float()
                        })
                        .collect();
                    let blocked = !cache
                        && !blocked_sums.is_empty()
                        && n.div_ceil(step as usize) > THREAD_BLOCK;
                    let mut b = Src {
                        text: String::new(),
                        depth: body_depth(&src) + usize::from(blocked),
                    };
                    let insts = &pass_full[p - 1];
                    red_space.decompose(&mut b, "j", ix, &loop_need(insts, false, &loaded));
                    let g = &guards[p - 1];
                    for i in guard::order(&k.body, &self.row, insts, g) {
                        let at = (&full_addr[..], &any_axis as &dyn Fn(usize) -> String);
                        self.emit_full(&mut b, i, at, g[i], &is_cached, &mut loaded)?;
                    }
                    for &r in &these {
                        let Inst::Reduce { x, .. } = k.body[r] else {
                            continue;
                        };
                        let acc = if blocked && blocked_sums.contains(&r) {
                            format!("s{r}")
                        } else {
                            format!("a{r}")
                        };
                        b.line(format!(
                            "{acc} = {};",
                            accumulate(reduce_op(&k.body[r]), self.dt[r], &acc, &format!("v{x}"))
                        ));
                    }
                    if blocked {
                        self.emit_blocked_loop(&mut src, &blocked_sums, n, start, step, &b.text);
                    } else {
                        emit_loop(&mut src, &b.text);
                    }
                    self.fold(&mut src, lay, &these);
                    for &r in &these {
                        src.line(format!("const {} v{r} = a{r};", c_type(self.dt[r])));
                    }
                }
            }
            // Row-level values of this stage.
            for (i, inst) in k.body.iter().enumerate() {
                if needed[i] && self.stage[i] == s && !matches!(inst, Inst::Reduce { .. }) {
                    let e = self.expr(i, &row_addr, &row_axis)?;
                    src.line(format!("const {} v{i} = {e};", c_type(self.dt[i])));
                }
            }
        }

        if full_outputs {
            if let (Layout::Group { .. }, true) = (lay, combine) {
                // The shuffles ended the passes; this orders their reads before the writes.
                src.line("__syncwarp();");
            }
            src.line("// the full outputs");
            let mut b = Src {
                text: String::new(),
                depth: body_depth(&src),
            };
            red_space.decompose(&mut b, "j", ix, &loop_need(&final_full, true, &loaded));
            let g = &guards[passes];
            for i in guard::order(&k.body, &self.row, &final_full, g) {
                let at = (&full_addr[..], &any_axis as &dyn Fn(usize) -> String);
                self.emit_full(&mut b, i, at, g[i], &is_cached, &mut loaded)?;
            }
            let out_addr = join(out_base.clone(), red_space.part(out_vec, "j", ix), ix);
            for (j, o) in k.outputs.iter().enumerate() {
                if !self.row[o.value] {
                    if !matches!(lay, Layout::Block { .. }) {
                        b.line(format!("if (ok) {{ out{j}[{out_addr}] = v{}; }}", o.value));
                    } else {
                        b.line(format!("out{j}[{out_addr}] = v{};", o.value));
                    }
                }
            }
            emit_loop(&mut src, &b.text);
        }
        self.store_rows(&mut src, lay);
        if combine && loops && !matches!(lay, Layout::Group { .. }) {
            src.line("__syncthreads(); // the next row reuses the shared memory");
        }
        src.close();
        src.close();
        Ok((text_without_unread_row(src.text, row_line), launch))
    }
}
