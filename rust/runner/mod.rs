//! The runner's batched containers: rows of a vector-env batch, and per-module inference
//! batches gathered across sub-envs and agents with the index map back.
//!
//! A runner steps N sub-envs (each with any number of agents) per env step. Per step it
//! needs (1) the rows of each batched array the env or the module produced, one per
//! sub-env/agent, to record them into that sub-env's episode, and (2) per module, the
//! observations of the agents that act, stacked contiguously for one forward pass, plus
//! where each row came from so the module's outputs can be split back. Both are plain byte
//! bookkeeping and live here, free of Python.
//!
//! A step may concern only some of the sub-envs (remote sub-envs batched as they become
//! ready): [`EnvIndices`] says which sub-env each row of such a step belongs to.

pub mod batcher;
pub mod ready;
pub mod step;
pub mod tally;

use std::fmt;
use std::sync::Arc;

use crate::schema::Schema;

/// Errors of batch bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchError {
    /// A leaf buffer whose length is not `rows * item_bytes`.
    RowCount { leaf: usize, expected_rows: usize, item_bytes: usize, got_bytes: usize },
    /// An item with a different number of leaves than the schema.
    LeafCount { expected: usize, got: usize },
    /// An item leaf of the wrong size.
    ItemSize { leaf: usize, expected: usize, got: usize },
    /// Entry `entry` of a subset of sub-envs names `index`, which is not one of the
    /// `num_envs` sub-envs (negative or too large).
    EnvIndexOutOfRange { entry: usize, index: i64, num_envs: usize },
    /// Sub-env `index` appears twice in a subset of sub-envs, at entries `first` and `second`.
    DuplicateEnvIndex { index: usize, first: usize, second: usize },
    /// Entry `entry` of a subset of sub-envs is an int too large for any index (`repr`).
    NotAnIndex { entry: usize, repr: String },
    /// Entry `entry` of a subset of sub-envs is not an int (`repr`; a bool neither).
    NotAnInt { entry: usize, repr: String },
    /// A subset of sub-envs that is not a sequence of ints or a 1-D integer array (`got`
    /// describes what it is).
    NotInts { got: String },
    /// A per-row input (`what`, made of `unit`s) without one entry per row of the step.
    Count { what: &'static str, unit: &'static str, expected: usize, per: &'static str, got: usize },
    /// A batch of `rows` rows given with a subset of `entries` sub-envs.
    SubsetRows { rows: usize, entries: usize },
    /// A gather's observation dicts (`dicts`) not one per row: one per episode
    /// (`subset: false`, `rows` episodes) or per entry of the subset (`rows` entries).
    GatherRows { subset: bool, rows: usize, dicts: usize },
    /// A batch that holds no row `row` (it changed size since it was checked).
    NoRow { row: usize },
    /// A batch that holds fewer rows than when it was checked.
    Shrank,
    /// A module output column `output` of `rows` rows for a batch of `batch` rows.
    OutputRows { module: String, output: String, rows: usize, batch: usize },
    /// An index map entry that names no gathered agent.
    StaleIndex,
    /// An agent (`agent`, as the host writes it) that the agent-to-module mapping maps to
    /// no module.
    NoModule { agent: String },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::RowCount { leaf, expected_rows, item_bytes, got_bytes } => write!(
                f,
                "leaf {leaf}: expected {expected_rows} rows of {item_bytes} bytes \
                 ({} bytes), got {got_bytes} bytes",
                expected_rows * item_bytes
            ),
            BatchError::LeafCount { expected, got } => {
                write!(f, "expected an item of {expected} leaves, got {got}")
            }
            BatchError::ItemSize { leaf, expected, got } => {
                write!(f, "leaf {leaf}: expected {expected} bytes per item, got {got}")
            }
            BatchError::EnvIndexOutOfRange { entry, index, num_envs } => match num_envs {
                0 => write!(f, "env_indices[{entry}] is {index}, but there are no sub-envs (no episodes)"),
                n => write!(
                    f,
                    "env_indices[{entry}] is {index}, not a sub-env index: the {n} episodes are \
                     sub-envs 0 to {}",
                    n - 1
                ),
            },
            BatchError::DuplicateEnvIndex { index, first, second } => write!(
                f,
                "env_indices names sub-env {index} twice (entries {first} and {second}); each \
                 sub-env steps at most once per call"
            ),
            BatchError::NotAnIndex { entry, repr } => {
                write!(f, "env_indices[{entry}] is {repr}, not a sub-env index")
            }
            BatchError::NotAnInt { entry, repr } => write!(f, "env_indices[{entry}] is {repr}, not an int"),
            BatchError::NotInts { got } => {
                write!(f, "env_indices must be a sequence of ints or a 1-D integer numpy array, got {got}")
            }
            BatchError::Count { what, unit, expected, per, got } => {
                write!(f, "{what}: expected {expected} {unit} ({per}), got {got}")
            }
            BatchError::SubsetRows { rows, entries } => {
                write!(f, "{rows} rows, but env_indices has {entries} entries (one row per entry)")
            }
            BatchError::GatherRows { subset: false, rows, dicts } => {
                write!(f, "expected one episode per sub-env: {rows} episodes, {dicts} observation dicts")
            }
            BatchError::GatherRows { subset: true, rows, dicts } => write!(
                f,
                "expected one observation dict per entry of env_indices: {rows} entries, {dicts} \
                 observation dicts"
            ),
            BatchError::NoRow { row } => write!(f, "no row {row} in the batch (was it resized?)"),
            BatchError::Shrank => write!(f, "a batch shrank while the step was recorded"),
            BatchError::OutputRows { module, output, rows, batch } => {
                write!(f, "module {module:?}: output {output:?} has {rows} rows, the batch has {batch}")
            }
            BatchError::StaleIndex => write!(f, "the batcher's index map is out of date"),
            BatchError::NoModule { agent } => write!(
                f,
                "agent {agent} maps to no module (the agent-to-module mapping function returned \
                 None); it must return a configured module id"
            ),
        }
    }
}

