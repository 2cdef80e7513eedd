//! RLlib 2.60's read rules for one field of a single-agent episode, as a plan: which
//! stored items a read returns, where fill items go, and in what form the host hands the
//! result back (one item, a list, a batch and its dtypes). The binding only carries it out.

use std::fmt;

use super::field::{Field, FieldSpec, Storage};
use super::single::FieldName;
use crate::column::{Index, IndexError, Pos, Resolved};

/// A read's arguments (RLlib's `get_*` keywords).
#[derive(Clone, Debug, PartialEq)]
pub struct ReadArgs {
    pub index: Index,
    pub neg_index_as_lookback: bool,
    /// A fill value was given: positions outside the stored items are fill items.
    pub fill: bool,
    /// `one_hot_discrete`.
    pub one_hot: bool,
}

/// Which spec shapes the fill items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillSpec {
    /// The field's own space: `np.full` of each leaf's shape and dtype.
    Own,
    /// RLlib's float32 scalar space of the rewards buffer (not in slices).
    RewardsF32,
    /// None: the fill value as given.
    Raw,
}

/// The dtype a batch's leaf takes where fill rows join data without a space of the
/// field's own (RLlib concatenates or stacks the fill with the data and numpy decides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafDtype {
    /// The fill's dtype (its space's, or the fill value's own).
    Fill,
    /// The stored dtype.
    Stored,
    /// numpy's `result_type` of the stored dtype and the fill's.
    Promoted,
}

/// How a batch treats fill rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchFill {
    /// No fill rows: the items as stored.
    None,
    /// The fill cast to the field's own space.
    Cast,
    /// Only fill rows and no space to shape them: an array of the fill values
    /// (RLlib's `np.array([fill] * n)`).
    FillOnly,
    /// Gathered with zeros in `rows`, each leaf turned into its dtype, then the fill
    /// value written into `rows`.
    Promote { dtypes: Vec<LeafDtype>, rows: Vec<usize> },
}

/// The form a read's result takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Form {
    /// One item (an int index).
    Item,
    /// A host list of items (before `to_numpy`, and always for infos).
    List,
    /// The object items as one host array (`np.array(items)`).
    ObjectArray,
    /// An empty host list: a numpy'd field that never held an item.
    EmptyList,
    /// Typed items batched per leaf.
    Batch(BatchFill),
}

/// What a read returns, decided by [`plan`].
#[derive(Clone, Debug, PartialEq)]
pub struct ReadPlan {
    /// The positions read: stored items or fills, one or many.
    pub positions: Resolved,
    pub form: Form,
    /// One-hot encode discrete leaves (the field has a space).
    pub one_hot: bool,
    /// Scalars given as host scalars read back as such (before `to_numpy`).
    pub host_scalars: bool,
    pub fill_spec: FillSpec,
}

impl ReadPlan {
    /// The stored positions the read returns (its fill items left out).
    #[must_use]
    pub fn stored_positions(&self) -> Vec<usize> {
        let at = |p: &Pos| if let Pos::At(p) = p { Some(*p) } else { None };
        match &self.positions {
            Resolved::One(p) => at(p).into_iter().collect(),
            Resolved::Many(v) => v.iter().filter_map(at).collect(),
        }
    }
}

/// Why a read cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    Index(IndexError),
    /// One-hot encoding asked of data without a space to say the number of classes.
    NoSpaceForOneHot {
        field: String,
        space: &'static str,
    },
    /// A numpy'd typed field read with an empty list of indices (RLlib cannot batch none).
    EmptyListBatch,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Index(e) => e.fmt(f),
            ReadError::NoSpaceForOneHot { field, space } => write!(
                f,
                "cannot one-hot encode the {field} without a space: give the episode an {space} space"
            ),
            ReadError::EmptyListBatch => f.write_str("cannot batch an empty list of indices"),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<IndexError> for ReadError {
    fn from(e: IndexError) -> Self {
        ReadError::Index(e)
    }
}

