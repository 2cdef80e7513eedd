//! Specs: how the Python values of one field map onto the core's typed leaves.
//!
//! A [`Spec`] is a schema (from a gymnasium space, or inferred from the first item) plus
//! what is needed to hand items back to Python: the nesting (Dict/Tuple) and each leaf's
//! numpy dtype. Converting in goes value -> leaf bytes (one copy); converting out goes
//! gathered bytes -> one new numpy array per leaf (one copy).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyTuple, PyType};

use super::errors::SpaceMismatchError;
use crate::column::{Column, Pos};
use crate::episode::Leaves;
use crate::schema::{DType, Kind, Leaf, OneHot, Schema};

/// The nesting of a field's items.
pub enum Tree {
    Leaf(usize),
    Dict(Vec<(Py<PyAny>, Tree)>),
    Tuple(Vec<Tree>),
}

/// How one field's values are stored and handed back.
///
/// Immutable once built and shared (`Arc`): every episode with the same space (or the
/// same inferred layout) points at one interned spec (see [`intern`]), and its columns at
/// the spec's schema, instead of each holding copies (about 1.5 KB per episode).
pub struct Spec {
    pub tree: Tree,
    pub schema: Arc<Schema>,
    pub descrs: Vec<Py<PyArrayDescr>>,
    /// From a gymnasium space: values that do not fit are errors. Inferred specs instead
    /// fall back to object storage.
    pub from_space: bool,
}

impl Spec {
    pub fn schema(&self) -> Arc<Schema> {
        Arc::clone(&self.schema)
    }

    /// Whether `other` describes the same layout with the same Python objects (dtype
    /// descriptors and dict keys compared by identity: cheap, and never wrong, at worst
    /// two equal specs stay apart).
    fn same_as(&self, other: &Spec) -> bool {
        fn same_tree(a: &Tree, b: &Tree) -> bool {
            match (a, b) {
                (Tree::Leaf(i), Tree::Leaf(j)) => i == j,
                (Tree::Dict(x), Tree::Dict(y)) => {
                    x.len() == y.len()
                        && x.iter().zip(y).all(|((k, s), (l, t))| k.as_ptr() == l.as_ptr() && same_tree(s, t))
                }
                (Tree::Tuple(x), Tree::Tuple(y)) => {
                    x.len() == y.len() && x.iter().zip(y).all(|(s, t)| same_tree(s, t))
                }
                _ => false,
            }
        }
        self.from_space == other.from_space
            && self.schema == other.schema
            && self.descrs.len() == other.descrs.len()
            && self.descrs.iter().zip(&other.descrs).all(|(a, b)| a.as_ptr() == b.as_ptr())
            && same_tree(&self.tree, &other.tree)
    }
}

impl crate::episode::FieldSpec for Spec {
    fn is_from_space(&self) -> bool {
        self.from_space
    }
}

/// Specs built so far, so that equal ones are shared; bounded (the oldest goes first).
static INTERNED: Mutex<Vec<Arc<Spec>>> = Mutex::new(Vec::new());
/// How many entries an intern table keeps.
const MAX_INTERNED: usize = 64;

/// The shared spec equal to `spec` (see [`Spec::same_as`]), interning it if it is new.
pub fn intern(spec: Spec) -> Arc<Spec> {
    intern_in(&INTERNED, spec, Spec::same_as)
}

/// The entry of `table` that `same` finds equal to `item`, else `item`, added.
///
/// The oldest entry goes when the table is full (its users keep their pointer): a
/// long-lived process that has seen many layouts still shares the ones it uses now. It is
/// dropped after the lock is released: releasing its Python objects may run Python code.
pub fn intern_in<T>(table: &Mutex<Vec<Arc<T>>>, item: T, same: fn(&T, &T) -> bool) -> Arc<T> {
    // A poisoned lock only means a panic elsewhere while it was held; the table itself
    // (a Vec of complete entries) is still valid.
    let mut entries = table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(s) = entries.iter().find(|s| same(s, &item)) {
        return Arc::clone(s);
    }
    let item = Arc::new(item);
    let evicted = (entries.len() == MAX_INTERNED).then(|| entries.remove(0));
    entries.push(Arc::clone(&item));
    drop(entries);
    drop(evicted);
    item
}

fn kind_of(descr: &Bound<'_, PyArrayDescr>) -> Option<Kind> {
    Kind::from_code(descr.kind() as char)
}

pub fn dtype_of(descr: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    Some(DType { kind: kind_of(descr)?, size: descr.itemsize() })
}

static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

pub fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    NUMPY.get_or_try_init(py, || Ok(py.import("numpy")?.unbind())).map(|m| m.bind(py))
}

fn space_class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "gymnasium.spaces", name)
}

