//! A data set on disk opened for the model ([`open_dataset`]): which kind a path holds, its
//! files, and the fingerprint checkpoints keep to refuse resuming on other data. The `train`
//! command's loop drives the source with a [`crate::data::Loader`] feeding
//! [`crate::session::Session::step_on`].

use crate::data::images::{ImageBatches, ImageFolder, ImageOptions, Transform};
use crate::data::{
    BatchSource, DataError, Order, SampleBatches, SampleSet, TokenBatches, TokenLayout, TokenStream,
};
use ingot_compiler::ir::Graph;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Which kind of data set a path holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatasetKind {
    /// A token stream (raw uint16, an llm.c shard, a 1-D `.npy`): batches of `seq + 1` tokens.
    Tokens,
    /// Samples `x` and `y`: a directory holding `x.npy` and `y.npy`, or one safetensors file.
    Samples,
    /// An image folder: one folder of JPEG/PNG images per class ([`crate::data::images`]).
    Images,
}

/// How a data set is read: as its first bytes say ([`DatasetFormat::Auto`], what
/// [`detect_format`] finds), or as the user says (`--dataset-format`), whatever they look like.
///
/// An image folder's format carries how its images are read (normalisation, threads, and the
/// log of skipped files), so that the training and the validation folder, each opened through
/// [`open_dataset_as`] with the run's format, are read alike and report to one log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DatasetFormat {
    #[default]
    Auto,
    /// Raw little-endian uint16 tokens (nanoGPT's `train.bin`).
    Raw,
    /// An llm.c token shard.
    LlmC,
    /// A 1-D `.npy` of tokens, or a directory of `x.npy` and `y.npy` samples.
    Npy,
    /// A safetensors file of samples `x` and `y`.
    Safetensors,
    /// A directory of class folders of JPEG/PNG images (torchvision's `ImageFolder`).
    Images(ImageOptions),
}

impl DatasetFormat {
    /// The name `--dataset-format` takes.
    pub fn name(&self) -> &'static str {
        match self {
            DatasetFormat::Auto => "auto",
            DatasetFormat::Raw => "raw",
            DatasetFormat::LlmC => "llmc",
            DatasetFormat::Npy => "npy",
            DatasetFormat::Safetensors => "safetensors",
            DatasetFormat::Images(_) => "images",
        }
    }

    /// What a file of this format is, in words.
    fn what(&self) -> &'static str {
        match self {
            DatasetFormat::Auto => "a data set",
            DatasetFormat::Raw => "raw uint16 tokens",
            DatasetFormat::LlmC => "an llm.c token shard",
            DatasetFormat::Npy => "a .npy array",
            DatasetFormat::Safetensors => "a safetensors file of samples x and y",
            DatasetFormat::Images(_) => "an image folder",
        }
    }

    /// The kind of data set this format holds (`path` tells a directory of `.npy` samples
    /// from a `.npy` token file).
    fn kind(&self, path: &Path) -> DatasetKind {
        match self {
            DatasetFormat::Images(_) => DatasetKind::Images,
            DatasetFormat::Safetensors => DatasetKind::Samples,
            DatasetFormat::Npy | DatasetFormat::Auto if path.is_dir() => DatasetKind::Samples,
            _ => DatasetKind::Tokens,
        }
    }
}

/// The format `path`'s data set is read as under `format`: `format` itself when given, else
/// what its first bytes say ([`detect_format`]).
pub fn resolve_format(path: &Path, format: DatasetFormat) -> Result<DatasetFormat, DataError> {
    match format {
        DatasetFormat::Auto => detect_format(path),
        f => Ok(f),
    }
}

/// The format `path`'s first bytes announce: a directory of folders holding no `x.npy` or
/// `y.npy` is an image folder (with the default [`ImageOptions`]), any other directory `.npy`
/// samples; a file is safetensors, `.npy`, an llm.c shard or raw tokens, tested in
/// that order ([`dataset_kind`], [`crate::data::tokens::detect_layout`]).
pub fn detect_format(path: &Path) -> Result<DatasetFormat, DataError> {
    if path.is_dir() {
        return Ok(match is_image_folder(path) {
            true => DatasetFormat::Images(ImageOptions::default()),
            false => DatasetFormat::Npy,
        });
    }
    if dataset_kind(path)? == DatasetKind::Samples {
        return Ok(DatasetFormat::Safetensors);
    }
    let mut reader = crate::data::array::WindowReader::open(path)?;
    Ok(match crate::data::tokens::detect_layout(reader.head(12)?) {
        TokenLayout::Raw => DatasetFormat::Raw,
        TokenLayout::LlmC => DatasetFormat::LlmC,
        TokenLayout::Npy => DatasetFormat::Npy,
    })
}

/// Whether the directory `dir` is an image folder: it holds a folder (a class) and neither
/// `x.npy` nor `y.npy`. Any other directory is taken for a sample set (whose reader names the
/// missing `.npy` file).
fn is_image_folder(dir: &Path) -> bool {
    if dir.join("x.npy").exists() || dir.join("y.npy").exists() {
        return false;
    }
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.is_dir()))
    })
}