/// Plans a read of `field` (named `name`, of an episode whose rewards have RLlib's
/// float32 space when `rewards_fill_f32`) with RLlib 2.60's semantics.
///
/// # Errors
/// An index out of range (without fill) or a zero slice step; one-hot encoding of data
/// without a space; an empty list of indices on a numpy'd typed field.
pub fn plan<O: Clone, S: FieldSpec>(
    field: &Field<O, S>,
    name: FieldName<'_>,
    rewards_fill_f32: bool,
    args: &ReadArgs,
) -> Result<ReadPlan, ReadError> {
    let ReadArgs { index, neg_index_as_lookback: neg, fill, one_hot } = args;
    let g = field.geometry();
    let spaced = field.spaced();
    let no_space = || ReadError::NoSpaceForOneHot {
        field: name.label(),
        space: if name == FieldName::Actions { "action" } else { "observation" },
    };
    if let (true, false, Index::List(list)) = (one_hot, spaced, index) {
        // RLlib reads a list item by item, one-hot encoding each: the first item decides
        // whether an index error or the missing space is reported.
        for &i in list {
            if let Resolved::One(Pos::At(_)) = g.resolve(&Index::Int(i), *neg, *fill)? {
                return Err(no_space());
            }
        }
    }
    let resolved = g.resolve(index, *neg, *fill)?;
    // Whether the read has a data part (RLlib's rule for slices: its nominal length).
    let reads_data = match (&resolved, index) {
        (Resolved::One(p), _) => matches!(p, Pos::At(_)),
        (_, Index::Slice { start, stop, step }) => g.slice_reads_data(*start, *stop, *step, *neg),
        (_, Index::All) => true,
        (Resolved::Many(v), _) => v.iter().any(|p| matches!(p, Pos::At(_))),
    };
    if *one_hot && !spaced && reads_data {
        // RLlib one-hot encodes whatever data part it read, even an empty one.
        return Err(no_space());
    }
    let fill_spec = if spaced {
        FillSpec::Own
    } else if name == FieldName::Rewards && rewards_fill_f32 {
        FillSpec::RewardsF32
    } else {
        FillSpec::Raw
    };
    let mut plan = ReadPlan {
        positions: resolved,
        form: Form::List,
        one_hot: *one_hot && spaced,
        host_scalars: false,
        fill_spec,
    };
    let Resolved::Many(positions) = &plan.positions else {
        plan.form = Form::Item;
        if let Storage::Typed { host_scalars, .. } = &field.storage {
            plan.host_scalars = *host_scalars && !field.finalized;
        }
        return Ok(plan);
    };
    match &field.storage {
        Storage::Typed { host_scalars, .. } if !field.finalized => plan.host_scalars = *host_scalars,
        Storage::Typed { column, .. } => {
            let list_index = matches!(index, Index::List(_));
            if list_index && positions.is_empty() {
                return Err(ReadError::EmptyListBatch);
            }
            // RLlib one-hot encodes a slice's data part only when it reads one: otherwise
            // an empty slice comes back as stored (dtype, item shape).
            plan.one_hot &= reads_data || !positions.is_empty();
            let fill_rows: Vec<usize> = positions
                .iter()
                .enumerate()
                .filter(|(_, p)| matches!(p, Pos::Fill))
                .map(|(i, _)| i)
                .collect();
            plan.form = Form::Batch(if fill_rows.is_empty() {
                BatchFill::None
            } else if spaced {
                BatchFill::Cast
            } else if !reads_data && fill_spec == FillSpec::Raw {
                BatchFill::FillOnly
            } else {
                // A slice concatenates data and fill batches (numpy promotes both dtypes);
                // a list of ints stacks items the way RLlib's `batch` does: into the first
                // item's dtype when that is an array (a fill of a space, or a row of a
                // non-scalar leaf), else with numpy's promotion of the scalars.
                let first_is_fill = matches!(positions.first(), Some(Pos::Fill));
                let dtypes = column
                    .schema()
                    .leaves
                    .iter()
                    .map(|leaf| {
                        if !reads_data || (list_index && first_is_fill && fill_spec != FillSpec::Raw) {
                            LeafDtype::Fill
                        } else if list_index && !first_is_fill && !leaf.shape.is_empty() {
                            LeafDtype::Stored
                        } else {
                            LeafDtype::Promoted
                        }
                    })
                    .collect();
                BatchFill::Promote { dtypes, rows: fill_rows }
            });
        }
        // RLlib's infos stay a list of dicts after `to_numpy`.
        _ if !field.finalized || name == FieldName::Infos => {}
        Storage::Untyped { .. } if positions.is_empty() => plan.form = Form::EmptyList,
        _ => plan.form = Form::ObjectArray,
    }
    Ok(plan)
}

