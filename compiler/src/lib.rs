//! Ingot's compiler: a training step traced into an IR, differentiated, rewritten, fused,
//! scheduled and planned into one slab whose peak is known before launch.

pub mod align;
pub mod autodiff;
pub mod error;
pub mod exe;
pub mod files;
pub mod fit;
pub mod flops;
pub mod fuse;
pub mod ir;
pub mod layout;
pub mod lower;
pub mod model;
pub mod pipeline;
pub mod plan;
pub mod precision;
pub mod printable;
pub mod random_graph;
pub mod recognize;
pub mod report;
pub mod rewrite;
pub mod schedule;
pub mod snapshot;
pub mod trace;

pub use error::{IrError, Result};

// The compiler's unit tests build reference models by name (`crate::models::by_name("mlp")`),
// but the zoo (`ingot-models`) depends on the compiler, and a unit test that used it as a
// dev-dependency would see a second copy of the compiler's types. So the unit tests compile the
// zoo's source as a module of their own, where `ingot_compiler::` names this crate (the zoo's
// files never write `crate::`). The library itself knows no model.
#[cfg(test)]
extern crate self as ingot_compiler;
// (Unit tests use only part of the zoo; the rest is the zoo crate's to use.)
#[cfg(test)]
#[path = "../../models/src/lib.rs"]
#[allow(dead_code, unused_imports)]
pub(crate) mod models;