impl std::error::Error for BatchError {}

impl BatchError {
    /// Whether the error is about the kind of a value (Python's `TypeError`), not its value.
    #[must_use]
    pub fn is_type_error(&self) -> bool {
        matches!(self, BatchError::NotAnInt { .. } | BatchError::NotInts { .. })
    }
}

/// An entry of a subset of sub-envs as the host classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexEntry {
    /// An int that fits an `i64`.
    Int(i64),
    /// An int that does not.
    BigInt,
    /// A bool (an int to Python, never an index).
    Bool,
    /// Anything else.
    Other,
}

impl IndexEntry {
    /// The index entry `entry` stands for; `repr` (called only for an error) names it.
    pub fn index(self, entry: usize, repr: impl FnOnce() -> String) -> Result<i64, BatchError> {
        match self {
            IndexEntry::Int(i) => Ok(i),
            IndexEntry::BigInt => Err(BatchError::NotAnIndex { entry, repr: repr() }),
            IndexEntry::Bool | IndexEntry::Other => Err(BatchError::NotAnInt { entry, repr: repr() }),
        }
    }

    /// Checks that an array of `ndim` dimensions and dtype kind `kind` (numpy's
    /// `dtype.kind`) can hold sub-env indices: 1-D, of signed or unsigned integers.
    /// `describe` (called only for an error) says what the array is.
    pub fn check_array(ndim: usize, kind: u8, describe: impl FnOnce() -> String) -> Result<(), BatchError> {
        if ndim == 1 && matches!(kind, b'i' | b'u') {
            return Ok(());
        }
        Err(BatchError::NotInts { got: describe() })
    }
}

/// The rows of one batch: one contiguous buffer per leaf, row `i` of leaf `l` at
/// `leaves[l][i * item_bytes(l)..]`. Borrows the buffers; checks their sizes once.
pub struct Rows<'a> {
    leaves: Vec<(&'a [u8], usize)>,
    n: usize,
}

