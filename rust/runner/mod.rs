//! The runner's batched containers: rows of a vector-env batch, and per-module inference
//! batches gathered across sub-envs and agents with the index map back.
//!
//! A runner steps N sub-envs (each with any number of agents) per env step. Per step it
//! needs (1) the rows of each batched array the env or the module produced, one per
//! sub-env/agent, to record them into that sub-env's episode, and (2) per module, the
//! observations of the agents that act, stacked contiguously for one forward pass, plus
//! where each row came from so the module's outputs can be split back. Both are plain byte
//! bookkeeping and live here, free of Python.

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
        }
    }
}

impl std::error::Error for BatchError {}

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

/// One module's inference batch under construction: rows appended one item at a time
/// (the observations of the agents mapped to the module that act now), with the
/// `(sub-env index, agent slot)` each row came from.
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

    /// Appends one item (one slice per leaf) for agent slot `agent` of sub-env `env`.
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

    /// The contiguous bytes of leaf `leaf` (`len()` items).
    #[must_use]
    pub fn leaf(&self, leaf: usize) -> &[u8] {
        &self.leaves[leaf]
    }

    /// Where each row came from: `(sub-env index, agent slot)`, in row order.
    #[must_use]
    pub fn index(&self) -> &[(usize, usize)] {
        &self.index
    }
}

/// Groups the rows of a module batch's index map by sub-env: for each of `num_envs`
/// sub-envs, the `(row, agent slot)` pairs that belong to it, in row order.
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
}
