//! A training run as a library ([`ingot_trainer::run::train`]): what its observer is told, in
//! which order, and how a run stops (a typed [`RunError`]).

use ingot_compiler::model::Model;
use ingot_trainer::run::{
    self, EvalEvent, Finished, Observer, ObserverError, RunError, RunOptions, Start, StepEvent,
};
use ingot_trainer::session::Session;

fn tiny() -> Session {
    let text = include_str!("../../docs/examples/tiny-mlp.ir");
    Session::new(&Model::from_ir_text("tiny-mlp.ir", text).unwrap(), 0).unwrap()
}

/// Writes down what it is told; fails at step `fail_at`, if given.
#[derive(Default)]
struct Log {
    events: Vec<String>,
    losses: Vec<f64>,
    fail_at: Option<u64>,
}

impl Observer for Log {
    fn start(&mut self, s: &Start) -> Result<(), ObserverError> {
        self.events
            .push(format!("start {} last {:?}", s.model, s.last));
        Ok(())
    }
    fn step(&mut self, e: &StepEvent) -> Result<(), ObserverError> {
        self.events.push(format!("step {}", e.step));
        self.losses.push(e.result.loss);
        if self.fail_at == Some(e.step) {
            return Err("the observer gives up".into());
        }
        Ok(())
    }
    fn eval(&mut self, e: &EvalEvent) -> Result<(), ObserverError> {
        self.events.push(format!("eval {}", e.step));
        Ok(())
    }
    fn finish(&mut self, f: &Finished) -> Result<(), ObserverError> {
        self.events.push(format!("finish {}", f.summary.steps));
        Ok(())
    }
}

#[test]
fn a_run_tells_its_observer_its_start_each_step_and_its_summary_in_order() {
    let mut session = tiny();
    let mut log = Log::default();
    let o = RunOptions {
        steps: Some(3),
        ..Default::default()
    };
    run::train(&mut session, &o, None, &mut log).unwrap();
    assert_eq!(
        log.events,
        [
            "start tiny-mlp.ir last Some(3)",
            "step 1",
            "step 2",
            "step 3",
            "finish 3"
        ]
    );
    // The losses are the session's own, step for step.
    let mut again = tiny();
    let direct: Vec<f64> = (0..3).map(|_| again.step().unwrap().loss).collect();
    assert_eq!(log.losses, direct);
}

#[test]
fn an_observer_s_error_stops_the_run_there() {
    let mut session = tiny();
    let mut log = Log {
        fail_at: Some(2),
        ..Default::default()
    };
    let o = RunOptions {
        steps: Some(10),
        ..Default::default()
    };
    let e = run::train(&mut session, &o, None, &mut log).unwrap_err();
    assert!(matches!(e, RunError::Observer(_)), "{e:?}");
    assert_eq!(e.to_string(), "the observer gives up");
    assert_eq!(log.events.last().map(String::as_str), Some("step 2"));
}

#[test]
fn options_that_make_no_run_are_a_usage_error() {
    let mut session = tiny();
    let e = run::train(&mut session, &RunOptions::default(), None, &mut run::Silent).unwrap_err();
    assert!(
        matches!(&e, RunError::Usage(m) if m == "give --steps N"),
        "{e:?}"
    );
    let o = RunOptions {
        steps: Some(1),
        checkpoint_every: Some(0),
        ..Default::default()
    };
    let e = run::train(&mut session, &o, None, &mut run::Silent).unwrap_err();
    assert!(matches!(e, RunError::Usage(_)), "{e:?}");
}
