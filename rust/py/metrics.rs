//! `MetricsStorePy`: the native part of `fastrollout.MetricsLogger`, and `StatsSnapshotPy`,
//! what its `reduce()` returns and `aggregate()` takes.
//!
//! `log_value` is the hot call: a key seen before is found through a dict keyed by the
//! Python key object itself (one hash of an already-hashed str), so logging a float is one
//! dict lookup, one mutex lock and an O(1) push, with no allocation.
//!
//! Thread safety: the store sits behind a `std::sync::Mutex`, always taken with
//! `lock_py_attached` (which detaches from the interpreter while it waits), so a thread
//! that holds the lock and calls into Python (a tensor's `__float__`, a key's `__hash__`)
//! cannot deadlock with one waiting for it.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use pyo3::exceptions::{PyDeprecationWarning, PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::sync::MutexExt;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::object::PyObj;
use crate::metrics::store::{key_repr, Found};
use crate::metrics::{
    Config, KeyPart, MetricsError, Node, Options, Payload, Peeked, PercentilesArg, Reduce, Stat, StatState,
    Store, Throughput, WindowArg,
};

type PyStat = Stat<PyObj>;

fn metrics_error(e: MetricsError) -> PyErr {
    match e {
        MetricsError::Value(m) => PyValueError::new_err(m),
        MetricsError::Key(m) => PyKeyError::new_err(m),
    }
}

/// Seconds on a monotonic clock (the throughput clock).
fn now() -> f64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Flattens a key (str, int, or nested tuples/lists of them) into a key path.
fn key_path(key: &Bound<'_, PyAny>) -> PyResult<Vec<KeyPart>> {
    fn walk(k: &Bound<'_, PyAny>, out: &mut Vec<KeyPart>) -> PyResult<()> {
        if let Ok(s) = k.cast::<PyString>() {
            out.push(KeyPart::Str(s.to_str()?.to_owned()));
        } else if k.is_instance_of::<PyInt>() {
            out.push(KeyPart::Int(k.extract::<i64>()?));
        } else if let Ok(t) = k.cast::<PyTuple>() {
            for p in t.iter() {
                walk(&p, out)?;
            }
        } else if let Ok(l) = k.cast::<PyList>() {
            for p in l.iter() {
                walk(&p, out)?;
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
    if out.is_empty() {
        return Err(PyValueError::new_err("a metric key must not be empty"));
    }
    Ok(out)
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
        let window = given(self.window)
            .map(|w| {
                if w.is_instance_of::<PyBool>() {
                    Err(PyTypeError::new_err("window must be an int"))
                } else if let Ok(i) = w.extract::<i64>() {
                    Ok(WindowArg::Int(i))
                } else if let Ok(f) = w.extract::<f64>() {
                    Ok(WindowArg::Float(f))
                } else {
                    Err(PyTypeError::new_err(format!("window must be an int, got {}", w.get_type().name()?)))
                }
            })
            .transpose()?;
        let ema_coeff = given(self.ema_coeff).map(PyAnyMethods::extract::<f64>).transpose()?;
        let percentiles = match given(self.percentiles) {
            None => None,
            Some(p) if p.is_instance_of::<PyBool>() => p.is_truthy()?.then_some(PercentilesArg::Default),
            Some(p) => Some(PercentilesArg::List(p.extract::<Vec<f64>>().map_err(|_| {
                PyTypeError::new_err("percentiles must be a list of numbers in [0, 100] or True")
            })?)),
        };
        let flag = |o: Option<&Bound<'_, PyAny>>| given(o).map(PyAnyMethods::is_truthy).transpose();
        Config::resolve(&Options {
            reduce,
            window,
            ema_coeff,
            percentiles,
            with_throughput: flag(self.with_throughput)?,
            clear_on_reduce: flag(self.clear_on_reduce)?,
        })
        .map_err(metrics_error)
    }
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

fn push(
    stat: &mut PyStat,
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    garbage: &mut Vec<PyObj>,
) -> PyResult<()> {
    if !stat.is_leaf() {
        return Err(PyValueError::new_err(format!(
            "cannot log values to {}: the key is filled by aggregate() (log to the loggers \
             that are aggregated instead)",
            key.repr()?
        )));
    }
    let reduce = stat.reduce_kind();
    if reduce.is_numeric() {
        stat.push(number(key, value)?).map_err(metrics_error)
    } else {
        let old = stat.push_item(item(value, reduce)?).map_err(metrics_error)?;
        garbage.extend(old);
        Ok(())
    }
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
        Peeked::Items(items) => PyList::new(py, items.into_iter().map(|o| o.0.bind(py)))?.into_any(),
    })
}

fn obj_or_none<'py>(py: Python<'py>, o: Option<&PyObj>) -> Bound<'py, PyAny> {
    o.map_or_else(|| py.None().into_bound(py), |o| o.0.bind(py).clone())
}

