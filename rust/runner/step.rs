//! The rules of a single-agent runner's vector-step record: which field a batch fills and
//! how it reaches the episodes (a batch, a constant, per episode), the rows of the step's
//! fast path read straight from the batches' bytes, gymnasium's vector infos, and which
//! episodes a step started and left done.

use std::sync::Arc;

use super::{BatchError, EnvIndices, Rows};
use crate::episode::FieldName;
use crate::schema::{Leaf, Schema};

/// One field of a vector step: the observations, actions, rewards, or one extra model
/// output by its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepField {
    Observations,
    Actions,
    Rewards,
    Extra(String),
}

/// How the episodes of a vector step read one field's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldRows {
    /// A batch: row `i` for the step's row `i`.
    Batch,
    /// One value for every row (an extra such as the weights' sequence number).
    Constant,
    /// Neither: each episode converts its row on its own (dict/tuple batches of
    /// Dict/Tuple spaces), and the step takes no fast path.
    PerEpisode,
}

impl StepField {
    /// The episode field this one fills.
    #[must_use]
    pub fn name(&self) -> FieldName<'_> {
        match self {
            StepField::Observations => FieldName::Observations,
            StepField::Actions => FieldName::Actions,
            StepField::Rewards => FieldName::Rewards,
            StepField::Extra(k) => FieldName::Extra(k),
        }
    }

    /// How messages name the whole batch ("observations", "extra model output \"k\"").
    #[must_use]
    pub fn label(&self) -> String {
        match self {
            StepField::Observations => "observations".to_owned(),
            StepField::Actions => "actions".to_owned(),
            StepField::Rewards => "rewards".to_owned(),
            StepField::Extra(k) => format!("extra model output {k:?}"),
        }
    }

    /// How a value of this field is read, given whether it is an array and (asked only
    /// for an extra that is not) whether it is a nested batch of one array per leaf (a
    /// recurrent state). Only extras are constants: observations, actions and rewards
    /// always have a row per sub-env.
    pub fn rows(&self, is_array: bool, nested_batch: impl FnOnce() -> bool) -> FieldRows {
        match self {
            _ if is_array => FieldRows::Batch,
            StepField::Extra(_) if nested_batch() => FieldRows::Batch,
            StepField::Extra(_) => FieldRows::Constant,
            _ => FieldRows::PerEpisode,
        }
    }
}

/// Whether two schemas lay items out alike (shared schemas compare by address), so that a
/// batch converted for one is stored as it is by a column of the other.
#[must_use]
pub fn same_layout(a: &Arc<Schema>, b: &Arc<Schema>) -> bool {
    Arc::ptr_eq(a, b) || a.leaves == b.leaves
}

/// One field's bytes for a vector step, laid out by `schema`: a batch (per leaf, the
/// bytes of all rows) or a constant (per leaf, one item that every row reads). Generic
/// over the host's buffers, read anew each time: a host array may change size in between,
/// and a row past its live end is then refused, never read.
pub struct FieldBytes<B> {
    schema: Arc<Schema>,
    /// Per leaf: its buffer and the bytes per row (`None`: a constant's one item).
    leaves: Vec<(B, Option<usize>)>,
}

impl<B: AsRef<[u8]>> FieldBytes<B> {
    /// A batch of `n` rows: leaf `l` must hold `n` items of `schema`'s leaf `l`.
    pub fn batch(schema: Arc<Schema>, leaves: Vec<B>, n: usize) -> Result<FieldBytes<B>, BatchError> {
        Rows::new(&schema, &leaves.iter().map(AsRef::as_ref).collect::<Vec<_>>(), n)?;
        let widths = schema.leaves.iter().map(|l| Some(Leaf::item_bytes(l)));
        let leaves = leaves.into_iter().zip(widths).collect();
        Ok(FieldBytes { schema, leaves })
    }

