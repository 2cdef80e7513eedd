//! `MetricsStorePy`: the native part of `fastrollout.MetricsLogger`, and `StatsSnapshotPy`,
//! what its `reduce()` returns and `aggregate()` takes. The rules (option resolution,
//! reductions, aggregation, throughputs, state layout, a snapshot's number, arithmetic and
//! comparisons, which values wait to be converted) are the core's (`crate::metrics`); this
//! module converts Python values and maps errors.
//!
//! `log_value` is the hot call: a key seen before is found through a dict keyed by the
//! Python key object itself (one hash of an already-hashed str), so logging a float is one
//! dict lookup, one mutex lock and an O(1) push, with no allocation.
//!
//! Thread safety: the store sits behind a `std::sync::Mutex`, always taken with
//! `lock_py_attached` (which detaches from the interpreter while it waits), so a thread
//! that holds the lock and calls into Python (a tensor's `__float__`, a key's `__hash__`)
//! cannot deadlock with one waiting for it.

use std::ffi::CString;
use std::sync::Mutex;

use pyo3::exceptions::{PyDeprecationWarning, PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::sync::MutexExt;
use pyo3::types::{IntoPyDict, PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::object::PyObj;
use crate::metrics::store::{key_repr, Found};
use crate::metrics::{
    check_key, now, Arith, Compare, Comparison, Config, Deferred, DeprecatedOptions, FieldSource, FieldValue,
    KeyPart, MetricsError, Options, Peeked, PercentileKey, PercentilesArg, Reduce, Snapshot, Stat, StatState,
    StateField, Store, Throughput, Tree, Value, WindowArg,
};

type PyStat = Stat<PyObj>;

impl From<MetricsError> for PyErr {
    fn from(e: MetricsError) -> PyErr {
        match e {
            MetricsError::Value(m) => PyValueError::new_err(m),
            MetricsError::Key(m) => PyKeyError::new_err(m),
            MetricsError::Type(m) => PyTypeError::new_err(m),
        }
    }
}

/// Flattens a key (str, int, or nested tuples/lists of them) into a key path.
fn key_path(key: &Bound<'_, PyAny>) -> PyResult<Vec<KeyPart>> {
    fn walk(k: &Bound<'_, PyAny>, out: &mut Vec<KeyPart>) -> PyResult<()> {
        if let Ok(s) = k.cast::<PyString>() {
            out.push(KeyPart::Str(s.to_str()?.to_owned()));
        } else if k.is_instance_of::<PyInt>() {
            out.push(KeyPart::Int(k.extract::<i64>()?));
        } else if k.is_instance_of::<PyTuple>() || k.is_instance_of::<PyList>() {
            for p in k.try_iter()? {
                walk(&p?, out)?;
            }
        } else {
            return Err(PyTypeError::new_err(format!(
                "metric keys are str, int or tuples of them, got {}",
                k.get_type().name()?
            )));
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(key, &mut out)?;
    check_key(&out)?;
    Ok(out)
}

/// The key path of an optional key (`None`: the whole tree).
fn opt_key_path(key: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<KeyPart>> {
    match key {
        Some(k) if !k.is_none() => key_path(k),
        _ => Ok(Vec::new()),
    }
}

fn key_part_py<'py>(py: Python<'py>, k: &KeyPart) -> PyResult<Bound<'py, PyAny>> {
    Ok(match k {
        KeyPart::Str(s) => PyString::new(py, s).into_any(),
        KeyPart::Int(i) => i.into_pyobject(py)?.into_any(),
    })
}

fn key_tuple<'py>(py: Python<'py>, path: &[KeyPart]) -> PyResult<Bound<'py, PyTuple>> {
    let parts: Vec<Bound<'py, PyAny>> = path.iter().map(|k| key_part_py(py, k)).collect::<PyResult<_>>()?;
    PyTuple::new(py, parts)
}

/// A tree of values as nested dicts, with `leaf` converting each value.
fn tree_py<'py, R>(
    py: Python<'py>,
    tree: Tree<R>,
    leaf: &mut impl FnMut(R) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    match tree {
        Tree::Leaf(r) => leaf(r),
        Tree::Branch(children) => {
            let d = PyDict::new(py);
            for (k, t) in children {
                d.set_item(key_part_py(py, &k)?, tree_py(py, t, leaf)?)?;
            }
            Ok(d.into_any())
        }
    }
}

