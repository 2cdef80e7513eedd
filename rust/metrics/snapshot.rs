//! What one stat's `reduce()` returns (a snapshot: its configuration and reduced payload),
//! how snapshots read as numbers, and their checkpoint state.

use super::config::{Config, Reduce};
use super::stat::{peek_payload, Payload, Peeked, Stat};
use super::state::StatState;
use super::MetricsError;

/// One stat's reduction: what `MetricsLogger.reduce()` returns per key and `aggregate()`
/// merges (RLlib: the reduced Stats clone).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot<T> {
    pub config: Config,
    pub is_root: bool,
    pub is_leaf: bool,
    pub payload: Payload<T>,
}

impl<T: Clone> Snapshot<T> {
    /// Reduces `stat` (starting its next reduce cycle) into a snapshot.
    pub fn take(stat: &mut Stat<T>, now: f64) -> Snapshot<T> {
        let payload = stat.reduce(now);
        Snapshot { config: stat.config().clone(), is_root: stat.is_root(), is_leaf: stat.is_leaf(), payload }
    }

    /// The reduced value, as the stat's `peek` gave it at reduce time.
    #[must_use]
    pub fn peek(&self, compile: bool) -> Peeked<'_, T> {
        peek_payload(&self.config.percentiles, &self.payload, compile)
    }

    /// `reduce(compile=True)`: the compiled peek, except that an item series is its list
    /// even when empty (its peek is NaN then).
    #[must_use]
    pub fn compiled(&self) -> Peeked<'_, T> {
        match &self.payload {
            Payload::Items(items) => Peeked::Items(items.iter().collect()),
            _ => self.peek(true),
        }
    }

    /// The snapshot as one number, if it is one: a number-valued reduction, or an item that
    /// `item_number` reads as a number (RLlib's Stats compare and compute as `float(self)`).
    pub fn number(&self, item_number: impl FnOnce(&T) -> Option<f64>) -> Option<f64> {
        match &self.payload {
            Payload::Item(Some(item)) => item_number(item),
            p => p.number(),
        }
    }

    /// [`Snapshot::number`], or the error for a result that is not one number (Python's
    /// `float()` / `int()` of a snapshot).
    pub fn float(&self, item_number: impl FnOnce(&T) -> Option<f64>) -> Result<f64, MetricsError> {
        self.number(item_number).ok_or_else(|| {
            MetricsError::Value(format!(
                "a reduce='{}' result is not a single number",
                self.config.reduce.name()
            ))
        })
    }

    /// The checkpoint state: configuration and payload fields ([`super::StateField::of_snapshot`]).
    #[must_use]
    pub fn to_state(&self) -> StatState<T> {
        let mut st = StatState::new(self.config.clone(), self.is_root, self.is_leaf);
        match &self.payload {
            Payload::Series(v) | Payload::Ema(v) | Payload::LifetimeSum(v) => st.value = *v,
            Payload::Mean { mean, count } => (st.value, st.count) = (*mean, *count),
            Payload::Sorted(vs) => st.values.clone_from(vs),
            Payload::Item(item) => st.item.clone_from(item),
            Payload::Items(items) => st.items.clone_from(items),
        }
        st
    }

    /// A snapshot from its state; percentile values are sorted (a state may come from anywhere).
    #[must_use]
    pub fn from_state(st: StatState<T>) -> Snapshot<T> {
        let payload = match st.config.reduce {
            Reduce::Min | Reduce::Max | Reduce::Sum => Payload::Series(st.value),
            Reduce::Mean => Payload::Mean { mean: st.value, count: st.count },
            Reduce::Ema => Payload::Ema(st.value),
            Reduce::LifetimeSum => Payload::LifetimeSum(st.value),
            Reduce::Percentiles => {
                let mut vs = st.values;
                vs.sort_by(f64::total_cmp);
                Payload::Sorted(vs)
            }
            Reduce::Item => Payload::Item(st.item),
            Reduce::ItemSeries => Payload::Items(st.items),
        };
        Snapshot { config: st.config, is_root: st.is_root, is_leaf: st.is_leaf, payload }
    }
}

