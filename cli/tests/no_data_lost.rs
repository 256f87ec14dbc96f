//! The edges where a user used to lose work, each run as a user would run it: weights that a
//! finite loss left non-finite, an output path that names an input, two runs on one checkpoint
//! directory, a save killed part-way, a checkpoint damaged on disk, a run resumed in another
//! precision. Each test failed before its fix.

#[path = "support/cli.rs"]
mod cli;

use cli::{ingot, ok, s, scratch};
use ingot_testkit::text::assert_mentions;
use ingot_trainer::checkpoint;
use std::path::PathBuf;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The repository's tiny IR model (an MLP on a fixed batch).
fn tiny() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/examples/tiny-mlp.ir")
        .to_str()
        .unwrap()
        .to_string()
}

/// `ingot train --model-file TINY --steps STEPS MORE..` over the repository's tiny IR model:
/// how the tests of a checkpoint directory run.
fn train_tiny(steps: &str, more: &[&str]) -> std::process::Output {
    let tiny = tiny();
    ingot(
        &[
            &["train", "--model-file", &tiny, "--steps", steps][..],
            more,
        ]
        .concat(),
    )
}

#[test]
fn weights_made_infinite_by_an_update_after_a_finite_loss_are_never_saved() {
    let d = scratch("no-data-lost", "infinite-update");
    let (w, ck) = (d.join("w.safetensors"), d.join("ck"));
    // A good run first: its weights and checkpoint are what must survive.
    ok(&train_tiny("2", &["--save", s(&w), "--checkpoint", s(&ck)]));
    let (good_w, good_ck) = (std::fs::read(&w).unwrap(), checkpoint::load(&ck).unwrap());
    // lr 1e39 is infinite in f32: step 1's loss is finite, its update is not.
    let out = train_tiny(
        "1",
        &["--lr", "1e39", "--save", s(&w), "--checkpoint", s(&ck)],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("step 1: after its update")
            && e.contains("parameter \"")
            && e.contains("is not finite"),
        "the error names the step and the parameter: {e}"
    );
    assert_mentions(&e, &["was not written", "is kept"]);
    assert_eq!(
        std::fs::read(&w).unwrap(),
        good_w,
        "--save's file is untouched"
    );
    assert_eq!(checkpoint::load(&ck).unwrap().info, good_ck.info);

    // Past that step (--skip-nonfinite), a checkpoint due in the middle of the run refuses
    // too, and the run stops there.
    let out = train_tiny(
        "3",
        &[
            "--skip-nonfinite",
            "--lr",
            "1e39",
            "--checkpoint",
            s(&ck),
            "--checkpoint-every",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert_mentions(&e, &["not saved at step 1", "is not finite"]);
    let kept = checkpoint::load(&ck).unwrap();
    assert_eq!(
        kept.info, good_ck.info,
        "the last good checkpoint is in place"
    );
    assert_eq!(kept.parameters, good_ck.parameters);
}

#[test]
fn an_output_that_is_an_input_or_another_output_is_refused_before_any_work() {
    let d = scratch("no-data-lost", "output-is-input");
    let text = d.join("text.txt");
    std::fs::write(&text, "some words to train on, ".repeat(200)).unwrap();
    let bin = d.join("data.bin");
    ok(&ingot(&["data", "bytes", s(&text), s(&bin)]));
    let model = d.join("m.ir");
    std::fs::copy(tiny(), &model).unwrap();
    let link = d.join("link.bin");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&bin, &link).unwrap();
    #[cfg(not(unix))]
    std::fs::copy(&bin, &link).unwrap();
    let before: Vec<(PathBuf, Vec<u8>)> = [&text, &bin, &model]
        .iter()
        .map(|p| (p.to_path_buf(), std::fs::read(p).unwrap()))
        .collect();
    let gpt = "gpt:vocab=256,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=2";
    let o = d.join("o");
    // One step of the GPT over the data set, or of the model file, each case's flags after.
    let gpt_step = [
        "train",
        "--model",
        gpt,
        "--dataset",
        s(&bin),
        "--steps",
        "1",
    ];
    let file_step = ["train", "--model-file", s(&model), "--steps", "1"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["data", "bytes", s(&text), s(&text)], "INPUT"),
        (
            vec!["compile", "--model-file", s(&model), "-o", s(&model)],
            "--model-file",
        ),
        (
            vec!["plan", "--model-file", s(&model), "--html", s(&model)],
            "--model-file",
        ),
        (
            vec!["plan", "--model-file", s(&model), "--svg", s(&model)],
            "--model-file",
        ),
        (
            [&gpt_step[..], &["--report", s(&bin)]].concat(),
            "--dataset",
        ),
        (
            // The same file by another name: a symbolic link to the data set.
            [&gpt_step[..], &["--save", s(&link)]].concat(),
            "--dataset",
        ),
        (
            [&gpt_step[..], &["--val", s(&bin), "--report", s(&bin)]].concat(),
            "--dataset",
        ),
        (
            [&file_step[..], &["--save", s(&model)]].concat(),
            "--model-file",
        ),
        (
            [&file_step[..], &["--save", s(&o), "--report", s(&o)]].concat(),
            "--save",
        ),
        (
            vec!["dsa", "--input", s(&model), "--output", s(&model)],
            "--input",
        ),
    ];
    for (args, other) in cases {
        let out = ingot(&args);
        let e = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {e}");
        assert!(
            e.contains("is the same file as") && e.contains(other),
            "{args:?}: {e}"
        );
        assert!(out.stdout.is_empty(), "nothing ran: {args:?}");
    }
    for (p, bytes) in before {
        assert_eq!(
            std::fs::read(&p).unwrap(),
            bytes,
            "{} is untouched",
            p.display()
        );
    }
    assert!(!o.exists());
}

