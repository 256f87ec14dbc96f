//! Batches cut from a data set in the layout of the model's inputs `x` and `y`, written into
//! caller-owned byte buffers (native-endian elements of the input's dtype, row-major), and the
//! [`Epochs`] cursor over them.
//!
//! A batch is named by (epoch, batch index), and its contents depend only on that pair and the
//! seed: random token offsets come from a ChaCha8 generator keyed by (seed, epoch, batch), a
//! sample epoch's order from one keyed by (seed, epoch). So a run resumed from a
//! [`Position`] sees exactly the batches the uninterrupted run would have seen, and
//! [`Epochs::restore`] costs no replay.
//!
//! - Tokens ([`TokenBatches`]): `batch` rows of `seq + 1` consecutive tokens; `x` is a row's
//!   first `seq`, `y` its last `seq` (the next token of each), both `[batch, seq]` as the GPT
//!   models take them. In order, row `r` of the epoch starts at token `r * seq` (rows overlap by
//!   one token, as in llm.c); an epoch is the whole rows that fit, whole batches of them.
//!   At random, each row starts at a uniform offset (as nanoGPT's `get_batch`), and an epoch has
//!   as many batches as in order, so that both see about the file's token count per epoch.
//! - Samples ([`SampleBatches`]): `batch` samples in the epoch's order (a seeded shuffle, or the
//!   file's order), each sample exactly once per epoch; the final partial batch is dropped, and
//!   [`BatchSource::dropped_per_epoch`] says how many samples that leaves out.

use super::error::DataError;
use super::samples::SampleSet;
use super::tokens::TokenStream;
use ingot_compiler::ir::{DType, Graph, LeafKind, TensorType};
use ingot_runtime::tensor::{Data, Tensor};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Uniform};
use serde::{Deserialize, Serialize};

/// One input of the model a batch fills: its name, dtype and dims (batch first).
#[derive(Clone, Debug, PartialEq)]
pub struct InputSlot {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<usize>,
}

impl InputSlot {
    /// The bytes of one batch of this input.
    pub fn bytes(&self) -> usize {
        self.dims.iter().product::<usize>() * self.dtype.size()
    }

    /// The tensor held by `bytes`, a buffer filled for this slot (allocates: for the CPU path
    /// and for tests; the staged path copies the bytes straight into the planned slot).
    /// `None` if `bytes` is shorter than a batch or the dtype is one batches never hold.
    pub fn to_tensor(&self, bytes: &[u8]) -> Option<Tensor> {
        let b = bytes.get(..self.bytes())?;
        fn read<const N: usize, T>(b: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
            b.chunks_exact(N)
                .map(|c| f(c.try_into().expect("chunks of N")))
                .collect()
        }
        let data = match self.dtype {
            DType::F32 => Data::F32(read(b, f32::from_ne_bytes)),
            DType::F64 => Data::F64(read(b, f64::from_ne_bytes)),
            DType::I32 => Data::I32(read(b, i32::from_ne_bytes)),
            DType::I64 => Data::I64(read(b, i64::from_ne_bytes)),
            _ => return None,
        };
        Some(Tensor {
            ty: TensorType::new(self.dims.as_slice(), self.dtype),
            data,
        })
    }
}

/// Where a run stands in its data: the next batch to be produced is batch `batch` of epoch
/// `epoch`, under shuffle seed `seed`. Saved in checkpoints; [`Epochs::restore`] takes it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub epoch: u64,
    pub batch: u64,
    pub seed: u64,
}

/// Which batch a filled buffer holds, and the position to save once the step that used it is
/// done (the batch after it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchInfo {
    pub epoch: u64,
    pub batch: u64,
    /// The first batch of its epoch.
    pub first_of_epoch: bool,
    pub next: Position,
}

/// What an epoch leaves out: the samples (or tokens) past the last whole batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub count: u64,
    /// "samples" or "tokens".
    pub unit: &'static str,
}

/// What every source holds alike: the model's inputs `x` and `y` its batches fill, and the
/// seed of its shuffle or random offsets. A source lends it by [`BatchSource::cut`], and the
/// trait's [`BatchSource::x`], [`BatchSource::y`] and [`BatchSource::seed`] read it, so each
/// source writes one accessor instead of three; the checks and counts that token, sample and
/// image batches share are its methods.
#[derive(Clone, Debug, PartialEq)]
pub struct Cut {
    pub x: InputSlot,
    pub y: InputSlot,
    pub seed: u64,
}