/// Percentile keys as the user wrote them: 50 for 50, 99.9 for 99.9.
fn percentile_key(py: Python<'_>, p: f64) -> PyResult<Bound<'_, PyAny>> {
    if p.fract() == 0.0 {
        Ok((p as i64).into_pyobject(py)?.into_any())
    } else {
        Ok(PyFloat::new(py, p).into_any())
    }
}

fn config_dict<'py>(py: Python<'py>, c: &Config) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("reduce", c.reduce.name())?;
    d.set_item("window", c.window)?;
    d.set_item("ema_coeff", c.ema_coeff)?;
    d.set_item("percentiles", c.percentiles.clone())?;
    d.set_item("with_throughput", c.with_throughput)?;
    Ok(d)
}

fn req<'py>(d: &Bound<'py, PyDict>, k: &str) -> PyResult<Bound<'py, PyAny>> {
    d.get_item(k)?.ok_or_else(|| PyKeyError::new_err(format!("state is missing {k:?}")))
}

fn config_from(d: &Bound<'_, PyDict>) -> PyResult<Config> {
    let name: String = req(d, "reduce")?.extract()?;
    let reduce = Reduce::parse(&name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown reduce '{name}' in state")))?;
    let window: Option<usize> = req(d, "window")?.extract()?;
    if window == Some(0) {
        return Err(PyValueError::new_err("window must be a positive int"));
    }
    Ok(Config {
        reduce,
        window,
        ema_coeff: req(d, "ema_coeff")?.extract()?,
        percentiles: req(d, "percentiles")?.extract()?,
        with_throughput: req(d, "with_throughput")?.extract()?,
    })
}

fn objs(l: &Bound<'_, PyAny>) -> PyResult<Vec<PyObj>> {
    l.try_iter()?.map(|o| Ok(PyObj(o?.unbind()))).collect()
}

fn stat_state_dict<'py>(py: Python<'py>, s: &PyStat) -> PyResult<Bound<'py, PyDict>> {
    let st = s.to_state();
    let d = config_dict(py, &st.config)?;
    d.set_item("is_root", st.is_root)?;
    d.set_item("is_leaf", st.is_leaf)?;
    d.set_item("values", st.values)?;
    d.set_item("value", st.value)?;
    d.set_item("count", st.count)?;
    d.set_item("merged", st.merged)?;
    d.set_item("item", obj_or_none(py, st.item.as_ref()))?;
    d.set_item("items", PyList::new(py, st.items.iter().map(|o| o.0.bind(py)))?)?;
    Ok(d)
}

fn stat_from_state(d: &Bound<'_, PyDict>, t: f64) -> PyResult<PyStat> {
    let item = req(d, "item")?;
    let st = StatState {
        config: config_from(d)?,
        is_root: req(d, "is_root")?.extract()?,
        is_leaf: req(d, "is_leaf")?.extract()?,
        values: req(d, "values")?.extract()?,
        value: req(d, "value")?.extract()?,
        count: req(d, "count")?.extract()?,
        merged: req(d, "merged")?.extract()?,
        item: (!item.is_none()).then(|| PyObj(item.unbind())),
        items: objs(&req(d, "items")?)?,
    };
    Stat::from_state(st, t).map_err(metrics_error)
}

