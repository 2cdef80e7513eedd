//! Typed columns with look-back.
//!
//! A [`Column`] holds one kind of data of one episode (its observations, actions, one extra
//! model output, ...): one contiguous byte buffer per schema leaf, a length and a look-back
//! length. Appending copies only the item's bytes (amortised O(1)); reads resolve indices
//! through [`index::Geometry`] and gather bytes leaf by leaf, ready to become numpy arrays
//! with a single copy.

pub mod index;
pub mod stream;

use std::fmt;
use std::sync::Arc;

use crate::schema::{Leaf, Schema};
pub use index::{Geometry, Index, IndexError, Pos, Resolved};

/// Errors of column operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnError {
    /// An item's leaf has the wrong number of bytes for the schema.
    ItemSize {
        leaf: usize,
        expected: usize,
        got: usize,
    },
    /// An item has the wrong number of leaves.
    LeafCount {
        expected: usize,
        got: usize,
    },
    Index(IndexError),
    /// `set` got a different number of items than the index selects.
    SetLength {
        selected: usize,
        given: usize,
    },
}

impl fmt::Display for ColumnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ColumnError::ItemSize { leaf, expected, got } => {
                write!(f, "leaf {leaf} of the item has {got} bytes, expected {expected}")
            }
            ColumnError::LeafCount { expected, got } => {
                write!(f, "the item has {got} leaves, expected {expected}")
            }
            ColumnError::Index(e) => e.fmt(f),
            ColumnError::SetLength { selected, given } => {
                write!(f, "cannot set {given} items into {selected} selected positions: the sizes differ")
            }
        }
    }
}

impl std::error::Error for ColumnError {}

impl From<IndexError> for ColumnError {
    fn from(e: IndexError) -> Self {
        ColumnError::Index(e)
    }
}

/// The per-leaf buffers of a column. Most columns have one leaf (a Box, Discrete, a
/// scalar): that buffer is kept inline rather than in a one-element `Vec`, which saves an
/// allocation (32 bytes with the allocator's header) per column, i.e. per field of every
/// episode.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Leaves {
    One(Vec<u8>),
    Many(Vec<Vec<u8>>),
}

impl Leaves {
    fn new(buffers: Vec<Vec<u8>>) -> Leaves {
        if buffers.len() == 1 {
            Leaves::One(buffers.into_iter().next().unwrap_or_default())
        } else {
            Leaves::Many(buffers)
        }
    }
}

impl std::ops::Deref for Leaves {
    type Target = [Vec<u8>];

    fn deref(&self) -> &[Vec<u8>] {
        match self {
            Leaves::One(buf) => std::slice::from_ref(buf),
            Leaves::Many(bufs) => bufs,
        }
    }
}

impl std::ops::DerefMut for Leaves {
    fn deref_mut(&mut self) -> &mut [Vec<u8>] {
        match self {
            Leaves::One(buf) => std::slice::from_mut(buf),
            Leaves::Many(bufs) => bufs,
        }
    }
}

/// Typed storage for one kind of data, with look-back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Shared: every column of one kind of data (all episodes' observations of one space)
    /// points at one schema instead of holding a copy (~150 bytes of heap each).
    schema: Arc<Schema>,
    /// One contiguous buffer per leaf; item `i` of leaf `l` is
    /// `leaves[l][i * item_bytes(l)..(i + 1) * item_bytes(l)]`.
    leaves: Leaves,
    /// Items stored, look-back included. Kept explicitly: zero-size leaves (a `(0,)`
    /// Box) have no bytes to count.
    total: usize,
    lookback: usize,
}

impl Column {
    #[must_use]
    pub fn new(schema: impl Into<Arc<Schema>>) -> Column {
        let schema = schema.into();
        let leaves = Leaves::new(vec![Vec::new(); schema.leaves.len()]);
        Column { schema, leaves, total: 0, lookback: 0 }
    }

