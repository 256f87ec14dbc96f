//! `ingot generate` with what the field brings (issue 50): a Hugging Face tokenizer.json encodes
//! the prompt and decodes the tokens (the fixture's ids are the Python `tokenizers` library's),
//! and a tokenizer that does not fit the model is an error naming both vocabularies.

use ingot_testkit::text::assert_mentions;
use std::path::{Path, PathBuf};

#[path = "support/cli.rs"]
mod cli;
use cli::{exit_stderr, ingot, json_lines, ok, run, s};

/// The trainer's tokenizer fixture (a byte-level BPE of 512 ids, made by
/// scripts/tokenizer_fixture.py) and the Python library's ids of its sample text.
fn tokenizer_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../trainer/tests/fixtures/tokenizer")
        .join(name)
}

/// A small GPT of `vocab` tokens and a 64-token window, at its initial weights (seed 0), saved
/// at `dir/w{vocab}.safetensors`; returns its spec and the weights.
fn initial_gpt(dir: &Path, vocab: usize) -> (String, PathBuf) {
    let spec = format!("gpt:vocab={vocab},d_model=16,layers=1,heads=2,d_ff=32,seq=64,batch=1");
    let w = dir.join(format!("w{vocab}.safetensors"));
    ok(&ingot(&[
        "train",
        "--model",
        &spec,
        "--steps",
        "0",
        "--save",
        s(&w),
        "--threads",
        "1",
    ]));
    (spec, w)
}

/// `ingot generate`'s flags for the GPT `spec` from the weights `w` with the tokenizer file
/// `tokenizer` (the prompt and the draws follow).
fn gpt_with<'a>(spec: &'a str, w: &'a Path, tokenizer: &'a str) -> [&'a str; 7] {
    let init = s(w);
    [
        "generate",
        "--model",
        spec,
        "--init",
        init,
        "--tokenizer",
        tokenizer,
    ]
}

#[test]
fn a_tokenizer_json_encodes_the_prompt_as_the_python_library_does_and_decodes_the_tokens() {
    let d = cli::scratch("generate", "tokenizer");
    let (spec, w) = initial_gpt(&d, 512);
    let tok = tokenizer_fixture("tokenizer.json");
    // The first line of the sample, without its newline: the Python library's ids of it are
    // the first ids of the whole sample's (the byte-level pre-tokenizer cuts before a newline).
    let sample = std::fs::read_to_string(tokenizer_fixture("sample.txt")).unwrap();
    let line = sample.lines().next().unwrap();
    let all: Vec<u64> =
        serde_json::from_slice(&std::fs::read(tokenizer_fixture("sample_ids.json")).unwrap())
            .unwrap();
    let draw = [
        "--prompt",
        line,
        "--tokens",
        "12",
        "--seed",
        "3",
        "--json",
        "--threads",
        "1",
    ];
    let out = json_lines(&ok(&ingot(
        &[&gpt_with(&spec, &w, s(&tok))[..], &draw].concat(),
    )))
    .remove(0);
    let prompt: Vec<u64> = serde_json::from_value(out["prompt_tokens"].clone()).unwrap();
    assert!(
        !prompt.is_empty() && prompt.len() < all.len() && all.starts_with(&prompt),
        "the prompt's ids {prompt:?} are not the start of the library's {all:?}"
    );
    let tokens: Vec<u32> = serde_json::from_value(out["tokens"].clone()).unwrap();
    assert_eq!(tokens.len(), 12);
    let decoded = ingot_trainer::data::tokenizer::TextTokenizer::from_file(&tok)
        .unwrap()
        .decode(&tokens)
        .unwrap();
    assert_eq!(out["text"].as_str(), Some(decoded.as_str()));
    // Byte-level tokens stay the default: the same prompt, one token per byte.
    let bytes = json_lines(&ok(&ingot(&[
        "generate",
        "--model",
        &spec,
        "--init",
        s(&w),
        "--prompt",
        line,
        "--tokens",
        "1",
        "--json",
        "--threads",
        "1",
    ])))
    .remove(0);
    assert_eq!(bytes["prompt_tokens"].as_array().unwrap().len(), line.len());
}