/// `log_value`'s options as Python objects; converted only when a stat is created.
struct RawOptions<'a, 'py> {
    reduce: Option<&'a Bound<'py, PyAny>>,
    window: Option<&'a Bound<'py, PyAny>>,
    ema_coeff: Option<&'a Bound<'py, PyAny>>,
    percentiles: Option<&'a Bound<'py, PyAny>>,
    clear_on_reduce: Option<&'a Bound<'py, PyAny>>,
    with_throughput: Option<&'a Bound<'py, PyAny>>,
}

fn given<'a, 'py>(o: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
    o.filter(|v| !v.is_none())
}

impl RawOptions<'_, '_> {
    fn resolve(&self) -> PyResult<Config> {
        let reduce = given(self.reduce)
            .map(PyAnyMethods::extract::<String>)
            .transpose()
            .map_err(|_| PyTypeError::new_err("reduce must be a str naming the reduction method"))?;
        let window = given(self.window).map(window_arg).transpose()?;
        let ema_coeff = given(self.ema_coeff).map(PyAnyMethods::extract::<f64>).transpose()?;
        let percentiles = given(self.percentiles).map(percentiles_arg).transpose()?;
        let flag = |o: Option<&Bound<'_, PyAny>>| given(o).map(PyAnyMethods::is_truthy).transpose();
        Ok(Config::resolve(&Options {
            reduce,
            window,
            ema_coeff,
            percentiles,
            with_throughput: flag(self.with_throughput)?,
            clear_on_reduce: flag(self.clear_on_reduce)?,
        })?)
    }
}

/// The `window` argument as given (a bool stays one: the core rejects it).
fn window_arg(w: &Bound<'_, PyAny>) -> PyResult<WindowArg> {
    if let Ok(b) = w.cast::<PyBool>() {
        Ok(WindowArg::Bool(b.is_true()))
    } else if let Ok(i) = w.extract::<i64>() {
        Ok(WindowArg::Int(i))
    } else if let Ok(f) = w.extract::<f64>() {
        Ok(WindowArg::Float(f))
    } else {
        Err(PyTypeError::new_err(format!("window must be an int, got {}", w.get_type().name()?)))
    }
}

/// The `percentiles` argument as given: a bool, or a list of numbers.
fn percentiles_arg(p: &Bound<'_, PyAny>) -> PyResult<PercentilesArg> {
    if let Ok(b) = p.cast::<PyBool>() {
        return Ok(PercentilesArg::Bool(b.is_true()));
    }
    p.extract::<Vec<f64>>()
        .map(PercentilesArg::List)
        .map_err(|_| PyTypeError::new_err("percentiles must be a list of numbers in [0, 100] or True"))
}

fn is_torch_tensor(v: &Bound<'_, PyAny>) -> bool {
    v.get_type().module().is_ok_and(|m| m.to_str().is_ok_and(|m| m == "torch" || m.starts_with("torch.")))
}

/// A value for a number-valued stat: floats and ints directly, anything else (numpy
/// scalars, one-element torch tensors on any device) through `__float__`.
fn number(key: &Bound<'_, PyAny>, v: &Bound<'_, PyAny>) -> PyResult<f64> {
    if let Ok(f) = v.cast_exact::<PyFloat>() {
        return Ok(f.value());
    }
    v.extract::<f64>().map_err(|e| {
        PyTypeError::new_err(format!(
            "log_value({}): the value must be a number (a float, int, numpy scalar or \
             one-element tensor), got {}: {e}",
            key.repr().map_or_else(|_| "?".into(), |r| r.to_string()),
            v.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string()),
        ))
    })
}

/// An item for `reduce="item"` (tensors become Python numbers, as RLlib does on push) or
/// `"item_series"` (tensors become Python numbers or lists, as RLlib does on read).
fn item(v: &Bound<'_, PyAny>, reduce: Reduce) -> PyResult<PyObj> {
    if is_torch_tensor(v) {
        let cpu = v.call_method0("detach")?.call_method0("cpu")?;
        let method = if reduce == Reduce::Item { "item" } else { "tolist" };
        return Ok(PyObj(cpu.call_method0(method)?.unbind()));
    }
    Ok(PyObj(v.clone().unbind()))
}

