//! One statistic: RLlib 2.60's Stats classes' numbers, with O(1) pushes.
//!
//! A stat is a *leaf* when values are logged to it directly, and an *aggregator* when it
//! was created by merging the reductions of other loggers (`MetricsLogger.aggregate`).
//! A stat in a root logger is *root*; only root lifetime sums keep their value on reduce.
//!
//! Where RLlib 2.60 is wrong this core does the right thing (pinned in the Python tests):
//! merged means are weighted by the number of values behind each incoming mean (RLlib
//! averages the means, so a runner with one episode counts as much as one with a hundred).

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::Instant;

use super::config::{Config, Reduce};
use super::state::StatState;
use super::window::{percentile, Ring, SortedValues};
use super::{value_err, MetricsError};

/// Running reduction over the non-NaN values seen (NaN results when there were none).
///
/// For min/max/sum `value` is the running min/max/sum; for mean it is the weighted sum and
/// `count` the total weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acc {
    pub value: f64,
    pub count: f64,
}

impl Acc {
    const EMPTY: Acc = Acc { value: 0.0, count: 0.0 };

    fn add(&mut self, reduce: Reduce, v: f64, weight: f64) {
        if v.is_nan() || weight <= 0.0 {
            return;
        }
        if self.count == 0.0 {
            self.value = if reduce == Reduce::Mean { v * weight } else { v };
        } else {
            self.value = match reduce {
                Reduce::Min => self.value.min(v),
                Reduce::Max => self.value.max(v),
                Reduce::Mean => self.value + v * weight,
                _ => self.value + v,
            };
        }
        self.count += weight;
    }

    fn result(&self, reduce: Reduce) -> f64 {
        if self.count == 0.0 {
            f64::NAN
        } else if reduce == Reduce::Mean {
            self.value / self.count
        } else {
            self.value
        }
    }
}

/// Reduction of a window of values as numpy's nan-functions do it (NaN if all are NaN).
fn reduce_window<'a>(reduce: Reduce, values: impl Iterator<Item = &'a f64>) -> Acc {
    let mut acc = Acc::EMPTY;
    for v in values {
        acc.add(reduce, *v, 1.0);
    }
    acc
}

/// What a stat's `reduce()` hands to an aggregating logger (RLlib: the reduced Stats clone).
#[derive(Debug, Clone, PartialEq)]
pub enum Payload<T> {
    /// min / max / sum: the reduced value (NaN: none).
    Series(f64),
    /// mean: the mean and the number of values behind it (its weight when merged).
    Mean {
        mean: f64,
        count: f64,
    },
    Ema(f64),
    LifetimeSum(f64),
    /// percentiles: the values, ascending.
    Sorted(Vec<f64>),
    Item(Option<T>),
    Items(Vec<T>),
}

impl<T> Payload<T> {
    /// The reduced number of a number-valued reduction (an empty item series counts as
    /// NaN, as its compiled peek is); `None` for percentiles, items and item series.
    #[must_use]
    pub fn number(&self) -> Option<f64> {
        match self {
            Payload::Series(v) | Payload::Ema(v) | Payload::LifetimeSum(v) => Some(*v),
            Payload::Mean { mean, .. } => Some(*mean),
            Payload::Items(items) if items.is_empty() => Some(f64::NAN),
            Payload::Sorted(_) | Payload::Item(_) | Payload::Items(_) => None,
        }
    }

    /// The number of values behind a mean (its weight when merged); `None` for the others.
    #[must_use]
    pub fn count(&self) -> Option<f64> {
        match self {
            Payload::Mean { count, .. } => Some(*count),
            _ => None,
        }
    }

    /// What `len()` of RLlib's reduced Stats object gives: the number of values it holds
    /// (one reduced value, one EMA, one sum or one item; every percentile value and item).
    #[must_use]
    pub fn rllib_len(&self) -> usize {
        match self {
            Payload::Sorted(vs) => vs.len(),
            Payload::Items(items) => items.len(),
            _ => 1,
        }
    }
}

/// A peeked value, borrowing item values from the stat.
#[derive(Debug, PartialEq)]
pub enum Peeked<'a, T> {
    Float(f64),
    Floats(Vec<f64>),
    /// (percentile, value) pairs; `None` values when there is no data.
    Percentiles(Vec<(f64, Option<f64>)>),
    Item(Option<&'a T>),
    /// `[item]` (peek with `compile=False`).
    ItemList(Option<&'a T>),
    Items(Vec<&'a T>),
}

/// The key of a percentile in a compiled peek, as the user wrote it: 50 for 50, 99.9 for 99.9.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PercentileKey {
    Int(i64),
    Float(f64),
}

impl PercentileKey {
    /// An integral percentile is an int key, any other a float key.
    #[must_use]
    pub fn of(p: f64) -> PercentileKey {
        if p.fract() == 0.0 {
            PercentileKey::Int(p as i64)
        } else {
            PercentileKey::Float(p)
        }
    }
}

/// A value to log: a number, or an item for `reduce="item"` / `"item_series"`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<T> {
    Number(f64),
    Item(T),
}

/// Throughput of a stat tracking one (see `Stat::throughput`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Throughput {
    /// `reduce="sum"`: the sum since the last reduce per second.
    Sum(f64),
    /// `reduce="lifetime_sum"`: growth per second since the last reduce and (root only)
    /// since the last restore.
    Lifetime { since_last_reduce: f64, since_last_restore: Option<f64> },
}