impl Cut {
    /// The inputs `x` and `y` of `g` with `seed`; a model without one is an error naming the
    /// data set at `path`.
    pub fn of_graph(g: &Graph, path: &std::path::Path, seed: u64) -> Result<Cut, DataError> {
        let slot = |name: &str| {
            graph_slot(g, name).ok_or_else(|| {
                DataError::model(path, format!("the model has no input named {name}"))
            })
        };
        Ok(Cut {
            x: slot("x")?,
            y: slot("y")?,
            seed,
        })
    }

    /// The rows (samples, token windows) of a batch: the first axis of `x`.
    pub fn batch(&self) -> usize {
        self.x.dims.first().copied().unwrap_or(0)
    }

    /// Checks that `y` takes one integer class id per sample of the batch, as classifiers'
    /// labels do; an error naming the data set at `path` otherwise.
    pub(crate) fn check_labels(&self, path: &std::path::Path) -> Result<(), DataError> {
        let (batch, y) = (self.batch(), &self.y);
        if y.dims.iter().product::<usize>() != batch || !matches!(y.dtype, DType::I32 | DType::I64)
        {
            return Err(DataError::model(
                path,
                format!(
                    "the model's input y is {:?} {}; class labels need {batch} integer ids (i32 or i64)",
                    y.dims,
                    y.dtype.name()
                ),
            ));
        }
        Ok(())
    }

    /// The whole batches of an epoch over `n` samples, each sample at most once.
    pub(crate) fn sample_batches(&self, n: u64) -> u64 {
        n / self.batch() as u64
    }

    /// What an epoch over `n` samples leaves out: those past the last whole batch.
    pub(crate) fn samples_dropped(&self, n: u64) -> Dropped {
        Dropped {
            count: n % self.batch() as u64,
            unit: "samples",
        }
    }
}

/// A data set cut into batches, each named by (epoch, index).
pub trait BatchSource: Send {
    /// The inputs the batches fill and the seed they are cut with.
    fn cut(&self) -> &Cut;
    fn x(&self) -> &InputSlot {
        &self.cut().x
    }
    fn y(&self) -> &InputSlot {
        &self.cut().y
    }
    /// The seed of the shuffle or of the random offsets.
    fn seed(&self) -> u64 {
        self.cut().seed
    }
    /// Whole batches per epoch (at least 1: a data set that cannot fill one is refused when
    /// the source is made).
    fn batches_per_epoch(&self) -> u64;
    /// Fills batch `batch` (< [`BatchSource::batches_per_epoch`]) of `epoch` into `x` and `y`,
    /// which are [`InputSlot::bytes`] long (or longer). Allocates nothing.
    fn fill(&mut self, epoch: u64, batch: u64, x: &mut [u8], y: &mut [u8])
        -> Result<(), DataError>;
    /// What each epoch leaves out (the dropped final partial batch): to be said once.
    fn dropped_per_epoch(&self) -> Dropped;
    /// A line identifying the data set and how it is cut, for checkpoints and logs.
    fn describe(&self) -> String;
    /// Checks every token id (or label) of the file against the model's bound, reading it
    /// once in 1 MiB pieces: a run can refuse bad data before its first step instead of
    /// meeting it hours in (batches check the ids they hold in any case).
    fn check_all(&mut self) -> Result<(), DataError>;
}