    /// A constant: one item (a buffer per leaf, laid out by `schema`) for every row.
    #[must_use]
    pub fn constant(schema: Arc<Schema>, leaves: Vec<B>) -> FieldBytes<B> {
        FieldBytes { schema, leaves: leaves.into_iter().map(|b| (b, None)).collect() }
    }

    #[must_use]
    pub fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    /// Each leaf's bytes with its bytes per row (`None`: a constant), for [`StepLeaves`].
    pub fn leaves(&self) -> impl Iterator<Item = (&[u8], Option<usize>)> {
        self.leaves.iter().map(|(b, w)| (b.as_ref(), *w))
    }

    /// Row `i`, one slice per leaf.
    pub fn row(&self, i: usize) -> Result<Vec<&[u8]>, BatchError> {
        self.leaves().map(|(bytes, width)| leaf_row(bytes, width, i)).collect()
    }
}

/// Row `i` of a leaf whose rows are `width` bytes (`None`: a constant, every row).
fn leaf_row(bytes: &[u8], width: Option<usize>, i: usize) -> Result<&[u8], BatchError> {
    match width {
        // Not `ok_or`: an eager error would be dropped on every row read (a call).
        Some(w) => match bytes.get(i * w..(i + 1) * w) {
            Some(row) => Ok(row),
            None => Err(BatchError::NoRow { row: i }),
        },
        None => Ok(bytes),
    }
}

/// Every leaf of a step's fields on the fast path: the bytes of all rows with the bytes
/// per row, or a constant's one item (`None`), which every row reads.
pub struct StepLeaves<'a> {
    leaves: Vec<(&'a [u8], Option<usize>)>,
}

impl<'a> StepLeaves<'a> {
    #[must_use]
    pub fn new(leaves: Vec<(&'a [u8], Option<usize>)>) -> StepLeaves<'a> {
        StepLeaves { leaves }
    }

    /// Checks that every batch leaf still holds `rows` rows (their sizes were checked when
    /// they were converted, but Python code may have run since).
    pub fn check_rows(&self, rows: usize) -> Result<(), BatchError> {
        if self.leaves.iter().any(|&(bytes, width)| width.is_some_and(|w| bytes.len() < rows * w)) {
            return Err(BatchError::Shrank);
        }
        Ok(())
    }

    /// Row `i`, one slice per leaf, into `out` (cleared first: one buffer for all rows).
    pub fn row_into(&self, i: usize, out: &mut Vec<&'a [u8]>) -> Result<(), BatchError> {
        out.clear();
        for &(bytes, width) in &self.leaves {
            out.push(leaf_row(bytes, width, i)?);
        }
        Ok(())
    }
}
/// The common vector step, stored without converting anything per sub-env: every field
/// (observation, action, reward, each extra) is a batch (or constant) laid out as the
/// columns of the episodes that take this path.
pub struct FastStep<B> {
    /// Observation, action, reward, then the extras in `keys` order.
    fields: Vec<FieldBytes<B>>,
    keys: Vec<String>,
}

impl<B: AsRef<[u8]>> Default for FastStep<B> {
    fn default() -> Self {
        FastStep { fields: Vec::new(), keys: Vec::new() }
    }
}

impl<B: AsRef<[u8]>> FastStep<B> {
    /// The fast step of a vector step's fields (observation, action, reward, then the
    /// extras), each given as its field, how the episodes read it, and what `bytes` takes
    /// to lay it out by the columns of the episodes that take the path.
    ///
    /// `bytes(value, constant)` is the field's batch (or, `constant`, its one item) laid
    /// out by the column that stores it; `None` where no column stores the field typed or
    /// the value does not convert. Returns `None` (every episode converts its own row) as
    /// soon as a field is read per episode or has no bytes.
    pub fn build<'f, T>(
        fields: impl IntoIterator<Item = (&'f StepField, FieldRows, T)>,
        mut bytes: impl FnMut(T, bool) -> Option<FieldBytes<B>>,
    ) -> Option<FastStep<B>> {
        let mut out = FastStep::default();
        for (field, rows, value) in fields {
            let constant = match rows {
                FieldRows::Batch => false,
                FieldRows::Constant => true,
                FieldRows::PerEpisode => return None,
            };
            out.push(field, bytes(value, constant)?);
        }
        Some(out)
    }

    /// Adds the next field's bytes (observation, action, reward, then the extras).
    pub fn push(&mut self, field: &StepField, bytes: FieldBytes<B>) {
        if let StepField::Extra(key) = field {
            self.keys.push(key.clone());
        }
        self.fields.push(bytes);
    }

    /// The fields' layouts in field order (what an episode's columns must be to take it).
    #[must_use]
    pub fn layouts(&self) -> Vec<&Schema> {
        self.fields.iter().map(|f| &**f.schema()).collect()
    }

    /// The extras' keys, in field order.
    #[must_use]
    pub fn keys(&self) -> Vec<&str> {
        self.keys.iter().map(String::as_str).collect()
    }

    /// Every leaf of every field, in field order, to read rows from.
    #[must_use]
    pub fn leaves(&self) -> StepLeaves<'_> {
        StepLeaves::new(self.fields.iter().flat_map(FieldBytes::leaves).collect())
    }
}

/// What a vector step does to one sub-env's episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Stores row `i` of the fast step's batches as they are.
    Row,
    /// Converts its row of each field and takes it as a step.
    Step,
    /// Takes its row's observation (and infos) as its reset: an episode not reset yet is
    /// a new one after gymnasium's next-step autoreset.
    Reset,
}