impl<'a> Rows<'a> {
    /// Views `leaves` (laid out by `schema`) as `n` rows.
    pub fn new(schema: &Schema, leaves: &[&'a [u8]], n: usize) -> Result<Rows<'a>, BatchError> {
        if leaves.len() != schema.leaves.len() {
            return Err(BatchError::LeafCount { expected: schema.leaves.len(), got: leaves.len() });
        }
        let mut out = Vec::with_capacity(leaves.len());
        for (i, (bytes, leaf)) in leaves.iter().zip(&schema.leaves).enumerate() {
            let item_bytes = leaf.item_bytes();
            if bytes.len() != n * item_bytes {
                return Err(BatchError::RowCount {
                    leaf: i,
                    expected_rows: n,
                    item_bytes,
                    got_bytes: bytes.len(),
                });
            }
            out.push((*bytes, item_bytes));
        }
        Ok(Rows { leaves: out, n })
    }

    /// Number of rows.
    #[must_use]
    pub fn len(&self) -> usize {
        self.n
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Row `i`, one slice per leaf (`None` past the end).
    #[must_use]
    pub fn row(&self, i: usize) -> Option<Vec<&'a [u8]>> {
        if i >= self.n {
            return None;
        }
        Some(self.leaves.iter().map(|(b, w)| &b[i * w..(i + 1) * w]).collect())
    }
}

/// Which sub-env each row of a step belongs to: row `i` to sub-env `i` for all of them
/// (the common case, no allocation), or row `j` to sub-env `indices[j]` for a subset of
/// distinct sub-envs, in any order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvIndices {
    num_envs: usize,
    /// `None`: every sub-env, in order.
    subset: Option<Vec<usize>>,
}

impl EnvIndices {
    /// Every one of `num_envs` sub-envs, row `i` for sub-env `i`.
    #[must_use]
    pub fn all(num_envs: usize) -> EnvIndices {
        EnvIndices { num_envs, subset: None }
    }

    /// The sub-envs `indices` (row `j` for sub-env `indices[j]`) of `num_envs`.
    ///
    /// Checks every index: each must be in `0..num_envs` and appear once.
    pub fn subset(indices: &[i64], num_envs: usize) -> Result<EnvIndices, BatchError> {
        let mut out = Vec::with_capacity(indices.len());
        for (entry, &index) in indices.iter().enumerate() {
            match usize::try_from(index) {
                Ok(i) if i < num_envs => out.push(i),
                _ => return Err(BatchError::EnvIndexOutOfRange { entry, index, num_envs }),
            }
        }
        // Duplicates: one bit per sub-env, in a word on the stack for up to 64 sub-envs
        // (no allocation: the table took a third of the check for 8 sub-envs).
        let mut small = 0u64;
        let mut big = vec![0u64; if num_envs > 64 { num_envs.div_ceil(64) } else { 0 }];
        for (entry, &i) in out.iter().enumerate() {
            let word = if big.is_empty() { &mut small } else { &mut big[i / 64] };
            let bit = 1u64 << (i % 64);
            if *word & bit != 0 {
                let first = out.iter().position(|&x| x == i).unwrap_or(0);
                return Err(BatchError::DuplicateEnvIndex { index: i, first, second: entry });
            }
            *word |= bit;
        }
        Ok(EnvIndices { num_envs, subset: Some(out) })
    }

