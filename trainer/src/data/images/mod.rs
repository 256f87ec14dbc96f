//! Image folders as data sets (issue 48): `--dataset DIR` where `DIR` holds one folder of
//! JPEG/PNG images per class, torchvision's `ImageFolder` layout ([`folder`]), for models whose
//! inputs are an image batch `x` `[N, C, H, W]` (float, C of 1 or 3) and labels `y` `[N]`.
//!
//! A batch is decoded and augmented on CPU threads (a rayon pool of its own, one sample a
//! task, [`transform`]) inside the loader thread, into the same two staging buffers (pinned on
//! the GPU) that every data set fills while the step runs ([`super::Loader`]).
//!
//! Everything is a function of (seed, epoch, position in the epoch): the epoch's order is the
//! same seeded shuffle as sample arrays' ([`super::SampleBatches`]), and each sample's crop and
//! flip draw from a generator keyed by (seed, epoch, position). So the batches are the same
//! whatever the thread count and however the tasks interleave, and a resumed run sees the
//! uninterrupted run's batches.
//!
//! A file that cannot be read or decoded is skipped with a warning naming it, once
//! ([`SkipLog`], counted in the run's summary): the next image of the folder's order (wrapping
//! around) that decodes takes its place, with its own label, so the batch stays full and the
//! outcome is the same on every run. An image whose channels the model cannot take (a color
//! image for a one-channel model) is an error naming it.
//!
//! Unlike array data sets, a batch allocates: the decoders' pixels and the resized images, on
//! the loader's threads, never on the step's.

pub mod folder;
pub mod options;
pub mod transform;

pub use folder::ImageFolder;
pub use options::{ImageOptions, SkipLog, IMAGENET_MEAN, IMAGENET_STD};
pub use transform::Transform;

use super::batches::{id_bound, Cut, EpochOrder};
use super::error::DataError;
use super::{BatchSource, Dropped, InputSlot};
use ingot_compiler::ir::{DType, Graph};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Uniform};
use rayon::prelude::*;
use std::collections::HashSet;
use std::sync::Mutex;

/// A generator keyed by (seed, epoch, position in the epoch): one sample's augmentation.
fn sample_rng(seed: u64, epoch: u64, position: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    key[16..24].copy_from_slice(&position.to_le_bytes());
    key[24..].copy_from_slice(b"ingotimg");
    ChaCha8Rng::from_seed(key)
}

/// Batches of an image folder: `batch` images per batch, shuffled and augmented
/// ([`Transform::Train`]) or in the folder's order with the evaluation transform.
pub struct ImageBatches {
    folder: ImageFolder,
    cut: Cut,
    /// The model's `C`, `H`, `W`.
    channels: usize,
    height: u32,
    width: u32,
    transform: Transform,
    mean: Vec<f32>,
    std: Vec<f32>,
    options: ImageOptions,
    /// The threads a batch is decoded on (none for one: the loader's thread).
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    /// The sample order of the epoch being read.
    order: EpochOrder,
    /// Images found unreadable (a cache: they would fail the same way again).
    bad: Mutex<HashSet<u32>>,
}

