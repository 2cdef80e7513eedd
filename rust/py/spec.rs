//! Specs: how the Python values of one field map onto the core's typed leaves.
//!
//! A [`Spec`] is a schema (from a gymnasium space, or inferred from the first item) plus
//! what is needed to hand items back to Python: the nesting (Dict/Tuple) and each leaf's
//! numpy dtype. Converting in goes value -> leaf bytes (one copy); converting out goes
//! gathered bytes -> one new numpy array per leaf (one copy).

use std::fmt::Write as _;
use std::sync::Arc;

use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyTuple, PyType};

use super::errors::SpaceMismatchError;
use crate::column::{Column, Pos};
use crate::episode::Leaves;
use crate::intern::Interner;
use crate::schema::{
    DType, Expected, Got, Inline, Kind, Leaf, Mismatch, OneHot, Scalar, Schema, INLINE_BYTES,
};

/// The nesting of a field's items, keyed by the Python dict keys.
pub type Tree = crate::schema::Tree<Py<PyAny>>;

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
        self.from_space == other.from_space
            && self.schema == other.schema
            && self.descrs.len() == other.descrs.len()
            && self.descrs.iter().zip(&other.descrs).all(|(a, b)| a.as_ptr() == b.as_ptr())
            && self.tree.same_as(&other.tree, &|k, l| k.as_ptr() == l.as_ptr())
    }
}

impl crate::episode::FieldSpec for Spec {
    fn is_from_space(&self) -> bool {
        self.from_space
    }

    fn schema(&self) -> Option<&Schema> {
        Some(&self.schema)
    }
}

/// Specs built so far, so that equal ones are shared.
static INTERNED: Interner<Spec> = Interner::new(64);

