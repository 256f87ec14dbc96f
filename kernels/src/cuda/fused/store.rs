//! The store stage of a reduction: the final loop over the row that computes and writes the
//! per-element outputs, and the row-level outputs, written by one thread a row.

use super::layout::Layout;
use super::plan::Plan;
use super::space::join;
use super::Analysis;
use crate::cuda::{narrowed, CodegenError, Src};

impl Analysis<'_> {
    /// The output loop: after the last pass, every thread computes the full outputs at its
    /// elements of the row and writes them there (columns and groups: only on rows that exist,
    /// `ok`). Each thread reads and writes only its own elements.
    pub(super) fn store_full(
        &self,
        src: &mut Src,
        plan: &Plan,
        loaded: &mut [bool],
    ) -> Result<(), CodegenError> {
        let (k, ix, lay) = (self.k, self.ix, plan.shape.lay);
        if let (Layout::Group { .. }, true) = (lay, plan.shape.combine) {
            // The shuffles ended the passes; this orders their reads before the writes.
            src.line("__syncwarp();");
        }
        let (insts, g) = (&plan.p.final_full, &plan.guards[plan.p.passes]);
        if !plan.prefetched.is_empty() {
            src.line("// the final loop's loads, all read before its first store");
            let mut b = plan.el.body(src, 0);
            self.loop_insts(&mut b, plan, &plan.prefetched, false, g, loaded, None)?;
            plan.el.emit(src, &b.text);
        }
        src.line("// the full outputs");
        let (sp, base) = (&plan.sp, plan.at.out_base.clone());
        let out_addr = join(base, sp.red.part(sp.out_vec, "j", ix), ix);
        let vectors = self.loop_vectors(plan, insts, plan.p.passes, loaded);
        let vector_outputs = plan.vectors.as_ref().is_some_and(|v| v.outputs);
        let mask = self.loop_mask(plan, insts, plan.p.passes);
        if vectors.iter().any(|&v| v) || vector_outputs || mask.is_some() {
            // Four elements at a time: each lane's outputs into its lane of `r{j}`, or stored
            // one by one where the outputs are not vectors.
            let skips = self.vector_skips(plan, insts, plan.p.passes, &vectors);
            let lanes = self.vector_lanes(plan, &vectors, mask, loaded, |l, loaded| {
                let lane = l.q;
                let mut b = Src {
                    text: String::new(),
                    depth: src.depth + 2,
                };
                self.loop_insts(&mut b, plan, insts, true, g, loaded, Some(l))?;
                for (j, o) in k.outputs.iter().enumerate() {
                    if !self.row[o.value] {
                        let v = narrowed(k.output_dtype(j), format!("v{}", o.value));
                        if vector_outputs {
                            b.line(self.vector_store_line(plan, j, lane, &v));
                        } else if matches!(lay, Layout::Group { .. }) {
                            b.line(format!("if (ok) {{ out{j}[{out_addr}] = {v}; }}"));
                        } else {
                            b.line(format!("out{j}[{out_addr}] = {v};"));
                        }
                    }
                }
                Ok(b.text)
            })?;
            let ends = (&[][..], &[][..]);
            self.emit_vector_loop(src, plan, &vectors, &skips, vector_outputs, &lanes, ends)?;
            return Ok(());
        }
        let mut b = plan.el.body(src, 0);
        self.loop_insts(&mut b, plan, insts, true, g, loaded, None)?;
        for (j, o) in k.outputs.iter().enumerate() {
            if !self.row[o.value] {
                let v = narrowed(k.output_dtype(j), format!("v{}", o.value));
                if !matches!(lay, Layout::Block { .. }) {
                    b.line(format!("if (ok) {{ out{j}[{out_addr}] = {v}; }}"));
                } else {
                    b.line(format!("out{j}[{out_addr}] = {v};"));
                }
            }
        }
        plan.el.emit(src, &b.text);
        Ok(())
    }

    /// The store stage of the row-level outputs: one thread of each row writes them at `row`
    /// (the row's first thread; with several rows a block, only rows that exist: `ok`).
    pub(super) fn store_rows(&self, src: &mut Src, lay: Layout) {
        let k = self.k;
        let row_stores: Vec<String> = k
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| self.row[o.value])
            .map(|(j, o)| {
                let v = narrowed(k.output_dtype(j), format!("v{}", o.value));
                format!("out{j}[row] = {v};")
            })
            .collect();
        if !row_stores.is_empty() {
            let cond = match lay {
                Layout::Columns { .. } => "ok && threadIdx.y == 0u",
                Layout::Group { .. } => "ok && lane == 0u",
                Layout::Block { .. } => "threadIdx.x == 0u",
            };
            src.line(format!("if ({cond}) {{ {} }}", row_stores.join(" ")));
        }
    }
}