/// `format` for the data set at `path`, with image folders read as `images` says: an explicit
/// image format takes `images`, and so does [`DatasetFormat::Auto`] where `path` is detected
/// as an image folder; every other format is left as it is (and a path that cannot be
/// inspected too, for opening it to name what is wrong).
pub fn with_image_options(
    format: DatasetFormat,
    path: &Path,
    images: &ImageOptions,
) -> DatasetFormat {
    match format {
        DatasetFormat::Images(_) => DatasetFormat::Images(images.clone()),
        DatasetFormat::Auto if matches!(detect_format(path), Ok(DatasetFormat::Images(_))) => {
            DatasetFormat::Images(images.clone())
        }
        f => f,
    }
}

/// The sentence that tells a user of a detected format how to read the file otherwise.
fn how_to_force(took: &DatasetFormat) -> String {
    let others: Vec<&str> = [
        DatasetFormat::Raw,
        DatasetFormat::LlmC,
        DatasetFormat::Npy,
        DatasetFormat::Safetensors,
    ]
    .into_iter()
    .filter(|f| f != took)
    .map(|f| f.name())
    .collect();
    format!(
        "--dataset-format {} reads it as another format",
        others.join("|")
    )
}

/// The longest safetensors header a sample set is taken to have: `x` and `y` need a few
/// hundred bytes, so a longer "header" is a token stream's bytes.
const MAX_SAMPLE_HEADER: u64 = 1 << 20;

/// Tells a sample set from a token stream by what is on disk: a directory is a pair of `.npy`
/// files, or an image folder where it holds folders and neither `x.npy` nor `y.npy`; a file whose first bytes are a safetensors header (an 8-byte little-endian length
/// that fits in the file, then that many bytes of JSON object) holds `x` and `y`; anything
/// else is a token stream, whose own reader then recognises its layout ([`TokenStream::open`]).
/// The header is parsed, not only its first byte looked at, so a raw uint16 token file whose
/// first tokens happen to read as a plausible length and a `{` is not taken for safetensors.
/// A FIFO, socket or device is refused (a data set is read with random access, and opening a
/// FIFO with no writer would wait forever).
pub fn dataset_kind(path: &Path) -> Result<DatasetKind, DataError> {
    let meta = std::fs::metadata(path).map_err(|e| DataError::io(path, "its metadata", e))?;
    if meta.is_dir() {
        return Ok(match is_image_folder(path) {
            true => DatasetKind::Images,
            false => DatasetKind::Samples,
        });
    }
    if !meta.is_file() {
        return Err(DataError::Format {
            file: path.to_path_buf(),
            field: "the file's kind".into(),
            reason: "it is not a regular file (a FIFO, socket or device); a data set is read with random access (offsets, epochs): write it to a file first".into(),
        });
    }
    let io = |e| DataError::io(path, "the first bytes", e);
    let mut f = std::fs::File::open(path).map_err(io)?;
    let len = meta.len();
    let mut head = [0u8; 9];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..]).map_err(io)? {
            0 => break,
            n => got += n,
        }
    }
    if got == head.len() {
        let n = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        if head[8] == b'{'
            && (2..=MAX_SAMPLE_HEADER).contains(&n)
            && n.checked_add(8).is_some_and(|end| end <= len)
        {
            let mut header = vec![0u8; n as usize];
            header[0] = b'{';
            f.read_exact(&mut header[1..]).map_err(io)?;
            if serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&header).is_ok()
            {
                return Ok(DatasetKind::Samples);
            }
        }
    }
    Ok(DatasetKind::Tokens)
}

/// Opens the data set at `path` for `g`'s inputs `x` and `y`, cut in `order` (token rows at
/// random offsets or in order; samples shuffled each epoch or in the file's order) from `seed`;
/// its format is detected from its first bytes.
///
/// An image folder read at random ([`Order::Random`], training's default) is shuffled each
/// epoch and augmented (random resized crop and flip); read in order ([`Order::Sequential`],
/// how a validation set is read) it goes through the evaluation transform (resize and center
/// crop) in the folder's order.
pub fn open_dataset(
    path: &Path,
    g: &Graph,
    order: Order,
    seed: u64,
) -> Result<Box<dyn BatchSource>, DataError> {
    open_dataset_as(path, g, order, seed, DatasetFormat::Auto)
}

