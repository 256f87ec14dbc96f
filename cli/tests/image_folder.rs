//! `ingot train --dataset DIR` over an image folder (issue 48): the built-in `cnn` (one
//! channel, 28 x 28, 10 classes, batch 128) trains from a folder of generated grayscale JPEG
//! and PNG files, with a corrupt one skipped, named and counted.

#[path = "support/cli.rs"]
mod cli;
use cli::{failed, json_lines, numbers, ok, train_on};
use ingot_testkit::text::assert_mentions;
use std::path::Path;

/// 128 grayscale images (one batch of `cnn`) in 10 class folders, of sizes around 32 x 30;
/// `corrupt` of them replaced by bytes that are no image.
fn gray_folder(dir: &Path, corrupt: usize) -> Vec<std::path::PathBuf> {
    let mut bad = Vec::new();
    for i in 0..128usize {
        let class = dir.join(format!("digit{}", i % 10));
        std::fs::create_dir_all(&class).unwrap();
        let (w, h) = (30 + (i % 4) as u32 * 2, 28 + (i % 3) as u32 * 3);
        let img = image::GrayImage::from_fn(w, h, |x, y| {
            image::Luma([((x * 9 + y * 4 + i as u32 * 13) % 256) as u8])
        });
        let path = class.join(format!("{i:03}.{}", if i % 2 == 0 { "png" } else { "jpg" }));
        if i < corrupt {
            std::fs::write(&path, b"\xff\xd8 truncated").unwrap();
            bad.push(path);
        } else {
            img.save(&path).unwrap();
        }
    }
    bad
}

#[test]
fn a_cnn_trains_two_steps_from_an_image_folder_and_counts_a_corrupt_file() {
    let d = cli::scratch("image-folder-tests", "cnn");
    let train = d.join("train");
    let bad = gray_folder(&train, 1);
    let dir = train.to_str().unwrap();
    let out = train_on(
        "cnn",
        dir,
        &[
            "--val",
            dir,
            "--steps",
            "2",
            "--eval-batches",
            "1",
            "--lr",
            "0.01",
            "--threads",
            "2",
            "--json",
        ],
    );
    let lines = json_lines(&ok(&out));
    let losses: Vec<f64> = numbers(&lines, "loss");
    assert_eq!(losses.len(), 2, "{lines:?}");
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(
        lines.iter().any(|v| v
            .get("val_loss")
            .is_some_and(|l| l.as_f64().unwrap().is_finite())),
        "{lines:?}"
    );
    let summary = lines.last().unwrap()["summary"].clone();
    // The same file is bad in the training and the validation folder: told and counted once.
    assert_eq!(summary["skipped_images"], 1, "{summary}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&*bad[0].to_string_lossy()) && err.contains("skipped"),
        "{err}"
    );

    // The same seed trains on the same batches: the same losses, on another thread count.
    let again = train_on(
        "cnn",
        dir,
        &["--steps", "2", "--lr", "0.01", "--threads", "1", "--json"],
    );
    let again: Vec<f64> = numbers(&json_lines(&ok(&again)), "loss");
    assert_eq!(again, losses);
}

#[test]
fn a_folder_the_model_cannot_take_is_an_error_naming_it() {
    let d = cli::scratch("image-folder-tests", "errors");
    // Three class folders for a model of ten classes.
    let three = d.join("three");
    for c in 0..3 {
        let class = three.join(format!("c{c}"));
        std::fs::create_dir_all(&class).unwrap();
        image::GrayImage::new(28, 28)
            .save(class.join("a.png"))
            .unwrap();
    }
    let one_step = ["--steps", "1"];
    let out = train_on(
        "cnn",
        &three,
        &[&one_step[..], &["--dataset-format", "images"]].concat(),
    );
    let e = failed(&out, 1);
    assert_mentions(&e, &["3 class folders", "10 classes"]);
    // An empty class folder.
    let empty = d.join("empty");
    gray_folder(&empty, 0);
    std::fs::create_dir_all(empty.join("digit99")).unwrap();
    let e = failed(&train_on("cnn", &empty, &one_step), 1);
    assert_mentions(&e, &["digit99", "no .jpg"]);
    // A standard deviation of 0.
    let out = train_on(
        "cnn",
        &empty,
        &[&one_step[..], &["--image-std", "0"]].concat(),
    );
    failed(&out, 2);
}