/// Arithmetic of a snapshot's number with another number (a float, as on RLlib's Stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arith {
    Add,
    Sub,
    Mul,
}

impl Arith {
    /// `a op b`, or `b op a` when `reflected` (the snapshot is the right operand: `__rsub__`).
    #[must_use]
    pub fn apply(self, a: f64, b: f64, reflected: bool) -> f64 {
        let (x, y) = if reflected { (b, a) } else { (a, b) };
        match self {
            Arith::Add => x + y,
            Arith::Sub => x - y,
            Arith::Mul => x * y,
        }
    }

    /// [`Arith::apply`] when both operands are numbers; `None` otherwise (Python:
    /// `NotImplemented`, so the other operand may try).
    #[must_use]
    pub fn of(self, a: Option<f64>, b: Option<f64>, reflected: bool) -> Option<f64> {
        Some(self.apply(a?, b?, reflected))
    }
}

/// A rich comparison of a snapshot with another value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    Lt,
    Le,
    Eq,
    Ne,
    Gt,
    Ge,
}

/// What a comparison of a snapshot comes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// Both are numbers: whether the comparison holds (IEEE: NaN is only `!=`).
    Holds(bool),
    /// `==` / `!=` of a result that is not a number: compare the peeked values, and the
    /// comparison holds when their equality is `equal`.
    ByValue { equal: bool },
    /// An ordering of a result that is not a number (Python: `NotImplemented`).
    Unsupported,
}

impl Compare {
    /// Compares as RLlib's Stats do, by number (`float(self) < float(other)`); `a` is the
    /// snapshot's number, `b` the other value's, `None` where one is not a number.
    #[must_use]
    // Exact, as Python compares floats.
    #[allow(clippy::float_cmp)]
    pub fn of(self, a: Option<f64>, b: Option<f64>) -> Comparison {
        match (a, b, self) {
            (Some(a), Some(b), _) => Comparison::Holds(match self {
                Compare::Lt => a < b,
                Compare::Le => a <= b,
                Compare::Eq => a == b,
                Compare::Ne => a != b,
                Compare::Gt => a > b,
                Compare::Ge => a >= b,
            }),
            (_, _, Compare::Eq) => Comparison::ByValue { equal: true },
            (_, _, Compare::Ne) => Comparison::ByValue { equal: false },
            _ => Comparison::Unsupported,
        }
    }
}

