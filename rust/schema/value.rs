//! The rules for a host value going into a leaf: which dtypes may be cast into which, when
//! a value's shape holds one item (or a batch) of a leaf, how a scalar is encoded without
//! the host's array machinery, and how a value that does not fit is described.

use std::fmt;

use super::{DType, Kind, Leaf};

impl Kind {
    /// Whether data of this kind may be stored in a leaf of kind `to` without losing
    /// meaning: bool into anything, ints into ints and floats, floats into floats; never
    /// a float into an int or bool leaf.
    #[must_use]
    pub fn casts_to(self, to: Kind) -> bool {
        use Kind::{Bool, Complex, Float, Int, UInt};
        match self {
            Bool => true,
            Int | UInt => matches!(to, Int | UInt | Float | Complex),
            Float => matches!(to, Float | Complex),
            Complex => to == Complex,
        }
    }
}

impl Leaf {
    /// How many items of this leaf a value of `shape` holds: 1 for one item (`batch`
    /// `None`, the shape is the leaf's), or the length of the first axis of a batch of
    /// items (`Some(n)`: exactly `n` of them; `Some(None)`: any number). `None` if the
    /// shape does not fit.
    #[must_use]
    pub fn items_in(&self, shape: &[usize], batch: Option<Option<usize>>) -> Option<usize> {
        let (n, item) = match batch {
            None => (1, shape),
            Some(want) => {
                let (&n, item) = shape.split_first()?;
                if want.is_some_and(|w| w != n) {
                    return None;
                }
                (n, item)
            }
        };
        (item == self.shape.as_slice()).then_some(n)
    }
}

impl Leaf {
    /// The shape one item of this leaf reads out as, and whether it is one-hot encoded:
    /// `[width]` float32 slots where `one_hot` is asked of a discrete leaf, else its own.
    #[must_use]
    pub fn out_shape(&self, one_hot: bool) -> (Vec<usize>, bool) {
        match self.one_hot_width() {
            Some(w) if one_hot => (vec![w], true),
            _ => (self.shape.clone(), false),
        }
    }
}

/// A shape as Python prints it: `()`, `(4,)`, `(2, 3)`.
pub struct PyShape<'a>(pub &'a [usize]);

impl fmt::Display for PyShape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => f.write_str("()"),
            [n] => write!(f, "({n},)"),
            [first, rest @ ..] => {
                write!(f, "({first}")?;
                for d in rest {
                    write!(f, ", {d}")?;
                }
                f.write_str(")")
            }
        }
    }
}

/// A leaf as error messages describe it: `shape (2, 3) and dtype float32`.
impl fmt::Display for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shape {} and dtype {}", PyShape(&self.shape), self.dtype)
    }
}

/// The most bytes an [`Inline`] holds: a float32[4] observation (CartPole's), in no more
/// room than the `Vec` of an owned item takes.
pub const INLINE_BYTES: usize = 16;

/// The bytes of a small item held inline: a scalar (actions, rewards and log-probs of every
/// step) or a small array, up to [`INLINE_BYTES`] (no heap block per step and field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inline {
    bytes: [u8; INLINE_BYTES],
    len: u8,
}

impl Inline {
    /// A copy of `b`; `None` if it is longer than [`INLINE_BYTES`].
    #[must_use]
    #[inline]
    pub fn new(b: &[u8]) -> Option<Inline> {
        let mut bytes = [0u8; INLINE_BYTES];
        bytes.get_mut(..b.len())?.copy_from_slice(b);
        Some(Inline { bytes, len: b.len() as u8 })
    }
}

impl AsRef<[u8]> for Inline {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// A host scalar read once (a Python float/int, a numpy float/int/bool scalar), on its way
/// into a scalar leaf.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Float(f64),
    Int(i64),
    Bool(bool),
}

