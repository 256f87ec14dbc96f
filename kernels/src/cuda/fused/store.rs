//! The store stage of a reduction: writing the outputs, the row-level ones by one thread a row.

use super::layout::Layout;
use super::Analysis;
use crate::cuda::Src;

impl Analysis<'_> {
    /// The store stage of the row-level outputs: one thread of each row writes them at `row`
    /// (the row's first thread; with several rows a block, only rows that exist: `ok`).
    pub(super) fn store_rows(&self, src: &mut Src, lay: Layout) {
        let k = self.k;
        let row_stores: Vec<String> = k
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| self.row[o.value])
            .map(|(j, o)| format!("out{j}[row] = v{};", o.value))
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
