//! A data set's batches as the ranks of a data-parallel step read them: the union of every
//! rank's shard for several ranks in one process ([`RankBatches`]), one rank's shard for one
//! process of several ([`ShardBatches`]). Rank `r` of `N` reads the same rows either way, so a
//! run gives the same losses in-process and as a job of processes.

use super::error::DataError;
use super::{BatchSource, Cut, Dropped, InputSlot};
use ingot_runtime::StepExecutor;

/// `ranks` (at least 1), when `inner` has a batch per epoch for each; otherwise the error
/// saying a rank would get nothing.
fn enough_for<S: BatchSource>(inner: &S, ranks: usize) -> Result<usize, DataError> {
    let ranks = ranks.max(1);
    if inner.batches_per_epoch() < ranks as u64 {
        return Err(DataError::TooSmall {
            file: inner.describe().into(),
            reason: format!(
                "{} batches per epoch cannot give each of {ranks} ranks one",
                inner.batches_per_epoch()
            ),
        });
    }
    Ok(ranks)
}

/// `source` (one rank's batches) as `step` reads them: this process's shard of every batch
/// for one process of several ([`StepExecutor::data_shard`]), the union of the ranks' shards
/// for several ranks in one process ([`StepExecutor::data_ranks`]), `source` itself for one
/// rank. Training and evaluation read their data sets through it, so every rank sees the rows
/// it would see in any of the three.
pub fn rank_batches(
    source: Box<dyn BatchSource>,
    step: &dyn StepExecutor,
) -> Result<Box<dyn BatchSource>, DataError> {
    Ok(match (step.data_shard(), step.data_ranks()) {
        (Some((r, n)), _) => Box::new(ShardBatches::new(source, r, n)?),
        (None, 0 | 1) => source,
        (None, n) => Box::new(RankBatches::new(source, n)?),
    })
}

/// The [`BatchSource`] methods [`RankBatches`] and [`ShardBatches`] share (both hold `inner`
/// and `ranks`): an epoch of `ranks` times fewer batches than the inner source's, and its
/// drops, description and checks.
macro_rules! shard_methods {
    () => {
        fn batches_per_epoch(&self) -> u64 {
            self.inner.batches_per_epoch() / self.ranks as u64
        }
        fn dropped_per_epoch(&self) -> Dropped {
            self.inner.dropped_per_epoch()
        }
        fn describe(&self) -> String {
            format!(
                "{}, in shards for {} ranks",
                self.inner.describe(),
                self.ranks
            )
        }
        fn check_all(&mut self) -> Result<(), DataError> {
            self.inner.check_all()
        }
    };
}

/// A batch source for `N` ranks: batch `k` of an epoch is the inner source's batches
/// `kN, kN + 1, ..., kN + N - 1`, one after another (rank `r` gets batch `kN + r`, its shard):
/// disjoint shards of the same seeded order, and an epoch has `N` times fewer (larger) batches.
pub struct RankBatches<S> {
    inner: S,
    ranks: usize,
    /// The inner source's slots with `ranks` times its batch, and its seed.
    cut: Cut,
}

impl<S: BatchSource> RankBatches<S> {
    /// `inner` makes one rank's batches; `ranks` at least 1. A data set with fewer batches per
    /// epoch than ranks is refused (a rank would get nothing).
    pub fn new(inner: S, ranks: usize) -> Result<RankBatches<S>, DataError> {
        let ranks = enough_for(&inner, ranks)?;
        let widen = |s: &InputSlot| {
            let mut s = s.clone();
            if let Some(d) = s.dims.first_mut() {
                *d *= ranks;
            }
            s
        };
        Ok(RankBatches {
            cut: Cut {
                x: widen(inner.x()),
                y: widen(inner.y()),
                seed: inner.seed(),
            },
            inner,
            ranks,
        })
    }
}

