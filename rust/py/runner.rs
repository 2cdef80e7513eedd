//! The runner's hot path: one call records a vector-env step into all sub-envs' episodes,
//! one call gathers each module's inference batch, one call scatters module outputs back.
//!
//! The rules (rows of a batch, which field takes the fast path, per-module gather with its
//! index map, which sub-env each row belongs to, the checks of every per-row input, the
//! step tallies) are the pure core's (`crate::runner`); this layer converts numpy/Python
//! values to and from it.
//!
//! Each call takes the runner's full list of episodes and, optionally, `env_indices`: the
//! sub-envs that stepped (row `j` of every batch belongs to `episodes[env_indices[j]]`),
//! so that a runner whose sub-envs become ready at different times records and gathers
//! the ready ones without a Python loop over sub-envs.

use std::sync::Arc;

use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple};

use numpy::{PyArray1, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};

use super::errors::with_prefix;
use super::multi::MultiAgentEpisodeCore;
use super::object::PyObj;
use super::outputs::{AgentOutputsPy, ModuleOutputs, OutputColumn};
use super::single::{Input, LengthGuess, SingleAgentEpisodePy};
use super::spec::{self, LeafBytes, Spec};
use crate::runner::batcher::{Batcher, OutputRole};
use crate::runner::step::{
    same_layout, step_results, vector_info_keys, FastStep, FieldBytes, FieldRows, StepField, StepKind,
};
use crate::runner::tally::{StepCounts, Tally};
use crate::runner::{BatchError, EnvIndices, IndexEntry};

/// A batch bookkeeping error as Python's `ValueError`.
#[allow(clippy::needless_pass_by_value)] // the shape `map_err` takes
fn value_error(e: BatchError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A batch bookkeeping error as Python's `TypeError` or `ValueError`, as it says.
#[allow(clippy::needless_pass_by_value)] // the shape `map_err` takes
fn batch_error(e: BatchError) -> PyErr {
    if e.is_type_error() {
        PyTypeError::new_err(e.to_string())
    } else {
        PyValueError::new_err(e.to_string())
    }
}

/// `repr(value)`, or nothing where it raises (for messages).
fn repr(value: &Bound<'_, PyAny>) -> String {
    value.repr().map(|r| r.to_string()).unwrap_or_default()
}

/// A field's batch (or constant) viewed through the layout of the episodes' field that
/// stores it (see [`FieldBytes`]).
type Bytes<'py> = FieldBytes<LeafBytes<'py>>;

/// Row `i` of `rows`, copied (inline for up to 8 bytes: the column then copies it once
/// more into its buffer, a few bytes for vector items).
fn row_leaves(rows: &Bytes<'_>, i: usize) -> PyResult<Vec<LeafBytes<'static>>> {
    Ok(rows.row(i).map_err(value_error)?.into_iter().map(LeafBytes::copied).collect())
}

/// One batched field of a vector step: converted to rows lazily, with the spec of the
/// first episode that stores the field typed.
struct BatchField<'py> {
    value: Bound<'py, PyAny>,
    field: StepField,
    rows: Option<Option<Bytes<'py>>>,
    /// For episodes that infer the field's spec from their first item: the spec inferred
    /// from the batch's row 0 and the batch laid out by it (made on first use).
    first: Option<Option<FirstRows<'py>>>,
    n: usize,
}

/// A batch (or constant) laid out by the spec its rows infer (see
/// [`BatchField::first_rows`]).
struct FirstRows<'py> {
    spec: Arc<Spec>,
    host_scalars: bool,
    rows: Bytes<'py>,
}

impl FirstRows<'_> {
    fn input(&self, i: usize) -> PyResult<Input<'static>> {
        let leaves = row_leaves(&self.rows, i)?;
        Ok(Input::FirstRow { leaves, spec: self.spec.clone(), host_scalars: self.host_scalars })
    }
}

impl<'py> BatchField<'py> {
    fn new(value: Bound<'py, PyAny>, field: StepField, n: usize) -> Self {
        BatchField { value, field, rows: None, first: None, n }
    }

    /// How the episodes read the value: a batch, a constant, or per episode.
    fn kind(&self) -> FieldRows {
        let is_array = self.value.cast::<PyUntypedArray>().is_ok();
        self.field.rows(is_array, || is_nested_batch(&self.value, self.n))
    }

    /// Row `i` of the batch for `episode`: bytes laid out for its field where it stores
    /// typed items of the batch's layout, else the row as a Python object.
    fn input(&mut self, episode: &SingleAgentEpisodePy, i: usize) -> Result<Input<'py>, FieldError> {
        if episode.infers_spec(self.field.name()) {
            if self.first.is_none() {
                self.first = Some(self.first_rows().map_err(FieldError::Batch)?);
            }
            if let Some(Some(first)) = &self.first {
                return first.input(i).map_err(FieldError::Row);
            }
        }
        if self.kind() == FieldRows::Constant {
            return Ok(Input::Object(self.value.clone()));
        }
        let spec = episode.row_spec(self.field.name());
        if self.rows.is_none() {
            self.rows = Some(match spec {
                Some(s) => Some(self.convert(s).map_err(FieldError::Batch)?),
                None => None,
            });
        }
        if let (Some(Some(rows)), Some(s)) = (&self.rows, spec) {
            if same_layout(rows.schema(), &s.schema) {
                return Ok(Input::Row(row_leaves(rows, i).map_err(FieldError::Row)?));
            }
        }
        Ok(Input::Object(row_object(&self.value, i).map_err(FieldError::Row)?))
    }

    /// The spec that an episode storing its first item of this field infers from row 0
    /// of the batch, with the batch laid out by it; `None` unless the batch is a numpy
    /// array of integers or floats in native byte order, or a constant extra output.
    ///
    /// Every row of such an array is the same kind of item (a numpy scalar of its dtype,
    /// or an array of its dtype and row shape), so each row infers this spec, and a
    /// constant is the same object for every sub-env: a chunk's first step takes its
    /// row's bytes, as later steps do, instead of making each row a numpy object and
    /// inferring its spec again (about a microsecond per episode in all: a runner with
    /// 1024 sub-envs makes ~50 new chunks per vector step).
    fn first_rows(&self) -> PyResult<Option<FirstRows<'py>>> {
        let Ok(array) = self.value.cast::<PyUntypedArray>() else {
            // A nested batch's first item is inferred from its row 0 (the per-row path).
            if self.kind() != FieldRows::Constant {
                return Ok(None);
            }
            // As `prepare` infers and converts a first item (an object where either fails).
            let Some((spec, host_scalars)) = spec::infer(&self.value)? else { return Ok(None) };
            let Some(rows) = self.const_bytes(&spec) else { return Ok(None) };
            return Ok(Some(FirstRows { spec, host_scalars, rows }));
        };
        let dtype = array.dtype();
        if array.ndim() == 0
            || self.n == 0
            || !matches!(dtype.kind(), b'i' | b'u' | b'f')
            || !dtype.is_native_byteorder().unwrap_or(false)
        {
            return Ok(None);
        }
        let Some((spec, host_scalars)) = spec::infer(&self.value.get_item(0)?)? else { return Ok(None) };
        Ok(self.convert(&spec).ok().map(|rows| FirstRows { spec, host_scalars, rows }))
    }

    /// A constant's (non-batch) leaves laid out by `spec`, owned; `None` if it does not
    /// convert.
    fn const_bytes(&self, spec: &Spec) -> Option<Bytes<'py>> {
        let views = spec::to_leaf_views(spec, &self.value, None, &|| self.field.label()).ok()?;
        let owned = views.into_vec().into_iter().map(|v| LeafBytes::Owned(v.into_owned()));
        Some(FieldBytes::constant(spec.schema(), owned.collect()))
    }

    fn convert(&self, s: &Spec) -> PyResult<Bytes<'py>> {
        // The label is formatted only for an error message (formatting it eagerly took
        // about 2% of the image runner's record).
        let views = spec::to_leaf_views(s, &self.value, Some(Some(self.n)), &|| self.field.label())?;
        FieldBytes::batch(s.schema(), views.into_vec(), self.n)
            .map_err(|e| PyValueError::new_err(format!("{}: {e}", self.field.label())))
    }
}