impl<S: BatchSource + ?Sized> BatchSource for Box<S> {
    fn cut(&self) -> &Cut {
        (**self).cut()
    }
    fn batches_per_epoch(&self) -> u64 {
        (**self).batches_per_epoch()
    }
    fn fill(
        &mut self,
        epoch: u64,
        batch: u64,
        x: &mut [u8],
        y: &mut [u8],
    ) -> Result<(), DataError> {
        (**self).fill(epoch, batch, x, y)
    }
    fn dropped_per_epoch(&self) -> Dropped {
        (**self).dropped_per_epoch()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn check_all(&mut self) -> Result<(), DataError> {
        (**self).check_all()
    }
}

/// Writes integer `v` as element `i` of `out`, in `dtype` (an integer or float type).
#[inline]
fn put_int(dtype: DType, out: &mut [u8], i: usize, v: u64) {
    match dtype {
        DType::I64 => out[i * 8..i * 8 + 8].copy_from_slice(&(v as i64).to_ne_bytes()),
        DType::I32 => out[i * 4..i * 4 + 4].copy_from_slice(&(v as i32).to_ne_bytes()),
        DType::F32 => out[i * 4..i * 4 + 4].copy_from_slice(&(v as f32).to_ne_bytes()),
        DType::F64 => out[i * 8..i * 8 + 8].copy_from_slice(&(v as f64).to_ne_bytes()),
        _ => unreachable!("slot dtypes are checked when the source is made"),
    }
}

/// Writes `v` as element `i` of `out`, in the float type `dtype`.
#[inline]
/// A uint8 pixel scaled to `[0, 1]` in `dtype` (divided in that dtype, as
/// `img.to(dtype).div(255)`).
fn put_unit(dtype: DType, out: &mut [u8], i: usize, v: u8) {
    match dtype {
        DType::F32 => out[i * 4..i * 4 + 4].copy_from_slice(&(v as f32 / 255.0).to_ne_bytes()),
        DType::F64 => out[i * 8..i * 8 + 8].copy_from_slice(&(v as f64 / 255.0).to_ne_bytes()),
        _ => unreachable!("only float inputs are scaled"),
    }
}

/// The layout of `file`'s samples in the model's input `x`: an image array `[n, a, b, c]` into
/// an image input `[batch, C, H, W]` is NCHW if `[a, b, c] = [C, H, W]`, NHWC if it is
/// `[H, W, C]`, and an error naming the file and both shapes otherwise; anything else keeps the
/// file's order (its row length is checked by the caller).
fn image_layout(file: &super::array::ArrayInfo, x: &InputSlot) -> Result<Layout, DataError> {
    let (&[_, a, b, c], &[_, ch, h, w]) = (file.shape.as_slice(), x.dims.as_slice()) else {
        return Ok(Layout::Same);
    };
    if [a, b, c] == [ch, h, w] {
        return Ok(Layout::Same);
    }
    if [a, b, c] == [h, w, ch] {
        if !x.dtype.is_float() {
            return Err(DataError::model(
                &file.file,
                format!(
                    "x holds NHWC images {:?} but the model's input x is {}; images feed a float input",
                    &file.shape[1..],
                    x.dtype.name()
                ),
            ));
        }
        return Ok(Layout::Nhwc { h, w, c: ch });
    }
    Err(DataError::model(
        &file.file,
        format!(
            "x holds images of shape {:?} per sample, but the model's input x {:?} takes NCHW {:?} or NHWC {:?}",
            &file.shape[1..],
            x.dims,
            [ch, h, w],
            [h, w, ch]
        ),
    ))
}

fn put_float(dtype: DType, out: &mut [u8], i: usize, v: f64) {
    match dtype {
        DType::F32 => out[i * 4..i * 4 + 4].copy_from_slice(&(v as f32).to_ne_bytes()),
        DType::F64 => out[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes()),
        _ => unreachable!("slot dtypes are checked when the source is made"),
    }
}

/// The sample order of one epoch of the sample sets and the image folders, allocated once and
/// drawn again in place when the epoch changes ([`epoch_order`]). One copy of the cache and
/// its batch slicing for [`SampleBatches`] and the image batches.
#[derive(Debug)]
pub(crate) struct EpochOrder {
    order: Vec<u32>,
    /// The epoch `order` is the order of.
    epoch: Option<u64>,
}

impl EpochOrder {
    /// An order of `n` samples, drawn at the first [`EpochOrder::prepare`].
    pub(crate) fn new(n: usize) -> EpochOrder {
        EpochOrder {
            order: Vec::with_capacity(n),
            epoch: None,
        }
    }

    /// Makes the order the one of `epoch` over `n` samples (drawn only when it holds another
    /// epoch's).
    pub(crate) fn prepare(&mut self, epoch: u64, n: u32, shuffle: bool, seed: u64) {
        if self.epoch == Some(epoch) {
            return;
        }
        epoch_order(&mut self.order, n, shuffle, seed, epoch);
        self.epoch = Some(epoch);
    }

