//! The row-step path: a step whose fields arrive as rows laid out like the episode's typed
//! columns (a vector env's batches, a module's outputs), stored without per-item conversion.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyDict, PyString};
use smallvec::SmallVec;

use super::{FieldName, SingleAgentEpisodePy};
use crate::episode::Leaves;
use crate::py::dict_walk::for_each_item;
use crate::py::errors::episode_error;
use crate::py::object::PyObj;
use crate::py::outputs::AgentOutputsPy;
use crate::py::spec::{self, LeafBytes, Spec};
use crate::schema::DType;

/// A runner's guess of how long its chunks get (see
/// [`SingleAgentEpisodePy::reserve_after_first_step`]).
#[derive(Clone, Copy, Debug)]
pub struct LengthGuess {
    /// The length of the episodes the runner saw end.
    pub expected_len: i64,
    /// The most steps a chunk can take before the runner cuts it (`usize::MAX`: no bound).
    pub steps_left: usize,
}

/// A step's extra model outputs for [`SingleAgentEpisodePy::prepare_row_step`]: a dict of
/// values, or the agent's row of its module's output arrays (the runner's scatter).
pub enum ExtraOutputs<'a, 'py> {
    Dict(&'a Bound<'py, PyDict>),
    Rows(&'a AgentOutputsPy),
}

/// Steps of several episodes (one env step's agents) as raw rows laid out like each
/// episode's typed columns (observation, action, reward, then its extras), for
/// [`SingleAgentEpisodePy::add_row_step`]: what [`SingleAgentEpisodePy::prepare_row_step`]
/// adds to.
///
/// All steps share the same lists of leaves and keys (the multi-agent record prepares
/// every agent's step before it stores any): lists per step cost a heap block each, and
/// moving a step with inline buffers through the record's plans cost as much, each about a
/// tenth of the record. The lists are inline up to eight agents' usual steps.
#[derive(Default)]
pub struct RowSteps<'py> {
    leaves: RowLeaves<'py>,
    /// The extras' keys, their text read once (for the lookup of their columns when
    /// converted and when stored).
    keys: SmallVec<[PyBackedStr; 24]>,
    /// Per step, where its leaves and its extras' keys start and end.
    spans: SmallVec<[Span; 8]>,
}

/// [`RowSteps`]' leaves: room for eight steps of an observation, an action, a reward and
/// three one-leaf extras.
pub(super) type RowLeaves<'py> = SmallVec<[LeafBytes<'py>; 48]>;

/// One step's leaves and keys in [`RowSteps`]: the leaves `[0]..[1]`, the keys `[2]..[3]`.
type Span = [usize; 4];

impl RowSteps<'_> {
    /// Where the next step's leaves and keys start (for [`Self::finish`]).
    pub(super) fn mark(&self) -> (usize, usize) {
        (self.leaves.len(), self.keys.len())
    }

    /// Ends the step begun at `mark`: kept (its index) where `added` is `Ok(true)`;
    /// otherwise what it added is taken back, so that the next step starts clean.
    #[inline]
    pub(super) fn finish(&mut self, mark: (usize, usize), added: PyResult<bool>) -> PyResult<Option<usize>> {
        if !matches!(added, Ok(true)) {
            self.leaves.truncate(mark.0);
            self.keys.truncate(mark.1);
            return added.map(|_| None);
        }
        self.spans.push([mark.0, self.leaves.len(), mark.1, self.keys.len()]);
        Ok(Some(self.spans.len() - 1))
    }

    /// Stores step `step` into `episode` (nothing is stored on error); `info` as
    /// [`info_or_absent`] gives it.
    #[inline]
    pub fn apply(
        &self,
        step: usize,
        episode: &mut SingleAgentEpisodePy,
        info: Option<PyObj>,
        terminated: bool,
        truncated: bool,
        now: f64,
    ) -> PyResult<()> {
        let [l0, l1, k0, k1] = self.spans[step];
        episode.add_row_step(&self.leaves[l0..l1], &self.keys[k0..k1], info, terminated, truncated, now)
    }
}

