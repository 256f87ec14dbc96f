//! Text generation ([`ingot_trainer::generate`]): the planned generation steps' greedy tokens
//! (the whole window's and the cached decode step's) are the ones an independent reference
//! takes (the CPU interpreter running the unplanned, unfused forward graph over the same
//! context, its argmax taken here), the cached step's logits are the whole window's at every
//! position, draws repeat under a seed, and tokens after the first allocate nothing (a counting
//! allocator watches this test binary).

use indexmap::IndexMap;
use ingot_compiler::model::Model;
use ingot_compiler::precision::Precision;
use ingot_runtime::tensor::Tensor;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::generate::{Generator, Sampling};
use ingot_trainer::session::{Device, Session};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

#[path = "support/generation.rs"]
mod generation;
use generation::{assert_logits_within, relative_difference, run_observed};

#[path = "support/counting.rs"]
mod counting;

/// The counter sees every thread: tests that count take this first.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const SPEC: &str = "gpt:vocab=32,d_model=16,layers=2,heads=2,d_ff=32,seq=8,batch=1";

/// The model and its weights (`support/generation.rs`).
fn model_and_weights() -> (Model, IndexMap<String, Tensor>) {
    generation::model_and_weights(SPEC, 11)
}

fn generator(m: &Model, w: &IndexMap<String, Tensor>) -> Generator {
    generator_in(m, w, Precision::F32, false)
}

fn cached(m: &Model, w: &IndexMap<String, Tensor>) -> Generator {
    generator_in(m, w, Precision::F32, true)
}

/// The whole-window generator of `m`, or with `cached` its decode step, with weights `w`.
fn generator_in(
    m: &Model,
    w: &IndexMap<String, Tensor>,
    precision: Precision,
    cached: bool,
) -> Generator {
    ingot_runtime::cpu::threads::set_default_threads(1);
    let opts = Session::cpu_options();
    let mut g = if cached {
        Generator::cached(m, precision, &opts, Device::Cpu).unwrap()
    } else {
        Generator::new(m, precision, &opts, Device::Cpu).unwrap()
    };
    assert_eq!(g.is_cached(), cached);
    g.step_mut().load_weights(w, &IndexMap::new()).unwrap();
    g
}

const GREEDY: Sampling = Sampling {
    temperature: 0.0,
    top_k: None,
    seed: 0,
};

fn run(g: &mut Generator, prompt: &[u32], n: usize, s: &Sampling) -> Vec<u32> {
    let mut out = Vec::with_capacity(n);
    g.generate(prompt, n, s, |t| {
        out.push(t);
        Ok(())
    })
    .unwrap();
    out
}

/// Greedy tokens by the interpreter on the forward graph reduced to its logits, over the
/// context the generators keep: the prompt's last `seq` tokens and each drawn one, the last
/// `seq / 2` kept when the window is full.
fn reference_greedy(m: &Model, w: &IndexMap<String, Tensor>, prompt: &[u32], n: usize) -> Vec<u32> {
    let g = ingot_compiler::trace::logits::logits_only(&m.graph).unwrap();
    let (seq, vocab) = (8, 32);
    let mut all: Vec<u32> = prompt.to_vec();
    let mut start = prompt.len().saturating_sub(seq);
    for _ in 0..n {
        let window = &all[start..];
        assert!(window.len() <= seq);
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
        if window.len() == seq {
            start = all.len() - seq / 2;
        }
        all.push(best as u32);
    }
    all[prompt.len()..].to_vec()
}

#[test]
fn greedy_generation_takes_the_references_argmax_at_every_token_through_window_slides() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (m, w) = model_and_weights();
    // 3 prompt tokens and 20 more: the 8-token window fills and slides several times.
    let prompt = [5, 17, 2];
    let want = reference_greedy(&m, &w, &prompt, 20);
    let distinct: std::collections::BTreeSet<_> = want.iter().collect();
    assert!(
        distinct.len() > 1,
        "the reference repeats one token: {want:?}"
    );
    for is_cached in [false, true] {
        let mut g = generator_in(&m, &w, Precision::F32, is_cached);
        assert_eq!(
            run(&mut g, &prompt, 20, &GREEDY),
            want,
            "cached: {is_cached}"
        );
    }
}