#[test]
fn a_tokenizer_that_does_not_fit_the_model_is_an_error_naming_both_vocabularies() {
    let d = cli::scratch("generate", "tokenizer_sizes");
    let tok = tokenizer_fixture("tokenizer.json");
    let generate = |spec: &str, w: &Path, temperature: &str| {
        let draw = [
            "--prompt",
            "the plan",
            "--tokens",
            "48",
            "--temperature",
            temperature,
        ];
        run(&[&gpt_with(spec, w, s(&tok))[..], &draw, &["--threads", "1"]].concat())
    };
    // The tokenizer's 512 ids reach past a model of 256.
    let (spec, w) = initial_gpt(&d, 256);
    let err = exit_stderr(generate(&spec, &w, "0.8"), 1);
    assert_mentions(&err, &["512", "256", "tokenizer.json"]);
    // A model of 1024 tokens draws ids the tokenizer does not have (a draw at a high
    // temperature is near uniform: 48 draws all below 512 would be a 1-in-2^48 chance).
    let (spec, w) = initial_gpt(&d, 1024);
    let err = exit_stderr(generate(&spec, &w, "100"), 1);
    assert_mentions(&err, &["the model drew token", "512", "1024"]);
    // A missing file names itself.
    let one = ["--prompt", "a", "--tokens", "1"];
    let err = exit_stderr(
        run(&[&gpt_with(&spec, &w, "nope.json")[..], &one].concat()),
        1,
    );
    assert!(err.contains("nope.json"), "{err}");
}

// ---------------------------------------------------------------- ONNX decoders

/// transformers' GPT-2 at a tiny config (vocab 32, a window of 8, 2 layers of width 16, batch
/// 2 fixed in the file), exported by scripts/onnx_torch_fixtures.py, and its initial weights
/// under transformers' names.
fn hf_gpt2(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../onnx/tests/torch/hf_gpt2")
        .join(file)
}

/// The same shape in Ingot's built-in GPT (transformers' GPT-2 block: pre-norm, tanh GELU, a
/// 4 × width MLP, the head tied at initialization).
const HF_GPT2_AS_GPT: &str = "gpt:vocab=32,d_model=16,layers=2,heads=2,d_ff=64,seq=8,batch=1";

/// Prompts of token ids below the fixture's vocabulary of 32, as byte-level text.
const PROMPTS: [&str; 2] = ["\u{3}\u{11}\u{7}", "\u{1d}\u{2}"];

/// `ingot generate` with `args`, its JSON lines' token lists.
fn generated(args: &[&str]) -> Vec<Vec<u64>> {
    let base = ["generate", "--json", "--threads", "1"];
    let all: Vec<&str> = base.iter().chain(args).copied().collect();
    json_lines(&ok(&ingot(&all)))
        .iter()
        .map(|l| serde_json::from_value(l["tokens"].clone()).unwrap())
        .collect()
}

/// `weights` (transformers' names, as the ONNX file names its initializers) mapped onto
/// Ingot's GPT by `train --init` and saved under Ingot's names at `at`.
fn as_ingot_gpt(weights: &Path, at: &Path) {
    ok(&ingot(&[
        "train",
        "--model",
        HF_GPT2_AS_GPT,
        "--init",
        s(weights),
        "--steps",
        "0",
        "--save",
        s(at),
        "--threads",
        "1",
    ]));
}

/// `prompts`, 12 tokens each (a window of 8 slides twice), from seed 4 at `temperature`.
fn draw_from<'a>(prompts: &[&'a str], temperature: &'a str) -> Vec<&'a str> {
    let mut args = Vec::new();
    for p in prompts {
        args.extend(["--prompt", p]);
    }
    args.extend([
        "--tokens",
        "12",
        "--temperature",
        temperature,
        "--seed",
        "4",
    ]);
    args
}

/// The flags of Ingot's own GPT holding `weights` (Ingot's names), the reference the imported
/// model's draws are checked against.
fn as_gpt(weights: &Path) -> [&str; 4] {
    ["--model", HF_GPT2_AS_GPT, "--init", s(weights)]
}

/// The transformers GPT-2 fixture's ONNX file, and its initial weights saved under Ingot's names
/// in the scratch folder of `test`.
fn hf_gpt2_and_as_gpt(test: &str) -> (PathBuf, PathBuf) {
    let ingot_names = cli::scratch("generate", test).join("as_gpt.safetensors");
    as_ingot_gpt(&hf_gpt2("init.safetensors"), &ingot_names);
    (hf_gpt2("model.onnx"), ingot_names)
}

#[test]
fn an_imported_gpt2_draws_the_tokens_of_its_weights_in_ingots_own_gpt() {
    let (model, ingot_names) = hf_gpt2_and_as_gpt("onnx_gpt2");
    // 12 tokens after 2 or 3: the window of 8 slides twice. Greedy, and drawn at temperature
    // 1 from the same seed (the draws follow the whole softmax, so logits that differed would
    // soon draw another token; greedy decoding of these random weights settles on one token).
    for prompt in PROMPTS {
        for (temperature, distinct_at_least) in [("0", 1), ("1", 4)] {
            let draw = draw_from(&[prompt], temperature);
            let imported = generated(&[&["--onnx", s(&model)][..], &draw].concat());
            let reference = generated(&[&as_gpt(&ingot_names)[..], &draw].concat());
            assert_eq!(imported, reference, "prompt {prompt:?} at {temperature}");
            let distinct: std::collections::BTreeSet<u64> = imported[0].iter().copied().collect();
            assert!(
                distinct.len() >= distinct_at_least,
                "too few distinct tokens to prove much: {imported:?}"
            );
        }
    }
}