impl Throughput {
    /// A lifetime sum's rates under the names `peek(throughput=True)` gives them (since the
    /// last restore only at a root); empty for a sum, whose throughput is one number.
    #[must_use]
    pub fn entries(&self) -> Vec<(&'static str, f64)> {
        match *self {
            Throughput::Sum(_) => Vec::new(),
            Throughput::Lifetime { since_last_reduce, since_last_restore } => {
                let mut out = vec![("throughput_since_last_reduce", since_last_reduce)];
                out.extend(since_last_restore.map(|r| ("throughput_since_last_restore", r)));
                out
            }
        }
    }
}

/// Seconds on a monotonic clock, from its first reading in the process: the throughput clock.
#[must_use]
pub fn now() -> f64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}

#[derive(Debug, Clone, PartialEq)]
enum Data<T> {
    /// min/max/sum/mean of a leaf without window, and of every aggregator.
    Acc(Acc),
    /// min/max/sum/mean of a leaf with a window.
    Window(Ring<f64>),
    /// `merged`: at aggregators, the incoming EMAs since the last reduce (their count, and
    /// the sum and count of the non-NaN ones).
    Ema {
        value: f64,
        merged: Option<(f64, Acc)>,
    },
    LifetimeSum(f64),
    Percentiles(SortedValues),
    Item(Option<T>),
    Items {
        items: VecDeque<T>,
        window: Option<usize>,
    },
}

/// `(percentile, value)` pairs of ascending `sorted` for the configured `percentiles`.
fn percentiles_of(percentiles: &[f64], sorted: &[f64]) -> Vec<(f64, Option<f64>)> {
    percentiles.iter().map(|p| (*p, percentile(sorted, *p))).collect()
}

/// The peek of a reduced payload of a stat tracking `percentiles` (RLlib: `peek` on the
/// Stats clone that reduce returned).
pub fn peek_payload<'a, T>(percentiles: &[f64], payload: &'a Payload<T>, compile: bool) -> Peeked<'a, T> {
    match payload {
        Payload::Series(v) | Payload::Ema(v) | Payload::LifetimeSum(v) => Peeked::number(*v, compile),
        Payload::Mean { mean, .. } => Peeked::number(*mean, compile),
        Payload::Sorted(vs) => Peeked::sorted(percentiles, vs, compile),
        Payload::Item(item) => Peeked::item(item.as_ref(), compile),
        Payload::Items(items) => Peeked::items(items.iter(), compile),
    }
}

impl<'a, T> Peeked<'a, T> {
    /// One number: itself compiled, else as a one-element list.
    fn number(v: f64, compile: bool) -> Self {
        if compile {
            Peeked::Float(v)
        } else {
            Peeked::Floats(vec![v])
        }
    }

    /// Ascending values: their `percentiles` compiled, else the values.
    fn sorted(percentiles: &[f64], sorted: &[f64], compile: bool) -> Self {
        if compile {
            Peeked::Percentiles(percentiles_of(percentiles, sorted))
        } else {
            Peeked::Floats(sorted.to_vec())
        }
    }

    /// One item: itself compiled, else as a one-element list.
    fn item(item: Option<&'a T>, compile: bool) -> Self {
        if compile {
            Peeked::Item(item)
        } else {
            Peeked::ItemList(item)
        }
    }

    /// An item series (compiled and empty: NaN, as RLlib's).
    fn items(items: impl ExactSizeIterator<Item = &'a T>, compile: bool) -> Self {
        if compile && items.len() == 0 {
            Peeked::Float(f64::NAN)
        } else {
            Peeked::Items(items.collect())
        }
    }
}

/// One statistic.
#[derive(Debug, Clone, PartialEq)]
pub struct Stat<T> {
    config: Config,
    is_root: bool,
    is_leaf: bool,
    data: Data<T>,
    /// Aggregators: what the most recent merge brought in (`peek(latest_merged_only=True)`).
    latest: Option<Payload<T>>,
    last_reduce_time: f64,
    last_restore_time: f64,
    value_at_last_reduce: f64,
    value_at_last_restore: f64,
}

impl<T: Clone> Stat<T> {
    /// A new stat; `now` (seconds, monotonic) starts its throughput clock.
    #[must_use]
    pub fn new(config: Config, is_root: bool, is_leaf: bool, now: f64) -> Stat<T> {
        let data = Self::empty_data(&config, is_leaf);
        Stat {
            config,
            is_root,
            is_leaf,
            data,
            latest: None,
            last_reduce_time: now,
            last_restore_time: now,
            value_at_last_reduce: 0.0,
            value_at_last_restore: 0.0,
        }
    }