macro_rules! space_cls {
    ($py:expr, $name:literal) => {{
        static CELL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        space_class($py, &CELL, $name)?
    }};
}

fn descr_from<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyArrayDescr>> {
    // A space's `dtype` is already a descriptor (`np.dtype` of one gives it back).
    if let Ok(d) = obj.cast::<PyArrayDescr>() {
        return Ok(d.clone());
    }
    let py = obj.py();
    let d = numpy(py)?.getattr(intern!(py, "dtype"))?.call1((obj,))?;
    Ok(d.cast_into::<PyArrayDescr>()?)
}

fn shape_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    obj.getattr(intern!(obj.py(), "shape"))?.extract()
}

/// Builds the spec of a gymnasium space; `None` for spaces without a fixed numeric
/// layout (Text, Graph, Sequence, ...), whose values are stored as objects.
pub fn from_space(space: &Bound<'_, PyAny>) -> PyResult<Option<Arc<Spec>>> {
    let mut leaves = Vec::new();
    let mut descrs = Vec::new();
    let Some(tree) = walk_space(space, &mut leaves, &mut descrs)? else { return Ok(None) };
    Ok(Some(intern(Spec { tree, schema: Arc::new(Schema::new(leaves)), descrs, from_space: true })))
}

fn walk_space(
    space: &Bound<'_, PyAny>,
    leaves: &mut Vec<Leaf>,
    descrs: &mut Vec<Py<PyArrayDescr>>,
) -> PyResult<Option<Tree>> {
    let py = space.py();
    let mut leaf =
        |descr: Bound<'_, PyArrayDescr>, shape: Vec<usize>, one_hot: OneHot| -> PyResult<Option<Tree>> {
            let Some(dtype) = dtype_of(&descr) else { return Ok(None) };
            leaves.push(Leaf { dtype, shape, one_hot });
            descrs.push(descr.unbind());
            Ok(Some(Tree::Leaf(leaves.len() - 1)))
        };
    let dtype = || descr_from(&space.getattr(intern!(py, "dtype"))?);
    if space.is_instance(space_cls!(py, "Box"))? || space.is_instance(space_cls!(py, "MultiBinary"))? {
        return leaf(dtype()?, shape_of(space)?, OneHot::No);
    }
    if space.is_instance(space_cls!(py, "Discrete"))? {
        let n: usize = space.getattr(intern!(py, "n"))?.extract()?;
        let start: i64 = space.getattr(intern!(py, "start"))?.extract()?;
        return leaf(dtype()?, vec![], OneHot::Discrete { n, start });
    }
    if space.is_instance(space_cls!(py, "MultiDiscrete"))? {
        let flat = |name: &str| -> PyResult<Vec<i64>> {
            space.getattr(name)?.call_method0("flatten")?.call_method0("tolist")?.extract()
        };
        let nvec: Vec<usize> = flat("nvec")?.into_iter().map(|v| usize::try_from(v).unwrap_or(0)).collect();
        let start = flat("start")?;
        return leaf(dtype()?, shape_of(space)?, OneHot::MultiDiscrete { nvec, start });
    }
    if space.is_instance(space_cls!(py, "Dict"))? {
        let mut entries = Vec::new();
        for item in space.getattr(intern!(py, "spaces"))?.call_method0("items")?.try_iter()? {
            let (key, sub): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
            let Some(t) = walk_space(&sub, leaves, descrs)? else { return Ok(None) };
            entries.push((key.unbind(), t));
        }
        return Ok(Some(Tree::Dict(entries)));
    }
    if space.is_instance(space_cls!(py, "Tuple"))? {
        let mut entries = Vec::new();
        for sub in space.getattr(intern!(py, "spaces"))?.try_iter()? {
            let Some(t) = walk_space(&sub?, leaves, descrs)? else { return Ok(None) };
            entries.push(t);
        }
        return Ok(Some(Tree::Tuple(entries)));
    }
    Ok(None)
}

/// Infers a spec from a first item given without a space: numbers, numeric arrays and
/// dicts/tuples of them. Returns the spec and whether the item was a plain Python scalar
/// (then items are handed back as Python scalars before `to_numpy`, as given).
pub fn infer(value: &Bound<'_, PyAny>) -> PyResult<Option<(Arc<Spec>, bool)>> {
    let mut leaves = Vec::new();
    let mut descrs = Vec::new();
    let host_scalar = is_host_scalar(value);
    let Some(tree) = walk_value(value, &mut leaves, &mut descrs)? else { return Ok(None) };
    let spec = Spec { tree, schema: Arc::new(Schema::new(leaves)), descrs, from_space: false };
    Ok(Some((intern(spec), host_scalar)))
}

