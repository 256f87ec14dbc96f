//! A training run's host memory is flat over any number of steps (issue 53): what the run keeps
//! of its steps (their times, the losses the report draws) is of fixed size, so the bytes the
//! process holds after step 100 are the bytes it holds after step 100,000. A counting global
//! allocator (this test binary's own) watches every byte allocated and freed, on every thread.

use ingot_compiler::model::Model;
use ingot_trainer::run::{self, Observer, ObserverError, RunOptions, StepEvent};
use ingot_trainer::session::Session;
use std::sync::atomic::Ordering;

#[path = "support/counting.rs"]
mod counting;
use counting::LIVE_BYTES;

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

/// The live bytes after each of `steps` of a run of the tiny model as `o` says.
fn live_bytes(o: &RunOptions, steps: &[u64]) -> Vec<(u64, isize)> {
    let mut session = Session::new(&tiny(), 0).unwrap();
    let mut watch = Watch {
        at: Vec::with_capacity(steps.len()),
        steps: steps.to_vec(),
    };
    run::train(&mut session, o, None, &mut watch).unwrap();
    assert_eq!(watch.at.len(), steps.len());
    watch.at
}

/// One test in this binary, so that nothing else runs while it counts: the live bytes are the
/// whole process's, and the test harness's own bookkeeping of another test finishing (its
/// result, its captured output) would land in them.
#[test]
fn a_run_of_100_000_steps_holds_after_its_last_step_the_bytes_it_held_after_step_100() {
    let o = RunOptions {
        steps: Some(100_000),
        ..Default::default()
    };
    let at = live_bytes(&o, &[100, 1_000, 10_000, 100_000]);
    let first = at[0].1;
    for &(step, live) in &at {
        assert_eq!(
            live, first,
            "live bytes after step {step}: {live}, after step 100: {first}"
        );
    }

    // With a report, whose curves are kept in fixed-size form as the run goes.
    let dir = std::env::temp_dir().join(format!("ingot-flat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("run.html");
    let o = RunOptions {
        steps: Some(20_000),
        report: Some(report.clone()),
        ..Default::default()
    };
    let at = live_bytes(&o, &[100, 5_000, 20_000]);
    assert!(at.iter().all(|&(_, live)| live == at[0].1), "{at:?}");
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(page.contains("<tr><td>steps</td><td>20000</td></tr>"));
    std::fs::remove_dir_all(&dir).unwrap();
}
