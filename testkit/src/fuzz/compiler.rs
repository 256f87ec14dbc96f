//! The compiler's fuzz bodies: the IR text parser, the executable reader, the planner.

use ingot_compiler::exe::Executable;
use ingot_compiler::ir::{text, Graph};
use ingot_compiler::plan::{self, PlanError, PlanOptions};
use std::time::Duration;

/// The IR text parser: arbitrary bytes (as UTF-8, lossily) parse to a graph or an error; a
/// graph that parses verifies, and its printed form parses back to a graph that prints the
/// same (the text form round-trips).
pub fn ir_text(data: &[u8]) {
    let src = String::from_utf8_lossy(data);
    let Ok(g) = text::parse(&src) else { return };
    if let Err(e) = g.verify() {
        panic!("a parsed graph does not verify: {e}\n{src}");
    }
    let printed = text::print(&g);
    match text::parse(&printed) {
        Ok(again) => assert_eq!(
            text::print(&again),
            printed,
            "the printed graph does not print the same after parsing"
        ),
        Err(e) => panic!("the printed form of a parsed graph does not parse: {e}\n{printed}"),
    }
}

/// `Executable::from_bytes`: arbitrary bytes are an executable or an error; an executable it
/// accepts holds a plan the validator accepts for its graph and a program that fits the plan,
/// and writes itself out as bytes
/// that read back to the same bytes.
pub fn executable(data: &[u8]) {
    let Ok(e) = Executable::from_bytes(data, "fuzz.ingot") else {
        return;
    };
    if let Err(v) = e.plan().validate(e.graph()) {
        panic!("from_bytes accepted a plan the validator rejects: {v}");
    }
    if let Err(v) = e.program().check(e.graph(), e.plan()) {
        panic!("from_bytes accepted a program its check rejects: {v}");
    }
    let bytes = e
        .to_bytes()
        .unwrap_or_else(|err| panic!("an accepted executable cannot be written: {err}"));
    let again = Executable::from_bytes(&bytes, "fuzz.ingot")
        .unwrap_or_else(|err| panic!("a written executable does not read back: {err}"));
    let bytes2 = again.to_bytes().expect("written once already");
    assert!(
        bytes == bytes2,
        "an executable's bytes change on a second round trip"
    );
}

/// Planning options for fuzzing: the planner's own schedules with a small solver budget, so
/// that each input takes milliseconds (the budget bounds the search, not what it must respect).
pub fn fuzz_plan_options() -> PlanOptions {
    PlanOptions {
        solver_nodes: 2_000,
        solver_time: Duration::from_secs(2),
        ..PlanOptions::default()
    }
}

/// Plan-then-validate: a graph from bytes (IR text) is planned; planning gives a plan or an
/// error, and never a plan the independent validator rejects, neither inside the planner (its
/// `PlanError::Invalid`) nor when validated again here.
pub fn plan_then_validate(data: &[u8]) {
    let src = String::from_utf8_lossy(data);
    let Ok(g) = text::parse(&src) else { return };
    plan_graph(&g);
}

/// The planning half of [`plan_then_validate`], for callers that build graphs themselves.
pub fn plan_graph(g: &Graph) {
    match plan::plan(g, &fuzz_plan_options()) {
        Ok(p) => {
            if let Err(v) = p.validate(g) {
                panic!("the planner returned a plan the validator rejects: {v}");
            }
        }
        Err(PlanError::Invalid(v)) => {
            panic!("the planner made a plan the validator rejects: {v}")
        }
        Err(_) => {}
    }
}