fn is_host_scalar(value: &Bound<'_, PyAny>) -> bool {
    value.is_exact_instance_of::<PyFloat>()
        || value.is_exact_instance_of::<PyInt>()
        || value.is_exact_instance_of::<PyBool>()
}

fn walk_value(
    value: &Bound<'_, PyAny>,
    leaves: &mut Vec<Leaf>,
    descrs: &mut Vec<Py<PyArrayDescr>>,
) -> PyResult<Option<Tree>> {
    let py = value.py();
    if let Ok(d) = value.cast::<PyDict>() {
        let mut entries = Vec::new();
        for (k, v) in d.iter() {
            let Some(t) = walk_value(&v, leaves, descrs)? else { return Ok(None) };
            entries.push((k.unbind(), t));
        }
        return Ok(Some(Tree::Dict(entries)));
    }
    if let Ok(t) = value.cast::<PyTuple>() {
        let mut entries = Vec::new();
        for v in t.iter() {
            let Some(sub) = walk_value(&v, leaves, descrs)? else { return Ok(None) };
            entries.push(sub);
        }
        return Ok(Some(Tree::Tuple(entries)));
    }
    let (descr, shape) = if let Ok(a) = value.cast::<PyUntypedArray>() {
        (a.dtype(), a.shape().to_vec())
    } else if let Some(descr) = scalar_descr(value)? {
        (descr, Vec::new())
    } else if is_host_scalar(value) || value.cast::<PyList>().is_ok() {
        match numpy(py)?.getattr(intern!(py, "asarray"))?.call1((value,)) {
            Ok(a) => {
                let a = a.cast_into::<PyUntypedArray>()?;
                (a.dtype(), a.shape().to_vec())
            }
            Err(_) => return Ok(None),
        }
    } else {
        return Ok(None);
    };
    let Some(dtype) = dtype_of(&descr) else { return Ok(None) };
    leaves.push(Leaf::new(dtype, shape));
    descrs.push(canonical_descr(&descr)?);
    Ok(Some(Tree::Leaf(leaves.len() - 1)))
}

/// The dtype `numpy.asarray(value)` has for a scalar it can be told without making the
/// array: a numpy scalar's own dtype, float64 for a Python float, bool for a Python bool,
/// int64 for a Python int that fits one (a bigger one is left to `asarray`, which makes it
/// uint64 or an object). None for anything else.
///
/// Why: an extra model output's first value is inferred this way once per episode and
/// key, and making a 0-d array per scalar (a call into numpy) was most of a multi-agent
/// runner's first steps of its agent episodes.
fn scalar_descr<'py>(value: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyArrayDescr>>> {
    let py = value.py();
    if value.is_exact_instance_of::<PyFloat>() {
        return Ok(Some(numpy::dtype::<f64>(py)));
    }
    if value.is_exact_instance_of::<PyBool>() {
        return Ok(Some(numpy::dtype::<bool>(py)));
    }
    if value.is_exact_instance_of::<PyInt>() {
        return Ok(value.extract::<i64>().is_ok().then(|| numpy::dtype::<i64>(py)));
    }
    static GENERIC: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    if value.is_instance(GENERIC.import(py, "numpy", "generic")?)? {
        return Ok(Some(value.getattr(intern!(py, "dtype"))?.cast_into::<PyArrayDescr>()?));
    }
    Ok(None)
}

/// `numpy.dtype(descr.str)`: the plain dtype of `descr`'s type, size and byte order (what
/// an inferred spec keeps, so that specs of equal values share their dtype objects and
/// intern as one). Remembered per dtype object: the call was the other half of the cost
/// of inferring a spec.
fn canonical_descr(descr: &Bound<'_, PyArrayDescr>) -> PyResult<Py<PyArrayDescr>> {
    /// Dtype objects seen (and kept alive, so their addresses stay theirs) with their
    /// canonical dtype; a handful in practice, bounded like the intern tables.
    static SEEN: Mutex<Vec<(Py<PyArrayDescr>, Py<PyArrayDescr>)>> = Mutex::new(Vec::new());
    let py = descr.py();
    {
        // A poisoned lock only means a panic elsewhere while it was held; the entries
        // are complete pairs.
        let seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, c)) = seen.iter().find(|(d, _)| d.as_ptr() == descr.as_ptr()) {
            return Ok(c.clone_ref(py));
        }
    }
    // Called with the lock released: numpy's code may run Python code.
    let canonical = numpy(py)?
        .getattr(intern!(py, "dtype"))?
        .call1((descr.getattr(intern!(py, "str"))?,))?
        .cast_into::<PyArrayDescr>()?
        .unbind();
    let mut seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if seen.len() < MAX_INTERNED {
        seen.push((descr.clone().unbind(), canonical.clone_ref(py)));
    }
    Ok(canonical)
}

