//! Compressed storage for a column's older items (`compress_observations`).
//!
//! A packed column keeps its newest items uncompressed (the rows still being appended and
//! the look-back a cut keeps) and seals every full block of [`Packed::rows`] older items,
//! leaf by leaf, into one LZ4 block (`lz4_flex`, pure Rust). A closed column (one that
//! receives no more items: a done episode, a chunk handed out) seals everything, the last
//! block possibly shorter than `rows`. Blocks are compressed once and never change: a
//! write into a sealed item or an append after a short last block unseals the blocks from
//! there on first.
//!
//! Why LZ4 and 32 rows: on 84x84x4 uint8 frame stacks of a moving-shapes scene, LZ4 blocks
//! of 32 rows kept 21x fewer bytes at about 10 µs per row to compress and 9-14 µs to
//! decompress; zstd level 1 kept 47x fewer at 18 µs per row (docs/compression.md has the
//! numbers and the command). Blocks of 16-64 rows compressed alike; 32 rows (0.9 MB of such
//! frames) keeps single-item reads of sealed items cheap enough with the one-block cache.

use std::fmt;
use std::sync::Mutex;

/// Rows per sealed block when compression is switched on without a block size.
pub const DEFAULT_BLOCK_ROWS: usize = 32;

/// The compressed part of a column: items `0..sealed` (absolute positions) in blocks.
pub(crate) struct Packed {
    /// Items per block (at least 1).
    pub rows: usize,
    /// Items held in blocks, from absolute position 0: a multiple of `rows`, except on a
    /// closed column whose last block is short (and then no item is left uncompressed).
    pub sealed: usize,
    /// Per leaf, the compressed blocks in order; block `b` holds items
    /// `b * rows..min((b + 1) * rows, sealed)`.
    pub blocks: Vec<Vec<Vec<u8>>>,
    /// Seal every item, not only full blocks beyond the newest `rows` (see
    /// `Column::seal_all`); an append opens the column again.
    pub closed: bool,
    /// The last block decompressed for single-item reads (leaf, block, bytes).
    cache: Mutex<Option<(usize, usize, Vec<u8>)>>,
}

impl Packed {
    pub fn new(rows: usize, leaves: usize) -> Packed {
        Packed {
            rows: rows.max(1),
            sealed: 0,
            blocks: vec![Vec::new(); leaves],
            closed: false,
            cache: Mutex::new(None),
        }
    }

    /// Items in block `block` (`rows`, or fewer for a short last block).
    pub fn block_rows(&self, block: usize) -> usize {
        self.rows.min(self.sealed.saturating_sub(block * self.rows))
    }

    /// Blocks per leaf.
    pub fn block_count(&self) -> usize {
        self.sealed.div_ceil(self.rows)
    }

    /// Drops blocks `from..` of every leaf (their items are `from * rows..sealed`); the
    /// caller has copied them out.
    pub fn truncate(&mut self, from: usize) {
        for b in &mut self.blocks {
            b.truncate(from);
        }
        self.sealed = self.sealed.min(from * self.rows);
        let cache = self.cache.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.as_ref().is_some_and(|(_, b, _)| *b >= from) {
            *cache = None;
        }
    }

    /// Compresses one block (`bytes`: `rows` items, or fewer for the last block of a
    /// closed column) of `leaf` and appends it.
    pub fn seal(&mut self, leaf: usize, bytes: &[u8]) {
        self.blocks[leaf].push(lz4_flex::block::compress(bytes));
    }

    /// Decompresses block `block` of `leaf` into `out`, which holds exactly that block's
    /// bytes ([`Self::block_rows`] items). `false` if the block does not decompress to that size (a bug: blocks are
    /// only ever made by [`Self::seal`]).
    pub fn decompress_into(&self, leaf: usize, block: usize, out: &mut [u8]) -> bool {
        let Some(z) = self.blocks.get(leaf).and_then(|b| b.get(block)) else { return false };
        matches!(lz4_flex::block::decompress_into(z, out), Ok(n) if n == out.len())
    }

    /// Copies item `pos` (a sealed position) of `leaf`, `n` bytes per item, into `dst`,
    /// decompressing its block unless it is the cached one.
    pub fn read_item(&self, leaf: usize, pos: usize, n: usize, dst: &mut [u8]) -> bool {
        let block = pos / self.rows;
        let at = (pos % self.rows) * n;
        // A poisoned lock only means a panic elsewhere while it was held; the cache is
        // rebuilt from the blocks anyway.
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let hit = matches!(&*cache, Some((l, b, _)) if *l == leaf && *b == block);
        if !hit {
            let mut bytes = vec![0; self.block_rows(block) * n];
            if !self.decompress_into(leaf, block, &mut bytes) {
                *cache = None;
                return false;
            }
            *cache = Some((leaf, block, bytes));
        }
        match &*cache {
            Some((_, _, bytes)) => {
                dst.copy_from_slice(&bytes[at..at + n]);
                true
            }
            None => false,
        }
    }

    /// Drops every block (the column keeps its configuration, `closed` included).
    pub fn clear(&mut self) {
        for b in &mut self.blocks {
            b.clear();
        }
        self.sealed = 0;
        *self.cache.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Bytes of the compressed blocks (their lengths).
    pub fn stored_bytes(&self) -> usize {
        self.blocks.iter().flatten().map(Vec::len).sum()
    }

    /// Bytes held by the blocks (their capacities and the block lists).
    pub fn capacity_bytes(&self) -> usize {
        self.blocks
            .iter()
            .map(|b| b.capacity() * size_of::<Vec<u8>>() + b.iter().map(Vec::capacity).sum::<usize>())
            .sum()
    }

    pub fn shrink_to_fit(&mut self) {
        for b in &mut self.blocks {
            b.shrink_to_fit();
        }
    }
}

impl Clone for Packed {
    fn clone(&self) -> Packed {
        Packed {
            rows: self.rows,
            sealed: self.sealed,
            blocks: self.blocks.clone(),
            closed: self.closed,
            cache: Mutex::new(None),
        }
    }
}

/// Equal when the blocks are: LZ4 output is a function of its input, so equal columns
/// packed with the same block size have equal blocks. The cache does not count.
impl PartialEq for Packed {
    fn eq(&self, other: &Packed) -> bool {
        self.rows == other.rows
            && self.sealed == other.sealed
            && self.closed == other.closed
            && self.blocks == other.blocks
    }
}

impl Eq for Packed {}

impl fmt::Debug for Packed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Packed")
            .field("rows", &self.rows)
            .field("sealed", &self.sealed)
            .field("closed", &self.closed)
            .field("stored_bytes", &self.stored_bytes())
            .finish_non_exhaustive()
    }
}