#[cfg(test)]
// The expected values are exact.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    fn mean_of(values: &[f64]) -> Snapshot<i32> {
        let mut s = Stat::new(Config::new(Reduce::Mean), false, true, 0.0);
        for v in values {
            s.push(*v).unwrap();
        }
        Snapshot::take(&mut s, 0.0)
    }

    #[test]
    fn take_reduces_the_stat() {
        let mut s = Stat::<i32>::new(Config::new(Reduce::Sum), true, true, 0.0);
        s.push(2.0).unwrap();
        let snap = Snapshot::take(&mut s, 0.0);
        assert_eq!((snap.payload.clone(), snap.is_root, snap.is_leaf), (Payload::Series(2.0), true, true));
        assert_eq!(snap.peek(false), Peeked::Floats(vec![2.0]));
        assert_eq!(Snapshot::take(&mut s, 0.0).number(|_| None).map(f64::is_nan), Some(true));
    }

    #[test]
    fn numbers_of_snapshots() {
        assert_eq!(mean_of(&[1.0, 2.0]).number(|_| None), Some(1.5));
        let item = |i: Option<i32>| Snapshot { payload: Payload::Item(i), ..mean_of(&[]) };
        assert_eq!(item(Some(3)).number(|i| Some(f64::from(*i))), Some(3.0));
        assert_eq!(item(Some(3)).number(|_| None), None);
        assert_eq!(item(None).number(|_| Some(1.0)), None);
        let sorted = Snapshot { payload: Payload::Sorted(vec![1.0]), ..mean_of(&[]) };
        assert_eq!(sorted.number(|_| Some(1.0)), None);
    }

    #[test]
    fn compiled_item_series_stays_a_list() {
        let empty = Snapshot::<i32> { payload: Payload::Items(vec![]), ..mean_of(&[]) };
        assert_eq!(empty.compiled(), Peeked::Items(vec![]));
        assert!(matches!(empty.peek(true), Peeked::Float(v) if v.is_nan()));
        assert_eq!(mean_of(&[4.0]).compiled(), Peeked::Float(4.0));
    }

    #[test]
    fn state_round_trip_keeps_the_payload_fields() {
        let snap = mean_of(&[1.0, 3.0]);
        let st = snap.to_state();
        assert_eq!((st.value, st.count), (2.0, 2.0));
        assert_eq!(Snapshot::from_state(st), snap);
        let mut cfg = Config::new(Reduce::Percentiles);
        cfg.window = Some(4);
        let mut st = StatState::<i32>::new(cfg, false, true);
        st.values = vec![3.0, 1.0, 2.0];
        let p = Snapshot::from_state(st);
        assert_eq!(p.payload, Payload::Sorted(vec![1.0, 2.0, 3.0]), "sorted on load");
        assert_eq!(p.to_state().values, vec![1.0, 2.0, 3.0]);
        let items = Snapshot { payload: Payload::Items(vec![7, 8]), ..mean_of(&[]) };
        assert_eq!(items.to_state().items, vec![7, 8]);
    }

    #[test]
    fn arithmetic_and_reflection() {
        assert_eq!(Arith::Sub.apply(5.0, 2.0, false), 3.0);
        assert_eq!(Arith::Sub.apply(5.0, 2.0, true), -3.0);
        assert_eq!(Arith::Add.apply(1.5, 2.0, true), 3.5);
        assert_eq!(Arith::Mul.apply(3.0, 2.0, false), 6.0);
        assert!(Arith::Add.apply(f64::NAN, 1.0, false).is_nan());
    }

    #[test]
    fn arithmetic_needs_two_numbers() {
        assert_eq!(Arith::Sub.of(Some(5.0), Some(2.0), true), Some(-3.0));
        assert_eq!(Arith::Add.of(None, Some(2.0), false), None);
        assert_eq!(Arith::Mul.of(Some(2.0), None, true), None);
    }

    #[test]
    fn comparisons_by_number_then_by_value() {
        assert_eq!(Compare::Lt.of(Some(1.0), Some(2.0)), Comparison::Holds(true));
        assert_eq!(Compare::Ge.of(Some(1.0), Some(2.0)), Comparison::Holds(false));
        assert_eq!(Compare::Eq.of(Some(2.0), Some(2.0)), Comparison::Holds(true));
        let nan = Some(f64::NAN);
        for op in [Compare::Lt, Compare::Le, Compare::Eq, Compare::Gt, Compare::Ge] {
            assert_eq!(op.of(nan, nan), Comparison::Holds(false), "{op:?}");
        }
        assert_eq!(Compare::Ne.of(nan, Some(1.0)), Comparison::Holds(true));
        assert_eq!(Compare::Eq.of(None, Some(1.0)), Comparison::ByValue { equal: true });
        assert_eq!(Compare::Ne.of(Some(1.0), None), Comparison::ByValue { equal: false });
        assert_eq!(Compare::Lt.of(None, Some(1.0)), Comparison::Unsupported);
    }

    #[test]
    fn float_of_a_result_that_is_no_number_is_an_error() {
        assert_eq!(mean_of(&[1.0, 2.0]).float(|_| None), Ok(1.5));
        let sorted = Snapshot::<i32> { payload: Payload::Sorted(vec![1.0]), ..mean_of(&[]) };
        let e = MetricsError::Value("a reduce='mean' result is not a single number".into());
        assert_eq!(sorted.float(|_| None), Err(e));
    }
}