/// Why a field of a vector step did not convert: the whole batch (its shape or dtype, the
/// same for every sub-env, e.g. a vector env's own batch of the wrong shape) or one
/// sub-env's row.
enum FieldError {
    Batch(PyErr),
    Row(PyErr),
}

impl FieldError {
    /// The Python error: a row's names its sub-env; a batch's names none, as every
    /// sub-env's row is alike.
    fn into_py(self, py: Python<'_>, env: usize) -> PyErr {
        match self {
            FieldError::Batch(err) => err,
            FieldError::Row(err) => for_env(py, env, err),
        }
    }
}

/// The common vector step laid out by the columns of `model` (a reset episode with a
/// step), as [`FastStep::build`] decides; episodes whose columns differ (first steps,
/// fields stored as objects, other dtypes) go through the per-episode conversion instead.
fn fast_step<'a, 'py: 'a>(
    model: &SingleAgentEpisodePy,
    fields: impl Iterator<Item = &'a BatchField<'py>>,
) -> Option<FastStep<LeafBytes<'py>>> {
    FastStep::build(fields.map(|f| (&f.field, f.kind(), f)), |f, constant| {
        let spec = model.row_spec(f.field.name())?;
        if constant {
            f.const_bytes(spec)
        } else {
            f.convert(spec).ok()
        }
    })
}

/// Stores the steps of the episodes that take the fast path: row `i` of every batch,
/// no conversion, no Python code run (the batches' bytes are read once for all rows).
/// Errors name the sub-env by its episode index (`envs.env(i)`).
fn record_rows(
    fast: &FastStep<LeafBytes<'_>>,
    steps: Vec<(usize, Bound<'_, SingleAgentEpisodePy>, Option<PyObj>)>,
    terminateds: &[bool],
    truncateds: &[bool],
    now: f64,
    guess: Option<LengthGuess>,
    envs: &EnvIndices,
) -> PyResult<()> {
    let leaves = fast.leaves();
    // The batches' sizes were checked when they were converted, but Python code ran since
    // (the other sub-envs' conversions): check again, before any episode is stepped.
    leaves.check_rows(steps.iter().map(|(i, ..)| i + 1).max().unwrap_or(0)).map_err(value_error)?;
    let keys = fast.keys();
    let mut row = Vec::new();
    for (i, ep, info) in steps {
        leaves.row_into(i, &mut row).map_err(value_error)?;
        let mut e = ep.borrow_mut();
        e.add_row_step(&row, &keys, info, terminateds[i], truncateds[i], now)
            .map_err(|err| for_env(ep.py(), envs.env(i), err))?;
        e.reserve_after_first_step(guess);
    }
    Ok(())
}

/// The members of a dict or tuple (its values or items): a nested batch's, one per leaf
/// of a Dict/Tuple space or a recurrent module's state; `None` for any other value.
fn members<'py>(value: &Bound<'py, PyAny>) -> Option<Vec<Bound<'py, PyAny>>> {
    if let Ok(d) = value.cast::<PyDict>() {
        return Some(d.iter().map(|(_, v)| v).collect());
    }
    value.cast::<PyTuple>().ok().map(|t| t.iter().collect())
}

/// Whether an extra model output is a nested batch of `n` rows (a recurrent module's
/// state): a non-empty dict or tuple whose leaves are all numpy arrays with `n` rows. Any
/// other dict or tuple is a constant for every row, as any other non-array value is.
fn is_nested_batch(value: &Bound<'_, PyAny>, n: usize) -> bool {
    fn leaves_have_rows(value: &Bound<'_, PyAny>, n: usize) -> bool {
        match members(value) {
            Some(m) => !m.is_empty() && m.iter().all(|v| leaves_have_rows(v, n)),
            None => value.cast::<PyUntypedArray>().is_ok_and(|a| a.shape().first() == Some(&n)),
        }
    }
    members(value).is_some() && leaves_have_rows(value, n)
}

/// The rows of a batch: `len(value)`, or for a nested batch its first leaf's (every leaf
/// of a well-formed one has as many; reading a row checks the others).
fn batch_len(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    match members(value).and_then(|m| m.into_iter().next()) {
        Some(first) => batch_len(&first),
        None => value.len(),
    }
}

