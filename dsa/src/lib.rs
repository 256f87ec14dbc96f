//! The offset solver: dynamic storage allocation (DSA), usable alone (it depends on nothing of
//! the Ingot compiler, whose memory planner uses it for the slab of a training step).
//!
//! Every buffer is live over a half-open interval `[lower, upper)` of schedule
//! positions and needs `size` bytes. The solver gives each one an offset in a single slab so that
//! two buffers live at the same moment never share a byte, every offset is a multiple of the
//! problem's alignment, and the peak (the largest `offset + size`) is as small as it can find.
//!
//! LOAD, the largest total size live at one moment, is a lower bound on the peak; the solver
//! reports the peak against it.
//!
//! How [`solve`] works:
//!
//! 1. **Greedy portfolio**: best fit and first fit in the manner of XLA's heap simulator
//!    (`greedy.rs`) over several buffer orders (decreasing size, lifetime, area, contention), and
//!    *skyline dives* (`dive.rs` without a capacity: always place next the buffer that can sit
//!    lowest, on top of what it meets). Strategies run in waves, one per thread, in the order of
//!    [`Greedy::ALL`]; the portfolio stops early once a wave reaches LOAD (or the capacity).
//!    The lowest peak wins, ties to the earlier strategy.
//! 2. **Search**, when the best greedy peak is above LOAD (or the capacity asked for):
//!    * up to a few thousand buffers, a depth-first search after MiniMalloc (Moffitt, ASPLOS
//!      2023; `search.rs`): canonical order (offsets never decrease, each buffer resting on the
//!      highest placed buffer it meets), dominance (skip a choice when an unplaced buffer could
//!      drop below it), inference (per time section, floor plus the unplaced size live there
//!      must fit), decomposition in time, and preorders taking turns under a doubling node
//!      limit. Without a capacity, a decreasing-capacity loop (bisection between the proved
//!      lower bound and the best peak, the bound itself tried first) tightens the peak until
//!      the budget is spent or the peak is proved optimal.
//!    * beyond that, *capacity-aware dives* (`dive.rs`): the search's first descent without
//!      backtracking, with the same inference, on data structures that scale to tens of
//!      thousands of buffers; tried at LOAD first, then bisecting.
//! 3. **Validation** ([`validate`]): an independent checker, sharing no code with the solver,
//!    checks every solution before it is returned.
//!
//! Results are deterministic: the same problem and options give the same offsets on every
//! machine and with any number of threads, unless the time limit (CPU time the solving threads spent, not wall-clock time: a
//! busy machine reaches it no sooner) stops the work (use
//! [`SolveOptions::node_limit`] for a budget that does not depend on the machine's speed).
//!
//! Measured on the benchmark set (`cargo run --release -p ingot-dsa --example dsa_bench
//! -- <dir>`, 2 cores): the eleven MiniMalloc "challenging" problems fit 1,048,576 bytes in
//! 0.02 to 0.4 s each (MiniMalloc reports 0.6 to 5.4 s); iopddl-Y_1 (62,185 buffers) is packed
//! to LOAD by best fit in contention order in under a second, file reading included; pangu 2.6B
//! (18,692 buffers) reaches LOAD through a capacity-aware dive in about 2.5 s; iopddl-S_1 stays
//! 0.18% above LOAD (skyline dive; the capacity-aware dives fail there).
//!
//! # Example
//!
//! ```
//! use ingot_dsa::{solve, validate, Buffer, Problem, SolveOptions};
//!
//! // Buffers 0 and 1 are live together; buffer 2 only after both have died.
//! let problem = Problem {
//!     buffers: vec![
//!         Buffer { id: 0, lower: 0, upper: 2, size: 100 },
//!         Buffer { id: 1, lower: 1, upper: 3, size: 50 },
//!         Buffer { id: 2, lower: 3, upper: 4, size: 120 },
//!     ],
//!     alignment: 64,
//! };
//! let (solution, stats) = solve(&problem, &SolveOptions::default()).expect("solvable");
//! assert_eq!(solution.offsets.len(), 3);
//! assert!(solution.offsets.iter().all(|o| o % 64 == 0));
//! assert_eq!(solution.offsets[2], 0); // buffer 2 reuses the bytes of 0 and 1
//! assert_eq!(solution.peak, 164); // 50 bytes at 0, then 100 at 64 (LOAD, 150, is not reachable)
//! assert!(stats.optimal); // the peak equals a proved lower bound
//! validate(&problem, &solution).expect("every returned solution is valid");
//! ```
//!
//! The CSV format of MiniMalloc's benchmarks ([`read_csv`], [`write_csv`]) lets the same
//! problems come from files; the `ingot dsa` command solves one from the command line.

