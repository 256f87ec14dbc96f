//! The data path of issue 18: token and sample readers (every error path), batching, shuffle
//! determinism and epoch coverage, resume from a position, the loader thread, and the
//! text -> bytes -> token stream round trip.

use ingot_compiler::ir::DType;
use ingot_testkit::bytes::{f32s, i64s};
use ingot_testkit::text::assert_mentions;
use ingot_trainer::data::npy::encode;
use ingot_trainer::data::tokens::{LLMC_MAGIC_U16, LLMC_MAGIC_U32};
use ingot_trainer::data::*;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ingot-data-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn u16s(v: impl IntoIterator<Item = u16>) -> Vec<u8> {
    v.into_iter().flat_map(|t| t.to_le_bytes()).collect()
}

fn llmc(magic: i32, version: i32, count: i32, tokens: &[u8]) -> Vec<u8> {
    let mut h = vec![0i32; 256];
    h[0] = magic;
    h[1] = version;
    h[2] = count;
    let mut out: Vec<u8> = h.iter().flat_map(|w| w.to_le_bytes()).collect();
    out.extend(tokens);
    out
}

/// Every token of the stream, read through `TokenStream::read`.
fn all_tokens(s: &mut TokenStream, vocab: u64) -> Result<Vec<u64>, DataError> {
    let mut out = vec![0; s.len() as usize];
    s.read(0, s.len() as usize, vocab, |i, t| out[i] = t)?;
    Ok(out)
}

fn err_text<T: std::fmt::Debug>(r: Result<T, DataError>) -> String {
    r.unwrap_err().to_string()
}

fn slot(name: &str, dtype: DType, dims: &[usize]) -> InputSlot {
    InputSlot {
        name: name.into(),
        dtype,
        dims: dims.to_vec(),
    }
}

// ---------------------------------------------------------------- token readers

#[test]
fn a_raw_uint16_file_reads_back_its_tokens_and_an_odd_length_is_an_error() {
    let d = scratch("raw");
    let p = write(&d, "train.bin", &u16s([5, 0, 65535, 7]));
    let mut s = TokenStream::open(&p).unwrap();
    assert_eq!(s.format(), TokenFormat::RawU16);
    assert_eq!(all_tokens(&mut s, 65536).unwrap(), [5, 0, 65535, 7]);
    let mut part = vec![];
    s.read(1, 2, 65536, |_, t| part.push(t)).unwrap();
    assert_eq!(part, [0, 65535]);
    let e = err_text(s.read(3, 2, 65536, |_, _| {}));
    assert_mentions(&e, &["3..5", "holds 4"]);

    let p = write(&d, "odd.bin", &[1, 0, 2]);
    let e = err_text(TokenStream::open(&p));
    assert_mentions(&e, &["odd.bin", "length", "odd"]);
    let e = err_text(TokenStream::open(&d.join("missing.bin")));
    assert_mentions(&e, &["missing.bin", "cannot read"]);
}

#[test]
fn an_llmc_shard_is_recognised_by_its_header_and_its_tokens_follow_it() {
    let d = scratch("llmc");
    let p = write(
        &d,
        "s.bin",
        &llmc(LLMC_MAGIC_U16, 1, 3, &u16s([9, 8, 50256])),
    );
    let mut s = TokenStream::open(&p).unwrap();
    assert_eq!(
        s.format(),
        TokenFormat::LlmC {
            magic: LLMC_MAGIC_U16
        }
    );
    assert_eq!(all_tokens(&mut s, 50257).unwrap(), [9, 8, 50256]);

    let toks: Vec<u8> = [70000u32, 1].iter().flat_map(|t| t.to_le_bytes()).collect();
    let p = write(&d, "l3.bin", &llmc(LLMC_MAGIC_U32, 7, 2, &toks));
    let mut s = TokenStream::open(&p).unwrap();
    assert_eq!(all_tokens(&mut s, 128256).unwrap(), [70000, 1]);
}

#[test]
fn a_bad_llmc_header_is_an_error_naming_its_field() {
    let d = scratch("llmc-bad");
    let cases: [(&str, Vec<u8>, &str); 5] = [
        (
            "version",
            llmc(LLMC_MAGIC_U16, 2, 1, &u16s([1])),
            "version (int32 1)",
        ),
        (
            "count",
            llmc(LLMC_MAGIC_U16, 1, 5, &u16s([1, 2])),
            "token count (int32 2)",
        ),
        ("neg", llmc(LLMC_MAGIC_U16, 1, -1, &[]), "is negative"),
        (
            "long",
            llmc(LLMC_MAGIC_U32, 7, 1, &u16s([1, 2, 3])),
            "token count",
        ),
        (
            "short",
            llmc(LLMC_MAGIC_U16, 1, 1, &[])[..100].to_vec(),
            "fewer than the 1024",
        ),
    ];
    for (name, bytes, want) in cases {
        let p = write(&d, &format!("{name}.bin"), &bytes);
        let e = err_text(TokenStream::open(&p));
        assert!(
            e.contains(&format!("{name}.bin")) && e.contains(want),
            "{name}: {e}"
        );
    }
    // A truncated shard says so.
    let p = write(&d, "trunc.bin", &llmc(LLMC_MAGIC_U16, 1, 5, &u16s([1, 2])));
    assert!(err_text(TokenStream::open(&p)).contains("truncated"));
}

#[test]
fn npy_token_arrays_of_uint16_int32_and_int64_read_back() {
    let d = scratch("npy-tokens");
    let p = write(&d, "a.npy", &encode("<u2", &[3], &u16s([1, 2, 3])));
    let mut s = TokenStream::open(&p).unwrap();
    assert_eq!(s.format().to_string(), ".npy uint16");
    assert_eq!(all_tokens(&mut s, 10).unwrap(), [1, 2, 3]);
    let b: Vec<u8> = [4i32, 5].iter().flat_map(|t| t.to_le_bytes()).collect();
    let p = write(&d, "b.npy", &encode("<i4", &[2], &b));
    assert_eq!(
        all_tokens(&mut TokenStream::open(&p).unwrap(), 10).unwrap(),
        [4, 5]
    );
    let b: Vec<u8> = [6i64, 7].iter().flat_map(|t| t.to_le_bytes()).collect();
    let p = write(&d, "c.npy", &encode("<i8", &[2], &b));
    assert_eq!(
        all_tokens(&mut TokenStream::open(&p).unwrap(), 10).unwrap(),
        [6, 7]
    );
}

