//! Typed columns with look-back.
//!
//! A [`Column`] holds one kind of data of one episode (its observations, actions, one extra
//! model output, ...): one contiguous byte buffer per schema leaf, a length and a look-back
//! length. Appending copies only the item's bytes (amortised O(1)); reads resolve indices
//! through [`index::Geometry`] and gather bytes leaf by leaf, ready to become numpy arrays
//! with a single copy.

pub mod index;
mod packed;
pub mod stream;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::schema::{Leaf, Schema};
pub use index::{Geometry, Index, IndexError, Pos, Resolved};
use packed::Packed;
pub use packed::DEFAULT_BLOCK_ROWS;

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
    /// Stored parts of a compressed column ([`PackedParts`]) that do not fit together.
    Packed(&'static str),
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
            ColumnError::Packed(why) => write!(f, "compressed column parts do not fit together: {why}"),
        }
    }
}

impl std::error::Error for ColumnError {}

impl ColumnError {
    /// A set writes exactly one value per selected position: `SetLength` otherwise.
    pub fn check_set_len(selected: usize, given: usize) -> Result<(), ColumnError> {
        if selected == given {
            Ok(())
        } else {
            Err(ColumnError::SetLength { selected, given })
        }
    }
}

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

    /// The buffers `make(leaf)` of the `n` leaves, without a vector of them for one leaf
    /// (which would be allocated and freed again: a column is made per field of every
    /// episode and cut).
    fn from_fn(n: usize, mut make: impl FnMut(usize) -> Vec<u8>) -> Leaves {
        if n == 1 {
            Leaves::One(make(0))
        } else {
            Leaves::Many((0..n).map(make).collect())
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

/// A compressed column's items as they are stored (see [`Column::packed_parts`]): what
/// moves the column to another process without decompressing and compressing it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedParts {
    /// Items per block.
    pub rows: usize,
    /// Items in the blocks, from position 0.
    pub sealed: usize,
    /// Every item is sealed (the column receives no more items, [`Column::seal_all`]).
    pub closed: bool,
    /// Per leaf, the compressed blocks in order.
    pub blocks: Vec<Vec<Vec<u8>>>,
    /// Per leaf, the bytes of the uncompressed items after the sealed ones.
    pub raw: Vec<Vec<u8>>,
    /// Items stored (sealed and uncompressed), look-back included.
    pub total: usize,
    pub lookback: usize,
}

/// Typed storage for one kind of data, with look-back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Shared: every column of one kind of data (all episodes' observations of one space)
    /// points at one schema instead of holding a copy (~150 bytes of heap each).
    schema: Arc<Schema>,
    /// One contiguous buffer per leaf; item `i` of leaf `l` is
    /// `leaves[l][(i - s) * item_bytes(l)..(i - s + 1) * item_bytes(l)]`, where `s` is the
    /// number of items sealed into compressed blocks (0 unless `packed`).
    leaves: Leaves,
    /// Compression of the older items (see [`Column::set_compression`]); `None` (the
    /// default) keeps every item in `leaves`.
    packed: Option<Box<Packed>>,
    /// Items stored, look-back included. Kept explicitly: zero-size leaves (a `(0,)`
    /// Box) have no bytes to count.
    total: usize,
    lookback: usize,
}

impl Column {
    #[must_use]
    pub fn new(schema: impl Into<Arc<Schema>>) -> Column {
        let schema = schema.into();
        let leaves = Leaves::from_fn(schema.leaves.len(), |_| Vec::new());
        Column { schema, leaves, packed: None, total: 0, lookback: 0 }
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
        Ok(Column { schema, leaves: Leaves::new(leaves), packed: None, total, lookback: lookback.min(total) })
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

    /// The uncompressed bytes of one leaf: every stored item, or on a compressed column
    /// the items after the sealed ones.
    #[must_use]
    pub fn leaf_bytes(&self, leaf: usize) -> &[u8] {
        &self.leaves[leaf]
    }

    /// Items sealed into compressed blocks (absolute positions `0..sealed()`).
    #[must_use]
    pub fn sealed(&self) -> usize {
        self.packed.as_ref().map_or(0, |p| p.sealed)
    }

    /// The bytes of item `pos` (absolute position) of leaf `leaf`: borrowed, or copied out
    /// of its decompressed block for a sealed item.
    #[must_use]
    pub fn item(&self, leaf: usize, pos: usize) -> Cow<'_, [u8]> {
        let n = self.schema.leaves[leaf].item_bytes();
        let base = self.sealed();
        if pos >= base {
            return Cow::Borrowed(&self.leaves[leaf][(pos - base) * n..(pos - base + 1) * n]);
        }
        let mut out = vec![0; n];
        if let Some(p) = &self.packed {
            let ok = p.read_item(leaf, pos, n, &mut out);
            debug_assert!(ok, "a sealed block did not decompress");
        }
        Cow::Owned(out)
    }

    /// Compression of the older items: `Some(rows)` seals every full block of `rows`
    /// items (at least 1) that is not among the newest `rows` into one LZ4 block per
    /// leaf; reads decompress transparently. `None` unpacks everything. Items read,
    /// select, cut and gather exactly as uncompressed; the column compares equal only to
    /// columns with the same compression (and the same [`Self::seal_all`] state). The
    /// same `rows` again changes nothing.
    pub fn set_compression(&mut self, rows: Option<usize>) {
        match rows {
            None => {
                self.unpack();
                self.packed = None;
            }
            Some(rows) => {
                if self.packed.as_ref().is_some_and(|p| p.rows == rows.max(1)) {
                    return;
                }
                self.unpack();
                self.packed = Some(Box::new(Packed::new(rows, self.schema.leaves.len())));
                self.seal_full_blocks();
            }
        }
    }