/// The shared spec equal to `spec` (see [`Spec::same_as`]), interning it if it is new.
pub fn intern(spec: Spec) -> Arc<Spec> {
    INTERNED.get_or_insert(spec, Spec::same_as, Arc::new)
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

/// The class `gymnasium.spaces.<name>`, imported once.
macro_rules! space_cls {
    ($py:expr, $name:literal) => {{
        static CELL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        CELL.import($py, "gymnasium.spaces", $name)?
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

/// The leaves and dtypes of a spec being built, numbered as its tree refers to them.
#[derive(Default)]
struct Builder {
    leaves: Vec<Leaf>,
    descrs: Vec<Py<PyArrayDescr>>,
}

impl Builder {
    /// The tree of a new leaf of `descr`'s dtype; `None` for a dtype that is not numeric.
    fn leaf(&mut self, descr: Bound<'_, PyArrayDescr>, shape: Vec<usize>, one_hot: OneHot) -> Option<Tree> {
        self.leaves.push(Leaf { dtype: dtype_of(&descr)?, shape, one_hot });
        self.descrs.push(descr.unbind());
        Some(Tree::Leaf(self.leaves.len() - 1))
    }

    /// A Dict (`keyed`: each entry has its key) or Tuple tree of `entries` walked by
    /// `walk`; `None` if one of them has no numeric layout.
    fn nested<'py>(
        &mut self,
        keyed: bool,
        entries: impl Iterator<Item = PyResult<(Option<Bound<'py, PyAny>>, Bound<'py, PyAny>)>>,
        walk: fn(&Bound<'py, PyAny>, &mut Builder) -> PyResult<Option<Tree>>,
    ) -> PyResult<Option<Tree>> {
        let (mut keys, mut trees) = (Vec::new(), Vec::new());
        for entry in entries {
            let (key, value) = entry?;
            let Some(t) = walk(&value, self)? else { return Ok(None) };
            keys.extend(key.map(Bound::unbind));
            trees.push(t);
        }
        Ok(Some(if keyed { Tree::Dict(keys.into_iter().zip(trees).collect()) } else { Tree::Tuple(trees) }))
    }

    /// The interned spec of `tree` over the leaves built.
    fn finish(self, tree: Tree, from_space: bool) -> Arc<Spec> {
        intern(Spec { tree, schema: Arc::new(Schema::new(self.leaves)), descrs: self.descrs, from_space })
    }
}

/// Builds the spec of a gymnasium space; `None` for spaces without a fixed numeric
/// layout (Text, Graph, Sequence, ...), whose values are stored as objects.
pub fn from_space(space: &Bound<'_, PyAny>) -> PyResult<Option<Arc<Spec>>> {
    let mut b = Builder::default();
    Ok(walk_space(space, &mut b)?.map(|tree| b.finish(tree, true)))
}

fn walk_space(space: &Bound<'_, PyAny>, b: &mut Builder) -> PyResult<Option<Tree>> {
    let py = space.py();
    let mut leaf = |shape: Vec<usize>, one_hot: OneHot| -> PyResult<Option<Tree>> {
        Ok(b.leaf(descr_from(&space.getattr(intern!(py, "dtype"))?)?, shape, one_hot))
    };
    if space.is_instance(space_cls!(py, "Box"))? || space.is_instance(space_cls!(py, "MultiBinary"))? {
        return leaf(shape_of(space)?, OneHot::No);
    }
    if space.is_instance(space_cls!(py, "Discrete"))? {
        let n: usize = space.getattr(intern!(py, "n"))?.extract()?;
        let start: i64 = space.getattr(intern!(py, "start"))?.extract()?;
        return leaf(vec![], OneHot::Discrete { n, start });
    }
    if space.is_instance(space_cls!(py, "MultiDiscrete"))? {
        let flat = |name: &str| -> PyResult<Vec<i64>> {
            space.getattr(name)?.call_method0("flatten")?.call_method0("tolist")?.extract()
        };
        let nvec: Vec<usize> = flat("nvec")?.into_iter().map(|v| usize::try_from(v).unwrap_or(0)).collect();
        let start = flat("start")?;
        return leaf(shape_of(space)?, OneHot::MultiDiscrete { nvec, start });
    }
    if space.is_instance(space_cls!(py, "Dict"))? {
        let entries = space.getattr(intern!(py, "spaces"))?.call_method0("items")?;
        let entries = entries.try_iter()?.map(|e| e?.extract().map(|(k, v)| (Some(k), v)));
        return b.nested(true, entries, walk_space);
    }
    if space.is_instance(space_cls!(py, "Tuple"))? {
        let entries = space.getattr(intern!(py, "spaces"))?.try_iter()?.map(|v| Ok((None, v?)));
        return b.nested(false, entries, walk_space);
    }
    Ok(None)
}

/// Infers a spec from a first item given without a space: numbers, numeric arrays and
/// dicts/tuples of them. Returns the spec and whether the item was a plain Python scalar
/// (then items are handed back as Python scalars before `to_numpy`, as given).
pub fn infer(value: &Bound<'_, PyAny>) -> PyResult<Option<(Arc<Spec>, bool)>> {
    let mut b = Builder::default();
    Ok(walk_value(value, &mut b)?.map(|tree| (b.finish(tree, false), is_host_scalar(value))))
}

fn is_host_scalar(value: &Bound<'_, PyAny>) -> bool {
    value.is_exact_instance_of::<PyFloat>()
        || value.is_exact_instance_of::<PyInt>()
        || value.is_exact_instance_of::<PyBool>()
}

fn walk_value(value: &Bound<'_, PyAny>, b: &mut Builder) -> PyResult<Option<Tree>> {
    let py = value.py();
    if let Ok(d) = value.cast::<PyDict>() {
        return b.nested(true, d.iter().map(|(k, v)| Ok((Some(k), v))), walk_value);
    }
    if let Ok(t) = value.cast::<PyTuple>() {
        return b.nested(false, t.iter().map(|v| Ok((None, v))), walk_value);
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
    if dtype_of(&descr).is_none() {
        return Ok(None);
    }
    Ok(b.leaf(canonical_descr(&descr)?.into_bound(py), shape, OneHot::No))
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
    /// canonical dtype; a handful in practice.
    static SEEN: Interner<(Py<PyArrayDescr>, Py<PyArrayDescr>)> = Interner::new(64);
    let py = descr.py();
    let same = |(d, _): &(Py<PyArrayDescr>, Py<PyArrayDescr>)| d.as_ptr() == descr.as_ptr();
    if let Some(pair) = SEEN.find(same) {
        return Ok(pair.1.clone_ref(py));
    }
    // Called with the table unlocked: numpy's code may run Python code.
    let canonical = numpy(py)?
        .getattr(intern!(py, "dtype"))?
        .call1((descr.getattr(intern!(py, "str"))?,))?
        .cast_into::<PyArrayDescr>()?
        .unbind();
    let pair = (descr.clone().unbind(), canonical);
    Ok(SEEN.get_or_insert(pair, |a, b| a.0.as_ptr() == b.0.as_ptr(), Arc::new).1.clone_ref(py))
}

/// The bytes of one leaf of one value: owned (converted), or a view of the caller's numpy
/// array when it already has the leaf's exact dtype and C layout, so that storing the item
/// copies its bytes once, straight from the array into the column.
pub enum LeafBytes<'py> {
    Owned(Vec<u8>),
    Array(Bound<'py, PyUntypedArray>),
    /// A small item (a converted scalar, or an array of up to [`INLINE_BYTES`] copied when
    /// converted), kept inline: no allocation per step and field.
    Inline(Inline),
}

impl LeafBytes<'_> {
    pub fn into_owned(self) -> Vec<u8> {
        match self {
            LeafBytes::Owned(v) => v,
            LeafBytes::Array(a) => array_bytes(&a),
            LeafBytes::Inline(b) => b.as_ref().to_vec(),
        }
    }

    /// Row `i` of this view of a batch whose rows are `width` bytes, copied (inline for
    /// up to [`INLINE_BYTES`]: the column then copies it once more into its buffer, a few bytes for
    /// vector items); `None` where the view holds no such row. An array view reads its
    /// live layout here, so a row past a buffer that changed since is refused, never read.
    pub(crate) fn row(&self, i: usize, width: usize) -> Option<LeafBytes<'static>> {
        Some(LeafBytes::copied(self.as_ref().get(i * width..(i + 1) * width)?))
    }

    /// A copy of `b`: inline for up to [`INLINE_BYTES`], else on the heap.
    pub(crate) fn copied(b: &[u8]) -> LeafBytes<'static> {
        Inline::new(b).map_or_else(|| LeafBytes::Owned(b.to_vec()), LeafBytes::Inline)
    }
}

impl AsRef<[u8]> for LeafBytes<'_> {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        // The small-item arms inline (read twice per field and step: checked, then stored);
        // an array view's live layout is read out of line.
        match self {
            LeafBytes::Inline(b) => b.as_ref(),
            LeafBytes::Owned(v) => v,
            LeafBytes::Array(a) => live_array_bytes(a),
        }
    }
}