/// Row `i` of a batch as a Python value: `value[i]`, or for the dicts/tuples of batches
/// that vector envs return for Dict/Tuple spaces, the same structure of rows.
fn row_object<'py>(value: &Bound<'py, PyAny>, i: usize) -> PyResult<Bound<'py, PyAny>> {
    let py = value.py();
    if let Ok(d) = value.cast::<PyDict>() {
        let out = PyDict::new(py);
        for (k, v) in d.iter() {
            out.set_item(k, row_object(&v, i)?)?;
        }
        return Ok(out.into_any());
    }
    if let Ok(t) = value.cast::<PyTuple>() {
        let items = t.iter().map(|v| row_object(&v, i)).collect::<PyResult<Vec<_>>>()?;
        return Ok(PyTuple::new(py, items)?.into_any());
    }
    value.get_item(i)
}

/// Reads a sequence of flags (a numpy bool array or any sequence), one per row of `envs`.
fn flags(value: &Bound<'_, PyAny>, envs: &EnvIndices, what: &'static str) -> PyResult<Vec<bool>> {
    // Fast path: a contiguous numpy bool array (what vector envs return) is read as bytes,
    // without creating a numpy scalar per sub-env.
    if let Ok(a) = value.cast::<PyUntypedArray>() {
        let py = value.py();
        if a.ndim() == 1 && a.dtype().is_equiv_to(&numpy::dtype::<bool>(py)) {
            let view = LeafBytes::Array(a.clone());
            let b = view.as_ref();
            if b.len() == envs.len() {
                return Ok(b.iter().map(|&x| x != 0).collect());
            }
        }
    }
    let out = value.try_iter()?.map(|v| v.and_then(|v| v.is_truthy())).collect::<PyResult<Vec<bool>>>()?;
    envs.check_count(what, "flags", out.len()).map_err(value_error)?;
    Ok(out)
}

/// The infos of each row: from a list (one per row), or unbatched from gymnasium's vector
/// format (a dict of arrays, `_key` masks saying which sub-envs have the key; see
/// [`vector_info_keys`]). `None` where a sub-env has no infos.
fn unbatch_infos<'py>(
    py: Python<'py>,
    infos: Option<&Bound<'py, PyAny>>,
    envs: &EnvIndices,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    let Some(infos) = infos.filter(|i| !i.is_none()) else { return Ok(vec![None; envs.len()]) };
    if let Ok(d) = infos.cast::<PyDict>() {
        // gymnasium's keys (and so its masks) are str; any other key is not unbatched.
        let items: Vec<_> =
            d.iter().filter_map(|(k, v)| Some((k.cast_into::<PyString>().ok()?, v))).collect();
        let names = items.iter().map(|(k, _)| k.to_str()).collect::<PyResult<Vec<_>>>()?;
        let mut dicts: Vec<Option<Bound<'py, PyDict>>> = vec![None; envs.len()];
        for (key, mask) in vector_info_keys(&names) {
            let ((k, v), mask) = (&items[key], mask.map(|m| &items[m].1));
            for (i, slot) in dicts.iter_mut().enumerate() {
                if mask.map_or(Ok(true), |m| m.get_item(i)?.is_truthy())? {
                    slot.get_or_insert_with(|| PyDict::new(py)).set_item(k, v.get_item(i)?)?;
                }
            }
        }
        return Ok(dicts.into_iter().map(|d| d.map(Bound::into_any)).collect());
    }
    let list: Vec<Bound<'py, PyAny>> = infos.try_iter()?.collect::<PyResult<_>>()?;
    envs.check_count("infos", "info dicts", list.len()).map_err(value_error)?;
    Ok(list.into_iter().map(Some).collect())
}

/// The sub-envs a call's rows belong to: every one of `num_envs` (`env_indices` None), or
/// the subset `env_indices` names (a sequence of ints or a 1-D integer numpy array).
///
/// Raises `ValueError` naming the entry and its value for an index out of range (negative
/// included) or given twice, and `TypeError` for what is not integers (a bool mask too).
fn env_indices(value: Option<&Bound<'_, PyAny>>, num_envs: usize) -> PyResult<EnvIndices> {
    let Some(value) = value.filter(|v| !v.is_none()) else { return Ok(EnvIndices::all(num_envs)) };
    let indices: Vec<i64> = if let Ok(a) = value.cast::<PyUntypedArray>() {
        let dtype = a.dtype();
        IndexEntry::check_array(a.ndim(), dtype.kind(), || {
            let repr = dtype.str().map(|r| r.to_string()).unwrap_or_default();
            format!("an array of dtype {repr} and shape {:?}", a.shape())
        })
        .map_err(batch_error)?;
        if a.is_c_contiguous() && a.cast::<PyArray1<i64>>().is_ok() {
            // The common case (np.array of ints, np.flatnonzero): its bytes, read without a
            // Python call (rust-numpy's `readonly()` borrow check cost more than the rest
            // of the check: 3,600 instructions for 64 indices).
            let bytes = LeafBytes::Array(a.clone());
            return EnvIndices::from_ne_bytes(bytes.as_ref(), num_envs).map_err(value_error);
        }
        ints(value.call_method0(intern!(value.py(), "tolist"))?.try_iter()?)?
    } else {
        let Ok(items) = value.try_iter() else {
            let name = value.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            return Err(batch_error(BatchError::NotInts { got: format!("a {name}") }));
        };
        ints(items)?
    };
    EnvIndices::subset(&indices, num_envs).map_err(value_error)
}

/// The items of `env_indices` as `i64`s, each classified for [`IndexEntry::index`].
fn ints(items: Bound<'_, pyo3::types::PyIterator>) -> PyResult<Vec<i64>> {
    let mut out = Vec::new();
    for (entry, item) in items.enumerate() {
        let item = item?;
        let kind = match item.extract::<i64>() {
            Ok(_) if item.is_instance_of::<PyBool>() => IndexEntry::Bool,
            Ok(i) => IndexEntry::Int(i),
            Err(_) if item.is_instance_of::<PyInt>() => IndexEntry::BigInt,
            Err(_) => IndexEntry::Other,
        };
        out.push(kind.index(entry, || repr(&item)).map_err(batch_error)?);
    }
    Ok(out)
}

/// Checks that a batch given with `env_indices` has one row per entry: numpy arrays (and
/// lists) by their length, dicts and tuples of them (Dict/Tuple spaces) leaf by leaf;
/// anything else is left to the conversion.
fn check_subset_rows(value: &Bound<'_, PyAny>, envs: &EnvIndices, what: &dyn Fn() -> String) -> PyResult<()> {
    let rows = if let Ok(a) = value.cast::<PyUntypedArray>() {
        a.shape().first().copied()
    } else if let Some(members) = members(value) {
        for v in &members {
            check_subset_rows(v, envs, what)?;
        }
        None
    } else {
        value.cast::<PyList>().ok().map(PyListMethods::len)
    };
    envs.check_batch_rows(rows).map_err(|e| PyValueError::new_err(format!("{}: {e}", what())))
}