    /// The samples of batch `batch` of `b` samples in the prepared epoch, in order.
    pub(crate) fn batch(&self, batch: u64, b: usize) -> &[u32] {
        let s = batch as usize * b;
        &self.order[s..s + b]
    }
}

/// Fills `order` with `0..n`, shuffled when `shuffle` by the generator of (`seed`, `epoch`)
/// (Fisher-Yates from the end): the epoch order of the sample sets and the image folders, the
/// same on every machine. Reuses `order`'s allocation.
fn epoch_order(order: &mut Vec<u32>, n: u32, shuffle: bool, seed: u64, epoch: u64) {
    order.clear();
    order.extend(0..n);
    if shuffle {
        let mut rng = rng_at(seed, epoch, u64::MAX);
        for i in (1..n as usize).rev() {
            let j = Uniform::new_inclusive(0, i)
                .expect("0 <= i")
                .sample(&mut rng);
            order.swap(i, j);
        }
    }
}

/// A generator keyed by (seed, epoch, batch): the same triple gives the same draws anywhere.
pub(crate) fn rng_at(seed: u64, epoch: u64, batch: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    key[16..24].copy_from_slice(&batch.to_le_bytes());
    key[24..].copy_from_slice(b"ingotdat");
    ChaCha8Rng::from_seed(key)
}

/// The graph's input leaf `name`, as a slot.
pub(crate) fn graph_slot(g: &Graph, name: &str) -> Option<InputSlot> {
    let id = g.leaf(name)?;
    g.leaves(LeafKind::Input).contains(&id).then(|| {
        let ty = g.ty(id);
        InputSlot {
            name: name.to_string(),
            dtype: ty.dtype,
            dims: ty.shape.dims().to_vec(),
        }
    })
}

/// How token rows are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Consecutive rows from the start of the file, the same every epoch.
    Sequential,
    /// Rows at uniform random offsets, drawn from the seed.
    Random,
}

/// Token batches of `batch` rows of `seq + 1` tokens.
#[derive(Debug)]
pub struct TokenBatches {
    stream: TokenStream,
    cut: Cut,
    vocab: u64,
    order: Order,
    rows: u64,
}

impl TokenBatches {
    /// Batches for inputs `x` and `y`, both `[batch, seq]` of an integer dtype, with ids below
    /// `vocab`. The stream must hold at least `batch * seq + 1` tokens (one batch of rows).
    pub fn new(
        mut stream: TokenStream,
        x: InputSlot,
        y: InputSlot,
        vocab: u64,
        order: Order,
        seed: u64,
    ) -> Result<TokenBatches, DataError> {
        let path = stream.path().to_path_buf();
        let (batch, seq) = match x.dims[..] {
            [b, s] if b > 0 && s > 0 => (b, s),
            _ => {
                return Err(DataError::model(
                    &path,
                    format!(
                    "the model's input x is {:?}; token batches need [batch, seq], both above 0",
                    x.dims
                ),
                ))
            }
        };
        if y.dims != x.dims {
            return Err(DataError::model(
                &path,
                format!("the model's input y is {:?} but x is {:?}; token batches give both [batch, seq]", y.dims, x.dims),
            ));
        }
        for s in [&x, &y] {
            if !matches!(s.dtype, DType::I32 | DType::I64) {
                return Err(DataError::model(
                    &path,
                    format!(
                        "the model's input {} is {}; token ids need an integer input (i32 or i64)",
                        s.name,
                        s.dtype.name()
                    ),
                ));
            }
        }
        let rows = stream.len().saturating_sub(1) / seq as u64;
        if rows < batch as u64 {
            return Err(DataError::TooSmall {
                file: path,
                reason: format!(
                    "{} tokens cannot fill one batch: {batch} rows of {seq} + 1 tokens need at least {}",
                    stream.len(),
                    batch as u64 * seq as u64 + 1
                ),
            });
        }
        stream.reserve(seq + 1);
        Ok(TokenBatches {
            stream,
            cut: Cut { x, y, seed },
            vocab,
            order,
            rows,
        })
    }