/// A version-1 npy file with `header` as its dict text and `data` after it.
fn npy_with(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

#[test]
fn a_malformed_npy_file_is_an_error_naming_the_file_and_the_field() {
    let d = scratch("npy-bad");
    let ok_dict = |descr: &str, fortran: &str, shape: &str| {
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}\n")
    };
    let mut v3 = encode("<u2", &[1], &u16s([1]));
    v3[6] = 9;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "2d",
            encode("<u2", &[2, 2], &u16s([1, 2, 3, 4])),
            "is not 1-D",
        ),
        ("float", encode("<f4", &[1], &[0; 4]), "not an integer type"),
        (
            "big",
            npy_with(&ok_dict(">u2", "False", "(1,)"), &[0, 1]),
            "big-endian",
        ),
        (
            "f16",
            npy_with(&ok_dict("<f2", "False", "(1,)"), &[0, 1]),
            "unsupported dtype",
        ),
        (
            "fortran",
            npy_with(&ok_dict("<u2", "True", "(2, 2)"), &[0; 8]),
            "Fortran",
        ),
        ("trunc", encode("<u2", &[4], &u16s([1, 2, 3])), "truncated"),
        (
            "long",
            encode("<u2", &[1], &u16s([1, 2])),
            "holds 4 bytes after the header",
        ),
        (
            "dict",
            npy_with("{'descr': '<u2', 'shape': (1,,), }", &[0, 0]),
            "at byte",
        ),
        (
            "nodescr",
            npy_with("{'fortran_order': False, 'shape': (1,), }", &[0, 0]),
            "no 'descr'",
        ),
        (
            "struct",
            npy_with(
                "{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (1,), }",
                &[0, 0],
            ),
            "structured",
        ),
        ("version", v3, "version 9.0"),
        (
            "hdrlen",
            {
                let mut b = encode("<u2", &[1], &u16s([1]));
                b[8] = 0xff;
                b[9] = 0xff;
                b.truncate(100);
                b
            },
            "header should end at byte",
        ),
        ("short", b"\x93NUMPY\x01".to_vec(), "ends inside the header"),
    ];
    for (name, bytes, want) in cases {
        let p = write(&d, &format!("{name}.npy"), &bytes);
        let e = err_text(TokenStream::open(&p));
        assert!(
            e.contains(&format!("{name}.npy")) && e.contains(want),
            "{name}: {e}"
        );
    }
    // A Fortran-order 1-D array is the same bytes as C order, and is accepted.
    let p = write(
        &d,
        "f1.npy",
        &npy_with(&ok_dict("<u2", "True", "(1,)"), &[3, 0]),
    );
    assert_eq!(
        all_tokens(&mut TokenStream::open(&p).unwrap(), 10).unwrap(),
        [3]
    );
}

#[test]
fn a_token_id_at_or_above_the_vocabulary_or_negative_is_an_error_naming_its_position() {
    let d = scratch("vocab");
    let p = write(&d, "t.bin", &u16s([1, 2, 300, 4]));
    let mut s = TokenStream::open(&p).unwrap();
    let e = s.check_ids(256).unwrap_err();
    assert_eq!(
        e,
        DataError::OutOfRange {
            file: p.clone(),
            what: "token id",
            position: 2,
            value: 300,
            bound: 256
        }
    );
    assert!(e
        .to_string()
        .contains("t.bin: token id 300 at position 2 is outside 0..256"));
    s.check_ids(301).unwrap();
    let b: Vec<u8> = [0i32, -1].iter().flat_map(|t| t.to_le_bytes()).collect();
    let p = write(&d, "n.npy", &encode("<i4", &[2], &b));
    let e = err_text(TokenStream::open(&p).unwrap().check_ids(10));
    assert!(e.contains("-1 at position 1"), "{e}");
}

// ---------------------------------------------------------------- sample readers

fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(|t| t.to_le_bytes()).collect()
}