#[test]
fn an_imported_gpt2_trained_by_ingot_generates_from_its_saved_weights() {
    let d = cli::scratch("generate", "onnx_trained");
    let model = hf_gpt2("model.onnx");
    let trained = d.join("trained.safetensors");
    ok(&ingot(&[
        "train",
        "--onnx",
        s(&model),
        "--loss",
        "cross-entropy",
        "--class-axis",
        "last",
        "--data",
        s(&hf_gpt2("batch.safetensors")),
        "--steps",
        "5",
        "--save",
        s(&trained),
        "--checkpoint",
        s(&d.join("ckpt")),
        "--threads",
        "1",
    ]));
    let ingot_names = d.join("as_gpt.safetensors");
    as_ingot_gpt(&trained, &ingot_names);
    let greedy = [
        "--prompt",
        PROMPTS[0],
        "--tokens",
        "10",
        "--temperature",
        "0",
    ];
    let from_file = generated(&[&["--onnx", s(&model)][..], &greedy].concat());
    let imported =
        generated(&[&["--onnx", s(&model), "--init", s(&trained)][..], &greedy].concat());
    let reference = generated(&[&as_gpt(&ingot_names)[..], &greedy].concat());
    assert_eq!(imported, reference);
    // The run's checkpoint records the file: it needs no --onnx.
    let recorded = generated(&[&["--checkpoint", s(&d.join("ckpt"))][..], &greedy].concat());
    assert_eq!(recorded, imported);
    assert_ne!(
        imported, from_file,
        "the trained weights change nothing: the test proves nothing"
    );
    // Weights of another model name what they lack.
    let err = exit_stderr(
        generate_one(&model, "\u{1}", &["--init", s(&ingot_names)]),
        1,
    );
    assert_mentions(&err, &["lacks", "as_gpt.safetensors"]);
}

/// `ingot generate --onnx ONNX --prompt PROMPT --tokens 1 EXTRA..`: one token, for the tests of
/// what an ONNX model must have before it can generate.
fn generate_one(onnx: &Path, prompt: &str, extra: &[&str]) -> (i32, String, String) {
    let base = [
        "generate",
        "--onnx",
        s(onnx),
        "--prompt",
        prompt,
        "--tokens",
        "1",
    ];
    run(&[&base[..], extra].concat())
}

#[test]
fn an_onnx_model_without_decoder_logits_is_an_error_listing_its_outputs() {
    let classifier =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../onnx/tests/torch/mlp/model.onnx");
    let err = exit_stderr(generate_one(&classifier, "a", &[]), 1);
    assert_mentions(&err, &["[batch, seq, vocab]", "classifier", "logits"]);
    let gpt2 = hf_gpt2("model.onnx");
    let err = exit_stderr(generate_one(&gpt2, "\u{1}", &["--logits", "scores"]), 1);
    assert_mentions(&err, &["\"scores\"", "logits"]);
}

// ---------------------------------------------------------------- several prompts

#[test]
fn several_prompts_at_once_each_get_the_tokens_they_get_alone() {
    let (onnx, weights) = hf_gpt2_and_as_gpt("rows");
    // Drawn at a temperature (each prompt its own draws from the seed), past a window slide.
    let draw = ["--tokens", "11", "--temperature", "1.5", "--seed", "9"];
    let models: [&[&str]; 3] = [
        // The file's batch of 2: the two prompts are its two rows.
        &["--onnx", s(&onnx)],
        // The built-in GPT's whole window at a batch of 2, and its decode step prompt by prompt.
        &[&as_gpt(&weights)[..], &["--whole-window"]].concat(),
        &as_gpt(&weights),
    ];
    for model in models {
        let together = generated(
            &[
                model,
                &["--prompt", PROMPTS[0], "--prompt", PROMPTS[1]],
                &draw,
            ]
            .concat(),
        );
        let alone: Vec<Vec<u64>> = PROMPTS
            .iter()
            .flat_map(|p| generated(&[model, &["--prompt", p], &draw].concat()))
            .collect();
        assert_eq!(together, alone, "{model:?}");
        assert_ne!(together[0], together[1], "{model:?}");
    }
    // Three prompts do not fit the file's batch of 2.
    let more = ["--prompt", "\u{2}", "--prompt", "\u{3}"];
    let err = exit_stderr(generate_one(&onnx, "\u{1}", &more), 1);
    assert_mentions(&err, &["3 prompts", "batch of 2"]);
}

