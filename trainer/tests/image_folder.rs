//! Image folders as data sets (issue 48): torchvision's ImageFolder layout read into image
//! batches, on folders of tiny JPEG and PNG files written here.

use ingot_compiler::ir::DType;
use ingot_testkit::bytes::{f32s, i64s};
use ingot_testkit::text::assert_err_mentions;
use ingot_trainer::data::images::{
    transform, ImageBatches, ImageFolder, ImageOptions, Transform, IMAGENET_MEAN, IMAGENET_STD,
};
use ingot_trainer::data::{BatchSource, DataError, InputSlot};
use std::path::{Path, PathBuf};

/// A fresh directory for `test`.
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir()
        .join(format!("ingot-image-folder-{}", std::process::id()))
        .join(test);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A scratch folder for `test` holding [`folder`]'s `classes` class folders of `per_class`
/// images.
fn class_folders(test: &str, classes: usize, per_class: usize) -> PathBuf {
    let d = scratch(test);
    folder(&d, classes, per_class);
    d
}

/// An RGB image `w x h` whose pixels are a function of its position and `salt`.
fn pattern(w: u32, h: u32, salt: u32) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            ((x * 7 + y * 3 + salt * 11) % 256) as u8,
            ((x * 2 + y * 9 + salt * 5) % 256) as u8,
            ((x * 5 + y + salt * 17) % 256) as u8,
        ])
    })
}

/// A folder of `classes` class folders (named `class0`, ...) of `per_class` images each, JPEG
/// and PNG in turn, of sizes that vary around 40 x 30.
fn folder(dir: &Path, classes: usize, per_class: usize) {
    for c in 0..classes {
        let cd = dir.join(format!("class{c}"));
        std::fs::create_dir_all(&cd).unwrap();
        for i in 0..per_class {
            let salt = (c * per_class + i) as u32;
            let img = pattern(40 + (salt % 5) * 3, 30 + (salt % 3) * 4, salt);
            let ext = if i % 2 == 0 { "jpg" } else { "png" };
            img.save(cd.join(format!("img{i:03}.{ext}"))).unwrap();
        }
    }
}

fn slots(batch: usize, c: usize, side: usize) -> (InputSlot, InputSlot) {
    (
        InputSlot {
            name: "x".into(),
            dtype: DType::F32,
            dims: vec![batch, c, side, side],
        },
        InputSlot {
            name: "y".into(),
            dtype: DType::I64,
            dims: vec![batch],
        },
    )
}

fn batches(
    dir: &Path,
    batch: usize,
    classes: u64,
    transform: Transform,
    seed: u64,
    options: ImageOptions,
) -> Result<ImageBatches, DataError> {
    let (x, y) = slots(batch, 3, 16);
    ImageBatches::new(
        ImageFolder::open(dir)?,
        x,
        y,
        classes,
        transform,
        seed,
        options,
    )
}

/// Batches of the slots `(x, y)` over the folder `dir` of two classes, seed 0, on one thread.
fn two_classes(
    dir: &Path,
    xy: (InputSlot, InputSlot),
    t: Transform,
) -> Result<ImageBatches, DataError> {
    let (x, y) = xy;
    ImageBatches::new(ImageFolder::open(dir)?, x, y, 2, t, 0, with_threads(1))
}

fn with_threads(threads: usize) -> ImageOptions {
    ImageOptions {
        threads,
        ..Default::default()
    }
}

/// Every batch of `epochs` epochs of the batches `b` (which must have opened).
fn every_batch(b: Result<ImageBatches, DataError>, epochs: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    all_batches(&mut b.unwrap(), epochs)
}

/// Batch `k` of epoch `e`, its x and y bytes, filled into buffers of the slots' sizes.
fn filled(b: &mut ImageBatches, e: u64, k: u64) -> Result<(Vec<u8>, Vec<u8>), DataError> {
    let mut x = vec![0u8; b.x().bytes()];
    let mut y = vec![0u8; b.y().bytes()];
    b.fill(e, k, &mut x, &mut y)?;
    Ok((x, y))
}

/// Every batch of `epochs` epochs, x and y bytes.
fn all_batches(b: &mut ImageBatches, epochs: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for e in 0..epochs {
        for k in 0..b.batches_per_epoch() {
            out.push(filled(b, e, k).unwrap());
        }
    }
    out
}