mod check;
mod clock;
mod csv;
mod dive;
mod greedy;
mod search;
#[cfg(test)]
mod tests;

/// The README's usage example, run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use check::validate;
pub use csv::{read_csv, write_csv};

use clock::Deadline;
use std::fmt;
use std::time::Duration;
use thiserror::Error;

/// One buffer: live over `[lower, upper)`, needing `size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buffer {
    pub id: u64,
    pub lower: u64,
    pub upper: u64,
    pub size: u64,
}

/// An offset-assignment problem. Offsets must be multiples of `alignment` (at least 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub buffers: Vec<Buffer>,
    pub alignment: u64,
}

/// Offsets in the same order as [`Problem::buffers`], and the resulting peak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Solution {
    pub offsets: Vec<u64>,
    pub peak: u64,
}

/// What [`solve`] may spend and what it must reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SolveOptions {
    /// `Some(c)`: the peak must be at most `c`; solving stops as soon as it is, and fails if the
    /// budget runs out first. `None`: minimize the peak within the budget.
    pub capacity: Option<u64>,
    /// Budget of CPU time for the whole solve, on the clock of the thread that does the work
    /// (so a busy machine does not stop the work sooner than an idle one). The first wave of
    /// the greedy portfolio always completes (so there is always an answer); later strategies
    /// and the search stop at it.
    pub time_limit: Duration,
    /// Budget of search nodes, independent of the machine: a search stopped by this budget
    /// gives the same answer everywhere, one stopped by `time_limit` may not.
    pub node_limit: u64,
    /// Worker threads for the greedy portfolio (0: use what the machine has). The result does not
    /// depend on it.
    pub threads: usize,
    /// Without a capacity, on problems of more than [`LARGE_PROBLEM`] buffers: a peak at most
    /// this many parts per million above LOAD ends the solve. There the skyline dives and the search cost
    /// seconds (every long-lived buffer meets a number of others that grows with the problem,
    /// so they grow faster than linearly), while the cheap best fits already land within a
    /// few parts in ten thousand of LOAD on deep models; they can gain at most this much.
    /// 0: minimize towards LOAD within the budget whatever the size.
    pub large_problem_gap_ppm: u64,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            capacity: None,
            time_limit: Duration::from_secs(1),
            node_limit: u64::MAX,
            threads: 0,
            large_problem_gap_ppm: 1000,
        }
    }
}

/// A buffer order for the greedy heuristics. Ties always fall back to the next key and finally
/// to the buffer's position in the problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Order {
    /// Decreasing size, then decreasing lifetime.
    Size,
    /// Decreasing lifetime (`upper - lower`), then decreasing size.
    Lifetime,
    /// Decreasing `size * lifetime`, then decreasing size.
    Area,
    /// Decreasing contention (the largest LOAD over the buffer's lifetime), then decreasing size.
    Contention,
}

/// A fit policy: which free gap a buffer goes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FitPolicy {
    /// The smallest gap that holds it (XLA's heap simulator).
    Best,
    /// The lowest gap that holds it.
    First,
}

/// One greedy strategy of the portfolio.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Greedy {
    /// Place buffers one by one in `order`, each into a free gap chosen by `fit`.
    Fit { fit: FitPolicy, order: Order },
    /// Place next the buffer with the lowest feasible offset (offsets never decrease), ties
    /// broken by `order`.
    Dive { order: Order },
}

