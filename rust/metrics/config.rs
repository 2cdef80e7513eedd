//! Resolution of `log_value`'s options into one reduction, as RLlib 2.60 resolves them.

use super::{value_err, MetricsError};

/// The percentiles tracked when `reduce="percentiles"` names none (RLlib's default).
pub const DEFAULT_PERCENTILES: [f64; 7] = [0.0, 50.0, 75.0, 90.0, 95.0, 99.0, 100.0];

/// The EMA coefficient used when `reduce="ema"` names none (RLlib's default).
pub const DEFAULT_EMA_COEFF: f64 = 0.01;

/// A reduction method: RLlib 2.60's `DEFAULT_STATS_CLS_LOOKUP` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduce {
    Mean,
    Ema,
    Min,
    Max,
    Sum,
    LifetimeSum,
    Percentiles,
    Item,
    ItemSeries,
}

impl Reduce {
    pub const ALL: [Reduce; 9] = [
        Reduce::Mean,
        Reduce::Ema,
        Reduce::Min,
        Reduce::Max,
        Reduce::Sum,
        Reduce::LifetimeSum,
        Reduce::Percentiles,
        Reduce::Item,
        Reduce::ItemSeries,
    ];

    /// The name RLlib uses for this reduction.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Reduce::Mean => "mean",
            Reduce::Ema => "ema",
            Reduce::Min => "min",
            Reduce::Max => "max",
            Reduce::Sum => "sum",
            Reduce::LifetimeSum => "lifetime_sum",
            Reduce::Percentiles => "percentiles",
            Reduce::Item => "item",
            Reduce::ItemSeries => "item_series",
        }
    }

    /// The reduction named `name`, if there is one.
    #[must_use]
    pub fn parse(name: &str) -> Option<Reduce> {
        Reduce::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Whether values of this reduction are numbers (all but `item` / `item_series`).
    #[must_use]
    pub fn is_numeric(self) -> bool {
        !matches!(self, Reduce::Item | Reduce::ItemSeries)
    }

    fn takes_window(self) -> bool {
        matches!(
            self,
            Reduce::Mean | Reduce::Min | Reduce::Max | Reduce::Sum | Reduce::Percentiles | Reduce::ItemSeries
        )
    }
}

/// The `window` argument as given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WindowArg {
    Int(i64),
    Float(f64),
    /// `True` / `False`: an int to Python, but no window (a type error).
    Bool(bool),
}

/// The `percentiles` argument as given.
#[derive(Debug, Clone, PartialEq)]
pub enum PercentilesArg {
    /// `True`: the default percentiles; `False`: as if not given.
    Bool(bool),
    List(Vec<f64>),
}

/// `log_value`'s options before resolution (`None`: not given).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    pub reduce: Option<String>,
    pub window: Option<WindowArg>,
    pub ema_coeff: Option<f64>,
    pub percentiles: Option<PercentilesArg>,
    pub with_throughput: Option<bool>,
    pub clear_on_reduce: Option<bool>,
}

/// A resolved, valid stat configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub reduce: Reduce,
    /// Most recent values a leaf stat keeps (`None`: all since the last reduce).
    pub window: Option<usize>,
    pub ema_coeff: f64,
    /// Percentiles in [0, 100] (only for `Reduce::Percentiles`).
    pub percentiles: Vec<f64>,
    pub with_throughput: bool,
}

impl Config {
    /// A configuration with defaults for `reduce` (no window, no throughput).
    #[must_use]
    pub fn new(reduce: Reduce) -> Config {
        Config {
            reduce,
            window: None,
            ema_coeff: DEFAULT_EMA_COEFF,
            percentiles: if reduce == Reduce::Percentiles {
                DEFAULT_PERCENTILES.to_vec()
            } else {
                Vec::new()
            },
            with_throughput: false,
        }
    }

