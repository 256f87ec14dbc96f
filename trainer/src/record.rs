//! What a run keeps of its steps, in memory that does not grow with them: a trainer whose point
//! is flat memory must be flat itself (issue 53). Each structure takes its whole capacity when
//! it is made, so a run of a billion steps holds the bytes a run of a hundred holds
//! (`tests/flat_host_memory.rs` counts them).
//!
//! - [`StepTimes`]: the count, min, mean and max of every step's time, and the median of the
//!   last [`StepTimes::WINDOW`] steps (exact for shorter runs: the median of all of them).
//! - [`Curve`]: a curve of at most [`Curve::POINTS`] points for the run report, thinned as it
//!   grows (every other point dropped and the stride doubled when it is full), its first and
//!   last points always kept.

/// Step times: the median of the last [`StepTimes::WINDOW`] finite ones (a ring buffer), and
/// the count, min, mean and max of all finite ones.
#[derive(Clone, Debug)]
pub struct StepTimes {
    /// The last finite times, in a ring once full (`next` is where the next one goes).
    ring: Vec<f64>,
    next: usize,
    /// Finite times seen, and their sum, min and max.
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Default for StepTimes {
    fn default() -> StepTimes {
        StepTimes::new()
    }
}

impl StepTimes {
    /// The steps the median is taken over: the last 4,096 (32 KiB).
    pub const WINDOW: usize = 4096;

