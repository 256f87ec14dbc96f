//! A training run's host memory is flat over any number of steps (issue 53): what the run keeps
//! of its steps (their times, the losses the report draws) is of fixed size, so the bytes the
//! process holds after step 100 are the bytes it holds after step 100,000. A counting global
//! allocator (this test binary's own) watches every byte allocated and freed, on every thread.

use ingot_compiler::models::Model;
use ingot_trainer::run::{self, Observer, ObserverError, RunOptions, StepEvent};
use ingot_trainer::session::Session;
use std::sync::atomic::Ordering;

#[path = "support/counting.rs"]
mod counting;
use counting::LIVE_BYTES;

/// The tests of this file run one at a time: the live bytes are the whole process's, and
/// another test's allocations would land in them.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Notes the live bytes after chosen steps.
struct Watch {
    at: Vec<(u64, isize)>,
    steps: Vec<u64>,
}

impl Observer for Watch {
    fn step(&mut self, e: &StepEvent) -> Result<(), ObserverError> {
        assert!(e.finite, "step {}: loss {}", e.step, e.result.loss);
        if self.steps.contains(&e.step) {
            // `at` has room for every step watched: pushing allocates nothing.
            self.at.push((e.step, LIVE_BYTES.load(Ordering::SeqCst)));
        }
        Ok(())
    }
}

fn tiny() -> Model {
    let text = include_str!("../../docs/examples/tiny-mlp.ir");
    Model::from_ir_text("tiny-mlp.ir", text).unwrap()
}

#[test]
fn a_run_of_100_000_steps_holds_after_its_last_step_the_bytes_it_held_after_step_100() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut session = Session::new(&tiny(), 0).unwrap();
    let steps = [100, 1_000, 10_000, 100_000];
    let mut watch = Watch {
        at: Vec::with_capacity(steps.len()),
        steps: steps.to_vec(),
    };
    let o = RunOptions {
        steps: Some(100_000),
        ..Default::default()
    };
    run::train(&mut session, &o, None, &mut watch).unwrap();
    assert_eq!(watch.at.len(), steps.len());
    let first = watch.at[0].1;
    for &(step, live) in &watch.at {
        assert_eq!(
            live, first,
            "live bytes after step {step}: {live}, after step 100: {first}"
        );
    }
}

#[test]
fn a_run_writing_its_report_is_flat_too() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut session = Session::new(&tiny(), 0).unwrap();
    let dir = std::env::temp_dir().join(format!("ingot-flat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("run.html");
    let steps = [100, 5_000, 20_000];
    let mut watch = Watch {
        at: Vec::with_capacity(steps.len()),
        steps: steps.to_vec(),
    };
    let o = RunOptions {
        steps: Some(20_000),
        // The report's curves are kept in fixed-size form as the run goes.
        report: Some(report.clone()),
        ..Default::default()
    };
    run::train(&mut session, &o, None, &mut watch).unwrap();
    let first = watch.at[0].1;
    assert!(
        watch.at.iter().all(|&(_, live)| live == first),
        "{:?}",
        watch.at
    );
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(page.contains("<tr><td>steps</td><td>20000</td></tr>"));
    std::fs::remove_dir_all(&dir).unwrap();
}