    /// The sub-envs whose indices are `bytes`: native-endian `i64`s (the buffer of a numpy
    /// int64 array, read without a Python call per index), checked as by [`Self::subset`].
    pub fn from_ne_bytes(bytes: &[u8], num_envs: usize) -> Result<EnvIndices, BatchError> {
        let indices: Vec<i64> =
            bytes.chunks_exact(8).map(|b| i64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))).collect();
        EnvIndices::subset(&indices, num_envs)
    }

    /// Rows of the step (sub-envs it concerns).
    #[must_use]
    pub fn len(&self) -> usize {
        self.subset.as_ref().map_or(self.num_envs, Vec::len)
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of sub-envs the indices are taken from.
    #[must_use]
    pub fn num_envs(&self) -> usize {
        self.num_envs
    }

    /// The subset's indices in row order; `None` for every sub-env.
    #[must_use]
    pub fn subset_indices(&self) -> Option<&[usize]> {
        self.subset.as_deref()
    }

    /// The sub-env of row `row` (`row < len()`; past the end, `row` itself, as for every
    /// sub-env: callers index their rows first).
    #[must_use]
    pub fn env(&self, row: usize) -> usize {
        match &self.subset {
            Some(v) => v.get(row).copied().unwrap_or(row),
            None => row,
        }
    }

    /// `(row, sub-env)` pairs in row order.
    #[must_use]
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (usize, usize)> + '_ {
        (0..self.len()).map(|row| (row, self.env(row)))
    }

    /// What one entry of a call's per-row inputs stands for (for messages).
    #[must_use]
    pub fn per_row(&self) -> &'static str {
        match self.subset {
            Some(_) => "one per entry of env_indices",
            None => "one per sub-env",
        }
    }

    /// Checks that a per-row input (`what`, a sequence of `unit`s) has `got` entries: one
    /// per row of the step.
    pub fn check_count(&self, what: &'static str, unit: &'static str, got: usize) -> Result<(), BatchError> {
        let expected = self.len();
        if got == expected {
            return Ok(());
        }
        Err(BatchError::Count { what, unit, expected, per: self.per_row(), got })
    }

    /// Checks that a batch of `rows` rows (`None`: a length the caller cannot tell) has one
    /// per entry of a subset: a batch of every sub-env given with a subset of their
    /// indices would otherwise be recorded row by row into the wrong episodes.
    pub fn check_batch_rows(&self, rows: Option<usize>) -> Result<(), BatchError> {
        match (&self.subset, rows) {
            (Some(s), Some(rows)) if rows != s.len() => {
                Err(BatchError::SubsetRows { rows, entries: s.len() })
            }
            _ => Ok(()),
        }
    }

    /// Checks that a gather has `dicts` observation dicts, one per row.
    pub fn check_gather_rows(&self, dicts: usize) -> Result<(), BatchError> {
        if dicts == self.len() {
            return Ok(());
        }
        Err(BatchError::GatherRows { subset: self.subset.is_some(), rows: self.len(), dicts })
    }
}

/// One module's inference batch under construction: rows appended one item at a time
/// (the observations of the agents mapped to the module that act now), with the
/// `(sub-env row, agent slot)` each row came from: the sub-env's position among those
/// gathered (its sub-env index when every sub-env is, see [`EnvIndices`]).
///
/// Reused across env steps: `clear` keeps the buffers' capacity, so a runner in steady
/// state does not allocate here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleBatch {
    schema: Arc<Schema>,
    leaves: Vec<Vec<u8>>,
    index: Vec<(usize, usize)>,
}

impl ModuleBatch {
    #[must_use]
    pub fn new(schema: impl Into<Arc<Schema>>) -> ModuleBatch {
        let schema = schema.into();
        let leaves = vec![Vec::new(); schema.leaves.len()];
        ModuleBatch { schema, leaves, index: Vec::new() }
    }

    #[must_use]
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Empties the batch, keeping its capacity.
    pub fn clear(&mut self) {
        for l in &mut self.leaves {
            l.clear();
        }
        self.index.clear();
    }

    /// Appends one item (one slice per leaf) for agent slot `agent` of sub-env row `env`.
    /// Checks the item first: on error the batch is unchanged.
    pub fn push<B: AsRef<[u8]>>(&mut self, env: usize, agent: usize, item: &[B]) -> Result<(), BatchError> {
        if item.len() != self.schema.leaves.len() {
            return Err(BatchError::LeafCount { expected: self.schema.leaves.len(), got: item.len() });
        }
        for (i, (b, leaf)) in item.iter().zip(&self.schema.leaves).enumerate() {
            let got = b.as_ref().len();
            if got != leaf.item_bytes() {
                return Err(BatchError::ItemSize { leaf: i, expected: leaf.item_bytes(), got });
            }
        }
        for (dst, b) in self.leaves.iter_mut().zip(item) {
            dst.extend_from_slice(b.as_ref());
        }
        self.index.push((env, agent));
        Ok(())
    }

