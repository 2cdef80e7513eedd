//! Space schemas: what one item of a column looks like once flattened into leaves.
//!
//! A gymnasium space (Box of any dtype, Discrete, MultiDiscrete, MultiBinary, nested
//! Dict/Tuple) flattens into an ordered list of leaves, each a fixed-shape array of one
//! numpy dtype. The binding layer walks the Python space and builds the [`Schema`]; the core
//! only needs each leaf's dtype and shape to store, slice and one-hot encode items.

use std::fmt;

pub mod tree;
pub mod value;

pub use tree::Tree;
pub use value::{Expected, Got, Inline, Mismatch, PyShape, Scalar, INLINE_BYTES};

/// The kind of a numpy dtype, as far as the core needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Bool,
    Int,
    UInt,
    Float,
    Complex,
}

impl Kind {
    /// numpy's one-letter `dtype.kind` code.
    #[must_use]
    pub fn code(self) -> char {
        match self {
            Kind::Bool => 'b',
            Kind::Int => 'i',
            Kind::UInt => 'u',
            Kind::Float => 'f',
            Kind::Complex => 'c',
        }
    }

    /// Parses numpy's one-letter `dtype.kind` code.
    #[must_use]
    pub fn from_code(code: char) -> Option<Kind> {
        Some(match code {
            'b' => Kind::Bool,
            'i' => Kind::Int,
            'u' => Kind::UInt,
            'f' => Kind::Float,
            'c' => Kind::Complex,
            _ => return None,
        })
    }
}

/// A fixed-size numeric dtype (native byte order): kind and size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DType {
    pub kind: Kind,
    pub size: usize,
}

impl DType {
    pub const BOOL: DType = DType { kind: Kind::Bool, size: 1 };
    pub const I64: DType = DType { kind: Kind::Int, size: 8 };
    pub const F32: DType = DType { kind: Kind::Float, size: 4 };
    pub const F64: DType = DType { kind: Kind::Float, size: 8 };

    /// Reads one element stored at the start of `bytes` as an integer, for one-hot
    /// encoding. `None` for non-integer kinds.
    #[must_use]
    pub fn read_int(self, bytes: &[u8]) -> Option<i64> {
        let b = bytes.get(..self.size)?;
        Some(match (self.kind, self.size) {
            (Kind::Int, 1) => i64::from(i8::from_ne_bytes([b[0]])),
            (Kind::Int, 2) => i64::from(i16::from_ne_bytes([b[0], b[1]])),
            (Kind::Int, 4) => i64::from(i32::from_ne_bytes(b.try_into().ok()?)),
            (Kind::Int, 8) => i64::from_ne_bytes(b.try_into().ok()?),
            (Kind::UInt | Kind::Bool, 1) => i64::from(b[0]),
            (Kind::UInt, 2) => i64::from(u16::from_ne_bytes([b[0], b[1]])),
            (Kind::UInt, 4) => i64::from(u32::from_ne_bytes(b.try_into().ok()?)),
            (Kind::UInt, 8) => i64::try_from(u64::from_ne_bytes(b.try_into().ok()?)).ok()?,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.kind {
            Kind::Bool => return f.write_str("bool"),
            Kind::Int => "int",
            Kind::UInt => "uint",
            Kind::Float => "float",
            Kind::Complex => "complex",
        };
        write!(f, "{name}{}", self.size * 8)
    }
}

/// How a leaf is one-hot encoded on request (`one_hot_discrete=True`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OneHot {
    /// Not a discrete leaf: returned as stored.
    No,
    /// A `Discrete(n)` leaf: a scalar index becomes `n` float32 slots.
    Discrete { n: usize, start: i64 },
    /// A `MultiDiscrete(nvec)` leaf: each index becomes `nvec[i]` slots, concatenated.
    MultiDiscrete { nvec: Vec<usize>, start: Vec<i64> },
}

/// One leaf of a flattened space.
#[derive(Clone, Debug, Eq)]
pub struct Leaf {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub one_hot: OneHot,
}

/// Written out rather than derived: the derived form compares `shape` with one `memcmp`
/// call, and glibc's vectorized `memcmp` cost ~80 ns per call on these few bytes on the
/// machines measured (criterion: a 4-field layout check took 360 ns derived, 21 ns so).
/// The runners compare each sub-env's layouts on every step.
impl PartialEq for Leaf {
    fn eq(&self, other: &Leaf) -> bool {
        self.dtype == other.dtype && self.shape.iter().eq(other.shape.iter()) && self.one_hot == other.one_hot
    }
}

impl Leaf {
    #[must_use]
    pub fn new(dtype: DType, shape: Vec<usize>) -> Leaf {
        Leaf { dtype, shape, one_hot: OneHot::No }
    }

    /// Number of scalar elements in one item.
    #[must_use]
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes in one item.
    #[must_use]
    pub fn item_bytes(&self) -> usize {
        self.numel() * self.dtype.size
    }

    /// The width of this leaf's one-hot encoding, `None` if it is not discrete.
    #[must_use]
    pub fn one_hot_width(&self) -> Option<usize> {
        match &self.one_hot {
            OneHot::No => None,
            OneHot::Discrete { n, .. } => Some(*n),
            OneHot::MultiDiscrete { nvec, .. } => Some(nvec.iter().sum()),
        }
    }

    /// Appends the float32 one-hot encoding of one stored item to `out`.
    pub fn write_one_hot(&self, item: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + self.one_hot_width().map_or(item.len(), |w| w * 4), 0);
        self.write_one_hot_into(item, &mut out[start..]);
    }