/// The bytes of `a` as its layout is now (see [`LeafBytes::as_ref`]).
#[inline(never)]
fn live_array_bytes<'a>(a: &'a Bound<'_, PyUntypedArray>) -> &'a [u8] {
    // The array's layout is read now, not when the view was made: a reshape or resize in
    // between changes the length (the column then rejects the item) but never points
    // outside the live buffer.
    if !a.is_c_contiguous() {
        return &[];
    }
    let n = a.len_total_bytes();
    // SAFETY: `a` is a live C-contiguous numpy array (checked just above) held by the
    // caller's value, so its data pointer addresses `n` readable bytes. The slice borrows
    // that value and the caller copies it before any Python code can run (the thread
    // stays attached and executes only Rust in between).
    unsafe {
        let data = (*a.as_array_ptr()).fields.data.cast::<u8>();
        if n == 0 || data.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(data, n)
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

/// What `value` was, for the error message of a value that does not fit.
fn describe(value: &Bound<'_, PyAny>) -> Got {
    if let Ok(a) = value.cast::<PyUntypedArray>() {
        let dtype = a.dtype().str().map(|s| s.to_string()).unwrap_or_default();
        return Got::Array { shape: a.shape().to_vec(), dtype };
    }
    let ty = value.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    Got::Value { repr: value.repr().map(|r| r.to_string()).unwrap_or_default(), ty }
}

/// The `SpaceMismatchError` for `value`, which is not what `what` expected.
fn mismatch(what: String, expected: Expected, value: &Bound<'_, PyAny>) -> PyErr {
    SpaceMismatchError::new_err(Mismatch { what, expected, got: describe(value) }.to_string())
}

/// A Python float or int, or a numpy float/int/bool scalar, read as a [`Scalar`] with its
/// own type's size; `None` for anything else (the general path converts it).
#[inline]
fn host_scalar(value: &Bound<'_, PyAny>) -> PyResult<Option<(Scalar, usize)>> {
    if value.is_exact_instance_of::<PyFloat>() {
        return Ok(Some((Scalar::Float(value.extract()?), 8)));
    }
    if value.is_exact_instance_of::<PyInt>() {
        return Ok(exact_int(value).map(|v| (Scalar::Int(v), 8)));
    }
    numpy_scalar(value)
}

/// [`host_scalar`] for numpy's scalars.
#[inline(never)]
fn numpy_scalar(value: &Bound<'_, PyAny>) -> PyResult<Option<(Scalar, usize)>> {
    /// numpy's scalar types that the fast path knows, with their dtypes.
    static TYPES: PyOnceLock<Vec<(Py<PyType>, DType)>> = PyOnceLock::new();
    let py = value.py();
    let types = TYPES.get_or_try_init(py, || -> PyResult<_> {
        let np = numpy(py)?;
        let known = [
            ("float32", DType::F32),
            ("float64", DType::F64),
            ("int64", DType::I64),
            ("int32", DType { kind: Kind::Int, size: 4 }),
            ("bool_", DType::BOOL),
        ];
        let mut v = Vec::new();
        for (name, dtype) in known {
            v.push((np.getattr(name)?.cast_into::<PyType>()?.unbind(), dtype));
        }
        Ok(v)
    })?;
    let ty = value.get_type_ptr();
    let Some(&(_, dtype)) = types.iter().find(|(t, _)| t.as_ptr() == ty.cast()) else { return Ok(None) };
    // The value is read where numpy keeps it: `float(x)` or `operator.index(x)` would make
    // a Python object per value (about a quarter of a step's cost per numpy scalar).
    /// numpy's layout of a scalar object (`PyArrayScalar_VAL` in its C API): the object
    /// header, then the value.
    #[repr(C)]
    struct ScalarObject {
        head: pyo3::ffi::PyObject,
        value: [u8; 8],
    }
    let mut raw = [0u8; 8];
    // SAFETY: `value` is a live object whose type is exactly one of the numpy scalar types
    // above, each laid out as a `ScalarObject` holding one value of `dtype.size` (<= 8)
    // bytes right after the header; only those bytes are read.
    unsafe {
        let at = std::ptr::addr_of!((*value.as_ptr().cast::<ScalarObject>()).value).cast::<u8>();
        std::ptr::copy_nonoverlapping(at, raw.as_mut_ptr(), dtype.size);
    }
    Ok(Scalar::read(dtype, &raw[..dtype.size]).map(|s| (s, dtype.size)))
}

/// The value of an exact Python int that fits an i64 (`int(value)`), `None` for a bigger
/// one; read with one C-API call, without pyo3's error check of every -1.
#[inline]
pub(crate) fn exact_int(value: &Bound<'_, PyAny>) -> Option<i64> {
    let mut overflow = 0;
    // SAFETY: `value` is a live object (an exact int for every caller, which cannot fail
    // to convert other than by overflowing) and `overflow` a valid local.
    let v = unsafe { pyo3::ffi::PyLong_AsLongLongAndOverflow(value.as_ptr(), &raw mut overflow) };
    if overflow != 0 || (v == -1 && PyErr::take(value.py()).is_some()) {
        return None;
    }
    Some(v)
}

/// `value.extract::<i64>()`, an exact int that fits read by [`exact_int`].
pub(crate) fn extract_i64(value: &Bound<'_, PyAny>) -> PyResult<i64> {
    if value.is_exact_instance_of::<PyInt>() {
        if let Some(v) = exact_int(value) {
            return Ok(v);
        }
    }
    value.extract()
}

/// Converts one value (or batch of values) into the bytes of leaf `leaf`.
///
/// With `batch = Some(n)`, the value holds `n` items stacked on a leading axis (`None`:
/// take `n` from the value).
#[inline]
fn leaf_bytes<'py>(
    value: &Bound<'py, PyAny>,
    leaf: &Leaf,
    descr: &Bound<'py, PyArrayDescr>,
    batch: Option<Option<usize>>,
    what: &dyn Fn() -> String,
) -> PyResult<LeafBytes<'py>> {
    // Fast paths, inline in the per-step callers: Python and numpy scalars into scalar
    // leaves (no numpy call; the per-step cost of rewards, actions and log-probs), and
    // an array already in the leaf's layout (numpy's own descriptor of the leaf's dtype,
    // one object per builtin dtype; the leaf's shape; C layout).
    if batch.is_none() {
        if leaf.shape.is_empty() {
            if let Some(bytes) = host_scalar(value)?.and_then(|(s, size)| s.encode(size, leaf.dtype)) {
                return Ok(LeafBytes::Inline(bytes));
            }
        }
        if let Ok(array) = value.cast::<PyUntypedArray>() {
            if in_leaf_layout(array, leaf, descr.as_ptr()) {
                return Ok(view_or_copy(array.clone(), leaf.item_bytes()));
            }
        }
    }
    convert_leaf(value, leaf, descr, batch, what)
}

