//! Files from the field (issue 50): a Hugging Face tokenizer.json encodes text as the Python
//! `tokenizers` library does, and GPT-2 weights made by transformers' own GPT2LMHeadModel,
//! under Hugging Face's and nanoGPT's names, give transformers' loss in Ingot's GPT and write
//! back bit for bit. The fixtures and the script that made them: tests/fixtures/tokenizer and
//! tests/fixtures/gpt2_names, scripts/tokenizer_fixture.py and scripts/gpt2_names_fixture.py.

use indexmap::IndexMap;
use ingot_runtime::io;
use ingot_runtime::tensor::Tensor;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::data::tokenizer::TextTokenizer;
use ingot_trainer::gpt_names::{self, Naming};
use ingot_trainer::session::Session;
use std::path::PathBuf;

fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path)
}

fn json(path: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixture(path)).unwrap()).unwrap()
}

// ---------------------------------------------------------------- tokenizer

#[test]
fn the_fixture_tokenizer_encodes_the_sample_as_the_python_library_does_and_decodes_it_back() {
    let tok = TextTokenizer::from_file(&fixture("tokenizer/tokenizer.json")).unwrap();
    let text = std::fs::read_to_string(fixture("tokenizer/sample.txt")).unwrap();
    let want: Vec<u32> = serde_json::from_value(json("tokenizer/sample_ids.json")).unwrap();
    let ids = tok.encode(&text).unwrap();
    assert_eq!(ids, want);
    assert_eq!(tok.vocab_size(), 512);
    // Pieces as small as can be (one a line start) give the ids of the whole text.
    assert_eq!(tok.encode_in_pieces(&text, 1).unwrap(), want);
    assert_eq!(tok.decode(&ids).unwrap(), text);
    let e = tok.decode(&[3, 512]).unwrap_err().to_string();
    assert_mentions(&e, &["512 at position 1", "tokenizer.json"]);
}

#[test]
fn a_missing_or_unparsable_tokenizer_is_an_error_naming_the_file() {
    let e = TextTokenizer::from_file(&fixture("tokenizer/nope.json")).unwrap_err();
    assert!(e.to_string().contains("nope.json"), "{e}");
    let e = TextTokenizer::from_file(&fixture("tokenizer/sample.txt")).unwrap_err();
    let e = e.to_string();
    assert_mentions(&e, &["sample.txt", "tokenizer"]);
}

// ---------------------------------------------------------------- GPT-2 names

/// The fixture's GPT under Ingot's names, on the CPU, with its batch.
fn session() -> Session {
    let cfg = json("gpt2_names/torch.json");
    let model = ingot_models::by_name(cfg["model"].as_str().unwrap()).unwrap();
    let mut s = Session::new(&model, 0).unwrap();
    let batch = io::load(fixture("gpt2_names/batch.safetensors")).unwrap();
    s.set_batch_map(&batch).unwrap();
    s
}

/// The fixture file `name` under Ingot's names, with the naming detected.
fn mapped(name: &str, s: &Session) -> (IndexMap<String, Tensor>, Naming, Vec<String>) {
    let file = io::load(fixture(&format!("gpt2_names/{name}"))).unwrap();
    let (naming, prefix) = gpt_names::detect(&file).expect("GPT-2 names");
    let (params, notes) = gpt_names::to_ingot(&file, &s.parameters(), naming, &prefix).unwrap();
    (params, naming, notes)
}

/// The first step's loss of the fixture's GPT with the weights of `name`.
fn first_loss(name: &str) -> f64 {
    let mut s = session();
    let (params, _, _) = mapped(name, &s);
    s.load_parameters(&params).unwrap();
    s.step().unwrap().loss
}

#[test]
fn a_transformers_gpt2_under_hugging_faces_names_gives_transformers_loss_in_ingots_gpt() {
    let want = json("gpt2_names/torch.json")["loss_f32"].as_f64().unwrap();
    let got = first_loss("hf.safetensors");
    // Far from ln(64) = 4.16, so a transposition or bias mapped wrongly would show.
    assert!((want - 64f64.ln()).abs() > 1.0, "{want}");
    assert!(
        (got - want).abs() <= 1e-5,
        "Ingot {got}, transformers {want}"
    );
}

#[test]
fn the_same_gpt2_under_nanogpts_names_gives_the_same_loss() {
    let want = json("gpt2_names/torch.json")["loss_f32"].as_f64().unwrap();
    let got = first_loss("nanogpt.safetensors");
    assert!(
        (got - want).abs() <= 1e-5,
        "Ingot {got}, transformers {want}"
    );
}