    /// A column holding `items` (one byte buffer per leaf, `total` items each) whose first
    /// `lookback` items are look-back.
    pub fn from_leaves(
        schema: impl Into<Arc<Schema>>,
        leaves: Vec<Vec<u8>>,
        total: usize,
        lookback: usize,
    ) -> Result<Column, ColumnError> {
        let schema = schema.into();
        if leaves.len() != schema.leaves.len() {
            return Err(ColumnError::LeafCount { expected: schema.leaves.len(), got: leaves.len() });
        }
        for (i, (bytes, leaf)) in leaves.iter().zip(&schema.leaves).enumerate() {
            if bytes.len() != total * leaf.item_bytes() {
                return Err(ColumnError::ItemSize {
                    leaf: i,
                    expected: total * leaf.item_bytes(),
                    got: bytes.len(),
                });
            }
        }
        Ok(Column { schema, leaves: Leaves::new(leaves), total, lookback: lookback.min(total) })
    }

    #[must_use]
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The schema as the shared pointer, for new columns of the same kind.
    #[must_use]
    pub fn shared_schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    #[must_use]
    pub fn geometry(&self) -> Geometry {
        Geometry { total: self.total, lookback: self.lookback }
    }

    /// Items in the chunk (look-back not counted).
    #[must_use]
    pub fn len(&self) -> usize {
        self.total - self.lookback
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items stored, look-back included.
    #[must_use]
    pub fn total(&self) -> usize {
        self.total
    }

    #[must_use]
    pub fn lookback(&self) -> usize {
        self.lookback
    }

    pub fn set_lookback(&mut self, lookback: usize) {
        self.lookback = lookback.min(self.total);
    }

    /// The raw bytes of one leaf over all stored items.
    #[must_use]
    pub fn leaf_bytes(&self, leaf: usize) -> &[u8] {
        &self.leaves[leaf]
    }

    /// The bytes of item `pos` (absolute position) of leaf `leaf`.
    #[must_use]
    pub fn item(&self, leaf: usize, pos: usize) -> &[u8] {
        let n = self.schema.leaves[leaf].item_bytes();
        &self.leaves[leaf][pos * n..(pos + 1) * n]
    }

    fn check_item<B: AsRef<[u8]>>(&self, item: &[B]) -> Result<(), ColumnError> {
        if item.len() != self.schema.leaves.len() {
            return Err(ColumnError::LeafCount { expected: self.schema.leaves.len(), got: item.len() });
        }
        for (i, (bytes, leaf)) in item.iter().zip(&self.schema.leaves).enumerate() {
            let bytes = bytes.as_ref();
            if bytes.len() != leaf.item_bytes() {
                return Err(ColumnError::ItemSize { leaf: i, expected: leaf.item_bytes(), got: bytes.len() });
            }
        }
        Ok(())
    }

    /// Appends one item. All-or-nothing: a malformed item leaves the column unchanged.
    pub fn push<B: AsRef<[u8]>>(&mut self, item: &[B]) -> Result<(), ColumnError> {
        self.check_item(item)?;
        self.push_unchecked(item);
        Ok(())
    }

    /// [`Self::push`] without the size check, for items already checked against the
    /// schema (a wrong size would corrupt later reads, not memory: every read is bounds
    /// checked).
    pub fn push_unchecked<B: AsRef<[u8]>>(&mut self, item: &[B]) {
        for (buf, bytes) in self.leaves.iter_mut().zip(item) {
            stream::extend(buf, bytes.as_ref());
        }
        self.total += 1;
    }

    /// Appends the items at `positions` of `other` (same schema) after this column's data.
    pub fn extend_from(&mut self, other: &Column, positions: &[usize]) {
        debug_assert_eq!(self.schema, other.schema);
        for (leaf, buf) in self.leaves.iter_mut().enumerate() {
            buf.reserve(positions.len() * other.schema.leaves[leaf].item_bytes());
            for &p in positions {
                buf.extend_from_slice(other.item(leaf, p));
            }
        }
        self.total += positions.len();
    }

    /// Removes the item at absolute position `pos` (RLlib's `pop`); the look-back shrinks
    /// if the item was part of it.
    pub fn remove(&mut self, pos: usize) {
        if pos >= self.total {
            return;
        }
        for (leaf, buf) in self.leaves.iter_mut().enumerate() {
            let n = self.schema.leaves[leaf].item_bytes();
            buf.drain(pos * n..(pos + 1) * n);
        }
        self.total -= 1;
        if pos < self.lookback {
            self.lookback -= 1;
        }
        self.lookback = self.lookback.min(self.total);
    }

    /// A new column with the items at `positions`, the first `lookback` of them look-back.
    #[must_use]
    pub fn select(&self, positions: &[usize], lookback: usize) -> Column {
        let mut out = Column::new(Arc::clone(&self.schema));
        out.extend_from(self, positions);
        out.set_lookback(lookback);
        out
    }

    /// Keeps only the last `keep` items, moving them to the front of the existing storage
    /// (no allocation); they become the look-back of what is appended next.
    ///
    /// This is the runner's recycle step: once a chunk has been exported (`to_numpy`
    /// copies it out), its buffers are reused for the successor chunk, so per-sub-env
    /// buffers behave as ring buffers that never reallocate in steady state.
    pub fn recycle_keep_tail(&mut self, keep: usize) {
        let keep = keep.min(self.total);
        let drop = self.total - keep;
        for (leaf, buf) in self.leaves.iter_mut().enumerate() {
            let n = self.schema.leaves[leaf].item_bytes();
            buf.copy_within(drop * n.., 0);
            buf.truncate(keep * n);
        }
        self.total = keep;
        self.lookback = keep;
    }

    /// Bytes of one gathered item of leaf `leaf` (float32 one-hot groups with `one_hot`
    /// on a discrete leaf).
    #[must_use]
    pub fn gathered_item_bytes(&self, leaf: usize, one_hot: bool) -> usize {
        let spec = &self.schema.leaves[leaf];
        match spec.one_hot_width() {
            Some(width) if one_hot => width * 4,
            _ => spec.item_bytes(),
        }
    }

    /// Gathers leaf `leaf` at `positions` into one contiguous buffer (row-major, one item
    /// after the other); [`Pos::Fill`] items copy `fill`, which must be one item's bytes.
    /// With `one_hot`, discrete leaves are written as float32 one-hot groups.
    #[must_use]
    pub fn gather(&self, leaf: usize, positions: &[Pos], fill: Option<&[u8]>, one_hot: bool) -> Vec<u8> {
        let mut out = vec![0; positions.len() * self.gathered_item_bytes(leaf, one_hot)];
        self.gather_into(leaf, positions, fill, one_hot, &mut out);
        out
    }

    /// [`Self::gather`] into `out`, which holds exactly `positions.len()` gathered items
    /// (the caller allocates it, e.g. as the numpy array handed out: one copy per read).
    /// Returns `false` and writes nothing if `out` or `fill` has the wrong size.
    pub fn gather_into(
        &self,
        leaf: usize,
        positions: &[Pos],
        fill: Option<&[u8]>,
        one_hot: bool,
        out: &mut [u8],
    ) -> bool {
        let spec: &Leaf = &self.schema.leaves[leaf];
        let one_hot = one_hot && spec.one_hot_width().is_some();
        let n = self.gathered_item_bytes(leaf, one_hot);
        if out.len() != positions.len() * n || fill.is_some_and(|f| f.len() != n) {
            return false;
        }
        if n == 0 {
            return true;
        }
        for (pos, dst) in positions.iter().zip(out.chunks_exact_mut(n)) {
            match *pos {
                Pos::At(p) if one_hot => spec.write_one_hot_into(self.item(leaf, p), dst),
                Pos::At(p) => dst.copy_from_slice(self.item(leaf, p)),
                Pos::Fill => match fill {
                    Some(bytes) => dst.copy_from_slice(bytes),
                    None => dst.fill(0),
                },
            }
        }
        true
    }

    /// Overwrites the items at `positions` with `items` (one buffer per leaf holding
    /// `positions.len()` items back to back). All-or-nothing.
    pub fn overwrite_many(&mut self, positions: &[usize], items: &[&[u8]]) -> Result<(), ColumnError> {
        if items.len() != self.schema.leaves.len() {
            return Err(ColumnError::LeafCount { expected: self.schema.leaves.len(), got: items.len() });
        }
        for (leaf, bytes) in items.iter().enumerate() {
            let n = self.schema.leaves[leaf].item_bytes();
            if bytes.len() != n * positions.len() {
                let given = bytes.len().checked_div(n).unwrap_or(0);
                return Err(ColumnError::SetLength { selected: positions.len(), given });
            }
        }
        if let Some(&bad) = positions.iter().find(|&&p| p >= self.total) {
            return Err(IndexError::OutOfRange {
                index: bad as i64,
                len: self.len(),
                lookback: self.lookback,
            }
            .into());
        }
        for (leaf, bytes) in items.iter().enumerate() {
            let n = self.schema.leaves[leaf].item_bytes();
            for (k, &p) in positions.iter().enumerate() {
                self.leaves[leaf][p * n..(p + 1) * n].copy_from_slice(&bytes[k * n..(k + 1) * n]);
            }
        }
        Ok(())
    }

    /// Makes room for `items` more items in every leaf buffer, as a hint: at most
    /// [`MAX_RESERVE_BYTES`] per buffer, and nothing where the allocator refuses (an
    /// allocation failure here must not abort the process; the buffers then grow as
    /// usual).
    pub fn reserve(&mut self, items: usize) {
        for (buf, leaf) in self.leaves.iter_mut().zip(&self.schema.leaves) {
            let bytes = items.saturating_mul(leaf.item_bytes()).min(MAX_RESERVE_BYTES);
            let _ = buf.try_reserve_exact(bytes);
        }
    }

    /// Gives back the buffers' spare capacity (growth by doubling leaves up to half of a
    /// buffer unused), for a column that is kept but no longer appended to.
    ///
    /// Each buffer shrinks in place. Moving it into an exact-size allocation instead
    /// (tried) kept one sequence of same-shaped episodes a little smaller, but where
    /// several episodes grow at once, as a runner's sub-envs' do, the exact copies landed
    /// between the freed growth buffers and left the C heap full of holes: a runner's held
    /// CartPole episodes then cost 4.4x their raw bytes in RSS, against 2.2x shrunk in
    /// place, with the same live bytes (`benches/memory.py`).
    pub fn shrink_to_fit(&mut self) {
        for buf in self.leaves.iter_mut() {
            shrink(buf);
        }
    }

    /// Bytes held by the buffers (capacity, not length): for memory accounting.
    #[must_use]
    pub fn capacity_bytes(&self) -> usize {
        self.leaves.iter().map(Vec::capacity).sum()
    }
}

/// The most [`Column::reserve`] adds to one buffer (a guessed episode length times a big
/// item could otherwise ask for gigabytes at once).
pub const MAX_RESERVE_BYTES: usize = 256 * 1024 * 1024;

/// Where a buffer counts as big: the extension's allocator takes blocks of this many
/// bytes or more from mimalloc and smaller ones from the system allocator
/// (`rust/alloc.rs`). mimalloc shrinks a block in place only when it loses more than half
/// of it, so big buffers move to an exact block when they shrink with more than an eighth
/// of spare room (`Vec::shrink_to_fit` alone would keep up to twice the bytes stored);
/// smaller buffers shrink in place (moving those left the C heap full of holes, see
/// [`Column::shrink_to_fit`]).
pub const BIG_BUFFER_BYTES: usize = 64 * 1024;

/// Gives back a buffer's spare capacity (see [`BIG_BUFFER_BYTES`]).
fn shrink(buf: &mut Vec<u8>) {
    if buf.capacity() >= BIG_BUFFER_BYTES && buf.capacity() - buf.len() > buf.len() / 8 {
        let mut exact = Vec::with_capacity(buf.len());
        stream::extend(&mut exact, buf);
        *buf = exact;
    } else {
        buf.shrink_to_fit();
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // exact values written and read back
mod tests {
    use super::*;
    use crate::schema::{DType, OneHot};

    fn f32_col() -> Column {
        Column::new(Schema::new(vec![Leaf::new(DType::F32, vec![2])]))
    }

    fn item(a: f32, b: f32) -> Vec<u8> {
        let mut v = a.to_ne_bytes().to_vec();
        v.extend_from_slice(&b.to_ne_bytes());
        v
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn push_and_gather() {
        let mut c = f32_col();
        for i in 0..4 {
            c.push(&[&item(i as f32, -(i as f32))]).unwrap();
        }
        c.set_lookback(1);
        assert_eq!(c.len(), 3);
        let Resolved::Many(pos) = c.geometry().resolve(&Index::All, false, false).unwrap() else { panic!() };
        assert_eq!(floats(&c.gather(0, &pos, None, false)), vec![1.0, -1.0, 2.0, -2.0, 3.0, -3.0]);
        let fill = item(9.0, 9.0);
        assert_eq!(
            floats(&c.gather(0, &[Pos::Fill, Pos::At(0)], Some(&fill), false)),
            vec![9.0, 9.0, 0.0, 0.0]
        );
    }

    #[test]
    fn malformed_item_leaves_column_unchanged() {
        let mut c = f32_col();
        c.push(&[&item(1.0, 2.0)]).unwrap();
        let before = c.clone();
        assert_eq!(c.push(&[&[0u8; 4]]), Err(ColumnError::ItemSize { leaf: 0, expected: 8, got: 4 }));
        assert_eq!(c.push::<&[u8]>(&[]), Err(ColumnError::LeafCount { expected: 1, got: 0 }));
        assert_eq!(c, before);
    }

    #[test]
    fn recycle_keeps_tail_without_reallocating() {
        let mut c = f32_col();
        for i in 0..100 {
            c.push(&[&item(i as f32, 0.0)]).unwrap();
        }
        let cap = c.capacity_bytes();
        let ptr = c.leaf_bytes(0).as_ptr();
        c.recycle_keep_tail(2);
        assert_eq!((c.total(), c.lookback(), c.len()), (2, 2, 0));
        assert_eq!(floats(c.item(0, 0))[0], 98.0);
        assert_eq!(floats(c.item(0, 1))[0], 99.0);
        for i in 0..90 {
            c.push(&[&item(i as f32, 0.0)]).unwrap();
        }
        assert_eq!(c.capacity_bytes(), cap, "steady state reuses the storage");
        assert_eq!(c.leaf_bytes(0).as_ptr(), ptr);
    }

    #[test]
    fn reserve_is_a_capped_hint() {
        let mut c = f32_col();
        c.push(&[&item(1.0, 2.0)]).unwrap();
        c.reserve(10);
        assert!(c.capacity_bytes() >= 11 * 8);
        assert_eq!((c.total(), floats(c.item(0, 0))), (1, vec![1.0, 2.0]));
        // A request past the cap (here, past any address space) is cut to the cap, and
        // one the allocator refuses is dropped: no abort, the column still works.
        let mut huge = Column::new(Schema::new(vec![Leaf::new(DType::F32, vec![1 << 20])]));
        huge.reserve(usize::MAX / 2);
        assert!(huge.capacity_bytes() <= MAX_RESERVE_BYTES);
        huge.push(&[&vec![0u8; 4 << 20]]).unwrap();
        assert_eq!(huge.total(), 1);
    }

    #[test]
    fn shrink_gives_back_spare_capacity_and_keeps_data() {
        let mut c = f32_col();
        for i in 0..5 {
            c.push(&[&item(i as f32, 1.0)]).unwrap();
        }
        c.set_lookback(2);
        assert!(c.capacity_bytes() > 40);
        c.shrink_to_fit();
        assert_eq!(c.capacity_bytes(), 40);
        assert_eq!((c.total(), c.lookback()), (5, 2));
        assert_eq!(floats(c.item(0, 4)), vec![4.0, 1.0]);
        c.push(&[&item(5.0, 5.0)]).unwrap();
        assert_eq!(floats(c.item(0, 5)), vec![5.0, 5.0], "appending after a shrink grows again");

        // Large buffers too; the data stays.
        let mut big = Column::new(Schema::new(vec![Leaf::new(DType::F32, vec![1000])]));
        let row = vec![7u8; 4000];
        for _ in 0..17 {
            big.push(&[&row]).unwrap();
        }
        big.shrink_to_fit();
        assert_eq!(big.capacity_bytes(), 17 * 4000);
        assert_eq!(big.item(0, 16), &row[..]);
    }

    #[test]
    fn multi_leaf_columns_keep_one_buffer_per_leaf() {
        let schema = Schema::new(vec![Leaf::new(DType::F32, vec![2]), Leaf::new(DType::I64, vec![])]);
        let mut c = Column::new(schema);
        for i in 0..3 {
            c.push(&[item(i as f32, 0.5), (i64::from(i) * 10).to_ne_bytes().to_vec()]).unwrap();
        }
        c.shrink_to_fit();
        assert_eq!((c.leaf_bytes(0).len(), c.leaf_bytes(1).len()), (24, 24));
        assert_eq!(c.capacity_bytes(), 48);
        let s = c.select(&[2, 0], 1);
        assert_eq!(floats(s.item(0, 0)), vec![2.0, 0.5]);
        assert_eq!(s.item(1, 1), 0i64.to_ne_bytes());
        assert_eq!(
            c.push(&[item(1.0, 1.0)]),
            Err(ColumnError::LeafCount { expected: 2, got: 1 }),
            "both leaves are needed"
        );
        let from = Column::from_leaves(c.shared_schema().clone(), vec![vec![0; 8], vec![0; 8]], 1, 0);
        assert_eq!(from.map(|f| f.total()), Ok(1));
    }

    #[test]
    fn select_shares_the_schema() {
        let mut c = f32_col();
        c.push(&[&item(1.0, 2.0)]).unwrap();
        let s = c.select(&[0], 0);
        assert!(std::sync::Arc::ptr_eq(c.shared_schema(), s.shared_schema()));
    }

    #[test]
    fn select_extend_remove() {
        let mut c = f32_col();
        for i in 0..5 {
            c.push(&[&item(i as f32, 0.0)]).unwrap();
        }
        let s = c.select(&[3, 4], 1);
        assert_eq!((s.total(), s.lookback()), (2, 1));
        let mut t = s.clone();
        t.extend_from(&c, &[0]);
        assert_eq!(floats(t.item(0, 2))[0], 0.0);
        t.remove(0);
        assert_eq!((t.total(), t.lookback()), (2, 0));
        t.remove(7); // out of range: no-op
        assert_eq!(t.total(), 2);
    }

    #[test]
    fn overwrite_checks_everything_first() {
        let mut c = f32_col();
        for i in 0..3 {
            c.push(&[&item(i as f32, 0.0)]).unwrap();
        }
        c.overwrite_many(&[1], &[&item(7.0, 7.0)]).unwrap();
        assert_eq!(floats(c.item(0, 1)), vec![7.0, 7.0]);
        assert!(c.overwrite_many(&[3], &[&item(7.0, 7.0)]).is_err());
        let two = [item(5.0, 5.0), item(6.0, 6.0)].concat();
        assert_eq!(
            c.overwrite_many(&[0, 1, 2], &[&two]),
            Err(ColumnError::SetLength { selected: 3, given: 2 })
        );
        c.overwrite_many(&[2, 0], &[&two]).unwrap();
        assert_eq!(floats(c.item(0, 2)), vec![5.0, 5.0]);
        assert_eq!(floats(c.item(0, 0)), vec![6.0, 6.0]);
    }

    #[test]
    fn one_hot_gather_and_zero_size_items() {
        let mut leaf = Leaf::new(DType::I64, vec![]);
        leaf.one_hot = OneHot::Discrete { n: 2, start: 0 };
        let mut c = Column::new(Schema::new(vec![leaf]));
        c.push(&[&1i64.to_ne_bytes()]).unwrap();
        assert_eq!(floats(&c.gather(0, &[Pos::At(0), Pos::Fill], None, true)), vec![0.0, 1.0, 0.0, 0.0]);

        let mut z = Column::new(Schema::new(vec![Leaf::new(DType::F32, vec![0])]));
        z.push(&[&[]]).unwrap();
        z.push(&[&[]]).unwrap();
        assert_eq!(z.len(), 2);
        assert!(Column::from_leaves(z.schema().clone(), vec![vec![]], 2, 0).is_ok());
        assert!(Column::from_leaves(z.schema().clone(), vec![], 2, 0).is_err());
    }
}