impl<S: BatchSource> BatchSource for RankBatches<S> {
    fn cut(&self) -> &Cut {
        &self.cut
    }
    fn fill(
        &mut self,
        epoch: u64,
        batch: u64,
        x: &mut [u8],
        y: &mut [u8],
    ) -> Result<(), DataError> {
        let (xb, yb) = (self.inner.x().bytes(), self.inner.y().bytes());
        for r in 0..self.ranks {
            let k = batch * self.ranks as u64 + r as u64;
            self.inner.fill(
                epoch,
                k,
                &mut x[r * xb..(r + 1) * xb],
                &mut y[r * yb..(r + 1) * yb],
            )?;
        }
        Ok(())
    }
    shard_methods!();
}

/// One rank's shard of a data set for a job of one process per rank (`--torchrun`): batch `k`
/// of an epoch is the inner source's batch `kN + r`, the same shard [`RankBatches`] gives rank
/// `r` inside its union batch, so a run of `N` processes and a run of `N` GPUs in one process
/// see the same data.
pub struct ShardBatches<S> {
    inner: S,
    rank: usize,
    ranks: usize,
}

impl<S: BatchSource> ShardBatches<S> {
    /// `inner` makes one rank's batches; `rank < ranks`. A data set with fewer batches per
    /// epoch than ranks is refused (a rank would get nothing).
    pub fn new(inner: S, rank: usize, ranks: usize) -> Result<ShardBatches<S>, DataError> {
        let ranks = enough_for(&inner, ranks)?;
        Ok(ShardBatches {
            inner,
            rank: rank.min(ranks - 1),
            ranks,
        })
    }
}

impl<S: BatchSource> BatchSource for ShardBatches<S> {
    fn cut(&self) -> &Cut {
        self.inner.cut()
    }
    fn fill(
        &mut self,
        epoch: u64,
        batch: u64,
        x: &mut [u8],
        y: &mut [u8],
    ) -> Result<(), DataError> {
        let k = batch * self.ranks as u64 + self.rank as u64;
        self.inner.fill(epoch, k, x, y)
    }
    shard_methods!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_compiler::ir::DType;

    /// Batches whose x bytes are the batch's number within the epoch.
    struct Numbered(Cut);

    impl BatchSource for Numbered {
        fn cut(&self) -> &Cut {
            &self.0
        }
        fn batches_per_epoch(&self) -> u64 {
            10
        }
        fn fill(&mut self, _: u64, b: u64, x: &mut [u8], _: &mut [u8]) -> Result<(), DataError> {
            x.fill(b as u8);
            Ok(())
        }
        fn dropped_per_epoch(&self) -> Dropped {
            Dropped {
                count: 0,
                unit: "samples",
            }
        }
        fn describe(&self) -> String {
            "numbered".into()
        }
        fn check_all(&mut self) -> Result<(), DataError> {
            Ok(())
        }
    }

    fn numbered() -> Numbered {
        let slot = |name: &str| InputSlot {
            name: name.into(),
            dtype: DType::Bool,
            dims: vec![2],
        };
        Numbered(Cut {
            x: slot("x"),
            y: slot("y"),
            seed: 0,
        })
    }

    #[test]
    fn each_process_reads_the_shard_its_rank_gets_inside_the_union_batch() {
        let mut union = RankBatches::new(numbered(), 3).unwrap();
        assert_eq!(union.batches_per_epoch(), 3);
        let (mut x, mut y) = (vec![0u8; 6], vec![0u8; 6]);
        union.fill(0, 2, &mut x, &mut y).unwrap();
        for r in 0..3 {
            let mut shard = ShardBatches::new(numbered(), r, 3).unwrap();
            assert_eq!(shard.batches_per_epoch(), 3);
            assert_eq!(
                shard.describe(),
                union.describe(),
                "one data set, one fingerprint"
            );
            let (mut sx, mut sy) = (vec![0u8; 2], vec![0u8; 2]);
            shard.fill(0, 2, &mut sx, &mut sy).unwrap();
            assert_eq!(sx, x[2 * r..2 * r + 2], "rank {r}");
            assert_eq!(sx, vec![(2 * 3 + r) as u8; 2]);
        }
        let small = ShardBatches::new(numbered(), 0, 11)
            .err()
            .expect("10 batches, 11 ranks");
        assert!(small.to_string().contains("11 ranks"), "{small}");
    }
}
