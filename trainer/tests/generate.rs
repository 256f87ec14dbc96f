//! Text generation ([`ingot_trainer::generate`]): the planned generation step's greedy tokens
//! are the ones an independent reference takes (the CPU interpreter running the unplanned,
//! unfused forward graph, its argmax taken here), draws repeat under a seed, and tokens after
//! the first allocate nothing (a counting allocator watches this test binary).

use indexmap::IndexMap;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::models::{self, Model};
use ingot_compiler::precision::Precision;
use ingot_runtime::tensor::{Data, Tensor};
use ingot_trainer::generate::{Generator, Sampling};
use ingot_trainer::session::{Device, Session};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

#[path = "support/counting.rs"]
mod counting;

/// The counter sees every thread: tests that count take this first.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const SPEC: &str = "gpt:vocab=32,d_model=16,layers=2,heads=2,d_ff=32,seq=8,batch=1";

/// The model and weights large enough that its logits differ clearly (seeded, then the
/// matrices scaled up from GPT-2's 0.02).
fn model_and_weights() -> (Model, IndexMap<String, Tensor>) {
    let m = models::by_name(SPEC).unwrap();
    let mut w = ingot_trainer::init::init_leaves(&m.graph, LeafKind::Parameter, 11);
    for (name, t) in w.iter_mut() {
        if let (Data::F32(v), false) = (&mut t.data, name.contains("ln")) {
            v.iter_mut().for_each(|x| *x *= 25.0);
        }
    }
    (m, w)
}

fn generator(m: &Model, w: &IndexMap<String, Tensor>) -> Generator {
    ingot_runtime::cpu::threads::set_default_threads(1);
    let mut g = Generator::new(m, Precision::F32, &Session::cpu_options(), Device::Cpu).unwrap();
    g.step_mut().load_weights(w, &IndexMap::new()).unwrap();
    g
}

fn run(g: &mut Generator, prompt: &[u32], n: usize, s: &Sampling) -> Vec<u32> {
    let mut out = Vec::with_capacity(n);
    g.generate(prompt, n, s, |t| {
        out.push(t);
        Ok(())
    })
    .unwrap();
    out
}

/// Greedy tokens by the interpreter on the forward graph reduced to its logits, the window
/// sliding as nanoGPT's `idx[:, -block_size:]`.
fn reference_greedy(m: &Model, w: &IndexMap<String, Tensor>, prompt: &[u32], n: usize) -> Vec<u32> {
    let g = ingot_compiler::trace::logits::logits_only(&m.graph).unwrap();
    let (seq, vocab) = (8, 32);
    let mut all: Vec<u32> = prompt.to_vec();
    for _ in 0..n {
        let window = &all[all.len().saturating_sub(seq)..];
        let mut ids = vec![0i64; seq];
        for (i, &t) in window.iter().enumerate() {
            ids[i] = t as i64;
        }
        let mut leaves = w.clone();
        leaves.insert("x".into(), Tensor::from_i64([1, seq], ids));
        let out = ingot_runtime::cpu::interp::run_graph(&g, &leaves).unwrap();
        let logits = out.outputs["logits"].as_f32().unwrap().to_vec();
        let row = &logits[(window.len() - 1) * vocab..window.len() * vocab];
        let mut best = 0;
        for i in 0..vocab {
            if row[i] > row[best] {
                best = i;
            }
        }
        all.push(best as u32);
    }
    all[prompt.len()..].to_vec()
}

#[test]
fn greedy_generation_takes_the_references_argmax_at_every_token_through_a_sliding_window() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (m, w) = model_and_weights();
    let mut g = generator(&m, &w);
    let greedy = Sampling {
        temperature: 0.0,
        top_k: None,
        seed: 0,
    };
    // 3 prompt tokens and 12 more: the 8-token window slides for the last 7.
    let prompt = [5, 17, 2];
    let got = run(&mut g, &prompt, 12, &greedy);
    let want = reference_greedy(&m, &w, &prompt, 12);
    assert_eq!(got, want);
    let distinct: std::collections::BTreeSet<_> = want.iter().collect();
    assert!(
        distinct.len() > 1,
        "the reference repeats one token: {want:?}"
    );
}

#[test]
fn the_same_seed_draws_the_same_tokens_and_another_seed_others() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (m, w) = model_and_weights();
    let mut g = generator(&m, &w);
    let s = |seed| Sampling {
        temperature: 1.5,
        top_k: Some(20),
        seed,
    };
    let a = run(&mut g, &[1, 2], 40, &s(3));
    let b = run(&mut g, &[1, 2], 40, &s(3));
    let mut fresh = generator(&m, &w);
    let c = run(&mut fresh, &[1, 2], 40, &s(3));
    let d = run(&mut g, &[1, 2], 40, &s(4));
    assert_eq!(a, b);
    assert_eq!(a, c);
    assert_ne!(a, d);
}

#[test]
fn generated_tokens_allocate_nothing_after_the_first() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (m, w) = model_and_weights();
    let mut g = generator(&m, &w);
    let s = Sampling {
        temperature: 1.0,
        top_k: Some(5),
        seed: 1,
    };
    let n = 1000;
    // The counter sees every thread, the test harness's too (it prints another test's result
    // while this one runs): the least of three runs is this one's own.
    let least = (0..3)
        .map(|_| {
            let mut out = Vec::with_capacity(n);
            // Each token takes the count before it: the first may warm up, none after may
            // allocate.
            let mut counts = Vec::with_capacity(n + 1);
            counts.push(counting::ALLOCATIONS.load(Ordering::SeqCst));
            g.generate(&[3], n, &s, |t| {
                out.push(t);
                counts.push(counting::ALLOCATIONS.load(Ordering::SeqCst));
                Ok(())
            })
            .unwrap();
            assert_eq!(out.len(), n);
            counts[n] - counts[1]
        })
        .min()
        .unwrap();
    assert_eq!(least, 0, "{least} allocations in {} tokens", n - 1);
}

#[test]
fn a_prompt_outside_the_vocabulary_is_refused_naming_the_token() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (m, w) = model_and_weights();
    let mut g = generator(&m, &w);
    let s = Sampling {
        temperature: 0.0,
        top_k: None,
        seed: 0,
    };
    let e = g.generate(&[1, 40], 3, &s, |_| Ok(())).unwrap_err();
    assert!(
        e.contains("prompt token 1 is 40") && e.contains("32"),
        "{e}"
    );
    let e = g.generate(&[], 3, &s, |_| Ok(())).unwrap_err();
    assert!(e.contains("no token"), "{e}");
}
