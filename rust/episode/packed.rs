//! The state that moves a compressed field to another process as it is stored: its
//! [`PackedParts`] as named entries (the keys of the binding's `_packed_state` dict, which
//! pickled episodes hold, so the names are fixed here once).

use crate::column::PackedParts;

/// The names of the entries, one per part of [`PackedParts`].
pub mod key {
    pub const ROWS: &str = "rows";
    pub const SEALED: &str = "sealed";
    pub const CLOSED: &str = "closed";
    pub const BLOCKS: &str = "blocks";
    pub const RAW: &str = "raw";
    pub const TOTAL: &str = "total";
    pub const LOOKBACK: &str = "lookback";
}

/// One entry of a packed field's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    Count(usize),
    Flag(bool),
    /// Per leaf, the compressed blocks in order.
    Blocks(&'a [Vec<Vec<u8>>]),
    /// Per leaf, the bytes of the uncompressed items.
    Raw(&'a [Vec<u8>]),
}

/// `parts` as the named entries of a packed field's state, in the order they are written.
#[must_use]
pub fn entries(parts: &PackedParts) -> [(&'static str, Entry<'_>); 7] {
    [
        (key::ROWS, Entry::Count(parts.rows)),
        (key::SEALED, Entry::Count(parts.sealed)),
        (key::CLOSED, Entry::Flag(parts.closed)),
        (key::BLOCKS, Entry::Blocks(&parts.blocks)),
        (key::RAW, Entry::Raw(&parts.raw)),
        (key::TOTAL, Entry::Count(parts.total)),
        (key::LOOKBACK, Entry::Count(parts.lookback)),
    ]
}

/// A packed field's state as the host holds it, read entry by entry (see [`from_state`]).
pub trait State {
    type Error;
    fn count(&self, key: &'static str) -> Result<usize, Self::Error>;
    fn flag(&self, key: &'static str) -> Result<bool, Self::Error>;
    fn blocks(&self, key: &'static str) -> Result<Vec<Vec<Vec<u8>>>, Self::Error>;
    fn raw(&self, key: &'static str) -> Result<Vec<Vec<u8>>, Self::Error>;
}

/// The parts that [`entries`] wrote into `state`, read in the same order.
///
/// Errors: the first of `state`'s (an entry it lacks or cannot read).
pub fn from_state<T: State>(state: &T) -> Result<PackedParts, T::Error> {
    Ok(PackedParts {
        rows: state.count(key::ROWS)?,
        sealed: state.count(key::SEALED)?,
        closed: state.flag(key::CLOSED)?,
        blocks: state.blocks(key::BLOCKS)?,
        raw: state.raw(key::RAW)?,
        total: state.count(key::TOTAL)?,
        lookback: state.count(key::LOOKBACK)?,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use super::*;

    /// A host state: the entries by name, and the names read in order.
    #[derive(Default)]
    struct Map {
        counts: HashMap<&'static str, usize>,
        flags: HashMap<&'static str, bool>,
        blocks: HashMap<&'static str, Vec<Vec<Vec<u8>>>>,
        raw: HashMap<&'static str, Vec<Vec<u8>>>,
        read: RefCell<Vec<&'static str>>,
    }

    fn get<V: Clone>(map: &Map, values: &HashMap<&'static str, V>, key: &'static str) -> Result<V, String> {
        map.read.borrow_mut().push(key);
        values.get(key).cloned().ok_or_else(|| key.to_string())
    }

    impl State for Map {
        type Error = String;
        fn count(&self, key: &'static str) -> Result<usize, String> {
            get(self, &self.counts, key)
        }
        fn flag(&self, key: &'static str) -> Result<bool, String> {
            get(self, &self.flags, key)
        }
        fn blocks(&self, key: &'static str) -> Result<Vec<Vec<Vec<u8>>>, String> {
            get(self, &self.blocks, key)
        }
        fn raw(&self, key: &'static str) -> Result<Vec<Vec<u8>>, String> {
            get(self, &self.raw, key)
        }
    }

    fn parts() -> PackedParts {
        PackedParts {
            rows: 4,
            sealed: 8,
            closed: false,
            blocks: vec![vec![vec![1, 2], vec![3]], vec![vec![4], vec![5]]],
            raw: vec![vec![6, 7], vec![8]],
            total: 9,
            lookback: 2,
        }
    }

    fn written(parts: &PackedParts) -> Map {
        let mut map = Map::default();
        for (key, entry) in entries(parts) {
            match entry {
                Entry::Count(n) => map.counts.insert(key, n).map(drop),
                Entry::Flag(b) => map.flags.insert(key, b).map(drop),
                Entry::Blocks(b) => map.blocks.insert(key, b.to_vec()).map(drop),
                Entry::Raw(r) => map.raw.insert(key, r.to_vec()).map(drop),
            };
        }
        map
    }

    #[test]
    fn the_entries_read_back_as_the_parts_in_the_order_written() {
        let map = written(&parts());
        assert_eq!(from_state(&map), Ok(parts()));
        let names: Vec<&str> = entries(&parts()).iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            ["rows", "sealed", "closed", "blocks", "raw", "total", "lookback"],
            "pickles hold these"
        );
        assert_eq!(*map.read.borrow(), names);
    }

    #[test]
    fn the_first_missing_entry_is_the_error() {
        let mut map = written(&parts());
        map.raw.clear();
        map.counts.remove(key::TOTAL);
        assert_eq!(from_state(&map), Err("raw".to_string()));
    }
}