/// Whether numpy data of kind `from` may be stored in a leaf of kind `to` without losing
/// meaning: bool into anything, ints into ints and floats, floats into floats; never a
/// float into an int or bool leaf.
fn castable(from: Kind, to: Kind) -> bool {
    use Kind::{Bool, Complex, Float, Int, UInt};
    match from {
        Bool => true,
        Int | UInt => matches!(to, Int | UInt | Float | Complex),
        Float => matches!(to, Float | Complex),
        Complex => to == Complex,
    }
}

/// The bytes of one leaf of one value: owned (converted), or a view of the caller's numpy
/// array when it already has the leaf's exact dtype and C layout, so that storing the item
/// copies its bytes once, straight from the array into the column.
pub enum LeafBytes<'py> {
    Owned(Vec<u8>),
    Array(Bound<'py, PyUntypedArray>),
    /// A converted scalar (at most 8 bytes), kept inline: actions, rewards and log-probs
    /// of every step, so no allocation per step and field.
    Scalar {
        bytes: [u8; 8],
        len: u8,
    },
}

impl LeafBytes<'_> {
    pub fn into_owned(self) -> Vec<u8> {
        match self {
            LeafBytes::Owned(v) => v,
            LeafBytes::Array(a) => array_bytes(&a),
            LeafBytes::Scalar { bytes, len } => bytes[..usize::from(len)].to_vec(),
        }
    }

    /// Row `i` of this view of a batch whose rows are `width` bytes, copied (inline for
    /// up to 8 bytes: the column then copies it once more into its buffer, a few bytes for
    /// vector items); `None` where the view holds no such row. An array view reads its
    /// live layout here, so a row past a buffer that changed since is refused, never read.
    pub(crate) fn row(&self, i: usize, width: usize) -> Option<LeafBytes<'static>> {
        Some(LeafBytes::copied(self.as_ref().get(i * width..(i + 1) * width)?))
    }

    /// A copy of `b`: inline for up to 8 bytes, else on the heap.
    pub(crate) fn copied(b: &[u8]) -> LeafBytes<'static> {
        if b.len() <= 8 {
            LeafBytes::scalar(b)
        } else {
            LeafBytes::Owned(b.to_vec())
        }
    }

    /// The inline bytes of a scalar of up to 8 bytes.
    pub(crate) fn scalar(value: &[u8]) -> LeafBytes<'static> {
        let mut bytes = [0u8; 8];
        let len = value.len().min(8);
        bytes[..len].copy_from_slice(&value[..len]);
        LeafBytes::Scalar { bytes, len: len as u8 }
    }
}

impl AsRef<[u8]> for LeafBytes<'_> {
    fn as_ref(&self) -> &[u8] {
        match self {
            LeafBytes::Owned(v) => v,
            LeafBytes::Scalar { bytes, len } => &bytes[..usize::from(*len)],
            LeafBytes::Array(a) => {
                // The array's layout is read now, not when the view was made: a reshape or
                // resize in between changes the length (the column then rejects the item)
                // but never points outside the live buffer.
                if !a.is_c_contiguous() {
                    return &[];
                }
                let n = a.len_total_bytes();
                // SAFETY: `a` is a live C-contiguous numpy array (checked just above) held
                // by this value, so its data pointer addresses `n` readable bytes. The slice
                // borrows `self` and the caller copies it before any Python code can run
                // (the thread stays attached and executes only Rust in between).
                unsafe {
                    let data = (*a.as_array_ptr()).fields.data.cast::<u8>();
                    if n == 0 || data.is_null() {
                        &[]
                    } else {
                        std::slice::from_raw_parts(data, n)
                    }
                }
            }
        }
    }
}

/// Copies the bytes of a C-contiguous array.
fn array_bytes(array: &Bound<'_, PyUntypedArray>) -> Vec<u8> {
    let n = array.len_total_bytes();
    // SAFETY: `array` is a live numpy array that is C-contiguous (checked by every caller),
    // so its data pointer addresses `nbytes` readable bytes; we copy them while the
    // array is borrowed and the thread is attached.
    unsafe {
        let data = (*array.as_array_ptr()).fields.data.cast::<u8>();
        std::slice::from_raw_parts(data, n).to_vec()
    }
}

trait TotalBytes {
    fn len_total_bytes(&self) -> usize;
}

impl TotalBytes for Bound<'_, PyUntypedArray> {
    fn len_total_bytes(&self) -> usize {
        self.shape().iter().product::<usize>() * self.dtype().itemsize()
    }
}

