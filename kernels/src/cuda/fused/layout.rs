//! The strategy stage of a reduction that maps threads onto rows: how many threads a row, how
//! many rows a block, and whether the loads that several loops read stay in registers. The
//! measurements behind each threshold are with the constant that holds it.

use super::analysis::Analysis;
use super::passes::Passes;
use crate::cuda::emit::{grid_for, reg_size, MAX_GRID_ROWS};
use crate::cuda::kernel::{CodegenError, Launch, Strategy};
use crate::fused::Inst;

/// Blocks that fill an H100 twice over (132 SMs): fewer than this, and the row and column
/// strategies use bigger blocks.
pub(super) const FILL: usize = 2 * 132;
/// Static shared memory a block may declare.
pub(super) const MAX_SHARED: usize = 48 * 1024;

/// Register caching of loads across passes: at most this many elements per thread when every
/// load the loops read is cached, and this many 32-bit registers per thread for all the cached
/// loads together.
pub(super) const CACHE_PER_THREAD: usize = 32;
pub(super) const CACHE_WORDS: usize = 32;
/// Elements per thread when the row gets more threads so that its loads fit in registers
/// (see `Analysis::layout`): at most this many, or [`CACHE_SPLIT_MAX`] with 1024 threads a
/// row; and at most `CACHE_SPLIT_MAX` whenever some loads the loops read are not cached
/// (those are read from memory in the unrolled loops: more would keep too many loads in
/// flight).
pub(super) const CACHE_SPLIT_PER_THREAD: usize = 4;
pub(super) const CACHE_SPLIT_MAX: usize = 8;

/// Threads (rows × threads a row) that count as plenty: a row-strategy kernel with at least
/// this many may give each thread more elements (see `Analysis::layout`).
pub(super) const ROW_THREADS_PLENTY: usize = 1 << 21;

/// The column strategy puts as many rows side by side in a block (32 down to 8) as leave at
/// least this many blocks. Measured on an H200 (GPT-2's bias gradients, 8192 rows summed):
/// 768 columns take 11.4 µs with 16 a block (48 blocks), 14.1 with 8, 15.5 with 32; 2304
/// columns 28.3 µs with 32, 30.5 with 8; 3072 columns 31.6 µs with 32, 36.3 with 8.
pub(super) const COLUMN_BLOCKS: usize = 48;

/// Rows of at most this many elements get a group of lanes of one warp, not a block.
pub(super) const GROUP_MAX_N: usize = 1024;

/// How the threads of a block map onto rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// Row strategy, long rows: one block of `t` threads per row.
    Block { t: u32 },
    /// Row strategy, short rows: `w` lanes of one warp per row (a power of two up to 32), `g`
    /// rows a block; partials combine by shuffles alone.
    Group { w: u32, g: u32 },
    /// Column strategy: `x` rows side by side, `y` threads along each.
    Columns { x: u32, y: u32 },
}