/// Prefixes `err`'s message with the sub-env it concerns (same exception type).
fn for_env(py: Python<'_>, env: usize, err: PyErr) -> PyErr {
    with_prefix(py, &format!("sub-env {env}"), err)
}

/// Item `i` of `list`, `None` for Python's None.
fn item<'py>(list: &Bound<'py, PyList>, i: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
    let v = list.get_item(i)?;
    Ok(if v.is_none() { None } else { Some(v) })
}

enum Prepared<'py> {
    Reset(super::single::PreparedReset<'py>),
    Step(super::single::PreparedStep<'py>),
}

/// The episodes of a subset's rows (`episodes[subset[j]]` for row `j`), once each batch
/// is checked to have one row per entry of the subset (constant extras excepted).
///
/// Kept out of the record's body (never inlined) so that the call without `env_indices`
/// compiles as it did: inlined here, it made the compiler stop inlining the per-episode
/// helpers of the record loop (about 1% more instructions per call at 64 sub-envs).
#[inline(never)]
fn subset_episodes<'py, 'a>(
    episodes: &Bound<'py, PyList>,
    envs: &EnvIndices,
    subset: &[usize],
    fields: impl Iterator<Item = &'a BatchField<'py>>,
) -> PyResult<Vec<Bound<'py, SingleAgentEpisodePy>>>
where
    'py: 'a,
{
    for f in fields.filter(|f| f.kind() != FieldRows::Constant) {
        check_subset_rows(&f.value, envs, &|| f.field.label())?;
    }
    subset.iter().map(|&i| Ok(episodes.get_item(i)?.cast_into::<SingleAgentEpisodePy>()?)).collect()
}

/// Records one vector-env step into the N sub-envs' `SingleAgentEpisode`s in one call.
///
/// Row `i` of every batch belongs to `episodes[i]`; with `env_indices`, the batches have
/// one row per entry and row `j` belongs to `episodes[env_indices[j]]` (the other
/// episodes are left as they are). An episode that was not reset yet (a new episode after
/// gymnasium's next-step autoreset) gets its row's observation and infos as its reset;
/// the others get a step. Everything is converted and checked first; only then is
/// anything stored, so an error leaves every episode as it was.
///
/// With `expected_len` (the runner's guess of an episode's length, from those that
/// ended), an episode whose chunk has just made its first step reserves room in its
/// typed columns for the steps left to that length, and no more than `steps_left` (the
/// vector steps the runner may still take before it cuts its chunks; none: no bound):
/// they then neither copy themselves as they grow nor, when the guess is right, when
/// `to_numpy` shrinks them.
///
/// Args:
///     episodes: The runner's episodes, one per sub-env (all N, also with `env_indices`).
///     observations: Batch of observations (a numpy array, or dicts/tuples of them for
///         Dict/Tuple spaces), one row per sub-env that stepped.
///     actions: Batch of the actions taken.
///     rewards: Batch of rewards.
///     terminateds: One flag per row (a numpy bool array or any sequence).
///     truncateds: One flag per row.
///     infos: gymnasium's vector infos (a dict of arrays with `_key` masks) or one dict
///         per row; None: no infos.
///     extra_model_outputs: Key -> batch (or a constant for every row, such as the
///         weights' sequence number).
///     expected_len: The runner's guess of an episode's length (see above).
///     steps_left: The vector steps left before the runner cuts its chunks.
///     env_indices: The sub-envs that stepped, in row order (a sequence of ints or a 1-D
///         integer numpy array, distinct, each in `range(len(episodes))`); None: all of
///         them, in order.
///
/// Returns:
///     `(started, done)`: the indices into `episodes` of the episodes that were reset now
///     and of those that are done after this step, in row order (with `env_indices`,
///     values of it, not row numbers).
///
/// Raises:
///     ValueError: For an `env_indices` entry out of range (negative included) or given
///         twice, or a batch, flags or infos without one row per entry of `env_indices`
///         (the message names the entry and its value, or the lengths), before anything
///         is checked or stored.
///     TypeError: If `env_indices` is not integers.
///     SpaceMismatchError, EpisodeStateError: For a row that does not fit its episode's
///         space or an episode that cannot take the step; the message names the sub-env
///         by its index into `episodes` (`sub-env 5: ...`).
#[pyfunction]
#[pyo3(signature = (episodes, observations, actions, rewards, terminateds, truncateds, infos=None, extra_model_outputs=None, expected_len=None, steps_left=None, env_indices=None))]
#[allow(clippy::too_many_arguments)]
pub fn single_agent_record_vector_step<'py>(
    py: Python<'py>,
    episodes: &Bound<'py, PyList>,
    observations: &Bound<'py, PyAny>,
    actions: &Bound<'py, PyAny>,
    rewards: &Bound<'py, PyAny>,
    terminateds: &Bound<'py, PyAny>,
    truncateds: &Bound<'py, PyAny>,
    infos: Option<&Bound<'py, PyAny>>,
    extra_model_outputs: Option<&Bound<'py, PyDict>>,
    expected_len: Option<i64>,
    steps_left: Option<usize>,
    env_indices: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Vec<usize>, Vec<usize>)> {
    let guess = expected_len
        .map(|expected_len| LengthGuess { expected_len, steps_left: steps_left.unwrap_or(usize::MAX) });
    let envs = self::env_indices(env_indices, episodes.len())?;
    // Rows of the step: one per sub-env that stepped.
    let n = envs.len();
    let terminateds = flags(terminateds, &envs, "terminateds")?;
    let truncateds = flags(truncateds, &envs, "truncateds")?;
    let infos = unbatch_infos(py, infos, &envs)?;
    let mut obs = BatchField::new(observations.clone(), StepField::Observations, n);
    let mut act = BatchField::new(actions.clone(), StepField::Actions, n);
    let mut rew = BatchField::new(rewards.clone(), StepField::Rewards, n);
    let mut extras = Vec::new();
    for (k, v) in extra_model_outputs.iter().flat_map(|d| d.iter()) {
        let k = k
            .cast_into::<PyString>()
            .map_err(|_| PyTypeError::new_err("extra_model_outputs keys must be str"))?;
        let field = StepField::Extra(k.to_str()?.to_owned());
        extras.push((k, BatchField::new(v, field, n)));
    }
    let all = || [&obs, &act, &rew].into_iter().chain(extras.iter().map(|(_, f)| f));
    let episodes: Vec<Bound<'py, SingleAgentEpisodePy>> = match envs.subset_indices() {
        None => episodes.iter().map(Bound::cast_into::<SingleAgentEpisodePy>).collect::<Result<_, _>>()?,
        Some(subset) => subset_episodes(episodes, &envs, subset, all())?,
    };
    let fast =
        episodes.iter().find(|e| e.borrow().chunk_len() > 0).and_then(|m| fast_step(&m.borrow(), all()));
    let layouts = fast.as_ref().map(|f| (f.layouts(), f.keys()));
    // Everything is checked (and every Python call made) before anything is stored. `i`
    // is a row of the batches; `envs.env(i)` its episode's index, for messages and results.
    // (Sized once: in steady state every episode takes the fast path.)
    let mut rows = Vec::with_capacity(if fast.is_some() { n } else { 0 });
    let mut others = Vec::new();
    for (i, (ep, info)) in episodes.into_iter().zip(&infos).enumerate() {
        let e = ep.borrow();
        let env = envs.env(i);
        let fits = layouts.as_ref().is_some_and(|(l, k)| e.fits_rows(l, k));
        let p = match StepKind::of(fits, || e.is_reset()) {
            StepKind::Row => None,
            StepKind::Step => {
                let input = |f: &mut BatchField<'py>| f.input(&e, i).map_err(|err| err.into_py(py, env));
                let (o, a, r) = (input(&mut obs)?, input(&mut act)?, input(&mut rew)?);
                let x =
                    extras.iter_mut().map(|(k, f)| Ok((k.clone(), input(f)?))).collect::<PyResult<_>>()?;
                Some(Prepared::Step(
                    e.prepare_step_inputs(o, a, r, info.as_ref(), x).map_err(|err| for_env(py, env, err))?,
                ))
            }
            StepKind::Reset => {
                let o = row_object(observations, i)?;
                Some(Prepared::Reset(e.prepare_reset(&o).map_err(|err| for_env(py, env, err))?))
            }
        };
        drop(e);
        match p {
            None => rows.push((i, ep, super::single::info_or_absent(info.as_ref()))),
            Some(p) => others.push((i, ep, p)),
        }
    }
    let now = super::single::perf_counter();
    if let Some(f) = &fast {
        record_rows(f, rows, &terminateds, &truncateds, now, guess, &envs)?;
    }
    // Rows whose episode was reset now, ascending (`others` is in row order).
    let mut started = Vec::new();
    for (i, ep, p) in others {
        let mut e = ep.borrow_mut();
        match p {
            Prepared::Reset(r) => {
                e.apply_reset(py, r, infos[i].as_ref())?;
                started.push(i);
            }
            Prepared::Step(s) => {
                e.apply_step(py, s, terminateds[i], truncateds[i])?;
                e.reserve_after_first_step(guess);
            }
        }
    }
    // A stepped episode is done exactly when its step says so (a reset one never is), so
    // the episodes need not be borrowed again to tell.
    Ok(step_results(&envs, &started, &terminateds, &truncateds))
}