#[test]
fn a_symbolic_window_axis_of_an_onnx_model_takes_its_size_from_dim() {
    // A model whose input is [2, "seq"] (an MLP over it, no decoder logits).
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../onnx/tests/fixtures/errors/symbolic_seq.onnx");
    let generate = |extra: &[&str]| generate_one(&path, "\u{1}", extra);
    let err = exit_stderr(generate(&[]), 1);
    assert_mentions(&err, &["axis 1", "\"seq\""]);
    // Sized, the import goes through, and what stops it is the model's outputs.
    let err = exit_stderr(generate(&["--dim", "seq=4"]), 1);
    assert!(
        !err.contains("is symbolic") && err.contains("[batch, seq, vocab]"),
        "{err}"
    );
    exit_stderr(generate(&["--dim", "seq=0"]), 2);
}

// ---------------------------------------------------------------- decoders with more inputs

/// Two small decoders of the same weights (scripts/decoder_inputs_fixture.py): `plain.onnx`
/// reads the token ids alone (its positions the constant 0..8); `inputs.onnx` also reads
/// `attention_mask` and `position_ids`, as transformers exports a decoder. Vocabulary 32, a
/// window of 8, a symbolic batch.
fn decoder(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/decoder_inputs")
        .join(file)
}

/// Both prompts, 12 tokens each (the window of 8 slides), from seed 4 at `temperature`.
fn draw(temperature: &str) -> Vec<&str> {
    draw_from(&PROMPTS, temperature)
}

#[test]
fn a_decoder_with_its_mask_held_at_one_and_its_positions_along_the_window_draws_the_tokens_of_the_same_decoder_without_those_inputs(
) {
    let inputs = decoder("inputs.onnx");
    let plain = decoder("plain.onnx");
    let held = [
        "--input-value",
        "attention_mask=1",
        "--input-value",
        "position_ids=positions",
    ];
    for temperature in ["0", "1"] {
        let reference = generated(&[&["--onnx", s(&plain)][..], &draw(temperature)].concat());
        let with_inputs =
            generated(&[&["--onnx", s(&inputs)][..], &held, &draw(temperature)].concat());
        assert_eq!(with_inputs, reference, "at temperature {temperature}");
        assert_eq!(reference.len(), 2);
        let distinct: std::collections::BTreeSet<u64> =
            reference.iter().flatten().copied().collect();
        assert!(
            distinct.len() >= 3,
            "too few distinct tokens to prove much: {reference:?}"
        );
    }
    // The positions are read: held at 0 instead, the tokens differ.
    let at_zero = generated(
        &[
            &["--onnx", s(&inputs)][..],
            &["--input-value", "attention_mask=1"],
            &["--input-value", "position_ids=0"],
            &draw("1"),
        ]
        .concat(),
    );
    let reference = generated(&[&["--onnx", s(&plain)][..], &draw("1")].concat());
    assert_ne!(at_zero, reference);
}

#[test]
fn a_decoder_input_given_no_value_is_refused_naming_it_and_the_flag() {
    let inputs = decoder("inputs.onnx");
    let generate = |extra: &[&str]| generate_one(&inputs, "\u{1}", extra);
    // Neither held: both named, each with a value that suits it.
    let err = exit_stderr(generate(&[]), 2);
    assert_mentions(
        &err,
        &[
            "(input_ids)",
            "--input-value attention_mask=1",
            "--input-value position_ids=positions",
        ],
    );
    // The mask held, the positions not: only they are named.
    let err = exit_stderr(generate(&["--input-value", "attention_mask=1"]), 2);
    assert!(
        err.contains("--input-value position_ids=positions") && !err.contains("attention_mask"),
        "{err}"
    );
    // A name the model does not have, and a value that is neither a number nor positions.
    let err = exit_stderr(generate(&["--input-value", "token_type_ids=0"]), 1);
    assert_mentions(&err, &["\"token_type_ids\"", "not a data input"]);
    let err = exit_stderr(generate(&["--input-value", "position_ids=position"]), 2);
    assert!(err.contains("positions"), "{err}");
}

#[test]
fn plan_takes_the_positions_with_the_same_flag_as_generate() {
    let inputs = decoder("inputs.onnx");
    let out = ok(&ingot(&[
        "plan",
        "--onnx",
        s(&inputs),
        "--loss",
        "cross-entropy",
        "--class-axis",
        "last",
        "--batch",
        "2",
        "--input-value",
        "attention_mask=1",
        "--input-value",
        "position_ids=positions",
        "--json",
    ]));
    assert!(out.contains("total_bytes"), "{out}");
}