impl StepKind {
    /// The kind of step for an episode whose columns `fit_rows` of the fast step (a
    /// reset episode with typed columns of its layouts) and that `is_reset` (asked only
    /// where they do not fit).
    #[must_use]
    pub fn of(fits_rows: bool, is_reset: impl FnOnce() -> bool) -> StepKind {
        if fits_rows {
            StepKind::Row
        } else if is_reset() {
            StepKind::Step
        } else {
            StepKind::Reset
        }
    }
}

/// How gymnasium's vector infos (a dict of per-sub-env arrays) unbatch: for each key that
/// is not another key's mask, its position and its mask's (`_key`, which says which
/// sub-envs have the key; none: every sub-env has it).
#[must_use]
pub fn vector_info_keys(keys: &[&str]) -> Vec<(usize, Option<usize>)> {
    let position = |k: &str| keys.iter().position(|x| *x == k);
    keys.iter()
        .enumerate()
        .filter(|(_, k)| k.strip_prefix('_').is_none_or(|base| position(base).is_none()))
        .map(|(i, k)| (i, position(&format!("_{k}"))))
        .collect()
}

/// The episodes a vector step reset and left done, as indices into the runner's
/// episodes: `started` (rows whose episode took its reset, ascending) mapped to their
/// sub-envs, and the rows whose step is terminated or truncated (a reset is never done).
#[must_use]
pub fn step_results(
    envs: &EnvIndices,
    started: &[usize],
    terminateds: &[bool],
    truncateds: &[bool],
) -> (Vec<usize>, Vec<usize>) {
    let done = terminateds
        .iter()
        .zip(truncateds)
        .enumerate()
        .filter(|&(i, (te, tr))| (*te || *tr) && started.binary_search(&i).is_err())
        .map(|(i, _)| envs.env(i))
        .collect();
    (started.iter().map(|&i| envs.env(i)).collect(), done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::DType;

    #[test]
    fn step_fields_name_their_episode_field_and_batch() {
        assert_eq!(StepField::Rewards.name(), FieldName::Rewards);
        assert_eq!(StepField::Extra("vf".into()).name(), FieldName::Extra("vf"));
        assert_eq!(StepField::Observations.label(), "observations");
        assert_eq!(StepField::Extra("vf".into()).label(), "extra model output \"vf\"");
    }

    #[test]
    fn only_extras_are_constants_and_only_they_are_asked_about_nesting() {
        let extra = StepField::Extra("state".into());
        assert_eq!(extra.rows(true, || panic!("not asked for an array")), FieldRows::Batch);
        assert_eq!(extra.rows(false, || true), FieldRows::Batch);
        assert_eq!(extra.rows(false, || false), FieldRows::Constant);
        assert_eq!(StepField::Observations.rows(true, || false), FieldRows::Batch);
        // A dict of observation batches is converted per episode, never a constant.
        assert_eq!(StepField::Observations.rows(false, || panic!("not asked")), FieldRows::PerEpisode);
        assert_eq!(StepField::Actions.rows(false, || true), FieldRows::PerEpisode);
    }

    #[test]
    fn same_layout_compares_leaves_not_addresses() {
        let a = Arc::new(Schema::new(vec![Leaf::new(DType::F32, vec![2])]));
        let b = Arc::new(Schema::new(vec![Leaf::new(DType::F32, vec![2])]));
        let c = Arc::new(Schema::new(vec![Leaf::new(DType::F64, vec![2])]));
        assert!(same_layout(&a, &a) && same_layout(&a, &b));
        assert!(!same_layout(&a, &c));
    }

    #[test]
    fn step_leaves_read_rows_and_constants() {
        let batch = [1u8, 2, 3, 4, 5, 6];
        let constant = [9u8];
        let leaves = StepLeaves::new(vec![(&batch[..], Some(2)), (&constant[..], None)]);
        let mut row = Vec::new();
        leaves.row_into(1, &mut row).unwrap();
        assert_eq!(row, vec![&[3u8, 4][..], &[9u8][..]]);
        leaves.row_into(2, &mut row).unwrap();
        assert_eq!(row, vec![&[5u8, 6][..], &[9u8][..]], "the buffer is reused, not appended to");
        assert_eq!(leaves.row_into(3, &mut row), Err(BatchError::NoRow { row: 3 }));
        assert!(leaves.check_rows(3).is_ok());
        assert_eq!(leaves.check_rows(4), Err(BatchError::Shrank));
        assert_eq!(BatchError::NoRow { row: 3 }.to_string(), "no row 3 in the batch (was it resized?)");
    }

    #[test]
    fn field_bytes_check_a_batch_and_read_rows_or_a_constant() {
        let schema =
            Arc::new(Schema::new(vec![Leaf::new(DType::F32, vec![]), Leaf::new(DType::BOOL, vec![2])]));
        let f32s: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let batch = FieldBytes::batch(schema.clone(), vec![f32s.clone(), vec![1, 0, 0, 1]], 2).unwrap();
        assert_eq!(batch.row(1).unwrap(), vec![&2.0f32.to_ne_bytes()[..], &[0u8, 1][..]]);
        assert_eq!(batch.row(2), Err(BatchError::NoRow { row: 2 }));
        assert_eq!(batch.leaves().map(|(_, w)| w).collect::<Vec<_>>(), vec![Some(4), Some(2)]);
        let short = FieldBytes::batch(schema.clone(), vec![f32s, vec![1, 0]], 2).err();
        assert_eq!(
            short,
            Some(BatchError::RowCount { leaf: 1, expected_rows: 2, item_bytes: 2, got_bytes: 2 })
        );
        let constant = FieldBytes::constant(schema.clone(), vec![vec![0u8; 4], vec![1, 1]]);
        assert_eq!(constant.row(7).unwrap(), vec![&[0u8; 4][..], &[1u8, 1][..]]);
        assert!(Arc::ptr_eq(constant.schema(), &schema));
    }

    #[test]
    fn a_fast_step_reads_every_fields_row_in_field_order() {
        let scalar = |dtype| Arc::new(Schema::new(vec![Leaf::new(dtype, vec![])]));
        let mut step = FastStep::default();
        step.push(
            &StepField::Observations,
            FieldBytes::batch(scalar(DType::BOOL), vec![vec![1u8, 0]], 2).unwrap(),
        );
        step.push(
            &StepField::Extra("seq".into()),
            FieldBytes::constant(scalar(DType::BOOL), vec![vec![7u8]]),
        );
        step.push(
            &StepField::Extra("v".into()),
            FieldBytes::batch(scalar(DType::BOOL), vec![vec![3u8, 4]], 2).unwrap(),
        );
        assert_eq!(step.keys(), vec!["seq", "v"]);
        assert_eq!(step.layouts().len(), 3);
        let leaves = step.leaves();
        let mut row = Vec::new();
        leaves.row_into(1, &mut row).unwrap();
        assert_eq!(row, vec![&[0u8][..], &[7u8][..], &[4u8][..]]);
        assert_eq!(leaves.check_rows(3), Err(BatchError::Shrank));
    }

    #[test]
    fn a_fast_step_needs_bytes_for_every_field_and_none_read_per_episode() {
        let scalar = Arc::new(Schema::new(vec![Leaf::new(DType::BOOL, vec![])]));
        let (obs, seq) = (StepField::Observations, StepField::Extra("seq".into()));
        let bytes = |v: u8, constant: bool| -> Option<FieldBytes<Vec<u8>>> {
            match (v, constant) {
                (0, _) => None,
                (_, true) => Some(FieldBytes::constant(scalar.clone(), vec![vec![v]])),
                (_, false) => FieldBytes::batch(scalar.clone(), vec![vec![v, v]], 2).ok(),
            }
        };
        let step = FastStep::build([(&obs, FieldRows::Batch, 1), (&seq, FieldRows::Constant, 9)], bytes);
        let step = step.expect("every field has bytes");
        assert_eq!(step.keys(), vec!["seq"]);
        let mut row = Vec::new();
        step.leaves().row_into(1, &mut row).unwrap();
        assert_eq!(row, vec![&[1u8][..], &[9u8][..]]);
        // A field without bytes (not stored typed, or not converted): no fast path.
        assert!(
            FastStep::build([(&obs, FieldRows::Batch, 1), (&seq, FieldRows::Constant, 0)], bytes).is_none()
        );
        // A field read per episode: no fast path, and its bytes are never asked for.
        let per_episode = [(&obs, FieldRows::PerEpisode, 1), (&seq, FieldRows::Batch, 1)];
        let mut asked = 0;
        let none = FastStep::build(per_episode, |v, c| {
            asked += 1;
            bytes(v, c)
        });
        assert!(none.is_none());
        assert_eq!(asked, 0);
        assert!(FastStep::<Vec<u8>>::build([], bytes).is_some_and(|s| s.layouts().is_empty()));
    }

    #[test]
    fn an_episode_takes_its_row_a_step_or_its_reset() {
        assert_eq!(StepKind::of(true, || panic!("a fitting episode is reset")), StepKind::Row);
        assert_eq!(StepKind::of(false, || true), StepKind::Step);
        // Not reset yet: after gymnasium's next-step autoreset, its row is a reset.
        assert_eq!(StepKind::of(false, || false), StepKind::Reset);
    }

    #[test]
    fn vector_infos_skip_masks_and_pair_keys_with_them() {
        // "_b" masks "b"; "_c" has no "c", so it is an info key of its own.
        let keys = ["a", "_b", "b", "_c"];
        assert_eq!(vector_info_keys(&keys), vec![(0, None), (2, Some(1)), (3, None)]);
        assert!(vector_info_keys(&[]).is_empty());
        // A key "_" is a mask only if the empty key is present.
        assert_eq!(vector_info_keys(&["_", ""]), vec![(1, Some(0))]);
    }

    #[test]
    fn step_results_map_rows_to_sub_envs_and_never_call_a_reset_done() {
        let all = EnvIndices::all(4);
        let (started, done) =
            step_results(&all, &[1], &[true, true, false, false], &[false, false, false, true]);
        assert_eq!((started, done), (vec![1], vec![0, 3]));
        let subset = EnvIndices::subset(&[7, 2, 5], 8).unwrap();
        let (started, done) = step_results(&subset, &[0, 2], &[false, true, true], &[true, false, false]);
        assert_eq!((started, done), (vec![7, 5], vec![2]));
    }
}