/// Whether `array` is one item of `leaf` as the column stores it: numpy's own descriptor
/// of the leaf's dtype (`descr`: one object per builtin dtype), the leaf's shape, C layout.
#[inline]
fn in_leaf_layout(array: &Bound<'_, PyUntypedArray>, leaf: &Leaf, descr: *mut pyo3::ffi::PyObject) -> bool {
    // SAFETY: `array` is a live numpy array; its descriptor pointer is only compared.
    let same_descr = unsafe { (*array.as_array_ptr()).fields.descr.cast() == descr };
    same_descr && array.shape().iter().eq(leaf.shape.iter()) && array.is_c_contiguous()
}

/// The bytes of `value` for a spec of one leaf where [`leaf_bytes`] takes one of its fast
/// paths (a Python or numpy scalar into a scalar leaf, an array already in the leaf's
/// layout), without its error plumbing; `None` otherwise (then [`one_leaf_view`] gives the
/// bytes, or the error).
#[inline]
pub fn one_leaf_fast<'py>(spec: &Spec, value: &Bound<'py, PyAny>) -> Option<LeafBytes<'py>> {
    let (Tree::Leaf(0), [leaf], [descr]) =
        (&spec.tree, spec.schema.leaves.as_slice(), spec.descrs.as_slice())
    else {
        return None;
    };
    if leaf.shape.is_empty() {
        if let Ok(Some((s, size))) = host_scalar(value) {
            if let Some(bytes) = s.encode(size, leaf.dtype) {
                return Some(LeafBytes::Inline(bytes));
            }
        }
    }
    let array = value.cast::<PyUntypedArray>().ok()?;
    in_leaf_layout(array, leaf, descr.as_ptr()).then(|| view_or_copy(array.clone(), leaf.item_bytes()))
}