impl Analysis<'_> {
    /// The launch layout of a reduction kernel, and whether the loops over the row keep the
    /// loads that several of them read in registers (`loop_uses[i]`: how many loops read
    /// load `i`).
    ///
    /// The row strategy's default layout (a group of up to 32 lanes per short row, a block per
    /// long row, see [`row_threads`]) is kept when caching is not wanted (no load is read by
    /// several loops) or fits it: the cached loads within [`CACHE_WORDS`] registers a thread,
    /// and at most [`CACHE_SPLIT_MAX`] elements a thread, or [`CACHE_PER_THREAD`] when every
    /// load the loops read is cached (a short softmax). Otherwise the row gets more threads:
    /// with plenty of rows ([`ROW_THREADS_PLENTY`] threads in all), the fewest whose cached
    /// values take at most half of [`CACHE_WORDS`]; otherwise
    /// the fewest (a power of two, up to 1024) that leave each thread at most
    /// [`CACHE_SPLIT_PER_THREAD`] elements (at most [`CACHE_SPLIT_MAX`] with 1024), the cached
    /// loads within [`CACHE_WORDS`]; the loads read by one loop only are then read from memory
    /// in the unrolled loops, a few at a time. Rows too long for that (more than 8192
    /// elements, or fewer with many loads) read memory in every loop.
    ///
    /// Measured on an H200 (GPT-2's rows of 768 and 1024): GPT-2's attention backward (two
    /// cached loads, rows of 1024) takes 838 µs with 32 lanes and nothing cached, 1150 µs with
    /// 64 threads (16 elements each: 114 registers), 748 with 128, 662 with 256, 930 with 512;
    /// LayerNorms over 768 are 30-45% faster with 128 or 256 threads (equal) than with 32
    /// lanes, 10-25% slower with 512.
    pub(super) fn layout(&self, reductions: usize, loop_uses: &[usize]) -> (Layout, bool) {
        let (lay, cache) = self.layout_by_length(reductions, loop_uses);
        match lay {
            Layout::Block { t } if cache && self.tuning.row_threads.is_none() => (
                Layout::Block {
                    t: self.in_whole_vectors(t),
                },
                cache,
            ),
            _ => (lay, cache),
        }
    }

    /// The threads of a cached row's block (`t`, a power of two) changed to give each thread a
    /// whole number of vectors of 4 ([`super::rowvec`]) where `t` leaves it 2 or 3 elements
    /// (or some fraction between): a row of `4·t'`
    /// elements, `t'` a multiple of 32 from 64 to 1024, gets `t'` (rows of 768: 192 threads,
    /// 4 elements each, instead of 256 with 3). Measured on an H200 (session 12), GPT-2's bf16
    /// LayerNorm kernels over 768 took 36.1 µs instead of 40.8 (its backward, 23 a step), 28.1
    /// instead of 29.2 (its forward) and 24.8 instead of 31.5.
    fn in_whole_vectors(&self, t: u32) -> u32 {
        let (n, t) = (self.n, t as usize);
        // A thread with one element (rows of 512 in blocks of 512) is left as it is: four
        // times fewer threads a row is a different trade, not measured.
        if self.tuning.scalar_rows || n.is_multiple_of(4 * t) || !n.is_multiple_of(4) || n < 2 * t {
            return t as u32;
        }
        match n / 4 {
            w if w.is_multiple_of(32) && (64..=1024).contains(&w) => w as u32,
            _ => t as u32,
        }
    }

    /// [`Analysis::layout`] before [`Analysis::in_whole_vectors`]: by the row's length and
    /// what its loops keep in registers.
    fn layout_by_length(&self, reductions: usize, loop_uses: &[usize]) -> (Layout, bool) {
        let n = self.n;
        if self.strategy == Strategy::Columns {
            let (x, y) = self.column_block(reductions);
            return (Layout::Columns { x, y }, false);
        }
        let with = |t: u32| {
            if t <= 32 {
                // A group of lanes of one warp per row, several rows a block.
                let w = t.min(n.next_power_of_two().clamp(1, 32) as u32);
                Layout::Group { w, g: 256 / w }
            } else {
                Layout::Block { t }
            }
        };
        let default = match self.tuning.row_threads {
            Some(t) => with(t),
            None if n <= GROUP_MAX_N => with(32),
            None => Layout::Block {
                t: row_threads(n, self.rows),
            },
        };
        let steps = |lay: Layout| match lay {
            Layout::Group { w, .. } => w as usize,
            Layout::Block { t } => t as usize,
            Layout::Columns { y, .. } => y as usize,
        };
        let in_loops = loop_uses.iter().filter(|&&u| u > 0).count();
        let multi: Vec<usize> = (0..loop_uses.len())
            .filter(|&i| loop_uses[i] >= 2)
            .collect();
        if multi.is_empty() {
            return (default, false);
        }
        let all = multi.len() == in_loops;
        let words: usize = multi
            .iter()
            .map(|&i| reg_size(self.dt[i]).div_ceil(4))
            .sum();
        let most_words = self.tuning.cache_words.unwrap_or(CACHE_WORDS);
        let fits = |t: usize| {
            let per = n.div_ceil(t);
            per * words <= most_words && (per <= CACHE_SPLIT_MAX || all && per <= CACHE_PER_THREAD)
        };
        let t0 = steps(default);
        if self.tuning.row_threads.is_some() {
            return (default, fits(t0));
        }
        // Cached as it is, with few elements a thread: keep it. With many (a row of 1024 in one
        // warp holds 32 a lane), more threads per row measured faster (gpt2's attention
        // softmax: 309 µs in one warp, about 220 with 64 or more threads, on an H200).
        if fits(t0) && n.div_ceil(t0) <= CACHE_SPLIT_MAX {
            return (default, true);
        }
        // Where rows are plenty, the fewest threads whose values take at most half the
        // registers: the GPU is full anyway, and fewer threads a row combine faster. On an H200,
        // gpt2's attention softmax (98304 rows of 1024, one cached load) takes 227 µs with 64
        // threads, 276 with 256; its backward (two loads) 282 with 128 and 280 with 256.
        let mut t = t0 * 2;
        while t <= 1024 {
            let per = n.div_ceil(t);
            // Loads read by one loop only are read in the unrolled loops: as many in flight.
            let in_flight = all || per <= CACHE_SPLIT_MAX;
            if per * words <= CACHE_WORDS / 2
                && in_flight
                && self.rows.saturating_mul(t) >= ROW_THREADS_PLENTY
            {
                return (with(t as u32), true);
            }
            t *= 2;
        }
        let mut t = t0 * 2;
        while t <= 1024 {
            let per = n.div_ceil(t);
            let most = if t == 1024 {
                CACHE_SPLIT_MAX
            } else {
                CACHE_SPLIT_PER_THREAD
            };
            if per <= most && per * words <= CACHE_WORDS {
                return (with(t as u32), true);
            }
            t *= 2;
        }
        (default, false)
    }

    /// Block shape `(X, Y)` of the column strategy: X rows side by side (32, or down to 8 when
    /// that leaves fewer than [`COLUMN_BLOCKS`] blocks; 8 four-byte values still fill a 32-byte
    /// sector), Y threads along each row (256 threads a block, 1024 when blocks are few).
    pub(super) fn column_block(&self, reductions: usize) -> (u32, u32) {
        let mut x = 32usize;
        while x > 8 && self.rows.div_ceil(x) < COLUMN_BLOCKS {
            x /= 2;
        }
        if let Some(forced) = self.tuning.column_rows {
            if forced.is_power_of_two() && forced <= 32 {
                x = forced as usize;
            }
        }
        let threads = if self.rows.div_ceil(x) < FILL {
            1024
        } else {
            256
        };
        let mut y = (threads / x).min(self.n.next_power_of_two()).max(2);
        let widest = (0..self.k.body.len())
            .filter(|&i| self.live[i] && matches!(self.k.body[i], Inst::Reduce { .. }))
            .map(|i| reg_size(self.dt[i]))
            .max()
            .unwrap_or(4);
        while y > 2 && reductions * x * y * widest > MAX_SHARED {
            y /= 2;
        }
        (x as u32, y as u32)
    }
}