impl Scalar {
    /// The bytes of this scalar, whose own type is `size` bytes wide, in a scalar leaf of
    /// dtype `to`, where the cast is one numpy makes with the same result: floats into
    /// float32/float64 (rounded to nearest), ints and bools into int64, ints of at most 4
    /// bytes and bools into int32, bools into bool. `None` otherwise: the caller converts
    /// through numpy, which also reports what does not fit.
    #[must_use]
    #[inline]
    pub fn encode(self, size: usize, to: DType) -> Option<Inline> {
        match (self, to.kind, to.size) {
            (Scalar::Float(v), Kind::Float, 4) => Inline::new(&(v as f32).to_ne_bytes()),
            (Scalar::Float(v), Kind::Float, 8) => Inline::new(&v.to_ne_bytes()),
            (Scalar::Int(v), Kind::Int, 8) => Inline::new(&v.to_ne_bytes()),
            (Scalar::Bool(b), Kind::Int, 8) => Inline::new(&i64::from(b).to_ne_bytes()),
            (Scalar::Int(v), Kind::Int, 4) if size <= 4 => Inline::new(&i32::try_from(v).ok()?.to_ne_bytes()),
            (Scalar::Bool(b), Kind::Int, 4) => Inline::new(&i32::from(b).to_ne_bytes()),
            (Scalar::Bool(b), Kind::Bool, 1) => Inline::new(&[u8::from(b)]),
            _ => None,
        }
    }
}

impl Scalar {
    /// The scalar whose native bytes of dtype `dtype` are `bytes` (a numpy scalar's own
    /// value): float32/float64, int32/int64 or bool; `None` for other dtypes or a slice
    /// of another size.
    #[must_use]
    pub fn read(dtype: DType, bytes: &[u8]) -> Option<Scalar> {
        match (dtype.kind, dtype.size) {
            (Kind::Float, 4) => Some(Scalar::Float(f64::from(f32::from_ne_bytes(bytes.try_into().ok()?)))),
            (Kind::Int, 4) => Some(Scalar::Int(i64::from(i32::from_ne_bytes(bytes.try_into().ok()?)))),
            (Kind::Float | Kind::Int, 8) | (Kind::Bool, 1) => Scalar::decode(dtype, bytes),
            _ => None,
        }
    }

    /// A stored scalar item read back as the host scalar it was given as (a leaf of
    /// `float64`, `int64` or `bool`, the dtypes inferred from host scalars); `None` for
    /// other dtypes, which read back as numpy scalars.
    #[must_use]
    pub fn decode(dtype: DType, bytes: &[u8]) -> Option<Scalar> {
        match (dtype.kind, dtype.size) {
            (Kind::Float, 8) => Some(Scalar::Float(f64::from_ne_bytes(bytes.try_into().ok()?))),
            (Kind::Int, 8) => Some(Scalar::Int(i64::from_ne_bytes(bytes.try_into().ok()?))),
            (Kind::Bool, 1) => Some(Scalar::Bool(*bytes.first()? != 0)),
            _ => None,
        }
    }
}

/// What a value that did not fit was, for the error message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Got {
    /// An array: its shape and its dtype's text (numpy's `dtype.str`).
    Array { shape: Vec<usize>, dtype: String },
    /// Anything else: its repr (clipped to 80 characters) and its type's name.
    Value { repr: String, ty: String },
}

impl fmt::Display for Got {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Got::Array { shape, dtype } => {
                write!(f, "an array of shape {} and dtype {dtype}", PyShape(shape))
            }
            Got::Value { repr, ty } => {
                const MAX: usize = 80;
                if repr.chars().count() > MAX {
                    let clipped: String = repr.chars().take(MAX - 3).collect();
                    write!(f, "{clipped}... (a {ty})")
                } else {
                    write!(f, "{repr} (a {ty})")
                }
            }
        }
    }
}

/// What a part of a field's layout expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// One item (or, with `batch`, a batch of items) of a leaf.
    Leaf { leaf: Leaf, batch: bool },
    /// A dict holding the key (its repr).
    DictKey(String),
    /// A tuple of this many items.
    Tuple(usize),
}

/// A value that does not fit a field's layout: `what` names the part of the field
/// (`observation['pos'][0]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub what: String,
    pub expected: Expected,
    pub got: Got,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: expected ", self.what)?;
        match &self.expected {
            Expected::Leaf { leaf, batch } => {
                write!(f, "{}{leaf}", if *batch { "a batch of items of " } else { "" })?;
            }
            Expected::DictKey(key) => write!(f, "a dict with key {key}")?,
            Expected::Tuple(n) => write!(f, "a tuple of {n} items")?,
        }
        write!(f, ", got {}", self.got)
    }
}

