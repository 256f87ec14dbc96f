//! Tensors checked for NaN and infinite elements.

use indexmap::IndexMap;
use ingot_runtime::tensor::Tensor;

/// A tensor map's first non-finite element, as an error naming the tensor, the element's
/// index and value, and how many of the tensor's elements are not finite. `what` says whose
/// tensors they are ("parameter", "optimizer state").
pub fn check_finite(what: &str, tensors: &IndexMap<String, Tensor>) -> Result<(), String> {
    for (name, t) in tensors {
        if let Some(bad) = t.non_finite() {
            let mut index = Vec::with_capacity(t.dims().len());
            let mut rest = bad.first;
            for &d in t.dims().iter().rev() {
                index.push(rest % d.max(1));
                rest /= d.max(1);
            }
            index.reverse();
            return Err(format!(
                "{what} {name:?} is not finite: {} at {index:?} ({} of its {} elements are NaN or infinite)",
                bad.value,
                bad.count,
                t.numel()
            ));
        }
    }
    Ok(())
}