/// Records one env step of each of N `MultiAgentEpisode`s (a vectorized multi-agent
/// runner's sub-envs) in one call.
///
/// Each argument is a list with one per-agent dict (or None) per sub-env, as the sub-env
/// returned it (the runner's scatter gives actions and extra model outputs in this form);
/// with `env_indices`, one per entry of it, entry `j` for `episodes[env_indices[j]]`.
/// Each episode checks its whole step before it stores any of it (`add_env_step`), and
/// the lists and `env_indices` are checked before any episode is stepped; the episodes
/// are stepped in row order, so an error in one leaves the earlier ones stepped.
///
/// With `agent_steps` and `module_steps` (dicts, e.g. `Counter`s), each agent that
/// observes in a sub-env counts one step for itself and one for its module (the
/// episode's `_agent_to_module_mapping`, or its `module_for` for an agent it has not
/// mapped yet): the runner's sampled step counts, kept here instead of in a Python loop
/// over the sub-envs.
///
/// Args:
///     episodes: The runner's episodes, one per sub-env (all N, also with `env_indices`).
///     observations: Per row, agent id -> observation (None: no agent observes).
///     actions: Per row, agent id -> action.
///     rewards: Per row, agent id -> reward.
///     infos: Per row, agent id -> infos (or None).
///     terminateds: Per row, agent id (and `"__all__"`) -> terminated (or None).
///     truncateds: Per row, agent id (and `"__all__"`) -> truncated (or None).
///     extra_model_outputs: Per row, agent id -> extra outputs (a dict or the scatter's
///         `AgentOutputs`), or None.
///     agent_steps: Agent id -> steps, added to.
///     module_steps: Module id -> steps, added to.
///     env_indices: The sub-envs that stepped, in row order (a sequence of ints or a 1-D
///         integer numpy array, distinct, each in `range(len(episodes))`); None: all of
///         them, in order.
///
/// Returns:
///     The indices into `episodes` of the episodes that are done (`__all__`) after the
///     step, in row order (with `env_indices`, values of it, not row numbers).
///
/// Raises:
///     ValueError: For an `env_indices` entry out of range or given twice, a list
///         without one entry per row, or an agent that maps to no module.
///     TypeError: If `env_indices` is not integers.
///     MultiAgentEnvError, SpaceMismatchError: From an episode's `add_env_step`; the
///         message names the sub-env by its index into `episodes` (`sub-env 5: ...`).
#[pyfunction]
#[pyo3(signature = (episodes, observations, actions, rewards, infos, terminateds, truncateds, extra_model_outputs, agent_steps=None, module_steps=None, env_indices=None))]
#[allow(clippy::too_many_arguments)]
pub fn multi_agent_record_steps<'py>(
    py: Python<'py>,
    episodes: &Bound<'py, PyList>,
    observations: &Bound<'py, PyList>,
    actions: &Bound<'py, PyList>,
    rewards: &Bound<'py, PyList>,
    infos: &Bound<'py, PyList>,
    terminateds: &Bound<'py, PyList>,
    truncateds: &Bound<'py, PyList>,
    extra_model_outputs: &Bound<'py, PyList>,
    agent_steps: Option<&Bound<'py, PyDict>>,
    module_steps: Option<&Bound<'py, PyDict>>,
    env_indices: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<usize>> {
    let envs = self::env_indices(env_indices, episodes.len())?;
    for (what, l) in [
        ("observations", observations),
        ("actions", actions),
        ("rewards", rewards),
        ("infos", infos),
        ("terminateds", terminateds),
        ("truncateds", truncateds),
        ("extra_model_outputs", extra_model_outputs),
    ] {
        envs.check_count(what, "dicts", l.len()).map_err(value_error)?;
    }
    let mut done = Vec::new();
    // Stands for a None dict (one for all sub-envs: nothing writes to it).
    let empty = PyDict::new(py);
    // The call's counts, written to the dicts once per agent and module at the end.
    let counts = agent_steps.zip(module_steps);
    let mut tally = StepCounts::default();
    // `i` is a row of the lists; `env` its episode's index, for messages and results.
    for (i, env) in envs.iter() {
        let ep = episodes.get_item(env)?.cast_into::<MultiAgentEpisodeCore>()?;
        let dict = |l: &Bound<'py, PyList>| -> PyResult<Bound<'py, PyDict>> {
            Ok(item(l, i)?.map(Bound::cast_into::<PyDict>).transpose()?.unwrap_or_else(|| empty.clone()))
        };
        let obs = dict(observations)?;
        MultiAgentEpisodeCore::add_env_step(
            &ep,
            &obs,
            &dict(actions)?,
            &dict(rewards)?,
            item(infos, i)?.as_ref(),
            item(terminateds, i)?.as_ref(),
            item(truncateds, i)?.as_ref(),
            item(extra_model_outputs, i)?.as_ref(),
        )
        .map_err(|err| for_env(py, env, err))?;
        if counts.is_some() {
            count_steps(ep.as_any(), &obs, &mut tally)?;
        }
        if ep.try_borrow()?.done() {
            done.push(env);
        }
    }
    if let Some((agents, modules)) = counts {
        add_counts(&tally.agents, agents)?;
        add_counts(&tally.modules, modules)?;
    }
    Ok(done)
}