    fn empty_data(config: &Config, is_leaf: bool) -> Data<T> {
        // Windows apply at leaves only: an aggregator keeps everything merged since its
        // last reduce (RLlib's behaviour).
        let window = if is_leaf { config.window } else { None };
        match config.reduce {
            Reduce::Mean | Reduce::Min | Reduce::Max | Reduce::Sum => match window {
                Some(w) => Data::Window(Ring::new(w)),
                None => Data::Acc(Acc::EMPTY),
            },
            Reduce::Ema => {
                Data::Ema { value: f64::NAN, merged: if is_leaf { None } else { Some((0.0, Acc::EMPTY)) } }
            }
            Reduce::LifetimeSum => Data::LifetimeSum(0.0),
            Reduce::Percentiles => Data::Percentiles(SortedValues::new(window)),
            Reduce::Item => Data::Item(None),
            Reduce::ItemSeries => Data::Items { items: VecDeque::new(), window },
        }
    }

    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    #[must_use]
    pub fn reduce_kind(&self) -> Reduce {
        self.config.reduce
    }

    #[must_use]
    pub fn is_leaf(&self) -> bool {
        self.is_leaf
    }

    #[must_use]
    pub fn is_root(&self) -> bool {
        self.is_root
    }

    /// Logs a number. NaN is skipped by EMA and lifetime sums and rejected by percentiles,
    /// as in RLlib; the other reductions keep it in their window and ignore it when reducing.
    pub fn push(&mut self, v: f64) -> Result<(), MetricsError> {
        let reduce = self.config.reduce;
        match &mut self.data {
            Data::Acc(acc) => acc.add(reduce, v, 1.0),
            Data::Window(ring) => {
                ring.push(v);
            }
            Data::Ema { value, .. } => {
                if !v.is_nan() {
                    *value = if value.is_nan() {
                        v
                    } else {
                        self.config.ema_coeff * v + (1.0 - self.config.ema_coeff) * *value
                    };
                }
            }
            Data::LifetimeSum(s) => {
                if !v.is_nan() {
                    *s += v;
                }
            }
            Data::Percentiles(s) => {
                if v.is_nan() {
                    return value_err("NaN values are not allowed in percentiles");
                }
                s.push(v);
            }
            Data::Item(_) | Data::Items { .. } => {
                return value_err(format!("reduce='{}' logs items, not numbers", self.config.reduce.name()))
            }
        }
        Ok(())
    }

    /// Logs an item (`reduce="item"` / `"item_series"`); returns the item it replaced.
    pub fn push_item(&mut self, item: T) -> Result<Option<T>, MetricsError> {
        match &mut self.data {
            Data::Item(slot) => Ok(slot.replace(item)),
            Data::Items { items, window } => {
                items.push_back(item);
                if let Some(w) = window {
                    if items.len() > *w {
                        return Ok(items.pop_front());
                    }
                }
                Ok(None)
            }
            _ => value_err(format!("reduce='{}' logs numbers, not items", self.config.reduce.name())),
        }
    }

    /// Values are logged to leaves only: an aggregator holds what `aggregate()` merged.
    pub fn check_leaf(&self) -> Result<(), MetricsError> {
        if self.is_leaf {
            Ok(())
        } else {
            value_err("the key is filled by aggregate() (log to the loggers that are aggregated instead)")
        }
    }

    /// Logs a value (`log_value`); returns the item it dropped (replaced, or out of the window).
    pub fn push_value(&mut self, v: Value<T>) -> Result<Option<T>, MetricsError> {
        self.check_leaf()?;
        match v {
            Value::Number(x) => self.push(x).map(|()| None),
            Value::Item(item) => self.push_item(item),
        }
    }

    /// Replaces what a leaf holds by one value (`set_value`); `value` is asked for it (given
    /// the reduction it must fit) only once the stat is known to take one. Returns the
    /// items it dropped.
    pub fn set_with<E: From<MetricsError>>(
        &mut self,
        value: impl FnOnce(Reduce) -> Result<Value<T>, E>,
    ) -> Result<Vec<T>, E> {
        if !self.is_leaf {
            return Err(
                MetricsError::Value("cannot set a value on a key filled by aggregate()".into()).into()
            );
        }
        let v = value(self.config.reduce)?;
        let mut dropped = match std::mem::replace(&mut self.data, Self::empty_data(&self.config, true)) {
            Data::Item(item) => item.into_iter().collect(),
            Data::Items { items, .. } => items.into(),
            _ => Vec::new(),
        };
        dropped.extend(self.push_value(v)?);
        Ok(dropped)
    }

    /// Whether numbers logged to this stat may be pushed later, in one batch per read: leaf
    /// mean/min/max/sum only read their values when the stat is read. (RLlib's EMA, lifetime
    /// sum and percentiles check each value for NaN as it is logged, so those take it at once.)
    #[must_use]
    pub fn defers_numbers(&self) -> bool {
        self.is_leaf && matches!(self.config.reduce, Reduce::Mean | Reduce::Min | Reduce::Max | Reduce::Sum)
    }

    fn series_acc(&self) -> Acc {
        match &self.data {
            Data::Acc(acc) => *acc,
            Data::Window(ring) => reduce_window(self.config.reduce, ring.iter()),
            _ => Acc::EMPTY,
        }
    }

    fn ema_value(&self) -> f64 {
        match &self.data {
            Data::Ema { value, merged: Some((n, acc)) } if *n > 0.0 => {
                let _ = value;
                acc.result(Reduce::Mean)
            }
            Data::Ema { value, .. } => *value,
            _ => f64::NAN,
        }
    }

