//! Waiting for worker processes: which of a set of pipes has a message to read.
//!
//! The shared-memory sub-env backend runs its sub-envs in worker processes, each with a pipe
//! on which it answers every command (a step of some of its sub-envs, a reset). The runner
//! waits until enough sub-envs are ready to make a batch: [`wait_ready`] blocks in `poll(2)`
//! (the binding calls it with the GIL released), so no thread spins while the workers step.

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Why a wait was refused before it started.
#[derive(Clone, Debug, PartialEq)]
pub enum ReadyError {
    /// Not one weight per pipe.
    Lengths { fds: usize, weights: usize },
    /// A timeout that is negative or not a number.
    Timeout(f64),
}

impl fmt::Display for ReadyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadyError::Lengths { fds, weights } => write!(f, "{fds} fds but {weights} weights"),
            ReadyError::Timeout(t) => write!(f, "timeout_s must be >= 0, got {t}"),
        }
    }
}

impl std::error::Error for ReadyError {}

/// Checks a wait's arguments: one weight per pipe (`fds`, `weights`: their counts) and a
/// timeout in seconds that is `>= 0` (None: no limit).
///
/// Returns the timeout as [`wait_ready`] takes it (one too long for a `Duration`: none).
///
/// # Errors
/// [`ReadyError`] for counts that differ or a negative, infinite or NaN timeout.
pub fn wait_args(fds: usize, weights: usize, timeout_s: Option<f64>) -> Result<Option<Duration>, ReadyError> {
    if fds != weights {
        return Err(ReadyError::Lengths { fds, weights });
    }
    match timeout_s {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Duration::try_from_secs_f64(t).ok()),
        Some(t) => Err(ReadyError::Timeout(t)),
    }
}

/// Waits until pipes whose weights sum to at least `need` are readable (or hung up).
///
/// Each pipe stands for a worker; its weight is the number of sub-envs its pending answer
/// carries. A pipe counts once it is readable or closed (a dead worker: the reader then sees
/// the end of the file), so a dead worker never makes the wait hang.
///
/// Args:
/// - `fds`: the pipes' read ends (distinct);
/// - `weights`: one per pipe;
/// - `need`: the weight to reach (capped at the sum of all weights);
/// - `timeout`: how long to wait in all (None: without end); on timeout the pipes found
///   ready so far are returned, possibly none;
/// - `on_interrupt`: called when a signal interrupts the wait; an error ends the wait with
///   that error (the binding checks Python's signals there, so Ctrl-C works).
///
/// Returns the indices into `fds` of the ready pipes, in the order they were found ready.
///
/// # Errors
/// An error of `poll(2)` other than an interruption, or `on_interrupt`'s; an
/// `InvalidInput` error if `weights` and `fds` differ in length.
pub fn wait_ready(
    fds: &[RawFd],
    weights: &[usize],
    need: usize,
    timeout: Option<Duration>,
    mut on_interrupt: impl FnMut() -> io::Result<()>,
) -> io::Result<Vec<usize>> {
    if fds.len() != weights.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} pipes but {} weights", fds.len(), weights.len()),
        ));
    }
    let need = need.min(weights.iter().sum());
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut ready: Vec<usize> = Vec::new();
    let mut have = 0usize;
    // The pipes not found ready yet (poll is level-triggered: a ready pipe stays readable
    // until it is read, so it must leave the set).
    let mut pending: Vec<usize> = (0..fds.len()).collect();
    let mut polls: Vec<libc::pollfd> = Vec::with_capacity(fds.len());
    let mut first = true;
    while !pending.is_empty() && (first || have < need) {
        polls.clear();
        polls.extend(pending.iter().map(|&i| libc::pollfd { fd: fds[i], events: libc::POLLIN, revents: 0 }));
        // The first poll only looks (timeout 0) when nothing is needed.
        let wait_ms = if first && need == 0 { 0 } else { remaining_ms(deadline) };
        first = false;
        // SAFETY: `polls` is a valid, initialised array of `polls.len()` pollfd structs that
        // lives across the call.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                on_interrupt()?;
                first = need == 0;
                continue;
            }
            return Err(err);
        }
        let mut still = Vec::with_capacity(pending.len());
        for (p, &i) in polls.iter().zip(&pending) {
            if p.revents != 0 {
                ready.push(i);
                have += weights[i];
            } else {
                still.push(i);
            }
        }
        pending = still;
        if n == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if need == 0 {
            break;
        }
    }
    Ok(ready)
}