impl std::fmt::Debug for ImageBatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl ImageBatches {
    /// Batches of `folder` for inputs `x` (`[batch, C, H, W]`, F32 or F64, C of 1 or 3) and
    /// `y` (`batch` integer labels) of a model with `classes` classes, which must be the
    /// folder's class count. The transform is `transform` and the order a seeded shuffle for
    /// [`Transform::Train`], the folder's order for [`Transform::Eval`].
    pub fn new(
        folder: ImageFolder,
        x: InputSlot,
        y: InputSlot,
        classes: u64,
        transform: Transform,
        seed: u64,
        options: ImageOptions,
    ) -> Result<ImageBatches, DataError> {
        let root = folder.root().to_path_buf();
        let &[batch, channels, height, width] = x.dims.as_slice() else {
            return Err(DataError::model(
                &root,
                format!(
                    "the model's input x is {:?}; an image folder feeds an image batch [N, C, H, W]",
                    x.dims
                ),
            ));
        };
        if batch == 0 || height == 0 || width == 0 || !(channels == 1 || channels == 3) {
            return Err(DataError::model(
                &root,
                format!(
                    "the model's input x is {:?}; an image folder feeds [N, C, H, W] with N, H and W above 0 and C of 1 (grayscale) or 3 (RGB)",
                    x.dims
                ),
            ));
        }
        if !matches!(x.dtype, DType::F32 | DType::F64) {
            return Err(DataError::model(
                &root,
                format!(
                    "the model's input x is {}; an image folder feeds f32 or f64 pixels",
                    x.dtype.name()
                ),
            ));
        }
        let cut = Cut { x, y, seed };
        cut.check_labels(&root)?;
        let found = folder.classes().len() as u64;
        if found != classes {
            return Err(DataError::model(
                &root,
                format!(
                    "{found} class folders, but the model has {classes} classes (its output layer): give a folder of {classes} class folders, or a model of {found} classes"
                ),
            ));
        }
        if (folder.len() as u64) < batch as u64 {
            return Err(DataError::TooSmall {
                file: root,
                reason: format!("{} images cannot fill one batch of {batch}", folder.len()),
            });
        }
        options.check().map_err(|e| DataError::model(&root, e))?;
        let threads = options.thread_count();
        let pool = match threads {
            1 => None,
            n => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("ingot-images-{i}"))
                    .build()
                    .map_err(|e| {
                        DataError::Stopped(format!("cannot start {n} image decoding threads: {e}"))
                    })?,
            ),
        };
        let (mean, std) = options.norm(channels);
        Ok(ImageBatches {
            order: EpochOrder::new(folder.len()),
            folder,
            cut,
            channels,
            height: height as u32,
            width: width as u32,
            transform,
            mean,
            std,
            options,
            pool,
            threads,
            bad: Mutex::new(HashSet::new()),
        })
    }

    /// Batches for the inputs `x` and `y` of `g`, with the class count read off its output
    /// layer ([`crate::init::id_bound`]).
    pub fn for_graph(
        folder: ImageFolder,
        g: &Graph,
        transform: Transform,
        seed: u64,
        options: ImageOptions,
    ) -> Result<ImageBatches, DataError> {
        let root = folder.root().to_path_buf();
        let Cut { x, y, seed } = Cut::of_graph(g, &root, seed)?;
        let classes = id_bound(g, &root, "y", "output layer to read the class count off")?;
        ImageBatches::new(folder, x, y, classes, transform, seed, options)
    }

    pub fn folder(&self) -> &ImageFolder {
        &self.folder
    }

    /// The threads a batch is decoded on.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The order of `epoch`: the folder's, or the seeded shuffle of sample arrays.
    fn order_for(&mut self, epoch: u64) {
        let shuffle = self.transform == Transform::Train;
        let n = self.folder.len() as u32;
        self.order.prepare(epoch, n, shuffle, self.cut.seed);
    }

    /// The images of batch `batch` of `epoch` before any is skipped, in order (for tests).
    pub fn samples_of(&mut self, epoch: u64, batch: u64) -> &[u32] {
        self.order_for(epoch);
        self.order.batch(batch, self.cut.batch())
    }

    /// Fills `row` (one sample of x) from image `index` at `position` of `epoch`, or from the
    /// next image in the folder's order that decodes if it does not; returns the label used.
    fn one(&self, index: u32, epoch: u64, position: u64, row: &mut [u8]) -> Result<u64, DataError> {
        let n = self.folder.len() as u32;
        for k in 0..n {
            let i = (index + k) % n;
            if self
                .bad
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&i)
            {
                continue;
            }
            let (path, label) = self.folder.sample(i as usize);
            let (pixels, w, h) = match transform::decode(&path, self.channels) {
                Ok(d) => d,
                Err(transform::Failed::Skip(reason)) => {
                    self.options.log.record(&path, &reason);
                    self.bad.lock().unwrap_or_else(|e| e.into_inner()).insert(i);
                    continue;
                }
                Err(transform::Failed::Fatal(e)) => return Err(e),
            };
            let mut rng = sample_rng(self.cut.seed, epoch, position);
            let (region, flip) = match self.transform {
                Transform::Train => {
                    let r = transform::random_resized_crop(w, h, &mut rng);
                    (
                        r,
                        Uniform::new(0.0f64, 1.0).expect("0 < 1").sample(&mut rng) < 0.5,
                    )
                }
                Transform::Eval => (
                    transform::eval_region(w, h, self.width, self.height).0,
                    false,
                ),
            };
            transform::resize_into(
                pixels,
                (w, h),
                self.channels,
                region,
                (self.width, self.height),
                flip,
                (&self.mean, &self.std),
                self.cut.x.dtype,
                row,
            )
            .map_err(|e| DataError::format(&path, "resizing", e))?;
            return Ok(label as u64);
        }
        Err(DataError::TooSmall {
            file: self.folder.root().to_path_buf(),
            reason: "no image of the folder could be read and decoded (the warnings name each)"
                .into(),
        })
    }
}