    /// Resolves `log_value`'s options the way RLlib 2.60 does.
    ///
    /// No `reduce` means `"mean"` when a window is given and `"ema"` otherwise;
    /// `reduce="sum"` with `clear_on_reduce=False` is a lifetime sum. Options that do not
    /// belong to the reduction are errors (RLlib raises for them too, some as a
    /// `TypeError` deep inside a Stats constructor; here each gets a message that names it).
    /// A bool window is a type error, checked first; `percentiles=False` is no percentiles.
    pub fn resolve(opts: &Options) -> Result<Config, MetricsError> {
        let bool_window = || MetricsError::Type("window must be an int".into());
        if let Some(WindowArg::Bool(_)) = opts.window {
            return Err(bool_window());
        }
        let mut reduce = match opts.reduce.as_deref() {
            None if opts.window.is_some() => Reduce::Mean,
            None => Reduce::Ema,
            Some(name) => Reduce::parse(name).ok_or_else(|| {
                let names: Vec<&str> = Reduce::ALL.iter().map(|r| r.name()).collect();
                MetricsError::Value(format!(
                    "invalid reduce method '{name}': expected one of {}",
                    names.join(", ")
                ))
            })?,
        };
        if reduce == Reduce::Sum && opts.clear_on_reduce == Some(false) {
            reduce = Reduce::LifetimeSum;
        }
        let mut cfg = Config::new(reduce);
        let r = reduce.name();

        if let Some(w) = opts.window {
            if !reduce.takes_window() {
                return value_err(match reduce {
                    Reduce::Ema => "window is not supported for reduce='ema'; use reduce='mean' \
                                    with a window instead"
                        .to_string(),
                    _ => format!("window is not supported for reduce='{r}'"),
                });
            }
            cfg.window = match w {
                WindowArg::Int(n) if n >= 1 => Some(n as usize),
                WindowArg::Float(f) if f == f64::INFINITY => None,
                WindowArg::Int(n) => return value_err(format!("window must be a positive int, got {n}")),
                WindowArg::Float(f) => {
                    return value_err(format!("window must be a positive int (or float('inf')), got {f}"))
                }
                WindowArg::Bool(_) => return Err(bool_window()),
            };
        }
        if let Some(c) = opts.ema_coeff {
            match reduce {
                Reduce::Ema => {
                    if !(c > 0.0 && c <= 1.0) {
                        return value_err(format!("ema_coeff must be in (0, 1], got {c}"));
                    }
                    cfg.ema_coeff = c;
                }
                Reduce::Mean => {
                    return value_err(
                        "ema_coeff is not supported for reduce='mean'; use reduce='ema' instead",
                    )
                }
                _ => return value_err(format!("ema_coeff is not supported for reduce='{r}'")),
            }
        }
        if let Some(p) = opts.percentiles.as_ref().filter(|p| **p != PercentilesArg::Bool(false)) {
            if reduce != Reduce::Percentiles {
                return value_err(format!(
                    "percentiles is only supported for reduce='percentiles', not reduce='{r}'"
                ));
            }
            if let PercentilesArg::List(ps) = p {
                if let Some(p) = ps.iter().find(|p| !(0.0..=100.0).contains(*p)) {
                    return value_err(format!("percentiles must be in [0, 100], got {p}"));
                }
                cfg.percentiles.clone_from(ps);
            }
        }
        if opts.with_throughput == Some(true) {
            if !matches!(reduce, Reduce::Sum | Reduce::LifetimeSum) {
                return value_err(format!(
                    "with_throughput=True is only supported for reduce='sum' or \
                     reduce='lifetime_sum', not reduce='{r}'"
                ));
            }
            cfg.with_throughput = true;
        }
        Ok(cfg)
    }

    /// The configuration of a checkpointed stat or snapshot, checked: a state may come from
    /// anywhere, and an unknown reduction or an empty window would make a broken stat.
    pub fn from_state(
        reduce: &str,
        window: Option<usize>,
        ema_coeff: f64,
        percentiles: Vec<f64>,
        with_throughput: bool,
    ) -> Result<Config, MetricsError> {
        let Some(reduce) = Reduce::parse(reduce) else {
            return value_err(format!("unknown reduce '{reduce}' in state"));
        };
        if window == Some(0) {
            return value_err("window must be a positive int");
        }
        Ok(Config { reduce, window, ema_coeff, percentiles, with_throughput })
    }
}

/// Which of `log_value`'s deprecated options (RLlib 2.60's old names) were given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeprecatedOptions {
    pub clear_on_reduce: bool,
    pub throughput_ema_coeff: bool,
    pub reduce_per_index_on_aggregate: bool,
}

impl DeprecatedOptions {
    /// The deprecation warnings these options get, in order, or the error for one that no
    /// longer works (`throughput_ema_coeff`: throughputs are measured once per reduce).
    pub fn warnings(self) -> Result<Vec<&'static str>, MetricsError> {
        if self.throughput_ema_coeff {
            return value_err(
                "throughput_ema_coeff is no longer supported: throughputs are measured once per \
                 reduce() (as in RLlib 2.60)",
            );
        }
        let mut out = Vec::new();
        if self.clear_on_reduce {
            out.push(
                "clear_on_reduce is deprecated (RLlib 2.60): every reduction but lifetime_sum and \
                 ema starts over after reduce(); use reduce='lifetime_sum' for sums that must not",
            );
        }
        if self.reduce_per_index_on_aggregate {
            out.push("reduce_per_index_on_aggregate is deprecated (RLlib 2.60) and has no effect");
        }
        Ok(out)
    }
}

