//! The loop-nest stage of a reduction: the loop over the rows a block takes, and the loops over
//! a thread's elements of a row (plain, unrolled for the register cache, or blocked for long
//! float sums). Kept apart so that the loops' shape, which decides which variables exist
//! (`row`, `ok`, `j`, `u`), is written in one place.

use super::layout::Layout;
use super::text::mentions;
use super::Analysis;
use crate::cuda::{literal, reg_type, Ix, Src};

/// The most terms a thread adds one after another into one float sum: a thread whose share of
/// a row is longer sums it in blocks of this many terms, adds each block's sum into a second
/// accumulator, and that one into the thread's total every this many blocks (a cascade, as the
/// CPU's; see [`crate::cpu::reduce`](mod@crate::cpu::reduce)), so that f32 sums stay accurate
/// at any length. Threads with at most this many terms (every reduction of the reference
/// models) keep the plain loop.
pub(crate) const THREAD_BLOCK: usize = 1024;

impl Analysis<'_> {
    /// The loop-nest stage of a reduction: opens the grid-stride loop over rows (blocks: one
    /// row a block) or over units of rows (columns and groups: several rows a block, each
    /// thread's row clamped to the last so that every thread reaches the block's barriers;
    /// `ok` says whether it is real). Returns where the line defining `row` from the clamped
    /// slot starts, so the text stage can drop it when nothing reads `row`.
    pub(super) fn row_loop(&self, src: &mut Src, lay: Layout, units: usize) -> Option<usize> {
        let (ix, rows) = (self.ix, self.rows);
        let t = ix.ty();
        let mut row_line = None;
        match lay {
            Layout::Block { .. } => {
                src.open(format!(
                    "for ({t} row = blockIdx.x; row < {rows}; row += gridDim.x) {{",
                    rows = ix.lit(rows)
                ));
            }
            Layout::Columns { x, .. } | Layout::Group { g: x, .. } => {
                if let Layout::Group { w, .. } = lay {
                    src.line(format!("const unsigned lane = threadIdx.x & {}u;", w - 1));
                }
                src.open(format!(
                    "for ({t} rb = blockIdx.x; rb < {units}; rb += gridDim.x) {{",
                    units = ix.lit(units)
                ));
                let slot = match lay {
                    Layout::Group { w, .. } => format!("threadIdx.x / {w}u"),
                    _ => "threadIdx.x".to_string(),
                };
                src.line(format!(
                    "const {t} rr = rb * {} + {slot};",
                    ix.lit(x as usize)
                ));
                src.line(format!("const bool ok = rr < {};", ix.lit(rows)));
                row_line = Some(src.text.len());
                src.line(format!("const {t} row = ok ? rr : {};", ix.lit(rows - 1)));
            }
        }
        row_line
    }

    /// The loop over a thread's elements of the row with its float sums `sums` blocked (see
    /// [`THREAD_BLOCK`]): `body` adds each term into `s{r}`, the block's sum, which goes into
    /// `m{r}` at the end of the block; every THREAD_BLOCK blocks `m{r}` goes into `a{r}`.
    /// (`el`: the loop it replaces.)
    pub(super) fn emit_blocked_loop(
        &self,
        src: &mut Src,
        el: &Elements,
        sums: &[usize],
        body: &str,
    ) {
        let (ix, t) = (self.ix, self.ix.ty());
        let (n, start, step) = (el.n, el.start, el.step);
        let span = (step as usize).saturating_mul(THREAD_BLOCK);
        src.line(format!(
            "// float sums in blocks of {THREAD_BLOCK} terms a thread, cascaded (accurate at any length)"
        ));
        for &r in sums {
            let ty = self.dt[r];
            src.line(format!("{} m{r} = {};", reg_type(ty), literal(0.0, ty)));
        }
        // The block counter is named for the loop's first sum: a kernel of several passes
        // has one blocked loop a pass, all in one scope (a LayerNorm over rows of millions:
        // the mean's loop, then the variance's).
        let nb = format!("nb{}", sums.first().copied().unwrap_or(0));
        src.line(format!("unsigned {nb} = 0u;"));
        src.open(format!(
            "for ({t} jb = {start}; jb < {n}; jb += {span}) {{",
            n = ix.lit(n),
            span = ix.lit(span)
        ));
        src.line(format!(
            "const {t} je = {n} - jb > {span} ? jb + {span} : {n};",
            n = ix.lit(n),
            span = ix.lit(span)
        ));
        for &r in sums {
            let ty = self.dt[r];
            src.line(format!("{} s{r} = {};", reg_type(ty), literal(0.0, ty)));
        }
        src.open(format!(
            "for ({t} j = jb; j < je; j += {}) {{",
            ix.lit(step as usize)
        ));
        src.text.push_str(body);
        src.close();
        let flush: Vec<String> = sums
            .iter()
            .map(|r| format!("m{r} = m{r} + s{r};"))
            .collect();
        src.line(flush.join(" "));
        let up: Vec<String> = sums
            .iter()
            .map(|&r| format!("a{r} = a{r} + m{r}; m{r} = {};", literal(0.0, self.dt[r])))
            .collect();
        src.line(format!(
            "if (++{nb} == {THREAD_BLOCK}u) {{ {} {nb} = 0u; }}",
            up.join(" ")
        ));
        src.close();
        let last: Vec<String> = sums
            .iter()
            .map(|r| format!("a{r} = a{r} + m{r};"))
            .collect();
        src.line(last.join(" "));
    }
}