    /// Writes the float32 one-hot encoding of one stored item into `out`, which holds
    /// exactly one encoded item (`one_hot_width() * 4` bytes; the item itself for
    /// non-discrete leaves).
    ///
    /// Indices outside the space's range give an all-zero slot group (numpy-style one-hot
    /// of an invalid index would raise; a column only holds validated items, so this only
    /// guards against data set through `set_*` without a space check).
    pub fn write_one_hot_into(&self, item: &[u8], out: &mut [u8]) {
        let mut slots = out.chunks_exact_mut(4);
        let mut put_group = |value: i64, start: i64, n: usize| {
            let hot = value.checked_sub(start).and_then(|v| usize::try_from(v).ok());
            for (slot, dst) in (0..n).zip(slots.by_ref()) {
                let v: f32 = if hot == Some(slot) { 1.0 } else { 0.0 };
                dst.copy_from_slice(&v.to_ne_bytes());
            }
        };
        match &self.one_hot {
            OneHot::No => {
                let n = out.len().min(item.len());
                out[..n].copy_from_slice(&item[..n]);
            }
            OneHot::Discrete { n, start } => {
                let value = self.dtype.read_int(item).unwrap_or(-1);
                put_group(value, *start, *n);
            }
            OneHot::MultiDiscrete { nvec, start } => {
                for (i, (&n, &s)) in nvec.iter().zip(start).enumerate() {
                    let at = i * self.dtype.size;
                    let value = item.get(at..).and_then(|b| self.dtype.read_int(b)).unwrap_or(-1);
                    put_group(value, s, n);
                }
            }
        }
    }
}

/// The flattened form of a space: its leaves in the order the binding layer walks them
/// (Dict keys sorted, as gymnasium orders them; Tuple entries in order).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Schema {
    pub leaves: Vec<Leaf>,
    /// Bytes in one item of each leaf ([`Leaf::item_bytes`]), computed once: every stored
    /// step checks its items' sizes against them.
    sizes: Vec<usize>,
}

impl Schema {
    #[must_use]
    pub fn new(leaves: Vec<Leaf>) -> Schema {
        let sizes = leaves.iter().map(Leaf::item_bytes).collect();
        Schema { leaves, sizes }
    }

    /// Bytes in one item of each leaf, in leaf order.
    #[must_use]
    pub fn leaf_sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Bytes of one whole item across all leaves.
    #[must_use]
    pub fn item_bytes(&self) -> usize {
        self.leaves.iter().map(Leaf::item_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_sizes_are_the_leaves_item_bytes() {
        let schema = Schema::new(vec![
            Leaf::new(DType::F32, vec![4]),
            Leaf::new(DType::I64, vec![]),
            Leaf::new(DType::F64, vec![2, 3]),
        ]);
        assert_eq!(schema.leaf_sizes(), &[16, 8, 48]);
        assert_eq!(schema.item_bytes(), 72);
        assert!(Schema::default().leaf_sizes().is_empty());
    }

    #[test]
    fn read_int_covers_all_int_widths() {
        assert_eq!(DType { kind: Kind::Int, size: 1 }.read_int(&[0xff]), Some(-1));
        assert_eq!(DType { kind: Kind::UInt, size: 1 }.read_int(&[0xff]), Some(255));
        assert_eq!(DType { kind: Kind::Int, size: 2 }.read_int(&(-3i16).to_ne_bytes()), Some(-3));
        assert_eq!(DType { kind: Kind::Int, size: 4 }.read_int(&7i32.to_ne_bytes()), Some(7));
        assert_eq!(DType::I64.read_int(&(-9i64).to_ne_bytes()), Some(-9));
        assert_eq!(DType { kind: Kind::UInt, size: 8 }.read_int(&u64::MAX.to_ne_bytes()), None);
        assert_eq!(DType::F32.read_int(&1f32.to_ne_bytes()), None);
        assert_eq!(DType::I64.read_int(&[1, 2]), None, "too few bytes");
    }

    #[test]
    fn one_hot_discrete_and_multidiscrete() {
        let mut leaf = Leaf::new(DType::I64, vec![]);
        leaf.one_hot = OneHot::Discrete { n: 3, start: 0 };
        let mut out = Vec::new();
        leaf.write_one_hot(&2i64.to_ne_bytes(), &mut out);
        let vals: Vec<f32> = out.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(vals, vec![0.0, 0.0, 1.0]);

        let mut md = Leaf::new(DType { kind: Kind::Int, size: 4 }, vec![2]);
        md.one_hot = OneHot::MultiDiscrete { nvec: vec![2, 3], start: vec![0, 0] };
        let mut item = 1i32.to_ne_bytes().to_vec();
        item.extend_from_slice(&0i32.to_ne_bytes());
        let mut out = Vec::new();
        md.write_one_hot(&item, &mut out);
        let vals: Vec<f32> = out.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(vals, vec![0.0, 1.0, 1.0, 0.0, 0.0]);
        assert_eq!(md.one_hot_width(), Some(5));
    }

    #[test]
    fn sizes_and_display() {
        let leaf = Leaf::new(DType::F32, vec![2, 3]);
        assert_eq!(leaf.numel(), 6);
        assert_eq!(leaf.item_bytes(), 24);
        let schema = Schema::new(vec![leaf, Leaf::new(DType::I64, vec![])]);
        assert_eq!(schema.item_bytes(), 32);
        assert_eq!(DType::F32.to_string(), "float32");
        assert_eq!(DType::BOOL.to_string(), "bool");
        assert_eq!(Kind::from_code('u'), Some(Kind::UInt));
        assert_eq!(Kind::from_code('O'), None);
        assert_eq!(Kind::Float.code(), 'f');
    }
}