/// `value` as what a stat of `reduce` logs: a number, or an item.
fn loggable(reduce: Reduce, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<Value<PyObj>> {
    Ok(if reduce.is_numeric() {
        Value::Number(number(key, value)?)
    } else {
        Value::Item(item(value, reduce)?)
    })
}

fn vanished() -> PyErr {
    PyKeyError::new_err("metric key vanished while logging")
}

fn peeked_py<'py>(py: Python<'py>, p: Peeked<'_, PyObj>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match p {
        Peeked::Float(v) => PyFloat::new(py, v).into_any(),
        Peeked::Floats(vs) => PyList::new(py, vs)?.into_any(),
        Peeked::Percentiles(pairs) => {
            let d = PyDict::new(py);
            for (p, v) in pairs {
                d.set_item(percentile_key(py, p)?, v)?;
            }
            d.into_any()
        }
        Peeked::Item(i) => obj_or_none(py, i),
        Peeked::ItemList(i) => PyList::new(py, [obj_or_none(py, i)])?.into_any(),
        Peeked::Items(items) => objs_list(py, items)?.into_any(),
    })
}

fn objs_list<'py, 'a>(
    py: Python<'py>,
    objs: impl IntoIterator<Item = &'a PyObj>,
) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, objs.into_iter().map(|o| o.0.bind(py)))
}

fn obj_or_none<'py>(py: Python<'py>, o: Option<&PyObj>) -> Bound<'py, PyAny> {
    o.map_or_else(|| py.None().into_bound(py), |o| o.0.bind(py).clone())
}

/// A percentile's key in a compiled peek: an int or a float, as the core says.
fn percentile_key(py: Python<'_>, p: f64) -> PyResult<Bound<'_, PyAny>> {
    Ok(match PercentileKey::of(p) {
        PercentileKey::Int(i) => i.into_pyobject(py)?.into_any(),
        PercentileKey::Float(f) => PyFloat::new(py, f).into_any(),
    })
}

/// A state as a dict of its named fields (the layout is the core's `StatState::to_fields`).
fn state_dict<'py>(
    py: Python<'py>,
    fields: Vec<(&str, FieldValue<'_, PyObj>)>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, v) in fields {
        match v {
            FieldValue::Str(s) => d.set_item(name, s),
            FieldValue::Window(w) => d.set_item(name, w),
            FieldValue::Float(f) => d.set_item(name, f),
            FieldValue::Floats(fs) => d.set_item(name, fs),
            FieldValue::Flag(b) => d.set_item(name, b),
            FieldValue::Merged(m) => d.set_item(name, m),
            FieldValue::Item(i) => d.set_item(name, obj_or_none(py, i)),
            FieldValue::Items(items) => d.set_item(name, objs_list(py, items)?),
        }?;
    }
    Ok(d)
}

/// A state's dict (see `state_dict`), read field by field by `StatState::from_fields`.
struct StateDict<'a, 'py>(&'a Bound<'py, PyDict>);

impl StateDict<'_, '_> {
    fn req(&self, k: &str) -> PyResult<Bound<'_, PyAny>> {
        self.0.get_item(k)?.ok_or_else(|| PyKeyError::new_err(format!("state is missing {k:?}")))
    }
}

impl FieldSource<PyObj> for StateDict<'_, '_> {
    type Error = PyErr;
    fn str(&self, name: &'static str) -> PyResult<String> {
        self.req(name)?.extract()
    }
    fn window(&self, name: &'static str) -> PyResult<Option<usize>> {
        self.req(name)?.extract()
    }
    fn float(&self, name: &'static str) -> PyResult<f64> {
        self.req(name)?.extract()
    }
    fn floats(&self, name: &'static str) -> PyResult<Vec<f64>> {
        self.req(name)?.extract()
    }
    fn flag(&self, name: &'static str) -> PyResult<bool> {
        self.req(name)?.extract()
    }
    fn merged(&self, name: &'static str) -> PyResult<Option<(f64, f64, f64)>> {
        self.req(name)?.extract()
    }
    fn item(&self, name: &'static str) -> PyResult<Option<PyObj>> {
        let v = self.req(name)?;
        Ok((!v.is_none()).then(|| PyObj(v.unbind())))
    }
    fn items(&self, name: &'static str) -> PyResult<Vec<PyObj>> {
        self.req(name)?.try_iter()?.map(|o| Ok(PyObj(o?.unbind()))).collect()
    }
}

/// What one stat's `reduce()` returned: its configuration and reduced content.
///
/// `MetricsLogger.reduce()` returns a nested dict of these; `aggregate()` merges lists of
/// such dicts. They pickle, so they can cross process (Ray actor) boundaries.
#[pyclass(name = "StatsSnapshot", module = "fastrollout._core", frozen)]
pub struct StatsSnapshotPy(Snapshot<PyObj>);