/// The loop over a thread's elements of a row (the reduce index `j`), as the layout strides it:
/// plain (`j` from the thread's first element in steps of the threads along the row), or, with
/// the register cache, unrolled over the thread's `per_thread` elements (`u`), so that every
/// index into a cached array is a compile-time constant and the arrays live in registers.
/// With the register cache a vector at a time ([`Elements::vector`] above 1), a thread's
/// elements are runs of `vector` consecutive ones, a run every `vector` times the threads:
/// element `u` is `j = vector·thread + (u / vector)·(vector·threads) + u % vector`, in every
/// loop of the kernel, so that a value cached at `u` by a loop a vector at a time is the same
/// element a plain unrolled loop reads there.
pub(super) struct Elements {
    ix: Ix,
    /// Elements a row.
    pub(super) n: usize,
    /// The thread's first element, and the distance between its elements.
    pub(super) start: &'static str,
    pub(super) step: u32,
    cache: bool,
    /// Elements a thread (the last one past the row's end for some threads when `ragged`).
    pub(super) per_thread: usize,
    /// Unrolled, and the row is not a multiple of the step: each element is checked.
    ragged: bool,
    /// Consecutive elements a thread takes together with the register cache (1: one at a
    /// time); set by [`Elements::in_vectors`].
    pub(super) vector: usize,
}

impl Elements {
    pub(super) fn new(ix: Ix, n: usize, lay: Layout, cache: bool) -> Elements {
        let (start, step) = match lay {
            Layout::Columns { y, .. } => ("threadIdx.y", y),
            Layout::Group { w, .. } => ("lane", w),
            Layout::Block { t } => ("threadIdx.x", t),
        };
        Elements {
            ix,
            n,
            start,
            step,
            cache,
            per_thread: n.div_ceil(step as usize),
            ragged: cache && !n.is_multiple_of(step as usize),
            vector: 1,
        }
    }

    /// The same loops with the register cache taking `width` consecutive elements a thread at
    /// a time; only where every thread has a whole number of such runs (no ragged row).
    pub(super) fn in_vectors(&mut self, width: usize) {
        if self.cache && !self.ragged && self.per_thread.is_multiple_of(width) {
            self.vector = width;
        }
    }

    /// Whether the float sums `sums` of a pass are added in blocks of [`THREAD_BLOCK`] terms:
    /// a thread has more terms than that (never in the unrolled loop, whose threads have few).
    pub(super) fn blocks(&self, sums: &[usize]) -> bool {
        !self.cache && !sums.is_empty() && self.per_thread > THREAD_BLOCK
    }

