//! Index resolution with look-back: RLlib's `InfiniteLookbackBuffer` index semantics as a
//! pure function from (index, buffer geometry, flags) to storage positions.
//!
//! A buffer holds `total` items, the first `lookback` of which precede the chunk (they are
//! kept for look-back only). User indices are relative to the chunk start:
//! - a non-negative int `i` is item `lookback + i`;
//! - a negative int counts from the end of the whole buffer (Python list semantics) unless
//!   `neg_index_as_lookback`, where `-1` is the last look-back item, `-2` the one before...;
//! - slices follow the same rules per bound; with `fill`, positions that fall outside the
//!   stored data come back as [`Pos::Fill`] instead of being clipped away.
//!
//! Both the typed byte columns and the binding layer's Python-object columns resolve
//! through here, so every column kind agrees on what an index means.

use std::fmt;

/// A user index, already converted from Python.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Index {
    /// `indices=None`: the whole chunk (not the look-back).
    All,
    Int(i64),
    List(Vec<i64>),
    Slice {
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
    },
}

/// Where one requested item comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pos {
    /// Absolute storage position (0 = first look-back item).
    At(usize),
    /// Outside the stored data: the caller's fill value.
    Fill,
}

/// The resolved form of an [`Index`]: one item, or a batch of items.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    One(Pos),
    Many(Vec<Pos>),
}

/// Errors of index resolution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexError {
    /// An int index outside the stored data, without `fill`.
    OutOfRange { index: i64, len: usize, lookback: usize },
    /// A slice with step 0.
    ZeroStep,
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexError::OutOfRange { index, len, lookback } => write!(
                f,
                "index {index} is out of range for a buffer of length {len} \
                 (with {lookback} look-back items before it)"
            ),
            IndexError::ZeroStep => f.write_str("slice step cannot be zero"),
        }
    }
}

impl std::error::Error for IndexError {}

/// RLlib's stand-in for "minus infinity" as a slice stop (a negative step runs to item 0).
const NEG_INFINITE_STOP: i64 = i64::MIN / 4;

/// The geometry of a buffer: `total` stored items, the first `lookback` of them look-back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub total: usize,
    pub lookback: usize,
}

impl Geometry {
    #[must_use]
    pub fn new(total: usize, lookback: usize) -> Geometry {
        Geometry { total, lookback: lookback.min(total) }
    }

    /// Items in the chunk (not counting look-back).
    #[must_use]
    pub fn len(self) -> usize {
        self.total.saturating_sub(self.lookback)
    }

