//! The checkpoint state of stats and snapshots, and its layout: the named fields a state
//! is written as and read from (the binding converts each value, a dict holds them).

use super::config::{Config, Reduce};
use super::MetricsError;

/// A stat's content, for checkpoints (`get_state` / `set_state`).
#[derive(Debug, Clone, PartialEq)]
pub struct StatState<T> {
    pub config: Config,
    pub is_root: bool,
    pub is_leaf: bool,
    /// Windowed values (oldest first), or percentile values.
    pub values: Vec<f64>,
    /// Running value: min/max/sum/mean accumulator, EMA, lifetime sum.
    pub value: f64,
    /// Weight behind `value` (min/max/sum/mean accumulators).
    pub count: f64,
    /// Aggregating EMA: (incoming count, non-NaN sum, non-NaN count).
    pub merged: Option<(f64, f64, f64)>,
    pub item: Option<T>,
    pub items: Vec<T>,
}

impl<T> StatState<T> {
    /// The state of an empty stat: no values, a NaN running value, no items.
    #[must_use]
    pub fn new(config: Config, is_root: bool, is_leaf: bool) -> StatState<T> {
        StatState {
            config,
            is_root,
            is_leaf,
            values: Vec::new(),
            value: f64::NAN,
            count: 0.0,
            merged: None,
            item: None,
            items: Vec::new(),
        }
    }
}

/// A field of a stat's or a snapshot's state besides its configuration (and its name there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateField {
    Values,
    Value,
    Count,
    Merged,
    Item,
    Items,
}

impl StateField {
    /// Every field, in the state's order: a stat's state carries them all.
    pub const ALL: [StateField; 6] = [
        StateField::Values,
        StateField::Value,
        StateField::Count,
        StateField::Merged,
        StateField::Item,
        StateField::Items,
    ];

    /// The field's key in the state.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            StateField::Values => "values",
            StateField::Value => "value",
            StateField::Count => "count",
            StateField::Merged => "merged",
            StateField::Item => "item",
            StateField::Items => "items",
        }
    }

    /// The fields the state of a snapshot of `reduce` carries (its payload, no more).
    #[must_use]
    pub fn of_snapshot(reduce: Reduce) -> &'static [StateField] {
        match reduce {
            Reduce::Min | Reduce::Max | Reduce::Sum | Reduce::Ema | Reduce::LifetimeSum => {
                &[StateField::Value]
            }
            Reduce::Mean => &[StateField::Value, StateField::Count],
            Reduce::Percentiles => &[StateField::Values],
            Reduce::Item => &[StateField::Item],
            Reduce::ItemSeries => &[StateField::Items],
        }
    }

    /// The fields the state of a stat carries: all of them, whatever its reduction.
    #[must_use]
    pub fn of_stat(_: Reduce) -> &'static [StateField] {
        &StateField::ALL
    }
}

