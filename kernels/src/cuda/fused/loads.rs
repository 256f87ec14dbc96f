//! The loads stage of a reduction: where each load reads (the index spaces of the row and
//! reduce axes, each input's base at the row) and the register cache of the loads several
//! loops read.

use super::Analysis;
use crate::cuda::guard::Guard;
use crate::cuda::{c_type, CodegenError, Src};

impl Analysis<'_> {
    /// Writes full instruction `i` inside a loop over the row (`at`: the input addresses and
    /// the axis indices there): a cached load is read from memory (and kept) the first time,
    /// from its registers after that; a guarded load only where its guard holds.
    pub(super) fn emit_full(
        &self,
        src: &mut Src,
        i: usize,
        at: (&[String], &dyn Fn(usize) -> String),
        guard: Option<Guard>,
        cached: &[bool],
        loaded: &mut [bool],
    ) -> Result<(), CodegenError> {
        let ty = c_type(self.dt[i]);
        if cached[i] && loaded[i] {
            src.line(format!("const {ty} v{i} = c{i}[u];"));
            return Ok(());
        }
        let e = self.guarded(self.expr(i, at.0, at.1)?, i, guard);
        src.line(format!("const {ty} v{i} = {e};"));
        if cached[i] {
            src.line(format!("c{i}[u] = v{i};"));
            loaded[i] = true;
        }
        Ok(())
    }
}