/// What one stat's `reduce()` returned: its configuration and reduced content.
///
/// `MetricsLogger.reduce()` returns a nested dict of these; `aggregate()` merges lists of
/// such dicts. They pickle, so they can cross process (Ray actor) boundaries.
#[pyclass(name = "StatsSnapshot", module = "fastrollout._core", frozen)]
pub struct StatsSnapshotPy {
    /// A stat that holds only the configuration (to peek payloads the way it would).
    shape: PyStat,
    payload: Payload<PyObj>,
}

impl StatsSnapshotPy {
    fn new(shape_of: &PyStat, payload: Payload<PyObj>) -> StatsSnapshotPy {
        let shape = Stat::new(shape_of.config().clone(), shape_of.is_root(), shape_of.is_leaf(), 0.0);
        StatsSnapshotPy { shape, payload }
    }

    /// The snapshot as one number, if it is one (an item: if it converts to a float).
    fn number(&self, py: Python<'_>) -> Option<f64> {
        match &self.payload {
            Payload::Item(Some(item)) => item.0.bind(py).extract::<f64>().ok(),
            p => p.number(),
        }
    }

    fn not_a_number(&self) -> PyErr {
        PyValueError::new_err(format!("a reduce='{}' result is not a single number", self.reduce_method()))
    }

    /// `f(self, other)` as a float, or `NotImplemented` unless both are numbers.
    fn arithmetic(&self, other: &Bound<'_, PyAny>, f: impl Fn(f64, f64) -> f64) -> Py<PyAny> {
        let py = other.py();
        match (self.number(py), other_number(other)) {
            (Some(a), Some(b)) => PyFloat::new(py, f(a, b)).into_any().unbind(),
            _ => py.NotImplemented(),
        }
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

/// `reduce(compile=True)` of a stat whose reduction is `payload`: the compiled peek,
/// except that an item series is its list even when empty.
fn compiled<'py>(py: Python<'py>, shape: &PyStat, payload: &Payload<PyObj>) -> PyResult<Bound<'py, PyAny>> {
    if let Payload::Items(items) = payload {
        return Ok(PyList::new(py, items.iter().map(|o| o.0.bind(py)))?.into_any());
    }
    peeked_py(py, shape.peek_payload(payload, true))
}