    /// Rows per compressed block, `None` if the column is not compressed.
    #[must_use]
    pub fn compression(&self) -> Option<usize> {
        self.packed.as_ref().map(|p| p.rows)
    }

    /// Bytes of stored item data: the uncompressed items plus the compressed blocks
    /// (lengths, not capacities).
    #[must_use]
    pub fn stored_bytes(&self) -> usize {
        self.leaves.iter().map(Vec::len).sum::<usize>() + self.packed.as_ref().map_or(0, |p| p.stored_bytes())
    }

    /// The stored parts of a compressed column, `None` for an uncompressed one.
    #[must_use]
    pub fn packed_parts(&self) -> Option<PackedParts> {
        let p = self.packed.as_deref()?;
        Some(PackedParts {
            rows: p.rows,
            sealed: p.sealed,
            closed: p.closed,
            blocks: p.blocks.clone(),
            raw: self.leaves.to_vec(),
            total: self.total,
            lookback: self.lookback,
        })
    }

    /// The compressed column of `schema` that [`Self::packed_parts`] gave. Every block is
    /// decompressed once to check it (parts come from another process), not kept.
    ///
    /// Errors: [`ColumnError::LeafCount`] or [`ColumnError::ItemSize`] for parts of
    /// another schema; [`ColumnError::Packed`] for parts that do not fit together (block
    /// counts, a short block where more items follow, a block that does not decompress to
    /// its items, a look-back beyond the items).
    pub fn from_packed_parts(
        schema: impl Into<Arc<Schema>>,
        parts: PackedParts,
    ) -> Result<Column, ColumnError> {
        let schema = schema.into();
        let n_leaves = schema.leaves.len();
        if parts.blocks.len() != n_leaves || parts.raw.len() != n_leaves {
            let got = if parts.blocks.len() == n_leaves { parts.raw.len() } else { parts.blocks.len() };
            return Err(ColumnError::LeafCount { expected: n_leaves, got });
        }
        if parts.rows == 0 {
            return Err(ColumnError::Packed("blocks of 0 rows"));
        }
        let mut packed = Packed::new(parts.rows, n_leaves);
        packed.sealed = parts.sealed;
        packed.closed = parts.closed;
        let Some(raw_items) = parts.total.checked_sub(parts.sealed) else {
            return Err(ColumnError::Packed("more items sealed than stored"));
        };
        for (i, (raw, leaf)) in parts.raw.iter().zip(&schema.leaves).enumerate() {
            let expected = raw_items * leaf.item_bytes();
            if raw.len() != expected {
                return Err(ColumnError::ItemSize { leaf: i, expected, got: raw.len() });
            }
        }
        if parts.sealed % parts.rows != 0 && !(parts.closed && raw_items == 0) {
            return Err(ColumnError::Packed("a short block with items after it"));
        }
        // One scratch buffer for the check, the size of the biggest block.
        let widest = schema.leaves.iter().map(Leaf::item_bytes).max().unwrap_or(0);
        let mut scratch = vec![0; parts.rows.min(parts.sealed) * widest];
        for (leaf, blocks) in parts.blocks.iter().enumerate() {
            if blocks.len() != packed.block_count() {
                return Err(ColumnError::Packed("a leaf holds another number of blocks than its items need"));
            }
            let n = schema.leaves[leaf].item_bytes();
            for (b, block) in blocks.iter().enumerate() {
                let out = &mut scratch[..packed.block_rows(b) * n];
                if !matches!(lz4_flex::block::decompress_into(block, out), Ok(got) if got == out.len()) {
                    return Err(ColumnError::Packed("a block does not decompress to its items"));
                }
            }
        }
        packed.blocks = parts.blocks;
        if parts.lookback > parts.total {
            return Err(ColumnError::Packed("a look-back longer than the items"));
        }
        let leaves = Leaves::new(parts.raw);
        let (total, lookback) = (parts.total, parts.lookback);
        Ok(Column { schema, leaves, packed: Some(Box::new(packed)), total, lookback })
    }

    /// Seals every item, the last block possibly shorter than `rows`, on a column that
    /// receives no more items (a done episode's observations, a chunk a runner hands
    /// out): nothing stays uncompressed and the emptied buffers give back their memory.
    /// Nothing happens on an uncompressed column. Reads are unchanged (reading the last
    /// item decompresses its block once). A write or removal seals everything again; an
    /// append opens the column: its last block goes back to the uncompressed buffers and
    /// full blocks are sealed as before.
    pub fn seal_all(&mut self) {
        let Some(p) = self.packed.as_deref_mut() else { return };
        p.closed = true;
        self.seal_full_blocks();
        for buf in self.leaves.iter_mut() {
            shrink(buf);
        }
    }

    /// Seals full blocks while more than two blocks' worth of items are uncompressed, so
    /// that the newest `rows..2 * rows` items stay uncompressed (the look-back a cut
    /// keeps and the last observation the runner reads are there); on a closed column
    /// (see [`Self::seal_all`]) seals every item.
    fn seal_full_blocks(&mut self) {
        let Some(p) = self.packed.as_deref_mut() else { return };
        // A short last block exists only on a closed column that holds no raw item.
        debug_assert!(p.sealed % p.rows == 0 || self.total == p.sealed);
        let mut done = 0;
        loop {
            let raw = self.total - p.sealed;
            let take = if p.closed {
                raw.min(p.rows)
            } else if raw >= 2 * p.rows {
                p.rows
            } else {
                0
            };
            if take == 0 {
                break;
            }
            for (leaf, buf) in self.leaves.iter().enumerate() {
                let n = self.schema.leaves[leaf].item_bytes();
                p.seal(leaf, &buf[done * n..(done + take) * n]);
            }
            done += take;
            p.sealed += take;
        }
        if done > 0 {
            // One move of the remaining raw items to the front, however many blocks sealed.
            for (leaf, buf) in self.leaves.iter_mut().enumerate() {
                let bytes = done * self.schema.leaves[leaf].item_bytes();
                buf.copy_within(bytes.., 0);
                buf.truncate(buf.len() - bytes);
            }
        }
    }