impl Greedy {
    /// The portfolio, in the order it runs and breaks ties: best fit by size (XLA's default)
    /// first, then what most often wins on real traces, cheapest first.
    pub const ALL: [Greedy; 12] = [
        Greedy::Fit {
            fit: FitPolicy::Best,
            order: Order::Size,
        },
        Greedy::Fit {
            fit: FitPolicy::Best,
            order: Order::Contention,
        },
        Greedy::Dive { order: Order::Area },
        Greedy::Dive { order: Order::Size },
        Greedy::Fit {
            fit: FitPolicy::First,
            order: Order::Contention,
        },
        Greedy::Fit {
            fit: FitPolicy::Best,
            order: Order::Lifetime,
        },
        Greedy::Dive {
            order: Order::Contention,
        },
        Greedy::Dive {
            order: Order::Lifetime,
        },
        Greedy::Fit {
            fit: FitPolicy::First,
            order: Order::Size,
        },
        Greedy::Fit {
            fit: FitPolicy::Best,
            order: Order::Area,
        },
        Greedy::Fit {
            fit: FitPolicy::First,
            order: Order::Lifetime,
        },
        Greedy::Fit {
            fit: FitPolicy::First,
            order: Order::Area,
        },
    ];
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Order::Size => "size",
            Order::Lifetime => "lifetime",
            Order::Area => "area",
            Order::Contention => "contention",
        })
    }
}

impl fmt::Display for Greedy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Greedy::Fit {
                fit: FitPolicy::Best,
                order,
            } => write!(f, "best-fit by {order}"),
            Greedy::Fit {
                fit: FitPolicy::First,
                order,
            } => write!(f, "first-fit by {order}"),
            Greedy::Dive { order } => write!(f, "skyline dive by {order}"),
        }
    }
}

/// What ended a search that did not meet its capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// [`SolveOptions::time_limit`] ran out.
    TimeLimit(Duration),
    /// [`SolveOptions::node_limit`] search nodes were spent.
    NodeLimit(u64),
    /// The capacity-aware dives failed under every order, and the exact search cannot hold the
    /// problem (its overlap lists would exceed the search's memory bound): the solver has no
    /// other method to try, so more time would not help.
    HeuristicsExhausted,
}

impl Stopped {
    /// What the user can do about it.
    fn advice(&self) -> &'static str {
        match self {
            Stopped::TimeLimit(_) => "raise the capacity or the time limit",
            Stopped::NodeLimit(_) => "raise the capacity or the node limit",
            Stopped::HeuristicsExhausted => {
                "raise the capacity (more time would not help this problem)"
            }
        }
    }
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stopped::TimeLimit(t) => write!(f, "the time limit of {:.3} s ran out", t.as_secs_f64()),
            Stopped::NodeLimit(n) => write!(f, "the node limit of {n} search nodes was reached"),
            Stopped::HeuristicsExhausted => write!(
                f,
                "the capacity-aware dives failed under every order, and the problem is too large for the exact search"
            ),
        }
    }
}

/// What happened during a [`solve`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SolveStats {
    /// LOAD: the largest total size live at one moment (a lower bound on the peak).
    pub load: u64,
    /// The best peak of the greedy portfolio.
    pub greedy_peak: u64,
    /// The greedy strategy that produced `greedy_peak`.
    pub greedy: Greedy,
    /// Time spent in the greedy portfolio (the rest went to the search).
    pub greedy_elapsed: Duration,
    /// The peak returned.
    pub peak: u64,
    /// The best lower bound known on the peak: LOAD, or more where the search proved it.
    pub lower_bound: u64,
    /// `peak == lower_bound`: no valid assignment has a lower peak.
    pub optimal: bool,
    /// Whether the search improved on the greedy result.
    pub improved_by_search: bool,
    /// Search nodes visited (0 when the greedy result was already good enough).
    pub nodes_explored: u64,
    /// Whether the search stopped because the time or node budget ran out.
    pub budget_exhausted: bool,
    /// Wall-clock time of the whole solve.
    pub elapsed: Duration,
}

