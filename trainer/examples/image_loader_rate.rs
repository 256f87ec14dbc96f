//! How fast the image-folder loader fills batches on this machine, without a model: the rate
//! a training step must not outrun for the loader to cost nothing (issue 48).
//!
//! ```text
//! cargo run --release -p ingot-trainer --example image_loader_rate -- DIR [SIDE] [BATCH] [THREADS] [BATCHES]
//! ```
//!
//! Defaults: side 224, batch 128, every core, 20 batches. Prints images per second for the
//! training transform (random resized crop and flip) and the evaluation transform.

use ingot_compiler::ir::DType;
use ingot_trainer::data::images::{ImageBatches, ImageFolder, ImageOptions, Transform};
use ingot_trainer::data::{BatchSource, InputSlot};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: image_loader_rate DIR [SIDE] [BATCH] [THREADS] [BATCHES]");
        std::process::exit(2);
    };
    let num = |i: usize, default: usize| {
        args.get(i)
            .map(|s| s.parse::<usize>().expect("a whole number"))
            .unwrap_or(default)
    };
    let (side, batch, threads, batches) = (num(1, 224), num(2, 128), num(3, 0), num(4, 20));
    for transform in [Transform::Train, Transform::Eval] {
        let folder = match ImageFolder::open(dir.as_ref()) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        let classes = folder.classes().len() as u64;
        let x = InputSlot {
            name: "x".into(),
            dtype: DType::F32,
            dims: vec![batch, 3, side, side],
        };
        let y = InputSlot {
            name: "y".into(),
            dtype: DType::I64,
            dims: vec![batch],
        };
        let options = ImageOptions {
            threads,
            ..Default::default()
        };
        let mut b =
            ImageBatches::new(folder, x, y, classes, transform, 0, options).unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(1);
            });
        let mut xb = vec![0u8; b.x().bytes()];
        let mut yb = vec![0u8; b.y().bytes()];
        let n = batches.min(b.batches_per_epoch() as usize).max(1);
        // One batch first: the pool's threads start and the files enter the page cache.
        b.fill(0, 0, &mut xb, &mut yb).expect("a batch");
        let t = Instant::now();
        for k in 0..n {
            b.fill(1, k as u64 % b.batches_per_epoch(), &mut xb, &mut yb)
                .expect("a batch");
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "{transform:?}: {:.0} images/s ({:.1} ms a batch of {batch} at {side}x{side}, {} threads)",
            (n * batch) as f64 / s,
            s / n as f64 * 1e3,
            b.threads()
        );
    }
}