#[test]
fn the_same_seed_gives_the_same_batches_on_one_thread_or_four() {
    let d = class_folders("same-seed", 3, 6);
    let one = every_batch(batches(&d, 4, 3, Transform::Train, 7, with_threads(1)), 2);
    let four = every_batch(batches(&d, 4, 3, Transform::Train, 7, with_threads(4)), 2);
    assert_eq!(one.len(), 8, "18 images, batches of 4, two epochs");
    assert!(one == four, "1 and 4 threads gave different batches");
    // Another seed shuffles and crops otherwise; another epoch too.
    let other = every_batch(batches(&d, 4, 3, Transform::Train, 8, with_threads(2)), 2);
    assert!(one != other);
    assert!(one[0] != one[4], "epoch 1 repeats epoch 0");
    // A batch asked for again (as a resumed run does) is the same.
    let mut b = batches(&d, 4, 3, Transform::Train, 7, with_threads(3)).unwrap();
    assert!(filled(&mut b, 1, 2).unwrap() == one[6]);
}

#[test]
fn the_eval_transform_is_deterministic_and_in_folder_order() {
    let d = class_folders("eval", 2, 4);
    let a = every_batch(batches(&d, 4, 2, Transform::Eval, 1, with_threads(1)), 2);
    let b = every_batch(batches(&d, 4, 2, Transform::Eval, 99, with_threads(4)), 1);
    assert!(
        a[0] == b[0] && a[1] == b[1],
        "the seed or threads changed eval"
    );
    assert!(a[0] == a[2], "eval batches differ between epochs");
    assert_eq!(i64s(&a[0].1), [0, 0, 0, 0]);
    assert_eq!(i64s(&a[1].1), [1, 1, 1, 1]);
}

#[test]
fn class_ids_follow_sorted_folder_names_as_torchvision_assigns_them() {
    let d = scratch("classes");
    // Byte order: "Zebra" < "ant" < "bee" (as Python's sorted()).
    for (name, salt) in [("bee", 0u32), ("Zebra", 1), ("ant", 2)] {
        let cd = d.join(name);
        std::fs::create_dir_all(cd.join("nested")).unwrap();
        pattern(20, 20, salt).save(cd.join("b.png")).unwrap();
        pattern(20, 20, salt).save(cd.join("a.PNG")).unwrap();
        pattern(20, 20, salt)
            .save(cd.join("nested/c.jpeg"))
            .unwrap();
        std::fs::write(cd.join("notes.txt"), "not an image").unwrap();
    }
    let f = ImageFolder::open(&d).unwrap();
    assert_eq!(f.classes(), ["Zebra", "ant", "bee"]);
    assert_eq!(f.len(), 9);
    let rel = |i: usize| {
        let (p, c) = f.sample(i);
        (p.strip_prefix(&d).unwrap().to_path_buf(), c)
    };
    // os.walk's folders sorted by path ("ant" before "ant/nested"), files sorted by name.
    assert_eq!(rel(0), (PathBuf::from("Zebra/a.PNG"), 0));
    assert_eq!(rel(2), (PathBuf::from("Zebra/nested/c.jpeg"), 0));
    assert_eq!(rel(3), (PathBuf::from("ant/a.PNG"), 1));
    assert_eq!(rel(8), (PathBuf::from("bee/nested/c.jpeg"), 2));
    let b = every_batch(batches(&d, 3, 3, Transform::Eval, 0, with_threads(2)), 1);
    let ids: Vec<i64> = b.iter().flat_map(|(_, y)| i64s(y)).collect();
    assert_eq!(ids, [0, 0, 0, 1, 1, 1, 2, 2, 2]);
}

#[test]
fn a_corrupt_image_is_skipped_with_a_warning_naming_it_and_counted() {
    let d = class_folders("corrupt", 2, 4);
    let bad = d.join("class1").join("img002.jpg");
    std::fs::write(&bad, b"this is not a JPEG").unwrap();
    // A truncated PNG: its header and nothing else.
    let png = d.join("class0").join("img001.png");
    let bytes = std::fs::read(&png).unwrap();
    std::fs::write(&png, &bytes[..40]).unwrap();
    let options = with_threads(2);
    let log = options.log.clone();
    let mut b = batches(&d, 4, 2, Transform::Train, 3, options).unwrap();
    let first = all_batches(&mut b, 2);
    assert_eq!(log.count(), 2);
    let warnings = log.take_new();
    assert_eq!(warnings.len(), 2, "each file is told once: {warnings:?}");
    assert!(warnings.iter().any(|w| w.contains(&*bad.to_string_lossy())));
    assert!(warnings.iter().any(|w| w.contains(&*png.to_string_lossy())));
    assert!(log.take_new().is_empty());
    // The batches are whole, and the same on a second reading (the skipped files cached).
    let again = all_batches(&mut b, 2);
    assert!(first == again);
    for (x, _) in &first {
        assert!(f32s(x).iter().all(|v| v.is_finite()));
    }
}

