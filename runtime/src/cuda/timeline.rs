//! Where a step's time goes *inside* its graph: the step captured once more with a timestamp
//! after every operation, so that overlap (collectives beside the backward pass, independent
//! branches) shows as it runs, which the op-by-op profile ([`super::CudaStep::profile`]) cannot
//! show.
//!
//! Each stamp is a one-thread kernel writing `%globaltimer` into its slot of a buffer outside
//! the plan (a diagnostic's allocation, never a step's). A stamp depends only on its operation's
//! last graph nodes and nothing depends on it, so the step's own dependencies are unchanged; the
//! stamps are captured on a stream of the GPU's highest priority, so a stamp is not queued
//! behind the blocks of the kernels launched after its operation. Slot 0 is a stamp with no
//! dependency: the graph's start.
//!
//! The analysis here is plain arithmetic over the stamps and the program's dependencies, tested
//! on the host: an operation's start is taken as the latest end among its dependencies (the
//! graph's start for a root), so a span covers waiting for SMs as well as running.

/// The stamp kernel, as PTX: writes the global nanosecond timer to `out`.
pub const STAMP_PTX: &str = r#".version 7.0
.target sm_70
.address_size 64

.visible .entry ingot_stamp(.param .u64 out)
{
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u64 %rd3, %globaltimer;
    st.global.u64 [%rd2], %rd3;
    ret;
}
"#;

/// The stamp kernel's entry name in [`STAMP_PTX`].
pub const STAMP_KERNEL: &str = "ingot_stamp";

/// One operation's place in a replay, in microseconds from the graph's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub start_us: f64,
    pub end_us: f64,
}

impl Span {
    pub fn us(&self) -> f64 {
        self.end_us - self.start_us
    }
}

/// Each operation's span from the raw stamps (`stamps[0]` the graph's start, `stamps[i + 1]`
/// operation `i`'s end, in nanoseconds) and the program's dependencies (`deps[i]`: operations
/// before `i`). A stamp earlier than the start (a timer that went back, or a stamp never
/// written) is read as the start, so no span is negative.
pub fn spans(stamps: &[u64], deps: &[impl AsRef<[usize]>]) -> Vec<Span> {
    let t0 = stamps.first().copied().unwrap_or(0);
    let ends: Vec<f64> = stamps
        .iter()
        .skip(1)
        .map(|&t| t.saturating_sub(t0) as f64 / 1e3)
        .collect();
    deps.iter()
        .zip(&ends)
        .map(|(d, &end)| {
            let start = d
                .as_ref()
                .iter()
                .filter_map(|&j| ends.get(j).copied())
                .fold(0.0, f64::max);
            Span {
                start_us: start.min(end),
                end_us: end,
            }
        })
        .collect()
}

/// The length of the union of `intervals` (each `(start, end)`), in their unit.
fn union_length(mut intervals: Vec<(f64, f64)>) -> f64 {
    intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut cur: Option<(f64, f64)> = None;
    for (s, e) in intervals {
        match &mut cur {
            Some((_, ce)) if s <= *ce => *ce = ce.max(e),
            _ => {
                if let Some((cs, ce)) = cur {
                    total += ce - cs;
                }
                cur = Some((s, e));
            }
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

/// The time some collective runs while no other operation does, in microseconds: what the
/// collectives add to the step that overlap did not hide.
pub fn exposed_collective_us(spans: &[Span], collective: &[bool]) -> f64 {
    let pick = |want: bool| -> Vec<(f64, f64)> {
        spans
            .iter()
            .zip(collective)
            .filter(|(_, &c)| c == want)
            .map(|(s, _)| (s.start_us, s.end_us))
            .collect()
    };
    let (comm, compute) = (pick(true), pick(false));
    let both: Vec<(f64, f64)> = comm.iter().chain(&compute).copied().collect();
    // |comm \ compute| = |comm ∪ compute| - |compute|.
    union_length(both) - union_length(compute)
}

/// The step's length: the latest end.
pub fn length_us(spans: &[Span]) -> f64 {
    spans.iter().map(|s| s.end_us).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_starts_when_its_latest_dependency_ends() {
        // op 0 ends at 10 us, op 1 (after 0) at 25, op 2 (after 0 and 1) at 40, op 3 a root.
        let stamps = [1_000, 11_000, 26_000, 41_000, 6_000];
        let deps: Vec<Vec<usize>> = vec![vec![], vec![0], vec![0, 1], vec![]];
        let s = spans(&stamps, &deps);
        assert_eq!(
            s[0],
            Span {
                start_us: 0.0,
                end_us: 10.0
            }
        );
        assert_eq!(
            s[1],
            Span {
                start_us: 10.0,
                end_us: 25.0
            }
        );
        assert_eq!(
            s[2],
            Span {
                start_us: 25.0,
                end_us: 40.0
            }
        );
        assert_eq!(
            s[3],
            Span {
                start_us: 0.0,
                end_us: 5.0
            }
        );
        assert_eq!(length_us(&s), 40.0);
    }

    #[test]
    fn a_stamp_before_the_start_gives_an_empty_span_not_a_negative_one() {
        let s = spans(&[5_000, 1_000], &[Vec::<usize>::new()]);
        assert_eq!(
            s[0],
            Span {
                start_us: 0.0,
                end_us: 0.0
            }
        );
    }

    #[test]
    fn only_the_part_of_a_collective_that_no_compute_overlaps_is_exposed() {
        let s = |a: f64, b: f64| Span {
            start_us: a,
            end_us: b,
        };
        // Compute 0..10 and 12..20; a collective 5..15 is exposed for 10..12 only, another
        // 18..30 for 20..30.
        let spans = [s(0.0, 10.0), s(12.0, 20.0), s(5.0, 15.0), s(18.0, 30.0)];
        let collective = [false, false, true, true];
        let exposed = exposed_collective_us(&spans, &collective);
        assert!((exposed - 12.0).abs() < 1e-9, "{exposed}");
        // Hidden entirely: nothing exposed.
        let hidden = [s(0.0, 10.0), s(2.0, 8.0)];
        assert_eq!(exposed_collective_us(&hidden, &[false, true]), 0.0);
    }
}