    /// Moves the items of blocks `from..` back in front of the uncompressed buffers (the
    /// compression setting stays; [`Self::seal_full_blocks`] seals again).
    fn unseal_from(&mut self, from: usize) {
        let Some(p) = self.packed.as_deref_mut() else { return };
        let start = from * p.rows;
        if start >= p.sealed {
            return;
        }
        for (leaf, buf) in self.leaves.iter_mut().enumerate() {
            let n = self.schema.leaves[leaf].item_bytes();
            let mut all = vec![0; (p.sealed - start) * n + buf.len()];
            let mut at = 0;
            for b in from..p.block_count() {
                let len = p.block_rows(b) * n;
                let ok = n == 0 || p.decompress_into(leaf, b, &mut all[at..at + len]);
                debug_assert!(ok, "a sealed block did not decompress");
                at += len;
            }
            all[at..].copy_from_slice(buf);
            *buf = all;
        }
        p.truncate(from);
    }

    /// Unseals the block of absolute position `pos` and every later one, if `pos` is
    /// sealed (before a write into or removal of that item).
    fn unseal_at(&mut self, pos: usize) {
        if let Some(p) = self.packed.as_deref().filter(|p| pos < p.sealed) {
            let block = pos / p.rows;
            self.unseal_from(block);
        }
    }

    /// Decompresses every sealed item back into the uncompressed buffers.
    fn unpack(&mut self) {
        self.unseal_from(0);
    }