/// [`leaf_bytes`] for values that its fast paths do not take.
#[inline(never)]
fn convert_leaf<'py>(
    value: &Bound<'py, PyAny>,
    leaf: &Leaf,
    descr: &Bound<'py, PyArrayDescr>,
    batch: Option<Option<usize>>,
    what: &dyn Fn() -> String,
) -> PyResult<LeafBytes<'py>> {
    let py = value.py();
    let mismatch = || mismatch(what(), Expected::Leaf { leaf: leaf.clone(), batch: batch.is_some() }, value);
    let array = match value.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => numpy(py)?
            .getattr("asarray")?
            .call1((value,))
            .map_err(|_| mismatch())?
            .cast_into::<PyUntypedArray>()?,
    };
    let given = array.dtype();
    let fits = leaf.items_in(array.shape(), batch).is_some()
        && kind_of(&given).is_some_and(|kind| kind.casts_to(leaf.dtype.kind));
    if !fits {
        return Err(mismatch());
    }
    // Identity first: numpy shares one descriptor object per builtin dtype, so the
    // common case skips the C-API equivalence call.
    if (given.is(descr) || given.is_equiv_to(descr)) && array.is_c_contiguous() {
        let n = array.shape().iter().product::<usize>() * given.itemsize();
        return Ok(view_or_copy(array, n));
    }
    let cast =
        numpy(py)?.getattr("ascontiguousarray")?.call1((&array, descr))?.cast_into::<PyUntypedArray>()?;
    Ok(LeafBytes::Array(cast))
}