/// Everything that can go wrong reading or solving a problem. None of it panics.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DsaError {
    #[error("the CSV has no header line (expected `id,lower,upper,size`)")]
    CsvEmpty,
    #[error("line {line}: the header has no `{column}` column (expected `id,lower,upper,size` in any order); header was `{header}`")]
    CsvMissingColumn {
        line: usize,
        column: &'static str,
        header: String,
    },
    #[error("line {line}: `{column}` must be a non-negative integer, found `{value}`")]
    CsvNotInteger {
        line: usize,
        column: &'static str,
        value: String,
    },
    #[error("line {line}: buffer {id} has upper {upper} <= lower {lower}; a lifetime [lower, upper) must be non-empty")]
    CsvEmptyLifetime {
        line: usize,
        id: u64,
        lower: u64,
        upper: u64,
    },
    #[error("line {line}: duplicate id {id} (first seen on line {first_line})")]
    CsvDuplicateId {
        line: usize,
        id: u64,
        first_line: usize,
    },
    #[error("line {line}: {message}")]
    Csv { line: usize, message: String },
    #[error("buffer {id} (row {row}): {reason}")]
    InvalidBuffer { row: usize, id: u64, reason: String },
    #[error("alignment must be at least 1, got 0")]
    ZeroAlignment,
    #[error(
        "the problem is too large: the total of all buffer sizes (aligned) does not fit in 64 bits"
    )]
    TooLarge,
    #[error("capacity {capacity} is below LOAD {load}, the total size live at one moment, so nothing fits; the best peak found is {best_peak}; raise the capacity to at least {load}")]
    CapacityBelowLoad {
        capacity: u64,
        load: u64,
        best_peak: u64,
    },
    #[error("capacity {capacity} cannot be met: the search proved no assignment fits (best peak found {best_peak}, LOAD {load}); raise the capacity to at least {lower_bound}")]
    CapacityInfeasible {
        capacity: u64,
        best_peak: u64,
        load: u64,
        lower_bound: u64,
    },
    #[error("capacity {capacity} not met: {stopped} (after {:.3} s and {nodes} search nodes); best peak found {best_peak}, LOAD {load}; {}", .elapsed.as_secs_f64(), .stopped.advice())]
    CapacityNotMet {
        capacity: u64,
        best_peak: u64,
        load: u64,
        elapsed: Duration,
        nodes: u64,
        /// What ended the search.
        stopped: Stopped,
    },
    #[error("internal error, invalid solution: {message}")]
    InvalidSolution { message: String },
}

/// The solver's internal view of a problem: lifetimes compressed to slot indices.
pub(crate) struct Instance {
    pub n: usize,
    /// First slot of each buffer's lifetime.
    pub lo: Vec<u32>,
    /// One past the last slot.
    pub hi: Vec<u32>,
    pub size: Vec<u64>,
    /// Original lifetime length, for the orders.
    pub length: Vec<u64>,
    pub align: u64,
    /// Number of elementary time slots (between consecutive distinct endpoints).
    pub slots: usize,
    /// Total size live in each slot.
    pub slot_load: Vec<u64>,
    pub load: u64,
}

impl Instance {
    pub fn new(p: &Problem) -> Result<Instance, DsaError> {
        if p.alignment == 0 {
            return Err(DsaError::ZeroAlignment);
        }
        let n = p.buffers.len();
        if n >= u32::MAX as usize {
            return Err(DsaError::TooLarge);
        }
        let mut total: u64 = 0;
        for (row, b) in p.buffers.iter().enumerate() {
            if b.upper <= b.lower {
                return Err(DsaError::InvalidBuffer {
                    row,
                    id: b.id,
                    reason: format!(
                        "upper {} <= lower {}; a lifetime [lower, upper) must be non-empty",
                        b.upper, b.lower
                    ),
                });
            }
            let aligned = b
                .size
                .checked_add(p.alignment - 1)
                .map(|s| s / p.alignment * p.alignment)
                .ok_or(DsaError::TooLarge)?;
            total = total.checked_add(aligned).ok_or(DsaError::TooLarge)?;
        }
        // Headroom: the search adds floors, totals and sizes without overflow checks.
        if total > u64::MAX / 4 {
            return Err(DsaError::TooLarge);
        }
        let mut times: Vec<u64> = p.buffers.iter().flat_map(|b| [b.lower, b.upper]).collect();
        times.sort_unstable();
        times.dedup();
        let slot = |t: u64| times.partition_point(|&x| x < t) as u32;
        let lo: Vec<u32> = p.buffers.iter().map(|b| slot(b.lower)).collect();
        let hi: Vec<u32> = p.buffers.iter().map(|b| slot(b.upper)).collect();
        let slots = times.len().saturating_sub(1);
        let mut diff = vec![0i128; slots + 1];
        for (i, b) in p.buffers.iter().enumerate() {
            diff[lo[i] as usize] += b.size as i128;
            diff[hi[i] as usize] -= b.size as i128;
        }
        let mut slot_load = Vec::with_capacity(slots);
        let mut cur = 0i128;
        for d in diff.iter().take(slots) {
            cur += d;
            slot_load.push(cur as u64);
        }
        let load = slot_load.iter().copied().max().unwrap_or(0);
        Ok(Instance {
            n,
            lo,
            hi,
            size: p.buffers.iter().map(|b| b.size).collect(),
            length: p.buffers.iter().map(|b| b.upper - b.lower).collect(),
            align: p.alignment,
            slots,
            slot_load,
            load,
        })
    }