/// One named value of a state, borrowed from it (see [`StatState::to_fields`]).
#[derive(Debug, PartialEq)]
pub enum FieldValue<'a, T> {
    Str(&'static str),
    /// `None`: no window.
    Window(Option<usize>),
    Float(f64),
    Floats(&'a [f64]),
    Flag(bool),
    /// An aggregating EMA's (incoming count, non-NaN sum, non-NaN count).
    Merged(Option<(f64, f64, f64)>),
    Item(Option<&'a T>),
    Items(&'a [T]),
}

/// Where a state is read from, one named field at a time (the binding: a dict).
pub trait FieldSource<T> {
    /// A missing or mistyped field; the core's own errors convert into it.
    type Error: From<MetricsError>;
    fn str(&self, name: &'static str) -> Result<String, Self::Error>;
    fn window(&self, name: &'static str) -> Result<Option<usize>, Self::Error>;
    fn float(&self, name: &'static str) -> Result<f64, Self::Error>;
    fn floats(&self, name: &'static str) -> Result<Vec<f64>, Self::Error>;
    fn flag(&self, name: &'static str) -> Result<bool, Self::Error>;
    fn merged(&self, name: &'static str) -> Result<Option<(f64, f64, f64)>, Self::Error>;
    fn item(&self, name: &'static str) -> Result<Option<T>, Self::Error>;
    fn items(&self, name: &'static str) -> Result<Vec<T>, Self::Error>;
}

impl<T> StatState<T> {
    /// The state as named values: the configuration (`reduce`, `window`, `ema_coeff`,
    /// `percentiles`, `with_throughput`), `is_root`, `is_leaf`, then `fields` in order.
    #[must_use]
    pub fn to_fields(&self, fields: &[StateField]) -> Vec<(&'static str, FieldValue<'_, T>)> {
        let c = &self.config;
        let mut out = vec![
            ("reduce", FieldValue::Str(c.reduce.name())),
            ("window", FieldValue::Window(c.window)),
            ("ema_coeff", FieldValue::Float(c.ema_coeff)),
            ("percentiles", FieldValue::Floats(&c.percentiles)),
            ("with_throughput", FieldValue::Flag(c.with_throughput)),
            ("is_root", FieldValue::Flag(self.is_root)),
            ("is_leaf", FieldValue::Flag(self.is_leaf)),
        ];
        out.extend(fields.iter().map(|&f| {
            let v = match f {
                StateField::Values => FieldValue::Floats(&self.values),
                StateField::Value => FieldValue::Float(self.value),
                StateField::Count => FieldValue::Float(self.count),
                StateField::Merged => FieldValue::Merged(self.merged),
                StateField::Item => FieldValue::Item(self.item.as_ref()),
                StateField::Items => FieldValue::Items(&self.items),
            };
            (f.name(), v)
        }));
        out
    }

    /// A state read from `src` in [`StatState::to_fields`]' order, with the payload fields
    /// that `fields` gives for its reduction; the configuration is checked
    /// ([`Config::from_state`]).
    pub fn from_fields<S: FieldSource<T>>(
        src: &S,
        fields: fn(Reduce) -> &'static [StateField],
    ) -> Result<StatState<T>, S::Error> {
        let config = Config::from_state(
            &src.str("reduce")?,
            src.window("window")?,
            src.float("ema_coeff")?,
            src.floats("percentiles")?,
            src.flag("with_throughput")?,
        )?;
        let fields = fields(config.reduce);
        let mut st = StatState::new(config, src.flag("is_root")?, src.flag("is_leaf")?);
        for &f in fields {
            let name = f.name();
            match f {
                StateField::Values => st.values = src.floats(name)?,
                StateField::Value => st.value = src.float(name)?,
                StateField::Count => st.count = src.float(name)?,
                StateField::Merged => st.merged = src.merged(name)?,
                StateField::Item => st.item = src.item(name)?,
                StateField::Items => st.items = src.items(name)?,
            }
        }
        Ok(st)
    }
}

#[cfg(test)]
// The expected values are exact.
#[allow(clippy::float_cmp)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use super::*;

    /// A state written out as owned values (what a dict holds), with the names read back.
    #[derive(Debug, Clone, PartialEq)]
    enum Owned {
        Str(String),
        Window(Option<usize>),
        Float(f64),
        Floats(Vec<f64>),
        Flag(bool),
        Merged(Option<(f64, f64, f64)>),
        Item(Option<i32>),
        Items(Vec<i32>),
    }

    struct Map {
        values: HashMap<&'static str, Owned>,
        read: RefCell<Vec<&'static str>>,
    }

    impl Map {
        fn of(st: &StatState<i32>, fields: &[StateField]) -> Map {
            let values = st
                .to_fields(fields)
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        FieldValue::Str(s) => Owned::Str(s.to_string()),
                        FieldValue::Window(w) => Owned::Window(w),
                        FieldValue::Float(f) => Owned::Float(f),
                        FieldValue::Floats(fs) => Owned::Floats(fs.to_vec()),
                        FieldValue::Flag(b) => Owned::Flag(b),
                        FieldValue::Merged(m) => Owned::Merged(m),
                        FieldValue::Item(i) => Owned::Item(i.copied()),
                        FieldValue::Items(is) => Owned::Items(is.to_vec()),
                    };
                    (k, v)
                })
                .collect();
            Map { values, read: RefCell::new(Vec::new()) }
        }

        fn get(&self, name: &'static str) -> Result<Owned, MetricsError> {
            self.read.borrow_mut().push(name);
            self.values
                .get(name)
                .cloned()
                .ok_or_else(|| MetricsError::Key(format!("state is missing {name:?}")))
        }
    }

    fn wrong(name: &str) -> MetricsError {
        MetricsError::Type(format!("{name} has the wrong type"))
    }

    macro_rules! read_as {
        ($fn:ident, $variant:ident, $t:ty) => {
            fn $fn(&self, name: &'static str) -> Result<$t, MetricsError> {
                match self.get(name)? {
                    Owned::$variant(v) => Ok(v),
                    _ => Err(wrong(name)),
                }
            }
        };
    }

    impl FieldSource<i32> for Map {
        type Error = MetricsError;
        read_as!(str, Str, String);
        read_as!(window, Window, Option<usize>);
        read_as!(float, Float, f64);
        read_as!(floats, Floats, Vec<f64>);
        read_as!(flag, Flag, bool);
        read_as!(merged, Merged, Option<(f64, f64, f64)>);
        read_as!(item, Item, Option<i32>);
        read_as!(items, Items, Vec<i32>);
    }

    fn names(fields: &[(&'static str, FieldValue<'_, i32>)]) -> Vec<&'static str> {
        fields.iter().map(|(k, _)| *k).collect()
    }

    #[test]
    fn snapshot_fields_follow_the_reduction() {
        assert_eq!(StateField::of_snapshot(Reduce::Mean), &[StateField::Value, StateField::Count]);
        assert_eq!(StateField::of_snapshot(Reduce::LifetimeSum), &[StateField::Value]);
        assert_eq!(StateField::of_snapshot(Reduce::Percentiles), &[StateField::Values]);
        assert_eq!(StateField::of_snapshot(Reduce::ItemSeries), &[StateField::Items]);
        let names: Vec<&str> = StateField::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["values", "value", "count", "merged", "item", "items"]);
    }

    #[test]
    fn layout_is_config_flags_then_fields() {
        let mut st = StatState::<i32>::new(Config::new(Reduce::Ema), true, false);
        st.value = 2.5;
        st.merged = Some((3.0, 2.0, 1.0));
        let all = st.to_fields(&StateField::ALL);
        let head = ["reduce", "window", "ema_coeff", "percentiles", "with_throughput", "is_root", "is_leaf"];
        assert_eq!(names(&all)[..7], head);
        assert_eq!(names(&all)[7..], ["values", "value", "count", "merged", "item", "items"]);
        assert_eq!(all[0].1, FieldValue::Str("ema"));
        assert_eq!(all[2].1, FieldValue::Float(0.01));
        assert_eq!(all[5].1, FieldValue::Flag(true));
        assert_eq!(all[10].1, FieldValue::Merged(Some((3.0, 2.0, 1.0))));
        let mean = StatState::<i32>::new(Config::new(Reduce::Mean), false, true);
        let fields = mean.to_fields(StateField::of_snapshot(Reduce::Mean));
        assert_eq!(names(&fields)[7..], ["value", "count"]);
    }

    #[test]
    fn fields_round_trip_in_order() {
        let mut cfg = Config::new(Reduce::ItemSeries);
        cfg.window = Some(3);
        let mut st = StatState::<i32>::new(cfg, false, true);
        (st.items, st.item, st.value) = (vec![4, 5], Some(1), 2.0);
        let map = Map::of(&st, &StateField::ALL);
        assert_eq!(StatState::from_fields(&map, StateField::of_stat), Ok(st.clone()));
        let read = map.read.borrow().clone();
        assert_eq!(read, names(&st.to_fields(&StateField::ALL)), "read in the written order");
        // A snapshot's state reads only its reduction's fields.
        let map = Map::of(&st, StateField::of_snapshot(Reduce::ItemSeries));
        let back = StatState::from_fields(&map, StateField::of_snapshot).unwrap();
        assert_eq!((back.items, back.item), (vec![4, 5], None));
    }

    #[test]
    fn bad_fields_are_errors() {
        let st = StatState::<i32>::new(Config::new(Reduce::Sum), false, true);
        let mut map = Map::of(&st, &StateField::ALL);
        map.values.remove("count");
        let e = StatState::from_fields(&map, StateField::of_stat).unwrap_err();
        assert_eq!(e, MetricsError::Key("state is missing \"count\"".into()));
        map.values.insert("reduce", Owned::Str("median".into()));
        let e = StatState::from_fields(&map, StateField::of_stat).unwrap_err();
        assert_eq!(e, MetricsError::Value("unknown reduce 'median' in state".into()));
        assert_eq!(*map.read.borrow().last().unwrap(), "with_throughput", "checked before the flags");
    }
}