    /// Rows in the batch.
    #[must_use]
    pub fn len(&self) -> usize {
        self.index.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The shape of leaf `leaf`'s batch array: the rows, then the item's shape.
    #[must_use]
    pub fn leaf_shape(&self, leaf: usize) -> Vec<usize> {
        let item = self.schema.leaves.get(leaf).map_or(&[][..], |l| &l.shape);
        [&[self.len()][..], item].concat()
    }

    /// The contiguous bytes of leaf `leaf` (`len()` items).
    #[must_use]
    pub fn leaf(&self, leaf: usize) -> &[u8] {
        &self.leaves[leaf]
    }

    /// Where each row came from: `(sub-env row, agent slot)`, in row order.
    #[must_use]
    pub fn index(&self) -> &[(usize, usize)] {
        &self.index
    }
}

/// Groups the rows of a module batch's index map by sub-env: for each of `num_envs`
/// sub-env rows, the `(row, agent slot)` pairs that belong to it, in row order.
///
/// This is the scatter plan: a module's outputs (one row per index entry) go back to the
/// sub-envs and agents they were computed for.
#[must_use]
pub fn scatter_plan(index: &[(usize, usize)], num_envs: usize) -> Vec<Vec<(usize, usize)>> {
    let mut out = vec![Vec::new(); num_envs];
    for (row, &(env, agent)) in index.iter().enumerate() {
        if let Some(v) = out.get_mut(env) {
            v.push((row, agent));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{DType, Leaf};

    fn schema() -> Schema {
        Schema::new(vec![Leaf::new(DType::F32, vec![2]), Leaf::new(DType::I64, vec![])])
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn rows_split_every_leaf() {
        let a = f32s(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let b: Vec<u8> = [7i64, 8, 9].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let rows = Rows::new(&schema(), &[&a, &b], 3).unwrap();
        assert_eq!(rows.len(), 3);
        let r1 = rows.row(1).unwrap();
        assert_eq!(r1[0], f32s(&[2.0, 3.0]).as_slice());
        assert_eq!(r1[1], 8i64.to_ne_bytes().as_slice());
        assert!(rows.row(3).is_none());
    }

    #[test]
    fn rows_reject_wrong_sizes() {
        let a = f32s(&[0.0, 1.0, 2.0]);
        let b = vec![0u8; 16];
        assert_eq!(
            Rows::new(&schema(), &[&a, &b], 2).err(),
            Some(BatchError::RowCount { leaf: 0, expected_rows: 2, item_bytes: 8, got_bytes: 12 })
        );
        assert_eq!(Rows::new(&schema(), &[&a], 2).err(), Some(BatchError::LeafCount { expected: 2, got: 1 }));
        let empty = Rows::new(&schema(), &[&[], &[]], 0).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn module_batch_gathers_contiguously_with_index() {
        let mut mb = ModuleBatch::new(schema());
        mb.push(0, 1, &[f32s(&[1.0, 2.0]), 5i64.to_ne_bytes().to_vec()]).unwrap();
        mb.push(2, 0, &[f32s(&[3.0, 4.0]), 6i64.to_ne_bytes().to_vec()]).unwrap();
        assert_eq!(mb.len(), 2);
        assert_eq!(mb.leaf(0), f32s(&[1.0, 2.0, 3.0, 4.0]).as_slice());
        assert_eq!(mb.index(), &[(0, 1), (2, 0)]);
        assert_eq!((mb.leaf_shape(0), mb.leaf_shape(1)), (vec![2, 2], vec![2]));
        // A bad item is rejected and leaves the batch as it was.
        let err = mb.push(1, 0, &[f32s(&[1.0]), 5i64.to_ne_bytes().to_vec()]).unwrap_err();
        assert_eq!(err, BatchError::ItemSize { leaf: 0, expected: 8, got: 4 });
        assert_eq!(mb.len(), 2);
        assert_eq!(mb.leaf(1).len(), 16);
        // Clearing keeps capacity (no allocation in steady state).
        let cap = mb.leaves[0].capacity();
        mb.clear();
        assert!(mb.is_empty());
        assert_eq!(mb.leaves[0].capacity(), cap);
        assert!(err.to_string().contains("leaf 0"));
    }

    #[test]
    fn scatter_plan_inverts_the_index() {
        let index = [(1, 0), (0, 2), (1, 1), (0, 0)];
        let plan = scatter_plan(&index, 3);
        assert_eq!(plan, vec![vec![(1, 2), (3, 0)], vec![(0, 0), (2, 1)], vec![]]);
        // Round trip: every row appears exactly once, at its env.
        let mut seen: Vec<usize> = plan.iter().flatten().map(|(r, _)| *r).collect();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3]);
    }

    #[test]
    fn gather_then_scatter_round_trips_rows() {
        // Pseudo-random assignment of (env, agent) rows to two modules.
        let mut batches = [ModuleBatch::new(schema()), ModuleBatch::new(schema())];
        let mut expected = Vec::new();
        let mut x = 12345u64;
        for env in 0..5 {
            for agent in 0..3 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let m = (x >> 33) as usize % 2;
                let v = (env * 10 + agent) as f32;
                batches[m].push(env, agent, &[f32s(&[v, -v]), (v as i64).to_ne_bytes().to_vec()]).unwrap();
                expected.push((env, agent, m, v));
            }
        }
        for (env, agent, m, v) in expected {
            let b = &batches[m];
            let rows = Rows::new(b.schema(), &[b.leaf(0), b.leaf(1)], b.len()).unwrap();
            let plan = scatter_plan(b.index(), 5);
            let (row, a) = plan[env].iter().copied().find(|(_, a)| *a == agent).unwrap();
            assert_eq!(a, agent);
            assert_eq!(rows.row(row).unwrap()[0], f32s(&[v, -v]).as_slice());
        }
    }

    #[test]
    fn env_indices_all_is_the_identity() {
        let all = EnvIndices::all(3);
        assert_eq!((all.len(), all.num_envs(), all.subset_indices()), (3, 3, None));
        assert_eq!(all.iter().collect::<Vec<_>>(), vec![(0, 0), (1, 1), (2, 2)]);
        assert!(EnvIndices::all(0).is_empty());
    }

    #[test]
    fn env_indices_subset_maps_rows_to_sub_envs_in_any_order() {
        let s = EnvIndices::subset(&[5, 0, 3], 8).unwrap();
        assert_eq!((s.len(), s.num_envs()), (3, 8));
        assert_eq!(s.subset_indices(), Some(&[5usize, 0, 3][..]));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, 5), (1, 0), (2, 3)]);
        // Every sub-env, given explicitly, is the identity; none is an empty step.
        let full = EnvIndices::subset(&[0, 1, 2], 3).unwrap();
        assert_eq!(full.iter().collect::<Vec<_>>(), EnvIndices::all(3).iter().collect::<Vec<_>>());
        assert!(EnvIndices::subset(&[], 4).unwrap().is_empty());
    }