/// Adds a tally's counts to `d[key]` (0 where missing).
fn add_counts<'py>(tally: &Tally<Bound<'py, PyAny>>, d: &Bound<'py, PyDict>) -> PyResult<()> {
    for (key, n) in tally.iter() {
        let old = d.get_item(key)?.map(|v| v.extract::<i64>()).transpose()?.unwrap_or(0);
        d.set_item(key, old + n)?;
    }
    Ok(())
}

/// The module of agent `aid` in `episode`: from its agent-to-module mapping, or for an
/// agent it has not mapped yet, its `module_for`.
fn module_of<'py>(
    episode: &Bound<'py, PyAny>,
    mapping: &Bound<'py, PyDict>,
    aid: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    match mapping.get_item(aid)? {
        Some(m) => Ok(m),
        None => episode.call_method1(intern!(episode.py(), "module_for"), (aid,)),
    }
}

/// The agent-to-module mapping of `episode`.
fn mapping<'py>(episode: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    Ok(episode.getattr(intern!(episode.py(), "_agent_to_module_mapping"))?.cast_into::<PyDict>()?)
}

/// Counts the step of `episode`'s sub-env (see [`StepCounts::add_step`]): keys are the
/// same object (agent ids recur across steps and sub-envs) or, failing that, equal as a
/// dict compares them.
fn count_steps<'py>(
    episode: &Bound<'py, PyAny>,
    observations: &Bound<'py, PyDict>,
    counts: &mut StepCounts<Bound<'py, PyAny>>,
) -> PyResult<()> {
    if observations.is_empty() {
        return Ok(());
    }
    let mapping = mapping(episode)?;
    counts.add_step(
        observations.iter().map(|(aid, _)| aid),
        |aid| module_of(episode, &mapping, aid).map(|m| (!m.is_none()).then_some(m)),
        |aid| aid.repr().map_or_else(|e| e, |r| value_error(BatchError::NoModule { agent: r.to_string() })),
        |a, b| a.is(b),
        |a, b| a.eq(b),
    )
}

/// Whether `flags[aid]` is set (a done agent).
fn is_flagged(flags: Option<&Bound<'_, PyDict>>, aid: &Bound<'_, PyAny>) -> PyResult<bool> {
    match flags.map(|d| d.get_item(aid)).transpose()?.flatten() {
        Some(v) => v.is_truthy(),
        None => Ok(false),
    }
}

/// A module's extra outputs as rows of its arrays (see [`super::outputs`]), or `None`
/// where [`OutputRole::extras_as_rows`] refuses them (the scatter then makes per-agent
/// dicts); a column has rows if it is a C-contiguous numpy array with a row axis.
fn module_outputs(
    cols: &Bound<'_, PyDict>,
    actions_key: &str,
    actions_for_env_key: &str,
    constants: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<Arc<ModuleOutputs>>> {
    let mut extras = Vec::new();
    for (col, value) in cols.iter() {
        let name = col.cast_into::<PyString>()?;
        if OutputRole::of(name.to_str()?, actions_key, actions_for_env_key, false, false)
            == Some(OutputRole::Extra)
        {
            extras.push(OutputColumn::new(&name, &value).ok_or(name));
        }
    }
    let names = extras.iter().map(|c| match c {
        Ok(c) => c.name.bind(cols.py()).to_str().map(|n| (n, true)),
        Err(name) => name.to_str().map(|n| (n, false)),
    });
    let names = names.collect::<PyResult<Vec<_>>>()?;
    if !OutputRole::extras_as_rows(names, |n| constants.map_or(Ok(false), |c| c.contains(n)))? {
        return Ok(None);
    }
    let columns = extras.into_iter().flatten().collect();
    // A copy: the values are read when the step is recorded, after the caller's code ran.
    let constants = constants.map(PyDictMethods::copy).transpose()?.map(Bound::unbind);
    Ok(Some(Arc::new(ModuleOutputs { columns, constants })))
}

/// `d[aid]`, a dict, created empty if missing.
fn agent_dict<'py>(d: &Bound<'py, PyDict>, aid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    if let Some(x) = d.get_item(aid)? {
        return Ok(x.cast_into::<PyDict>()?);
    }
    let x = PyDict::new(d.py());
    d.set_item(aid, &x)?;
    Ok(x)
}

