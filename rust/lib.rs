//! fastrollout's native core.
//!
//! The crate has two layers:
//! - the pure core (`schema`, `column`, `episode`, `metrics`, `runner`, `dist`,
//!   `postprocess`, `intern`): typed columns with look-back, the episode bookkeeping built on them
//!   and RLlib's episode rules (reads, fills, the multi-agent env step as a plan), the
//!   metric statistics, the runner's batched containers, and the batch post-processing
//!   (GAE). It knows nothing of Python, so `cargo test` and the criterion benches run on it
//!   alone;
//! - the binding layer (`py`, behind the `python` feature that maturin turns on): converts
//!   Python/numpy values to and from the core's types, maps core errors to Python
//!   exceptions and applies the core's plans (`py/mod.rs` lists the rules still decided
//!   there, on Python values).

pub mod column;
pub mod dist;
pub mod episode;
pub mod intern;
pub mod metrics;
pub mod postprocess;
pub mod runner;
pub mod schema;

#[cfg(feature = "python")]
mod alloc;
#[cfg(feature = "python")]
mod py;

#[cfg(feature = "python")]
#[global_allocator]
static ALLOCATOR: alloc::SplitAllocator = alloc::SplitAllocator;