/// `array` (live, C-contiguous, `n` bytes) as leaf bytes: a small item (up to
/// [`INLINE_BYTES`]) copied now, so that storing it reads no layout; a view otherwise.
#[inline]
fn view_or_copy(array: Bound<'_, PyUntypedArray>, n: usize) -> LeafBytes<'_> {
    if n <= INLINE_BYTES {
        // SAFETY: `array` is a live C-contiguous numpy array of `n` bytes (the caller's
        // contract), so its data pointer addresses `n` readable bytes (or is unused for
        // `n == 0`); they are copied at once, with the thread attached and no Python code
        // in between.
        let bytes = unsafe {
            let data = (*array.as_array_ptr()).fields.data.cast::<u8>();
            if n == 0 || data.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(data, n)
            }
        };
        if let Some(small) = Inline::new(bytes) {
            return LeafBytes::Inline(small);
        }
    }
    LeafBytes::Array(array)
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

/// The bytes of `value` for a spec of one leaf (a Box, Discrete or scalar field), as
/// [`to_leaf_views`] gives them for one item; `None` for a spec of several leaves.
#[inline]
pub fn one_leaf_view<'py>(
    spec: &Spec,
    value: &Bound<'py, PyAny>,
    field: &dyn Fn() -> String,
) -> Option<PyResult<LeafBytes<'py>>> {
    let Tree::Leaf(0) = spec.tree else { return None };
    Some(leaf_bytes(value, &spec.schema.leaves[0], spec.descrs[0].bind(value.py()), None, field))
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
                    let key = key.repr().map(|r| r.to_string()).unwrap_or_default();
                    mismatch(what(path), Expected::DictKey(key), value)
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
                return Err(mismatch(what(path), Expected::Tuple(entries.len()), value));
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
    match Scalar::decode(leaf.dtype, bytes).filter(|_| host_scalar) {
        Some(Scalar::Float(v)) => return Ok(PyFloat::new(py, v).into_any()),
        Some(Scalar::Int(v)) => return Ok(v.into_pyobject(py)?.into_any()),
        Some(Scalar::Bool(b)) => return Ok(PyBool::new(py, b).to_owned().into_any()),
        None => {}
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
    let mut dict = |entries: Vec<(&Py<PyAny>, Bound<'py, PyAny>)>| {
        let d = PyDict::new(py);
        for (k, v) in entries {
            d.set_item(k.bind(py), v)?;
        }
        Ok(d.into_any())
    };
    let mut tuple = |items: Vec<Bound<'py, PyAny>>| Ok(PyTuple::new(py, items)?.into_any());
    let missing = || pyo3::exceptions::PyRuntimeError::new_err("internal error: leaf used twice");
    tree.nest(leaves, &mut dict, &mut tuple, &missing)
}