impl StatsSnapshotPy {
    /// The snapshot as one number, if it is one (an item: if it converts to a float).
    fn number(&self, py: Python<'_>) -> Option<f64> {
        self.0.number(|item| item_number(py, item))
    }

    /// `op` of the two numbers as a float (`reflected`: `other op self`), or
    /// `NotImplemented` unless both are numbers.
    fn arithmetic(&self, other: &Bound<'_, PyAny>, op: Arith, reflected: bool) -> Py<PyAny> {
        let py = other.py();
        match op.of(self.number(py), other_number(other), reflected) {
            Some(v) => PyFloat::new(py, v).into_any().unbind(),
            None => py.NotImplemented(),
        }
    }
}

fn item_number(py: Python<'_>, item: &PyObj) -> Option<f64> {
    item.0.bind(py).extract::<f64>().ok()
}

fn compare(op: CompareOp) -> Compare {
    match op {
        CompareOp::Lt => Compare::Lt,
        CompareOp::Le => Compare::Le,
        CompareOp::Eq => Compare::Eq,
        CompareOp::Ne => Compare::Ne,
        CompareOp::Gt => Compare::Gt,
        CompareOp::Ge => Compare::Ge,
    }
}

/// The number behind `other` in comparisons and arithmetic with a snapshot: another
/// snapshot's number, or what `float()` would give (not for strings); `None` otherwise.
fn other_number(other: &Bound<'_, PyAny>) -> Option<f64> {
    if let Ok(s) = other.cast::<StatsSnapshotPy>() {
        return s.get().number(other.py());
    }
    if other.is_instance_of::<PyString>() {
        return None;
    }
    other.extract::<f64>().ok()
}

#[pymethods]
impl StatsSnapshotPy {
    /// The reduced value, as the stat's `peek` gave it at reduce time.
    #[pyo3(signature = (compile=true))]
    fn peek<'py>(&self, py: Python<'py>, compile: bool) -> PyResult<Bound<'py, PyAny>> {
        peeked_py(py, self.0.peek(compile))
    }

    /// The reduction method (`"mean"`, `"ema"`, ...).
    #[getter]
    fn reduce_method(&self) -> &'static str {
        self.0.config.reduce.name()
    }

    /// The number of logged values behind a mean (its weight when merged), else `None`.
    #[getter]
    fn count(&self) -> Option<f64> {
        self.0.payload.count()
    }

    /// The reduced value (`compile=True`), as `MetricsLogger.reduce(compile=True)` gives
    /// it; `compile=False` returns the snapshot itself (snapshots are immutable).
    #[pyo3(signature = (compile=true))]
    fn reduce<'py>(slf: &Bound<'py, Self>, compile: bool) -> PyResult<Bound<'py, PyAny>> {
        if !compile {
            return Ok(slf.clone().into_any());
        }
        peeked_py(slf.py(), slf.get().0.compiled())
    }

    fn __float__(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.0.float(|item| item_number(py, item))?)
    }

    fn __int__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.__float__(py)?;
        // int() of the value itself, so an int item stays exact.
        py.get_type::<PyInt>().call1((self.peek(py, true)?,))
    }

    /// Compares by value as RLlib's Stats do (`float(self) < float(other)`); `==` of a
    /// result that is not a number (percentiles, an item series) compares its peeked value.
    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let holds = match compare(op).of(self.number(py), other_number(other)) {
            Comparison::Holds(holds) => holds,
            Comparison::Unsupported => return Ok(py.NotImplemented()),
            Comparison::ByValue { equal } => {
                let theirs = match other.cast::<StatsSnapshotPy>() {
                    Ok(s) => s.get().peek(py, true)?,
                    Err(_) => other.clone(),
                };
                self.peek(py, true)?.eq(theirs)? == equal
            }
        };
        Ok(PyBool::new(py, holds).to_owned().into_any().unbind())
    }

    fn __add__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, Arith::Add, false)
    }

    fn __radd__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, Arith::Add, true)
    }

    fn __sub__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, Arith::Sub, false)
    }

    fn __rsub__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, Arith::Sub, true)
    }

    fn __mul__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, Arith::Mul, false)
    }

    fn __rmul__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, Arith::Mul, true)
    }

    /// Formats the number as a float (as RLlib's Stats do), anything else as its value.
    fn __format__<'py>(&self, py: Python<'py>, spec: &str) -> PyResult<Bound<'py, PyAny>> {
        let value = match self.number(py) {
            Some(v) => PyFloat::new(py, v).into_any(),
            None => self.peek(py, true)?,
        };
        value.call_method1("__format__", (spec,))
    }

    /// The number of values held, as `len()` of RLlib's reduced Stats gives it.
    fn __len__(&self) -> usize {
        self.0.payload.rllib_len()
    }

    /// The peeked value as a numpy array (so `numpy.testing` and RLlib's `check` read it).
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(false) {
            return Err(PyValueError::new_err(
                "a StatsSnapshot always converts into a new array (copy=False is not possible)",
            ));
        }
        py.import("numpy")?.getattr("asarray")?.call1((self.peek(py, true)?, dtype))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "StatsSnapshot(reduce='{}', value={})",
            self.reduce_method(),
            self.peek(py, true)?.repr()?
        ))
    }

    /// The snapshot as a dict of plain Python values.
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        state_dict(py, self.0.to_state().to_fields(StateField::of_snapshot(self.0.config.reduce)))
    }

    /// A snapshot from `get_state()`'s dict.
    #[staticmethod]
    fn from_state(state: &Bound<'_, PyDict>) -> PyResult<StatsSnapshotPy> {
        let st = StatState::from_fields(&StateDict(state), StateField::of_snapshot)?;
        Ok(StatsSnapshotPy(Snapshot::from_state(st)))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyDict>,))> {
        let py = slf.py();
        let ctor = slf.get_type().getattr("from_state")?;
        Ok((ctor, (slf.get().get_state(py)?,)))
    }
}

