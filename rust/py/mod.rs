//! The binding layer: the `fastrollout._core` Python extension module.
//!
//! It converts between Python/numpy values and the pure core's types, maps core errors to
//! Python exceptions, and hands the core's plans the values they record: a multi-agent
//! env step (which agents it mentions and what each gets, `episode::multi::Mentions`; the
//! per-agent plan, applied by the core through the `Books` the binding implements over
//! RLlib's dicts), a multi-agent concat, cut or slice, a read or write of an episode
//! field, a runner's vector step, a metrics logger's stats. What it still decides, because
//! only Python can: which Python object is a numpy array, a torch tensor or a nested value
//! (and so how it converts), the order of a Python set where RLlib's results depend on it
//! (agents that join), and which keys of Python dicts name the same agent.

mod dict_walk;
mod dist;
mod errors;
mod ids;
mod index;
mod metrics;
mod multi;
mod multi_agents;
mod multi_cut;
mod object;
mod outputs;
mod postprocess;
mod ready;
mod runner;
mod single;
mod spec;

use pyo3::prelude::*;

#[pymodule]
mod _core {
    #[pymodule_export]
    use super::dist::categorical_draw;
    #[pymodule_export]
    use super::errors::EpisodeStateError;
    #[pymodule_export]
    use super::errors::SpaceMismatchError;
    #[pymodule_export]
    use super::ids::forget_episode_ids;
    #[pymodule_export]
    use super::ids::new_episode_id;
    #[pymodule_export]
    use super::metrics::MetricsStorePy;
    #[pymodule_export]
    use super::metrics::StatsSnapshotPy;
    #[pymodule_export]
    use super::multi::multi_agent_add_env_reset;
    #[pymodule_export]
    use super::multi::MultiAgentEpisodeCore;
    #[pymodule_export]
    use super::multi::StepMapPy;
    #[pymodule_export]
    use super::outputs::AgentOutputsPy;
    #[pymodule_export]
    use super::postprocess::gae_segments;
    #[pymodule_export]
    use super::ready::wait_ready;
    #[pymodule_export]
    use super::runner::multi_agent_record_steps;
    #[pymodule_export]
    use super::runner::single_agent_record_vector_step;
    #[pymodule_export]
    use super::runner::ModuleBatcherPy;
    #[pymodule_export]
    use super::single::SingleAgentEpisodePy;

    use pyo3::prelude::*;

    /// Bytes in the extension's live heap blocks (its episodes' columns, metric windows,
    /// ...), which the C heap's and Python's own statistics do not count (see
    /// `rust/alloc.rs`).
    #[pyfunction]
    fn native_heap_bytes() -> usize {
        crate::alloc::live_bytes()
    }

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        crate::alloc::hand_back_freed_pages_lazily();
        Ok(())
    }
}