#[test]
fn the_cached_step_gives_the_whole_windows_tokens_and_logits_for_a_hundred_tokens_past_slides() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (m, w) = model_and_weights();
    let mut whole = generator(&m, &w);
    let mut kv = cached(&m, &w);
    // A prompt longer than the window (its last 8 tokens are the context), then 120 tokens:
    // the window slides every 4.
    let prompt: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % 32).collect();
    let (want, want_logits) = run_observed(&mut whole, &prompt, 120, &GREEDY);
    let (got, got_logits) = run_observed(&mut kv, &prompt, 120, &GREEDY);
    assert_eq!(got, want);
    assert_logits_within(&got_logits, &want_logits, 1e-5, "the logits");
    // Greedy decoding of these weights settles on a few tokens; draws at temperature 1 (the
    // same logits and seed give the same draws) take the two steps through varied contexts.
    let s = Sampling {
        temperature: 1.0,
        top_k: None,
        seed: 9,
    };
    let (want, want_logits) = run_observed(&mut whole, &prompt, 120, &s);
    let (got, got_logits) = run_observed(&mut kv, &prompt, 120, &s);
    assert_eq!(got, want);
    assert_logits_within(&got_logits, &want_logits, 1e-5, "the drawn tokens' logits");
    let distinct: std::collections::BTreeSet<_> = want.iter().collect();
    assert!(distinct.len() > 8, "too few distinct tokens: {want:?}");
}

#[test]
fn the_cached_bf16_step_keeps_its_cache_in_bf16_and_follows_the_bf16_whole_window() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (m, w) = model_and_weights();
    let mut kv = generator_in(&m, &w, Precision::Bf16, true);
    let mut whole = generator_in(&m, &w, Precision::Bf16, false);
    // 2 layers, K and V, [1, 2 heads, 8, 8] in bf16.
    assert_eq!(kv.cache_bytes(), 4 * 2 * 8 * 8 * 2);
    // Teacher-forced over one token sequence, so both see the same contexts: the logits of
    // each prefix agree to bf16's precision (the two steps round at different places).
    let tokens: Vec<u32> = (0..14).map(|i| (i * 5 + 1) % 32).collect();
    for end in 1..=tokens.len() {
        let (_, a) = run_observed(&mut kv, &tokens[..end], 1, &GREEDY);
        let (_, b) = run_observed(&mut whole, &tokens[..end], 1, &GREEDY);
        let r = relative_difference(&a[0], &b[0]);
        assert!(
            r <= 0.05,
            "prefix {end}: the bf16 logits differ by {r:e} relative"
        );
    }
}

#[test]
fn the_cached_step_is_refused_for_a_model_outside_the_gpt_family() {
    let m = ingot_models::by_name("mlp").unwrap();
    let e = match Generator::cached(&m, Precision::F32, &Session::cpu_options(), Device::Cpu) {
        Ok(_) => panic!("the mlp has a decode step"),
        Err(e) => e,
    };
    assert_mentions(&e, &["mlp", "GPT family"]);
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
    allocates_nothing_after_the_first_token(&mut generator(&m, &w));
}

#[test]
fn a_thousand_cached_tokens_allocate_nothing_after_the_first() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (m, w) = model_and_weights();
    allocates_nothing_after_the_first_token(&mut cached(&m, &w));
}

/// 1,000 tokens from `g` (the window sliding every few), the heap's allocations counted.
fn allocates_nothing_after_the_first_token(g: &mut Generator) {
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
    assert_mentions(&e, &["prompt token 1 is 40", "32"]);
    let e = g.generate(&[], 3, &s, |_| Ok(())).unwrap_err();
    assert!(e.contains("no token"), "{e}");
}