#[test]
fn a_checkpoint_directory_held_by_a_run_is_refused_to_another_naming_the_holder() {
    let d = scratch("no-data-lost", "lock");
    let ck = d.join("ck");
    let held = checkpoint::lock(&ck).unwrap();
    let args = ["--checkpoint", s(&ck)];
    let out = train_tiny("2", &args);
    let e = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("another run is using it")
            && e.contains(&format!("process {}", std::process::id())),
        "the holder's pid is named: {e}"
    );
    assert!(out.stdout.is_empty(), "refused before anything ran");
    // --resume takes the directory too: a run rewriting it would delete what is read.
    let out = train_tiny("2", &["--resume", s(&ck)]);
    assert!(
        stderr(&out).contains("another run is using it"),
        "{}",
        stderr(&out)
    );
    drop(held);
    ok(&train_tiny("2", &args));
    // A run lets go of it when it ends: the next one takes it.
    let again = checkpoint::lock(&ck).unwrap();
    assert!(again.removed.is_empty());
}

#[test]
fn a_second_lock_in_one_process_is_refused_and_a_file_is_no_checkpoint_directory() {
    let d = scratch("no-data-lost", "lock-unit");
    let ck = d.join("ck");
    let first = checkpoint::lock(&ck).unwrap();
    let e = checkpoint::lock(&ck).unwrap_err();
    assert!(e.contains("another run is using it"), "{e}");
    drop(first);
    checkpoint::lock(&ck).unwrap();
    let file = d.join("f");
    std::fs::write(&file, b"x").unwrap();
    let e = checkpoint::lock(&file).unwrap_err();
    assert!(e.contains("is a file, not a directory"), "{e}");
    // From the command line, before the run rather than after it.
    let out = train_tiny("1", &["--checkpoint", s(&file)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("is a file"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
}

#[test]
fn what_a_killed_save_left_is_removed_and_the_users_own_files_are_not() {
    let d = scratch("no-data-lost", "stale");
    let ck = d.join("ck");
    let run = |steps: &str| train_tiny(steps, &["--checkpoint", s(&ck)]);
    ok(&run("1"));
    let stale = [
        ".weights-00000007.safetensors.4242.0.tmp",
        ".optimizer-00000007.safetensors.4242.1.tmp",
        ".checkpoint.json.4242.2.tmp",
    ];
    for name in stale {
        std::fs::write(ck.join(name), b"half").unwrap();
    }
    // Files of the user's that merely look like ours stay.
    let mine = ["weights-mine.safetensors", ".notes.tmp"];
    for name in mine {
        std::fs::write(ck.join(name), b"mine").unwrap();
    }
    let out = run("2");
    ok(&out);
    assert!(
        stderr(&out).contains("removed what an interrupted save left"),
        "{}",
        stderr(&out)
    );
    for name in stale {
        assert!(!ck.join(name).exists(), "{name} is gone");
    }
    for name in mine {
        assert_eq!(
            std::fs::read(ck.join(name)).unwrap(),
            b"mine",
            "{name} is kept"
        );
    }
    let info = checkpoint::load(&ck).unwrap().info;
    assert_eq!(info.step, 2);
    // Step 1's files went when step 2's record replaced theirs.
    assert!(!ck.join("weights-00000001.safetensors").exists());
    assert!(ck.join(&info.weights).exists());
}

#[test]
fn a_checkpoint_file_changed_on_disk_fails_its_checksum_on_resume() {
    let d = scratch("no-data-lost", "checksum");
    let ck = d.join("ck");
    ok(&train_tiny("1", &["--checkpoint", s(&ck)]));
    let info = checkpoint::load(&ck).unwrap().info;
    assert_eq!(info.checksums.len(), 2, "{:?}", info.checksums);
    // One bit of the last weight's last byte: still a valid safetensors file.
    let w = ck.join(&info.weights);
    let mut bytes = std::fs::read(&w).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&w, &bytes).unwrap();
    ingot_runtime::io::load(&w).expect("the damage is invisible to the format");
    let e = checkpoint::load(&ck).unwrap_err();
    assert!(e.contains("checksum") && e.contains(&info.weights), "{e}");
    let out = train_tiny("2", &["--resume", s(&ck)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("checksum"), "{}", stderr(&out));
}

#[test]
fn a_run_resumed_in_another_precision_says_so() {
    let d = scratch("no-data-lost", "precision");
    let ck = d.join("ck");
    let gpt = "gpt:vocab=64,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=2";
    ok(&ingot(&[
        "train",
        "--model",
        gpt,
        "--steps",
        "1",
        "--precision",
        "bf16",
        "--checkpoint",
        s(&ck),
    ]));
    let out = ingot(&["train", "--model", gpt, "--steps", "2", "--resume", s(&ck)]);
    ok(&out);
    let e = stderr(&out);
    assert_mentions(&e, &["written by a run in bf16", "computes in f32"]);
}

#[test]
fn every_number_out_of_range_is_refused_when_parsed_naming_the_flag() {
    // Each was taken before: --warmup 2^64-1 wrapped `warmup + 1` to 0 (an infinite learning
    // rate, exit 0); a NaN learning rate reached the optimizer; a budget past the address space
    // was planned for.
    let cases: &[(&[&str], &str, &str)] = &[
        (&["--warmup", "18446744073709551615"], "--warmup", "2^53"),
        (&["--lr", "nan"], "--lr", "not a finite number above 0"),
        (&["--lr", "-1"], "--lr", "not a finite number above 0"),
        (&["--lr", "inf"], "--lr", "not a finite number above 0"),
        (&["--weight-decay", "-0.1"], "--weight-decay", "at least 0"),
        (&["--clip-grad-norm", "nan"], "--clip-grad-norm", "finite"),
        (&["--min-lr-ratio", "1.5"], "--min-lr-ratio", "[0, 1]"),
        (&["--budget", "9000000TiB"], "--budget", "address space"),
        (
            &["--optimizer", "momentum", "--momentum", "1"],
            "--momentum",
            "[0, 1)",
        ),
        (
            &["--optimizer", "adamw", "--betas", "0.9,nan"],
            "--betas",
            "B2",
        ),
    ];
    for (args, flag, why) in cases {
        let mut all = vec!["train", "--model", "mlp", "--steps", "2"];
        all.extend_from_slice(args);
        let out = ingot(&all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag) && err.contains(why), "{args:?}: {err}");
        assert!(
            out.stdout.is_empty(),
            "{args:?} ran: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
