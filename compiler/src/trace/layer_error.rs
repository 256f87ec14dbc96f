//! Errors of a model's layers, named by the layer.

use crate::error::IrError;

/// Adds the layer's name to an error from the builder, so that a shape mismatch deep inside a
/// model says which layer it came from.
pub fn in_layer(layer: &str, e: IrError) -> IrError {
    match e {
        IrError::Type {
            op,
            node,
            operands,
            reason,
        } => IrError::Type {
            op,
            node,
            operands,
            reason: format!("{reason} (in layer {layer})"),
        },
        IrError::Invalid(m) => IrError::Invalid(format!("{m} (in layer {layer})")),
        other => other,
    }
}
