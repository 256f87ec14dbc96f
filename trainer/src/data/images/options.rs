//! How an image folder's pixels are normalised and on how many threads they are decoded, and
//! the log of the images skipped as unreadable.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// ImageNet's per-channel mean (R, G, B), torchvision's default for its pretrained models.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviation (R, G, B).
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// How an image folder is read: the normalisation `(pixel / 255 - mean) / std` per channel
/// (torchvision's `ToTensor` then `Normalize`), the threads that decode and augment a batch,
/// and where skipped images are told.
///
/// A one-channel model normalises with the average of the three means and of the three
/// standard deviations (one value given on the command line is all three).
#[derive(Clone, Debug)]
pub struct ImageOptions {
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Threads decoding a batch (0: every core of the machine). The batches are the same for
    /// any count: each sample's augmentation draws from its own generator.
    pub threads: usize,
    /// Shared by every source opened with these options (the training and the validation
    /// folder), so that the run can tell and count the files skipped in either.
    pub log: SkipLog,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
            threads: 0,
            log: SkipLog::default(),
        }
    }
}

/// Options are the same when their numbers are (bit for bit); the log is where skipped files
/// are told, not part of how images are read.
impl PartialEq for ImageOptions {
    fn eq(&self, other: &Self) -> bool {
        let bits = |v: &[f32; 3]| v.map(f32::to_bits);
        bits(&self.mean) == bits(&other.mean)
            && bits(&self.std) == bits(&other.std)
            && self.threads == other.threads
    }
}

impl Eq for ImageOptions {}

impl ImageOptions {
    /// The mean and standard deviation of each of `channels` channels (1 or 3).
    pub(crate) fn norm(&self, channels: usize) -> (Vec<f32>, Vec<f32>) {
        if channels == 3 {
            return (self.mean.to_vec(), self.std.to_vec());
        }
        let avg = |v: &[f32; 3]| (v[0] + v[1] + v[2]) / 3.0;
        (vec![avg(&self.mean)], vec![avg(&self.std)])
    }

    /// The checks a normalisation must pass: finite means and positive finite deviations.
    pub fn check(&self) -> Result<(), String> {
        if let Some(m) = self.mean.iter().find(|m| !m.is_finite()) {
            return Err(format!("--image-mean: {m} is not a finite number"));
        }
        if let Some(s) = self.std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(format!("--image-std: {s} is not a positive number"));
        }
        Ok(())
    }

    /// The threads a batch is decoded on: `threads`, or every core for 0.
    pub(crate) fn thread_count(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

/// The images skipped because they could not be read or decoded, each file once, and how
/// many of them have been told so far. Cloning shares the log.
#[derive(Clone, Debug, Default)]
pub struct SkipLog(Arc<Mutex<Skipped>>);

#[derive(Debug, Default)]
struct Skipped {
    files: BTreeSet<PathBuf>,
    /// Warnings not yet taken by [`SkipLog::take_new`].
    new: Vec<String>,
}

impl SkipLog {
    /// Records `file` as skipped for `reason`; a file already recorded is not told again.
    pub(crate) fn record(&self, file: &Path, reason: &str) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.files.insert(file.to_path_buf()) {
            s.new.push(format!(
                "{}: skipped: {reason} (another image of the folder takes its place in the batch)",
                file.display()
            ));
        }
    }

    /// The files skipped so far.
    pub fn count(&self) -> u64 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).files.len() as u64
    }

    /// The warnings recorded since the last call, one per file, naming it.
    pub fn take_new(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()).new)
    }
}