    /// Batches for the inputs `x` and `y` of `g` (a GPT's `[batch, seq]` token ids), with the
    /// vocabulary read off its embedding table ([`crate::init::id_bound`]).
    pub fn for_graph(
        stream: TokenStream,
        g: &Graph,
        order: Order,
        seed: u64,
    ) -> Result<TokenBatches, DataError> {
        let path = stream.path().to_path_buf();
        let Cut { x, y, seed } = Cut::of_graph(g, &path, seed)?;
        let vocab = id_bound(
            g,
            &path,
            "x",
            "embedding table to read the vocabulary size off",
        )?;
        TokenBatches::new(stream, x, y, vocab, order, seed)
    }

    pub fn stream_mut(&mut self) -> &mut TokenStream {
        &mut self.stream
    }

    fn shape(&self) -> (usize, usize) {
        (self.cut.x.dims[0], self.cut.x.dims[1])
    }
}

impl BatchSource for TokenBatches {
    fn cut(&self) -> &Cut {
        &self.cut
    }
    fn batches_per_epoch(&self) -> u64 {
        self.rows / self.shape().0 as u64
    }
    fn fill(
        &mut self,
        epoch: u64,
        batch: u64,
        x: &mut [u8],
        y: &mut [u8],
    ) -> Result<(), DataError> {
        let (rows, seq) = self.shape();
        let (xd, yd) = (self.cut.x.dtype, self.cut.y.dtype);
        let last_start = self.stream.len() - seq as u64 - 1;
        let mut rng = rng_at(self.cut.seed, epoch, batch);
        let offsets = Uniform::new_inclusive(0, last_start).expect("0 <= last_start");
        for r in 0..rows {
            let start = match self.order {
                Order::Sequential => (batch * rows as u64 + r as u64) * seq as u64,
                Order::Random => offsets.sample(&mut rng),
            };
            let base = r * seq;
            self.stream.read(start, seq + 1, self.vocab, |i, id| {
                if i < seq {
                    put_int(xd, x, base + i, id);
                }
                if i > 0 {
                    put_int(yd, y, base + i - 1, id);
                }
            })?;
        }
        Ok(())
    }
    fn dropped_per_epoch(&self) -> Dropped {
        let count = match self.order {
            Order::Sequential => {
                let (rows, seq) = self.shape();
                let used = self.batches_per_epoch() * rows as u64 * seq as u64 + 1;
                self.stream.len() - used
            }
            Order::Random => 0,
        };
        Dropped {
            count,
            unit: "tokens",
        }
    }
    fn describe(&self) -> String {
        format!(
            "tokens {}: batch {} x seq {}, {:?}, vocab {}",
            self.stream.describe(),
            self.cut.x.dims[0],
            self.cut.x.dims[1],
            self.order,
            self.vocab
        )
    }
    fn check_all(&mut self) -> Result<(), DataError> {
        self.stream.check_ids(self.vocab)
    }
}

/// The bound of input `input`'s ids ([`crate::init::id_bound`]); an error saying the model has
/// no `what` where it has none.
pub(crate) fn id_bound(
    g: &Graph,
    path: &std::path::Path,
    input: &str,
    what: &str,
) -> Result<u64, DataError> {
    crate::init::id_bound(g, input)
        .map(|b| b as u64)
        .ok_or_else(|| DataError::model(path, format!("the model has no {what}")))
}

/// How a sample's features are laid into a row of the model's input `x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// In the file's order (a row of as many elements: NCHW images, flat features).
    Same,
    /// NHWC images (`[n, H, W, C]`) into an NCHW input `[batch, C, H, W]`: element
    /// `(h, w, c)` of a sample goes to `(c, h, w)`.
    Nhwc { h: usize, w: usize, c: usize },
}

/// Sample batches: `batch` samples per batch, shuffled per epoch or in the file's order.
///
/// Image arrays: features `[n, C, H, W]` (NCHW, PyTorch's layout) or `[n, H, W, C]` (NHWC, the
/// layout of most image files and of NumPy/TensorFlow data sets) feed a model input
/// `[batch, C, H, W]`; NHWC samples are transposed to NCHW as they are read into the batch (an
/// array that is both, `C = H = W`, is taken as NCHW). uint8 features into a float input are
/// scaled to `[0, 1]` (`/ 255`, torchvision's `ToTensor`), in the input's dtype; every other
/// element type keeps its value.
#[derive(Debug)]
pub struct SampleBatches {
    set: SampleSet,
    layout: Layout,
    /// uint8 features into a float input: divided by 255.
    unit_scale: bool,
    cut: Cut,
    classes: u64,
    shuffle: bool,
    /// The sample order of the epoch being read (allocated once, reshuffled in place).
    order: EpochOrder,
}