fn i64_le(v: impl IntoIterator<Item = i64>) -> Vec<u8> {
    v.into_iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// A safetensors file written by the `safetensors` crate itself.
fn safetensors_file(tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.to_string(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// `n` samples of 3 features: sample i is [i, i + 0.5, -i]; its label i % classes.
fn sample_arrays(n: usize, classes: i64) -> (Vec<u8>, Vec<u8>) {
    let x = f32_bytes((0..n).flat_map(|i| [i as f32, i as f32 + 0.5, -(i as f32)]));
    let y = i64_le((0..n as i64).map(|i| i % classes));
    (x, y)
}

#[test]
fn samples_read_the_same_from_an_npy_pair_and_from_safetensors() {
    let d = scratch("samples");
    let (x, y) = sample_arrays(5, 3);
    write(&d, "x.npy", &encode("<f4", &[5, 3], &x));
    write(&d, "y.npy", &encode("<i8", &[5], &y));
    let st = write(
        &d,
        "d.safetensors",
        &safetensors_file(&[
            ("x", safetensors::Dtype::F32, vec![5, 3], x.clone()),
            ("y", safetensors::Dtype::I64, vec![5], y.clone()),
            ("other", safetensors::Dtype::U8, vec![2], vec![1, 2]),
        ]),
    );
    for path in [d.clone(), st] {
        let mut s = SampleSet::open(&path).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(f32s(s.features(4).unwrap()), [4.0, 4.5, -4.0]);
        assert_eq!(s.label(4, 3).unwrap(), 1);
        s.check_labels(3).unwrap();
        let e = s.check_labels(2).unwrap_err().to_string();
        assert!(e.contains("label 2 at position 2 is outside 0..2"), "{e}");
    }
}

#[test]
fn a_malformed_sample_set_is_an_error_naming_the_file_and_the_field() {
    let d = scratch("samples-bad");
    let (x, y) = sample_arrays(4, 2);
    let st = |t: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)]| safetensors_file(t);
    use safetensors::Dtype::*;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "noy",
            st(&[("x", F32, vec![4, 3], x.clone())]),
            "tensor \"y\": not in the file",
        ),
        (
            "count",
            st(&[
                ("x", F32, vec![4, 3], x.clone()),
                ("y", I64, vec![3], y[..24].to_vec()),
            ]),
            "3 samples in y but 4 in x",
        ),
        (
            "yfloat",
            st(&[
                ("x", F32, vec![4, 3], x.clone()),
                ("y", F32, vec![4], x[..16].to_vec()),
            ]),
            "labels must be integers",
        ),
        (
            "y2d",
            st(&[
                ("x", F32, vec![4, 3], x.clone()),
                ("y", I64, vec![2, 2], y.clone()),
            ]),
            "labels must be [n] or [n, 1]",
        ),
        (
            "f16",
            st(&[
                ("x", F16, vec![4, 3], x[..24].to_vec()),
                ("y", I64, vec![4], y.clone()),
            ]),
            "F16 is not supported",
        ),
        (
            "trunc",
            st(&[
                ("x", F32, vec![4, 3], x.clone()),
                ("y", I64, vec![4], y.clone()),
            ])[..100]
                .to_vec(),
            "truncated",
        ),
        ("hdr", u64::MAX.to_le_bytes().to_vec(), "longer than"),
        ("tiny", vec![1, 2, 3], "holds only 3 bytes"),
        (
            "json",
            {
                let mut b = 5u64.to_le_bytes().to_vec();
                b.extend(b"{\"x\":");
                b
            },
            "not valid JSON",
        ),
        (
            "offsets",
            {
                let mut b = br#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,8]},"y":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#.to_vec();
                let mut f = (b.len() as u64).to_le_bytes().to_vec();
                f.append(&mut b);
                f.extend([0u8; 8]);
                f
            },
            "data_offsets",
        ),
        (
            "npy",
            encode("<u2", &[1], &[0, 0]),
            "give the directory holding x.npy and y.npy",
        ),
    ];
    for (name, bytes, want) in cases {
        let p = write(&d, &format!("{name}.safetensors"), &bytes);
        let e = err_text(SampleSet::open(&p));
        assert!(
            e.contains(&format!("{name}.safetensors")) && e.contains(want),
            "{name}: {e}"
        );
    }
    // An npy pair whose y is missing names y.npy.
    let pair = d.join("pair");
    std::fs::create_dir_all(&pair).unwrap();
    write(&pair, "x.npy", &encode("<f4", &[4, 3], &x));
    let e = err_text(SampleSet::open(&pair));
    assert_mentions(&e, &["y.npy", "cannot read"]);
}

// ---------------------------------------------------------------- token batches

/// A raw token file whose token at position i is i % modulo.
fn counting_tokens(dir: &Path, n: usize, modulo: usize) -> PathBuf {
    write(
        dir,
        "tokens.bin",
        &u16s((0..n).map(|i| (i % modulo) as u16)),
    )
}

fn token_source(path: &Path, batch: usize, seq: usize, order: Order, seed: u64) -> TokenBatches {
    TokenBatches::new(
        TokenStream::open(path).unwrap(),
        slot("x", DType::I64, &[batch, seq]),
        slot("y", DType::I64, &[batch, seq]),
        65536,
        order,
        seed,
    )
    .unwrap()
}

/// Every batch of `epochs` epochs, as (x, y) element vectors.
fn collect<S: BatchSource>(e: &mut Epochs<S>, count: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let (xb, yb) = (e.source().x().bytes(), e.source().y().bytes());
    let mut out = vec![];
    for _ in 0..count {
        let (mut x, mut y) = (vec![0u8; xb], vec![0u8; yb]);
        if e.next_into(&mut x, &mut y).unwrap().is_none() {
            break;
        }
        out.push((x, y));
    }
    out
}

#[test]
fn in_order_token_batches_are_consecutive_rows_with_y_the_next_token_of_x() {
    let d = scratch("tok-seq");
    let p = counting_tokens(&d, 50, 1000);
    let src = token_source(&p, 2, 4, Order::Sequential, 0);
    // 49 / 4 = 12 rows, 6 batches; 6*2*4 + 1 = 49 tokens used, 1 dropped.
    assert_eq!(src.batches_per_epoch(), 6);
    assert_eq!(
        src.dropped_per_epoch(),
        Dropped {
            count: 1,
            unit: "tokens"
        }
    );
    let mut e = Epochs::new(src).epochs(2);
    let batches = collect(&mut e, 100);
    assert_eq!(batches.len(), 12, "two epochs of six batches, then the end");
    let (x, y) = &batches[1];
    assert_eq!(i64s(x), [8, 9, 10, 11, 12, 13, 14, 15]);
    assert_eq!(i64s(y), [9, 10, 11, 12, 13, 14, 15, 16]);
    assert_eq!(batches[7], batches[1], "epoch 1 repeats epoch 0 in order");
}

#[test]
fn random_token_batches_are_windows_at_seeded_offsets_inside_the_file() {
    let d = scratch("tok-rand");
    let p = counting_tokens(&d, 200, 1000);
    let mut a = Epochs::new(token_source(&p, 3, 5, Order::Random, 7));
    let mut b = Epochs::new(token_source(&p, 3, 5, Order::Random, 7));
    let mut c = Epochs::new(token_source(&p, 3, 5, Order::Random, 8));
    let (ba, bb, bc) = (
        collect(&mut a, 20),
        collect(&mut b, 20),
        collect(&mut c, 20),
    );
    assert_eq!(ba, bb, "the same seed gives the same batches");
    assert_ne!(ba, bc, "another seed gives other batches");
    let mut starts = std::collections::BTreeSet::new();
    for (x, y) in &ba {
        let (x, y) = (i64s(x), i64s(y));
        for r in 0..3 {
            let row = &x[r * 5..r * 5 + 5];
            starts.insert(row[0]);
            assert!(row[0] + 5 < 200, "a window runs past the end");
            for j in 0..5 {
                assert_eq!(row[j], row[0] + j as i64);
                assert_eq!(y[r * 5 + j], row[j] + 1);
            }
        }
    }
    assert!(
        starts.len() > 30,
        "offsets are spread: {} distinct",
        starts.len()
    );
}