impl std::error::Error for Mismatch {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_keep_meaning() {
        use Kind::{Bool, Complex, Float, Int, UInt};
        assert!([Bool, Int, UInt, Float, Complex].iter().all(|&k| Bool.casts_to(k)));
        assert!(Int.casts_to(UInt) && UInt.casts_to(Float) && Int.casts_to(Complex));
        assert!(!Int.casts_to(Bool), "an int is not a truth value");
        assert!(!Float.casts_to(Int) && !Float.casts_to(Bool), "a float loses its fraction");
        assert!(Float.casts_to(Complex) && !Complex.casts_to(Float));
    }

    #[test]
    fn items_in_one_item_or_a_batch() {
        let leaf = Leaf::new(DType::F32, vec![2, 3]);
        assert_eq!(leaf.items_in(&[2, 3], None), Some(1));
        assert_eq!(leaf.items_in(&[3, 2], None), None);
        assert_eq!(leaf.items_in(&[5, 2, 3], Some(None)), Some(5));
        assert_eq!(leaf.items_in(&[5, 2, 3], Some(Some(5))), Some(5));
        assert_eq!(leaf.items_in(&[4, 2, 3], Some(Some(5))), None, "a batch of the wrong length");
        assert_eq!(leaf.items_in(&[2, 3], Some(None)), None, "one item is no batch");
        let scalar = Leaf::new(DType::I64, vec![]);
        assert_eq!(scalar.items_in(&[], None), Some(1));
        assert_eq!(scalar.items_in(&[], Some(None)), None, "a 0-d value has no first axis");
        assert_eq!(scalar.items_in(&[0], Some(None)), Some(0));
    }

    #[test]
    fn one_hot_reads_out_as_float_slots_of_discrete_leaves_only() {
        let mut leaf = Leaf::new(DType::I64, vec![]);
        assert_eq!(leaf.out_shape(true), (vec![], false), "not discrete");
        leaf.one_hot = super::super::OneHot::Discrete { n: 4, start: 0 };
        assert_eq!(leaf.out_shape(true), (vec![4], true));
        assert_eq!(leaf.out_shape(false), (vec![], false));
    }

    #[test]
    fn shapes_and_leaves_print_as_python_does() {
        assert_eq!(PyShape(&[]).to_string(), "()");
        assert_eq!(PyShape(&[4]).to_string(), "(4,)");
        assert_eq!(PyShape(&[2, 3, 1]).to_string(), "(2, 3, 1)");
        assert_eq!(Leaf::new(DType::F32, vec![2]).to_string(), "shape (2,) and dtype float32");
    }

    #[test]
    fn inline_holds_up_to_sixteen_bytes() {
        assert_eq!(Inline::new(&[1, 2, 3]).map(|i| i.as_ref().to_vec()), Some(vec![1, 2, 3]));
        assert_eq!(Inline::new(&[7; 16]).map(|i| i.as_ref().len()), Some(16));
        assert_eq!(Inline::new(&[0; 17]), None);
        assert_eq!(Inline::new(&[]).map(|i| i.as_ref().len()), Some(0));
    }

    #[test]
    fn scalars_encode_where_numpy_casts_the_same() {
        let bytes = |s: Scalar, size: usize, to: DType| s.encode(size, to).map(|i| i.as_ref().to_vec());
        assert_eq!(bytes(Scalar::Float(0.1), 8, DType::F32), Some(0.1f32.to_ne_bytes().to_vec()));
        assert_eq!(bytes(Scalar::Float(0.1), 4, DType::F64), Some(0.1f64.to_ne_bytes().to_vec()));
        assert_eq!(bytes(Scalar::Int(-3), 8, DType::I64), Some((-3i64).to_ne_bytes().to_vec()));
        assert_eq!(bytes(Scalar::Bool(true), 1, DType::I64), Some(1i64.to_ne_bytes().to_vec()));
        let i32_ = DType { kind: Kind::Int, size: 4 };
        assert_eq!(bytes(Scalar::Int(7), 4, i32_), Some(7i32.to_ne_bytes().to_vec()));
        assert_eq!(bytes(Scalar::Int(7), 8, i32_), None, "an int64 into int32 goes through numpy");
        assert_eq!(bytes(Scalar::Int(1 << 40), 4, i32_), None, "never wraps");
        assert_eq!(bytes(Scalar::Bool(false), 1, DType::BOOL), Some(vec![0]));
        assert_eq!(bytes(Scalar::Int(1), 8, DType::BOOL), None, "an int is not a truth value");
        assert_eq!(bytes(Scalar::Float(1.0), 8, DType::I64), None, "a float into an int leaf");
        assert_eq!(bytes(Scalar::Int(1), 8, DType::F64), None, "left to numpy");
        assert_eq!(bytes(Scalar::Float(1.0), 8, DType { kind: Kind::Float, size: 2 }), None);
    }

