//! The buffers behind windowed stats.
//!
//! - [`Ring`]: the most recent `capacity` values, allocated once; a push past capacity
//!   overwrites the oldest (O(1), no allocation after the first fill).
//! - [`SortedValues`]: a multiset kept sorted for percentiles. With a window, each push
//!   inserts by binary search and the evicted value is removed the same way (O(log w) to
//!   find, one `memmove` of at most w floats: about 0.1 µs at w = 1000), so a peek reads
//!   percentiles off directly. Without a window, pushes go to an unsorted tail that is
//!   sorted and merged in at the next read (O(k log k + n)), never a sort of the history.

use std::cmp::Ordering;

/// A fixed-capacity ring buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Ring<T> {
    buf: Vec<T>,
    capacity: usize,
    /// Index of the oldest value once the buffer is full.
    head: usize,
}

impl<T> Ring<T> {
    /// An empty ring holding at most `capacity` (>= 1) values.
    #[must_use]
    pub fn new(capacity: usize) -> Ring<T> {
        Ring { buf: Vec::new(), capacity: capacity.max(1), head: 0 }
    }

    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Appends `v`; returns the value it evicted when the ring was full.
    pub fn push(&mut self, v: T) -> Option<T> {
        if self.buf.len() < self.capacity {
            self.buf.push(v);
            None
        } else {
            let old = std::mem::replace(&mut self.buf[self.head], v);
            self.head = (self.head + 1) % self.capacity;
            Some(old)
        }
    }

    /// The values, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        let (a, b) = self.buf.split_at(self.head);
        b.iter().chain(a.iter())
    }

    /// Removes and returns the values, oldest first.
    pub fn drain(&mut self) -> Vec<T> {
        let mut v = std::mem::take(&mut self.buf);
        v.rotate_left(self.head);
        self.head = 0;
        v
    }
}

/// Total order on floats with NaN last; the stats never hold NaN where this is used
/// (percentiles reject it), the order only has to be total.
fn cmp_f64(a: f64, b: f64) -> Ordering {
    a.total_cmp(&b)
}

/// A sorted multiset of floats, optionally limited to the most recent `window` values.
#[derive(Debug, Clone, PartialEq)]
pub struct SortedValues {
    /// Insertion order, for eviction (only with a window).
    ring: Option<Ring<f64>>,
    sorted: Vec<f64>,
    /// Values pushed since the last read (only without a window).
    pending: Vec<f64>,
}

impl SortedValues {
    #[must_use]
    pub fn new(window: Option<usize>) -> SortedValues {
        SortedValues { ring: window.map(Ring::new), sorted: Vec::new(), pending: Vec::new() }
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.sorted.len() + self.pending.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn push(&mut self, v: f64) {
        match &mut self.ring {
            Some(ring) => {
                if let Some(old) = ring.push(v) {
                    if let Ok(i) = self.sorted.binary_search_by(|x| cmp_f64(*x, old)) {
                        self.sorted.remove(i);
                    }
                }
                let i = self.sorted.partition_point(|x| cmp_f64(*x, v) == Ordering::Less);
                self.sorted.insert(i, v);
            }
            None => self.pending.push(v),
        }
    }

    /// Merges an already sorted run of values in (aggregation; no window applies).
    pub fn extend_sorted(&mut self, run: &[f64]) {
        self.flush();
        let mut out = Vec::with_capacity(self.sorted.len() + run.len());
        let (mut i, mut j) = (0, 0);
        while i < self.sorted.len() && j < run.len() {
            if cmp_f64(run[j], self.sorted[i]) == Ordering::Less {
                out.push(run[j]);
                j += 1;
            } else {
                out.push(self.sorted[i]);
                i += 1;
            }
        }
        out.extend_from_slice(&self.sorted[i..]);
        out.extend_from_slice(&run[j..]);
        self.sorted = out;
    }

    fn flush(&mut self) {
        if !self.pending.is_empty() {
            let mut run = std::mem::take(&mut self.pending);
            run.sort_unstable_by(|a, b| cmp_f64(*a, *b));
            self.extend_sorted(&run);
        }
    }

    /// The values in ascending order.
    pub fn sorted(&mut self) -> &[f64] {
        self.flush();
        &self.sorted
    }

    /// The values in the order they were pushed (window) or ascending (no window).
    pub fn in_order(&mut self) -> Vec<f64> {
        match &self.ring {
            Some(ring) => ring.iter().copied().collect(),
            None => self.sorted().to_vec(),
        }
    }

    /// Removes and returns the values in ascending order.
    pub fn take_sorted(&mut self) -> Vec<f64> {
        self.flush();
        if let Some(ring) = &mut self.ring {
            ring.drain();
        }
        std::mem::take(&mut self.sorted)
    }
}

/// Percentile `p` (0..=100) of ascending `sorted` by linear interpolation between the two
/// nearest ranks (numpy's default), `None` for no values.
#[must_use]
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let index = p / 100.0 * (n - 1) as f64;
    let lower = index.floor();
    let lo = (lower as usize).min(n - 1);
    // Exactly on a rank (RLlib's `index.is_integer()`): that value, no interpolation.
    #[allow(clippy::float_cmp)]
    let on_rank = index == lower;
    if on_rank {
        return Some(sorted[lo]);
    }
    let weight = index - lower;
    let hi = (lo + 1).min(n - 1);
    Some(sorted[lo] * (1.0 - weight) + sorted[hi] * weight)
}

#[cfg(test)]
// The expected values are exact.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_last_values_in_order() {
        let mut r = Ring::new(3);
        assert_eq!(r.push(1), None);
        r.push(2);
        r.push(3);
        assert_eq!(r.push(4), Some(1));
        assert_eq!(r.push(5), Some(2));
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(r.drain(), vec![3, 4, 5]);
        assert!(r.is_empty());
        r.push(9);
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), vec![9]);
    }

    #[test]
    fn sorted_window_evicts_oldest() {
        let mut s = SortedValues::new(Some(3));
        for v in [5.0, 1.0, 3.0, 2.0, 2.0] {
            s.push(v);
        }
        assert_eq!(s.sorted(), &[2.0, 2.0, 3.0]);
        assert_eq!(s.in_order(), vec![3.0, 2.0, 2.0]);
        assert_eq!(s.take_sorted(), vec![2.0, 2.0, 3.0]);
        assert!(s.is_empty());
    }

    #[test]
    fn ring_of_one_and_sorted_duplicates() {
        let mut r = Ring::new(1);
        assert_eq!(r.push(1), None);
        assert_eq!(r.push(2), Some(1));
        assert_eq!((r.len(), r.capacity()), (1, 1));
        let mut s = SortedValues::new(Some(2));
        for v in [1.0, 1.0, 1.0, 0.5] {
            s.push(v);
        }
        assert_eq!(s.sorted(), &[0.5, 1.0]);
        assert_eq!(s.in_order(), vec![1.0, 0.5]);
    }

    #[test]
    fn sorted_unbounded_merges_pending_runs() {
        let mut s = SortedValues::new(None);
        for v in [5.0, 1.0, 3.0] {
            s.push(v);
        }
        assert_eq!(s.sorted(), &[1.0, 3.0, 5.0]);
        s.push(2.0);
        s.extend_sorted(&[0.0, 4.0]);
        assert_eq!(s.sorted(), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(4.0));
        assert_eq!(percentile(&v, 50.0), Some(2.5));
        assert!((percentile(&v, 90.0).unwrap() - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&[], 50.0), None);
    }
}
