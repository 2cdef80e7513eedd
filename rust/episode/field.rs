//! A field of an episode: one kind of data (observations, actions, rewards, infos, one
//! extra model output) stored either as a typed [`Column`] or, for data that fits no
//! schema, as host objects (`O`: Python objects in the binding layer, anything `Clone` in
//! Rust tests), with the host's spec of its items (`S`: how the binding turns bytes into
//! numpy values; `()` in Rust tests).

use std::sync::Arc;

use crate::column::{Column, ColumnError, Geometry, Index, IndexError, PackedParts, Resolved};
use crate::schema::Schema;

/// Items a typed field's column makes room for when it receives its first item (an
/// episode's chunk usually grows to tens or hundreds of items), bounded by
/// [`FIRST_CHUNK_BYTES`]: a 100-step chunk's buffers of 4- to 16-byte items are then
/// allocated once and grown once, instead of grown three or four times (about 900
/// instructions each) from the column's first 64 bytes.
pub const FIRST_CHUNK_ITEMS: usize = 64;

/// The most bytes a buffer reserves for [`FIRST_CHUNK_ITEMS`] (whole items; a bigger item
/// reserves nothing ahead): 2 KiB, so that a short episode holds at most that much spare
/// per buffer until `to_numpy` gives it back.
pub const FIRST_CHUNK_BYTES: usize = 2048;

/// Makes room for [`FIRST_CHUNK_ITEMS`] in a column that has none yet (a new one).
fn reserve_first_chunk(column: &mut Column) {
    if column.total() == 0 && column.capacity_bytes() == 0 {
        column.reserve_within(FIRST_CHUNK_ITEMS, FIRST_CHUNK_BYTES);
    }
}

/// Storage of a field.
#[derive(Clone, Debug, PartialEq)]
pub enum Storage<O> {
    /// Nothing stored and no schema known yet: typed from the first item, its column
    /// compressed as `compression` says (see [`Field::set_compression`]).
    Untyped { compression: Option<usize> },
    /// Fixed-schema items in contiguous byte buffers.
    Typed {
        column: Column,
        /// The items were given as host scalars (Python `int`/`float`/`bool`), so readers
        /// hand them back as such before `to_numpy`, as RLlib does with its Python lists.
        host_scalars: bool,
    },
    /// Items that fit no schema (text, ragged data), kept as host objects.
    Objects { items: Vec<O>, lookback: usize },
    /// Host objects most of which are absent (the infos: most steps give none, and RLlib
    /// stores a fresh empty dict for each). Only the objects given are kept, by absolute
    /// position (sorted, unique), so a step without one costs no memory; the binding
    /// layer creates the host's default in place when an absent item is first read.
    Sparse { total: usize, lookback: usize, items: Vec<(usize, O)> },
}

/// One stored item of a typed column, handed to the caller that turns it into a host
/// object (see [`Field::make_objects`]).
#[derive(Debug)]
pub struct TypedItem<'a, S = ()> {
    pub column: &'a Column,
    /// The spec of the field the item belongs to.
    pub spec: Option<&'a S>,
    /// Absolute position (look-back included).
    pub pos: usize,
    /// The item was given as a host scalar and reads back as one (the field's
    /// `host_scalars`, before `to_numpy`): as an object it stays one.
    pub host_scalar: bool,
}

impl<S> Clone for TypedItem<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for TypedItem<'_, S> {}

/// What the core asks of a field's spec.
pub trait FieldSpec {
    /// The spec comes from a space the user gave (not inferred from the first item): values
    /// that do not fit it are errors, and fills and one-hot encodings follow it.
    fn is_from_space(&self) -> bool;

    /// The schema that items converted by this spec have, if it knows one.
    fn schema(&self) -> Option<&Schema> {
        None
    }
}

impl FieldSpec for () {
    fn is_from_space(&self) -> bool {
        false
    }
}

/// The per-leaf buffers of one item. Most spaces (Box, Discrete, scalars) have one
/// leaf: it is held inline, which saves an allocation per field and step (about a
/// tenth of a multi-agent step's cost per agent).
#[derive(Clone, Debug, PartialEq)]
pub enum Leaves<B> {
    One(B),
    Many(Vec<B>),
}

impl<B> std::ops::Deref for Leaves<B> {
    type Target = [B];

    fn deref(&self) -> &[B] {
        match self {
            Leaves::One(b) => std::slice::from_ref(b),
            Leaves::Many(v) => v,
        }
    }
}

impl<B> From<Vec<B>> for Leaves<B> {
    fn from(mut v: Vec<B>) -> Self {
        match v.pop() {
            Some(b) if v.is_empty() => Leaves::One(b),
            Some(b) => {
                v.push(b);
                Leaves::Many(v)
            }
            None => Leaves::Many(v),
        }
    }
}

impl<B> Leaves<B> {
    /// The buffers as a vector.
    pub fn into_vec(self) -> Vec<B> {
        match self {
            Leaves::One(b) => vec![b],
            Leaves::Many(v) => v,
        }
    }
}