/// Per-module inference batches for a (vectorized) multi-agent runner.
///
/// `gather` stacks, per module, the observations of the agents that act now across the
/// sub-envs (all of them, or the subset `env_indices` names) into one contiguous numpy
/// array per observation leaf (nested as the module's observation space), remembering
/// where each row came from; `scatter` splits the module outputs back into per-sub-env,
/// per-agent dicts. The buffers are reused across steps.
#[pyclass(name = "ModuleBatcher", module = "fastrollout._core")]
pub struct ModuleBatcherPy {
    /// Each module's observation spec, in the core's module order.
    specs: Vec<Arc<Spec>>,
    /// The module batches, and the agent id of each slot of each gathered row.
    core: Batcher<Py<PyAny>>,
}

impl ModuleBatcherPy {
    /// The position of module `mid`; `err` for an unknown one.
    fn module(&self, mid: &str, err: impl FnOnce() -> PyErr) -> PyResult<usize> {
        self.core.module_index(mid).ok_or_else(err)
    }
}

#[pymethods]
impl ModuleBatcherPy {
    /// Builds the batcher from each module's observation space.
    ///
    /// Raises `TypeError` if a module id is not a str and `ValueError` if an
    /// observation space has no fixed layout (a Text or Graph space cannot be batched).
    #[new]
    fn new(observation_spaces: &Bound<'_, PyDict>) -> PyResult<Self> {
        let mut modules = Vec::with_capacity(observation_spaces.len());
        for (mid, space) in observation_spaces.iter() {
            let mid: String = mid
                .extract()
                .map_err(|_| PyTypeError::new_err(format!("module ids must be str, got {}", repr(&mid))))?;
            let Some(spec) = spec::from_space(&space)? else {
                return Err(PyValueError::new_err(format!(
                    "module {mid:?}: its observation space {} has no fixed layout, so its \
                     observations cannot be batched",
                    space.repr()?
                )));
            };
            modules.push((mid, spec));
        }
        let core = Batcher::new(modules.iter().map(|(mid, spec)| (mid.clone(), spec.schema())));
        Ok(ModuleBatcherPy { specs: modules.into_iter().map(|(_, s)| s).collect(), core })
    }

    /// The module ids, in the order given.
    #[getter]
    fn module_ids(&self) -> Vec<String> {
        self.core.module_ids().map(str::to_owned).collect()
    }