/// The spec of a float32 scalar Box (RLlib's space for rewards buffers), shared.
pub fn f32_scalar(py: Python<'_>) -> Arc<Spec> {
    static F32: PyOnceLock<Arc<Spec>> = PyOnceLock::new();
    Arc::clone(F32.get_or_init(py, || {
        Arc::new(Spec {
            tree: Tree::Leaf(0),
            schema: Arc::new(Schema::new(vec![Leaf::new(DType::F32, vec![])])),
            descrs: vec![numpy::dtype::<f32>(py).unbind()],
            from_space: true,
        })
    }))
}

/// The shape and dtype leaf `i` of `spec` reads out as (see [`Leaf::out_shape`]: float32
/// one-hot slots where asked), and whether it is one-hot encoded.
fn out_layout<'py>(
    py: Python<'py>,
    spec: &Spec,
    i: usize,
    one_hot: bool,
) -> (Vec<usize>, Bound<'py, PyArrayDescr>, bool) {
    let (shape, hot) = spec.schema.leaves[i].out_shape(one_hot);
    let descr = if hot { numpy::dtype::<f32>(py) } else { spec.descrs[i].bind(py).clone() };
    (shape, descr, hot)
}

/// One Python value per leaf of `spec`, made by `make(i, out shape, out dtype, one-hot)`
/// (see [`out_layout`]), nested by the spec.
fn per_leaf<'py>(
    py: Python<'py>,
    spec: &Spec,
    one_hot: bool,
    mut make: impl FnMut(usize, Vec<usize>, &Bound<'py, PyArrayDescr>, bool) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut values = Vec::with_capacity(spec.schema.leaves.len());
    for i in 0..spec.schema.leaves.len() {
        let (shape, descr, hot) = out_layout(py, spec, i, one_hot);
        values.push(Some(make(i, shape, &descr, hot)?));
    }
    nest(py, &spec.tree, &mut values)
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
    per_leaf(py, spec, one_hot, |i, shape, descr, hot| {
        let leaf = &spec.schema.leaves[i];
        let item = column.item(i, pos);
        if hot {
            let mut out = Vec::new();
            leaf.write_one_hot(&item, &mut out);
            new_array(py, descr, &shape, &out)
        } else if leaf.shape.is_empty() {
            scalar(py, descr, leaf, &item, host_scalars)
        } else {
            new_array(py, descr, &shape, &item)
        }
    })
}

/// The fill item of a spec: one `np.full(leaf_shape, fill, leaf_dtype)` per leaf (float32
/// slots of the one-hot width for discrete leaves under `one_hot`), as bytes.
pub fn fill_leaves(
    py: Python<'_>,
    spec: &Spec,
    fill: &Bound<'_, PyAny>,
    one_hot: bool,
) -> PyResult<Vec<Vec<u8>>> {
    let full = numpy(py)?.getattr("full")?;
    (0..spec.schema.leaves.len())
        .map(|i| {
            let (shape, descr, _) = out_layout(py, spec, i, one_hot);
            Ok(array_bytes(&full.call1((shape, fill, descr))?.cast_into::<PyUntypedArray>()?))
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
    per_leaf(py, spec, one_hot, |i, shape, descr, _| new_array(py, descr, &shape, &bytes[i]))
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
    per_leaf(py, spec, one_hot, |i, item_shape, descr, hot| {
        let shape: Vec<usize> = std::iter::once(positions.len()).chain(item_shape).collect();
        let fill_i = fill.map(|f| f[i].as_slice());
        new_array_with(py, descr, &shape, |buf| column.gather_into(i, positions, fill_i, hot, buf))
    })
}