/// Threads a row of at least 16384 elements gets when there are rows enough to fill the GPU.
/// Measured on an H100 (session 10), gpt2's cross-entropy (rows of 50304, four elements a
/// thread, 37 registers): 512 threads made the bf16 step 0.28 ms faster than 1024 (one block
/// of 1024 such threads an SM fits, three of 512); the tf32 step did not move.
pub(super) const LONG_ROW_THREADS: u32 = 512;

/// Threads per block of the row strategy: the row's length rounded up to a power of two,
/// between 32 and 256; [`LONG_ROW_THREADS`] for rows of 16384 or more; 1024 for long rows
/// when there are too few rows to fill the GPU.
pub(super) fn row_threads(n: usize, rows: usize) -> u32 {
    if n >= 4096 && rows < FILL {
        return 1024;
    }
    if n >= 16384 {
        return LONG_ROW_THREADS;
    }
    n.next_power_of_two().clamp(32, 256) as u32
}

/// The launch of one reduction kernel: its layout and what follows from it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) lay: Layout,
    /// Whether the loops over the row keep the loads that several of them read in registers.
    pub(super) cache: bool,
    /// Threads a block.
    pub(super) threads: u32,
    /// Units of rows (the rows a block takes at a time) the grid-stride loop goes over.
    pub(super) units: usize,
    pub(super) launch: Launch,
    /// Whether some block takes more than one unit (and so reuses its shared memory).
    pub(super) loops: bool,
    /// Whether the threads of a row combine partials (some pass over rows that are not empty).
    pub(super) combine: bool,
}

impl Analysis<'_> {
    /// The launch stage of a reduction: the layout (see [`Analysis::layout`]), the grid over
    /// units of rows, and the shared memory the fold combines through, which must fit in
    /// [`MAX_SHARED`] (an error naming the byte count otherwise, before any text is written).
    pub(super) fn shape(&self, p: &Passes) -> Result<Shape, CodegenError> {
        let (lay, cache) = self.layout(p.reds.len(), &p.loop_uses);
        let (bx, by) = match lay {
            Layout::Columns { x, y } => (x, y),
            Layout::Group { w, g } => (w * g, 1),
            Layout::Block { t } => (t, 1),
        };
        // Rows a block takes at a time.
        let per_block = match lay {
            Layout::Columns { x, .. } => x as usize,
            Layout::Group { g, .. } => g as usize,
            Layout::Block { .. } => 1,
        };
        let units = self.rows.div_ceil(per_block);
        let grid = grid_for(units, 1, MAX_GRID_ROWS);
        let launch = Launch {
            grid: [grid, 1, 1],
            block: [bx, by, 1],
            shared_bytes: 0,
        };
        let combine = self.n > 0 && p.passes > 0;
        // A value per thread (columns) or per warp (blocks) of each reduction.
        let per = match lay {
            Layout::Columns { x, y } => (x * y) as usize,
            Layout::Block { t } => (t / 32) as usize,
            Layout::Group { .. } => 0,
        };
        let shared: usize = p.reds.iter().map(|&r| per * reg_size(self.dt[r])).sum();
        if combine && shared > MAX_SHARED {
            return Err(CodegenError::SharedMemory {
                bytes: shared,
                reductions: p.reds.len(),
            });
        }
        Ok(Shape {
            lay,
            cache,
            threads: bx * by,
            units,
            launch,
            loops: units > grid as usize,
            combine,
        })
    }
}
