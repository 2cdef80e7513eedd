//! fastrollout's native core.
//!
//! The crate has two layers:
//! - the pure core (`schema`, `column`, `episode`, `metrics`, `runner`): typed columns with
//!   look-back, the episode bookkeeping built on them, the metric statistics, and the
//!   runner's batched containers, and the batch post-processing (GAE). It knows nothing of Python, so `cargo test` and the
//!   criterion benches run on it alone;
//! - the binding layer (`py`, behind the `python` feature that maturin turns on): converts
//!   Python/numpy values to and from the core's types and maps core errors to Python
//!   exceptions. It holds no logic of its own beyond that.

pub mod column;
pub mod dist;
pub mod episode;
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