    #[test]
    fn env_indices_reject_out_of_range_negative_and_duplicates() {
        assert_eq!(
            EnvIndices::subset(&[1, 8], 8),
            Err(BatchError::EnvIndexOutOfRange { entry: 1, index: 8, num_envs: 8 })
        );
        let neg = EnvIndices::subset(&[-1], 8).unwrap_err();
        assert_eq!(neg, BatchError::EnvIndexOutOfRange { entry: 0, index: -1, num_envs: 8 });
        assert!(neg.to_string().contains("env_indices[0] is -1"), "{neg}");
        assert!(neg.to_string().contains("sub-envs 0 to 7"), "{neg}");
        let dup = EnvIndices::subset(&[2, 4, 2], 8).unwrap_err();
        assert_eq!(dup, BatchError::DuplicateEnvIndex { index: 2, first: 0, second: 2 });
        assert!(dup.to_string().contains("sub-env 2 twice (entries 0 and 2)"), "{dup}");
        // Past 64 sub-envs (the table on the heap) too.
        let big: Vec<i64> = (0..200).chain([130]).collect();
        assert_eq!(
            EnvIndices::subset(&big, 200),
            Err(BatchError::DuplicateEnvIndex { index: 130, first: 130, second: 200 })
        );
        assert_eq!(EnvIndices::subset(&big[..200], 200).unwrap().len(), 200);
        assert_eq!(
            EnvIndices::subset(&[63, 0, 63], 64),
            Err(BatchError::DuplicateEnvIndex { index: 63, first: 0, second: 2 })
        );
        let bytes: Vec<u8> = [5i64, 0, 3].iter().flat_map(|i| i.to_ne_bytes()).collect();
        assert_eq!(EnvIndices::from_ne_bytes(&bytes, 8), EnvIndices::subset(&[5, 0, 3], 8));
        let twice: Vec<u8> = [1i64, 1].iter().flat_map(|i| i.to_ne_bytes()).collect();
        assert!(EnvIndices::from_ne_bytes(&twice, 8).is_err());
        let none = EnvIndices::subset(&[0], 0).unwrap_err();
        assert!(none.to_string().contains("no sub-envs"), "{none}");
        assert!(EnvIndices::subset(&[i64::MIN, i64::MAX], 3).is_err());
    }