    #[must_use]
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The index (counted from the chunk's first item, negative ones reading look-back, as
    /// with RLlib's `neg_index_as_lookback`) that reads absolute item `pos`; for `None`,
    /// the index just past the items, which reads an item appended for the read.
    #[must_use]
    pub fn index_of(self, pos: Option<usize>) -> i64 {
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        pos.map_or_else(|| int(self.len()), |p| int(p) - int(self.lookback))
    }

    /// Resolves `index` to storage positions.
    ///
    /// `fill` says whether the caller supplies a fill value: with it, out-of-range ints and
    /// the parts of slices beyond the data become [`Pos::Fill`]; without it, out-of-range
    /// ints are an error and slices are clipped.
    pub fn resolve(
        self,
        index: &Index,
        neg_index_as_lookback: bool,
        fill: bool,
    ) -> Result<Resolved, IndexError> {
        match index {
            Index::All => Ok(Resolved::Many((self.lookback..self.total).map(Pos::At).collect())),
            Index::Int(i) => self.resolve_int(*i, neg_index_as_lookback, fill).map(Resolved::One),
            Index::List(list) => list
                .iter()
                .map(|&i| self.resolve_int(i, neg_index_as_lookback, fill))
                .collect::<Result<Vec<_>, _>>()
                .map(Resolved::Many),
            Index::Slice { start, stop, step } => {
                self.resolve_slice(*start, *stop, *step, neg_index_as_lookback, fill).map(Resolved::Many)
            }
        }
    }

    fn resolve_int(self, i: i64, neg_as_lookback: bool, fill: bool) -> Result<Pos, IndexError> {
        let total = self.total as i64;
        let lookback = self.lookback as i64;
        let absolute = if i >= 0 || neg_as_lookback {
            let a = lookback + i;
            // A look-back index reaching before the first stored item is out of range
            // (RLlib maps it past the end so that it fails the same way).
            if neg_as_lookback && a < 0 {
                total
            } else {
                a
            }
        } else {
            // Plain negative index: Python list semantics over the whole buffer, look-back
            // included.
            total + i
        };
        if (0..total).contains(&absolute) {
            Ok(Pos::At(absolute as usize))
        } else if fill {
            Ok(Pos::Fill)
        } else {
            Err(IndexError::OutOfRange { index: i, len: self.len(), lookback: self.lookback })
        }
    }

    /// RLlib's interpretation of a slice: absolute `start`/`stop` (stop may be the "minus
    /// infinity" marker), the step, and how many fill items go before / after.
    fn interpret_slice(
        self,
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
        neg_as_lookback: bool,
    ) -> Result<SliceParts, IndexError> {
        let step = step.unwrap_or(1);
        if step == 0 {
            return Err(IndexError::ZeroStep);
        }
        let total = self.total as i64;
        let lookback = self.lookback as i64;
        // Each bound to an absolute position (may lie outside 0..total).
        let bound = |b: Option<i64>, default: i64| match b {
            None => default,
            Some(v) if v < 0 && !neg_as_lookback => total + v,
            Some(v) => lookback + v,
        };
        let mut start = bound(start, lookback);
        let mut stop = bound(stop, total);
        // How many fill items go before / after the stored part (RLlib's rules, including
        // its treatment of reversed slices).
        let (mut fill_left, mut fill_right) = (0i64, 0i64);
        if start < 0 && stop < 0 {
            fill_left = (start - stop).abs();
            start = 0;
            stop = 0;
        } else if start >= total && stop >= total {
            fill_right = (start - stop).abs();
            start = total;
            stop = total;
        } else if start < 0 {
            fill_left = -start;
            start = 0;
        } else if stop >= total {
            fill_right = stop - total;
            stop = total;
        } else if stop < 0 {
            if start >= total {
                fill_left = start - total + 1;
                start = total - 1;
            }
            fill_right = -stop - 1;
            stop = NEG_INFINITE_STOP;
        }
        Ok(SliceParts { start, stop, step, fill_left, fill_right })
    }

    fn resolve_slice(
        self,
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
        neg_as_lookback: bool,
        fill: bool,
    ) -> Result<Vec<Pos>, IndexError> {
        let parts = self.interpret_slice(start, stop, step, neg_as_lookback)?;
        let mut out = Vec::new();
        if fill {
            out.extend(std::iter::repeat_n(Pos::Fill, parts.fill_left as usize));
        }
        out.extend(
            python_slice(self.total as i64, parts.start, parts.stop, parts.step).map(|p| Pos::At(p as usize)),
        );
        if fill {
            out.extend(std::iter::repeat_n(Pos::Fill, parts.fill_right as usize));
        }
        Ok(out)
    }

    /// Whether RLlib reads a data part for this slice (its nominal length is positive),
    /// even if that part turns out empty. It decides the dtype of a batch that mixes data
    /// and fill: an empty data part still takes part in the concatenation.
    #[must_use]
    pub fn slice_reads_data(
        self,
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
        neg_index_as_lookback: bool,
    ) -> bool {
        self.interpret_slice(start, stop, step, neg_index_as_lookback).is_ok_and(|p| {
            // RLlib: max(0, (stop - start + (step - sign(step))) // step), Python floor division.
            let num = p.stop - p.start + (p.step - p.step.signum());
            let q = num / p.step;
            let len = if num % p.step != 0 && ((num < 0) != (p.step < 0)) { q - 1 } else { q };
            len > 0
        })
    }
}

/// A slice as RLlib interprets it (see [`Geometry::interpret_slice`]).
struct SliceParts {
    start: i64,
    stop: i64,
    step: i64,
    fill_left: i64,
    fill_right: i64,
}

/// The positions `range(total)[start:stop:step]` selects, with Python's rules for any
/// bounds (negative ones count from the end, then clamp; the "minus infinity" stop runs a
/// negative step down to position 0).
fn python_slice(total: i64, start: i64, stop: i64, step: i64) -> impl Iterator<Item = i64> {
    // CPython's PySlice_AdjustIndices.
    let adjust = |v: i64| -> i64 {
        if v < 0 {
            let v = v.saturating_add(total);
            if v < 0 {
                if step < 0 {
                    -1
                } else {
                    0
                }
            } else {
                v
            }
        } else if v >= total {
            if step < 0 {
                total - 1
            } else {
                total
            }
        } else {
            v
        }
    };
    let (first, end) = (adjust(start), adjust(stop));
    let count = if step > 0 {
        if end > first {
            (end - first + step - 1) / step
        } else {
            0
        }
    } else if first > end {
        (first - end + (-step) - 1) / (-step)
    } else {
        0
    };
    (0..count).map(move |k| first + k * step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(v: &[usize]) -> Vec<Pos> {
        v.iter().map(|&p| Pos::At(p)).collect()
    }

    #[test]
    fn index_of_counts_from_the_first_item_after_the_lookback() {
        let g = Geometry::new(5, 2);
        assert_eq!((g.index_of(Some(0)), g.index_of(Some(2)), g.index_of(Some(4))), (-2, 0, 2));
        // Past the items: where an appended item is read.
        assert_eq!(g.index_of(None), 3);
        assert_eq!(Geometry::new(0, 0).index_of(None), 0);
    }

    fn slice(g: Geometry, a: Option<i64>, b: Option<i64>, s: Option<i64>, neg: bool, fill: bool) -> Vec<Pos> {
        match g.resolve(&Index::Slice { start: a, stop: b, step: s }, neg, fill).unwrap() {
            Resolved::Many(v) => v,
            Resolved::One(_) => panic!("slice resolved to one item"),
        }
    }

    #[test]
    fn ints_relative_to_chunk_start() {
        let g = Geometry::new(5, 2); // [lb0 lb1 | c0 c1 c2]
        assert_eq!(g.resolve(&Index::Int(0), false, false), Ok(Resolved::One(Pos::At(2))));
        assert_eq!(g.resolve(&Index::Int(-1), false, false), Ok(Resolved::One(Pos::At(4))));
        // Plain negatives reach into the look-back, as Python lists do.
        assert_eq!(g.resolve(&Index::Int(-5), false, false), Ok(Resolved::One(Pos::At(0))));
        assert!(g.resolve(&Index::Int(-6), false, false).is_err());
        assert!(g.resolve(&Index::Int(3), false, false).is_err());
        assert_eq!(g.resolve(&Index::Int(3), false, true), Ok(Resolved::One(Pos::Fill)));
    }

    #[test]
    fn negative_ints_as_lookback() {
        let g = Geometry::new(5, 2);
        assert_eq!(g.resolve(&Index::Int(-1), true, false), Ok(Resolved::One(Pos::At(1))));
        assert_eq!(g.resolve(&Index::Int(-2), true, false), Ok(Resolved::One(Pos::At(0))));
        assert!(g.resolve(&Index::Int(-3), true, false).is_err());
        assert_eq!(g.resolve(&Index::Int(-3), true, true), Ok(Resolved::One(Pos::Fill)));
    }

    #[test]
    fn all_is_the_chunk() {
        let g = Geometry::new(5, 2);
        assert_eq!(g.resolve(&Index::All, false, false), Ok(Resolved::Many(at(&[2, 3, 4]))));
        assert_eq!(g.len(), 3);
        assert!(Geometry::new(2, 2).is_empty());
        assert_eq!(Geometry::new(2, 9).lookback, 2, "look-back is capped at the data");
    }

    #[test]
    fn slices_clip_without_fill_and_pad_with_fill() {
        let g = Geometry::new(5, 2);
        assert_eq!(slice(g, Some(-1), None, None, false, false), at(&[4]));
        assert_eq!(slice(g, Some(1), Some(10), None, false, false), at(&[3, 4]));
        assert_eq!(
            slice(g, Some(1), Some(5), None, false, true),
            vec![Pos::At(3), Pos::At(4), Pos::Fill, Pos::Fill]
        );
        // Look-back slice reaching before the data.
        assert_eq!(
            slice(g, Some(-4), Some(1), None, true, true),
            vec![Pos::Fill, Pos::Fill, Pos::At(0), Pos::At(1), Pos::At(2)]
        );
        assert_eq!(slice(g, Some(-4), Some(1), None, true, false), at(&[0, 1, 2]));
        // Entirely before / after the data.
        assert_eq!(slice(g, Some(-9), Some(-7), None, true, true), vec![Pos::Fill; 2]);
        assert_eq!(slice(g, Some(7), Some(9), None, false, true), vec![Pos::Fill; 2]);
        assert_eq!(slice(g, Some(7), Some(9), None, false, false), vec![]);
    }

    #[test]
    fn steps_and_reversed_slices() {
        let g = Geometry::new(6, 1);
        assert_eq!(slice(g, None, None, Some(2), false, false), at(&[1, 3, 5]));
        assert_eq!(slice(g, None, None, Some(-1), false, false), vec![]);
        assert_eq!(slice(g, Some(-1), Some(-4), Some(-1), false, false), at(&[5, 4, 3]));
        assert_eq!(
            g.resolve(&Index::Slice { start: None, stop: None, step: Some(0) }, false, false),
            Err(IndexError::ZeroStep)
        );
    }

    #[test]
    fn python_slice_matches_python() {
        // range(5)[3:0:-1] == [3, 2, 1]; range(5)[10::-2] == [4, 2, 0]
        assert_eq!(python_slice(5, 3, 0, -1).collect::<Vec<_>>(), vec![3, 2, 1]);
        assert_eq!(python_slice(5, 10, NEG_INFINITE_STOP, -2).collect::<Vec<_>>(), vec![4, 2, 0]);
        assert_eq!(python_slice(5, 1, 4, 2).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(python_slice(0, 0, 0, 1).count(), 0);
        assert_eq!(python_slice(0, -1, NEG_INFINITE_STOP, 1).count(), 0);
        assert_eq!(python_slice(5, -2, 5, 1).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(python_slice(5, -9, 2, 1).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn reversed_bounds_on_an_empty_buffer_give_only_fill() {
        // RLlib 2.60 trips its own assertion here (start becomes -1); the right answer is
        // the fill items and no data.
        let g = Geometry::new(0, 0);
        assert_eq!(slice(g, Some(5), Some(-1), None, false, true), vec![Pos::Fill; 6]);
        assert_eq!(slice(g, Some(5), Some(-1), None, false, false), vec![]);
    }

    #[test]
    fn slice_reads_data_follows_the_nominal_length() {
        let g = Geometry::new(0, 0);
        // Fill on the left, then a nominal data part [0:3] that is empty.
        assert!(g.slice_reads_data(Some(-6), Some(3), None, true));
        assert!(!g.slice_reads_data(Some(2), Some(2), None, false));
        let g = Geometry::new(5, 0);
        assert!(g.slice_reads_data(Some(-1), Some(-4), Some(-1), false));
        assert!(!g.slice_reads_data(Some(3), Some(1), None, false));
    }

    #[test]
    fn lists_resolve_each_int() {
        let g = Geometry::new(4, 1);
        assert_eq!(
            g.resolve(&Index::List(vec![0, -1, 7]), false, true),
            Ok(Resolved::Many(vec![Pos::At(1), Pos::At(3), Pos::Fill]))
        );
        assert!(g.resolve(&Index::List(vec![0, 7]), false, false).is_err());
    }
}
