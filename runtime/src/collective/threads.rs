//! The in-process collective: `N` ranks are `N` threads of one process sharing a
//! [`ThreadGroup`]. An all-reduce copies each rank's buffer into its slot, waits for every rank,
//! then each rank sums the slots in rank order (0, 1, ..., N-1): the same
//! arithmetic on every rank and every run, so all ranks hold the same bits afterwards, as they
//! must for their parameters to stay equal. bf16 is summed in f32 and rounded once, to the
//! nearest even (as the step rounds every bf16 store). An all-gather copies every rank's slot
//! into each rank's buffer, in rank order. A reduce-scatter posts as an all-reduce does and
//! each rank computes only its part of the sum, element by element as the all-reduce does,
//! so its bytes are the all-reduce's.

use super::Collective;
use crate::error::ExecError;
use ingot_compiler::ir::DType;
use std::sync::{Arc, Barrier, Mutex};

/// What the ranks of one group share.
pub struct ThreadGroup {
    ranks: usize,
    barrier: Barrier,
    /// Each rank's buffer of the current all-reduce (kept between calls: no allocation once
    /// the largest bucket has been seen).
    slots: Vec<Mutex<Vec<u8>>>,
}

/// One rank of a [`ThreadGroup`]; move it to the rank's thread.
pub struct ThreadRank {
    rank: usize,
    group: Arc<ThreadGroup>,
}

/// The `ranks` ends of a new group, rank 0 first. `ranks` must be at least 1.
pub fn group(ranks: usize) -> Vec<ThreadRank> {
    let ranks = ranks.max(1);
    let group = Arc::new(ThreadGroup {
        ranks,
        barrier: Barrier::new(ranks),
        slots: (0..ranks).map(|_| Mutex::new(Vec::new())).collect(),
    });
    (0..ranks)
        .map(|rank| ThreadRank {
            rank,
            group: group.clone(),
        })
        .collect()
}

fn slot(group: &ThreadGroup, r: usize) -> std::sync::MutexGuard<'_, Vec<u8>> {
    // A rank that panicked while holding its slot leaves it poisoned; the bytes are still
    // plain bytes, and the lengths check below catches a half-written call.
    group.slots[r].lock().unwrap_or_else(|e| e.into_inner())
}

impl Collective for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.group.ranks
    }

    fn all_reduce_sum(&mut self, data: &mut [u8], dtype: DType) -> Result<(), ExecError> {
        self.post(data);
        self.combine("all_reduce", data.len(), None, |parts| {
            sum_into(parts, data, dtype)
        })
    }

    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<(), ExecError> {
        self.post(send);
        let wrong = (Some(recv.len()) != send.len().checked_mul(self.group.ranks)).then(|| {
            format!(
                "rank {} gathers {} bytes a rank into an output of {} bytes, not {} times that",
                self.rank,
                send.len(),
                recv.len(),
                self.group.ranks
            )
        });
        self.combine("all_gather", send.len(), wrong, |parts| {
            for (part, from) in recv.chunks_exact_mut(send.len().max(1)).zip(parts) {
                part.copy_from_slice(from);
            }
            Ok(())
        })
    }

    fn reduce_scatter_sum(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
    ) -> Result<(), ExecError> {
        self.post(send);
        let wrong = (Some(send.len()) != recv.len().checked_mul(self.group.ranks)).then(|| {
            format!(
                "rank {} reduce-scatters {} bytes into an output of {} bytes, not a {}th of them",
                self.rank,
                send.len(),
                recv.len(),
                self.group.ranks
            )
        });
        let (r, n) = (self.rank, recv.len());
        self.combine("reduce_scatter", send.len(), wrong, |parts| {
            // Called only when every part is `ranks * n` bytes long: this rank's are in range.
            let rows: Vec<&[u8]> = parts.iter().map(|p| &p[r * n..(r + 1) * n]).collect();
            sum_into(&rows, recv, dtype)
        })
    }
}

impl ThreadRank {
    /// The first half of a collective: this rank's bytes into its slot, then the wait until
    /// every rank has written its own.
    fn post(&self, mine: &[u8]) {
        let g = &*self.group;
        {
            let mut slot = slot(g, self.rank);
            slot.clear();
            slot.extend_from_slice(mine);
        }
        g.barrier.wait();
    }

