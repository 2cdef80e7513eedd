//! Compressed storage for a column's older items (`compress_observations`).
//!
//! A packed column keeps its newest items uncompressed (the rows still being appended and
//! the look-back a cut keeps) and seals every full block of [`Packed::rows`] older items,
//! leaf by leaf, into one LZ4 block (`lz4_flex`, pure Rust). Blocks are compressed once
//! and never change: a write into a sealed item unpacks the column first.
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
    /// Items held in blocks: a multiple of `rows`, from absolute position 0.
    pub sealed: usize,
    /// Per leaf, the compressed blocks in order; block `b` holds items
    /// `b * rows..(b + 1) * rows`.
    pub blocks: Vec<Vec<Vec<u8>>>,
    /// The last block decompressed for single-item reads (leaf, block, bytes).
    cache: Mutex<Option<(usize, usize, Vec<u8>)>>,
}

impl Packed {
    pub fn new(rows: usize, leaves: usize) -> Packed {
        Packed { rows: rows.max(1), sealed: 0, blocks: vec![Vec::new(); leaves], cache: Mutex::new(None) }
    }

    /// Compresses one block of `rows` items (`bytes`) of `leaf` and appends it.
    pub fn seal(&mut self, leaf: usize, bytes: &[u8]) {
        self.blocks[leaf].push(lz4_flex::block::compress(bytes));
    }

    /// Decompresses block `block` of `leaf` into `out`, which holds exactly one block's
    /// bytes. `false` if the block does not decompress to that size (a bug: blocks are
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
            let mut bytes = vec![0; self.rows * n];
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

    /// Drops every block (the column keeps its configuration).
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
        Packed { rows: self.rows, sealed: self.sealed, blocks: self.blocks.clone(), cache: Mutex::new(None) }
    }
}

/// Equal when the blocks are: LZ4 output is a function of its input, so equal columns
/// packed with the same block size have equal blocks. The cache does not count.
impl PartialEq for Packed {
    fn eq(&self, other: &Packed) -> bool {
        self.rows == other.rows && self.sealed == other.sealed && self.blocks == other.blocks
    }
}

impl Eq for Packed {}

impl fmt::Debug for Packed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Packed")
            .field("rows", &self.rows)
            .field("sealed", &self.sealed)
            .field("stored_bytes", &self.stored_bytes())
            .finish_non_exhaustive()
    }
}