struct Inner {
    store: Store<PyObj>,
    /// Python key object -> slab slot of a stat, for keys seen before.
    cache: Py<PyDict>,
    /// Torch tensors logged to stats that defer numbers, not read yet. They stay where they
    /// are (a GPU tensor on its GPU, as RLlib keeps them) and reach the host in one
    /// `stack(...).cpu()` per stat at the next read, instead of one device sync per value.
    pending: Deferred<PyObj>,
}

/// The values of one-element tensors, moved to the host in one transfer when they allow
/// it (same device and dtype kind), one by one otherwise.
fn host_values(py: Python<'_>, tensors: &[PyObj]) -> PyResult<Vec<f64>> {
    let batched = || -> PyResult<Vec<f64>> {
        let list = PyList::new(py, tensors.iter().map(|t| t.0.bind(py)))?;
        py.import("torch")?
            .call_method1("stack", (list,))?
            .call_method1("reshape", (-1,))?
            .call_method0("cpu")?
            .call_method0("tolist")?
            .extract()
    };
    match batched() {
        Ok(v) if v.len() == tensors.len() => Ok(v),
        _ => tensors.iter().map(|t| t.0.bind(py).extract::<f64>()).collect(),
    }
}

impl Inner {
    fn forget_keys(&mut self, py: Python<'_>) {
        self.cache.bind(py).clear();
    }

    /// Pushes the pending tensors of every stat (`slot: None`) or of one.
    fn flush(&mut self, py: Python<'_>, slot: Option<usize>) -> PyResult<()> {
        // The usual case, kept apart from the conversion so that `log_value` stays cheap.
        if self.pending.is_empty() {
            return Ok(());
        }
        self.flush_pending(py, slot)
    }

    #[inline(never)]
    fn flush_pending(&mut self, py: Python<'_>, slot: Option<usize>) -> PyResult<()> {
        for (s, tensors) in self.pending.take(slot) {
            self.store.push_numbers(s, &host_values(py, &tensors)?)?;
        }
        Ok(())
    }

    /// `log_value`'s push into the stat in `slot`.
    fn push(
        &mut self,
        py: Python<'_>,
        slot: usize,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        garbage: &mut Vec<PyObj>,
    ) -> PyResult<()> {
        let stat = self.store.get(slot).ok_or_else(vanished)?;
        if stat.defers_numbers() && !value.is_exact_instance_of::<PyFloat>() && is_torch_tensor(value) {
            if value.call_method0("numel")?.extract::<usize>()? != 1 {
                // Raises the error that names the key and the value.
                number(key, value)?;
            }
            self.pending.push(slot, PyObj(value.call_method0("detach")?.unbind()));
            return Ok(());
        }
        self.flush(py, Some(slot))?;
        let stat = self.store.get_mut(slot).ok_or_else(vanished)?;
        if let Err(e) = stat.check_leaf() {
            return Err(PyValueError::new_err(format!("cannot log values to {}: {e}", key.repr()?)));
        }
        garbage.extend(stat.push_value(loggable(stat.reduce_kind(), key, value)?)?);
        Ok(())
    }
}