/// Writes integer `v` as element `i` of `out` in `dtype` (I32 or I64).
fn put_label(dtype: DType, out: &mut [u8], v: u64) {
    match dtype {
        DType::I32 => out[..4].copy_from_slice(&(v as i32).to_ne_bytes()),
        _ => out[..8].copy_from_slice(&(v as i64).to_ne_bytes()),
    }
}

impl BatchSource for ImageBatches {
    fn cut(&self) -> &Cut {
        &self.cut
    }
    fn batches_per_epoch(&self) -> u64 {
        self.cut.sample_batches(self.folder.len() as u64)
    }
    /// Decodes the batch's images on the pool, one task each; the first error in batch order
    /// (not the first to happen) is the one returned, so failures are deterministic too.
    fn fill(
        &mut self,
        epoch: u64,
        batch: u64,
        x: &mut [u8],
        y: &mut [u8],
    ) -> Result<(), DataError> {
        self.order_for(epoch);
        let b = self.cut.batch();
        let (xrow, yrow) = (self.cut.x.bytes() / b, self.cut.y.bytes() / b);
        let first = batch as usize * b;
        let this = &*self;
        let samples = this.order.batch(batch, b);
        let ydt = this.cut.y.dtype;
        let work = |(r, (xr, yr)): (usize, (&mut [u8], &mut [u8]))| -> Result<(), DataError> {
            let position = (first + r) as u64;
            let label = this.one(samples[r], epoch, position, xr)?;
            put_label(ydt, yr, label);
            Ok(())
        };
        let (x, y) = (&mut x[..b * xrow], &mut y[..b * yrow]);
        let results: Vec<Result<(), DataError>> = match &this.pool {
            Some(pool) => pool.install(|| {
                x.par_chunks_mut(xrow)
                    .zip(y.par_chunks_mut(yrow))
                    .enumerate()
                    .map(work)
                    .collect()
            }),
            None => x
                .chunks_mut(xrow)
                .zip(y.chunks_mut(yrow))
                .enumerate()
                .map(work)
                .collect(),
        };
        results.into_iter().collect()
    }
    fn dropped_per_epoch(&self) -> Dropped {
        self.cut.samples_dropped(self.folder.len() as u64)
    }
    fn describe(&self) -> String {
        let f = |v: &[f32]| {
            v.iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "images {}: {} images in {} classes, batch {} of {}x{}x{}, {}, mean {} std {}",
            self.folder.root().display(),
            self.folder.len(),
            self.folder.classes().len(),
            self.cut.batch(),
            self.channels,
            self.height,
            self.width,
            match self.transform {
                Transform::Train => "shuffled, random resized crop and flip",
                Transform::Eval => "in order, resize and center crop",
            },
            f(&self.mean),
            f(&self.std)
        )
    }
    /// Nothing is read ahead: a million images are decoded as their batches need them, and an
    /// unreadable one is skipped then (told and counted).
    fn check_all(&mut self) -> Result<(), DataError> {
        Ok(())
    }
}
