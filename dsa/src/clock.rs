//! The solver's time limit, kept on the clock of the thread that does the work.
//!
//! A wall-clock deadline stops the work early when the machine is busy: the same problem then
//! gets another answer under load, and the planner's rule that the same graph gets the same
//! plan breaks on a loaded CI machine (measured: two compiles of one model at load 12 planned
//! two slabs). The CPU time the solving thread has itself spent does not depend on what else
//! runs, so a limit on it stops the same work on a busy machine as on an idle one; only a
//! slower processor could reach it sooner, and the planner sets it far above what its node
//! budget needs.

use std::time::Duration;

/// The point, on the current thread's CPU clock, at which the work stops.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    at: Duration,
}

impl Deadline {
    /// `limit` of this thread's CPU time from now.
    pub(crate) fn after(limit: Duration) -> Deadline {
        Deadline {
            at: thread_cpu().saturating_add(limit),
        }
    }

    /// Whether this thread has spent its time.
    pub(crate) fn passed(self) -> bool {
        thread_cpu() >= self.at
    }

    /// The CPU time left, to start the same budget on another thread's clock (a worker's:
    /// `Deadline::after(d.left())` on that thread).
    pub(crate) fn left(self) -> Duration {
        self.at.saturating_sub(thread_cpu())
    }
}

/// CPU time the calling thread has run.
#[cfg(unix)]
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant libc defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return wall();
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Elsewhere (no thread CPU clock): time since the first call, as before.
#[cfg(not(unix))]
fn thread_cpu() -> Duration {
    wall()
}

fn wall() -> Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleeping_thread_spends_none_of_its_deadline() {
        let d = Deadline::after(Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            !d.passed(),
            "60 ms asleep counted against a 20 ms CPU budget"
        );
    }

    #[test]
    fn a_busy_thread_reaches_its_deadline() {
        let d = Deadline::after(Duration::from_millis(5));
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while !d.passed() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            assert!(start.elapsed() < Duration::from_secs(30), "never passed");
        }
        assert!(d.left().is_zero());
        std::hint::black_box(x);
    }

    #[test]
    fn a_worker_thread_gets_the_time_left_on_its_own_clock() {
        let d = Deadline::after(Duration::from_secs(3600));
        let left = d.left();
        let passed = std::thread::spawn(move || Deadline::after(left).passed())
            .join()
            .unwrap();
        assert!(!passed);
        let spent = Deadline::after(Duration::ZERO).left();
        assert!(std::thread::spawn(move || Deadline::after(spent).passed())
            .join()
            .unwrap());
    }
}