#[test]
fn an_empty_class_folder_or_a_folder_without_classes_is_an_error_naming_it() {
    let d = class_folders("empty", 2, 2);
    let empty = d.join("class9");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("readme.txt"), "no images").unwrap();
    assert_err_mentions(
        ImageFolder::open(&d),
        &[&empty.to_string_lossy(), "no .jpg"],
    );

    let none = scratch("no-classes");
    std::fs::write(none.join("loose.jpg"), b"x").unwrap();
    assert_err_mentions(
        ImageFolder::open(&none),
        &[&none.to_string_lossy(), "no class folder"],
    );

    assert_err_mentions(ImageFolder::open(&d.join("missing")), &["missing"]);
}

#[test]
fn a_class_count_other_than_the_models_is_an_error_naming_both() {
    let d = class_folders("classes-mismatch", 3, 2);
    assert_err_mentions(
        batches(&d, 2, 10, Transform::Train, 0, ImageOptions::default()),
        &["3 class folders", "10 classes"],
    );
}

#[test]
fn a_color_image_for_a_one_channel_model_is_an_error_naming_it() {
    let d = class_folders("channels", 2, 2);
    let (mut x, y) = slots(2, 1, 16);
    x.dims[1] = 1;
    let mut b = two_classes(&d, (x, y), Transform::Eval).unwrap();
    assert_err_mentions(filled(&mut b, 0, 0), &["img000.jpg", "1-channel"]);
    // A model of 2 channels cannot take images at all.
    let (mut x, y) = slots(2, 2, 16);
    x.dims[1] = 2;
    assert_err_mentions(
        two_classes(&d, (x, y), Transform::Eval),
        &["C of 1 (grayscale) or 3 (RGB)"],
    );
}

/// A grayscale folder feeds a one-channel model, normalised by the average mean and std.
#[test]
fn grayscale_images_feed_a_one_channel_model() {
    let d = scratch("gray");
    for c in 0..2 {
        let cd = d.join(format!("c{c}"));
        std::fs::create_dir_all(&cd).unwrap();
        image::GrayImage::from_pixel(20, 20, image::Luma([51]))
            .save(cd.join("a.png"))
            .unwrap();
    }
    let (mut x, y) = slots(2, 1, 8);
    x.dims[1] = 1;
    let mut b = two_classes(&d, (x, y), Transform::Train).unwrap();
    let (xb, _) = all_batches(&mut b, 1).remove(0);
    let m = (IMAGENET_MEAN[0] + IMAGENET_MEAN[1] + IMAGENET_MEAN[2]) / 3.0;
    let s = (IMAGENET_STD[0] + IMAGENET_STD[1] + IMAGENET_STD[2]) / 3.0;
    let want = (51.0f32 / 255.0 - m) / s;
    assert!(
        f32s(&xb).iter().all(|&v| v == want),
        "{:?}",
        &f32s(&xb)[..4]
    );
}