    /// Opens a closed column (see [`Self::seal_all`]) before an append: its last block,
    /// short or full, goes back to the uncompressed buffers, so that the newest items are
    /// uncompressed again and no short block stays in the middle.
    fn reopen(&mut self) {
        let Some(p) = self.packed.as_deref_mut().filter(|p| p.closed) else { return };
        p.closed = false;
        let last = p.block_count().saturating_sub(1);
        self.unseal_from(last);
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
    #[inline]
    pub fn push_unchecked<B: AsRef<[u8]>>(&mut self, item: &[B]) {
        // The usual item (one small leaf, room in the buffer, no compression) inline: the
        // general push costs about 90 instructions per field and step, this about 20.
        if let (None, Leaves::One(buf), [bytes]) = (&self.packed, &mut self.leaves, item) {
            if stream::extend_within_capacity(buf, bytes.as_ref()) {
                self.total += 1;
                return;
            }
        }
        self.push_any(item);
    }

    /// [`Self::push_unchecked`] for any item and column.
    #[inline(never)]
    fn push_any<B: AsRef<[u8]>>(&mut self, item: &[B]) {
        if self.packed.as_ref().is_some_and(|p| p.closed) {
            self.reopen();
        }
        let append = |buf: &mut Vec<u8>, bytes: &[u8]| {
            if buf.capacity() - buf.len() < bytes.len() {
                buf.reserve(growth(buf.len(), bytes.len()));
            }
            stream::extend(buf, bytes);
        };
        match (&mut self.leaves, item) {
            (Leaves::One(buf), [bytes]) => append(buf, bytes.as_ref()),
            (leaves, _) => {
                for (buf, bytes) in leaves.iter_mut().zip(item) {
                    append(buf, bytes.as_ref());
                }
            }
        }
        self.total += 1;
        if self.packed.is_some() {
            self.seal_full_blocks();
        }
    }

    /// Appends the items at `positions` of `other` (same schema) after this column's data.
    pub fn extend_from(&mut self, other: &Column, positions: &[usize]) {
        debug_assert_eq!(self.schema, other.schema);
        if positions.is_empty() {
            return;
        }
        self.reopen();
        for (leaf, buf) in self.leaves.iter_mut().enumerate() {
            buf.reserve(positions.len() * other.schema.leaves[leaf].item_bytes());
            for &p in positions {
                buf.extend_from_slice(&other.item(leaf, p));
            }
        }
        self.total += positions.len();
        self.seal_full_blocks();
    }

    /// Removes the item at absolute position `pos` (RLlib's `pop`); the look-back shrinks
    /// if the item was part of it.
    pub fn remove(&mut self, pos: usize) {
        if pos >= self.total {
            return;
        }
        self.unseal_at(pos);
        let at = pos - self.sealed();
        for (leaf, buf) in self.leaves.iter_mut().enumerate() {
            let n = self.schema.leaves[leaf].item_bytes();
            buf.drain(at * n..(at + 1) * n);
        }
        self.total -= 1;
        if pos < self.lookback {
            self.lookback -= 1;
        }
        self.lookback = self.lookback.min(self.total);
        self.seal_full_blocks();
    }

    /// A new column with the items at `positions`, the first `lookback` of them look-back
    /// (compressed as this one is).
    #[must_use]
    pub fn select(&self, positions: &[usize], lookback: usize) -> Column {
        if let Some(out) = self.select_run(positions, lookback) {
            return out;
        }
        self.select_items(positions, lookback)
    }

    /// [`Column::select`] of a run of consecutive positions on an uncompressed column (a
    /// cut's tail): one copy of each leaf's bytes into a buffer of the exact size, instead
    /// of an item at a time into a growing one. `None` for other selections.
    fn select_run(&self, positions: &[usize], lookback: usize) -> Option<Column> {
        let (&first, &last) = (positions.first()?, positions.last()?);
        if self.packed.is_some() || last >= self.total || last - first + 1 != positions.len() {
            return None;
        }
        if positions.windows(2).any(|w| w[1] != w[0] + 1) {
            return None;
        }
        let leaves = Leaves::from_fn(self.leaves.len(), |l| {
            let n = self.schema.leaves[l].item_bytes();
            self.leaves[l][first * n..(last + 1) * n].to_vec()
        });
        let mut out = Column {
            schema: Arc::clone(&self.schema),
            leaves,
            packed: None,
            total: positions.len(),
            lookback: 0,
        };
        out.set_lookback(lookback);
        Some(out)
    }

    /// [`Column::select`], item by item.
    fn select_items(&self, positions: &[usize], lookback: usize) -> Column {
        let mut out = Column::new(Arc::clone(&self.schema));
        out.set_compression(self.compression());
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
        if keep > self.total - self.sealed() {
            // Only the blocks that hold the kept tail.
            self.unseal_at(self.total - keep);
        }
        // Items to drop from the uncompressed buffers (the sealed ones go with the blocks).
        let drop = self.total - keep - self.sealed();
        if let Some(p) = self.packed.as_deref_mut() {
            // The kept tail starts a successor that is appended to.
            p.clear();
            p.closed = false;
        }
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
        if let Some(packed) = self.packed.as_deref().filter(|p| p.sealed > 0) {
            return self.gather_packed_into(packed, leaf, positions, fill, one_hot, out);
        }
        // Nothing sealed: every item is in the raw buffer (no per-item `item()` dispatch).
        let (raw, item_n) = (&self.leaves[leaf], spec.item_bytes());
        for (pos, dst) in positions.iter().zip(out.chunks_exact_mut(n)) {
            let src = match *pos {
                Pos::At(p) => Some(&raw[p * item_n..(p + 1) * item_n]),
                Pos::Fill => None,
            };
            write_gathered(spec, src, fill, one_hot, dst);
        }
        true
    }

    /// [`Self::gather_into`] on a column with sealed items (`out` and `fill` checked).
    /// A run of positions that covers one whole block (a short last one included) in
    /// order decompresses straight into `out`; other sealed items go through one scratch
    /// block. `false` if a block does not decompress (a bug).
    fn gather_packed_into(
        &self,
        packed: &Packed,
        leaf: usize,
        positions: &[Pos],
        fill: Option<&[u8]>,
        one_hot: bool,
        out: &mut [u8],
    ) -> bool {
        let spec: &Leaf = &self.schema.leaves[leaf];
        let n = self.gathered_item_bytes(leaf, one_hot);
        let item_n = spec.item_bytes();
        let (rows, base) = (packed.rows, packed.sealed);
        let raw = &self.leaves[leaf];
        let mut scratch: Option<(usize, Vec<u8>)> = None;
        let mut i = 0;
        while i < positions.len() {
            let src = match positions[i] {
                Pos::At(p) if p >= base => Some(&raw[(p - base) * item_n..(p - base + 1) * item_n]),
                Pos::At(p) => {
                    let block = p / rows;
                    let len = packed.block_rows(block);
                    let whole = !one_hot
                        && p % rows == 0
                        && positions
                            .get(i..i + len)
                            .is_some_and(|run| run.iter().enumerate().all(|(k, &q)| q == Pos::At(p + k)));
                    if whole {
                        if !packed.decompress_into(leaf, block, &mut out[i * n..(i + len) * n]) {
                            return false;
                        }
                        i += len;
                        continue;
                    }
                    if scratch.as_ref().is_none_or(|(b, _)| *b != block) {
                        let mut bytes = scratch.take().map_or_else(Vec::new, |(_, v)| v);
                        bytes.resize(len * item_n, 0);
                        if !packed.decompress_into(leaf, block, &mut bytes) {
                            return false;
                        }
                        scratch = Some((block, bytes));
                    }
                    let Some((_, bytes)) = &scratch else { return false };
                    let at = (p % rows) * item_n;
                    Some(&bytes[at..at + item_n])
                }
                Pos::Fill => None,
            };
            write_gathered(spec, src, fill, one_hot, &mut out[i * n..(i + 1) * n]);
            i += 1;
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
        if let Some(&first) = positions.iter().min() {
            self.unseal_at(first);
        }
        let base = self.sealed();
        for (leaf, bytes) in items.iter().enumerate() {
            let n = self.schema.leaves[leaf].item_bytes();
            for (k, &p) in positions.iter().enumerate() {
                let at = p - base;
                self.leaves[leaf][at * n..(at + 1) * n].copy_from_slice(&bytes[k * n..(k + 1) * n]);
            }
        }
        self.seal_full_blocks();
        Ok(())
    }

    /// Makes room for `items` more items in every leaf buffer, as a hint: at most
    /// [`MAX_RESERVE_BYTES`] per buffer, and nothing where the allocator refuses (an
    /// allocation failure here must not abort the process; the buffers then grow as
    /// usual).
    pub fn reserve(&mut self, items: usize) {
        // A compressed column never holds more than two blocks uncompressed.
        let items = self.packed.as_ref().map_or(items, |p| items.min(2 * p.rows));
        for (buf, leaf) in self.leaves.iter_mut().zip(&self.schema.leaves) {
            let bytes = items.saturating_mul(leaf.item_bytes()).min(MAX_RESERVE_BYTES);
            let _ = buf.try_reserve_exact(bytes);
        }
    }

    /// Makes room for `items` more items in every leaf buffer, in whole items and at most
    /// `max_bytes` per buffer (a leaf whose item is bigger than that gets nothing); a hint,
    /// as [`Self::reserve`].
    pub fn reserve_within(&mut self, items: usize, max_bytes: usize) {
        let items = self.packed.as_ref().map_or(items, |p| items.min(2 * p.rows));
        for (buf, leaf) in self.leaves.iter_mut().zip(&self.schema.leaves) {
            let n = leaf.item_bytes();
            let fit = items.min(max_bytes.checked_div(n).unwrap_or(0));
            if fit > 0 {
                let _ = buf.try_reserve_exact(fit * n);
            }
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
        if let Some(p) = self.packed.as_deref_mut() {
            p.shrink_to_fit();
        }
    }

    /// Bytes held by the buffers (capacity, not length): for memory accounting.
    #[must_use]
    pub fn capacity_bytes(&self) -> usize {
        self.leaves.iter().map(Vec::capacity).sum::<usize>()
            + self.packed.as_ref().map_or(0, |p| p.capacity_bytes())
    }
}

/// The least a full leaf buffer grows by when an item is pushed. `Vec`'s doubling alone
/// starts at 8 bytes: a column of 4-byte items grew 7 times on its way to 100 items (about
/// 700 instructions each, 3% of a multi-agent step's record); from 64 bytes, 4 times.
/// Bigger items grow as before (doubling wins).
pub const GROWTH_FLOOR_BYTES: usize = 64;

/// Below this many bytes a full leaf buffer grows to four times its length, not two: a
/// 100-step chunk's columns of 4- to 16-byte items then grow 2 or 3 times instead of 3 to
/// 5 (a fifth of a multi-agent step's reallocations' cost), for at most 3 KiB of spare room
/// per column until `shrink_to_fit`; a chunk of up to 16 small items keeps its 64 bytes.
pub const QUADRUPLE_BELOW_BYTES: usize = 1024;

/// How many bytes a full buffer of `len` bytes reserves for an item of `item` bytes (see
/// [`GROWTH_FLOOR_BYTES`] and [`QUADRUPLE_BELOW_BYTES`]).
#[inline]
fn growth(len: usize, item: usize) -> usize {
    let quadruple = if len < QUADRUPLE_BELOW_BYTES { 3 * len } else { 0 };
    item.max(GROWTH_FLOOR_BYTES).max(quadruple)
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

/// Writes one gathered item of `spec` into `dst`: the stored item `src` (as float32
/// one-hot groups with `one_hot`), or for a [`Pos::Fill`] (`src` is `None`) `fill`, zeros
/// without one.
#[inline]
fn write_gathered(spec: &Leaf, src: Option<&[u8]>, fill: Option<&[u8]>, one_hot: bool, dst: &mut [u8]) {
    match (src, fill) {
        (Some(src), _) if one_hot => spec.write_one_hot_into(src, dst),
        (Some(bytes), _) | (None, Some(bytes)) => dst.copy_from_slice(bytes),
        (None, None) => dst.fill(0),
    }
}

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

    #[test]
    fn a_run_is_selected_as_item_by_item() {
        let two = Schema::new(vec![Leaf::new(DType::F32, vec![2]), Leaf::new(DType::I64, vec![])]);
        for total in 0..7usize {
            let mut one = f32_col();
            let mut many = Column::new(two.clone());
            for i in 0..total {
                one.push(&[&item(i as f32, -(i as f32))]).unwrap();
                many.push(&[item(i as f32, 1.0), (i as i64).to_ne_bytes().to_vec()]).unwrap();
            }
            one.set_lookback(total / 2);
            for first in 0..=total {
                for len in 0..=total - first {
                    let run: Vec<usize> = (first..first + len).collect();
                    for lookback in 0..=len + 1 {
                        for c in [&one, &many] {
                            let fast = c.select_run(&run, lookback);
                            assert_eq!(fast.is_some(), len > 0);
                            if let Some(fast) = fast {
                                assert_eq!(
                                    fast,
                                    c.select_items(&run, lookback),
                                    "{run:?} lookback {lookback}"
                                );
                            }
                        }
                    }
                }
            }
        }
        assert!(f32_col().select_run(&[0, 2], 0).is_none());
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
        assert_eq!(floats(&c.item(0, 0))[0], 98.0);
        assert_eq!(floats(&c.item(0, 1))[0], 99.0);
        for i in 0..90 {
            c.push(&[&item(i as f32, 0.0)]).unwrap();
        }
        assert_eq!(c.capacity_bytes(), cap, "steady state reuses the storage");
        assert_eq!(c.leaf_bytes(0).as_ptr(), ptr);
    }

    #[test]
    fn a_push_grows_a_small_buffer_by_the_floor_at_least() {
        let mut c = Column::new(Schema::new(vec![Leaf::new(DType::F32, vec![])]));
        c.push(&[1f32.to_ne_bytes()]).unwrap();
        assert!(c.leaves[0].capacity() >= GROWTH_FLOOR_BYTES);
        for v in 2..=40 {
            c.push(&[(v as f32).to_ne_bytes()]).unwrap();
        }
        assert_eq!(c.len(), 40);
        assert_eq!(c.item(0, 39)[..], 40f32.to_ne_bytes());
    }

    #[test]
    fn a_small_full_buffer_grows_fourfold_then_by_doubling() {
        assert_eq!(growth(0, 4), GROWTH_FLOOR_BYTES);
        assert_eq!(growth(64, 4), 192, "64 bytes grow to 256");
        assert_eq!(growth(256, 16), 768, "256 bytes grow to 1024");
        assert_eq!(growth(1024, 4), GROWTH_FLOOR_BYTES, "from 1 KiB Vec's doubling decides");
        assert_eq!(growth(64, 4096), 4096, "a big item reserves its size");
        let mut c = Column::new(Schema::new(vec![Leaf::new(DType::F32, vec![])]));
        let mut capacities = vec![];
        for v in 0..400 {
            c.push(&[(v as f32).to_ne_bytes()]).unwrap();
            if capacities.last() != Some(&c.leaves[0].capacity()) {
                capacities.push(c.leaves[0].capacity());
            }
        }
        assert_eq!(capacities, vec![64, 256, 1024, 2048]);
    }

    #[test]
    fn reserve_within_takes_whole_items_up_to_the_bound() {
        let mut c =
            Column::new(Schema::new(vec![Leaf::new(DType::F32, vec![4]), Leaf::new(DType::BOOL, vec![])]));
        c.reserve_within(128, 1024);
        assert_eq!(c.leaves[0].capacity(), 64 * 16, "the bound: 64 items of 16 bytes");
        assert_eq!(c.leaves[1].capacity(), 128, "the items: 128 of 1 byte");
        let mut big = Column::new(Schema::new(vec![Leaf::new(DType::BOOL, vec![4096])]));
        big.reserve_within(128, 1024);
        assert_eq!(big.capacity_bytes(), 0, "an item bigger than the bound gets no room");
    }

    #[test]
    fn reserve_is_a_capped_hint() {
        let mut c = f32_col();
        c.push(&[&item(1.0, 2.0)]).unwrap();
        c.reserve(10);
        assert!(c.capacity_bytes() >= 11 * 8);
        assert_eq!((c.total(), floats(&c.item(0, 0))), (1, vec![1.0, 2.0]));
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
        assert_eq!(floats(&c.item(0, 4)), vec![4.0, 1.0]);
        c.push(&[&item(5.0, 5.0)]).unwrap();
        assert_eq!(floats(&c.item(0, 5)), vec![5.0, 5.0], "appending after a shrink grows again");

        // Large buffers too; the data stays.
        let mut big = Column::new(Schema::new(vec![Leaf::new(DType::F32, vec![1000])]));
        let row = vec![7u8; 4000];
        for _ in 0..17 {
            big.push(&[&row]).unwrap();
        }
        big.shrink_to_fit();
        assert_eq!(big.capacity_bytes(), 17 * 4000);
        assert_eq!(&big.item(0, 16)[..], &row[..]);
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
        assert_eq!(floats(&s.item(0, 0)), vec![2.0, 0.5]);
        assert_eq!(s.item(1, 1)[..], 0i64.to_ne_bytes());
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
        assert_eq!(floats(&t.item(0, 2))[0], 0.0);
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
        assert_eq!(floats(&c.item(0, 1)), vec![7.0, 7.0]);
        assert!(c.overwrite_many(&[3], &[&item(7.0, 7.0)]).is_err());
        let two = [item(5.0, 5.0), item(6.0, 6.0)].concat();
        assert_eq!(
            c.overwrite_many(&[0, 1, 2], &[&two]),
            Err(ColumnError::SetLength { selected: 3, given: 2 })
        );
        assert_eq!(ColumnError::check_set_len(2, 2), Ok(()));
        assert_eq!(ColumnError::check_set_len(2, 0), Err(ColumnError::SetLength { selected: 2, given: 0 }));
        c.overwrite_many(&[2, 0], &[&two]).unwrap();
        assert_eq!(floats(&c.item(0, 2)), vec![5.0, 5.0]);
        assert_eq!(floats(&c.item(0, 0)), vec![6.0, 6.0]);
    }

    /// Every item of both columns, read one by one and gathered at once, per leaf.
    fn contents(c: &Column) -> Vec<Vec<u8>> {
        let all: Vec<Pos> = (0..c.total()).map(Pos::At).collect();
        (0..c.schema().leaves.len())
            .flat_map(|l| {
                let one: Vec<u8> = (0..c.total()).flat_map(|p| c.item(l, p).into_owned()).collect();
                let gathered = c.gather(l, &all, None, false);
                assert_eq!(one, gathered, "item and gather agree");
                [one, gathered]
            })
            .collect()
    }

    /// A two-leaf column of `n` items whose bytes repeat (so they compress).
    fn two_leaf(n: usize, rows: Option<usize>) -> Column {
        let schema = Schema::new(vec![
            Leaf::new(DType { kind: crate::schema::Kind::UInt, size: 1 }, vec![3, 5]),
            Leaf::new(DType::I64, vec![]),
        ]);
        let mut c = Column::new(schema);
        c.set_compression(rows);
        for i in 0..n {
            c.push(&[vec![(i % 7) as u8; 15], (i as i64).to_ne_bytes().to_vec()]).unwrap();
        }
        c
    }

    #[test]
    fn compressed_columns_read_as_uncompressed() {
        for rows in [1, 2, 3, 8] {
            for n in [0, 1, 5, 17, 40] {
                let plain = two_leaf(n, None);
                let packed = two_leaf(n, Some(rows));
                assert_eq!(packed.compression(), Some(rows));
                assert!(n < 2 * rows || packed.sealed() > 0, "full blocks are sealed");
                assert!(packed.total() - packed.sealed() >= rows.min(n), "the newest block stays raw");
                assert_eq!(contents(&packed), contents(&plain));
                // Gathers in any order, with fills and repeats.
                let pos: Vec<Pos> =
                    (0..n).rev().map(Pos::At).chain([Pos::Fill]).chain((0..n).map(Pos::At)).collect();
                assert_eq!(
                    packed.gather(0, &pos, Some(&[9; 15]), false),
                    plain.gather(0, &pos, Some(&[9; 15]), false)
                );
                // select (a cut) keeps the compression and the contents.
                let picks: Vec<usize> = (0..n).step_by(2).collect();
                let (s, t) = (packed.select(&picks, 1), plain.select(&picks, 1));
                assert_eq!((s.compression(), s.lookback()), (Some(rows), t.lookback()));
                assert_eq!(contents(&s), contents(&t));
                // Switching compression off gives back the plain column.
                let mut off = packed.clone();
                off.set_compression(None);
                assert_eq!(off, plain);
            }
        }
    }

    #[test]
    fn compressed_columns_write_remove_and_recycle_as_uncompressed() {
        let mut plain = two_leaf(30, None);
        let mut packed = two_leaf(30, Some(4));
        let item = [vec![200u8; 15], 7i64.to_ne_bytes().to_vec()];
        let (a, b) = (item[0].repeat(2), item[1].repeat(2));
        for c in [&mut plain, &mut packed] {
            c.overwrite_many(&[2, 29], &[&a, &b]).unwrap();
            c.remove(5);
            c.remove(27);
            c.set_lookback(3);
        }
        assert!(packed.sealed() > 0, "sealed again after the writes");
        assert_eq!(contents(&packed), contents(&plain));
        assert_eq!(
            packed.overwrite_many(&[40], &[&a[..15], &b[..8]]),
            plain.overwrite_many(&[40], &[&a[..15], &b[..8]])
        );
        let mut other = two_leaf(9, Some(4));
        let mut other_plain = two_leaf(9, None);
        other.extend_from(&packed, &(3..28).collect::<Vec<_>>());
        other_plain.extend_from(&plain, &(3..28).collect::<Vec<_>>());
        assert_eq!(contents(&other), contents(&other_plain));
        for keep in [0, 2, 6, 20] {
            let (mut p, mut q) = (packed.clone(), plain.clone());
            p.recycle_keep_tail(keep);
            q.recycle_keep_tail(keep);
            assert_eq!((p.total(), p.lookback(), p.sealed()), (q.total(), q.lookback(), 0));
            assert_eq!(contents(&p), contents(&q));
            for i in 0..11 {
                p.push(&[vec![i; 15], [i; 8].to_vec()]).unwrap();
                q.push(&[vec![i; 15], [i; 8].to_vec()]).unwrap();
            }
            assert_eq!(contents(&p), contents(&q));
        }
    }

    /// Plain and compressed (blocks of 32) columns of `n` 64x64 frames: a square moving
    /// over a gradient (`row(i)`: the square's row in frame `i`).
    fn moving_frames(n: usize, row: impl Fn(usize) -> usize) -> (Column, Column) {
        let image =
            Schema::new(vec![Leaf::new(DType { kind: crate::schema::Kind::UInt, size: 1 }, vec![64, 64])]);
        let (mut plain, mut packed) = (Column::new(image.clone()), Column::new(image));
        packed.set_compression(Some(32));
        for i in 0..n {
            let frame: Vec<u8> = (0..64 * 64)
                .map(|k: usize| {
                    if (k / 64).abs_diff(row(i)) < 6 && (k % 64).abs_diff(i % 40) < 6 {
                        255
                    } else {
                        (k / 64) as u8
                    }
                })
                .collect();
            plain.push(&[&frame]).unwrap();
            packed.push(&[&frame]).unwrap();
        }
        (plain, packed)
    }

    #[test]
    fn compressed_columns_hold_fewer_bytes_and_one_hot_reads_work() {
        let (plain, packed) = moving_frames(640, |i| i % 50);
        assert!(
            packed.stored_bytes() * 4 < plain.stored_bytes(),
            "{} vs {}",
            packed.stored_bytes(),
            plain.stored_bytes()
        );
        assert_eq!(contents(&packed), contents(&plain));
        let mut leaf = Leaf::new(DType::I64, vec![]);
        leaf.one_hot = OneHot::Discrete { n: 3, start: 0 };
        let mut c = Column::new(Schema::new(vec![leaf]));
        c.set_compression(Some(2));
        for i in [0i64, 1, 2, 1, 0, 2] {
            c.push(&[&i.to_ne_bytes()]).unwrap();
        }
        assert_eq!(c.sealed(), 4);
        let got = floats(&c.gather(0, &[Pos::At(1), Pos::At(5), Pos::Fill], None, true));
        assert_eq!(got, vec![0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
        // Zero-size items compress too.
        let mut z = Column::new(Schema::new(vec![Leaf::new(DType::F32, vec![0])]));
        z.set_compression(Some(1));
        for _ in 0..5 {
            z.push(&[&[]]).unwrap();
        }
        assert_eq!((z.total(), z.sealed()), (5, 4));
        assert!(z.item(0, 0).is_empty());
    }

    #[test]
    fn sealing_everything_keeps_reads_and_a_short_last_block() {
        for rows in [1, 2, 3, 8] {
            for n in [0, 1, 5, 17, 40] {
                let plain = two_leaf(n, None);
                let mut packed = two_leaf(n, Some(rows));
                packed.seal_all();
                assert_eq!(packed.sealed(), n, "nothing stays raw");
                assert!(packed.leaf_bytes(0).is_empty() && packed.leaf_bytes(1).is_empty());
                assert_eq!(contents(&packed), contents(&plain));
                let pos: Vec<Pos> =
                    (0..n).rev().map(Pos::At).chain([Pos::Fill]).chain((0..n).map(Pos::At)).collect();
                assert_eq!(
                    packed.gather(0, &pos, Some(&[9; 15]), false),
                    plain.gather(0, &pos, Some(&[9; 15]), false)
                );
                // Sealing again changes nothing; so does the same compression.
                let before = packed.clone();
                packed.seal_all();
                packed.set_compression(Some(rows));
                assert_eq!(packed, before);
                // A cut's look-back and a slice read the same and are open for appends.
                let tail: Vec<usize> = (n.saturating_sub(3)..n).collect();
                let picks: Vec<usize> = (0..n).step_by(2).collect();
                for (sel, lb) in [(&tail, tail.len().saturating_sub(1)), (&picks, 1)] {
                    let (mut s, mut t) = (packed.select(sel, lb), plain.select(sel, lb));
                    assert_eq!((s.compression(), s.lookback()), (Some(rows), t.lookback()));
                    assert_eq!(contents(&s), contents(&t));
                    for i in 0..3u8 {
                        s.push(&[vec![i; 15], [i; 8].to_vec()]).unwrap();
                        t.push(&[vec![i; 15], [i; 8].to_vec()]).unwrap();
                    }
                    assert_eq!(contents(&s), contents(&t));
                }
                // Unpacking gives back the plain column.
                let mut off = packed.clone();
                off.set_compression(None);
                assert_eq!(off, plain);
                // Sealing an uncompressed column does nothing.
                let mut p2 = plain.clone();
                p2.seal_all();
                assert_eq!(p2, plain);
            }
        }
    }

    #[test]
    fn packed_parts_rebuild_the_same_column_and_bad_parts_are_refused() {
        let schema = || two_leaf(0, None).shared_schema().clone();
        for rows in [1, 3, 8] {
            for n in [0, 1, 5, 17, 40] {
                for seal in [false, true] {
                    let mut c = two_leaf(n, Some(rows));
                    c.set_lookback(n.min(2));
                    if seal {
                        c.seal_all();
                    }
                    let parts = c.packed_parts().unwrap();
                    let back = Column::from_packed_parts(schema(), parts.clone()).unwrap();
                    assert_eq!(back, c);
                    assert_eq!(contents(&back), contents(&c));
                    // It goes on as the original does.
                    let (mut a, mut b) = (back, c.clone());
                    for i in 0..4u8 {
                        a.push(&[vec![i; 15], [i; 8].to_vec()]).unwrap();
                        b.push(&[vec![i; 15], [i; 8].to_vec()]).unwrap();
                    }
                    assert_eq!(a, b);
                    if parts.sealed == 0 {
                        continue;
                    }
                    let refused = |f: &dyn Fn(&mut PackedParts)| {
                        let mut bad = parts.clone();
                        f(&mut bad);
                        Column::from_packed_parts(schema(), bad).unwrap_err()
                    };
                    assert!(matches!(
                        refused(&|p| p.blocks[1].pop().map_or((), drop)),
                        ColumnError::Packed(_)
                    ));
                    assert!(matches!(refused(&|p| p.blocks[0][0].truncate(1)), ColumnError::Packed(_)));
                    assert!(matches!(refused(&|p| p.total += 1), ColumnError::ItemSize { .. }));
                    assert!(matches!(refused(&|p| p.lookback = p.total + 1), ColumnError::Packed(_)));
                    assert!(matches!(
                        refused(&|p| p.raw.pop().map_or((), drop)),
                        ColumnError::LeafCount { .. }
                    ));
                    assert!(matches!(refused(&|p| p.rows = 0), ColumnError::Packed(_)));
                    assert!(matches!(refused(&|p| p.sealed = p.total + 1), ColumnError::Packed(_)));
                }
            }
        }
        assert_eq!(f32_col().packed_parts(), None, "an uncompressed column has no packed parts");
    }

    #[test]
    fn a_sealed_column_takes_appends_writes_removals_and_concats() {
        for (rows, n) in [(4, 30), (4, 32), (3, 1), (8, 0), (1, 7)] {
            let mut plain = two_leaf(n, None);
            let mut packed = two_leaf(n, Some(rows));
            packed.seal_all();
            // Appends open the column: no short block stays before raw items, the newest
            // items are raw again, and sealing goes on by full blocks.
            for i in 0..(2 * rows + 3) {
                let item = [vec![(i * 3) as u8; 15], (i as i64).to_ne_bytes().to_vec()];
                packed.push(&item).unwrap();
                plain.push(&item).unwrap();
                assert_eq!(packed.sealed() % rows, 0);
                assert!(packed.sealed() < packed.total());
                assert_eq!(contents(&packed), contents(&plain));
            }
            packed.seal_all();
            assert_eq!(packed.sealed(), packed.total());
            // Writes and removals on a sealed column keep it sealed.
            let item = [vec![200u8; 15], 7i64.to_ne_bytes().to_vec()];
            let last = plain.total() - 1;
            for c in [&mut plain, &mut packed] {
                c.overwrite_many(&[last], &[&item[0], &item[1]]).unwrap();
                c.remove(last - 1);
                c.overwrite_many(&[0], &[&item[0], &item[1]]).unwrap();
            }
            assert_eq!(packed.sealed(), packed.total());
            assert_eq!(contents(&packed), contents(&plain));
            // A concat: a sealed chunk loses its last item (the successor's first), then
            // takes the successor's items, sealed or not.
            let (mut succ, mut succ_plain) = (two_leaf(9, Some(rows)), two_leaf(9, None));
            succ.seal_all();
            let all: Vec<usize> = (0..9).collect();
            let (mut a, mut b) = (packed.clone(), plain.clone());
            a.remove(a.total() - 1);
            b.remove(b.total() - 1);
            a.extend_from(&succ, &all);
            b.extend_from(&succ_plain, &all);
            assert_eq!(contents(&a), contents(&b));
            assert!(a.sealed() < a.total(), "the concat is open for appends");
            succ.extend_from(&packed, &[0, 1]);
            succ_plain.extend_from(&plain, &[0, 1]);
            assert_eq!(contents(&succ), contents(&succ_plain));
            // Recycling keeps the tail raw for the successor (unsealing only its blocks).
            for keep in [0, 2, rows + 1, plain.total()] {
                let (mut r, mut q) = (packed.clone(), plain.clone());
                r.recycle_keep_tail(keep);
                q.recycle_keep_tail(keep);
                assert_eq!((r.sealed(), r.lookback()), (0, q.lookback()));
                r.push(&item).unwrap();
                q.push(&item).unwrap();
                assert_eq!(contents(&r), contents(&q));
            }
        }
    }

    #[test]
    fn a_sealed_column_of_moving_frames_holds_far_fewer_bytes() {
        // 51 items: one chunk of 50 steps; before `seal_all` none is sealed.
        let (plain, mut packed) = moving_frames(51, |i| i);
        assert_eq!(packed.stored_bytes(), plain.stored_bytes());
        packed.seal_all();
        packed.shrink_to_fit();
        assert!(packed.stored_bytes() * 4 < plain.stored_bytes(), "{}", packed.stored_bytes());
        assert!(packed.capacity_bytes() * 4 < plain.stored_bytes(), "{}", packed.capacity_bytes());
        assert_eq!(contents(&packed), contents(&plain));
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
