//! Reads: RLlib's read plan (`crate::episode::read`) carried out on a field, the items
//! and fills turned into Python values, lists and numpy batches.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::writes::prepare;
use super::{empty_info, to_object, FieldName, PyField, SingleAgentEpisodePy};
use crate::column::{Column, Pos, Resolved};
use crate::episode::read::{self, BatchFill, FillSpec, Form, LeafDtype, ReadArgs, ReadError, ReadPlan};
use crate::episode::{EpisodeError, Field, Storage};
use crate::py::errors::index_error;
use crate::py::index::to_index;
use crate::py::spec::{self, Spec};

/// A read's arguments from Python (`fill`: `None` taken out already).
pub(super) fn read_args(
    indices: Option<&Bound<'_, PyAny>>,
    neg_index_as_lookback: bool,
    fill: Option<&Bound<'_, PyAny>>,
    one_hot: bool,
) -> PyResult<ReadArgs> {
    Ok(ReadArgs { index: to_index(indices)?, neg_index_as_lookback, fill: fill.is_some(), one_hot })
}

pub(super) fn read_error(e: &ReadError) -> PyErr {
    match e {
        ReadError::Index(i) => index_error(i),
        _ => PyValueError::new_err(e.to_string()),
    }
}

impl SingleAgentEpisodePy {
    /// RLlib's plan for a read of `f` (a field of this episode, or a view of one).
    pub(super) fn plan_read(&self, name: FieldName<'_>, f: &PyField, args: &ReadArgs) -> PyResult<ReadPlan> {
        read::plan(f, name, self.core.rewards_fill_f32, args).map_err(|e| read_error(&e))
    }

    /// The view of field `name` that `_get_ext` reads: [`crate::episode::SingleAgentCore::view`]
    /// with `add_last` appended.
    fn view(
        &self,
        py: Python<'_>,
        name: FieldName<'_>,
        add_last: Option<&Bound<'_, PyAny>>,
        ignore_last: bool,
    ) -> PyResult<PyField> {
        let mut view = self.core.view(name, ignore_last).ok_or(EpisodeError::MissingKey(name.label()))?;
        if let Some(value) = add_last {
            let item = prepare(value, &view, name)?;
            if !view.push(item, |t| to_object(py, t)) {
                return Err(EpisodeError::DoesNotFit { field: name.label() }.into());
            }
        }
        Ok(view)
    }

    /// Reads field `name` of this episode with RLlib's index semantics (no infos: those
    /// are made when first read, see [`Self::read`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn get<'py>(
        &self,
        py: Python<'py>,
        name: FieldName<'_>,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
        one_hot_discrete: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fill = fill.filter(|f| !f.is_none());
        let f = self.field(name)?;
        let plan =
            self.plan_read(name, f, &read_args(indices, neg_index_as_lookback, fill, one_hot_discrete)?)?;
        Self::execute(py, f, &plan, fill)
    }

    /// Carries out `plan` on `f`: its items (and `fill`) as Python values.
    pub(super) fn execute<'py>(
        py: Python<'py>,
        f: &PyField,
        plan: &ReadPlan,
        fill: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let rewards_f32 = (plan.fill_spec == FillSpec::RewardsF32).then(|| spec::f32_scalar(py));
        let fill_spec = match plan.fill_spec {
            FillSpec::Own => f.spec(),
            FillSpec::RewardsF32 => rewards_f32.as_deref(),
            FillSpec::Raw => None,
        };
        let fill_value = || fill.ok_or_else(|| PyValueError::new_err("internal error: fill"));
        let fill_item = || -> PyResult<Bound<'py, PyAny>> {
            match fill_spec {
                Some(s) => spec::fill_item(py, s, fill_value()?, plan.one_hot),
                None => Ok(fill_value()?.clone()),
            }
        };
        if let Storage::Typed { column, .. } = &f.storage {
            let spec =
                f.spec().ok_or_else(|| PyValueError::new_err("internal error: typed field without spec"))?;
            let item = |p: &Pos| match p {
                Pos::At(p) => spec::item(py, spec, column, *p, plan.host_scalars, plan.one_hot),
                Pos::Fill => fill_item(),
            };
            return match (&plan.positions, &plan.form) {
                (Resolved::One(p), _) => item(p),
                (Resolved::Many(positions), Form::Batch(rule)) => {
                    batch(py, spec, column, positions, plan.one_hot, rule, fill, fill_spec)
                }
                (Resolved::Many(positions), _) => {
                    Ok(PyList::new(py, positions.iter().map(item).collect::<PyResult<Vec<_>>>()?)?.into_any())
                }
            };
        }
        let object_at = |p: &Pos| -> PyResult<Bound<'py, PyAny>> {
            match (p, &f.storage) {
                (Pos::At(p), Storage::Objects { items, .. }) => Ok(items[*p].0.bind(py).clone()),
                (Pos::At(p), Storage::Sparse { .. }) => match f.object(*p) {
                    Some(o) => Ok(o.0.bind(py).clone()),
                    // Reads of this episode's infos made them first; a view's absent
                    // item is a fresh empty dict, as RLlib's would be.
                    None => Ok(empty_info(py).0.into_bound(py)),
                },
                (Pos::Fill, _) => fill_item(),
                _ => Err(PyValueError::new_err("internal error: position in an empty field")),
            }
        };
        let positions = match &plan.positions {
            Resolved::One(p) => return object_at(p),
            Resolved::Many(positions) => positions,
        };
        match plan.form {
            Form::EmptyList => Ok(PyList::empty(py).into_any()),
            Form::ObjectArray => {
                let items = positions.iter().map(object_at).collect::<PyResult<Vec<_>>>()?;
                spec::numpy(py)?.getattr("array")?.call1((items,))
            }
            _ => {
                Ok(PyList::new(py, positions.iter().map(object_at).collect::<PyResult<Vec<_>>>()?)?
                    .into_any())
            }
        }
    }

    /// Field `name`; a missing extra model output key is `empty` where one is given.
    fn field_or<'a>(&'a self, name: FieldName<'_>, empty: Option<&'a PyField>) -> PyResult<&'a PyField> {
        match (name, empty) {
            (FieldName::Extra(k), Some(e)) => Ok(self.core.extra(k).unwrap_or(e)),
            _ => self.field(name),
        }
    }

    /// The last stored observation and infos (for an agent terminated right after acting).
    pub fn last_observation_and_infos<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let minus_one = (-1i64).into_pyobject(py)?.into_any();
        let obs = self.get(py, FieldName::Observations, Some(&minus_one), false, None, false)?;
        let infos = self.read(py, FieldName::Infos, Some(&minus_one), false, None, false, None)?;
        Ok((obs, infos))
    }

    /// Reads field `name` (`_get`), or with `ext` = `(add_last, ignore_last)` the view of it
    /// that `_get_ext` reads, in which a missing extra model output key is an empty field.
    /// The absent infos the read returns are made in this episode first, so that later
    /// reads hand out the same dicts.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read<'py>(
        &mut self,
        py: Python<'py>,
        name: FieldName<'_>,
        indices: Option<&Bound<'py, PyAny>>,
        neg_index_as_lookback: bool,
        fill: Option<&Bound<'py, PyAny>>,
        one_hot_discrete: bool,
        ext: Option<(Option<&Bound<'py, PyAny>>, bool)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fill = fill.filter(|f| !f.is_none());
        let args = read_args(indices, neg_index_as_lookback, fill, one_hot_discrete)?;
        let (add_last, ignore_last) = ext.map_or((None, false), |(a, i)| (a.filter(|v| !v.is_none()), i));
        let view = |this: &Self| -> PyResult<Option<PyField>> {
            (add_last.is_some() || ignore_last)
                .then(|| this.view(py, name, add_last, ignore_last))
                .transpose()
        };
        let untyped = Field::untyped();
        let empty = ext.map(|_| &untyped);
        let mut viewed = view(self)?;
        let plan =
            self.plan_read(name, viewed.as_ref().map_or_else(|| self.field_or(name, empty), Ok)?, &args)?;
        if self.core.share_read_infos(name, &plan, || empty_info(py)) && viewed.is_some() {
            viewed = view(self)?;
        }
        Self::execute(py, viewed.as_ref().map_or_else(|| self.field_or(name, empty), Ok)?, &plan, fill)
    }
}