    /// Empty, with the whole window allocated.
    pub fn new() -> StepTimes {
        StepTimes {
            ring: Vec::with_capacity(Self::WINDOW),
            next: 0,
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    /// Records one step's time; a time that is not finite is left out of every figure.
    pub fn push(&mut self, seconds: f64) {
        if !seconds.is_finite() {
            return;
        }
        if self.ring.len() < Self::WINDOW {
            self.ring.push(seconds);
        } else {
            self.ring[self.next] = seconds;
        }
        self.next = (self.next + 1) % Self::WINDOW;
        self.count += 1;
        self.sum += seconds;
        self.min = self.min.min(seconds);
        self.max = self.max.max(seconds);
    }

    /// The finite times recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The median of the window's times (of all of them while there are at most
    /// [`StepTimes::WINDOW`]); `None` before the first.
    pub fn median(&self) -> Option<f64> {
        if self.ring.is_empty() {
            return None;
        }
        let mut v = self.ring.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    /// The steps the median was taken over, where that is fewer than all the finite ones
    /// recorded (`None`: the median is of all of them).
    pub fn median_window(&self) -> Option<u64> {
        (self.count > self.ring.len() as u64).then_some(self.ring.len() as u64)
    }

    /// The smallest, the mean and the largest time recorded; `None` before the first.
    pub fn min_mean_max(&self) -> Option<(f64, f64, f64)> {
        (self.count > 0).then(|| (self.min, self.sum / self.count as f64, self.max))
    }
}

/// A curve of (step, value) points for the run report, of at most [`Curve::POINTS`] points: a
/// run longer than that keeps every 2^k-th point (k grows as the run does) and its last.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve<T> {
    points: Vec<(u64, T)>,
    /// One point in `stride` is kept.
    stride: u64,
    /// Points pushed, and the last of them.
    count: u64,
    last: Option<(u64, T)>,
}

impl<T: Copy> Default for Curve<T> {
    fn default() -> Curve<T> {
        Curve::new()
    }
}

impl<T: Copy> Curve<T> {
    /// The most points kept (16 KiB of (u64, f64)).
    pub const POINTS: usize = 1024;

    /// Empty, with room for all its points.
    pub fn new() -> Curve<T> {
        Curve {
            points: Vec::with_capacity(Self::POINTS),
            stride: 1,
            count: 0,
            last: None,
        }
    }

    /// Adds a point; it is kept if its index is a multiple of the stride, and is the last
    /// point until the next one comes either way.
    pub fn push(&mut self, step: u64, value: T) {
        if self.count.is_multiple_of(self.stride) {
            if self.points.len() == Self::POINTS {
                // Full: keep every other point (those at multiples of the doubled stride).
                let mut kept = 0;
                for i in (0..self.points.len()).step_by(2) {
                    self.points[kept] = self.points[i];
                    kept += 1;
                }
                self.points.truncate(kept);
                self.stride *= 2;
            }
            if self.count.is_multiple_of(self.stride) {
                self.points.push((step, value));
            }
        }
        self.count += 1;
        self.last = Some((step, value));
    }

    /// The points pushed (not only those kept).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether no point was pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The first point pushed.
    pub fn first(&self) -> Option<(u64, T)> {
        self.points.first().copied()
    }

    /// The last point pushed.
    pub fn last(&self) -> Option<(u64, T)> {
        self.last
    }

    /// The points kept, in order, and the last one pushed where it was not kept: every point
    /// of a curve of at most [`Curve::POINTS`] of them.
    pub fn points(&self) -> impl Iterator<Item = (u64, T)> + '_ {
        let tail = match (self.points.last(), self.last) {
            (Some(k), Some(l)) if k.0 != l.0 => Some(l),
            (None, l) => l,
            _ => None,
        };
        self.points.iter().copied().chain(tail)
    }
}

impl<T: Copy> FromIterator<(u64, T)> for Curve<T> {
    fn from_iter<I: IntoIterator<Item = (u64, T)>>(iter: I) -> Curve<T> {
        let mut c = Curve::new();
        for (s, v) in iter {
            c.push(s, v);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact_median(xs: &[f64]) -> f64 {
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    #[test]
    fn a_short_run_s_median_is_the_median_of_every_step() {
        let xs: Vec<f64> = (0..999)
            .map(|i| ((i * 7919) % 1000) as f64 * 1e-3)
            .collect();
        let mut t = StepTimes::new();
        for &x in &xs {
            t.push(x);
        }
        t.push(f64::NAN);
        assert_eq!(t.median(), Some(exact_median(&xs)));
        assert_eq!(t.median_window(), None);
        assert_eq!(t.count(), 999);
        let (min, _, max) = t.min_mean_max().unwrap();
        assert_eq!((min, max), (0.0, 0.999));
    }

    #[test]
    fn a_long_run_s_median_is_of_the_last_window_and_its_memory_is_the_window() {
        let mut t = StepTimes::new();
        let capacity = t.ring.capacity();
        let xs: Vec<f64> = (0..3 * StepTimes::WINDOW + 17).map(|i| i as f64).collect();
        for &x in &xs {
            t.push(x);
        }
        assert_eq!(t.ring.capacity(), capacity, "the ring never grows");
        assert_eq!(
            t.median(),
            Some(exact_median(&xs[xs.len() - StepTimes::WINDOW..]))
        );
        assert_eq!(t.median_window(), Some(StepTimes::WINDOW as u64));
        let (min, mean, max) = t.min_mean_max().unwrap();
        assert_eq!((min, max), (0.0, (xs.len() - 1) as f64));
        assert_eq!(mean, xs.iter().sum::<f64>() / xs.len() as f64);
    }

    #[test]
    fn a_curve_of_up_to_its_capacity_keeps_every_point() {
        let c: Curve<f64> = (1..=Curve::<f64>::POINTS as u64)
            .map(|i| (i, i as f64))
            .collect();
        let all: Vec<(u64, f64)> = c.points().collect();
        assert_eq!(all.len(), Curve::<f64>::POINTS);
        assert_eq!(all[0], (1, 1.0));
        assert_eq!(c.last(), Some((1024, 1024.0)));
    }

    #[test]
    fn a_long_curve_is_thinned_evenly_and_keeps_its_ends() {
        let mut c = Curve::new();
        let capacity = c.points.capacity();
        for i in 1..=100_003u64 {
            c.push(i, i as f64);
        }
        assert_eq!(c.points.capacity(), capacity, "the curve never grows");
        let kept: Vec<(u64, f64)> = c.points().collect();
        assert!(kept.len() <= Curve::<f64>::POINTS + 1);
        assert!(kept.len() > Curve::<f64>::POINTS / 2);
        assert_eq!(kept.first(), Some(&(1, 1.0)));
        assert_eq!(kept.last(), Some(&(100_003, 100_003.0)));
        assert_eq!(c.count(), 100_003);
        // Evenly spaced: every gap but the last is the stride.
        let gaps: Vec<u64> = kept.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert!(gaps[..gaps.len() - 1].iter().all(|&g| g == c.stride));
    }
}