    #[test]
    fn index_entries_are_ints_that_fit_and_never_bools() {
        let repr = || "x".to_owned();
        assert_eq!(IndexEntry::Int(-3).index(0, || panic!("no message for an int")), Ok(-3));
        let too_large = IndexEntry::BigInt.index(2, || "10**30".to_owned()).unwrap_err();
        assert_eq!(too_large.to_string(), "env_indices[2] is 10**30, not a sub-env index");
        assert!(!too_large.is_type_error());
        let not_int = IndexEntry::Bool.index(1, || "True".to_owned()).unwrap_err();
        assert_eq!(not_int.to_string(), "env_indices[1] is True, not an int");
        assert!(not_int.is_type_error());
        assert_eq!(
            IndexEntry::Other.index(4, repr),
            Err(BatchError::NotAnInt { entry: 4, repr: "x".into() })
        );
        assert!(IndexEntry::check_array(1, b'u', || panic!("no message")).is_ok());
        let not_ints = IndexEntry::check_array(2, b'i', || "a 2-D array".to_owned()).unwrap_err();
        assert!(not_ints.is_type_error());
        assert_eq!(
            not_ints.to_string(),
            "env_indices must be a sequence of ints or a 1-D integer numpy array, got a 2-D array"
        );
        assert!(IndexEntry::check_array(1, b'b', String::new).is_err(), "a bool mask is not indices");
        assert!(!BatchError::Shrank.is_type_error());
    }

    #[test]
    fn per_row_inputs_need_one_entry_per_row() {
        let all = EnvIndices::all(2);
        assert!(all.check_count("rewards", "dicts", 2).is_ok());
        let err = all.check_count("terminateds", "flags", 3).unwrap_err();
        assert_eq!(err.to_string(), "terminateds: expected 2 flags (one per sub-env), got 3");
        let subset = EnvIndices::subset(&[4, 1], 8).unwrap();
        let err = subset.check_count("infos", "info dicts", 8).unwrap_err();
        assert_eq!(err.to_string(), "infos: expected 2 info dicts (one per entry of env_indices), got 8");
        // A batch's rows are checked against a subset only (all sub-envs: the conversion does).
        assert!(all.check_batch_rows(Some(5)).is_ok());
        assert!(subset.check_batch_rows(None).is_ok() && subset.check_batch_rows(Some(2)).is_ok());
        let err = subset.check_batch_rows(Some(8)).unwrap_err();
        assert_eq!(err.to_string(), "8 rows, but env_indices has 2 entries (one row per entry)");
    }

    #[test]
    fn a_gather_needs_one_observation_dict_per_row() {
        assert!(EnvIndices::all(3).check_gather_rows(3).is_ok());
        let err = EnvIndices::all(8).check_gather_rows(2).unwrap_err();
        assert_eq!(err.to_string(), "expected one episode per sub-env: 8 episodes, 2 observation dicts");
        let err = EnvIndices::subset(&[1], 8).unwrap().check_gather_rows(8).unwrap_err();
        assert_eq!(
            err.to_string(),
            "expected one observation dict per entry of env_indices: 1 entries, 8 observation dicts"
        );
    }

    #[test]
    fn subset_gather_then_scatter_goes_back_to_each_rows_sub_env() {
        // Rows of sub-envs 6, 1 and 4 of 8 (in that order), two agents each, one module:
        // the batch indexes rows; the subset maps them back to sub-envs.
        let envs = EnvIndices::subset(&[6, 1, 4], 8).unwrap();
        let mut mb = ModuleBatch::new(schema());
        for (row, env) in envs.iter() {
            for agent in 0..2 {
                let v = (env * 10 + agent) as f32;
                mb.push(row, agent, &[f32s(&[v, v]), (v as i64).to_ne_bytes().to_vec()]).unwrap();
            }
        }
        let plan = scatter_plan(mb.index(), envs.len());
        assert_eq!(plan.len(), 3);
        let rows = Rows::new(mb.schema(), &[mb.leaf(0), mb.leaf(1)], mb.len()).unwrap();
        for (row, env) in envs.iter() {
            for &(r, agent) in &plan[row] {
                let v = (env * 10 + agent) as f32;
                assert_eq!(rows.row(r).unwrap()[0], f32s(&[v, v]).as_slice());
            }
        }
    }
}
