//! The scalar operations every elementwise op, fused kernel and reduction is built from. The
//! IR's ops and the fused-kernel description share these, so a fused kernel means exactly what
//! the ops it replaced meant.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Tanh,
    Recip,
    /// The error function, `2/√π ∫₀ˣ e^(−t²) dt` (exact GELU is `x·½·(1 + erf(x/√2))`).
    Erf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Max,
}

// ---------------------------------------------------------------------------------------------
// The op-name table: the one place an elementwise op's name is spelled. The IR's text form
// (`compiler::ir`), the fused-kernel listing and checker messages, and the CUDA generator's
// "unsupported" errors all print these names, and the IR parser reads them back through
// `from_name`, so a renamed or added op changes every user at once.

/// Spells out `name()`, `ALL` and `from_name()` for an op enum from one `variant => "name"` list.
macro_rules! op_names {
    ($ty:ident { $($v:ident => $s:literal),* $(,)? }) => {
        impl $ty {
            /// Every op of this kind, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$v),*];

            /// The op's name in IR text, kernel listings and error messages.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$v => $s),*
                }
            }

            /// The op named `name` (the inverse of [`Self::name`]).
            pub fn from_name(name: &str) -> Option<$ty> {
                Self::ALL.iter().copied().find(|op| op.name() == name)
            }
        }
    };
}

op_names!(UnaryOp { Neg => "neg", Exp => "exp", Log => "log", Sqrt => "sqrt", Tanh => "tanh", Recip => "recip", Erf => "erf" });
op_names!(BinaryOp { Add => "add", Sub => "sub", Mul => "mul", Div => "div", Max => "max", Min => "min" });
op_names!(CmpOp { Lt => "lt", Le => "le", Gt => "gt", Ge => "ge", Eq => "eq", Ne => "ne" });

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_name_is_distinct_and_parses_back_to_its_op() {
        let mut names: Vec<&str> = UnaryOp::ALL.iter().map(|o| o.name()).collect();
        names.extend(BinaryOp::ALL.iter().map(|o| o.name()));
        names.extend(CmpOp::ALL.iter().map(|o| o.name()));
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "two ops share a name");
        for &op in UnaryOp::ALL {
            assert_eq!(UnaryOp::from_name(op.name()), Some(op));
        }
        for &op in BinaryOp::ALL {
            assert_eq!(BinaryOp::from_name(op.name()), Some(op));
        }
        for &op in CmpOp::ALL {
            assert_eq!(CmpOp::from_name(op.name()), Some(op));
        }
        assert_eq!(UnaryOp::from_name("nope"), None);
    }
}