/// The native store behind `fastrollout.MetricsLogger` (which subclasses it).
#[pyclass(name = "MetricsStore", module = "fastrollout._core", subclass, frozen)]
pub struct MetricsStorePy {
    inner: Mutex<Inner>,
    root: bool,
    created: f64,
}

impl MetricsStorePy {
    fn lock(&self, py: Python<'_>) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a stat half-updated in a way that
        // matters more than losing the logger, so a poisoned lock is simply taken over.
        self.inner.lock_py_attached(py).unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The slot of the stat under `key`, created from `opts` when missing.
    fn slot(
        &self,
        py: Python<'_>,
        g: &mut Inner,
        key: &Bound<'_, PyAny>,
        opts: &RawOptions<'_, '_>,
    ) -> PyResult<usize> {
        let cache = g.cache.bind(py);
        if let Ok(Some(slot)) = cache.get_item(key) {
            return slot.extract();
        }
        let path = key_path(key)?;
        let make = || Ok::<_, PyErr>(Stat::new(opts.resolve()?, self.root, true, now()));
        let slot = g.store.slot_or_insert(&path, make)?;
        // Unhashable keys (lists) are resolved each time.
        let _ = cache.set_item(key, slot);
        Ok(slot)
    }

    /// Applies `f` to the stat at `key` (or every stat under it, as a nested dict; all
    /// stats for `key=None`). `Ok(None)`: nothing there.
    fn map_key<'py>(
        &self,
        py: Python<'py>,
        key: Option<&Bound<'py, PyAny>>,
        f: impl FnMut(&mut PyStat) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut g = self.lock(py);
        g.flush(py, None)?;
        let tree = g.store.map(&opt_key_path(key)?, f)?;
        drop(g);
        tree.map(|t| tree_py(py, t, &mut Ok)).transpose()
    }
}

fn collect_snapshots<'py>(
    d: &Bound<'py, PyAny>,
    prefix: &mut Vec<KeyPart>,
    out: &mut Vec<(Vec<KeyPart>, Bound<'py, StatsSnapshotPy>)>,
) -> PyResult<()> {
    if let Ok(s) = d.cast::<StatsSnapshotPy>() {
        out.push((prefix.clone(), s.clone()));
        return Ok(());
    }
    let Ok(dict) = d.cast::<PyDict>() else {
        return Err(PyTypeError::new_err(format!(
            "aggregate() takes the dicts that MetricsLogger.reduce() returns; found a {} under \
             key {}",
            d.get_type().name()?,
            key_repr(prefix)
        )));
    };
    for (k, v) in dict.iter() {
        let n = prefix.len();
        prefix.extend(key_path(&k)?);
        collect_snapshots(&v, prefix, out)?;
        prefix.truncate(n);
    }
    Ok(())
}

#[pymethods]
impl MetricsStorePy {
    #[new]
    #[pyo3(signature = (root=false))]
    fn new(py: Python<'_>, root: bool) -> MetricsStorePy {
        MetricsStorePy {
            inner: Mutex::new(Inner {
                store: Store::default(),
                cache: PyDict::new(py).unbind(),
                pending: Deferred::default(),
            }),
            root,
            created: now(),
        }
    }

    /// Whether this is a root logger (lifetime sums are never reset on reduce).
    #[getter]
    fn _is_root_logger(&self) -> bool {
        self.root
    }