/// Describes what was wrong with a value for the error message.
fn describe(value: &Bound<'_, PyAny>) -> String {
    if let Ok(a) = value.cast::<PyUntypedArray>() {
        let dt = a.dtype().str().map(|s| s.to_string()).unwrap_or_default();
        return format!("an array of shape {} and dtype {dt}", py_shape(a.shape()));
    }
    let ty = value.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    let mut r = value.repr().map(|r| r.to_string()).unwrap_or_default();
    if r.len() > 80 {
        r.truncate(77);
        r.push_str("...");
    }
    format!("{r} (a {ty})")
}

/// A shape as Python prints it: `()`, `(4,)`, `(2, 3)`.
fn py_shape(shape: &[usize]) -> String {
    match shape {
        [] => "()".into(),
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    }
}

fn leaf_desc(leaf: &Leaf) -> String {
    format!("shape {} and dtype {}", py_shape(&leaf.shape), leaf.dtype)
}

/// numpy's scalar types that the fast path knows: (type, kind, size).
static SCALAR_TYPES: PyOnceLock<Vec<(Py<PyType>, Kind, usize)>> = PyOnceLock::new();

/// The bytes of a numpy float/int/bool scalar for a scalar leaf of the same kind and a
/// size at least as large; `None` when the fast path does not apply.
fn numpy_scalar_bytes(value: &Bound<'_, PyAny>, leaf: &Leaf) -> PyResult<Option<LeafBytes<'static>>> {
    let py = value.py();
    let types = SCALAR_TYPES.get_or_try_init(py, || -> PyResult<_> {
        let np = numpy(py)?;
        let mut v = Vec::new();
        for (name, kind, size) in [
            ("float32", Kind::Float, 4),
            ("float64", Kind::Float, 8),
            ("int64", Kind::Int, 8),
            ("int32", Kind::Int, 4),
            ("bool_", Kind::Bool, 1),
        ] {
            v.push((np.getattr(name)?.cast_into::<PyType>()?.unbind(), kind, size));
        }
        Ok(v)
    })?;
    let ty = value.get_type();
    let Some((_, kind, size)) = types.iter().find(|(t, _, _)| t.bind(py).is(&ty)) else { return Ok(None) };
    let (to, to_size) = (leaf.dtype.kind, leaf.dtype.size);
    Ok(match (kind, to, to_size) {
        (Kind::Float, Kind::Float, 4) if *size == 4 => {
            Some(LeafBytes::scalar(&(value.extract::<f64>()? as f32).to_ne_bytes()))
        }
        (Kind::Float, Kind::Float, 8) => Some(LeafBytes::scalar(&value.extract::<f64>()?.to_ne_bytes())),
        (Kind::Int | Kind::Bool, Kind::Int, 8) => {
            Some(LeafBytes::scalar(&value.extract::<i64>()?.to_ne_bytes()))
        }
        (Kind::Int | Kind::Bool, Kind::Int, 4) if *size <= 4 => {
            Some(LeafBytes::scalar(&(value.extract::<i64>()? as i32).to_ne_bytes()))
        }
        (Kind::Bool, Kind::Bool, 1) => Some(LeafBytes::scalar(&[u8::from(value.is_truthy()?)])),
        _ => None,
    })
}

/// Converts one value (or batch of values) into the bytes of leaf `leaf`.
///
/// With `batch = Some(n)`, the value holds `n` items stacked on a leading axis (`None`:
/// take `n` from the value).
fn leaf_bytes<'py>(
    value: &Bound<'py, PyAny>,
    leaf: &Leaf,
    descr: &Bound<'py, PyArrayDescr>,
    batch: Option<Option<usize>>,
    what: &dyn Fn() -> String,
) -> PyResult<LeafBytes<'py>> {
    let py = value.py();
    let mismatch = |why: String| -> PyErr {
        SpaceMismatchError::new_err(format!(
            "{}: expected {}{}, got {}",
            what(),
            if batch.is_some() { "a batch of items of " } else { "" },
            leaf_desc(leaf),
            why
        ))
    };
    // Fast paths: Python floats/ints and numpy float/int scalars into scalar leaves
    // (no numpy call; the per-step cost of rewards, actions and log-probs).
    if batch.is_none() && leaf.shape.is_empty() {
        if value.is_exact_instance_of::<PyFloat>() && leaf.dtype.kind == Kind::Float && leaf.dtype.size >= 4 {
            let v: f64 = value.extract()?;
            return Ok(if leaf.dtype.size == 8 {
                LeafBytes::scalar(&v.to_ne_bytes())
            } else {
                LeafBytes::scalar(&(v as f32).to_ne_bytes())
            });
        }
        if value.is_exact_instance_of::<PyInt>() && leaf.dtype == DType::I64 {
            if let Ok(v) = value.extract::<i64>() {
                return Ok(LeafBytes::scalar(&v.to_ne_bytes()));
            }
        }
        if let Some(bytes) = numpy_scalar_bytes(value, leaf)? {
            return Ok(bytes);
        }
    }
    let array = match value.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => numpy(py)?
            .getattr("asarray")?
            .call1((value,))
            .map_err(|_| mismatch(describe(value)))?
            .cast_into::<PyUntypedArray>()?,
    };
    let shape = array.shape();
    let item_shape = match batch {
        None => shape,
        Some(n) => {
            if shape.is_empty() || n.is_some_and(|n| n != shape[0]) {
                return Err(mismatch(describe(value)));
            }
            &shape[1..]
        }
    };
    if item_shape != leaf.shape.as_slice() {
        return Err(mismatch(describe(value)));
    }
    let given = array.dtype();
    let Some(kind) = kind_of(&given) else { return Err(mismatch(describe(value))) };
    if !castable(kind, leaf.dtype.kind) {
        return Err(mismatch(describe(value)));
    }
    // Identity first: numpy shares one descriptor object per builtin dtype, so the
    // common case skips the C-API equivalence call.
    if (given.is(descr) || given.is_equiv_to(descr)) && array.is_c_contiguous() {
        return Ok(LeafBytes::Array(array));
    }
    let cast =
        numpy(py)?.getattr("ascontiguousarray")?.call1((&array, descr))?.cast_into::<PyUntypedArray>()?;
    Ok(LeafBytes::Array(cast))
}