    /// The second half: every rank checks that all posted `len` bytes (so all agree on
    /// failing) and that its own output is not the `wrong` size (the reason when it is), then
    /// `combine`s the slots in rank order; a second barrier keeps the slots until every rank
    /// has read them (all reach it, failing or not: no rank is left waiting).
    fn combine(
        &self,
        op: &'static str,
        len: usize,
        wrong: Option<String>,
        combine: impl FnOnce(&[&[u8]]) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        let g = &*self.group;
        let lengths: Vec<usize> = (0..g.ranks).map(|r| slot(g, r).len()).collect();
        let reason = if lengths.iter().any(|&l| l != len) {
            Some(format!(
                "the ranks' {op} buffers have different lengths ({lengths:?} bytes): every rank \
                 must run the same step"
            ))
        } else {
            wrong
        };
        let result = if let Some(reason) = reason {
            Err(ExecError::Invalid { op, reason })
        } else {
            let slots: Vec<_> = (0..g.ranks).map(|r| slot(g, r)).collect();
            let parts: Vec<&[u8]> = slots.iter().map(|s| s.as_slice()).collect();
            combine(&parts)
        };
        g.barrier.wait();
        result
    }
}

/// `out = parts[0] + parts[1] + ...`, elementwise, summed in rank order.
fn sum_into(parts: &[&[u8]], out: &mut [u8], dtype: DType) -> Result<(), ExecError> {
    match dtype {
        DType::F32 => {
            for (e, o) in out.chunks_exact_mut(4).enumerate() {
                let at = |p: &[u8]| f32::from_le_bytes(p[4 * e..4 * e + 4].try_into().unwrap());
                let mut s = at(parts[0]);
                for p in &parts[1..] {
                    s += at(p);
                }
                o.copy_from_slice(&s.to_le_bytes());
            }
        }
        DType::F64 => {
            for (e, o) in out.chunks_exact_mut(8).enumerate() {
                let at = |p: &[u8]| f64::from_le_bytes(p[8 * e..8 * e + 8].try_into().unwrap());
                let mut s = at(parts[0]);
                for p in &parts[1..] {
                    s += at(p);
                }
                o.copy_from_slice(&s.to_le_bytes());
            }
        }
        DType::BF16 => {
            for (e, o) in out.chunks_exact_mut(2).enumerate() {
                let at = |p: &[u8]| {
                    half::bf16::from_le_bytes(p[2 * e..2 * e + 2].try_into().unwrap()).to_f32()
                };
                let mut s = at(parts[0]);
                for p in &parts[1..] {
                    s += at(p);
                }
                o.copy_from_slice(&half::bf16::from_f32(s).to_le_bytes());
            }
        }
        other => {
            return Err(ExecError::Invalid {
                op: "all_reduce",
                reason: format!("a sum of {other} elements; gradients are f32, f64 or bf16"),
            })
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn every_thread_rank_gets_the_sum_in_rank_order() {
        let ranks = group(3);
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|mut r| {
                std::thread::spawn(move || {
                    let k = r.rank() as f32;
                    let mut data = f32_bytes(&[k, 1e8 * (k - 1.0), 1.0 + k]);
                    r.all_reduce_sum(&mut data, DType::F32).unwrap();
                    data
                })
            })
            .collect();
        let outs: Vec<Vec<u8>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        // 0 + 1 + 2, (-1e8 + 0) + 1e8 in rank order, 1 + 2 + 3.
        let want = f32_bytes(&[3.0, (-1e8f32 + 0.0) + 1e8, 6.0]);
        for o in &outs {
            assert_eq!(o, &want);
        }
    }

    #[test]
    fn every_thread_rank_gets_every_ranks_buffer_in_rank_order() {
        let handles: Vec<_> = group(3)
            .into_iter()
            .map(|mut r| {
                std::thread::spawn(move || {
                    let k = r.rank() as u8;
                    let mut recv = vec![0u8; 6];
                    r.all_gather(&[k, 10 + k], &mut recv).unwrap();
                    recv
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), vec![0, 10, 1, 11, 2, 12]);
        }
    }

    #[test]
    fn ranks_gathering_different_lengths_all_get_an_error_instead_of_hanging() {
        let handles: Vec<_> = group(2)
            .into_iter()
            .map(|mut r| {
                std::thread::spawn(move || {
                    let send = vec![1u8; 1 + r.rank()];
                    let mut recv = vec![0u8; 2 * send.len()];
                    r.all_gather(&send, &mut recv)
                })
            })
            .collect();
        for h in handles {
            let e = h.join().unwrap().unwrap_err().to_string();
            assert!(e.contains("different lengths"), "{e}");
        }
    }

    #[test]
    fn ranks_reducing_different_lengths_all_get_an_error_instead_of_hanging() {
        let handles: Vec<_> = group(2)
            .into_iter()
            .map(|mut r| {
                std::thread::spawn(move || {
                    let mut data = vec![0u8; 4 * (1 + r.rank())];
                    r.all_reduce_sum(&mut data, DType::F32)
                })
            })
            .collect();
        for h in handles {
            let e = h.join().unwrap().unwrap_err().to_string();
            assert!(e.contains("different lengths"), "{e}");
        }
    }

    #[test]
    fn a_thread_ranks_reduce_scatter_is_its_part_of_the_all_reduce_to_the_bit() {
        // Three ranks, two elements each: sums whose order matters, as in the all-reduce test.
        let value = |k: f32| f32_bytes(&[k, 1e8 * (k - 1.0), 1.0 + k, 0.1 * k, -k, 3.0, 7.0, k]);
        // Every rank's thread is started before any is joined: they meet at barriers.
        let reducing: Vec<_> = group(3)
            .into_iter()
            .map(|mut r| {
                std::thread::spawn(move || {
                    let mut data = value(r.rank() as f32);
                    r.all_reduce_sum(&mut data, DType::F32).unwrap();
                    data
                })
            })
            .collect();
        let reduced: Vec<Vec<u8>> = reducing.into_iter().map(|h| h.join().unwrap()).collect();
        let handles: Vec<_> = group(3)
            .into_iter()
            .map(|mut r| {
                std::thread::spawn(move || {
                    let mut recv = vec![0u8; 8];
                    r.reduce_scatter_sum(&value(r.rank() as f32)[..24], &mut recv, DType::F32)
                        .unwrap();
                    recv
                })
            })
            .collect();
        for (k, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().unwrap(), reduced[0][8 * k..8 * k + 8], "rank {k}");
        }
    }

    #[test]
    fn a_reduce_scatter_into_an_output_of_the_wrong_size_is_an_error_on_that_rank_not_a_hang() {
        let handles: Vec<_> = group(2)
            .into_iter()
            .map(|mut r| {
                std::thread::spawn(move || {
                    let mut recv = vec![0u8; 4 + 4 * r.rank()];
                    r.reduce_scatter_sum(&[0u8; 8], &mut recv, DType::F32)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(results[0].is_ok());
        let e = results[1].as_ref().unwrap_err().to_string();
        assert!(e.contains("reduce-scatters 8 bytes"), "{e}");
    }

    #[test]
    fn a_bf16_sum_is_summed_in_f32_and_rounded_once() {
        let e = 2.0f32.powi(-8);
        let vals = [1.0f32, e, e];
        // In f32, 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly; rounding to bf16 after each addition
        // would lose both 2^-8 terms (1 + 2^-8 is a tie, rounded to even: 1).
        let once = half::bf16::from_f32(1.0 + e + e);
        let each = half::bf16::from_f32(half::bf16::from_f32(1.0 + e).to_f32() + e);
        assert_ne!(once, each, "the case tells the two apart");
        let handles: Vec<_> = group(3)
            .into_iter()
            .map(|mut r| {
                let v = half::bf16::from_f32(vals[r.rank()]);
                std::thread::spawn(move || {
                    let mut data = v.to_le_bytes().to_vec();
                    r.all_reduce_sum(&mut data, DType::BF16).unwrap();
                    half::bf16::from_le_bytes([data[0], data[1]])
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), once);
        }
    }
}