#[pymethods]
impl StatsSnapshotPy {
    /// The reduced value, as the stat's `peek` gave it at reduce time.
    #[pyo3(signature = (compile=true))]
    fn peek<'py>(&self, py: Python<'py>, compile: bool) -> PyResult<Bound<'py, PyAny>> {
        peeked_py(py, self.shape.peek_payload(&self.payload, compile))
    }

    /// The reduction method (`"mean"`, `"ema"`, ...).
    #[getter]
    fn reduce_method(&self) -> &'static str {
        self.shape.reduce_kind().name()
    }

    /// The number of logged values behind a mean (its weight when merged), else `None`.
    #[getter]
    fn count(&self) -> Option<f64> {
        match self.payload {
            Payload::Mean { count, .. } => Some(count),
            _ => None,
        }
    }

    /// The reduced value (`compile=True`), as `MetricsLogger.reduce(compile=True)` gives
    /// it; `compile=False` returns the snapshot itself (snapshots are immutable).
    #[pyo3(signature = (compile=true))]
    fn reduce<'py>(slf: &Bound<'py, Self>, compile: bool) -> PyResult<Bound<'py, PyAny>> {
        if !compile {
            return Ok(slf.clone().into_any());
        }
        let this = slf.get();
        compiled(slf.py(), &this.shape, &this.payload)
    }

    fn __float__(&self, py: Python<'_>) -> PyResult<f64> {
        self.number(py).ok_or_else(|| self.not_a_number())
    }

    fn __int__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.number(py).is_none() {
            return Err(self.not_a_number());
        }
        // int() of the value itself, so an int item stays exact.
        py.get_type::<PyInt>().call1((self.peek(py, true)?,))
    }

    /// Compares by value as RLlib's Stats do (`float(self) < float(other)`); `==` of a
    /// result that is not a number (percentiles, an item series) compares its peeked value.
    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        if let (Some(a), Some(b)) = (self.number(py), other_number(other)) {
            let holds = a.partial_cmp(&b).map_or(matches!(op, CompareOp::Ne), |ord| op.matches(ord));
            return Ok(PyBool::new(py, holds).to_owned().into_any().unbind());
        }
        if !matches!(op, CompareOp::Eq | CompareOp::Ne) {
            return Ok(py.NotImplemented());
        }
        let theirs = match other.cast::<StatsSnapshotPy>() {
            Ok(s) => s.get().peek(py, true)?,
            Err(_) => other.clone(),
        };
        let equal = self.peek(py, true)?.eq(theirs)?;
        Ok(PyBool::new(py, equal == matches!(op, CompareOp::Eq)).to_owned().into_any().unbind())
    }

    fn __add__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, |a, b| a + b)
    }

    fn __radd__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, |a, b| b + a)
    }

    fn __sub__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, |a, b| a - b)
    }

    fn __rsub__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, |a, b| b - a)
    }

    fn __mul__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, |a, b| a * b)
    }

    fn __rmul__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        self.arithmetic(other, |a, b| b * a)
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
        self.payload.rllib_len()
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
        let d = config_dict(py, self.shape.config())?;
        d.set_item("is_root", self.shape.is_root())?;
        d.set_item("is_leaf", self.shape.is_leaf())?;
        match &self.payload {
            Payload::Series(v) | Payload::Ema(v) | Payload::LifetimeSum(v) => d.set_item("value", v)?,
            Payload::Mean { mean, count } => {
                d.set_item("value", mean)?;
                d.set_item("count", count)?;
            }
            Payload::Sorted(vs) => d.set_item("values", vs.clone())?,
            Payload::Item(i) => d.set_item("item", obj_or_none(py, i.as_ref()))?,
            Payload::Items(items) => {
                d.set_item("items", PyList::new(py, items.iter().map(|o| o.0.bind(py)))?)?;
            }
        }
        Ok(d)
    }

    /// A snapshot from `get_state()`'s dict.
    #[staticmethod]
    fn from_state(state: &Bound<'_, PyDict>) -> PyResult<StatsSnapshotPy> {
        let config = config_from(state)?;
        let shape =
            Stat::new(config, req(state, "is_root")?.extract()?, req(state, "is_leaf")?.extract()?, 0.0);
        let f = |k: &str| -> PyResult<f64> { req(state, k)?.extract() };
        let payload = match shape.reduce_kind() {
            Reduce::Min | Reduce::Max | Reduce::Sum => Payload::Series(f("value")?),
            Reduce::Mean => Payload::Mean { mean: f("value")?, count: f("count")? },
            Reduce::Ema => Payload::Ema(f("value")?),
            Reduce::LifetimeSum => Payload::LifetimeSum(f("value")?),
            Reduce::Percentiles => {
                let mut vs: Vec<f64> = req(state, "values")?.extract()?;
                vs.sort_by(f64::total_cmp);
                Payload::Sorted(vs)
            }
            Reduce::Item => {
                let i = req(state, "item")?;
                Payload::Item((!i.is_none()).then(|| PyObj(i.unbind())))
            }
            Reduce::ItemSeries => Payload::Items(objs(&req(state, "items")?)?),
        };
        Ok(StatsSnapshotPy { shape, payload })
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
    /// Torch tensors logged to mean/min/max/sum stats and not read yet, per slot, in order.
    /// They stay where they are (a GPU tensor on its GPU, as RLlib keeps them) and reach
    /// the host in one `stack(...).cpu()` per stat at the next read, instead of one device
    /// sync per logged value. (RLlib's EMA, lifetime sum and percentiles check each value
    /// for NaN when it is logged, a sync each; those convert at once here too.)
    pending: Vec<(usize, Vec<PyObj>)>,
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
        if self.pending.is_empty() {
            return Ok(());
        }
        let (now_due, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.pending).into_iter().partition(|(s, _)| slot.is_none_or(|x| x == *s));
        self.pending = keep;
        for (s, tensors) in now_due {
            let values = host_values(py, &tensors)?;
            if let Some(stat) = self.store.get_mut(s) {
                for v in values {
                    stat.push(v).map_err(metrics_error)?;
                }
            }
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
        let Some(stat) = self.store.get(slot) else {
            return Err(PyKeyError::new_err("metric key vanished while logging"));
        };
        let deferrable = stat.is_leaf()
            && matches!(stat.reduce_kind(), Reduce::Mean | Reduce::Min | Reduce::Max | Reduce::Sum);
        if deferrable && !value.is_exact_instance_of::<PyFloat>() && is_torch_tensor(value) {
            if value.call_method0("numel")?.extract::<usize>()? != 1 {
                // Raises the error that names the key and the value.
                number(key, value)?;
            }
            let t = PyObj(value.call_method0("detach")?.unbind());
            match self.pending.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, ts)) => ts.push(t),
                None => self.pending.push((slot, vec![t])),
            }
            return Ok(());
        }
        self.flush(py, Some(slot))?;
        match self.store.get_mut(slot) {
            Some(stat) => push(stat, key, value, garbage),
            None => Err(PyKeyError::new_err("metric key vanished while logging")),
        }
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
        let slot = match g.store.find(&path) {
            Found::Leaf(id) => id,
            Found::Branch(b) if !b.is_empty() => {
                return Err(PyValueError::new_err(format!(
                    "cannot log to key {}: it holds nested metrics",
                    key_repr(&path)
                )))
            }
            _ => {
                let stat = Stat::new(opts.resolve()?, self.root, true, now());
                g.store.insert(&path, stat).map_err(metrics_error)?
            }
        };
        // Unhashable keys (lists) are resolved each time.
        let _ = cache.set_item(key, slot);
        Ok(slot)
    }

    fn node_py<'py>(
        py: Python<'py>,
        g: &mut Inner,
        branch: &[(KeyPart, Node)],
        f: &mut dyn FnMut(&mut PyStat) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, n) in branch {
            let v = match n {
                Node::Leaf(id) => match g.store.get_mut(*id) {
                    Some(s) => f(s)?,
                    None => continue,
                },
                Node::Branch(b) => Self::node_py(py, g, b, f)?.into_any(),
            };
            d.set_item(key_part_py(py, k)?, v)?;
        }
        Ok(d)
    }

    /// Applies `f` to the stat at `key` (or every stat under it, as a nested dict; all
    /// stats for `key=None`). `Ok(None)`: nothing there.
    fn map_key<'py>(
        &self,
        py: Python<'py>,
        key: Option<&Bound<'py, PyAny>>,
        mut f: impl FnMut(&mut PyStat) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut g = self.lock(py);
        g.flush(py, None)?;
        let path = match key {
            Some(k) if !k.is_none() => key_path(k)?,
            _ => Vec::new(),
        };
        match g.store.find(&path) {
            Found::Missing => Ok(None),
            Found::Leaf(id) => match g.store.get_mut(id) {
                Some(s) => f(s).map(Some),
                None => Ok(None),
            },
            Found::Branch(_) => {
                // The tree is cloned (keys only) so stats can be borrowed mutably.
                let Found::Branch(b) = g.store.find(&path) else { return Ok(None) };
                let b = b.to_vec();
                Ok(Some(Self::node_py(py, &mut g, &b, &mut f)?.into_any()))
            }
        }
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
                pending: Vec::new(),
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
        if clear_on_reduce.is_some()
            || throughput_ema_coeff.is_some()
            || reduce_per_index_on_aggregate.is_some()
        {
            deprecated_options(py, clear_on_reduce, throughput_ema_coeff, reduce_per_index_on_aggregate)?;
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
        let mut garbage = Vec::new();
        {
            let mut g = self.lock(py);
            g.flush(py, None)?;
            let slot = self.slot(py, &mut g, key, &opts)?;
            let Some(stat) = g.store.get_mut(slot) else {
                return Err(PyKeyError::new_err("metric key vanished while logging"));
            };
            if !stat.is_leaf() {
                return Err(PyValueError::new_err("cannot set a value on a key filled by aggregate()"));
            }
            let reduce = stat.reduce_kind();
            if reduce.is_numeric() {
                stat.set_number(number(key, value)?).map_err(metrics_error)?;
            } else {
                let fresh = Stat::new(stat.config().clone(), stat.is_root(), true, now());
                let old = std::mem::replace(stat, fresh);
                garbage.push(old);
                push(stat, key, value, &mut Vec::new())?;
            }
        }
        drop(garbage);
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
        let out = self.map_key(py, key, |s| {
            peeked_py(py, s.peek(compile, latest_merged_only).map_err(metrics_error)?)
        })?;
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
            let payload = s.reduce(t);
            if compile {
                compiled(py, s, &payload)
            } else {
                Ok(Bound::new(py, StatsSnapshotPy::new(s, payload))?.into_any())
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
        let mut prefix = match key {
            Some(k) if !k.is_none() => key_path(k)?,
            _ => Vec::new(),
        };
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
        // Group by key, in first-seen order.
        let mut index: HashMap<Vec<KeyPart>, usize> = HashMap::new();
        let mut groups: Vec<(Vec<KeyPart>, Vec<Bound<'_, StatsSnapshotPy>>)> = Vec::new();
        for (path, snap) in flat {
            if let Some(&i) = index.get(&path) {
                groups[i].1.push(snap);
            } else {
                index.insert(path.clone(), groups.len());
                groups.push((path, vec![snap]));
            }
        }
        let mut g = self.lock(py);
        let with_key = |path: &[KeyPart], e: MetricsError| match e {
            MetricsError::Value(m) => PyValueError::new_err(format!("key {}: {m}", key_repr(path))),
            other @ MetricsError::Key(_) => metrics_error(other),
        };
        // Everything is checked before anything is merged, so a failing aggregate leaves
        // the logger as it was.
        let payloads: Vec<Vec<&Payload<PyObj>>> =
            groups.iter().map(|(_, snaps)| snaps.iter().map(|s| &s.get().payload).collect()).collect();
        for ((path, snaps), incoming) in groups.iter().zip(&payloads) {
            let checked = match g.store.find(path) {
                Found::Leaf(id) => g.store.get(id).map_or(Ok(()), |s| s.check_merge(incoming)),
                _ => g
                    .store
                    .check_insert(path)
                    .and_then(|()| Stat::check_payloads(snaps[0].get().shape.reduce_kind(), incoming)),
            };
            checked.map_err(|e| with_key(path, e))?;
        }
        for ((path, snaps), incoming) in groups.iter().zip(&payloads) {
            let slot = if let Found::Leaf(id) = g.store.find(path) {
                id
            } else {
                let first = snaps[0].get();
                let stat = Stat::aggregator(first.shape.config().clone(), self.root, self.created);
                g.store.insert(path, stat).map_err(|e| with_key(path, e))?
            };
            let Some(stat) = g.store.get_mut(slot) else { continue };
            stat.merge(incoming).map_err(|e| with_key(path, e))?;
        }
        Ok(())
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
        let to_py = |tp: Throughput| -> PyResult<Bound<'py, PyAny>> {
            Ok(match tp {
                Throughput::Sum(v) => PyFloat::new(py, v).into_any(),
                Throughput::Lifetime { since_last_reduce, since_last_restore } => {
                    let d = PyDict::new(py);
                    d.set_item("throughput_since_last_reduce", since_last_reduce)?;
                    if let Some(r) = since_last_restore {
                        d.set_item("throughput_since_last_restore", r)?;
                    }
                    d.into_any()
                }
            })
        };
        let mut g = self.lock(py);
        g.flush(py, None)?;
        let path = match key {
            Some(k) if !k.is_none() => key_path(k)?,
            _ => Vec::new(),
        };
        match g.store.find(&path) {
            Found::Missing => Ok(None),
            Found::Leaf(id) => {
                let Some(s) = g.store.get_mut(id) else { return Ok(None) };
                match s.throughput(t) {
                    Some(tp) => Ok(Some(to_py(tp)?)),
                    None => Err(PyValueError::new_err(format!(
                        "key {} does not track a throughput (log it with with_throughput=True)",
                        key_repr(&path)
                    ))),
                }
            }
            Found::Branch(b) => {
                let mut leaves = Vec::new();
                Store::<PyObj>::leaves(b, &mut Vec::new(), &mut leaves);
                let out = PyDict::new(py);
                for (p, id) in leaves {
                    let Some(tp) = g.store.get_mut(id).and_then(|s| s.throughput(t)) else { continue };
                    let mut d = out.clone();
                    let Some((last, inner)) = p.split_last() else { continue };
                    for k in inner {
                        let kp = key_part_py(py, k)?;
                        let sub = if let Some(s) = d.get_item(&kp)? {
                            s.cast_into::<PyDict>()?
                        } else {
                            let s = PyDict::new(py);
                            d.set_item(&kp, &s)?;
                            s
                        };
                        d = sub;
                    }
                    let name = match last {
                        KeyPart::Str(s) => format!("{s}_throughput"),
                        KeyPart::Int(i) => format!("{i}_throughput"),
                    };
                    d.set_item(name, to_py(tp)?)?;
                }
                Ok((!out.is_empty()).then(|| out.into_any()))
            }
        }
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
        match removed {
            Ok(stats) => {
                drop(stats);
                Ok(())
            }
            Err(e) if key_error => Err(metrics_error(e)),
            Err(_) => Ok(()),
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
        let mut g = self.lock(py);
        g.flush(py, None)?;
        let mut leaves = Vec::new();
        Store::<PyObj>::leaves(&g.store.root, &mut Vec::new(), &mut leaves);
        let list = PyList::empty(py);
        for (path, id) in leaves {
            if let Some(s) = g.store.get(id) {
                list.append((key_tuple(py, &path)?, stat_state_dict(py, s)?))?;
            }
        }
        let d = PyDict::new(py);
        d.set_item("stats", list)?;
        Ok(d)
    }

    /// Replaces all stats by those in `state` (from `_get_state`).
    fn _set_state(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = now();
        let entries = state.get_item("stats")?;
        let mut restored = Vec::new();
        for e in entries.try_iter()? {
            let e = e?;
            let (k, d): (Bound<'_, PyAny>, Bound<'_, PyDict>) = e.extract()?;
            restored.push((key_path(&k)?, stat_from_state(&d, t)?));
        }
        let mut store = Store::default();
        for (path, stat) in restored {
            store.insert(&path, stat).map_err(metrics_error)?;
        }
        let old = {
            let mut g = self.lock(py);
            g.forget_keys(py);
            (std::mem::replace(&mut g.store, store), std::mem::take(&mut g.pending))
        };
        drop(old);
        Ok(())
    }
}

fn deprecated_options(
    py: Python<'_>,
    clear_on_reduce: Option<&Bound<'_, PyAny>>,
    throughput_ema_coeff: Option<&Bound<'_, PyAny>>,
    reduce_per_index_on_aggregate: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    if throughput_ema_coeff.is_some() {
        return Err(PyValueError::new_err(
            "throughput_ema_coeff is no longer supported: throughputs are measured once per \
             reduce() (as in RLlib 2.60)",
        ));
    }
    let warn = |msg: &str| -> PyResult<()> {
        let msg = CString::new(msg).unwrap_or_default();
        PyErr::warn(py, &py.get_type::<PyDeprecationWarning>(), &msg, 2)
    };
    if clear_on_reduce.is_some() {
        warn(
            "clear_on_reduce is deprecated (RLlib 2.60): every reduction but lifetime_sum and \
             ema starts over after reduce(); use reduce='lifetime_sum' for sums that must not",
        )?;
    }
    if reduce_per_index_on_aggregate.is_some() {
        warn("reduce_per_index_on_aggregate is deprecated (RLlib 2.60) and has no effect")?;
    }
    Ok(())
}