    /// The largest slot load over each buffer's lifetime.
    fn contention(&self) -> Vec<u64> {
        let leaves = self.slots.max(1).next_power_of_two();
        let mut t = vec![0u64; 2 * leaves];
        t[leaves..leaves + self.slots].copy_from_slice(&self.slot_load);
        for v in (1..leaves).rev() {
            t[v] = t[2 * v].max(t[2 * v + 1]);
        }
        (0..self.n)
            .map(|b| {
                let (mut l, mut r) = (self.lo[b] as usize + leaves, self.hi[b] as usize + leaves);
                let mut m = 0;
                while l < r {
                    if l & 1 == 1 {
                        m = m.max(t[l]);
                        l += 1;
                    }
                    if r & 1 == 1 {
                        r -= 1;
                        m = m.max(t[r]);
                    }
                    l >>= 1;
                    r >>= 1;
                }
                m
            })
            .collect()
    }

    /// Buffer indices sorted by `order` (ties: next key, then index).
    pub fn order(&self, order: Order, contention: &[u64]) -> Vec<u32> {
        let mut v: Vec<u32> = (0..self.n as u32).collect();
        let (s, l) = (&self.size, &self.length);
        match order {
            Order::Size => {
                v.sort_by_key(|&b| (std::cmp::Reverse((s[b as usize], l[b as usize])), b))
            }
            Order::Lifetime => {
                v.sort_by_key(|&b| (std::cmp::Reverse((l[b as usize], s[b as usize])), b))
            }
            Order::Area => v.sort_by_key(|&b| {
                let b_ = b as usize;
                (std::cmp::Reverse((s[b_] as u128 * l[b_] as u128, s[b_])), b)
            }),
            Order::Contention => v.sort_by_key(|&b| {
                (
                    std::cmp::Reverse((contention[b as usize], s[b as usize], l[b as usize])),
                    b,
                )
            }),
        }
        v
    }
}

/// LOAD: the largest total size of buffers live at one moment. A lower bound on any peak.
/// (Buffers with `upper <= lower` are never live and count for nothing.)
pub fn load(p: &Problem) -> u64 {
    let mut events: Vec<(u64, i128)> = Vec::with_capacity(2 * p.buffers.len());
    for b in p.buffers.iter().filter(|b| b.upper > b.lower) {
        events.push((b.lower, b.size as i128));
        events.push((b.upper, -(b.size as i128)));
    }
    // Half-open lifetimes: at equal times, ends (negative) come first.
    events.sort_unstable();
    let (mut cur, mut best) = (0i128, 0i128);
    for (_, d) in events {
        cur += d;
        best = best.max(cur);
    }
    best.min(u64::MAX as i128) as u64
}

/// Runs one greedy strategy alone (no search), for comparisons. The solution is validated.
pub fn solve_greedy(p: &Problem, strategy: Greedy) -> Result<Solution, DsaError> {
    let inst = Instance::new(p)?;
    let (offsets, peak) = run_strategy(&inst, strategy, &inst.contention(), None)
        .expect("no deadline, so it finishes");
    let sol = Solution { offsets, peak };
    validate(p, &sol)?;
    Ok(sol)
}

