//! Ingot's examples: the programs a new user copies. They use only the public APIs of
//! `ingot-compiler`, `ingot-runtime` and `ingot-trainer`, and live in this crate's `examples/` folder:
//!
//! - `define_model`: a model defined through the Rust API (`ingot_compiler::trace::nn`), its
//!   memory plan printed before anything runs.
//! - `plan_ir_text`: a model read from IR text (`docs/examples/tiny-mlp.ir`), planned and held
//!   to `--budget SIZE` (exit code 3 over it).
//! - `train_cpu`: that model trained on the CPU for a few steps, its weights saved to
//!   safetensors and loaded into a fresh session.
//!
//! Run one with `cargo run -p ingot-examples --example NAME`. The snapshot test of a plan is
//! `tests/plan_snapshot.rs` (insta), and `tests/user_guide.rs` runs the code of
//! docs/user-guide.md. Every example's own tests run with `cargo test -p ingot-examples`.