/// One item on its way into a field, already converted by the caller.
#[derive(Clone, Debug, PartialEq)]
pub enum Item<O, B = Vec<u8>, S = ()> {
    /// Bytes that fit the field's current schema, one buffer per leaf (`B`: owned bytes,
    /// or a view of the caller's buffer so that storing an item copies it only once).
    Bytes(Leaves<B>),
    /// The first item of an untyped field, with the schema inferred from it; `spec`, the
    /// spec that the caller inferred with it, becomes the field's once the item is stored
    /// (`None`: the field keeps its own).
    FirstTyped { schema: Arc<Schema>, leaves: Leaves<B>, host_scalars: bool, spec: Option<Arc<S>> },
    /// An item stored as a host object (the field holds objects, or must become so).
    Object(O),
}

/// How a host value written into a field becomes an item: the binding converts it as told.
#[derive(Debug, PartialEq, Eq)]
pub enum Conversion<'a, S> {
    /// Kept as a host object: the field holds objects, or typed items without a spec.
    Object,
    /// Converted to bytes by the field's spec. A value that does not convert is an error
    /// where `strict` (the spec is a space's); otherwise the field turns into objects and
    /// keeps it as one (a layout inferred from the first item binds nothing).
    Bytes { spec: &'a S, strict: bool },
    /// The field's first item, converted by the spec of the space given before any data;
    /// a value that does not convert is an error.
    First(&'a S),
    /// The first item of a field without a spec: the spec is inferred from the value and
    /// goes with the item ([`Item::FirstTyped`]); a value without a numeric layout, or
    /// one that does not convert, is kept as an object.
    Infer,
}

/// One field of an episode: storage, the spec of its items, and RLlib's "finalized" flag,
/// which only changes how reads are returned (lists of items before `to_numpy`, batched
/// arrays after).
///
/// The spec is shared (`Arc`): the binding interns its specs, so the fields of one
/// runner's episodes point at the same few (a pointer per field, nothing per episode).
/// Cuts, slices and copies carry it along with the items.
#[derive(Debug)]
pub struct Field<O, S = ()> {
    pub storage: Storage<O>,
    pub spec: Option<Arc<S>>,
    pub finalized: bool,
}

impl<O: Clone, S> Clone for Field<O, S> {
    fn clone(&self) -> Self {
        Field { storage: self.storage.clone(), spec: self.spec.clone(), finalized: self.finalized }
    }
}

/// Specs compare by address: the binding's are interned, so equal ones are shared.
impl<O: PartialEq, S> PartialEq for Field<O, S> {
    fn eq(&self, other: &Self) -> bool {
        let same_spec = match (&self.spec, &other.spec) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same_spec && self.finalized == other.finalized && self.storage == other.storage
    }
}

impl<O: Clone, S> Default for Field<O, S> {
    fn default() -> Self {
        Field::untyped()
    }
}

impl<O: Clone, S> Field<O, S> {
    #[must_use]
    pub fn untyped() -> Field<O, S> {
        Field { storage: Storage::Untyped { compression: None }, spec: None, finalized: false }
    }

    #[must_use]
    pub fn typed(schema: impl Into<Arc<Schema>>, host_scalars: bool) -> Field<O, S> {
        Field {
            storage: Storage::Typed { column: Column::new(schema), host_scalars },
            spec: None,
            finalized: false,
        }
    }

    #[must_use]
    pub fn objects(items: Vec<O>, lookback: usize) -> Field<O, S> {
        let lookback = lookback.min(items.len());
        Field { storage: Storage::Objects { items, lookback }, spec: None, finalized: false }
    }

    /// An empty field of sparse host objects (see [`Storage::Sparse`]).
    #[must_use]
    pub fn sparse() -> Field<O, S> {
        Field {
            storage: Storage::Sparse { total: 0, lookback: 0, items: Vec::new() },
            spec: None,
            finalized: false,
        }
    }

    /// The spec of the items (see [`Field::spec`]).
    #[must_use]
    pub fn spec(&self) -> Option<&S> {
        self.spec.as_deref()
    }

    /// Whether the spec comes from a space the user gave (see [`FieldSpec::is_from_space`]).
    #[must_use]
    pub fn spaced(&self) -> bool
    where
        S: FieldSpec,
    {
        self.spec().is_some_and(FieldSpec::is_from_space)
    }

    #[must_use]
    pub fn geometry(&self) -> Geometry {
        match &self.storage {
            Storage::Untyped { .. } => Geometry { total: 0, lookback: 0 },
            Storage::Typed { column, .. } => column.geometry(),
            Storage::Objects { items, lookback } => Geometry { total: items.len(), lookback: *lookback },
            Storage::Sparse { total, lookback, .. } => Geometry { total: *total, lookback: *lookback },
        }
    }

    /// The object stored at absolute position `pos` of an object field; `None` for an
    /// absent item of a sparse field, a position out of range, or a typed field.
    #[must_use]
    pub fn object(&self, pos: usize) -> Option<&O> {
        match &self.storage {
            Storage::Objects { items, .. } => items.get(pos),
            Storage::Sparse { items, .. } => {
                items.binary_search_by_key(&pos, |(p, _)| *p).ok().map(|i| &items[i].1)
            }
            _ => None,
        }
    }

    /// Appends one item to a sparse field: `Some` object, or `None` for an absent one.
    /// Returns `false` (and changes nothing) if the field is not sparse.
    #[inline]
    pub fn push_sparse(&mut self, item: Option<O>) -> bool {
        let Storage::Sparse { total, items, .. } = &mut self.storage else { return false };
        if let Some(o) = item {
            items.push((*total, o));
        }
        *total += 1;
        true
    }

    /// Stores `make()` at every absent position of `positions` in a sparse field (and
    /// nothing else), so that later reads hand out that same object: a caller that
    /// mutates what it read sees the change on the next read, as with stored objects.
    /// Positions out of range are skipped. Returns how many objects were made.
    pub fn materialize(&mut self, positions: &[usize], mut make: impl FnMut() -> O) -> usize {
        let Storage::Sparse { total, items, .. } = &mut self.storage else { return 0 };
        let mut missing: Vec<usize> = positions
            .iter()
            .copied()
            .filter(|&p| p < *total && items.binary_search_by_key(&p, |(q, _)| *q).is_err())
            .collect();
        if missing.is_empty() {
            return 0;
        }
        missing.sort_unstable();
        missing.dedup();
        // One merge of two sorted runs instead of an O(n) insert per position.
        let old = std::mem::take(items);
        items.reserve_exact(old.len() + missing.len());
        let mut new = missing.iter().peekable();
        for (p, o) in old {
            while let Some(&&m) = new.peek() {
                if m > p {
                    break;
                }
                items.push((m, make()));
                new.next();
            }
            items.push((p, o));
        }
        for &m in new {
            items.push((m, make()));
        }
        missing.len()
    }

    /// Overwrites the object at absolute position `pos` of an object field (sparse or
    /// not). Returns `false` (and changes nothing) for a typed field or a position out of
    /// range.
    pub fn set_object(&mut self, pos: usize, object: O) -> bool {
        match &mut self.storage {
            Storage::Objects { items, .. } => match items.get_mut(pos) {
                Some(slot) => {
                    *slot = object;
                    true
                }
                None => false,
            },
            Storage::Sparse { total, items, .. } if pos < *total => {
                match items.binary_search_by_key(&pos, |(p, _)| *p) {
                    Ok(i) => items[i].1 = object,
                    Err(i) => items.insert(i, (pos, object)),
                }
                true
            }
            _ => false,
        }
    }

    /// Gives back the buffers' spare capacity (after the last append of a chunk that is
    /// handed out and kept: `to_numpy`), so that held episodes cost their data only.
    pub fn shrink_to_fit(&mut self) {
        match &mut self.storage {
            Storage::Untyped { .. } => {}
            Storage::Typed { column, .. } => column.shrink_to_fit(),
            Storage::Objects { items, .. } => items.shrink_to_fit(),
            Storage::Sparse { items, .. } => items.shrink_to_fit(),
        }
    }

    /// Items in the chunk (look-back not counted).
    #[must_use]
    pub fn len(&self) -> usize {
        self.geometry().len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[must_use]
    pub fn lookback(&self) -> usize {
        self.geometry().lookback
    }

    pub fn set_lookback(&mut self, lookback: usize) {
        match &mut self.storage {
            Storage::Untyped { .. } => {}
            Storage::Typed { column, .. } => column.set_lookback(lookback),
            Storage::Objects { items, lookback: lb } => *lb = lookback.min(items.len()),
            Storage::Sparse { total, lookback: lb, .. } => *lb = lookback.min(*total),
        }
    }

    /// Resolves a user index against this field's geometry.
    pub fn resolve(
        &self,
        index: &Index,
        neg_index_as_lookback: bool,
        fill: bool,
    ) -> Result<Resolved, IndexError> {
        self.geometry().resolve(index, neg_index_as_lookback, fill)
    }

    /// A new field with the items at absolute `positions`, the first `lookback` of them
    /// look-back; same storage kind, spec and finalized flag.
    #[must_use]
    pub fn select(&self, positions: &[usize], lookback: usize) -> Field<O, S> {
        let storage = match &self.storage {
            Storage::Untyped { compression } => Storage::Untyped { compression: *compression },
            Storage::Typed { column, host_scalars } => {
                Storage::Typed { column: column.select(positions, lookback), host_scalars: *host_scalars }
            }
            Storage::Objects { items, .. } => {
                let items: Vec<O> = positions.iter().map(|&p| items[p].clone()).collect();
                let lookback = lookback.min(items.len());
                Storage::Objects { items, lookback }
            }
            Storage::Sparse { .. } => {
                let items: Vec<(usize, O)> = positions
                    .iter()
                    .enumerate()
                    .filter_map(|(k, &p)| self.object(p).map(|o| (k, o.clone())))
                    .collect();
                Storage::Sparse { total: positions.len(), lookback: lookback.min(positions.len()), items }
            }
        };
        Field { storage, spec: self.spec.clone(), finalized: self.finalized }
    }

    /// Removes the item at `index` of all stored items, look-back included (negative:
    /// from the end), as RLlib's `InfiniteLookbackBuffer.pop`; the look-back shrinks when
    /// the item was part of it. Returns the position removed, `None` (and nothing changes)
    /// if there is no such item.
    pub fn pop(&mut self, index: i64) -> Option<usize> {
        let total = self.geometry().total;
        let pos = if index < 0 { i64::try_from(total).ok()?.checked_add(index)? } else { index };
        let pos = usize::try_from(pos).ok().filter(|&p| p < total)?;
        self.remove(pos);
        Some(pos)
    }

    /// Bytes of the stored typed items (compressed blocks plus raw items); 0 for objects.
    #[must_use]
    pub fn stored_bytes(&self) -> usize {
        match &self.storage {
            Storage::Typed { column, .. } => column.stored_bytes(),
            _ => 0,
        }
    }

    /// The spec, where the field stores typed items laid out by it: a value converted by
    /// it is bytes the column takes as they are (a runner's rows of a batch).
    #[must_use]
    pub fn row_spec(&self) -> Option<&S>
    where
        S: FieldSpec,
    {
        let Storage::Typed { column, .. } = &self.storage else { return None };
        // The same schema object first: a column made from a spec shares it.
        self.spec().filter(|s| {
            s.schema().is_some_and(|schema| {
                std::ptr::eq(column.schema(), schema) || column.schema().leaves == schema.leaves
            })
        })
    }

    /// How a value written into this field becomes an item (see [`Conversion`]).
    #[must_use]
    pub fn conversion(&self) -> Conversion<'_, S>
    where
        S: FieldSpec,
    {
        match (&self.storage, self.spec()) {
            (Storage::Objects { .. } | Storage::Sparse { .. }, _) | (Storage::Typed { .. }, None) => {
                Conversion::Object
            }
            (Storage::Typed { .. }, Some(spec)) => Conversion::Bytes { spec, strict: spec.is_from_space() },
            (Storage::Untyped { .. }, Some(spec)) => Conversion::First(spec),
            (Storage::Untyped { .. }, None) => Conversion::Infer,
        }
    }

    /// Removes the item at absolute position `pos`.
    pub fn remove(&mut self, pos: usize) {
        match &mut self.storage {
            Storage::Untyped { .. } => {}
            Storage::Typed { column, .. } => column.remove(pos),
            Storage::Objects { items, lookback } => {
                if pos < items.len() {
                    items.remove(pos);
                    if pos < *lookback {
                        *lookback -= 1;
                    }
                }
            }
            Storage::Sparse { total, lookback, items } => {
                if pos < *total {
                    items.retain(|(p, _)| *p != pos);
                    for (p, _) in items.iter_mut().filter(|(p, _)| *p > pos) {
                        *p -= 1;
                    }
                    *total -= 1;
                    if pos < *lookback {
                        *lookback -= 1;
                    }
                }
            }
        }
    }

    /// Turns typed storage into host objects with `to_object` (one call per item), e.g.
    /// when an item arrives that does not fit the schema inferred from the first one.
    pub fn make_objects(&mut self, mut to_object: impl FnMut(TypedItem<'_, S>) -> O) {
        if let Storage::Typed { column, host_scalars } = &self.storage {
            let host_scalar = *host_scalars && !self.finalized;
            let spec = self.spec.as_deref();
            let items = (0..column.total())
                .map(|pos| to_object(TypedItem { column, spec, pos, host_scalar }))
                .collect();
            self.storage = Storage::Objects { items, lookback: column.lookback() };
        } else if let Storage::Untyped { .. } = self.storage {
            self.storage = Storage::Objects { items: Vec::new(), lookback: 0 };
        }
    }

    /// Whether `item` can be pushed without error (so that a step touching several
    /// fields can check them all before changing any).
    #[must_use]
    pub fn accepts<B: AsRef<[u8]>>(&self, item: &Item<O, B, S>) -> bool {
        let fits = |leaves: &[B], schema: &Schema| {
            leaves.len() == schema.leaves.len()
                && leaves.iter().zip(&schema.leaves).all(|(b, l)| b.as_ref().len() == l.item_bytes())
        };
        match (item, &self.storage) {
            (Item::Bytes(leaves), Storage::Typed { column, .. }) => fits(leaves, column.schema()),
            (Item::FirstTyped { schema, leaves, .. }, Storage::Untyped { .. }) => fits(leaves, schema),
            (Item::Object(_), _) => true,
            _ => false,
        }
    }

    /// Appends one item; `to_object` turns stored typed items into objects when an
    /// object item arrives in a typed field.
    ///
    /// Returns `false` (and changes nothing) if the item does not fit (see [`Self::accepts`]).
    pub fn push<B: AsRef<[u8]>>(
        &mut self,
        item: Item<O, B, S>,
        to_object: impl FnMut(TypedItem<'_, S>) -> O,
    ) -> bool {
        if !self.accepts(&item) {
            return false;
        }
        self.push_accepted(item, to_object);
        true
    }

    /// [`Self::push`] for an item that [`Self::accepts`] already approved (the hot path
    /// checks every field of a step first, then stores without checking again).
    pub fn push_accepted<B: AsRef<[u8]>>(
        &mut self,
        item: Item<O, B, S>,
        to_object: impl FnMut(TypedItem<'_, S>) -> O,
    ) -> bool {
        match item {
            Item::Bytes(leaves) => {
                if let Storage::Typed { column, .. } = &mut self.storage {
                    reserve_first_chunk(column);
                    // Checked again (a cheap length compare): a view's length is read at
                    // push time, and nothing may tear a column's item layout.
                    return column.push(&leaves).is_ok();
                }
                false
            }
            Item::FirstTyped { schema, leaves, host_scalars, spec } => {
                let mut column = Column::new(schema);
                column.set_compression(self.compression());
                reserve_first_chunk(&mut column);
                if column.push(&leaves).is_err() {
                    return false;
                }
                self.storage = Storage::Typed { column, host_scalars };
                if spec.is_some() {
                    self.spec = spec;
                }
                true
            }
            Item::Object(o) => {
                if let Storage::Sparse { .. } = self.storage {
                    return self.push_sparse(Some(o));
                }
                self.make_objects(to_object);
                if let Storage::Objects { items, .. } = &mut self.storage {
                    items.push(o);
                }
                true
            }
        }
    }

    /// Takes `other`'s spec where this field has none (the chunk it continues, or an item
    /// that typed it).
    pub fn adopt_spec(&mut self, other: Option<&Arc<S>>) {
        if self.spec.is_none() {
            self.spec = other.cloned();
        }
    }

    /// Compresses the field's typed column (see [`Column::set_compression`]): `Some(rows)`
    /// seals blocks of `rows` items, `None` unpacks. An untyped field keeps the setting for
    /// the column its first item makes; objects are not compressed (nothing changes).
    pub fn set_compression(&mut self, rows: Option<usize>) {
        match &mut self.storage {
            Storage::Untyped { compression } => *compression = rows,
            Storage::Typed { column, .. } => column.set_compression(rows),
            Storage::Objects { .. } | Storage::Sparse { .. } => {}
        }
    }

    /// Rows per compressed block of the typed column (or of the column an untyped field
    /// will make); `None` if not compressed.
    #[must_use]
    pub fn compression(&self) -> Option<usize> {
        match &self.storage {
            Storage::Untyped { compression } => *compression,
            Storage::Typed { column, .. } => column.compression(),
            _ => None,
        }
    }

    /// The stored parts of a compressed typed column laid out by its space's spec (see
    /// [`Column::packed_parts`]), for moving the field to another process as it is
    /// stored; `None` for any other field (it moves as its items).
    #[must_use]
    pub fn packed_parts(&self) -> Option<PackedParts>
    where
        S: FieldSpec,
    {
        let Storage::Typed { column, .. } = &self.storage else { return None };
        let from_space = self.spec().is_some_and(FieldSpec::is_from_space) && self.row_spec().is_some();
        from_space.then(|| column.packed_parts()).flatten()
    }

    /// Replaces the items of the typed column by the stored parts of one of the same
    /// layout ([`Self::packed_parts`] of the field in another process).
    ///
    /// Errors: [`ColumnError::Packed`] if the field holds no typed column, and the
    /// errors of [`Column::from_packed_parts`]; the field is unchanged then.
    pub fn set_packed_parts(&mut self, parts: PackedParts) -> Result<(), ColumnError> {
        let Storage::Typed { column, .. } = &mut self.storage else {
            return Err(ColumnError::Packed("the field holds no typed column"));
        };
        *column = Column::from_packed_parts(column.shared_schema().clone(), parts)?;
        Ok(())
    }

    /// Appends the chunk items of `other` (its look-back excluded).
    ///
    /// Returns `false` (and changes nothing) when the two storages cannot hold each
    /// other's items (different schemas, or typed vs objects): the caller converts first.
    /// The spec stays this field's (see [`Field::adopt_spec`]).
    pub fn extend_chunk(&mut self, other: &Field<O, S>) -> bool {
        let g = other.geometry();
        let positions: Vec<usize> = (g.lookback..g.total).collect();
        if positions.is_empty() {
            return true;
        }
        match (&mut self.storage, &other.storage) {
            (Storage::Typed { column, .. }, Storage::Typed { column: theirs, .. })
                if column.schema() == theirs.schema() =>
            {
                column.extend_from(theirs, &positions);
                true
            }
            (Storage::Objects { items, .. }, Storage::Objects { items: theirs, .. }) => {
                items.extend(positions.iter().map(|&p| theirs[p].clone()));
                true
            }
            (Storage::Sparse { total, items, .. }, Storage::Sparse { items: theirs, .. }) => {
                let shift = *total;
                items.extend(
                    theirs
                        .iter()
                        .filter(|(p, _)| *p >= g.lookback)
                        .map(|(p, o)| (p - g.lookback + shift, o.clone())),
                );
                *total += positions.len();
                true
            }
            (Storage::Untyped { compression }, _) => {
                let compression = *compression;
                let lookback = self.lookback();
                let mut adopted = other.select(&positions, 0);
                adopted.finalized = self.finalized;
                adopted.set_lookback(lookback);
                // A setting made while untyped wins; without one the column stays as given.
                if compression.is_some() {
                    adopted.set_compression(compression);
                }
                self.storage = adopted.storage;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{DType, Leaf};

    #[test]
    fn leaves_hold_one_buffer_inline_and_read_as_a_slice() {
        for n in 0..4 {
            let v: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; i]).collect();
            let leaves = Leaves::from(v.clone());
            assert_eq!(matches!(leaves, Leaves::One(_)), n == 1);
            assert_eq!(&*leaves, v.as_slice());
            assert_eq!(leaves.into_vec(), v);
        }
    }

    fn capacity(f: &Field<String>) -> usize {
        match &f.storage {
            Storage::Typed { column, .. } => column.capacity_bytes(),
            _ => 0,
        }
    }

    #[test]
    fn a_first_item_makes_room_for_a_chunk_within_the_bound() {
        let to_object = |_: TypedItem<'_>| String::new();
        let mut f: Field<String> = Field::typed(Schema::new(vec![Leaf::new(DType::I64, vec![])]), true);
        assert!(f.push(Item::Bytes(Leaves::One(7i64.to_ne_bytes().to_vec())), to_object));
        assert_eq!(capacity(&f), FIRST_CHUNK_ITEMS * 8);
        for v in 1..FIRST_CHUNK_ITEMS as i64 {
            f.push(Item::Bytes(Leaves::One(v.to_ne_bytes().to_vec())), to_object);
        }
        assert_eq!(capacity(&f), FIRST_CHUNK_ITEMS * 8, "the chunk fits without growing");

        // An untyped field typed by its first item; 64-byte items reach the byte bound.
        let mut g: Field<String> = Field::untyped();
        let schema = Arc::new(Schema::new(vec![Leaf::new(DType::F32, vec![16])]));
        let first =
            Item::FirstTyped { schema, leaves: Leaves::One(vec![0; 64]), host_scalars: false, spec: None };
        assert!(g.push(first, to_object));
        assert_eq!(capacity(&g), FIRST_CHUNK_BYTES);

        // A big item reserves no room ahead.
        let mut big: Field<String> =
            Field::typed(Schema::new(vec![Leaf::new(DType::BOOL, vec![4096])]), false);
        big.push(Item::Bytes(Leaves::One(vec![0; 4096])), to_object);
        assert_eq!(capacity(&big), 4096);
    }

    fn i64_field(values: &[i64], lookback: usize) -> Field<String> {
        let mut f = Field::typed(Schema::new(vec![Leaf::new(DType::I64, vec![])]), true);
        if let Storage::Typed { column, .. } = &mut f.storage {
            for v in values {
                column.push(&[&v.to_ne_bytes()]).unwrap();
            }
        }
        f.set_lookback(lookback);
        f
    }

    fn values(f: &Field<String>) -> Vec<i64> {
        match &f.storage {
            Storage::Typed { column, .. } => (0..column.total())
                .map(|p| i64::from_ne_bytes(column.item(0, p)[..].try_into().unwrap()))
                .collect(),
            _ => panic!("not typed"),
        }
    }

    #[test]
    fn select_and_extend_typed() {
        let f = i64_field(&[1, 2, 3, 4], 1);
        let s = f.select(&[2, 3], 1);
        assert_eq!((values(&s), s.lookback(), s.len()), (vec![3, 4], 1, 1));
        let mut g = i64_field(&[0, 1, 2], 0);
        assert!(g.extend_chunk(&s));
        assert_eq!(values(&g), vec![0, 1, 2, 4]);
    }

    #[test]
    fn objects_and_untyped() {
        let mut o: Field<String> = Field::objects(vec!["a".into(), "b".into(), "c".into()], 1);
        assert_eq!((o.len(), o.lookback()), (2, 1));
        o.remove(0);
        assert_eq!((o.len(), o.lookback()), (2, 0));
        let mut u: Field<String> = Field::untyped();
        assert!(u.is_empty());
        assert!(u.extend_chunk(&o));
        assert_eq!(u.len(), 2);
        let typed = i64_field(&[1], 0);
        assert!(!u.clone().extend_chunk(&typed), "objects cannot take typed items");
    }

    /// A sparse field with the given items (`None`: absent) and look-back.
    fn sparse(items: &[Option<&str>], lookback: usize) -> Field<String> {
        let mut f = Field::sparse();
        for item in items {
            assert!(f.push_sparse(item.map(str::to_string)));
        }
        f.set_lookback(lookback);
        f
    }

    /// The items of a sparse field by position, absent ones as `None`.
    fn dense(f: &Field<String>) -> Vec<Option<String>> {
        (0..f.geometry().total).map(|p| f.object(p).cloned()).collect()
    }

    #[test]
    fn sparse_stores_only_given_objects() {
        let f = sparse(&[None, Some("a"), None, None, Some("b")], 1);
        assert_eq!((f.len(), f.lookback(), f.geometry().total), (4, 1, 5));
        let Storage::Sparse { items, .. } = &f.storage else { panic!("not sparse") };
        assert_eq!(items, &vec![(1, "a".to_string()), (4, "b".to_string())]);
        assert_eq!(f.object(1).map(String::as_str), Some("a"));
        assert_eq!(f.object(2), None);
        assert_eq!(f.object(9), None);
        let mut typed = i64_field(&[1], 0);
        assert!(!typed.push_sparse(None), "only sparse fields take absent items");
    }

    #[test]
    fn materialize_fills_absent_positions_once_in_order() {
        let mut f = sparse(&[None, Some("a"), None, None, Some("b")], 0);
        let mut made = 0;
        let mut make = || {
            made += 1;
            format!("new{made}")
        };
        assert_eq!(f.materialize(&[3, 0, 1, 3, 7], &mut make), 2, "absent, deduplicated, in range");
        assert_eq!(
            dense(&f),
            vec![Some("new1".into()), Some("a".into()), None, Some("new2".into()), Some("b".into())]
        );
        assert_eq!(f.materialize(&[0, 3], &mut make), 0, "made objects stay");
        assert_eq!(f.materialize(&[2], &mut make), 1);
        let Storage::Sparse { items, .. } = &f.storage else { panic!("not sparse") };
        assert!(items.windows(2).all(|w| w[0].0 < w[1].0), "positions stay sorted");
        assert_eq!(i64_field(&[1], 0).materialize(&[0], &mut make), 0, "typed fields have none");
    }

    #[test]
    fn sparse_select_remove_extend_set() {
        let f = sparse(&[Some("r"), None, Some("a"), None, Some("b")], 1);
        let s = f.select(&[4, 2, 1], 1);
        assert_eq!(dense(&s), vec![Some("b".into()), Some("a".into()), None]);
        assert_eq!((s.lookback(), s.len()), (1, 2));

        let mut r = f.clone();
        r.remove(1);
        assert_eq!(dense(&r), vec![Some("r".into()), Some("a".into()), None, Some("b".into())]);
        r.remove(0);
        assert_eq!((r.lookback(), r.len()), (0, 3), "removing a look-back item shrinks it");
        r.remove(10);
        assert_eq!(r.geometry().total, 3);

        // The other chunk's look-back is not appended; positions shift behind ours.
        let mut e = sparse(&[None, Some("x")], 0);
        assert!(e.extend_chunk(&f));
        assert_eq!(dense(&e), vec![None, Some("x".into()), None, Some("a".into()), None, Some("b".into())]);
        assert!(!e.extend_chunk(&i64_field(&[1], 0)), "sparse objects take no typed items");

        assert!(e.set_object(0, "set".into()));
        assert!(e.set_object(1, "over".into()));
        assert!(!e.set_object(6, "out".into()));
        assert_eq!(dense(&e)[..2], [Some("set".into()), Some("over".into())]);

        let mut pushed = Field::<String>::sparse();
        assert!(pushed.push(Item::<String>::Object("o".into()), |_| unreachable!()));
        assert!(matches!(pushed.storage, Storage::Sparse { total: 1, .. }), "objects keep it sparse");
    }

    #[test]
    fn pop_counts_look_back_and_from_the_end() {
        let mut f = i64_field(&[1, 2, 3, 4], 2);
        assert_eq!(f.pop(-1), Some(3));
        assert_eq!((values(&f), f.lookback()), (vec![1, 2, 3], 2));
        assert_eq!(f.pop(0), Some(0));
        assert_eq!((values(&f), f.lookback()), (vec![2, 3], 1), "a look-back item shrinks it");
        assert_eq!(f.pop(2), None);
        assert_eq!(f.pop(-3), None);
        assert_eq!(f.pop(i64::MIN), None);
        assert_eq!(values(&f), vec![2, 3], "a refused pop changes nothing");
        assert_eq!(Field::<String>::untyped().pop(0), None);
    }

    #[test]
    fn conversion_follows_storage_and_spec() {
        struct Space(bool);
        impl FieldSpec for Space {
            fn is_from_space(&self) -> bool {
                self.0
            }
        }
        let mut f: Field<String, Space> = Field::untyped();
        assert!(matches!(f.conversion(), Conversion::Infer));
        f.spec = Some(Arc::new(Space(true)));
        assert!(matches!(f.conversion(), Conversion::First(Space(true))));
        f.storage = i64_field(&[1], 0).storage;
        assert!(matches!(f.conversion(), Conversion::Bytes { strict: true, .. }));
        f.spec = Some(Arc::new(Space(false)));
        assert!(matches!(f.conversion(), Conversion::Bytes { strict: false, .. }));
        f.spec = None;
        assert!(matches!(f.conversion(), Conversion::Object), "typed items of no known spec");
        let mut o: Field<String, Space> = Field::sparse();
        o.spec = Some(Arc::new(Space(true)));
        assert!(matches!(o.conversion(), Conversion::Object));
        assert_eq!((o.stored_bytes(), i64_field(&[1, 2], 0).stored_bytes()), (0, 16));
    }

    #[test]
    fn rows_go_in_where_the_spec_lays_out_the_column() {
        struct Laid(Schema);
        impl FieldSpec for Laid {
            fn is_from_space(&self) -> bool {
                false
            }
            fn schema(&self) -> Option<&Schema> {
                Some(&self.0)
            }
        }
        let i64s = Schema::new(vec![Leaf::new(DType::I64, vec![])]);
        let mut f: Field<String, Laid> =
            Field { spec: Some(Arc::new(Laid(i64s.clone()))), ..Field::untyped() };
        assert!(f.row_spec().is_none(), "no column yet");
        f.storage = i64_field(&[1], 0).storage;
        assert!(f.row_spec().is_some());
        f.spec = Some(Arc::new(Laid(Schema::new(vec![Leaf::new(DType::F32, vec![])]))));
        assert!(f.row_spec().is_none(), "another layout");
        let unlaid: Field<String, ()> = Field { spec: Some(Arc::new(())), ..i64_field(&[1], 0) };
        assert!(unlaid.row_spec().is_none(), "a spec without a schema");
    }

    #[test]
    fn a_first_item_brings_its_inferred_spec_and_none_keeps_the_fields() {
        let schema = Arc::new(Schema::new(vec![Leaf::new(DType::I64, vec![])]));
        let first =
            |len: usize, spec: Option<Arc<&'static str>>| Item::<String, Vec<u8>, &'static str>::FirstTyped {
                schema: Arc::clone(&schema),
                leaves: vec![vec![0; len]].into(),
                host_scalars: false,
                spec,
            };
        let mut f: Field<String, &str> = Field::untyped();
        assert!(!f.push(first(3, Some(Arc::new("inferred"))), |_| unreachable!()));
        assert_eq!(f.spec(), None, "a refused item brings nothing");
        assert!(f.push(first(8, Some(Arc::new("inferred"))), |_| unreachable!()));
        assert_eq!(f.spec(), Some(&"inferred"));
        let mut g: Field<String, &str> = Field::untyped();
        g.spec = Some(Arc::new("space"));
        assert!(g.push(first(8, None), |_| unreachable!()));
        assert_eq!(g.spec(), Some(&"space"));
    }

    #[test]
    fn shrink_keeps_items() {
        let mut f = i64_field(&(0..100).collect::<Vec<_>>(), 3);
        f.shrink_to_fit();
        let Storage::Typed { column, .. } = &f.storage else { panic!("not typed") };
        assert_eq!(column.capacity_bytes(), 800);
        assert_eq!(values(&f), (0..100).collect::<Vec<_>>());
        assert_eq!(f.lookback(), 3);
        let mut o = sparse(&[Some("a"), None], 0);
        o.shrink_to_fit();
        assert_eq!(dense(&o), vec![Some("a".into()), None]);
    }

    #[test]
    fn make_objects_keeps_items_and_lookback() {
        let mut f = i64_field(&[5, 6, 7], 2);
        f.make_objects(|t| {
            assert!(t.host_scalar, "given as host scalars");
            format!("{}", i64::from_ne_bytes(t.column.item(0, t.pos)[..].try_into().unwrap()))
        });
        match &f.storage {
            Storage::Objects { items, lookback } => {
                assert_eq!(items, &vec!["5".to_string(), "6".into(), "7".into()]);
                assert_eq!(*lookback, 2);
            }
            _ => panic!(),
        }
    }

    #[test]
    fn an_untyped_field_keeps_its_compression_for_the_column_its_first_item_makes() {
        let schema = Arc::new(Schema::new(vec![Leaf::new(DType::I64, vec![])]));
        let first = |v: i64| Item::<String, Vec<u8>>::FirstTyped {
            schema: Arc::clone(&schema),
            leaves: vec![v.to_ne_bytes().to_vec()].into(),
            host_scalars: false,
            spec: None,
        };
        let mut f: Field<String> = Field::untyped();
        f.set_compression(Some(2));
        assert_eq!((f.compression(), f.select(&[], 0).compression()), (Some(2), Some(2)));
        assert!(f.push(first(0), |_| unreachable!()));
        for v in 1..6i64 {
            assert!(f.push(Item::Bytes(vec![v.to_ne_bytes().to_vec()].into()), |_| unreachable!()));
        }
        assert_eq!((f.compression(), values(&f)), (Some(2), (0..6).collect()));
        let Storage::Typed { column, .. } = &f.storage else { panic!("not typed") };
        assert_eq!(column.sealed(), 4);

        // Adopting another field's items applies the setting too; objects drop it.
        let mut u: Field<String> = Field::untyped();
        u.set_compression(Some(3));
        assert!(u.extend_chunk(&i64_field(&[1, 2], 0)));
        assert_eq!(u.compression(), Some(3));
        let mut o: Field<String> = Field::untyped();
        o.set_compression(Some(2));
        assert!(o.push(Item::<String, Vec<u8>>::Object("x".into()), |_| unreachable!()));
        assert_eq!(o.compression(), None);
    }
}