fn run_strategy(
    inst: &Instance,
    g: Greedy,
    contention: &[u64],
    deadline: Option<Deadline>,
) -> Option<(Vec<u64>, u64)> {
    match g {
        Greedy::Fit { fit, order } => {
            let policy = match fit {
                FitPolicy::Best => greedy::Fit::Best,
                FitPolicy::First => greedy::Fit::First,
            };
            greedy::fit(inst, &inst.order(order, contention), policy, deadline)
        }
        Greedy::Dive { order } => {
            let ord = inst.order(order, contention);
            let mut rank = vec![0u32; inst.n];
            for (r, &b) in ord.iter().enumerate() {
                rank[b as usize] = r as u32;
            }
            // A dive without a capacity never rejects a candidate: the plain skyline dive.
            let setup = dive::DiveSetup::new(inst, false);
            let mut steps = 0;
            match dive::dive(inst, &setup, u64::MAX, &rank, deadline, &mut steps) {
                dive::DiveResult::Found(offsets) => {
                    let peak = (0..inst.n)
                        .map(|b| offsets[b] + inst.size[b])
                        .max()
                        .unwrap_or(0);
                    Some((offsets, peak))
                }
                dive::DiveResult::Failed | dive::DiveResult::Aborted => None,
            }
        }
    }
}

/// Problems with more buffers than this get a shorter portfolio and, instead of the full
/// search, capacity-aware dives.
pub const LARGE_PROBLEM: usize = 4000;

/// A strategy's offsets and their peak.
type Placed = (Vec<u64>, u64);

/// The best result of the greedy portfolio.
struct PortfolioResult {
    offsets: Vec<u64>,
    peak: u64,
    strategy: Greedy,
}