/// As [`open_dataset`], read as `format`. A file whose detected format does not read is an
/// error that says what it was taken for and how to force another reading
/// ([`DataError::Detected`]).
pub fn open_dataset_as(
    path: &Path,
    g: &Graph,
    order: Order,
    seed: u64,
    format: DatasetFormat,
) -> Result<Box<dyn BatchSource>, DataError> {
    let took = resolve_format(path, format.clone())?;
    let open = || -> Result<Box<dyn BatchSource>, DataError> {
        let layout = match took {
            DatasetFormat::Raw => Some(TokenLayout::Raw),
            DatasetFormat::LlmC => Some(TokenLayout::LlmC),
            _ => Some(TokenLayout::Npy),
        };
        Ok(match took.kind(path) {
            DatasetKind::Images => {
                let options = match &took {
                    DatasetFormat::Images(o) => o.clone(),
                    _ => ImageOptions::default(),
                };
                let transform = match order {
                    Order::Random => Transform::Train,
                    Order::Sequential => Transform::Eval,
                };
                Box::new(ImageBatches::for_graph(
                    ImageFolder::open(path)?,
                    g,
                    transform,
                    seed,
                    options,
                )?)
            }
            DatasetKind::Tokens => Box::new(TokenBatches::for_graph(
                TokenStream::open_as(path, layout)?,
                g,
                order,
                seed,
            )?),
            DatasetKind::Samples => Box::new(SampleBatches::for_graph(
                SampleSet::open(path)?,
                g,
                order == Order::Random,
                seed,
            )?),
        })
    };
    open().map_err(|e| match e {
        // Only a format's own complaint is about the guess; a model or loader error is not.
        DataError::Format { .. } if format == DatasetFormat::Auto && !path.is_dir() => {
            DataError::Detected {
                file: path.to_path_buf(),
                took: took.what().to_string(),
                force: how_to_force(&took),
                source: Box::new(e),
            }
        }
        e => e,
    })
}

/// The kind of data set `path` holds when read as `format` (see [`DatasetFormat`]).
pub fn dataset_kind_as(path: &Path, format: DatasetFormat) -> Result<DatasetKind, DataError> {
    Ok(resolve_format(path, format)?.kind(path))
}

/// The files a data set at `path` is read from: `x.npy` and `y.npy` of a directory, the
/// folder itself for an image folder, or the file itself.
pub fn dataset_files(path: &Path) -> Vec<std::path::PathBuf> {
    if path.is_dir() && !is_image_folder(path) {
        vec![path.join("x.npy"), path.join("y.npy")]
    } else {
        vec![path.to_path_buf()]
    }
}

/// Blocks a data set's fingerprint hashes in each file (the first and last among them).
const FINGERPRINT_BLOCKS: u64 = 16;
/// Bytes of each block.
const FINGERPRINT_BLOCK: u64 = 64 << 10;

/// What identifies a data set when a run resumes: its contents and how it is cut, not the path
/// it was given by. `description` is the batch source's ([`BatchSource::describe`], which names
/// `path` as typed); the fingerprint holds it with that path left out, each file's size, and an
/// FNV-1a-64 hash of its bytes: the whole file up to 1 MiB, beyond that 16 blocks of 64 KiB
/// spread evenly from the first to the last. So the same file by another path, or a copy of it,
/// is the same data set; another file, a file of another length, or another batch shape is not.
/// (A file edited in place to the same length only between those blocks would pass.)
///
/// An image folder's fingerprint is its listing's and a few of its images' instead
/// ([`ImageFolder::fingerprint`]): a million files are not read to resume a run.
pub fn dataset_fingerprint(path: &Path, description: &str) -> Result<String, DataError> {
    if path.is_dir() && is_image_folder(path) {
        let folder = ImageFolder::open(path)?;
        let cut = description.replace(&path.display().to_string(), "<data set>");
        return Ok(format!(
            "{cut}; {} images; fnv1a64 {:016x}",
            folder.len(),
            folder.fingerprint()?
        ));
    }
    let files = dataset_files(path);
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut sizes = Vec::with_capacity(files.len());
    let mut block = vec![0u8; FINGERPRINT_BLOCK as usize];
    for file in &files {
        let io = |e| DataError::io(file, "its contents (for the checkpoint's fingerprint)", e);
        let mut f = std::fs::File::open(file).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        sizes.push(len.to_string());
        let starts: Vec<u64> = if len <= FINGERPRINT_BLOCKS * FINGERPRINT_BLOCK {
            (0..len.div_ceil(FINGERPRINT_BLOCK))
                .map(|k| k * FINGERPRINT_BLOCK)
                .collect()
        } else {
            let last = len - FINGERPRINT_BLOCK;
            (0..FINGERPRINT_BLOCKS)
                .map(|k| last / (FINGERPRINT_BLOCKS - 1) * k)
                .map(|s| if s > last { last } else { s })
                .chain(std::iter::once(last))
                .collect()
        };
        for start in starts {
            let n = FINGERPRINT_BLOCK.min(len - start) as usize;
            f.seek(SeekFrom::Start(start)).map_err(io)?;
            f.read_exact(&mut block[..n]).map_err(io)?;
            for &b in &block[..n] {
                hash = (hash ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    let cut = description.replace(&path.display().to_string(), "<data set>");
    Ok(format!(
        "{cut}; {} bytes; fnv1a64 {hash:016x}",
        sizes.join(" + ")
    ))
}
