//! Metric statistics with RLlib 2.60's reductions, and the keyed store that holds them.
//!
//! - [`config`]: how `log_value`'s options resolve to one reduction (and which are errors);
//! - [`window`]: the ring buffer behind windowed stats and the sorted window behind
//!   percentiles;
//! - [`stat`]: one statistic: push, peek, reduce (what a logger sends up), merge (what an
//!   aggregating logger does with the reductions of n loggers), throughput and state;
//! - [`snapshot`]: what a stat's `reduce()` returns, as a number and as checkpoint state;
//! - [`state`]: the checkpoint state of stats and snapshots, as named fields;
//! - [`store`]: nested keys (tuples of strings/ints) mapped to stats; aggregation, throughputs
//!   and checkpoints over keys;
//! - [`deferred`]: logged values converted to numbers in a batch at the next read.
//!
//! Item values (`reduce="item"` / `"item_series"`) are a type parameter, so the core stays
//! free of Python: the binding instantiates it with Python objects, tests with integers.

pub mod config;
pub mod deferred;
pub mod snapshot;
pub mod stat;
pub mod state;
pub mod store;
pub mod window;

pub use config::{
    Config, DeprecatedOptions, Options, PercentilesArg, Reduce, WindowArg, DEFAULT_PERCENTILES,
};
pub use deferred::Deferred;
pub use snapshot::{Arith, Compare, Comparison, Snapshot};
pub use stat::{now, Payload, Peeked, PercentileKey, Stat, Throughput, Value};
pub use state::{FieldSource, FieldValue, StatState, StateField};
pub use store::{check_key, KeyPart, Node, Store, Tree};

/// An error from the metrics core. The variant says which Python exception it becomes.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricsError {
    /// Bad options or values (Python `ValueError`).
    Value(String),
    /// A key that is not there (Python `KeyError`).
    Key(String),
    /// An argument of the wrong kind (Python `TypeError`).
    Type(String),
}

impl std::fmt::Display for MetricsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricsError::Value(m) | MetricsError::Key(m) | MetricsError::Type(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for MetricsError {}

pub(crate) fn value_err<T>(msg: impl Into<String>) -> Result<T, MetricsError> {
    Err(MetricsError::Value(msg.into()))
}