#[test]
fn a_token_file_that_cannot_fill_one_batch_or_does_not_fit_the_model_is_an_error() {
    let d = scratch("tok-small");
    let p = counting_tokens(&d, 8, 100);
    let e = TokenBatches::new(
        TokenStream::open(&p).unwrap(),
        slot("x", DType::I64, &[2, 4]),
        slot("y", DType::I64, &[2, 4]),
        100,
        Order::Random,
        0,
    )
    .unwrap_err();
    assert!(matches!(e, DataError::TooSmall { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("tokens.bin: 8 tokens cannot fill one batch")
            && e.to_string().contains("at least 9")
    );
    let e = err_text(TokenBatches::new(
        TokenStream::open(&p).unwrap(),
        slot("x", DType::F32, &[1, 4]),
        slot("y", DType::I64, &[1, 4]),
        100,
        Order::Random,
        0,
    ));
    assert!(e.contains("token ids need an integer input"), "{e}");
    // A model whose inputs are not token ids (the mlp's x is features) is refused by name.
    let mlp = ingot_models::by_name("mlp").unwrap().graph;
    let e = err_text(TokenBatches::for_graph(
        TokenStream::open(&p).unwrap(),
        &mlp,
        Order::Random,
        0,
    ));
    assert!(
        e.contains("tokens.bin: the model's input y is [256] but x is [256, 784]"),
        "{e}"
    );
    // A token out of the model's vocabulary, met while cutting a batch, names its position.
    let p = write(&d, "big.bin", &u16s([1, 2, 3, 99, 4]));
    let mut e = Epochs::new(
        TokenBatches::new(
            TokenStream::open(&p).unwrap(),
            slot("x", DType::I64, &[1, 4]),
            slot("y", DType::I64, &[1, 4]),
            50,
            Order::Sequential,
            0,
        )
        .unwrap(),
    );
    let (mut x, mut y) = (vec![0; 32], vec![0; 32]);
    let err = e.next_into(&mut x, &mut y).unwrap_err().to_string();
    assert!(
        err.contains("big.bin: token id 99 at position 3 is outside 0..50"),
        "{err}"
    );
}

#[test]
fn token_batches_fill_a_gpts_inputs_as_the_synthetic_batch_does() {
    let d = scratch("tok-gpt");
    let p = counting_tokens(&d, 500, 37);
    let g = ingot_models::by_name("gpt:vocab=37,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=3")
        .unwrap()
        .graph;
    let src =
        TokenBatches::for_graph(TokenStream::open(&p).unwrap(), &g, Order::Random, 1).unwrap();
    let synthetic = ingot_trainer::init::synthetic_batch(&g, 0);
    let (xs, ys) = (src.x().clone(), src.y().clone());
    let mut e = Epochs::new(src);
    let (mut x, mut y) = (vec![0; xs.bytes()], vec![0; ys.bytes()]);
    e.next_into(&mut x, &mut y).unwrap().unwrap();
    let (tx, ty) = (xs.to_tensor(&x).unwrap(), ys.to_tensor(&y).unwrap());
    assert_eq!(tx.ty, synthetic["x"].ty);
    assert_eq!(ty.ty, synthetic["y"].ty);
    let (xv, yv) = (tx.as_i64().unwrap(), ty.as_i64().unwrap());
    assert!(xv.iter().all(|&t| (0..37).contains(&t)));
    assert_eq!(xv[1], yv[0], "y is x shifted by one token");
    // A vocabulary smaller than the file's ids is caught while cutting.
    let g = ingot_models::by_name("gpt:vocab=20,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=3")
        .unwrap()
        .graph;
    let src =
        TokenBatches::for_graph(TokenStream::open(&p).unwrap(), &g, Order::Sequential, 1).unwrap();
    let e = err_text(Epochs::new(src).next_into(&mut x, &mut y));
    assert!(
        e.contains("token id 20 at position 20 is outside 0..20"),
        "{e}"
    );
}

// ---------------------------------------------------------------- sample batches

fn sample_source(dir: &Path, n: usize, batch: usize, shuffle: bool, seed: u64) -> SampleBatches {
    let (x, y) = sample_arrays(n, 7);
    write(dir, "x.npy", &encode("<f4", &[n, 3], &x));
    write(dir, "y.npy", &encode("<i8", &[n], &y));
    SampleBatches::new(
        SampleSet::open(dir).unwrap(),
        slot("x", DType::F32, &[batch, 3]),
        slot("y", DType::I64, &[batch]),
        7,
        shuffle,
        seed,
    )
    .unwrap()
}

#[test]
fn a_shuffled_epoch_gives_every_sample_once_except_the_dropped_remainder() {
    let d = scratch("smp-epoch");
    let mut src = sample_source(&d, 23, 4, true, 11);
    assert_eq!(src.batches_per_epoch(), 5);
    assert_eq!(
        src.dropped_per_epoch(),
        Dropped {
            count: 3,
            unit: "samples"
        }
    );
    let mut orders = vec![];
    for epoch in 0..3 {
        let mut seen: Vec<u32> = (0..5)
            .flat_map(|b| src.samples_of(epoch, b).to_vec())
            .collect();
        orders.push(seen.clone());
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 20, "epoch {epoch}: 20 distinct samples");
    }
    assert_ne!(orders[0], orders[1], "each epoch has its own order");
    let mut again = sample_source(&scratch("smp-epoch2"), 23, 4, true, 11);
    assert_eq!(
        again.samples_of(1, 0),
        &orders[1][..4],
        "the same seed, the same order"
    );
    // The batch holds those samples' features and labels.
    let mut e = Epochs::new(src);
    let (mut x, mut y) = (vec![0; 48], vec![0; 32]);
    e.next_into(&mut x, &mut y).unwrap();
    let (x, y) = (f32s(&x), i64s(&y));
    for r in 0..4 {
        let i = orders[0][r] as f32;
        assert_eq!(&x[r * 3..r * 3 + 3], &[i, i + 0.5, -i]);
        assert_eq!(y[r], orders[0][r] as i64 % 7);
    }
    // Without shuffle, the file's order.
    let mut plain = sample_source(&scratch("smp-plain"), 23, 4, false, 11);
    assert_eq!(plain.samples_of(2, 1), &[4, 5, 6, 7]);
}

#[test]
fn a_sample_set_that_cannot_fill_one_batch_or_misfits_the_model_is_an_error() {
    let d = scratch("smp-bad");
    let (x, y) = sample_arrays(3, 7);
    write(&d, "x.npy", &encode("<f4", &[3, 3], &x));
    write(&d, "y.npy", &encode("<i8", &[3], &y));
    let make = |xs: InputSlot, ys: InputSlot, classes| {
        SampleBatches::new(SampleSet::open(&d).unwrap(), xs, ys, classes, true, 0)
    };
    let e = err_text(make(
        slot("x", DType::F32, &[4, 3]),
        slot("y", DType::I64, &[4]),
        7,
    ));
    assert!(
        e.contains("x.npy: 3 samples cannot fill one batch of 4"),
        "{e}"
    );
    let e = err_text(make(
        slot("x", DType::F32, &[2, 4]),
        slot("y", DType::I64, &[2]),
        7,
    ));
    assert_mentions(&e, &["x.npy", "takes [4]"]);
    let e = err_text(make(
        slot("x", DType::I64, &[2, 3]),
        slot("y", DType::I64, &[2]),
        7,
    ));
    assert!(
        e.contains("x holds float32 but the model's input x is i64"),
        "{e}"
    );
    // A label outside the model's classes, met in a batch, names y's file and the sample.
    let src = make(
        slot("x", DType::F32, &[3, 3]),
        slot("y", DType::I64, &[3]),
        2,
    )
    .unwrap();
    let (mut xb, mut yb) = (vec![0; 36], vec![0; 24]);
    let e = err_text(Epochs::new(src).next_into(&mut xb, &mut yb));
    assert!(
        e.contains("y.npy: label 2 at position 2 is outside 0..2"),
        "{e}"
    );
}

#[test]
fn the_mlp_takes_sample_batches_from_uint8_images() {
    let d = scratch("smp-mlp");
    let n = 70;
    let x: Vec<u8> = (0..n * 784).map(|i| (i % 251) as u8).collect();
    let y: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    write(&d, "x.npy", &encode("|u1", &[n, 28, 28], &x));
    write(&d, "y.npy", &encode("|u1", &[n], &y));
    let g = ingot_models::mlp_with(8, DType::F32).unwrap().graph;
    let src = SampleBatches::for_graph(SampleSet::open(&d).unwrap(), &g, true, 3).unwrap();
    let batch = src.x().dims[0];
    assert_eq!(src.batches_per_epoch(), (n / batch) as u64);
    let (xs, ys) = (src.x().clone(), src.y().clone());
    let mut e = Epochs::new(src);
    let (mut xb, mut yb) = (vec![0; xs.bytes()], vec![0; ys.bytes()]);
    e.next_into(&mut xb, &mut yb).unwrap().unwrap();
    let sample = i64s(&yb)[0] as usize; // label = index % 10; check its pixels match one such index
    let first = f32s(&xb)[..784].to_vec();
    // uint8 pixels into a float input are scaled to [0, 1] (torchvision's ToTensor).
    assert!((0..n)
        .filter(|i| i % 10 == sample)
        .any(|i| { (0..784).all(|j| first[j] == ((i * 784 + j) % 251) as u8 as f32 / 255.0) }));
}

// ---------------------------------------------------------------- image arrays

/// The pixel of image `i` at channel `c`, row `h`, column `w` (a uint8 pattern).
fn pixel(i: usize, c: usize, h: usize, w: usize) -> u8 {
    ((i * 131 + c * 71 + h * 13 + w * 7) % 256) as u8
}

/// The first batch of `source` (unshuffled) as f32s and i64s.
fn first_batch(source: SampleBatches) -> (Vec<f32>, Vec<i64>) {
    let (xs, ys) = (source.x().clone(), source.y().clone());
    let mut e = Epochs::new(source);
    let (mut xb, mut yb) = (vec![0; xs.bytes()], vec![0; ys.bytes()]);
    e.next_into(&mut xb, &mut yb).unwrap().unwrap();
    (f32s(&xb), i64s(&yb))
}

/// resnet18's input at batch 2: `[2, 3, 32, 32]` f32.
fn resnet_graph() -> ingot_compiler::ir::Graph {
    ingot_models::resnet18_with(2, DType::F32).unwrap().graph
}

#[test]
fn nhwc_uint8_images_are_read_as_nchw_floats_in_zero_to_one() {
    let d = scratch("img-nhwc");
    let (n, side) = (5, 32);
    let mut x = Vec::with_capacity(n * side * side * 3);
    for i in 0..n {
        for h in 0..side {
            for w in 0..side {
                for c in 0..3 {
                    x.push(pixel(i, c, h, w));
                }
            }
        }
    }
    let y: Vec<u8> = (0..n as i64).flat_map(|i| (i % 10).to_le_bytes()).collect();
    write(&d, "x.npy", &encode("|u1", &[n, side, side, 3], &x));
    write(&d, "y.npy", &encode("<i8", &[n], &y));
    let src =
        SampleBatches::for_graph(SampleSet::open(&d).unwrap(), &resnet_graph(), false, 1).unwrap();
    let (xb, yb) = first_batch(src);
    assert_eq!(yb, [0, 1]);
    for r in 0..2 {
        for c in 0..3 {
            for h in 0..side {
                for w in 0..side {
                    let got = xb[((r * 3 + c) * side + h) * side + w];
                    assert_eq!(got, pixel(r, c, h, w) as f32 / 255.0, "{r} {c} {h} {w}");
                }
            }
        }
    }
    assert!(xb.iter().all(|v| (0.0..=1.0).contains(v)));
}

#[test]
fn nchw_f32_images_in_safetensors_are_read_as_they_are() {
    let d = scratch("img-nchw");
    let (n, side) = (3, 32);
    let vals: Vec<f32> = (0..n * 3 * side * side)
        .map(|k| k as f32 * 0.5 - 7.0)
        .collect();
    let x: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let y: Vec<u8> = [4i64, 5, 6].iter().flat_map(|v| v.to_le_bytes()).collect();
    let st = write(
        &d,
        "images.safetensors",
        &safetensors_file(&[
            ("x", safetensors::Dtype::F32, vec![n, 3, side, side], x),
            ("y", safetensors::Dtype::I64, vec![n], y),
        ]),
    );
    let src =
        SampleBatches::for_graph(SampleSet::open(&st).unwrap(), &resnet_graph(), false, 1).unwrap();
    let (xb, yb) = first_batch(src);
    assert_eq!(yb, [4, 5]);
    assert_eq!(xb, vals[..2 * 3 * side * side]);
}

#[test]
fn image_arrays_that_fit_neither_layout_or_are_corrupt_are_errors_naming_the_file() {
    let d = scratch("img-bad");
    let y: Vec<u8> = (0..4i64).flat_map(|i| i.to_le_bytes()).collect();
    write(&d, "y.npy", &encode("<i8", &[4], &y));
    let open = |d: &Path| {
        SampleSet::open(d)
            .and_then(|s| SampleBatches::for_graph(s, &resnet_graph(), false, 1))
            .map(|_| ())
    };
    // Right element count, wrong image shape: neither [3, 32, 32] nor [32, 32, 3].
    write(&d, "x.npy", &encode("|u1", &[4, 32, 3, 32], &[0; 4 * 3072]));
    let e = err_text(open(&d));
    assert_mentions(&e, &["x.npy", "[32, 3, 32]", "NHWC [32, 32, 3]"]);
    // A truncated file: the header promises 4 images, the data holds 3 and a half.
    let full = encode("|u1", &[4, 32, 32, 3], &[0; 4 * 3072]);
    write(&d, "x.npy", &full[..full.len() - 1536]);
    let e = err_text(open(&d));
    assert!(e.contains("x.npy"), "{e}");
    assert_mentions(&e, &["12288 bytes", "truncated"]);
    // Garbage where the header should be.
    write(&d, "x.npy", b"\x93NUMPY\x01\x00\xff\xffnot a header at all");
    let e = err_text(open(&d));
    assert!(e.contains("x.npy"), "{e}");
    // Float labels.
    write(&d, "x.npy", &full);
    write(&d, "y.npy", &encode("<f4", &[4], &[0; 16]));
    let e = err_text(open(&d));
    assert_mentions(&e, &["y.npy", "integers"]);
}

// ---------------------------------------------------------------- resume

fn resume_matches<S: BatchSource>(make: impl Fn() -> S, skip: usize, more: usize) {
    let mut run = Epochs::new(make());
    collect(&mut run, skip);
    let at = run.position();
    let tail = collect(&mut run, more);
    let mut resumed = Epochs::new(make());
    resumed.restore(at).unwrap();
    assert_eq!(resumed.position(), at);
    assert_eq!(collect(&mut resumed, more), tail, "resumed at {at:?}");
}

#[test]
fn a_cursor_restored_mid_epoch_gives_the_same_batches_as_the_run_that_went_on() {
    let d = scratch("resume");
    let p = counting_tokens(&d, 300, 1000);
    for skip in [0, 3, 7, 9, 13] {
        resume_matches(|| token_source(&p, 2, 6, Order::Random, 5), skip, 12);
        resume_matches(|| token_source(&p, 2, 6, Order::Sequential, 5), skip, 12);
    }
    let sd = scratch("resume-s");
    for skip in [0, 2, 5, 6, 11] {
        resume_matches(|| sample_source(&sd, 27, 5, true, 9), skip, 8);
    }
}

#[test]
fn restoring_a_position_of_another_seed_or_past_an_epoch_is_an_error() {
    let d = scratch("restore-bad");
    let p = counting_tokens(&d, 100, 1000);
    let mut e = Epochs::new(token_source(&p, 2, 6, Order::Random, 5));
    let per = e.source().batches_per_epoch();
    assert!(e
        .restore(Position {
            epoch: 1,
            batch: 0,
            seed: 6
        })
        .unwrap_err()
        .contains("seed 6"));
    assert!(e
        .restore(Position {
            epoch: 1,
            batch: per + 1,
            seed: 5
        })
        .unwrap_err()
        .contains("past the"));
    e.restore(Position {
        epoch: 1,
        batch: per,
        seed: 5,
    })
    .unwrap();
    assert_eq!(
        e.position(),
        Position {
            epoch: 2,
            batch: 0,
            seed: 5
        }
    );
    let (mut x, mut y) = (vec![0; 96], vec![0; 96]);
    let info = e.next_into(&mut x, &mut y).unwrap().unwrap();
    assert!(info.first_of_epoch && info.epoch == 2);
    assert_eq!(
        info.next,
        Position {
            epoch: 2,
            batch: 1,
            seed: 5
        }
    );
}

// ---------------------------------------------------------------- loader thread

#[test]
fn the_loader_thread_gives_the_cursors_batches_in_order_in_two_reused_buffers() {
    let d = scratch("loader");
    let p = counting_tokens(&d, 400, 1000);
    let expect = collect(
        &mut Epochs::new(token_source(&p, 2, 8, Order::Random, 3)).epochs(2),
        1000,
    );
    let src = token_source(&p, 2, 8, Order::Random, 3);
    let (xb, yb) = (src.x().bytes(), src.y().bytes());
    let buffers = [0, 1].map(|_| Staging {
        x: vec![0u8; xb],
        y: vec![0u8; yb],
    });
    let mut loader = Loader::spawn(Epochs::new(src).epochs(2), buffers).unwrap();
    let mut got = vec![];
    let mut indices = vec![];
    while let Some(b) = loader.next_batch().unwrap() {
        got.push((b.x.clone(), b.y.clone()));
        indices.push(b.index());
    }
    assert_eq!(got, expect);
    assert!(
        indices.windows(2).all(|w| w[0] != w[1]),
        "the two buffers alternate"
    );
    assert!(loader.next_batch().unwrap().is_none());
    let back = loader.into_buffers();
    assert_eq!(back[0].x.len(), xb);

    let small = [0, 1].map(|_| Staging {
        x: vec![0u8; xb - 1],
        y: vec![0u8; yb],
    });
    let e = Loader::spawn(Epochs::new(token_source(&p, 2, 8, Order::Random, 3)), small)
        .err()
        .unwrap();
    assert!(e.to_string().contains("staging buffer 0"), "{e}");
}

#[test]
fn a_reader_error_in_the_loader_thread_reaches_the_caller_after_the_good_batches() {
    let d = scratch("loader-err");
    let mut toks: Vec<u16> = (0..100).collect();
    toks[40] = 900;
    let p = write(&d, "t.bin", &u16s(toks));
    let src = TokenBatches::new(
        TokenStream::open(&p).unwrap(),
        slot("x", DType::I64, &[1, 10]),
        slot("y", DType::I64, &[1, 10]),
        500,
        Order::Sequential,
        0,
    )
    .unwrap();
    let buffers = [0, 1].map(|_| Staging {
        x: vec![0u8; 80],
        y: vec![0u8; 80],
    });
    let mut loader = Loader::spawn(Epochs::new(src), buffers).unwrap();
    for b in 0..3 {
        assert_eq!(loader.next_batch().unwrap().unwrap().info.batch, b);
    }
    let e = loader.next_batch().err().unwrap().to_string();
    assert!(e.contains("t.bin: token id 900 at position 40"), "{e}");
    assert!(
        loader.next_batch().unwrap().is_none(),
        "nothing after the error"
    );
}

// ---------------------------------------------------------------- bytes round trip

#[test]
fn a_text_written_as_byte_tokens_reads_back_as_the_same_bytes() {
    let d = scratch("bytes");
    let text = "Ingot plans memory.\nÜber ñ — 日本\n";
    let input = write(&d, "in.txt", text.as_bytes());
    let out = d.join("out.bin");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["data", "bytes"])
        .arg(&input)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(
        said.contains(&format!("{} tokens (vocabulary 256", text.len())),
        "{said}"
    );
    let mut s = TokenStream::open(&out).unwrap();
    assert_eq!(s.format(), TokenFormat::RawU16);
    let back: Vec<u8> = all_tokens(&mut s, 256)
        .unwrap()
        .iter()
        .map(|&t| t as u8)
        .collect();
    assert_eq!(back, text.as_bytes());
    let files: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
    assert_eq!(
        files.len(),
        2,
        "no temporary file is left beside the output"
    );
    let failed = std::process::Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["data", "bytes"])
        .arg(d.join("nope.txt"))
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&failed.stderr).contains("nope.txt: cannot read it"));
}