/// How a write takes its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteValues {
    /// One value for the one position of an int index.
    One,
    /// One value per position: the data is a host list, or the index a list.
    PerItem,
    /// A batch with the items on its first axis.
    Batch,
}

/// What a write (RLlib's `set_*`) overwrites, decided by [`plan_write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritePlan {
    /// The stored positions overwritten, in the order of the values.
    pub positions: Vec<usize>,
    pub values: WriteValues,
}

/// Plans a write of `field` at `index` (`None` in RLlib: the whole chunk, [`Index::All`]);
/// `data_is_list` says the new data is a host list.
///
/// # Errors
/// An index out of range or a zero slice step (writes never fill).
pub fn plan_write<O: Clone, S>(
    field: &Field<O, S>,
    index: &Index,
    neg_index_as_lookback: bool,
    data_is_list: bool,
) -> Result<WritePlan, IndexError> {
    let positions = match field.geometry().resolve(index, neg_index_as_lookback, false)? {
        Resolved::One(p) => vec![p],
        Resolved::Many(v) => v,
    }
    .into_iter()
    .filter_map(|p| if let Pos::At(p) = p { Some(p) } else { None })
    .collect();
    let values = match index {
        Index::Int(_) => WriteValues::One,
        Index::List(_) => WriteValues::PerItem,
        _ if data_is_list => WriteValues::PerItem,
        _ => WriteValues::Batch,
    };
    Ok(WritePlan { positions, values })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{DType, Leaf, Schema};
    use std::sync::Arc;

    /// A test spec: whether it comes from a space.
    struct Space(bool);

    impl FieldSpec for Space {
        fn is_from_space(&self) -> bool {
            self.0
        }
    }

    type F = Field<String, Space>;

    /// A typed field of `total` items (`lookback` of them look-back) of `leaves`, with a
    /// spec from a space or inferred.
    fn typed(leaves: Vec<Leaf>, total: usize, lookback: usize, space: bool, host_scalars: bool) -> F {
        let mut f = F::typed(Schema::new(leaves), host_scalars);
        if let Storage::Typed { column, .. } = &mut f.storage {
            let items: Vec<Vec<u8>> =
                column.schema().leaves.iter().map(|l| vec![0; l.item_bytes()]).collect();
            let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
            for _ in 0..total {
                column.push(&refs).unwrap();
            }
        }
        f.set_lookback(lookback);
        f.spec = Some(Arc::new(Space(space)));
        f
    }

    fn scalar(dtype: DType) -> Leaf {
        Leaf::new(dtype, vec![])
    }

    fn numpyd(mut f: F) -> F {
        f.finalized = true;
        f
    }

    fn args(index: Index, fill: bool, one_hot: bool) -> ReadArgs {
        ReadArgs { index, neg_index_as_lookback: false, fill, one_hot }
    }

    fn slice(start: Option<i64>, stop: Option<i64>) -> Index {
        Index::Slice { start, stop, step: None }
    }

    #[test]
    fn items_and_lists_before_to_numpy_keep_host_scalars() {
        let f = typed(vec![scalar(DType::I64)], 4, 1, false, true);
        let p = plan(&f, FieldName::Actions, true, &args(Index::Int(-1), false, false)).unwrap();
        assert_eq!((p.positions, p.form, p.host_scalars), (Resolved::One(Pos::At(3)), Form::Item, true));
        let p = plan(&f, FieldName::Actions, true, &args(Index::All, false, false)).unwrap();
        assert_eq!((p.form, p.host_scalars), (Form::List, true));
        let p = plan(&numpyd(f), FieldName::Actions, true, &args(Index::Int(0), false, false)).unwrap();
        assert!(!p.host_scalars, "numpy'd fields read numpy scalars");
    }

    #[test]
    fn fill_only_slice_without_a_space_is_an_array_of_the_fill_but_rewards_are_float32() {
        // A reversed slice on an empty buffer: RLlib 2.60 fails; here it is the fill items.
        let f = numpyd(typed(vec![scalar(DType::F64)], 0, 0, false, false));
        let a = args(slice(Some(5), Some(-1)), true, false);
        let p = plan(&f, FieldName::Actions, true, &a).unwrap();
        assert_eq!(p.form, Form::Batch(BatchFill::FillOnly));
        let Resolved::Many(fills) = &p.positions else { panic!("a slice reads many") };
        assert!(!fills.is_empty() && fills.iter().all(|p| *p == Pos::Fill));
        let p = plan(&f, FieldName::Rewards, true, &a).unwrap();
        assert_eq!(p.fill_spec, FillSpec::RewardsF32);
        let rows = (0..fills.len()).collect();
        assert_eq!(p.form, Form::Batch(BatchFill::Promote { dtypes: vec![LeafDtype::Fill], rows }));
        // A slice's rewards have no float32 space (RLlib 2.60's `slice()`).
        let p = plan(&f, FieldName::Rewards, false, &a).unwrap();
        assert_eq!((p.fill_spec, p.form), (FillSpec::Raw, Form::Batch(BatchFill::FillOnly)));
    }

    #[test]
    fn fill_without_a_space_promotes_a_slice_and_stacks_a_list_like_rllib_batch() {
        let leaves = vec![scalar(DType::I64), Leaf::new(DType::F32, vec![2])];
        let f = numpyd(typed(leaves, 4, 0, false, false));
        // A slice with data: numpy's promotion per leaf (RLlib raises instead, its fill
        // batch not broadcast to the item shape).
        let p = plan(&f, FieldName::Observations, true, &args(slice(Some(-5), None), true, false)).unwrap();
        let promoted = vec![LeafDtype::Promoted; 2];
        assert_eq!(p.form, Form::Batch(BatchFill::Promote { dtypes: promoted.clone(), rows: vec![0] }));
        // A list starting with a fill: promoted too (no space of its own for the fill).
        let p =
            plan(&f, FieldName::Observations, true, &args(Index::List(vec![-9, 0]), true, false)).unwrap();
        assert_eq!(p.form, Form::Batch(BatchFill::Promote { dtypes: promoted, rows: vec![0] }));
        // A list starting with data: array leaves keep the stored dtype.
        let p = plan(&f, FieldName::Observations, true, &args(Index::List(vec![0, 9]), true, false)).unwrap();
        let dtypes = vec![LeafDtype::Promoted, LeafDtype::Stored];
        assert_eq!(p.form, Form::Batch(BatchFill::Promote { dtypes, rows: vec![1] }));
        // Rewards starting with a fill take the float32 space's dtype.
        let r = numpyd(typed(vec![scalar(DType::F64)], 4, 0, false, false));
        let p = plan(&r, FieldName::Rewards, true, &args(Index::List(vec![-9, 0]), true, false)).unwrap();
        assert_eq!(p.form, Form::Batch(BatchFill::Promote { dtypes: vec![LeafDtype::Fill], rows: vec![0] }));
    }

    #[test]
    fn fill_with_a_space_is_cast_to_it() {
        let f = numpyd(typed(vec![scalar(DType::I64)], 2, 0, true, false));
        let p = plan(&f, FieldName::Actions, true, &args(slice(Some(0), Some(4)), true, false)).unwrap();
        assert_eq!((p.form, p.fill_spec), (Form::Batch(BatchFill::Cast), FillSpec::Own));
        let p = plan(&f, FieldName::Actions, true, &args(slice(Some(0), Some(2)), true, false)).unwrap();
        assert_eq!(p.form, Form::Batch(BatchFill::None), "no fill rows");
    }

    #[test]
    fn one_hot_needs_a_space_only_where_data_is_read() {
        let f = typed(vec![scalar(DType::I64)], 3, 0, false, false);
        let hot = |index, fill| plan(&f, FieldName::Actions, true, &args(index, fill, true));
        let no_space = Err(ReadError::NoSpaceForOneHot { field: "action".into(), space: "action" });
        assert_eq!(hot(Index::Int(0), false), no_space);
        assert_eq!(hot(slice(Some(0), Some(2)), false), no_space);
        assert_eq!(hot(Index::All, false), no_space);
        // RLlib one-hot encodes even an empty data part (a slice's nominal length counts).
        let empty = typed(vec![scalar(DType::I64)], 0, 0, false, false);
        let p = plan(&empty, FieldName::Actions, true, &args(slice(Some(-6), Some(3)), true, true));
        assert_eq!(p, no_space);
        // Fill only: nothing to encode.
        assert!(hot(Index::Int(7), true).is_ok());
        // Lists go item by item: the first item decides between an index error and this.
        assert_eq!(hot(Index::List(vec![0, 9]), false), no_space);
        assert!(matches!(hot(Index::List(vec![9, 0]), false), Err(ReadError::Index(_))));
        let obs = plan(&f, FieldName::Observations, true, &args(Index::Int(0), false, true));
        assert_eq!(
            obs.unwrap_err().to_string(),
            "cannot one-hot encode the observation without a space: give the episode an observation space"
        );
    }

    #[test]
    fn one_hot_of_an_empty_numpyd_chunk_encodes_but_an_empty_slice_does_not() {
        // RLlib 2.60 fails on a zero-size one-hot; here it is a (0, n) batch.
        let f = numpyd(typed(vec![scalar(DType::I64)], 2, 2, true, false));
        let p = plan(&f, FieldName::Actions, true, &args(Index::All, false, true)).unwrap();
        assert_eq!((p.positions, p.one_hot), (Resolved::Many(vec![]), true));
        let p = plan(&f, FieldName::Actions, true, &args(slice(Some(1), Some(1)), false, true)).unwrap();
        assert!(!p.one_hot, "an empty slice comes back as stored");
    }

    #[test]
    fn forms_of_numpyd_fields() {
        let f = numpyd(typed(vec![scalar(DType::I64)], 2, 0, true, false));
        let empty = args(Index::List(vec![]), false, false);
        assert_eq!(plan(&f, FieldName::Actions, true, &empty), Err(ReadError::EmptyListBatch));
        let objects: F = numpyd(F::objects(vec!["a".into(), "b".into()], 0));
        let all = args(Index::All, false, false);
        assert_eq!(plan(&objects, FieldName::Observations, true, &all).unwrap().form, Form::ObjectArray);
        assert_eq!(
            plan(&objects, FieldName::Infos, true, &all).unwrap().form,
            Form::List,
            "infos stay lists"
        );
        let untyped: F = numpyd(F::untyped());
        assert_eq!(plan(&untyped, FieldName::Actions, true, &all).unwrap().form, Form::EmptyList);
        let mut infos: F = F::sparse();
        infos.push_sparse(None);
        infos.push_sparse(Some("i".into()));
        let p = plan(&infos, FieldName::Infos, true, &args(Index::List(vec![1, 5]), true, false)).unwrap();
        assert_eq!(p.stored_positions(), vec![1], "fills are not stored positions");
    }

    #[test]
    fn writes_take_one_value_per_item_or_a_batch() {
        let f = typed(vec![scalar(DType::I64)], 5, 2, false, false);
        let w = plan_write(&f, &Index::Int(-1), false, false).unwrap();
        assert_eq!(w, WritePlan { positions: vec![4], values: WriteValues::One });
        let w = plan_write(&f, &Index::All, false, false).unwrap();
        assert_eq!(w, WritePlan { positions: vec![2, 3, 4], values: WriteValues::Batch });
        let w = plan_write(&f, &Index::All, false, true).unwrap();
        assert_eq!(w.values, WriteValues::PerItem);
        let w = plan_write(&f, &Index::List(vec![-1, 0]), true, false).unwrap();
        assert_eq!(w, WritePlan { positions: vec![1, 2], values: WriteValues::PerItem });
        assert!(plan_write(&f, &Index::Int(9), false, false).is_err(), "writes never fill");
    }
}