    /// Logs `value` under `key`, creating the stat with the given options if it is new.
    ///
    /// The options only matter when the key is new (as in RLlib); for an existing key the
    /// value is pushed into the stat as it was configured.
    #[pyo3(signature = (
        key, value, *, reduce=None, window=None, ema_coeff=None, percentiles=None,
        clear_on_reduce=None, with_throughput=None, throughput_ema_coeff=None,
        reduce_per_index_on_aggregate=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn log_value(
        slf: &Bound<'_, Self>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        reduce: Option<&Bound<'_, PyAny>>,
        window: Option<&Bound<'_, PyAny>>,
        ema_coeff: Option<&Bound<'_, PyAny>>,
        percentiles: Option<&Bound<'_, PyAny>>,
        clear_on_reduce: Option<&Bound<'_, PyAny>>,
        with_throughput: Option<&Bound<'_, PyAny>>,
        throughput_ema_coeff: Option<&Bound<'_, PyAny>>,
        reduce_per_index_on_aggregate: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        let deprecated = DeprecatedOptions {
            clear_on_reduce: clear_on_reduce.is_some(),
            throughput_ema_coeff: throughput_ema_coeff.is_some(),
            reduce_per_index_on_aggregate: reduce_per_index_on_aggregate.is_some(),
        };
        for msg in deprecated.warnings()? {
            PyErr::warn(py, &py.get_type::<PyDeprecationWarning>(), &CString::new(msg)?, 2)?;
        }
        let this = slf.get();
        let opts = RawOptions { reduce, window, ema_coeff, percentiles, clear_on_reduce, with_throughput };
        let mut garbage = Vec::new();
        {
            let mut g = this.lock(py);
            let slot = this.slot(py, &mut g, key, &opts)?;
            g.push(py, slot, key, value, &mut garbage)?;
        }
        // Replaced items are released after unlocking: their destructors may run Python.
        drop(garbage);
        Ok(())
    }

    /// Creates the stat under `key` if it is missing (`log_time`); returns its reduction.
    #[pyo3(signature = (key, *, reduce=None, window=None, ema_coeff=None, percentiles=None, with_throughput=None))]
    #[allow(clippy::too_many_arguments)]
    fn _ensure(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        reduce: Option<&Bound<'_, PyAny>>,
        window: Option<&Bound<'_, PyAny>>,
        ema_coeff: Option<&Bound<'_, PyAny>>,
        percentiles: Option<&Bound<'_, PyAny>>,
        with_throughput: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<&'static str> {
        let opts =
            RawOptions { reduce, window, ema_coeff, percentiles, clear_on_reduce: None, with_throughput };
        let mut g = self.lock(py);
        let slot = self.slot(py, &mut g, key, &opts)?;
        Ok(g.store.get(slot).map_or("", |s| s.reduce_kind().name()))
    }

    /// Replaces what is logged under `key` by `value` alone (creating the stat if missing).
    #[pyo3(signature = (key, value, *, reduce=None, window=None, ema_coeff=None, percentiles=None, with_throughput=None))]
    #[allow(clippy::too_many_arguments)]
    fn set_value(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        reduce: Option<&Bound<'_, PyAny>>,
        window: Option<&Bound<'_, PyAny>>,
        ema_coeff: Option<&Bound<'_, PyAny>>,
        percentiles: Option<&Bound<'_, PyAny>>,
        with_throughput: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let opts =
            RawOptions { reduce, window, ema_coeff, percentiles, clear_on_reduce: None, with_throughput };
        let dropped = {
            let mut g = self.lock(py);
            g.flush(py, None)?;
            let slot = self.slot(py, &mut g, key, &opts)?;
            let stat = g.store.get_mut(slot).ok_or_else(vanished)?;
            stat.set_with(|reduce| loggable(reduce, key, value))?
        };
        // Replaced items are released after unlocking: their destructors may run Python.
        drop(dropped);
        Ok(())
    }