// ---------------------------------------------------------------- tokenize

/// The trainer's tokenizer fixture (made by scripts/tokenizer_fixture.py).
fn tokenizer_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../trainer/tests/fixtures/tokenizer")
        .join(name)
}

/// `ingot data tokenize` with `args` after the subcommand: exit code, stdout, stderr.
fn tokenize(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["data", "tokenize"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_tokenized_text_holds_the_python_librarys_ids_in_each_layout_the_loader_reads() {
    let d = scratch("tokenize");
    let tok = tokenizer_fixture("tokenizer.json");
    let sample = tokenizer_fixture("sample.txt");
    let want: Vec<u64> =
        serde_json::from_slice(&std::fs::read(tokenizer_fixture("sample_ids.json")).unwrap())
            .unwrap();
    for (flags, format) in [
        (
            &[][..],
            TokenFormat::LlmC {
                magic: LLMC_MAGIC_U16,
            },
        ),
        (
            &["--dtype", "u32"][..],
            TokenFormat::LlmC {
                magic: LLMC_MAGIC_U32,
            },
        ),
        (&["--raw"][..], TokenFormat::RawU16),
    ] {
        let out = d.join("out.bin");
        let mut args = vec![
            "--tokenizer".as_ref(),
            tok.as_os_str(),
            sample.as_os_str(),
            out.as_os_str(),
        ];
        args.extend(flags.iter().map(std::ffi::OsStr::new));
        let (code, said, err) = tokenize(&args);
        assert_eq!(code, Some(0), "{flags:?}: {err}");
        assert!(
            said.contains(&format!("{} tokens (vocabulary 512", want.len())),
            "{said}"
        );
        let mut s = TokenStream::open(&out).unwrap();
        assert_eq!(s.format(), format, "{flags:?}");
        assert_eq!(all_tokens(&mut s, 512).unwrap(), want, "{flags:?}");
    }
}

#[test]
fn tokenize_names_a_missing_or_unreadable_tokenizer_and_refuses_raw_u32() {
    let d = scratch("tokenize-errors");
    let sample = tokenizer_fixture("sample.txt");
    let out = d.join("out.bin");
    let nope = d.join("nope.json");
    let (code, _, err) = tokenize(&[
        "--tokenizer".as_ref(),
        nope.as_os_str(),
        sample.as_os_str(),
        out.as_os_str(),
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("nope.json"), "{err}");
    let bad = write(&d, "bad.json", b"{\"model\": 3}");
    let (code, _, err) = tokenize(&[
        "--tokenizer".as_ref(),
        bad.as_os_str(),
        sample.as_os_str(),
        out.as_os_str(),
    ]);
    assert_eq!(code, Some(1));
    assert_mentions(&err, &["bad.json", "tokenizer"]);
    let tok = tokenizer_fixture("tokenizer.json");
    let (code, _, err) = tokenize(&[
        "--tokenizer".as_ref(),
        tok.as_os_str(),
        sample.as_os_str(),
        out.as_os_str(),
        "--raw".as_ref(),
        "--dtype".as_ref(),
        "u32".as_ref(),
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--raw"), "{err}");
    assert!(!out.exists(), "nothing is written on error");
}

// ---------------------------------------------------------------- fuzz

/// Opens `bytes` as every kind of data file and reads all it can; only errors may come back.
fn read_everything(dir: &Path, bytes: &[u8]) {
    let p = write(dir, "f.bin", bytes);
    if let Ok(mut s) = TokenStream::open(&p) {
        let n = s.len().min(1 << 16) as usize;
        let _ = s.read(0, n, 1 << 20, |_, _| {});
        let _ = s.check_ids(300);
    }
    // As safetensors, and as both arrays of an npy pair.
    for mut s in [SampleSet::open(&p), SampleSet::open_npy(&p, &p)]
        .into_iter()
        .flatten()
    {
        let _ = s.check_labels(3);
        if !s.is_empty() && s.x().row_elems() < 1 << 16 {
            let _ = s.features(s.len() - 1);
        }
    }
}

fn valid_files() -> Vec<Vec<u8>> {
    let (x, y) = sample_arrays(3, 2);
    vec![
        encode("<u2", &[4], &u16s([1, 2, 3, 4])),
        encode("<i8", &[2, 1], &i64_le([1, 0])),
        encode("<f4", &[3, 3], &x),
        llmc(LLMC_MAGIC_U16, 1, 2, &u16s([1, 2])),
        safetensors_file(&[
            ("x", safetensors::Dtype::F32, vec![3, 3], x),
            ("y", safetensors::Dtype::I64, vec![3], y),
        ]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_as_any_data_file_give_errors_not_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        prefix in 0usize..4,
    ) {
        let d = scratch("fuzz-random");
        // Begin with each format's magic now and then, so the parsers past it are reached.
        let mut b: Vec<u8> = match prefix {
            0 => b"\x93NUMPY\x01\x00".to_vec(),
            1 => LLMC_MAGIC_U16.to_le_bytes().to_vec(),
            2 => (bytes.len() as u64 / 2).to_le_bytes().to_vec(),
            _ => vec![],
        };
        b.extend(&bytes);
        read_everything(&d, &b);
    }

    #[test]
    fn a_valid_file_with_bytes_changed_or_cut_gives_errors_not_panics(
        which in 0usize..5,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let d = scratch("fuzz-edit");
        let mut b = valid_files().swap_remove(which);
        for (at, v) in edits {
            let i = at.index(b.len());
            b[i] = v;
        }
        if do_cut {
            b.truncate(cut.index(b.len()));
        }
        read_everything(&d, &b);
    }
}

// ---------------------------------------------------------------- end to end

#[test]
fn a_loader_restarted_from_a_staged_batchs_next_position_continues_the_same_batches() {
    let d = scratch("loader-resume");
    let p = counting_tokens(&d, 300, 1000);
    let buffers = || {
        [0, 1].map(|_| Staging {
            x: vec![0u8; 96],
            y: vec![0u8; 96],
        })
    };
    let mut whole = Loader::spawn(
        Epochs::new(token_source(&p, 2, 6, Order::Random, 4)),
        buffers(),
    )
    .unwrap();
    let mut saved = None;
    let mut tail = vec![];
    for step in 0..40 {
        let b = whole.next_batch().unwrap().unwrap();
        if step == 29 {
            saved = Some(b.info.next); // as a checkpoint after step 30 would save it
        } else if step > 29 {
            tail.push(b.x.clone());
        }
    }
    let mut epochs = Epochs::new(token_source(&p, 2, 6, Order::Random, 4));
    epochs.restore(saved.unwrap()).unwrap();
    let mut resumed = Loader::spawn(epochs, buffers()).unwrap();
    let again: Vec<Vec<u8>> = (0..10)
        .map(|_| resumed.next_batch().unwrap().unwrap().x.clone())
        .collect();
    assert_eq!(again, tail);
}

#[test]
fn a_byte_level_gpt_trains_two_epochs_on_a_text_through_the_loader() {
    let d = scratch("e2e");
    let text: String = (0..200)
        .map(|i| format!("the cat {} sat on the mat. ", ["red", "big", "old"][i % 3]))
        .collect();
    let tokens = d.join("train.bin");
    std::fs::write(&tokens, bytes::byte_tokens(text.as_bytes())).unwrap();
    let model =
        ingot_models::by_name("gpt:vocab=256,d_model=32,layers=1,heads=2,d_ff=64,seq=16,batch=8")
            .unwrap();
    let src = TokenBatches::for_graph(
        TokenStream::open(&tokens).unwrap(),
        &model.graph,
        Order::Random,
        0,
    )
    .unwrap();
    let per_epoch = src.batches_per_epoch() as usize;
    let (xs, ys) = (src.x().clone(), src.y().clone());
    let buffers = [0, 1].map(|_| Staging {
        x: vec![0u8; xs.bytes()],
        y: vec![0u8; ys.bytes()],
    });
    let mut loader = Loader::spawn(Epochs::new(src).epochs(2), buffers).unwrap();
    let mut session = ingot_trainer::session::Session::new(&model, 0).unwrap();
    let mut losses = vec![];
    while let Some(b) = loader.next_batch().unwrap() {
        session
            .set_batch(&xs.to_tensor(&b.x).unwrap(), &ys.to_tensor(&b.y).unwrap())
            .unwrap();
        drop(b);
        losses.push(session.step().unwrap().loss);
    }
    assert_eq!(losses.len(), 2 * per_epoch);
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (first, last) = (mean(&losses[..5]), mean(&losses[losses.len() - 5..]));
    assert!(first > 5.0, "starts near ln 256 = 5.55: {first}");
    assert!(
        last < first - 1.0,
        "the loss falls over two epochs: {first} -> {last}"
    );
}