#[cfg(test)]
// The expected values are exact.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    fn opts(reduce: Option<&str>) -> Options {
        Options { reduce: reduce.map(str::to_string), ..Options::default() }
    }

    #[test]
    fn default_reduce_is_ema_or_windowed_mean() {
        let c = Config::resolve(&opts(None)).unwrap();
        assert_eq!((c.reduce, c.ema_coeff), (Reduce::Ema, 0.01));
        let o = Options { window: Some(WindowArg::Int(5)), ..opts(None) };
        let c = Config::resolve(&o).unwrap();
        assert_eq!((c.reduce, c.window), (Reduce::Mean, Some(5)));
    }

    #[test]
    fn sum_not_cleared_is_lifetime_sum() {
        let o = Options { clear_on_reduce: Some(false), ..opts(Some("sum")) };
        assert_eq!(Config::resolve(&o).unwrap().reduce, Reduce::LifetimeSum);
        let o = Options { clear_on_reduce: Some(true), ..opts(Some("sum")) };
        assert_eq!(Config::resolve(&o).unwrap().reduce, Reduce::Sum);
    }

    #[test]
    fn invalid_combinations_are_errors() {
        let bad = [
            Options { window: Some(WindowArg::Int(3)), ..opts(Some("ema")) },
            Options { window: Some(WindowArg::Int(0)), ..opts(Some("mean")) },
            Options { window: Some(WindowArg::Float(2.5)), ..opts(Some("mean")) },
            Options { window: Some(WindowArg::Int(3)), ..opts(Some("lifetime_sum")) },
            Options { ema_coeff: Some(0.1), ..opts(Some("mean")) },
            Options { ema_coeff: Some(1.5), ..opts(Some("ema")) },
            Options { ema_coeff: Some(0.1), ..opts(Some("max")) },
            Options { percentiles: Some(PercentilesArg::Bool(true)), ..opts(Some("mean")) },
            Options { percentiles: Some(PercentilesArg::List(vec![101.0])), ..opts(Some("percentiles")) },
            Options { with_throughput: Some(true), ..opts(Some("mean")) },
            opts(Some("median")),
        ];
        for o in bad {
            assert!(matches!(Config::resolve(&o), Err(MetricsError::Value(_))), "{o:?}");
        }
    }

    #[test]
    fn percentiles_default_and_list() {
        let o = Options { percentiles: Some(PercentilesArg::Bool(true)), ..opts(Some("percentiles")) };
        assert_eq!(Config::resolve(&o).unwrap().percentiles, DEFAULT_PERCENTILES.to_vec());
        let o = Options {
            percentiles: Some(PercentilesArg::List(vec![10.0, 99.9])),
            ..opts(Some("percentiles"))
        };
        assert_eq!(Config::resolve(&o).unwrap().percentiles, vec![10.0, 99.9]);
        let o = Options { window: Some(WindowArg::Float(f64::INFINITY)), ..opts(Some("max")) };
        assert_eq!(Config::resolve(&o).unwrap().window, None);
    }

    #[test]
    fn bool_arguments() {
        // A bool window is a type error, even before the reduction's name is checked.
        for reduce in [Some("mean"), Some("median"), None] {
            let o = Options { window: Some(WindowArg::Bool(true)), ..opts(reduce) };
            assert_eq!(Config::resolve(&o), Err(MetricsError::Type("window must be an int".into())));
        }
        // percentiles=False is no percentiles: no error for other reductions, defaults kept.
        let o = Options { percentiles: Some(PercentilesArg::Bool(false)), ..opts(Some("mean")) };
        assert_eq!(Config::resolve(&o).unwrap().reduce, Reduce::Mean);
        let o = Options { percentiles: Some(PercentilesArg::Bool(false)), ..opts(Some("percentiles")) };
        assert_eq!(Config::resolve(&o).unwrap().percentiles, DEFAULT_PERCENTILES.to_vec());
        let o = Options { percentiles: Some(PercentilesArg::Bool(true)), ..opts(Some("mean")) };
        assert!(matches!(Config::resolve(&o), Err(MetricsError::Value(_))));
    }

    #[test]
    fn deprecated_options_warn_or_fail() {
        assert_eq!(DeprecatedOptions::default().warnings().unwrap(), Vec::<&str>::new());
        let both = DeprecatedOptions {
            clear_on_reduce: true,
            reduce_per_index_on_aggregate: true,
            ..DeprecatedOptions::default()
        };
        let w = both.warnings().unwrap();
        assert_eq!(w.len(), 2);
        assert!(w[0].starts_with("clear_on_reduce is deprecated") && w[1].contains("no effect"));
        let gone = DeprecatedOptions { throughput_ema_coeff: true, ..both };
        assert!(matches!(gone.warnings(), Err(MetricsError::Value(m)) if m.contains("no longer supported")));
    }

    #[test]
    fn state_config_is_checked() {
        let c = Config::from_state("percentiles", Some(3), 0.5, vec![50.0], false).unwrap();
        assert_eq!((c.reduce, c.window, c.percentiles), (Reduce::Percentiles, Some(3), vec![50.0]));
        let e = Config::from_state("median", None, 0.01, vec![], false).unwrap_err();
        assert_eq!(e, MetricsError::Value("unknown reduce 'median' in state".into()));
        let e = Config::from_state("mean", Some(0), 0.01, vec![], false).unwrap_err();
        assert_eq!(e, MetricsError::Value("window must be a positive int".into()));
    }
}
