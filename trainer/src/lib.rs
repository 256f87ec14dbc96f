//! Ingot's training runs as a library, above the runtime (which only runs an executable):
//! a [`session`] loads a compiled step on a device with its initial values ([`init`]); data sets
//! are read batch by batch and sharded per rank ([`data`], [`datasets`]); [`eval`] runs the
//! evaluation step, [`schedule`] gives the learning rate of each step, [`checkpoint`] saves and
//! resumes a run, and [`report`] is what a run says about itself ([`flop_rate`]: its FLOP/s and
//! the fraction of the device's peak; [`figure`]: how its losses print). [`run`] is the
//! training loop itself, telling an observer its steps, evaluations and epochs, and keeping
//! what it records in fixed-size summaries ([`record`]); on the CPU it measures its heap with
//! [`host_memory`].
//! [`gpt_names`] maps GPT-2 weights under Hugging Face's and nanoGPT's names onto Ingot's GPT
//! and back. The `ingot` command line sits above this crate, and this crate never names it
//! (tests/layers.rs in the runtime crate).

pub mod checkpoint;
pub mod data;
pub mod datasets;
pub mod eval;
pub mod figure;
mod finite;
pub mod flop_rate;
pub mod generate;
pub mod gpt_names;
pub mod host_memory;
pub mod infer;
pub mod init;
pub mod record;
pub mod report;
pub mod run;
pub mod schedule;
pub mod session;
pub mod state_dict;
