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
pub mod models;
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