    #[test]
    fn host_scalars_read_back_as_given() {
        assert_eq!(Scalar::decode(DType::F64, &2.5f64.to_ne_bytes()), Some(Scalar::Float(2.5)));
        assert_eq!(Scalar::decode(DType::I64, &(-4i64).to_ne_bytes()), Some(Scalar::Int(-4)));
        assert_eq!(Scalar::decode(DType::BOOL, &[2]), Some(Scalar::Bool(true)));
        assert_eq!(Scalar::decode(DType::F32, &1f32.to_ne_bytes()), None, "a numpy scalar");
        assert_eq!(Scalar::decode(DType::I64, &[1, 2]), None, "too few bytes");
        assert_eq!(Scalar::decode(DType::BOOL, &[]), None);
    }

    #[test]
    fn numpy_scalars_read_from_their_native_bytes() {
        let i32_ = DType { kind: Kind::Int, size: 4 };
        assert_eq!(
            Scalar::read(DType::F32, &(-0.69f32).to_ne_bytes()),
            Some(Scalar::Float(f64::from(-0.69f32)))
        );
        assert_eq!(Scalar::read(DType::F64, &0.1f64.to_ne_bytes()), Some(Scalar::Float(0.1)));
        assert_eq!(Scalar::read(i32_, &(-7i32).to_ne_bytes()), Some(Scalar::Int(-7)));
        assert_eq!(Scalar::read(DType::I64, &(1i64 << 40).to_ne_bytes()), Some(Scalar::Int(1 << 40)));
        assert_eq!(Scalar::read(DType::BOOL, &[1]), Some(Scalar::Bool(true)));
        assert_eq!(Scalar::read(DType::F32, &[0; 8]), None, "a slice of another size");
        assert_eq!(Scalar::read(DType { kind: Kind::UInt, size: 8 }, &[0; 8]), None);
    }

    #[test]
    fn mismatches_name_the_part_what_it_expected_and_what_it_got() {
        let leaf = Leaf::new(DType::F32, vec![2]);
        let array = Got::Array { shape: vec![3], dtype: "<f8".into() };
        let m = Mismatch {
            what: "observation".into(),
            expected: Expected::Leaf { leaf, batch: false },
            got: array,
        };
        assert_eq!(
            m.to_string(),
            "observation: expected shape (2,) and dtype float32, got an array of shape (3,) and dtype <f8"
        );
        let batch = Mismatch {
            expected: Expected::Leaf { leaf: Leaf::new(DType::I64, vec![]), batch: true },
            ..m.clone()
        };
        assert!(batch
            .to_string()
            .starts_with("observation: expected a batch of items of shape () and dtype int64, "));
        let value = Got::Value { repr: "'x'".into(), ty: "str".into() };
        let key =
            Mismatch { what: "action".into(), expected: Expected::DictKey("'a'".into()), got: value.clone() };
        assert_eq!(key.to_string(), "action: expected a dict with key 'a', got 'x' (a str)");
        let tuple = Mismatch { what: "action[0]".into(), expected: Expected::Tuple(2), got: value };
        assert_eq!(tuple.to_string(), "action[0]: expected a tuple of 2 items, got 'x' (a str)");
    }

    #[test]
    fn long_reprs_are_clipped_on_character_boundaries() {
        let long = Got::Value { repr: "é".repeat(100), ty: "str".into() };
        assert_eq!(long.to_string(), format!("{}... (a str)", "é".repeat(77)));
        let exact = Got::Value { repr: "x".repeat(80), ty: "str".into() };
        assert_eq!(exact.to_string(), format!("{} (a str)", "x".repeat(80)));
    }
}