/// A batch of typed items with fill rows as `rule` says (see [`read::BatchFill`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn batch<'py>(
    py: Python<'py>,
    spec: &Spec,
    column: &Column,
    positions: &[Pos],
    one_hot: bool,
    rule: &BatchFill,
    fill: Option<&Bound<'py, PyAny>>,
    fill_spec: Option<&Spec>,
) -> PyResult<Bound<'py, PyAny>> {
    let fill = || fill.ok_or_else(|| PyValueError::new_err("internal error: fill"));
    match rule {
        BatchFill::None => spec::batch(py, spec, column, positions, None, one_hot),
        BatchFill::Cast => {
            let bytes = spec::fill_leaves(py, spec, fill()?, one_hot)?;
            spec::batch(py, spec, column, positions, Some(&bytes), one_hot)
        }
        BatchFill::FillOnly => {
            let fills = PyList::new(py, std::iter::repeat_n(fill()?, positions.len()))?;
            spec::numpy(py)?.getattr("array")?.call1((fills,))
        }
        BatchFill::Promote { dtypes, rows } => {
            let np = spec::numpy(py)?;
            let fill = fill()?;
            let mut leaves = Vec::with_capacity(spec.schema.leaves.len());
            for (i, leaf) in spec.schema.leaves.iter().enumerate() {
                let mut shape = vec![positions.len()];
                shape.extend_from_slice(&leaf.shape);
                let descr = spec.descrs[i].bind(py);
                let mut array = spec::new_array_with(py, descr, &shape, |buf| {
                    column.gather_into(i, positions, None, false, buf)
                })?;
                let fill_dtype = match fill_spec.and_then(|s| s.descrs.get(i)) {
                    Some(d) => d.bind(py).clone().into_any(),
                    None => np.getattr("asarray")?.call1((fill,))?.getattr("dtype")?,
                };
                let out = match dtypes.get(i) {
                    Some(LeafDtype::Fill) => fill_dtype,
                    Some(LeafDtype::Stored) | None => descr.clone().into_any(),
                    Some(LeafDtype::Promoted) => np.getattr("result_type")?.call1((descr, fill_dtype))?,
                };
                if !out.eq(descr)? {
                    array = array.call_method1("astype", (out,))?;
                }
                array.set_item(PyList::new(py, rows)?, fill)?;
                leaves.push(Some(array));
            }
            spec::nest(py, &spec.tree, &mut leaves)
        }
    }
}