/// Flattens `value` by `spec` into one byte buffer per leaf.
///
/// `batch`: `None` for one item; `Some(n)` for `n` items stacked per leaf (`Some(None)`:
/// any `n`, taken from the value; all leaves must agree).
pub fn to_leaves(
    spec: &Spec,
    value: &Bound<'_, PyAny>,
    batch: Option<Option<usize>>,
    field: &dyn Fn() -> String,
) -> PyResult<Vec<Vec<u8>>> {
    Ok(to_leaf_views(spec, value, batch, field)?.into_vec().into_iter().map(LeafBytes::into_owned).collect())
}

/// [`to_leaves`] without copying leaves that are already numpy arrays of the right dtype
/// and layout (the per-step path: the column copies them once).
pub fn to_leaf_views<'py>(
    spec: &Spec,
    value: &Bound<'py, PyAny>,
    batch: Option<Option<usize>>,
    field: &dyn Fn() -> String,
) -> PyResult<Leaves<LeafBytes<'py>>> {
    // One leaf (the common case: a Box, Discrete, a scalar) needs no tree walk.
    if let Tree::Leaf(0) = spec.tree {
        let leaf = &spec.schema.leaves[0];
        let descr = spec.descrs[0].bind(value.py());
        return Ok(Leaves::One(leaf_bytes(value, leaf, descr, batch, &|| field())?));
    }
    let mut out: Vec<LeafBytes<'py>> =
        (0..spec.schema.leaves.len()).map(|_| LeafBytes::Owned(Vec::new())).collect();
    let mut path = String::new();
    let mut batch = batch;
    flatten_into(spec, &spec.tree, value, &mut batch, field, &mut path, &mut out, value.py())?;
    Ok(Leaves::Many(out))
}

#[allow(clippy::too_many_arguments)]
fn flatten_into<'py>(
    spec: &Spec,
    tree: &Tree,
    value: &Bound<'py, PyAny>,
    batch: &mut Option<Option<usize>>,
    field: &dyn Fn() -> String,
    path: &mut String,
    out: &mut [LeafBytes<'py>],
    py: Python<'py>,
) -> PyResult<()> {
    // Error messages only: the field's name is formatted when something is wrong.
    let what = |path: &str| format!("{}{path}", field());
    match tree {
        Tree::Leaf(i) => {
            let what = || what(path);
            let descr = spec.descrs[*i].bind(py);
            let leaf = &spec.schema.leaves[*i];
            let bytes = leaf_bytes(value, leaf, descr, *batch, &what)?;
            if let Some(None) = batch {
                // The first leaf fixes the batch size for the others.
                let n = bytes.as_ref().len().checked_div(leaf.item_bytes()).unwrap_or(0);
                *batch = Some(Some(n));
            }
            out[*i] = bytes;
        }
        Tree::Dict(entries) => {
            for (key, sub) in entries {
                let key = key.bind(py);
                let item = value.get_item(key).map_err(|_| {
                    SpaceMismatchError::new_err(format!(
                        "{}: expected a dict with key {}, got {}",
                        what(path),
                        key.repr().map(|r| r.to_string()).unwrap_or_default(),
                        describe(value)
                    ))
                })?;
                let len = path.len();
                let _ = write!(path, "[{}]", key.repr()?);
                flatten_into(spec, sub, &item, batch, field, path, out, py)?;
                path.truncate(len);
            }
        }
        Tree::Tuple(entries) => {
            let n = value.len().unwrap_or(usize::MAX);
            if n != entries.len() || value.cast::<PyUntypedArray>().is_ok() {
                return Err(SpaceMismatchError::new_err(format!(
                    "{}: expected a tuple of {} items, got {}",
                    what(path),
                    entries.len(),
                    describe(value)
                )));
            }
            for (k, sub) in entries.iter().enumerate() {
                let item = value.get_item(k)?;
                let len = path.len();
                let _ = write!(path, "[{k}]");
                flatten_into(spec, sub, &item, batch, field, path, out, py)?;
                path.truncate(len);
            }
        }
    }
    Ok(())
}