    /// Gathers each module's inference batch.
    ///
    /// `observations[j]` is a sub-env's agent -> observation dict (None: nothing to
    /// gather there): sub-env `j`'s, or with `env_indices` sub-env `env_indices[j]`'s.
    /// Agents flagged in `terminateds[j]` or `truncateds[j]` (done agents, which do not
    /// act) are left out. Each agent's module is read from its sub-env's episode
    /// (`module_for`, cached per episode).
    ///
    /// Args:
    ///     episodes: The runner's episodes, one per sub-env (all N, also with
    ///         `env_indices`).
    ///     observations: Per row, agent id -> observation, or None.
    ///     terminateds: Per row, agent id -> terminated (or None); None: no agent is.
    ///     truncateds: Per row, agent id -> truncated (or None); None: no agent is.
    ///     env_indices: The sub-envs the rows belong to, in row order (a sequence of
    ///         ints or a 1-D integer numpy array, distinct, each in
    ///         `range(len(episodes))`); None: row `j` is `episodes[j]`'s.
    ///
    /// Returns:
    ///     Module id -> batched observations, for the modules with at least one row.
    ///     `index_map(module_id)` then says which `(episode index, agent id)` each row is,
    ///     and `scatter` splits outputs back into one entry per row of `observations`.
    ///
    /// Raises:
    ///     ValueError: For an `env_indices` entry out of range or given twice, or lists
    ///         without one entry per row (`episodes` must have one per row without
    ///         `env_indices`).
    ///     TypeError: If `env_indices` is not integers.
    ///     KeyError: If an agent maps to a module the batcher does not know.
    ///     SpaceMismatchError: If an observation does not fit its module's space (naming
    ///         the sub-env by its episode index, the agent and the module).
    #[pyo3(signature = (episodes, observations, terminateds=None, truncateds=None, env_indices=None))]
    fn gather<'py>(
        &mut self,
        py: Python<'py>,
        episodes: &Bound<'py, PyList>,
        observations: &Bound<'py, PyList>,
        terminateds: Option<&Bound<'py, PyList>>,
        truncateds: Option<&Bound<'py, PyList>>,
        env_indices: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let envs = self::env_indices(env_indices, episodes.len())?;
        envs.check_gather_rows(observations.len()).map_err(value_error)?;
        for (what, l) in [("terminateds", terminateds), ("truncateds", truncateds)] {
            l.map_or(Ok(()), |l| envs.check_count(what, "dicts", l.len())).map_err(value_error)?;
        }
        self.core.begin(envs);
        // `row` indexes the lists (and the batches' index maps); `env` is its episode's.
        for (row, obs) in observations.iter().enumerate() {
            if obs.is_none() {
                continue;
            }
            let env = self.core.env(row);
            let obs = obs.cast_into::<PyDict>()?;
            let episode = episodes.get_item(env)?;
            let mapping = mapping(&episode)?;
            let done_flags = |l: Option<&Bound<'py, PyList>>| -> PyResult<Option<Bound<'py, PyDict>>> {
                Ok(l.map(|l| item(l, row)).transpose()?.flatten().map(Bound::cast_into).transpose()?)
            };
            let (term, trunc) = (done_flags(terminateds)?, done_flags(truncateds)?);
            for (aid, o) in obs.iter() {
                if is_flagged(term.as_ref(), &aid)? || is_flagged(trunc.as_ref(), &aid)? {
                    continue;
                }
                let mid = module_of(&episode, &mapping, &aid)?.cast_into::<PyString>().map_err(|e| {
                    PyTypeError::new_err(format!(
                        "sub-env {env}: agent {} maps to {}, not a module id (str); the \
                         agent-to-module mapping function must return a configured module id",
                        repr(&aid),
                        repr(&e.into_inner())
                    ))
                })?;
                let mid = mid.to_str()?;
                let m = self.module(mid, || {
                    PyKeyError::new_err(format!(
                        "sub-env {env}: agent {} maps to module {mid:?}, which is not one of the \
                         runner's modules {:?}",
                        repr(&aid),
                        self.module_ids()
                    ))
                })?;
                let label = || format!("sub-env {env}: observation of agent {} (module {mid:?})", repr(&aid));
                let leaves = spec::to_leaf_views(&self.specs[m], &o, None, &label)?;
                self.core
                    .push(row, m, aid.clone().unbind(), &leaves)
                    .map_err(|e| PyValueError::new_err(format!("{}: {e}", label())))?;
            }
        }
        let out = PyDict::new(py);
        for (m, mid, batch) in self.core.gathered() {
            let spec = &self.specs[m];
            let arrays = spec.descrs.iter().enumerate().map(|(i, descr)| {
                Ok(Some(spec::new_array(py, descr.bind(py), &batch.leaf_shape(i), batch.leaf(i))?))
            });
            let mut values = arrays.collect::<PyResult<Vec<_>>>()?;
            out.set_item(mid, spec::nest(py, &spec.tree, &mut values)?)?;
        }
        Ok(out)
    }

    /// Where each row of module `module_id`'s last batch came from.
    ///
    /// Args:
    ///     module_id: The module.
    ///
    /// Returns:
    ///     `(env index, agent id)` per row of the module's last batch, where the env index
    ///     is the index into the gather's `episodes` (with `env_indices`, a value of it;
    ///     without, the row of `observations`, the same).
    ///
    /// Raises:
    ///     KeyError: For an unknown module id.
    fn index_map(&self, py: Python<'_>, module_id: &str) -> PyResult<Vec<(usize, Py<PyAny>)>> {
        let m = self.module(module_id, || PyKeyError::new_err(module_id.to_string()))?;
        let map = self.core.index_map(m).map_err(value_error)?;
        Ok(map.into_iter().map(|(env, aid)| (env, aid.clone_ref(py))).collect())
    }

    /// Splits module outputs back per sub-env and agent.
    ///
    /// The result has one entry per row of the last gather's `observations`, in its
    /// order: one per sub-env, or with the gather's `env_indices`, entry `j` for sub-env
    /// `env_indices[j]` (a sub-env whose row had no acting agent gets empty dicts) — the
    /// rows the multi-agent record takes with the same `env_indices`.
    ///
    /// Args:
    ///     outputs: Module id -> column -> batched value (one row per row of the module's
    ///         last batch).
    ///     actions_key: The column of the actions the module chose.
    ///     actions_for_env_key: The column of the actions to send to the env (missing:
    ///         the actions).
    ///     extra_constants: Column -> value given to every agent (the weights' sequence
    ///         number).
    ///     extras_as_rows: Give each agent its extra outputs as an `AgentOutputs`, its row
    ///         of its module's arrays, for the multi-agent record to copy
    ///         (`super::outputs`; a module whose outputs are not all C-contiguous arrays
    ///         still gets the dicts).
    ///
    /// Returns:
    ///     Per gathered row, `(actions_for_env, actions, extra_model_outputs)`: agent ->
    ///     action for the env, agent -> action as the module chose it, and agent ->
    ///     {column: value} for every other column (plus `extra_constants`).
    ///
    /// Raises:
    ///     KeyError: If a module's outputs lack `actions_key` or name an unknown module.
    ///     ValueError: If a column's length is not the batch's.
    #[pyo3(signature = (outputs, actions_key="actions", actions_for_env_key="actions_for_env", extra_constants=None, extras_as_rows=false))]
    fn scatter<'py>(
        &self,
        py: Python<'py>,
        outputs: &Bound<'py, PyDict>,
        actions_key: &str,
        actions_for_env_key: &str,
        extra_constants: Option<&Bound<'py, PyDict>>,
        extras_as_rows: bool,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let dicts =
            || -> Vec<Bound<'py, PyDict>> { (0..self.core.rows()).map(|_| PyDict::new(py)).collect() };
        let (env_actions, actions, extras) = (dicts(), dicts(), dicts());
        for (mid, cols) in outputs.iter() {
            let mid = mid.cast_into::<PyString>()?;
            let mid = mid.to_str()?;
            let m =
                self.module(mid, || PyKeyError::new_err(format!("outputs for unknown module {mid:?}")))?;
            let cols = cols.cast_into::<PyDict>()?;
            let Some(action_values) = cols.get_item(actions_key)? else {
                return Err(PyKeyError::new_err(format!(
                    "module {mid:?}'s outputs have no {actions_key:?} column"
                )));
            };
            let rows = if extras_as_rows {
                module_outputs(&cols, actions_key, actions_for_env_key, extra_constants)?
            } else {
                None
            };
            // The columns each agent takes a row of, every one checked first.
            let mut columns = Vec::with_capacity(cols.len());
            for (col, value) in cols.iter() {
                let name = col.cast::<PyString>()?.to_str()?;
                self.core.check_output(m, name, batch_len(&value)?).map_err(value_error)?;
                let same = value.is(&action_values);
                if let Some(role) =
                    OutputRole::of(name, actions_key, actions_for_env_key, same, rows.is_some())
                {
                    columns.push((role, col, value));
                }
            }
            let env_from_actions = OutputRole::env_from_actions(columns.iter().map(|(role, ..)| *role));
            // What each agent gets besides its dict's column values: its row of the
            // outputs, or the constants merged into that dict.
            let rows = rows.filter(|o| !o.columns.is_empty() || o.constants.is_some());
            for (env, agents) in self.core.plan(m).into_iter().enumerate() {
                for (row, aid) in agents {
                    let aid = aid.bind(py);
                    for (role, col, value) in &columns {
                        let v = row_object(value, row)?;
                        match role {
                            OutputRole::Actions => {
                                actions[env].set_item(aid, &v)?;
                                if env_from_actions {
                                    env_actions[env].set_item(aid, &v)?;
                                }
                            }
                            OutputRole::ActionsForEnv => env_actions[env].set_item(aid, &v)?,
                            OutputRole::Extra => agent_dict(&extras[env], aid)?.set_item(col, v)?,
                        }
                    }
                    match (&rows, extra_constants) {
                        (Some(o), _) => extras[env].set_item(aid, AgentOutputsPy::new(Arc::clone(o), row))?,
                        (None, Some(c)) => agent_dict(&extras[env], aid)?.update(c.as_mapping())?,
                        (None, None) => {}
                    }
                }
            }
        }
        env_actions
            .into_iter()
            .zip(actions)
            .zip(extras)
            .map(|((e, a), x)| PyTuple::new(py, [e.into_any(), a.into_any(), x.into_any()]))
            .collect()
    }
}