/// The evaluation transform of a 74 x 74 image for a 32 x 32 input: resized to 37 x 37
/// (round(32 / 0.875)), exactly half, so Pillow's bilinear filter weighs source pixels
/// 2k-1, 2k, 2k+1, 2k+2 by 1, 3, 3, 1 (/ 8) along each axis; then the center 32 x 32 (offset
/// round(2.5) = 2, Python's rounding) and normalised with ImageNet's mean and std.
#[test]
fn pixels_after_resize_center_crop_and_normalise_match_a_hand_computation() {
    let d = scratch("pixels");
    let src = pattern(74, 74, 3);
    for c in ["a", "b"] {
        std::fs::create_dir_all(d.join(c)).unwrap();
        src.save(d.join(c).join("x.png")).unwrap();
    }
    assert_eq!(
        transform::eval_region(74, 74, 32, 32),
        (
            transform::Region {
                left: 4.0,
                top: 4.0,
                width: 64.0,
                height: 64.0
            },
            (37, 37)
        )
    );
    let (x, y) = slots(1, 3, 32);
    let mut b = two_classes(&d, (x, y), Transform::Eval).unwrap();
    let (xb, _) = all_batches(&mut b, 1).remove(0);
    let out = f32s(&xb);
    let w = [1.0, 3.0, 3.0, 1.0];
    for (i, j) in [(0usize, 0usize), (5, 17), (31, 31), (16, 3)] {
        // Resized pixel (i + 2, j + 2) reads source rows and columns 2(k + 2) - 1 ...
        let (r0, c0) = (2 * (i + 2) - 1, 2 * (j + 2) - 1);
        for ch in 0..3 {
            let mut v = 0.0f64;
            for (a, wa) in w.iter().enumerate() {
                for (b, wb) in w.iter().enumerate() {
                    v += wa * wb * src.get_pixel((c0 + b) as u32, (r0 + a) as u32)[ch] as f64;
                }
            }
            let v = (v / 64.0).round();
            let want = (v / 255.0 - IMAGENET_MEAN[ch] as f64) / IMAGENET_STD[ch] as f64;
            let got = out[ch * 32 * 32 + i * 32 + j] as f64;
            // One 8-bit level: the resize rounds in fixed point.
            let tol = 1.01 / 255.0 / IMAGENET_STD[ch] as f64;
            assert!(
                (got - want).abs() <= tol,
                "pixel ({i}, {j}) channel {ch}: {got} against {want}"
            );
        }
    }
}

/// torchvision's RandomResizedCrop: the region is inside the image, of 8% to 100% of its area
/// and an aspect ratio in [3/4, 4/3] (up to rounding); an image too thin for 10 attempts
/// falls back to the center crop clamped to the ratio range.
#[test]
fn random_resized_crops_stay_in_the_image_and_in_their_ranges() {
    use rand_chacha::rand_core::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for _ in 0..500 {
        let r = transform::random_resized_crop(400, 350, &mut rng);
        assert!(r.left >= 0.0 && r.top >= 0.0);
        assert!(
            r.left + r.width <= 400.0 && r.top + r.height <= 350.0,
            "{r:?}"
        );
        let area = r.width * r.height / (400.0 * 350.0);
        assert!((0.07..=1.0).contains(&area), "{r:?}");
        let ratio = r.width / r.height;
        assert!((0.7..=1.4).contains(&ratio), "{r:?}");
    }
    let r = transform::random_resized_crop(1000, 10, &mut rng);
    assert_eq!(
        r,
        transform::Region {
            left: 493.0,
            top: 0.0,
            width: 13.0,
            height: 10.0
        }
    );
}

/// A directory of class folders is told from a sample set (`x.npy`, `y.npy`) and opened for a
/// model's inputs: resnet18's `[N, 3, 32, 32]` and 10 classes, shuffled and augmented when read
/// at random, in order with the evaluation transform when read in order (as `--val` is).
#[test]
fn a_directory_of_class_folders_is_detected_and_opened_for_a_models_inputs() {
    use ingot_trainer::data::Order;
    use ingot_trainer::datasets::{self, DatasetFormat, DatasetKind};
    let d = class_folders("detect", 10, 1);
    assert_eq!(datasets::dataset_kind(&d).unwrap(), DatasetKind::Images);
    assert!(matches!(
        datasets::detect_format(&d).unwrap(),
        DatasetFormat::Images(_)
    ));
    let g = ingot_models::resnet18_with(2, DType::F32).unwrap().graph;
    let train = datasets::open_dataset(&d, &g, Order::Random, 1).unwrap();
    assert!(
        train.describe().contains("random resized crop"),
        "{}",
        train.describe()
    );
    assert_eq!(train.batches_per_epoch(), 5);
    let val = datasets::open_dataset(&d, &g, Order::Sequential, 1).unwrap();
    assert!(val.describe().contains("center crop"), "{}", val.describe());
    // The fingerprint names the listing, not the path typed.
    let f = datasets::dataset_fingerprint(&d, &train.describe()).unwrap();
    assert!(
        f.contains("10 images") && !f.contains(&*d.to_string_lossy()),
        "{f}"
    );
    // A folder beside x.npy is a sample set's directory still.
    std::fs::write(d.join("x.npy"), b"").unwrap();
    assert_eq!(datasets::dataset_kind(&d).unwrap(), DatasetKind::Samples);
}