    /// The current reduced value (RLlib's `peek`); does not change the stat except for
    /// sorting pending percentile values in.
    pub fn peek(&mut self, compile: bool, latest_merged_only: bool) -> Result<Peeked<'_, T>, MetricsError> {
        if latest_merged_only && self.config.reduce != Reduce::Item {
            if self.is_leaf {
                return value_err(
                    "latest_merged_only can only be used on aggregated stats (keys filled by \
                     aggregate()), not on values logged directly",
                );
            }
            return Ok(match &self.latest {
                Some(p) => self.peek_payload(p, compile),
                None => self.never_merged(compile),
            });
        }
        let scalar = match &self.data {
            Data::Acc(_) | Data::Window(_) => Some(self.series_acc().result(self.config.reduce)),
            Data::Ema { .. } => Some(self.ema_value()),
            _ => None,
        };
        if let Some(v) = scalar {
            return Ok(Peeked::number(v, compile));
        }
        Ok(match &mut self.data {
            Data::LifetimeSum(s) => Peeked::number(*s, compile),
            Data::Percentiles(sv) => Peeked::sorted(&self.config.percentiles, sv.sorted(), compile),
            Data::Item(item) => Peeked::item(item.as_ref(), compile),
            Data::Items { items, .. } => Peeked::items(items.iter(), compile),
            // Handled above.
            Data::Acc(_) | Data::Window(_) | Data::Ema { .. } => Peeked::number(f64::NAN, compile),
        })
    }

    /// RLlib's peek of a stat that has not been merged into yet, with latest_merged_only.
    fn never_merged(&self, compile: bool) -> Peeked<'_, T> {
        match self.config.reduce {
            Reduce::LifetimeSum if compile => Peeked::Float(0.0),
            Reduce::LifetimeSum => Peeked::Floats(vec![0.0]),
            Reduce::Ema if !compile => Peeked::Floats(vec![f64::NAN]),
            Reduce::Percentiles if compile => {
                Peeked::Percentiles(percentiles_of(&self.config.percentiles, &[]))
            }
            _ if compile => Peeked::Float(f64::NAN),
            _ => Peeked::Floats(Vec::new()),
        }
    }

    /// The peek of a reduced payload (RLlib: `peek` on the Stats clone that reduce returned).
    pub fn peek_payload<'a>(&self, payload: &'a Payload<T>, compile: bool) -> Peeked<'a, T> {
        peek_payload(&self.config.percentiles, payload, compile)
    }

    /// Reduces: returns what to send up and starts a new reduce cycle (RLlib's `reduce`).
    ///
    /// Series, percentiles and item series are emptied; an EMA keeps its value at leaves
    /// and forgets the merged EMAs at aggregators; a lifetime sum restarts from zero except
    /// at the root.
    pub fn reduce(&mut self, now: f64) -> Payload<T> {
        let reduce = self.config.reduce;
        let payload = match &mut self.data {
            Data::Acc(_) | Data::Window(_) => {
                let acc = self.series_acc();
                self.data = Self::empty_data(&self.config, self.is_leaf);
                if reduce == Reduce::Mean {
                    Payload::Mean { mean: acc.result(reduce), count: acc.count }
                } else {
                    Payload::Series(acc.result(reduce))
                }
            }
            Data::Ema { .. } => {
                let v = self.ema_value();
                if let Data::Ema { merged: Some(m), .. } = &mut self.data {
                    *m = (0.0, Acc::EMPTY);
                }
                Payload::Ema(v)
            }
            Data::LifetimeSum(s) => {
                let v = *s;
                if self.is_root {
                    self.value_at_last_reduce = v;
                } else {
                    *s = 0.0;
                    self.value_at_last_reduce = 0.0;
                }
                Payload::LifetimeSum(v)
            }
            Data::Percentiles(sv) => Payload::Sorted(sv.take_sorted()),
            Data::Item(item) => Payload::Item(item.take()),
            Data::Items { items, .. } => Payload::Items(std::mem::take(items).into()),
        };
        if self.config.with_throughput {
            self.last_reduce_time = now;
        }
        payload
    }

    /// Merges the reductions of n loggers into this aggregator (RLlib's `merge`).
    /// Checks that `merge(incoming)` would succeed, changing nothing.
    pub fn check_merge(&self, incoming: &[&Payload<T>]) -> Result<(), MetricsError> {
        if self.is_leaf {
            return value_err(
                "cannot aggregate into a key that values are logged to directly; aggregation \
                 keys must be separate from direct logging keys",
            );
        }
        Self::check_payloads(self.config.reduce, incoming)
    }

    /// Checks that `incoming` are reductions of `reduce` stats (and one item for `item`).
    pub fn check_payloads(reduce: Reduce, incoming: &[&Payload<T>]) -> Result<(), MetricsError> {
        let fits = |p: &Payload<T>| match p {
            Payload::Series(_) => matches!(reduce, Reduce::Min | Reduce::Max | Reduce::Sum),
            Payload::Mean { .. } => reduce == Reduce::Mean,
            Payload::Ema(_) => reduce == Reduce::Ema,
            Payload::LifetimeSum(_) => reduce == Reduce::LifetimeSum,
            Payload::Sorted(_) => reduce == Reduce::Percentiles,
            Payload::Item(_) => reduce == Reduce::Item,
            Payload::Items(_) => reduce == Reduce::ItemSeries,
        };
        if !incoming.iter().all(|p| fits(p)) {
            return value_err(format!(
                "cannot merge a different kind of stat into reduce='{}'",
                reduce.name()
            ));
        }
        if reduce == Reduce::Item && incoming.len() != 1 {
            return value_err(format!(
                "reduce='item' keeps one item: it can take the reduction of exactly one logger, \
                 got {}",
                incoming.len()
            ));
        }
        Ok(())
    }

    /// Merges the reductions of n loggers into this aggregator (RLlib's `merge`); on error
    /// (see `check_merge`) the stat is unchanged.
    pub fn merge(&mut self, incoming: &[&Payload<T>]) -> Result<(), MetricsError> {
        self.check_merge(incoming)?;
        let reduce = self.config.reduce;
        let mismatch = || {
            MetricsError::Value(format!(
                "cannot merge a different kind of stat into reduce='{}'",
                reduce.name()
            ))
        };
        match &mut self.data {
            Data::Acc(acc) => {
                let mut latest = Acc::EMPTY;
                for p in incoming {
                    let (v, w) = match (reduce, p) {
                        (Reduce::Mean, Payload::Mean { mean, count }) => (*mean, *count),
                        (Reduce::Min | Reduce::Max | Reduce::Sum, Payload::Series(v)) => (*v, 1.0),
                        _ => return Err(mismatch()),
                    };
                    acc.add(reduce, v, w);
                    latest.add(reduce, v, w);
                }
                self.latest = Some(if reduce == Reduce::Mean {
                    Payload::Mean { mean: latest.result(reduce), count: latest.count }
                } else {
                    Payload::Series(latest.result(reduce))
                });
            }
            Data::Ema { merged, .. } => {
                let (n, acc) = merged.get_or_insert((0.0, Acc::EMPTY));
                let mut latest = Acc::EMPTY;
                for p in incoming {
                    let Payload::Ema(v) = p else { return Err(mismatch()) };
                    acc.add(Reduce::Mean, *v, 1.0);
                    latest.add(Reduce::Mean, *v, 1.0);
                }
                *n += incoming.len() as f64;
                self.latest = Some(Payload::Ema(latest.result(Reduce::Mean)));
            }
            Data::LifetimeSum(s) => {
                let mut sum = 0.0;
                for p in incoming {
                    let Payload::LifetimeSum(v) = p else { return Err(mismatch()) };
                    sum += v;
                }
                *s += sum;
                self.latest = Some(Payload::LifetimeSum(sum));
            }
            Data::Percentiles(sv) => {
                let mut merged = SortedValues::new(None);
                for p in incoming {
                    let Payload::Sorted(vs) = p else { return Err(mismatch()) };
                    merged.extend_sorted(vs);
                }
                let run = merged.take_sorted();
                sv.extend_sorted(&run);
                self.latest = Some(Payload::Sorted(run));
            }
            Data::Item(slot) => {
                let [Payload::Item(item)] = incoming else {
                    if incoming.iter().all(|p| matches!(p, Payload::Item(_))) {
                        return value_err(format!(
                            "reduce='item' keeps one item: it can take the reduction of exactly \
                             one logger, got {}",
                            incoming.len()
                        ));
                    }
                    return Err(mismatch());
                };
                slot.clone_from(item);
            }
            Data::Items { items, .. } => {
                let mut latest = Vec::new();
                for p in incoming {
                    let Payload::Items(its) = p else { return Err(mismatch()) };
                    latest.extend(its.iter().cloned());
                }
                items.extend(latest.iter().cloned());
                self.latest = Some(Payload::Items(latest));
            }
            Data::Window(_) => return Err(mismatch()),
        }
        Ok(())
    }

    /// Sets the start of the throughput clock (aggregators: the logger's creation time).
    pub fn set_reference_time(&mut self, t: f64) {
        self.last_reduce_time = t;
        self.last_restore_time = t;
    }

    /// The throughput, or `None` when the stat does not track one.
    #[must_use]
    pub fn throughput(&mut self, now: f64) -> Option<Throughput> {
        if !self.config.with_throughput {
            return None;
        }
        if let Data::LifetimeSum(s) = self.data {
            return Some(Throughput::Lifetime {
                since_last_reduce: (s - self.value_at_last_reduce) / (now - self.last_reduce_time),
                since_last_restore: self
                    .is_root
                    .then(|| (s - self.value_at_last_restore) / (now - self.last_restore_time)),
            });
        }
        let v = self.series_acc().result(self.config.reduce);
        Some(Throughput::Sum(v / (now - self.last_reduce_time)))
    }

    /// A new, empty aggregator with this payload's configuration.
    #[must_use]
    pub fn aggregator(config: Config, is_root: bool, reference_time: f64) -> Stat<T> {
        let mut s = Stat::new(config, is_root, false, reference_time);
        s.set_reference_time(reference_time);
        s
    }

    /// The stat's content for a checkpoint.
    #[must_use]
    pub fn to_state(&self) -> StatState<T> {
        let mut st = StatState::new(self.config.clone(), self.is_root, self.is_leaf);
        match &self.data {
            Data::Acc(acc) => (st.value, st.count) = (acc.value, acc.count),
            Data::Window(ring) => st.values = ring.iter().copied().collect(),
            Data::Ema { value, merged } => {
                st.value = *value;
                st.merged = merged.map(|(n, a)| (n, a.value, a.count));
            }
            Data::LifetimeSum(s) => st.value = *s,
            Data::Percentiles(sv) => st.values = sv.clone().in_order(),
            Data::Item(item) => st.item.clone_from(item),
            Data::Items { items, .. } => st.items = items.iter().cloned().collect(),
        }
        st
    }

    /// A stat restored from a checkpoint; `now` restarts its throughput clocks.
    pub fn from_state(st: StatState<T>, now: f64) -> Result<Stat<T>, MetricsError> {
        let mut s = Stat::new(st.config, st.is_root, st.is_leaf, now);
        match &mut s.data {
            Data::Acc(acc) => *acc = Acc { value: st.value, count: st.count },
            Data::Window(ring) => {
                for v in st.values {
                    ring.push(v);
                }
            }
            Data::Ema { value, merged } => {
                *value = st.value;
                if !s.is_leaf {
                    let (n, sum, count) = st.merged.unwrap_or((0.0, 0.0, 0.0));
                    *merged = Some((n, Acc { value: sum, count }));
                }
            }
            Data::LifetimeSum(sum) => {
                *sum = st.value;
                s.value_at_last_reduce = st.value;
                s.value_at_last_restore = st.value;
            }
            Data::Percentiles(sv) => {
                for v in st.values {
                    if v.is_nan() {
                        return value_err("NaN values are not allowed in percentiles");
                    }
                    sv.push(v);
                }
            }
            Data::Item(item) => *item = st.item,
            Data::Items { items, window } => {
                items.extend(st.items);
                if let Some(w) = window {
                    while items.len() > *w {
                        items.pop_front();
                    }
                }
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
// The expected values are exact (small integers and halves).
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    fn leaf(reduce: Reduce, window: Option<usize>) -> Stat<i32> {
        Stat::new(Config { window, ..Config::new(reduce) }, false, true, 0.0)
    }

    fn peek_f(s: &mut Stat<i32>) -> f64 {
        match s.peek(true, false).unwrap() {
            Peeked::Float(v) => v,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn window_reductions_ignore_nan_and_evict() {
        for (reduce, want) in
            [(Reduce::Mean, 3.5), (Reduce::Min, 3.0), (Reduce::Max, 4.0), (Reduce::Sum, 7.0)]
        {
            let mut s = leaf(reduce, Some(3));
            for v in [100.0, 3.0, f64::NAN, 4.0] {
                s.push(v).unwrap();
            }
            assert_eq!(peek_f(&mut s), want, "{reduce:?}");
            s.reduce(0.0);
            assert!(peek_f(&mut s).is_nan());
        }
    }

    #[test]
    fn unwindowed_mean_is_the_mean_of_all_values() {
        let mut s = leaf(Reduce::Mean, None);
        for v in [1.0, 2.0, 3.0, 6.0] {
            s.push(v).unwrap();
        }
        assert_eq!(peek_f(&mut s), 3.0);
        assert_eq!(s.reduce(0.0), Payload::Mean { mean: 3.0, count: 4.0 });
    }

    #[test]
    fn ema_skips_nan_and_survives_reduce() {
        let mut s = leaf(Reduce::Ema, None);
        assert!(peek_f(&mut s).is_nan());
        s.push(f64::NAN).unwrap();
        s.push(10.0).unwrap();
        s.push(20.0).unwrap();
        assert!((peek_f(&mut s) - 10.1).abs() < 1e-12);
        assert_eq!(s.reduce(0.0), Payload::Ema(peek_f(&mut s)));
        assert!((peek_f(&mut s) - 10.1).abs() < 1e-12);
    }

    #[test]
    fn merged_means_are_weighted_by_count() {
        let mut a = leaf(Reduce::Mean, Some(10));
        for v in [1.0, 2.0, 3.0, 4.0, 5.0] {
            a.push(v).unwrap();
        }
        let mut b = leaf(Reduce::Mean, Some(10));
        b.push(15.0).unwrap();
        let (pa, pb) = (a.reduce(0.0), b.reduce(0.0));
        let mut root = Stat::<i32>::aggregator(a.config().clone(), true, 0.0);
        root.merge(&[&pa, &pb]).unwrap();
        assert_eq!(peek_f(&mut root), 5.0);
        assert_eq!(root.reduce(0.0), Payload::Mean { mean: 5.0, count: 6.0 });
    }

    #[test]
    fn lifetime_sum_resets_only_below_root() {
        let mut s = leaf(Reduce::LifetimeSum, None);
        s.push(2.0).unwrap();
        assert_eq!(s.reduce(0.0), Payload::LifetimeSum(2.0));
        assert_eq!(peek_f(&mut s), 0.0);
        let mut root = Stat::<i32>::aggregator(s.config().clone(), true, 0.0);
        root.merge(&[&Payload::LifetimeSum(2.0), &Payload::LifetimeSum(3.0)]).unwrap();
        root.reduce(0.0);
        root.merge(&[&Payload::LifetimeSum(1.0)]).unwrap();
        assert_eq!(peek_f(&mut root), 6.0);
        assert_eq!(root.peek(true, true).unwrap(), Peeked::Float(1.0), "latest merged only");
    }

    #[test]
    fn percentiles_reject_nan_and_merge_sorted() {
        let mut s = leaf(Reduce::Percentiles, Some(4));
        assert!(s.push(f64::NAN).is_err());
        for v in [5.0, 1.0, 4.0, 2.0, 3.0] {
            s.push(v).unwrap();
        }
        let Peeked::Percentiles(ps) = s.peek(true, false).unwrap() else { panic!() };
        assert_eq!(ps[0], (0.0, Some(1.0)));
        assert_eq!(ps[6], (100.0, Some(4.0)));
        let p = s.reduce(0.0);
        assert_eq!(p, Payload::Sorted(vec![1.0, 2.0, 3.0, 4.0]));
        let mut root = Stat::<i32>::aggregator(s.config().clone(), true, 0.0);
        root.merge(&[&p, &Payload::Sorted(vec![0.0, 9.0])]).unwrap();
        let Peeked::Floats(all) = root.peek(false, false).unwrap() else { panic!() };
        assert_eq!(all, vec![0.0, 1.0, 2.0, 3.0, 4.0, 9.0]);
    }

    #[test]
    fn items_and_series_of_items() {
        let mut s = leaf(Reduce::Item, None);
        assert_eq!(s.push_item(1).unwrap(), None);
        assert_eq!(s.push_item(2).unwrap(), Some(1));
        assert!(s.push(1.0).is_err());
        assert_eq!(s.reduce(0.0), Payload::Item(Some(2)));
        let mut s = leaf(Reduce::ItemSeries, Some(2));
        for i in 0..3 {
            s.push_item(i).unwrap();
        }
        assert_eq!(s.peek(true, false).unwrap(), Peeked::Items(vec![&1, &2]));
        let mut root = Stat::<i32>::aggregator(s.config().clone(), true, 0.0);
        let p = s.reduce(0.0);
        root.merge(&[&p, &p]).unwrap();
        assert_eq!(root.peek(true, false).unwrap(), Peeked::Items(vec![&1, &2, &1, &2]));
        let mut it = Stat::<i32>::aggregator(Config::new(Reduce::Item), true, 0.0);
        let one = Payload::Item(Some(1));
        assert!(it.merge(&[&one, &one]).is_err());
    }

    #[test]
    fn merge_rejects_leaves_and_other_kinds() {
        let mut s = leaf(Reduce::Sum, None);
        assert!(s.merge(&[&Payload::Series(1.0)]).is_err());
        let mut root = Stat::<i32>::aggregator(Config::new(Reduce::Sum), true, 0.0);
        let before = root.clone();
        assert!(root.merge(&[&Payload::Series(1.0), &Payload::Ema(1.0)]).is_err());
        assert_eq!(root, before, "a failed merge changes nothing");
        for (reduce, ok) in [
            (Reduce::Mean, Payload::Mean { mean: 1.0, count: 2.0 }),
            (Reduce::Ema, Payload::Ema(1.0)),
            (Reduce::LifetimeSum, Payload::LifetimeSum(1.0)),
            (Reduce::Percentiles, Payload::Sorted(vec![1.0])),
            (Reduce::ItemSeries, Payload::Items(vec![1])),
        ] {
            assert!(Stat::<i32>::check_payloads(reduce, &[&ok, &ok]).is_ok());
            assert!(Stat::<i32>::check_payloads(reduce, &[&Payload::Series(1.0)]).is_err());
        }
    }

    #[test]
    fn ema_aggregator_averages_incoming_and_forgets_them_on_reduce() {
        let mut root = Stat::<i32>::aggregator(Config::new(Reduce::Ema), true, 0.0);
        assert!(peek_f(&mut root).is_nan());
        root.merge(&[&Payload::Ema(1.0), &Payload::Ema(f64::NAN), &Payload::Ema(3.0)]).unwrap();
        assert_eq!(peek_f(&mut root), 2.0);
        assert_eq!(root.reduce(0.0), Payload::Ema(2.0));
        assert!(peek_f(&mut root).is_nan());
        root.merge(&[&Payload::Ema(f64::NAN)]).unwrap();
        assert!(peek_f(&mut root).is_nan());
    }

    #[test]
    fn latest_merged_only_before_any_merge() {
        let mut root = Stat::<i32>::aggregator(Config::new(Reduce::Max), true, 0.0);
        assert_eq!(root.peek(false, true).unwrap(), Peeked::Floats(vec![]));
        let mut p = Stat::<i32>::aggregator(Config::new(Reduce::Percentiles), true, 0.0);
        let Peeked::Percentiles(ps) = p.peek(true, true).unwrap() else { panic!() };
        assert!(ps.iter().all(|(_, v)| v.is_none()));
        let mut l = leaf(Reduce::Max, None);
        assert!(l.peek(true, true).is_err());
    }

    #[test]
    fn percentile_keys_keep_the_written_kind() {
        assert_eq!(PercentileKey::of(50.0), PercentileKey::Int(50));
        assert_eq!(PercentileKey::of(0.0), PercentileKey::Int(0));
        assert_eq!(PercentileKey::of(99.9), PercentileKey::Float(99.9));
    }

    #[test]
    fn throughput_entries_name_the_rates() {
        assert_eq!(Throughput::Sum(2.0).entries(), vec![]);
        let root = Throughput::Lifetime { since_last_reduce: 1.0, since_last_restore: Some(2.0) };
        assert_eq!(
            root.entries(),
            vec![("throughput_since_last_reduce", 1.0), ("throughput_since_last_restore", 2.0)]
        );
        let leaf = Throughput::Lifetime { since_last_reduce: 3.0, since_last_restore: None };
        assert_eq!(leaf.entries(), vec![("throughput_since_last_reduce", 3.0)]);
    }

    #[test]
    fn clock_is_monotonic() {
        let a = now();
        let b = now();
        assert!(a >= 0.0 && b >= a);
    }

    #[test]
    fn throughput_of_sums() {
        let cfg = Config { with_throughput: true, ..Config::new(Reduce::Sum) };
        let mut s = Stat::<i32>::new(cfg, false, true, 10.0);
        s.push(30.0).unwrap();
        assert_eq!(s.throughput(13.0), Some(Throughput::Sum(10.0)));
        s.reduce(13.0);
        s.push(5.0).unwrap();
        assert_eq!(s.throughput(18.0), Some(Throughput::Sum(1.0)));
        let cfg = Config { with_throughput: true, ..Config::new(Reduce::LifetimeSum) };
        let mut root = Stat::<i32>::aggregator(cfg, true, 0.0);
        root.merge(&[&Payload::LifetimeSum(10.0)]).unwrap();
        assert_eq!(
            root.throughput(2.0),
            Some(Throughput::Lifetime { since_last_reduce: 5.0, since_last_restore: Some(5.0) })
        );
        assert_eq!(leaf(Reduce::Mean, None).throughput(1.0), None);
    }

    #[test]
    fn payload_numbers_and_lengths() {
        assert_eq!(Payload::<i32>::Mean { mean: 2.0, count: 3.0 }.number(), Some(2.0));
        assert_eq!(Payload::<i32>::LifetimeSum(4.0).number(), Some(4.0));
        assert!(Payload::<i32>::Items(vec![]).number().is_some_and(f64::is_nan));
        assert_eq!(Payload::Items(vec![1, 2]).number(), None);
        assert_eq!(Payload::<i32>::Sorted(vec![1.0]).number(), None);
        assert_eq!(Payload::Item(Some(1)).number(), None);
        assert_eq!(Payload::<i32>::Sorted(vec![1.0, 2.0, 3.0]).rllib_len(), 3);
        assert_eq!(Payload::Items(vec![1, 2]).rllib_len(), 2);
        assert_eq!(Payload::<i32>::Series(f64::NAN).rllib_len(), 1);
    }

    #[test]
    fn state_round_trip() {
        let mut s = leaf(Reduce::Mean, Some(3));
        for v in [1.0, 2.0, 3.0, 4.0] {
            s.push(v).unwrap();
        }
        let mut r = Stat::from_state(s.to_state(), 0.0).unwrap();
        assert_eq!(peek_f(&mut r), 3.0);
        r.push(8.0).unwrap();
        assert_eq!(peek_f(&mut r), 5.0);
    }

    #[test]
    fn values_go_to_leaves_only() {
        let mut agg = Stat::<i32>::aggregator(Config::new(Reduce::Sum), true, 0.0);
        let e = agg.push_value(Value::Number(1.0)).unwrap_err();
        assert!(e.to_string().starts_with("the key is filled by aggregate()"));
        let asked = agg.set_with(|_| -> Result<Value<i32>, MetricsError> { panic!("asked for a value") });
        assert_eq!(
            asked,
            Err(MetricsError::Value("cannot set a value on a key filled by aggregate()".into()))
        );
        assert!(!agg.defers_numbers());
        let mut s = leaf(Reduce::Max, Some(3));
        assert!(s.defers_numbers() && s.check_leaf().is_ok());
        assert_eq!(s.push_value(Value::Number(4.0)), Ok(None));
        assert!(s.push_value(Value::Item(1)).is_err());
        assert!(
            !leaf(Reduce::Ema, None).defers_numbers() && !leaf(Reduce::Percentiles, None).defers_numbers()
        );
    }

    #[test]
    fn set_with_replaces_what_a_leaf_holds() {
        let mut s = leaf(Reduce::Mean, Some(5));
        for v in [1.0, 2.0, 3.0] {
            s.push(v).unwrap();
        }
        let seen =
            s.set_with(|r| Ok::<_, MetricsError>((r == Reduce::Mean).then_some(Value::Number(7.0)).unwrap()));
        assert_eq!(seen, Ok(vec![]));
        assert_eq!(peek_f(&mut s), 7.0);
        let mut items = leaf(Reduce::ItemSeries, None);
        for i in 0..3 {
            items.push_item(i).unwrap();
        }
        assert_eq!(items.set_with(|_| Ok::<_, MetricsError>(Value::Item(9))), Ok(vec![0, 1, 2]));
        assert_eq!(items.peek(true, false).unwrap(), Peeked::Items(vec![&9]));
        let mut one = leaf(Reduce::Item, None);
        one.push_item(1).unwrap();
        assert_eq!(one.set_with(|_| Ok::<_, MetricsError>(Value::Item(2))), Ok(vec![1]));
        let mut p = leaf(Reduce::Percentiles, None);
        assert!(p.set_with(|_| Ok::<_, MetricsError>(Value::Number(f64::NAN))).is_err());
    }
}