impl SampleBatches {
    /// Batches for inputs `x` (`[batch, ...]`, holding as many elements per sample as the
    /// file's `x` rows, float unless the file's features are integers) and `y` (`batch`
    /// integer class ids below `classes`).
    pub fn new(
        mut set: SampleSet,
        x: InputSlot,
        y: InputSlot,
        classes: u64,
        shuffle: bool,
        seed: u64,
    ) -> Result<SampleBatches, DataError> {
        let xf = set.x().file.clone();
        let yf = set.y().file.clone();
        let batch = *x.dims.first().unwrap_or(&0);
        if batch == 0 {
            return Err(DataError::model(&xf, format!("the model's input x is {:?}; sample batches need [batch, ...] with batch above 0", x.dims)));
        }
        let row: usize = x.dims[1..].iter().product();
        let layout = image_layout(set.x(), &x)?;
        if row as u64 != set.x().row_elems() {
            return Err(DataError::model(
                &xf,
                format!(
                    "x holds samples of shape {:?} ({} elements) but the model's input x takes {:?} ({row} per sample)",
                    &set.x().shape[1..],
                    set.x().row_elems(),
                    &x.dims[1..]
                ),
            ));
        }
        match x.dtype {
            DType::F32 | DType::F64 => {}
            DType::I32 | DType::I64 if !set.x().elem.is_float() => {}
            d => {
                return Err(DataError::model(
                    &xf,
                    format!(
                        "x holds {} but the model's input x is {}",
                        set.x().elem.name(),
                        d.name()
                    ),
                ))
            }
        }
        let cut = Cut { x, y, seed };
        cut.check_labels(&yf)?;
        let n = set.len();
        if n > u32::MAX as u64 {
            return Err(DataError::TooSmall {
                file: xf,
                reason: format!("{n} samples is more than the {} supported", u32::MAX),
            });
        }
        if n < batch as u64 {
            return Err(DataError::TooSmall {
                file: xf,
                reason: format!("{n} samples cannot fill one batch of {batch}"),
            });
        }
        set.reserve();
        let unit_scale = cut.x.dtype.is_float() && set.x().elem == super::array::Elem::U8;
        Ok(SampleBatches {
            set,
            layout,
            unit_scale,
            cut,
            classes,
            shuffle,
            order: EpochOrder::new(n as usize),
        })
    }

    /// Batches for the inputs `x` and `y` of `g`, with the class count read off its output
    /// layer ([`crate::init::id_bound`]).
    pub fn for_graph(
        set: SampleSet,
        g: &Graph,
        shuffle: bool,
        seed: u64,
    ) -> Result<SampleBatches, DataError> {
        let path = set.path().clone();
        let Cut { x, y, seed } = Cut::of_graph(g, &path, seed)?;
        let classes = id_bound(g, &path, "y", "output layer to read the class count off")?;
        SampleBatches::new(set, x, y, classes, shuffle, seed)
    }

    pub fn set_mut(&mut self) -> &mut SampleSet {
        &mut self.set
    }

    /// The sample order of `epoch`: the file's order, or a Fisher-Yates shuffle drawn from a
    /// generator keyed by (seed, epoch). Reuses the order's allocation.
    fn order_for(&mut self, epoch: u64) {
        let n = self.set.len() as u32;
        self.order.prepare(epoch, n, self.shuffle, self.cut.seed);
    }

    /// The samples of batch `batch` of `epoch`, in order (for tests and logs).
    pub fn samples_of(&mut self, epoch: u64, batch: u64) -> &[u32] {
        self.order_for(epoch);
        self.order.batch(batch, self.cut.batch())
    }
}