/// A new C-contiguous numpy array of `descr` and `shape` holding a copy of `bytes`.
pub fn new_array<'py>(
    py: Python<'py>,
    descr: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
    bytes: &[u8],
) -> PyResult<Bound<'py, PyAny>> {
    new_array_with(py, descr, shape, |buf| {
        buf.copy_from_slice(bytes);
        true
    })
}

/// A new C-contiguous numpy array of `descr` and `shape` whose bytes `fill` writes in place
/// (so a read copies the data once, straight into the array handed out). `fill` gets
/// exactly `prod(shape) * itemsize` bytes and returns `false` if it could not fill them.
pub fn new_array_with<'py>(
    py: Python<'py>,
    descr: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
    fill: impl FnOnce(&mut [u8]) -> bool,
) -> PyResult<Bound<'py, PyAny>> {
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    let nbytes = shape.iter().product::<usize>() * descr.itemsize();
    // SAFETY: PyArray_NewFromDescr steals one reference to the descriptor, which
    // `into_dtype_ptr` hands over; with a null data pointer numpy allocates a C-contiguous
    // buffer of exactly prod(shape) * itemsize bytes, owned by the new array.
    let array = unsafe {
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.clone().into_dtype_ptr(),
            dims.len() as i32,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            // With a null data pointer a non-zero `flags` asks for Fortran order: 0 keeps
            // the C order the byte copy assumes.
            0,
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, ptr)?
    };
    let ok = if nbytes == 0 {
        fill(&mut [])
    } else {
        // SAFETY: the array was just created by us and is not shared yet; its data buffer
        // holds `nbytes` writable bytes (see above) and lives as long as `array`.
        let buf = unsafe {
            let data = (*array.as_ptr().cast::<npyffi::PyArrayObject>()).fields.data.cast::<u8>();
            std::slice::from_raw_parts_mut(data, nbytes)
        };
        fill(buf)
    };
    if ok {
        Ok(array)
    } else {
        Err(pyo3::exceptions::PyRuntimeError::new_err("internal error: array bytes of the wrong size"))
    }
}

/// One scalar of `descr` from its bytes: a numpy scalar, or a Python scalar with
/// `host_scalar`.
fn scalar<'py>(
    py: Python<'py>,
    descr: &Bound<'py, PyArrayDescr>,
    leaf: &Leaf,
    bytes: &[u8],
    host_scalar: bool,
) -> PyResult<Bound<'py, PyAny>> {
    if host_scalar {
        match (leaf.dtype.kind, leaf.dtype.size) {
            (Kind::Float, 8) => return Ok(PyFloat::new(py, f64::from_ne_bytes(bytes.try_into()?)).into_any()),
            (Kind::Int, 8) => return Ok(i64::from_ne_bytes(bytes.try_into()?).into_pyobject(py)?.into_any()),
            (Kind::Bool, 1) => return Ok(PyBool::new(py, bytes[0] != 0).to_owned().into_any()),
            _ => {}
        }
    }
    let array = new_array(py, descr, &[], bytes)?;
    // SAFETY: `array` is a valid 0-d ndarray; PyArray_Return steals the reference we pass
    // (hence `into_ptr`) and returns a new reference to the equivalent numpy scalar.
    unsafe {
        let ptr = PY_ARRAY_API.PyArray_Return(py, array.into_ptr().cast());
        Bound::from_owned_ptr_or_err(py, ptr)
    }
}

/// Rebuilds the nesting of `tree` around per-leaf Python values.
pub fn nest<'py>(
    py: Python<'py>,
    tree: &Tree,
    leaves: &mut [Option<Bound<'py, PyAny>>],
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match tree {
        Tree::Leaf(i) => leaves[*i]
            .take()
            .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("internal error: leaf used twice"))?,
        Tree::Dict(entries) => {
            let d = PyDict::new(py);
            for (k, sub) in entries {
                d.set_item(k.bind(py), nest(py, sub, leaves)?)?;
            }
            d.into_any()
        }
        Tree::Tuple(entries) => {
            let items = entries.iter().map(|sub| nest(py, sub, leaves)).collect::<PyResult<Vec<_>>>()?;
            PyTuple::new(py, items)?.into_any()
        }
    })
}