    /// An empty text to write a loop body into, indented for the loop [`Elements::emit`] opens
    /// at `src` (one level deeper, two with the check for a ragged row), plus `extra` levels.
    pub(super) fn body(&self, src: &Src, extra: usize) -> Src {
        Src {
            text: String::new(),
            depth: src.depth + 1 + usize::from(self.ragged) + extra,
        }
    }

    /// Writes the loop around `body` (written by [`Elements::body`]); the unrolled loop defines
    /// `j` only where the body or the ragged check reads it.
    pub(super) fn emit(&self, src: &mut Src, body: &str) {
        let (ix, t) = (self.ix, self.ix.ty());
        let step = ix.lit(self.step as usize);
        if self.cache {
            src.line("#pragma unroll");
            src.open(format!(
                "for (unsigned u = 0u; u < {}u; ++u) {{",
                self.per_thread
            ));
            if self.vector > 1 && mentions(body, "j") {
                let w = self.vector;
                src.line(format!(
                    "const {t} j = {} * {} + (u / {w}u) * {} + u % {w}u;",
                    ix.lit(w),
                    self.start,
                    ix.lit(w * self.step as usize)
                ));
            } else if self.ragged || mentions(body, "j") {
                src.line(format!("const {t} j = {} + u * {step};", self.start));
            }
            if self.ragged {
                src.open(format!("if (j < {}) {{", ix.lit(self.n)));
            }
        } else {
            src.open(format!(
                "for ({t} j = {}; j < {}; j += {step}) {{",
                self.start,
                ix.lit(self.n)
            ));
        }
        src.text.push_str(body);
        if self.ragged {
            src.close();
        }
        src.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NARROW: Ix = Ix { wide: false };
    const LANES: Layout = Layout::Group { w: 32, g: 8 };

    /// The loop `el` writes around a one-line body.
    fn written(el: &Elements, line: &str) -> String {
        let mut src = Src::default();
        let mut body = el.body(&src, 0);
        body.line(line);
        el.emit(&mut src, &body.text);
        src.text
    }

    #[test]
    fn an_unrolled_loop_over_a_ragged_row_checks_each_element() {
        // 100 elements over 32 lanes: 4 a thread, the fourth past the row's end for most.
        let el = Elements::new(NARROW, 100, LANES, true);
        assert_eq!(el.per_thread, 4);
        assert_eq!(
            written(&el, "a1 = a1 + v0;"),
            "#pragma unroll\nfor (unsigned u = 0u; u < 4u; ++u) {\n  \
             const unsigned j = lane + u * 32u;\n  if (j < 100u) {\n    a1 = a1 + v0;\n  }\n}\n"
        );
    }

    #[test]
    fn an_unrolled_loop_defines_j_only_where_its_body_reads_it() {
        let el = Elements::new(NARROW, 64, LANES, true);
        assert_eq!(
            written(&el, "a1 = a1 + c0[u];"),
            "#pragma unroll\nfor (unsigned u = 0u; u < 2u; ++u) {\n  a1 = a1 + c0[u];\n}\n"
        );
        assert!(written(&el, "const float v0 = in0[b0 + j];").contains("const unsigned j = "));
    }

    #[test]
    fn the_plain_loop_strides_by_the_threads_along_the_row() {
        let el = Elements::new(NARROW, 5000, Layout::Block { t: 256 }, false);
        assert_eq!(
            written(&el, "a1 = a1 + v0;"),
            "for (unsigned j = threadIdx.x; j < 5000u; j += 256u) {\n  a1 = a1 + v0;\n}\n"
        );
    }

    #[test]
    fn float_sums_are_blocked_only_past_thread_block_terms_a_thread_and_never_unrolled() {
        let long = 32 * THREAD_BLOCK + 1;
        assert!(Elements::new(NARROW, long, LANES, false).blocks(&[3]));
        assert!(!Elements::new(NARROW, long, LANES, false).blocks(&[]));
        assert!(!Elements::new(NARROW, long - 1, LANES, false).blocks(&[3]));
        assert!(!Elements::new(NARROW, long, LANES, true).blocks(&[3]));
    }
}