impl BatchSource for SampleBatches {
    fn cut(&self) -> &Cut {
        &self.cut
    }
    fn batches_per_epoch(&self) -> u64 {
        self.cut.sample_batches(self.set.len())
    }
    fn fill(
        &mut self,
        epoch: u64,
        batch: u64,
        x: &mut [u8],
        y: &mut [u8],
    ) -> Result<(), DataError> {
        self.order_for(epoch);
        let b = self.cut.batch();
        let row = self.set.x().row_elems() as usize;
        let src = self.set.x().elem;
        let (xd, yd) = (self.cut.x.dtype, self.cut.y.dtype);
        let (layout, unit_scale) = (self.layout, self.unit_scale);
        for r in 0..b {
            let i = self.order.batch(batch, b)[r] as u64;
            let label = self.set.label(i, self.classes)?;
            put_int(yd, y, r, label);
            let bytes = self.set.features(i)?;
            let size = src.size();
            for (j, e) in bytes.chunks_exact(size).enumerate() {
                // Where element j of the sample goes in the model's row.
                let at = match layout {
                    Layout::Same => j,
                    Layout::Nhwc { h, w, c } => {
                        let (pixel, ch) = (j / c, j % c);
                        ch * h * w + pixel
                    }
                };
                if unit_scale {
                    put_unit(xd, x, r * row + at, e[0]);
                } else if xd.is_float() {
                    put_float(xd, x, r * row + at, src.float(e));
                } else {
                    // Integer features into an integer input (checked when made).
                    put_int(
                        xd,
                        x,
                        r * row + at,
                        src.int(e).expect("integer features") as u64,
                    );
                }
            }
        }
        Ok(())
    }
    fn dropped_per_epoch(&self) -> Dropped {
        self.cut.samples_dropped(self.set.len())
    }
    fn describe(&self) -> String {
        format!(
            "samples {}: batch {}, {} classes, shuffle {}",
            self.set.describe(),
            self.cut.batch(),
            self.classes,
            self.shuffle
        )
    }
    fn check_all(&mut self) -> Result<(), DataError> {
        self.set.check_labels(self.classes)
    }
}

/// A cursor over a source's batches, epoch after epoch: it knows the [`Position`] of the next
/// batch and can be put back at any position of the same source and seed.
#[derive(Debug)]
pub struct Epochs<S> {
    source: S,
    next: Position,
    /// Stop before this epoch (`None`: never stop).
    end_epoch: Option<u64>,
}

impl<S: BatchSource> Epochs<S> {
    /// From the first batch of epoch 0, without end.
    pub fn new(source: S) -> Epochs<S> {
        let seed = source.seed();
        Epochs {
            source,
            next: Position {
                epoch: 0,
                batch: 0,
                seed,
            },
            end_epoch: None,
        }
    }

    /// Stops after `epochs` epochs (counted from epoch 0, whatever the position).
    pub fn epochs(mut self, epochs: u64) -> Epochs<S> {
        self.end_epoch = Some(epochs);
        self
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// The position of the next batch [`Epochs::next_into`] will give.
    pub fn position(&self) -> Position {
        self.next
    }

    /// Puts the cursor at `p`, as saved by a run over the same data set and seed. A batch
    /// index at the end of an epoch means the start of the next.
    pub fn restore(&mut self, p: Position) -> Result<(), String> {
        let per = self.source.batches_per_epoch();
        if p.seed != self.source.seed() {
            return Err(format!(
                "the position was saved with seed {} but the data is cut with seed {}",
                p.seed,
                self.source.seed()
            ));
        }
        if p.batch > per {
            return Err(format!(
                "batch {} of epoch {} is past the {per} batches of an epoch of this data set (a different data set or batch size?)",
                p.batch, p.epoch
            ));
        }
        self.next = if p.batch == per {
            Position {
                epoch: p.epoch + 1,
                batch: 0,
                ..p
            }
        } else {
            p
        };
        Ok(())
    }

    /// Fills the next batch into `x` and `y` and moves on; `None` past the last epoch.
    pub fn next_into(
        &mut self,
        x: &mut [u8],
        y: &mut [u8],
    ) -> Result<Option<BatchInfo>, DataError> {
        let p = self.next;
        if self.end_epoch.is_some_and(|e| p.epoch >= e) {
            return Ok(None);
        }
        self.source.fill(p.epoch, p.batch, x, y)?;
        let per = self.source.batches_per_epoch();
        self.next = if p.batch + 1 == per {
            Position {
                epoch: p.epoch + 1,
                batch: 0,
                ..p
            }
        } else {
            Position {
                batch: p.batch + 1,
                ..p
            }
        };
        Ok(Some(BatchInfo {
            epoch: p.epoch,
            batch: p.batch,
            first_of_epoch: p.batch == 0,
            next: self.next,
        }))
    }
}