/// The spec of a float32 scalar Box (RLlib's space for rewards buffers), shared.
pub fn f32_scalar(py: Python<'_>) -> Arc<Spec> {
    static F32: PyOnceLock<Arc<Spec>> = PyOnceLock::new();
    Arc::clone(F32.get_or_init(py, || {
        Arc::new(Spec {
            tree: Tree::Leaf(0),
            schema: Arc::new(Schema::new(vec![Leaf::new(DType::F32, vec![])])),
            descrs: vec![f32_descr(py).unbind()],
            from_space: true,
        })
    }))
}

/// The float32 descriptor used for one-hot output.
fn f32_descr(py: Python<'_>) -> Bound<'_, PyArrayDescr> {
    numpy::dtype::<f32>(py)
}

/// Item `pos` of `column` as a Python value (nested by the spec).
pub fn item<'py>(
    py: Python<'py>,
    spec: &Spec,
    column: &Column,
    pos: usize,
    host_scalars: bool,
    one_hot: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let mut values = Vec::with_capacity(spec.schema.leaves.len());
    for (i, leaf) in spec.schema.leaves.iter().enumerate() {
        let item = column.item(i, pos);
        let bytes: &[u8] = &item;
        let v = if one_hot && leaf.one_hot_width().is_some() {
            let mut out = Vec::new();
            leaf.write_one_hot(bytes, &mut out);
            new_array(py, &f32_descr(py), &[leaf.one_hot_width().unwrap_or(0)], &out)?
        } else if leaf.shape.is_empty() {
            scalar(py, spec.descrs[i].bind(py), leaf, bytes, host_scalars)?
        } else {
            new_array(py, spec.descrs[i].bind(py), &leaf.shape, bytes)?
        };
        values.push(Some(v));
    }
    nest(py, &spec.tree, &mut values)
}

/// The fill item of a spec: one `np.full(leaf_shape, fill, leaf_dtype)` per leaf (float32
/// slots of the one-hot width for discrete leaves under `one_hot`), as bytes.
pub fn fill_leaves(
    py: Python<'_>,
    spec: &Spec,
    fill: &Bound<'_, PyAny>,
    one_hot: bool,
) -> PyResult<Vec<Vec<u8>>> {
    let np = numpy(py)?;
    spec.schema
        .leaves
        .iter()
        .enumerate()
        .map(|(i, leaf)| {
            let (shape, descr) = match leaf.one_hot_width() {
                Some(w) if one_hot => (vec![w], f32_descr(py)),
                _ => (leaf.shape.clone(), spec.descrs[i].bind(py).clone()),
            };
            let full = np.getattr("full")?.call1((shape, fill, descr))?.cast_into::<PyUntypedArray>()?;
            Ok(array_bytes(&full))
        })
        .collect()
}

/// The fill item of a spec as a Python value (nested; 0-d arrays for scalar leaves, as
/// `np.full` gives them).
pub fn fill_item<'py>(
    py: Python<'py>,
    spec: &Spec,
    fill: &Bound<'py, PyAny>,
    one_hot: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let bytes = fill_leaves(py, spec, fill, one_hot)?;
    let mut values = Vec::with_capacity(spec.schema.leaves.len());
    for (i, leaf) in spec.schema.leaves.iter().enumerate() {
        let v = match leaf.one_hot_width() {
            Some(w) if one_hot => new_array(py, &f32_descr(py), &[w], &bytes[i])?,
            _ => new_array(py, spec.descrs[i].bind(py), &leaf.shape, &bytes[i])?,
        };
        values.push(Some(v));
    }
    nest(py, &spec.tree, &mut values)
}

/// The items at `positions` as one batched numpy array per leaf, nested by the spec.
pub fn batch<'py>(
    py: Python<'py>,
    spec: &Spec,
    column: &Column,
    positions: &[Pos],
    fill: Option<&[Vec<u8>]>,
    one_hot: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let mut values = Vec::with_capacity(spec.schema.leaves.len());
    for (i, leaf) in spec.schema.leaves.iter().enumerate() {
        let hot = one_hot && leaf.one_hot_width().is_some();
        let mut shape = vec![positions.len()];
        let f32 = f32_descr(py);
        let descr = if hot {
            shape.push(leaf.one_hot_width().unwrap_or(0));
            &f32
        } else {
            shape.extend_from_slice(&leaf.shape);
            spec.descrs[i].bind(py)
        };
        let fill_i = fill.map(|f| f[i].as_slice());
        let array =
            new_array_with(py, descr, &shape, |buf| column.gather_into(i, positions, fill_i, hot, buf))?;
        values.push(Some(array));
    }
    nest(py, &spec.tree, &mut values)
}