impl SingleAgentEpisodePy {
    /// [`Self::prepare_step`] for the common step of an episode whose fields are all
    /// typed (every step after an agent's first): each value converted straight to the
    /// bytes of its column's layout, added to `steps` for [`RowSteps::apply`], without the
    /// per-field items of the general path. Returns the step's index in `steps`, or
    /// `None` (and `steps` as it was) wherever the general path does something else (a
    /// field or extra key without a typed column, a value that does not convert, a reward
    /// column that is not one f32/f64 scalar): the caller then takes that path, which also
    /// raises its errors.
    pub fn prepare_row_step<'py>(
        &self,
        steps: &mut RowSteps<'py>,
        observation: &Bound<'py, PyAny>,
        action: &Bound<'py, PyAny>,
        reward: f64,
        extra_model_outputs: Option<ExtraOutputs<'_, 'py>>,
    ) -> PyResult<Option<usize>> {
        let py = observation.py();
        let mark = steps.mark();
        // Ok(false): a value does not go in as a row; `finish` takes back what was added.
        let added = (|| -> PyResult<bool> {
            if self.core.is_done() || !self.core.is_reset() {
                return Ok(false);
            }
            let leaves = &mut steps.leaves;
            if !self.push_row_bytes(leaves, FieldName::Observations, observation)
                || !self.push_row_bytes(leaves, FieldName::Actions, action)
            {
                return Ok(false);
            }
            let Some(spec) = self.row_spec(FieldName::Rewards) else { return Ok(false) };
            match spec.schema.leaves.as_slice() {
                [leaf] if leaf.shape.is_empty() && leaf.dtype == DType::F64 => {
                    leaves.push(LeafBytes::copied(&reward.to_ne_bytes()));
                }
                [leaf] if leaf.shape.is_empty() && leaf.dtype == DType::F32 => {
                    leaves.push(LeafBytes::copied(&(reward as f32).to_ne_bytes()));
                }
                _ => return Ok(false),
            }
            let push_dict = |steps: &mut RowSteps<'py>, d: &Bound<'py, PyDict>| -> PyResult<bool> {
                for_each_item(d, |_, k, v| {
                    let Ok(k) = k.cast_into::<PyString>() else { return Ok(false) };
                    // Kept at once: where the value does not fit, `finish` takes it back.
                    steps.keys.push(PyBackedStr::try_from(k)?);
                    let k = steps.keys.last().map_or("", |k| &**k);
                    Ok(self.push_row_bytes(&mut steps.leaves, FieldName::Extra(k), &v))
                })
            };
            match extra_model_outputs {
                None => Ok(true),
                Some(ExtraOutputs::Dict(d)) => push_dict(steps, d),
                Some(ExtraOutputs::Rows(r)) => {
                    for column in r.columns() {
                        let k = PyBackedStr::try_from(column.name.bind(py).clone())?;
                        let Some(spec) = self.row_spec(FieldName::Extra(&k)) else {
                            return Ok(false);
                        };
                        let Some(bytes) = r.row_bytes(py, column, spec) else { return Ok(false) };
                        steps.leaves.push(bytes);
                        steps.keys.push(k);
                    }
                    r.constants(py).map_or(Ok(true), |c| push_dict(steps, c))
                }
            }
        })();
        steps.finish(mark, added)
    }

    /// Appends `value`'s bytes in the layout of `name`'s typed column; false (nothing
    /// appended) where the field has no such column or the value does not convert.
    pub(super) fn push_row_bytes<'py>(
        &self,
        leaves: &mut RowLeaves<'py>,
        name: FieldName<'_>,
        value: &Bound<'py, PyAny>,
    ) -> bool {
        let Some(spec) = self.row_spec(name) else { return false };
        if let Some(bytes) = spec::one_leaf_fast(spec, value) {
            leaves.push(bytes);
            return true;
        }
        if let Some(view) = spec::one_leaf_view(spec, value, &|| name.label()) {
            return view.map(|v| leaves.push(v)).is_ok();
        }
        let Ok(views) = spec::to_leaf_views(spec, value, None, &|| name.label()) else { return false };
        match views {
            Leaves::One(view) => leaves.push(view),
            Leaves::Many(views) => leaves.extend(views),
        }
        true
    }

    /// The spec of `name` if the field stores typed items laid out by it, so that a row
    /// of a batch converted with this spec can be stored as it is ([`Input::Row`]).
    pub fn row_spec(&self, name: FieldName<'_>) -> Option<&Spec> {
        self.core.field(name)?.row_spec()
    }

    /// Whether the field `name` infers its spec from the next item stored, which
    /// [`Input::FirstRow`] stands in for (see [`crate::episode::SingleAgentCore::infers_spec`]).
    pub fn infers_spec(&self, name: FieldName<'_>) -> bool {
        self.core.infers_spec(name)
    }

    /// Right after a chunk's first step (when every field has its column), reserves room
    /// in its typed columns for the steps left until the episode is `guess.expected_len`
    /// long, and no more than `guess.steps_left` (see
    /// [`crate::episode::SingleAgentCore::reserve_until`]); nothing otherwise.
    pub fn reserve_after_first_step(&mut self, guess: Option<LengthGuess>) {
        if let Some(g) = guess {
            if self.core.len() == 1 {
                self.core.reserve_until(g.expected_len, g.steps_left);
            }
        }
    }

    /// Whether [`Self::add_row_step`] takes a step with these field layouts (observation,
    /// action, reward, then the extras `extra_keys`).
    pub fn fits_rows(&self, layouts: &[&crate::schema::Schema], extra_keys: &[&str]) -> bool {
        self.core.fits_rows(layouts, extra_keys)
    }

    /// Records one step from raw bytes, one slice per leaf of each field in
    /// [`Self::fits_rows`] order; `info` is [`info_or_absent`]'s (decided by the caller
    /// before any bytes are borrowed, since reading a value's truth may run Python code).
    /// Nothing is stored on error.
    #[inline]
    pub fn add_row_step<B: AsRef<[u8]>, K: AsRef<str>>(
        &mut self,
        leaves: &[B],
        extra_keys: &[K],
        info: Option<PyObj>,
        terminated: bool,
        truncated: bool,
        now: f64,
    ) -> PyResult<()> {
        self.core
            .add_row_step(leaves, extra_keys, info, terminated, truncated)
            .map_err(|e| episode_error(&e))?;
        self.stamp_step(now);
        Ok(())
    }
}