/// Runs the greedy portfolio in waves of up to `threads` strategies of one family (best/first
/// fits, then skyline dives, in the order of [`Greedy::ALL`]), stopping after a wave once some
/// peak is at most `target` or the deadline has passed. The first wave always runs to
/// completion; later strategies give up at the deadline.
///
/// The winner does not depend on the number of threads: it is the lowest peak among the
/// strategies up to the first (in portfolio order) whose peak meets `target`, ties to the
/// earlier one; results a wider wave computed past that point are set aside. Where nothing
/// meets `target`, the lowest peak of everything run wins (the same set on any machine unless
/// the deadline cut the portfolio short).
fn run_portfolio(
    inst: &Instance,
    threads: usize,
    target: u64,
    deadline: Option<Deadline>,
) -> PortfolioResult {
    let contention = inst.contention();
    // Large problems run the first four strategies only (the ones that win on large traces);
    // the capacity-aware dives that follow do better than the rest would.
    let all = if inst.n > LARGE_PROBLEM {
        &Greedy::ALL[..4]
    } else {
        &Greedy::ALL[..]
    };
    let threads = if threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        threads
    };
    // Small problems finish in microseconds: threads would cost more than they save.
    let threads = if inst.n < 2000 {
        1
    } else {
        threads.clamp(1, all.len())
    };
    let mut results: Vec<(Greedy, Option<Placed>)> = Vec::with_capacity(all.len());
    let mut met = None;
    for (w, wave) in waves(all, threads).into_iter().enumerate() {
        if w > 0 && deadline.is_some_and(Deadline::passed) {
            break;
        }
        let limit = if w == 0 { None } else { deadline };
        let found: Vec<Option<Placed>> = if wave.len() == 1 {
            vec![run_strategy(inst, wave[0], &contention, limit)]
        } else {
            std::thread::scope(|scope| {
                let contention = &contention;
                // Each worker spends what is left of the deadline on its own clock.
                let left = limit.map(Deadline::left);
                let handles: Vec<_> = wave
                    .iter()
                    .map(|&g| {
                        scope.spawn(move || {
                            run_strategy(inst, g, contention, left.map(Deadline::after))
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                    .collect()
            })
        };
        results.extend(wave.iter().copied().zip(found));
        met = results
            .iter()
            .position(|(_, r)| r.as_ref().is_some_and(|&(_, peak)| peak <= target));
        if met.is_some() {
            break;
        }
    }
    let considered = met.map_or(results.len(), |k| k + 1);
    let mut best: Option<PortfolioResult> = None;
    for (strategy, r) in results.into_iter().take(considered) {
        if let Some((offsets, peak)) = r {
            if best.as_ref().is_none_or(|b| peak < b.peak) {
                best = Some(PortfolioResult {
                    offsets,
                    peak,
                    strategy,
                });
            }
        }
    }
    best.expect("the first wave always completes")
}

/// The portfolio's waves: consecutive strategies of one family, at most `threads` each, so
/// that a cheap fit never waits in a wave for a dive that costs a hundred times more.
fn waves(all: &[Greedy], threads: usize) -> Vec<&[Greedy]> {
    let dive = |g: &Greedy| matches!(g, Greedy::Dive { .. });
    let mut out = Vec::new();
    let mut rest = all;
    while let Some(first) = rest.first() {
        let same = rest
            .iter()
            .take(threads)
            .take_while(|g| dive(g) == dive(first))
            .count();
        let (wave, tail) = rest.split_at(same);
        out.push(wave);
        rest = tail;
    }
    out
}

/// Solves `p`: see the module documentation for the method.
///
/// With `opts.capacity = Some(c)` the result has peak at most `c`, or the error says why not
/// (LOAD above `c`, proved infeasible, or budget spent) with the best peak found and LOAD.
/// Without a capacity the peak is minimized within the budget. Every returned solution has
/// passed [`validate`].
pub fn solve(p: &Problem, opts: &SolveOptions) -> Result<(Solution, SolveStats), DsaError> {
    let start = std::time::Instant::now();
    let deadline = Some(Deadline::after(opts.time_limit));
    let inst = Instance::new(p)?;
    let load = inst.load;
    let target = opts.capacity.unwrap_or_else(|| {
        if inst.n > LARGE_PROBLEM {
            // Rounded down: the target is never above what the gap allows.
            let gap = u128::from(load) * u128::from(opts.large_problem_gap_ppm) / 1_000_000;
            load.saturating_add(u64::try_from(gap).unwrap_or(u64::MAX))
        } else {
            load
        }
    });
    let g = run_portfolio(&inst, opts.threads, target, deadline);
    let greedy_elapsed = start.elapsed();
    let (greedy_peak, greedy) = (g.peak, g.strategy);
    let mut best = Solution {
        offsets: g.offsets,
        peak: g.peak,
    };
    let mut stats = SolveStats {
        load,
        greedy_peak,
        greedy,
        greedy_elapsed,
        peak: greedy_peak,
        lower_bound: load,
        optimal: greedy_peak == load,
        improved_by_search: false,
        nodes_explored: 0,
        budget_exhausted: false,
        elapsed: Duration::ZERO,
    };
    if let Some(cap) = opts.capacity {
        if cap < load {
            return Err(DsaError::CapacityBelowLoad {
                capacity: cap,
                load,
                best_peak: greedy_peak,
            });
        }
    }
    if best.peak > target {
        let limits = search::Limits {
            capacity: opts.capacity,
            deadline,
            node_limit: opts.node_limit,
        };
        let outcome = search::improve(&inst, &best, limits);
        stats.nodes_explored = outcome.nodes;
        stats.budget_exhausted = outcome.budget_exhausted;
        stats.lower_bound = stats.lower_bound.max(outcome.lower_bound);
        if let Some(sol) = outcome.solution {
            if sol.peak < best.peak {
                best = sol;
                stats.improved_by_search = true;
            }
        }
    }
    stats.peak = best.peak;
    stats.lower_bound = stats.lower_bound.min(best.peak);
    stats.optimal = best.peak == stats.lower_bound;
    stats.elapsed = start.elapsed();
    if let Err(e) = validate(p, &best) {
        debug_assert!(false, "the solver produced an invalid solution: {e}");
        return Err(e);
    }
    if let Some(cap) = opts.capacity {
        if best.peak > cap {
            return Err(if stats.lower_bound > cap {
                DsaError::CapacityInfeasible {
                    capacity: cap,
                    best_peak: best.peak,
                    load,
                    lower_bound: stats.lower_bound,
                }
            } else {
                DsaError::CapacityNotMet {
                    capacity: cap,
                    best_peak: best.peak,
                    load,
                    elapsed: stats.elapsed,
                    nodes: stats.nodes_explored,
                    stopped: if deadline.is_some_and(Deadline::passed) {
                        Stopped::TimeLimit(opts.time_limit)
                    } else if stats.nodes_explored >= opts.node_limit {
                        Stopped::NodeLimit(opts.node_limit)
                    } else if !stats.budget_exhausted {
                        Stopped::HeuristicsExhausted
                    } else {
                        // The budget ran out short of the node limit: the deadline passed,
                        // on a clock this thread does not read (the search thread's, or a
                        // portfolio worker's), or during the first greedy wave (which always
                        // completes).
                        Stopped::TimeLimit(opts.time_limit)
                    },
                }
            });
        }
    }
    Ok((best, stats))
}