/// Milliseconds left until `deadline` for `poll(2)` (-1: no deadline; rounded up, so a
/// wait never ends just before its deadline and spins).
fn remaining_ms(deadline: Option<Instant>) -> libc::c_int {
    match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            let ms = left.as_micros().div_ceil(1000);
            ms.min(libc::c_int::MAX as u128) as libc::c_int
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    struct Pipe {
        read: RawFd,
        write: RawFd,
    }

    impl Pipe {
        fn new() -> Pipe {
            let mut fds = [0 as RawFd; 2];
            // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            Pipe { read: fds[0], write: fds[1] }
        }

        fn send(&self) {
            // SAFETY: writes one byte from a valid buffer to an open descriptor.
            assert_eq!(unsafe { libc::write(self.write, [1u8].as_ptr().cast(), 1) }, 1);
        }

        fn close_write(&mut self) {
            // SAFETY: closes a descriptor this pipe owns, once (marked -1 after).
            unsafe { libc::close(self.write) };
            self.write = -1;
        }
    }

    impl Drop for Pipe {
        fn drop(&mut self) {
            // SAFETY: closes the descriptors this pipe still owns.
            unsafe {
                libc::close(self.read);
                if self.write >= 0 {
                    libc::close(self.write);
                }
            }
        }
    }

    #[allow(clippy::unnecessary_wraps)] // the signature wait_ready takes
    fn no_interrupt() -> io::Result<()> {
        Ok(())
    }

    #[test]
    fn returns_the_ready_pipes_once_their_weight_is_reached() {
        let pipes: Vec<Pipe> = (0..3).map(|_| Pipe::new()).collect();
        let fds: Vec<RawFd> = pipes.iter().map(|p| p.read).collect();
        pipes[2].send();
        pipes[0].send();
        let ready = wait_ready(&fds, &[2, 2, 2], 4, Some(Duration::from_secs(5)), no_interrupt).unwrap();
        let mut sorted = ready.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 2]);
    }

    #[test]
    fn waits_for_a_pipe_that_becomes_ready_later() {
        let pipes: Vec<Pipe> = (0..2).map(|_| Pipe::new()).collect();
        let fds: Vec<RawFd> = pipes.iter().map(|p| p.read).collect();
        pipes[1].send();
        let late = pipes[0].write;
        let writer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(30));
            // SAFETY: the descriptor stays open until the pipes drop, after the join.
            assert_eq!(unsafe { libc::write(late, [1u8].as_ptr().cast(), 1) }, 1);
        });
        let start = Instant::now();
        let ready = wait_ready(&fds, &[1, 1], 2, Some(Duration::from_secs(5)), no_interrupt).unwrap();
        writer.join().unwrap();
        assert_eq!(ready, vec![1, 0], "in the order found ready");
        assert!(start.elapsed() >= Duration::from_millis(25));
    }

    #[test]
    fn a_closed_pipe_counts_as_ready() {
        let mut pipes: Vec<Pipe> = (0..2).map(|_| Pipe::new()).collect();
        let fds: Vec<RawFd> = pipes.iter().map(|p| p.read).collect();
        pipes[0].close_write();
        let ready = wait_ready(&fds, &[1, 1], 1, Some(Duration::from_secs(5)), no_interrupt).unwrap();
        assert_eq!(ready, vec![0]);
    }

    #[test]
    fn a_timeout_returns_what_is_ready_so_far() {
        let pipes: Vec<Pipe> = (0..3).map(|_| Pipe::new()).collect();
        let fds: Vec<RawFd> = pipes.iter().map(|p| p.read).collect();
        pipes[1].send();
        let start = Instant::now();
        let ready = wait_ready(&fds, &[1, 1, 1], 3, Some(Duration::from_millis(20)), no_interrupt).unwrap();
        assert_eq!(ready, vec![1]);
        assert!(start.elapsed() >= Duration::from_millis(19));
        let none = wait_ready(&fds[..1], &[1], 1, Some(Duration::ZERO), no_interrupt).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn need_zero_only_looks_and_need_is_capped_by_the_total() {
        let pipes: Vec<Pipe> = (0..2).map(|_| Pipe::new()).collect();
        let fds: Vec<RawFd> = pipes.iter().map(|p| p.read).collect();
        assert!(wait_ready(&fds, &[1, 1], 0, None, no_interrupt).unwrap().is_empty());
        pipes[0].send();
        pipes[1].send();
        assert_eq!(wait_ready(&fds, &[1, 1], 0, None, no_interrupt).unwrap().len(), 2);
        // A need above the total weight waits for all, not for ever.
        assert_eq!(wait_ready(&fds, &[1, 1], 99, None, no_interrupt).unwrap().len(), 2);
    }

    #[test]
    fn wait_args_need_a_weight_per_pipe_and_a_timeout_at_or_above_zero() {
        assert_eq!(wait_args(2, 2, None), Ok(None));
        assert_eq!(wait_args(1, 1, Some(0.25)), Ok(Some(Duration::from_millis(250))));
        assert_eq!(wait_args(1, 1, Some(0.0)), Ok(Some(Duration::ZERO)));
        assert_eq!(wait_args(1, 1, Some(1e300)), Ok(None), "longer than a Duration: no limit");
        let err = wait_args(3, 2, Some(1.0)).unwrap_err();
        assert_eq!(err.to_string(), "3 fds but 2 weights");
        assert_eq!(wait_args(1, 1, Some(-0.5)).unwrap_err().to_string(), "timeout_s must be >= 0, got -0.5");
        assert!(wait_args(1, 1, Some(f64::INFINITY)).is_err());
        assert!(wait_args(1, 1, Some(f64::NAN)).is_err());
    }

    #[test]
    fn mismatched_weights_are_refused() {
        let err = wait_ready(&[0], &[], 1, None, no_interrupt).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