#[test]
fn the_naming_is_detected_and_the_tied_head_and_mask_buffers_are_told() {
    let s = session();
    let (hf, naming, notes) = mapped("hf.safetensors", &s);
    assert_eq!(naming, Naming::HuggingFace);
    assert_eq!(hf["head.weight"], hf["wte.weight"]);
    assert!(notes.iter().any(|n| n.contains("tied")), "{notes:?}");
    let (nano, naming, notes) = mapped("nanogpt.safetensors", &s);
    assert_eq!(naming, Naming::NanoGpt);
    assert_eq!(nano, hf, "the two files hold the same weights");
    assert!(
        notes.iter().any(|n| n.contains("ignored 2 causal-mask")),
        "{notes:?}"
    );
}

#[test]
fn weights_read_under_either_naming_write_back_bit_for_bit() {
    let s = session();
    for (name, naming) in [
        ("hf.safetensors", Naming::HuggingFace),
        ("nanogpt.safetensors", Naming::NanoGpt),
    ] {
        let file = io::load(fixture(&format!("gpt2_names/{name}"))).unwrap();
        let (params, _, _) = mapped(name, &s);
        let back = gpt_names::from_ingot(&params, naming).unwrap();
        let original: IndexMap<&String, &Tensor> = file
            .iter()
            .filter(|(n, _)| !n.ends_with(".attn.bias"))
            .collect();
        assert_eq!(back.len(), original.len(), "{name}");
        for (n, t) in &back {
            assert_eq!(t.ty, original[n].ty, "{name}: {n}");
            assert_eq!(t.to_le_bytes(), original[n].to_le_bytes(), "{name}: {n}");
        }
    }
}

#[test]
fn hub_names_without_the_transformer_prefix_and_a_longer_position_table_load_too() {
    let s = session();
    let file = io::load(fixture("gpt2_names/hf.safetensors")).unwrap();
    let (want, _, _) = mapped("hf.safetensors", &s);
    // As the hub's gpt2 files name them (GPT2Model's names), with GPT-2's mask buffers, and
    // a position table of twice the model's rows.
    let mut hub: IndexMap<String, Tensor> = file
        .iter()
        .map(|(n, t)| {
            (
                n.strip_prefix("transformer.").unwrap().to_string(),
                t.clone(),
            )
        })
        .collect();
    let wpe = &hub["wpe.weight"];
    let mut rows = wpe.as_f32().unwrap().to_vec();
    rows.extend(vec![9.0; rows.len()]);
    let (t, d) = (wpe.dims()[0], wpe.dims()[1]);
    hub.insert("wpe.weight".into(), Tensor::from_f32([2 * t, d], rows));
    hub.insert(
        "h.0.attn.bias".into(),
        Tensor::from_f32([1, 1, 1, 1], vec![1.0]),
    );
    hub.insert("h.1.attn.masked_bias".into(), Tensor::scalar(-1e4f32));
    let (naming, prefix) = gpt_names::detect(&hub).unwrap();
    assert_eq!((naming, prefix.as_str()), (Naming::HuggingFace, ""));
    let (got, notes) = gpt_names::to_ingot(&hub, &s.parameters(), naming, &prefix).unwrap();
    assert_eq!(got, want);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("first 16 of its 32 positions")),
        "{notes:?}"
    );
}

#[test]
fn a_missing_or_misshaped_tensor_is_an_error_naming_it_with_its_expected_and_found_shape() {
    let s = session();
    let file = io::load(fixture("gpt2_names/hf.safetensors")).unwrap();
    let try_map = |f: &IndexMap<String, Tensor>| {
        let (naming, prefix) = gpt_names::detect(f).unwrap();
        gpt_names::to_ingot(f, &s.parameters(), naming, &prefix).unwrap_err()
    };
    let mut missing = file.clone();
    missing.shift_remove("transformer.h.1.mlp.c_fc.bias");
    let e = try_map(&missing);
    assert_mentions(
        &e,
        &["transformer.h.1.mlp.c_fc.bias: missing", "blocks.1.fc.bias"],
    );
    // An nn.Linear layout under Hugging Face's names: c_proj is [d, d], so only c_fc shows it.
    let mut linear = file.clone();
    let fc = &file["transformer.h.0.mlp.c_fc.weight"];
    linear.insert(
        "transformer.h.0.mlp.c_fc.weight".into(),
        Tensor::from_f32([128, 32], fc.as_f32().unwrap().to_vec()),
    );
    let e = try_map(&linear);
    assert_mentions(
        &e,
        &[
            "transformer.h.0.mlp.c_fc.weight: expected shape",
            "f32[32,128] (Conv1D's [in, out]), found f32[128,32]",
        ],
    );
    let mut extra = file.clone();
    extra.insert(
        "transformer.h.2.ln_1.weight".into(),
        Tensor::from_f32([32], vec![1.0; 32]),
    );
    let e = try_map(&extra);
    assert_mentions(&e, &["transformer.h.2.ln_1.weight", "2 layer(s)"]);
    let e = gpt_names::from_ingot(&file, Naming::HuggingFace).unwrap_err();
    assert!(e.contains("not Ingot's GPT"), "{e}");
}