    /// Whether `key` holds a stat or a group of stats.
    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let path = key_path(key)?;
        Ok(!matches!(self.lock(py).store.find(&path), Found::Missing))
    }

    /// The peeked value(s) under `key` (`None`: everything); `KeyError` if there is nothing.
    #[pyo3(signature = (key=None, compile=true, latest_merged_only=false))]
    fn _peek<'py>(
        &self,
        py: Python<'py>,
        key: Option<&Bound<'py, PyAny>>,
        compile: bool,
        latest_merged_only: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let out = self.map_key(py, key, |s| peeked_py(py, s.peek(compile, latest_merged_only)?))?;
        out.ok_or_else(|| match key {
            Some(k) => PyKeyError::new_err(k.clone().unbind()),
            None => PyKeyError::new_err("no metrics"),
        })
    }

    /// Reduces every stat; returns the nested dict of snapshots (or of plain values).
    #[pyo3(signature = (compile=false))]
    fn _reduce<'py>(&self, py: Python<'py>, compile: bool) -> PyResult<Bound<'py, PyAny>> {
        let t = now();
        let out = self.map_key(py, None, |s| {
            let snapshot = Snapshot::take(s, t);
            if compile {
                peeked_py(py, snapshot.compiled())
            } else {
                Ok(Bound::new(py, StatsSnapshotPy(snapshot))?.into_any())
            }
        })?;
        Ok(out.unwrap_or_else(|| PyDict::new(py).into_any()))
    }

    /// Merges the results of `reduce()` of n loggers (a list of nested dicts of snapshots)
    /// into aggregating stats under `key` (a prefix) or at the top.
    #[pyo3(signature = (stats_dicts, key=None))]
    fn _aggregate(
        &self,
        py: Python<'_>,
        stats_dicts: &Bound<'_, PyAny>,
        key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let mut prefix = opt_key_path(key)?;
        let mut flat = Vec::new();
        for d in stats_dicts.try_iter()? {
            let d = d?;
            if !d.is_instance_of::<PyDict>() {
                return Err(PyTypeError::new_err(format!(
                    "aggregate() takes a list of dicts returned by MetricsLogger.reduce(), got a \
                     list of {}",
                    d.get_type().name()?
                )));
            }
            collect_snapshots(&d, &mut prefix, &mut flat)?;
        }
        let (paths, snapshots): (Vec<_>, Vec<_>) = flat.into_iter().unzip();
        let incoming = paths.into_iter().zip(snapshots.iter().map(|s| &s.get().0)).collect();
        Ok(self.lock(py).store.aggregate(incoming, self.root, self.created)?)
    }

    /// Throughput(s) under `key` (`None`: all stats tracking one, with `_throughput` added
    /// to their last key part); `None` if there are none.
    #[pyo3(signature = (key=None))]
    fn _throughputs<'py>(
        &self,
        py: Python<'py>,
        key: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let t = now();
        let mut g = self.lock(py);
        g.flush(py, None)?;
        let tree = g.store.throughputs(&opt_key_path(key)?, t)?;
        tree.map(|t| tree_py(py, t, &mut |tp| throughput_py(py, tp))).transpose()
    }

    /// Deletes `key` (a stat or a group); `KeyError` if missing and `key_error`.
    #[pyo3(signature = (key, key_error=true))]
    fn _delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>, key_error: bool) -> PyResult<()> {
        let path = key_path(key)?;
        let removed = {
            let mut g = self.lock(py);
            g.flush(py, None)?;
            g.forget_keys(py);
            g.store.remove(&path)
        };
        // The removed stats are dropped here, after unlocking: destructors may run Python.
        match removed {
            Err(e) if key_error => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Removes every stat.
    fn reset(&self, py: Python<'_>) {
        // Dropped after unlocking: destructors may run Python.
        let removed = {
            let mut g = self.lock(py);
            g.forget_keys(py);
            (g.store.clear(), std::mem::take(&mut g.pending))
        };
        drop(removed);
    }

    /// The state: `{"stats": [(key_tuple, stat_state_dict), ...]}`.
    fn _get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let states = {
            let mut g = self.lock(py);
            g.flush(py, None)?;
            g.store.states()
        };
        let list = PyList::empty(py);
        for (path, st) in &states {
            list.append((key_tuple(py, path)?, state_dict(py, st.to_fields(&StateField::ALL))?))?;
        }
        let d = PyDict::new(py);
        d.set_item("stats", list)?;
        Ok(d)
    }

    /// Replaces all stats by those in `state` (from `_get_state`).
    fn _set_state(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = now();
        let mut states = Vec::new();
        for e in state.get_item("stats")?.try_iter()? {
            let (k, d): (Bound<'_, PyAny>, Bound<'_, PyDict>) = e?.extract()?;
            states.push((key_path(&k)?, StatState::from_fields(&StateDict(&d), StateField::of_stat)?));
        }
        let store = Store::from_states(states, t)?;
        let old = {
            let mut g = self.lock(py);
            g.forget_keys(py);
            (std::mem::replace(&mut g.store, store), std::mem::take(&mut g.pending))
        };
        drop(old);
        Ok(())
    }
}

/// A throughput as `peek(throughput=True)` gives it: a float for a sum, a dict for a
/// lifetime sum.
fn throughput_py(py: Python<'_>, tp: Throughput) -> PyResult<Bound<'_, PyAny>> {
    Ok(match tp {
        Throughput::Sum(v) => PyFloat::new(py, v).into_any(),
        Throughput::Lifetime { .. } => tp.entries().into_py_dict(py)?.into_any(),
    })
}
