//! When an episode's steps happened: the times `get_duration_s` measures between.

/// Seconds on the clock `time.perf_counter()` reads, so that the times stored in states
/// compare with Python's: CPython 3.11 reads `clock_gettime(CLOCK_MONOTONIC)` on Linux
/// (`time.get_clock_info("perf_counter")`). 0.0 if the clock cannot be read.
#[must_use]
pub fn perf_counter() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    if rc == 0 {
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    } else {
        0.0
    }
}

/// The [`perf_counter`] times of an episode's start (its reset, or else its first step)
/// and of its last step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimes {
    pub start: Option<f64>,
    pub last_step: Option<f64>,
}

impl StepTimes {
    /// Records `now` as the reset's time: the episode starts then.
    pub fn reset(&mut self, now: f64) {
        self.start = Some(now);
    }

    /// Records `now` as the last step's time (and the start's, at a first step without a
    /// reset before it).
    pub fn step(&mut self, now: f64) {
        self.last_step = Some(now);
        self.start.get_or_insert(now);
    }

    /// Seconds between the start and the last step; 0.0 before a step.
    #[must_use]
    pub fn duration_s(&self) -> f64 {
        match (self.start, self.last_step) {
            (Some(start), Some(last)) => last - start,
            _ => 0.0,
        }
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the times are exact binary fractions
mod tests {
    use super::*;

    #[test]
    fn the_duration_runs_from_the_start_to_the_last_step() {
        let mut times = StepTimes::default();
        assert_eq!(times.duration_s(), 0.0);
        times.reset(10.0);
        assert_eq!(times.duration_s(), 0.0, "no step yet");
        times.step(11.5);
        times.step(12.0);
        assert_eq!((times.start, times.duration_s()), (Some(10.0), 2.0));
        times.reset(20.0);
        assert_eq!(times.duration_s(), -8.0, "a reset moves the start only");
    }

    #[test]
    fn a_first_step_without_a_reset_starts_the_episode() {
        let mut times = StepTimes::default();
        times.step(3.0);
        times.step(4.0);
        assert_eq!(times, StepTimes { start: Some(3.0), last_step: Some(4.0) });
    }

    #[test]
    fn the_clock_is_monotonic() {
        let a = perf_counter();
        let b = perf_counter();
        assert!(a > 0.0 && b >= a);
    }
}
