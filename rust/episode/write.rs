//! Writes into a single-agent episode's fields outside the recorded steps: items appended
//! (`extend`), an extra model output put in whole, items overwritten (`set`), one removed
//! (`pop`), and the infos a read hands out made first; with them the checks of a field's
//! compression setting and of a blank copy. The host converts its values as the core says
//! ([`Conversion`]); what is a batch, when a field turns into objects and which counts
//! must agree is decided here.

use super::field::{Conversion, Field, FieldSpec, Item, Storage};
use super::read::ReadPlan;
use super::single::{EpisodeError, FieldName, SingleAgentCore, ToObject};
use crate::column::ColumnError;

/// How the host takes data that is not one value per position (a batch) apart into items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitBatch {
    /// Into the rows of the field's layout, as [`SingleAgentCore::extend`] takes a batch:
    /// the field held typed items and turns into objects.
    Rows,
    /// As a sequence of items: the field holds objects.
    Items,
}

impl<O: Clone, S> SingleAgentCore<O, S> {
    /// The field `name`.
    ///
    /// Errors: [`EpisodeError::MissingKey`] for an extra model output key the episode lacks.
    pub fn require(&self, name: FieldName<'_>) -> Result<&Field<O, S>, EpisodeError> {
        self.field(name).ok_or_else(|| missing_key(name))
    }

    /// [`Self::require`], mutable.
    pub fn require_mut(&mut self, name: FieldName<'_>) -> Result<&mut Field<O, S>, EpisodeError> {
        self.field_mut(name).ok_or_else(|| missing_key(name))
    }

    /// Appends the values that `values` gives to field `name` (made, empty, for a new extra
    /// model output key, before the values are asked for), one at a time: `convert` turns
    /// each into an item as the field's [`Conversion`] says at that point (infos are kept
    /// as objects), so a first item types an empty field. A `batch` (the host's values were
    /// the rows of one array, not a list) marks the field finalized, as RLlib's buffers
    /// built from arrays are; infos stay a list.
    ///
    /// Errors: those of `values` and `convert`, and [`EpisodeError::DoesNotFit`] for an
    /// item the field's column does not take. The items before it stay appended.
    pub fn extend<V, I, B, E>(
        &mut self,
        name: FieldName<'_>,
        batch: bool,
        values: impl FnOnce() -> Result<I, E>,
        mut convert: impl FnMut(V, Conversion<'_, S>) -> Result<Item<O, B, S>, E>,
        mut to_object: impl ToObject<O, S>,
    ) -> Result<(), E>
    where
        S: FieldSpec,
        I: IntoIterator<Item = V>,
        B: AsRef<[u8]>,
        E: From<EpisodeError>,
    {
        if let FieldName::Extra(key) = name {
            self.extra_or_insert(key);
        }
        for value in values()? {
            let field = self.require(name)?;
            let conversion = if name == FieldName::Infos { Conversion::Object } else { field.conversion() };
            let item = convert(value, conversion)?;
            if !self.require_mut(name)?.push(item, &mut to_object) {
                return Err(EpisodeError::DoesNotFit { field: name.label() }.into());
            }
        }
        if batch && name != FieldName::Infos {
            self.require_mut(name)?.finalized = true;
        }
        Ok(())
    }

    /// Steps that the observations hold (one fewer than they, the reset observation not
    /// being a step's): the count [`Self::validate`] holds the other fields to.
    #[must_use]
    pub fn steps_observed(&self) -> usize {
        self.observations.len().saturating_sub(1)
    }

    /// Makes `field` the extra model output `key`, its first `lookback` items look-back: a
    /// new key goes last, an existing one is replaced in place.
    ///
    /// Errors: [`EpisodeError::ExtraLength`] unless the items after the look-back are one
    /// per step ([`Self::steps_observed`]); nothing changes then.
    pub fn put_extra(
        &mut self,
        key: &str,
        mut field: Field<O, S>,
        lookback: usize,
    ) -> Result<(), EpisodeError> {
        field.set_lookback(lookback);
        let steps = self.steps_observed();
        if field.len() != steps {
            return Err(EpisodeError::ExtraLength {
                key: key.to_string(),
                items: field.len(),
                lookback: field.lookback(),
                steps,
            });
        }
        *self.extra_or_insert(key) = field;
        Ok(())
    }

    /// RLlib's `set_extra_model_outputs` asserts that the key exists (reads of a missing
    /// key raise `KeyError` instead).
    ///
    /// Errors: [`EpisodeError::NoExtraToSet`] if the episode has no extra model output `key`.
    pub fn check_set_extra(&self, key: &str) -> Result<(), EpisodeError> {
        match self.extra(key) {
            Some(_) => Ok(()),
            None => Err(EpisodeError::NoExtraToSet { key: key.to_string() }),
        }
    }

    /// Overwrites the items at the stored `positions` of field `name` (RLlib's `set_*`,
    /// planned by [`crate::episode::read::plan_write`]); `given` is the number of values
    /// the host has, where it knows it before converting them.
    ///
    /// A typed field with a spec takes the values as `typed` lays them out by it (one
    /// buffer per leaf, the items back to back). Where they do not fit, a field whose spec
    /// is a space's fails with `typed`'s error; any other turns into objects (a layout
    /// inferred from the first item binds nothing) and takes `objects`. A field of objects
    /// takes `objects`; any other field fails with [`EpisodeError::NoData`], unless no
    /// position is selected.
    ///
    /// Errors: a count that is not one value per position
    /// ([`ColumnError::SetLength`]), those of `typed` and `objects`, and the above. The
    /// counts are checked before anything changes, and nothing changes on any error.
    #[allow(clippy::too_many_arguments)]
    pub fn set_items<E: From<EpisodeError>>(
        &mut self,
        name: FieldName<'_>,
        positions: &[usize],
        given: Option<usize>,
        typed: impl FnOnce(&S) -> Result<Vec<Vec<u8>>, E>,
        objects: impl FnOnce(SplitBatch) -> Result<Vec<O>, E>,
        to_object: impl ToObject<O, S>,
    ) -> Result<(), E>
    where
        S: FieldSpec,
    {
        let count = |n: usize| ColumnError::check_set_len(positions.len(), n).map_err(EpisodeError::from);
        if let Some(n) = given {
            count(n)?;
        }
        let field = self.require_mut(name)?;
        let converted = match field.conversion() {
            Conversion::Bytes { spec, strict } => Some((typed(spec), strict)),
            _ => None,
        };
        let split = match converted {
            Some((Ok(leaves), _)) => {
                let Storage::Typed { column, .. } = &mut field.storage else {
                    unreachable!("a field converts to bytes only when it is typed")
                };
                let refs: Vec<&[u8]> = leaves.iter().map(Vec::as_slice).collect();
                return column.overwrite_many(positions, &refs).map_err(|e| EpisodeError::from(e).into());
            }
            Some((Err(e), true)) => return Err(e),
            Some((Err(_), false)) => SplitBatch::Rows,
            None => SplitBatch::Items,
        };
        if split == SplitBatch::Items
            && !matches!(field.storage, Storage::Objects { .. } | Storage::Sparse { .. })
        {
            if positions.is_empty() {
                return Ok(());
            }
            return Err(EpisodeError::NoData { field: name.label() }.into());
        }
        let items = objects(split)?;
        count(items.len())?;
        // A typed field that did not take the values keeps objects from now on, as a step
        // with a value that does not fit its layout makes it.
        field.make_objects(to_object);
        for (&p, item) in positions.iter().zip(items) {
            field.set_object(p, item);
        }
        Ok(())
    }

    /// Removes the item at `index` of all stored items of field `name`, look-back included
    /// (negative: from the end), as RLlib's `InfiniteLookbackBuffer.pop`. Returns the
    /// position removed.
    ///
    /// Errors: [`EpisodeError::MissingKey`], and [`EpisodeError::PopOutOfRange`] if there
    /// is no such item (nothing changes).
    pub fn pop(&mut self, name: FieldName<'_>, index: i64) -> Result<usize, EpisodeError> {
        let field = self.require_mut(name)?;
        let total = field.geometry().total;
        field.pop(index).ok_or(EpisodeError::PopOutOfRange { index, total, field: name.host_name() })
    }

    /// Stores field `name`'s typed column compressed in blocks of `rows` items (`None`:
    /// uncompressed); reads are unchanged either way.
    ///
    /// Errors: [`EpisodeError::MissingKey`], and [`EpisodeError::NoTypedColumn`] for a
    /// field without a typed column (no space and no data yet, or objects).
    pub fn set_field_compression(
        &mut self,
        name: FieldName<'_>,
        rows: Option<usize>,
    ) -> Result<(), EpisodeError> {
        match &mut self.require_mut(name)?.storage {
            Storage::Typed { column, .. } => {
                column.set_compression(rows);
                Ok(())
            }
            _ => Err(EpisodeError::NoTypedColumn { field: name.host_name() }),
        }
    }

    /// A copy of this episode while nothing is recorded in it: its layouts and specs (a
    /// runner's next episode, without inferring them from the spaces again).
    ///
    /// Errors: [`EpisodeError::NotBlank`] if the episode was reset.
    pub fn blank_copy(&self) -> Result<SingleAgentCore<O, S>, EpisodeError> {
        if self.is_reset() {
            return Err(EpisodeError::NotBlank);
        }
        Ok(self.clone())
    }

    /// Before a read of field `name` (`plan`) hands out infos, makes the absent ones
    /// (`make`) in this episode, so that later reads hand out the same objects (positions
    /// past the stored items, a view's added one, are skipped). Returns whether any was
    /// made: a view of the field taken before is then out of date.
    pub fn share_read_infos(
        &mut self,
        name: FieldName<'_>,
        plan: &ReadPlan,
        make: impl FnMut() -> O,
    ) -> bool {
        name == FieldName::Infos && self.infos.materialize(&plan.stored_positions(), make) > 0
    }
}

fn missing_key(name: FieldName<'_>) -> EpisodeError {
    match name {
        FieldName::Extra(key) => EpisodeError::MissingKey(key.to_string()),
        _ => EpisodeError::MissingKey(name.label()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::column::{IndexError, Pos, Resolved};
    use crate::episode::field::TypedItem;
    use crate::episode::read::{FillSpec, Form};
    use crate::schema::{DType, Leaf, Schema};

    /// A test spec: whether it comes from a space.
    #[derive(Debug, PartialEq)]
    struct Space(bool);

    impl FieldSpec for Space {
        fn is_from_space(&self) -> bool {
            self.0
        }
    }

    type Core = SingleAgentCore<String, Space>;
    type TestItem = Item<String, Vec<u8>, Space>;

    fn i64_schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![Leaf::new(DType::I64, vec![])]))
    }

    /// The host's conversion in these tests: a number is an i64 item where the field
    /// converts to bytes or infers (its first item), anything else an object; `strict`
    /// specs refuse non-numbers.
    fn convert(value: &str, conversion: Conversion<'_, Space>) -> Result<TestItem, EpisodeError> {
        let number = value.parse::<i64>().ok().map(|v| vec![v.to_ne_bytes().to_vec()]);
        match (conversion, number) {
            (Conversion::Object, _) | (Conversion::Infer | Conversion::Bytes { strict: false, .. }, None) => {
                Ok(Item::Object(value.to_string()))
            }
            (Conversion::Bytes { .. }, Some(leaves)) => Ok(Item::Bytes(leaves.into())),
            (Conversion::Infer, Some(leaves)) => Ok(Item::FirstTyped {
                schema: i64_schema(),
                leaves: leaves.into(),
                host_scalars: true,
                spec: Some(Arc::new(Space(false))),
            }),
            (Conversion::First(_) | Conversion::Bytes { strict: true, .. }, None) => {
                Err(EpisodeError::DoesNotFit { field: "strict".into() })
            }
            (Conversion::First(_), Some(leaves)) => Ok(Item::FirstTyped {
                schema: i64_schema(),
                leaves: leaves.into(),
                host_scalars: false,
                spec: None,
            }),
        }
    }

    fn as_text(t: TypedItem<'_, Space>) -> String {
        i64::from_ne_bytes(t.column.item(0, t.pos)[..].try_into().unwrap()).to_string()
    }

    /// The items of a field as text (typed ones decoded), look-back included.
    fn texts(f: &Field<String, Space>) -> Vec<String> {
        match &f.storage {
            Storage::Typed { column, .. } => (0..column.total())
                .map(|pos| as_text(TypedItem { column, spec: None, pos, host_scalar: false }))
                .collect(),
            _ => (0..f.geometry().total).map(|p| f.object(p).cloned().unwrap_or_default()).collect(),
        }
    }

    fn extend(
        core: &mut Core,
        name: FieldName<'_>,
        values: &[&str],
        batch: bool,
    ) -> Result<(), EpisodeError> {
        let values: Vec<String> = values.iter().map(|v| (*v).to_string()).collect();
        core.extend(name, batch, || Ok(values), |v: String, c| convert(&v, c), as_text)
    }

    /// An episode of `steps` steps, every field typed from its first item.
    fn episode(steps: i64) -> Core {
        let mut core = Core::default();
        let obs: Vec<String> = (0..=steps).map(|v| v.to_string()).collect();
        let obs: Vec<&str> = obs.iter().map(String::as_str).collect();
        extend(&mut core, FieldName::Observations, &obs, false).unwrap();
        extend(&mut core, FieldName::Actions, &obs[1..], false).unwrap();
        extend(&mut core, FieldName::Rewards, &obs[1..], false).unwrap();
        for _ in 0..=steps {
            core.infos.push_sparse(None);
        }
        core.t = steps;
        core
    }

    #[test]
    fn extend_types_a_field_from_its_first_item_and_a_batch_finalizes_it() {
        let mut core = Core::default();
        extend(&mut core, FieldName::Actions, &["1", "2"], false).unwrap();
        assert!(matches!(core.actions.storage, Storage::Typed { .. }));
        assert!(!core.actions.finalized, "a list of items");
        extend(&mut core, FieldName::Actions, &["3"], true).unwrap();
        assert_eq!(
            (texts(&core.actions), core.actions.finalized),
            (vec!["1".into(), "2".into(), "3".into()], true)
        );
        // A value without the inferred layout turns the field into objects.
        extend(&mut core, FieldName::Actions, &["x"], false).unwrap();
        assert!(matches!(core.actions.storage, Storage::Objects { .. }));
        assert_eq!(texts(&core.actions), vec!["1", "2", "3", "x"]);
    }

    #[test]
    fn extend_keeps_infos_as_objects_and_never_finalizes_them() {
        let mut core = Core::default();
        extend(&mut core, FieldName::Infos, &["1", "a"], true).unwrap();
        assert!(matches!(core.infos.storage, Storage::Sparse { total: 2, .. }));
        assert_eq!((texts(&core.infos), core.infos.finalized), (vec!["1".into(), "a".into()], false));
    }

    #[test]
    fn extend_makes_a_missing_extra_key_before_asking_for_the_values() {
        let mut core = Core::default();
        let failed: Result<(), EpisodeError> = core.extend(
            FieldName::Extra("logp"),
            true,
            || Err::<Vec<String>, _>(EpisodeError::NoObservations),
            |v: String, c| convert(&v, c),
            as_text,
        );
        assert_eq!(failed, Err(EpisodeError::NoObservations));
        assert!(core.extra("logp").is_some_and(|f| f.is_empty() && !f.finalized));
        extend(&mut core, FieldName::Extra("logp"), &["5"], true).unwrap();
        assert_eq!(texts(core.extra("logp").unwrap()), vec!["5"]);
    }

    #[test]
    fn extend_refuses_an_item_its_column_does_not_take_after_storing_the_ones_before() {
        let mut core = Core::default();
        core.observations.spec = Some(Arc::new(Space(true)));
        core.observations.storage = Field::<String, Space>::typed(i64_schema(), false).storage;
        let odd = |v: String, c: Conversion<'_, Space>| -> Result<TestItem, EpisodeError> {
            if v == "short" {
                return Ok(Item::Bytes(vec![vec![0u8; 3]].into()));
            }
            convert(&v, c)
        };
        let values = vec!["1".to_string(), "short".into(), "2".into()];
        let r = core.extend(FieldName::Observations, false, || Ok(values), odd, as_text);
        assert_eq!(r, Err(EpisodeError::DoesNotFit { field: "observation".into() }));
        assert_eq!(texts(&core.observations), vec!["1"]);
        assert!(
            extend(&mut core, FieldName::Observations, &["y"], false).is_err(),
            "a space's layout is strict"
        );
    }

    #[test]
    fn put_extra_needs_one_item_per_step_after_the_lookback() {
        let mut core = episode(3);
        let items = |values: &[&str]| {
            let mut scratch = Core::default();
            extend(&mut scratch, FieldName::Extra("k"), values, false).unwrap();
            std::mem::take(scratch.extra_or_insert("k"))
        };
        let err = core.put_extra("k", items(&["1", "2", "3"]), 1).unwrap_err();
        assert_eq!(err, EpisodeError::ExtraLength { key: "k".into(), items: 2, lookback: 1, steps: 3 });
        assert_eq!(
            err.to_string(),
            "extra_model_outputs[\"k\"]: 2 items after a look-back of 1, but the episode has 3 steps"
        );
        assert!(core.extra("k").is_none(), "nothing changes");
        core.put_extra("k", items(&["0", "1", "2", "3"]), 1).unwrap();
        core.put_extra("j", items(&["7", "8", "9"]), 0).unwrap();
        core.put_extra("k", items(&["1", "2", "3"]), 0).unwrap();
        let keys: Vec<&str> = core.extra_model_outputs.iter().map(|(k, _)| &**k).collect();
        assert_eq!(keys, vec!["k", "j"], "a replaced key keeps its place");
        assert_eq!(
            (texts(core.extra("k").unwrap()), core.extra("k").unwrap().lookback()),
            (vec!["1".into(), "2".into(), "3".into()], 0)
        );
        core.validate().unwrap();
        // The steps are the observations' (what validate holds the fields to), not `t`.
        core.t = 7;
        assert_eq!(core.steps_observed(), 3);
        assert_eq!(Core::default().steps_observed(), 0);
    }

    #[test]
    fn set_extra_needs_the_key() {
        let mut core = episode(1);
        assert_eq!(core.check_set_extra("k"), Err(EpisodeError::NoExtraToSet { key: "k".into() }));
        core.extra_or_insert("k");
        assert_eq!(core.check_set_extra("k"), Ok(()));
    }

    /// Sets `values` at `positions` of field `name` as the host would (values that do not
    /// parse as numbers do not convert to bytes).
    fn set(
        core: &mut Core,
        name: FieldName<'_>,
        positions: &[usize],
        values: &[&str],
    ) -> Result<(), EpisodeError> {
        let typed = |_: &Space| -> Result<Vec<Vec<u8>>, EpisodeError> {
            let mut leaf = Vec::new();
            for v in values {
                let v = v.parse::<i64>().map_err(|_| EpisodeError::DoesNotFit { field: "typed".into() })?;
                leaf.extend_from_slice(&v.to_ne_bytes());
            }
            Ok(vec![leaf])
        };
        let objects = |_| Ok(values.iter().map(|v| (*v).to_string()).collect());
        core.set_items(name, positions, Some(values.len()), typed, objects, as_text)
    }

    #[test]
    fn set_overwrites_typed_items_in_place() {
        let mut core = episode(3);
        set(&mut core, FieldName::Actions, &[0, 2], &["10", "30"]).unwrap();
        assert!(matches!(core.actions.storage, Storage::Typed { .. }));
        assert_eq!(texts(&core.actions), vec!["10", "2", "30"]);
    }

    #[test]
    fn set_counts_before_anything_changes() {
        let mut core = episode(3);
        let before = core.clone();
        let too_many = EpisodeError::Column(ColumnError::SetLength { selected: 2, given: 3 });
        assert_eq!(set(&mut core, FieldName::Actions, &[0, 1], &["1", "2", "3"]), Err(too_many.clone()));
        assert_eq!(set(&mut core, FieldName::Actions, &[0, 1], &["x", "2", "3"]), Err(too_many));
        // Values the host did not count first: the objects are counted before the switch.
        let r: Result<(), EpisodeError> = core.set_items(
            FieldName::Actions,
            &[0, 1],
            None,
            |_| Err(EpisodeError::DoesNotFit { field: "typed".into() }),
            |split| {
                assert_eq!(split, SplitBatch::Rows);
                Ok(vec!["x".into()])
            },
            as_text,
        );
        assert_eq!(r, Err(EpisodeError::Column(ColumnError::SetLength { selected: 2, given: 1 })));
        assert_eq!(core, before);
    }

    #[test]
    fn a_strict_field_refuses_a_misfit_and_an_inferred_one_turns_into_objects() {
        let mut core = episode(2);
        core.actions.spec = Some(Arc::new(Space(true)));
        let before = core.clone();
        assert_eq!(
            set(&mut core, FieldName::Actions, &[1], &["x"]),
            Err(EpisodeError::DoesNotFit { field: "typed".into() })
        );
        assert_eq!(core, before);
        set(&mut core, FieldName::Rewards, &[1], &["x"]).unwrap();
        assert!(matches!(core.rewards.storage, Storage::Objects { .. }));
        assert_eq!(texts(&core.rewards), vec!["1", "x"]);
        // Objects take objects from now on, counted the same way.
        set(&mut core, FieldName::Rewards, &[0], &["5"]).unwrap();
        assert_eq!(texts(&core.rewards), vec!["5", "x"]);
        set(&mut core, FieldName::Infos, &[2], &["info"]).unwrap();
        assert_eq!(core.infos.object(2).map(String::as_str), Some("info"));
    }

    #[test]
    fn a_field_without_data_takes_only_an_empty_selection() {
        let mut core = Core::default();
        assert_eq!(set(&mut core, FieldName::Actions, &[], &[]), Ok(()));
        assert_eq!(
            set(&mut core, FieldName::Actions, &[0], &["1"]),
            Err(EpisodeError::NoData { field: "action".into() })
        );
        assert_eq!(
            EpisodeError::NoData { field: "action".into() }.to_string(),
            "cannot set the action: the field holds no data"
        );
        // Typed items of no known spec hold nothing a write can convert into.
        let mut typed = episode(1);
        typed.actions.spec = None;
        assert_eq!(
            set(&mut typed, FieldName::Actions, &[0], &["1"]),
            Err(EpisodeError::NoData { field: "action".into() })
        );
        assert_eq!(
            set(&mut typed, FieldName::Extra("k"), &[0], &["1"]),
            Err(EpisodeError::MissingKey("k".into()))
        );
    }

    #[test]
    fn pop_names_the_field_when_out_of_range() {
        let mut core = episode(2);
        assert_eq!(core.pop(FieldName::Actions, -1), Ok(1));
        let err = core.pop(FieldName::Actions, 5).unwrap_err();
        assert_eq!(err, EpisodeError::PopOutOfRange { index: 5, total: 1, field: "actions" });
        assert_eq!(err.to_string(), "pop index 5 out of range for 1 stored items of the actions");
        assert_eq!(core.pop(FieldName::Extra("k"), 0), Err(EpisodeError::MissingKey("k".into())));
        assert_eq!(texts(&core.actions), vec!["1"]);
    }

    #[test]
    fn a_read_makes_the_infos_it_hands_out_once() {
        let mut core = episode(2);
        let mut made = 0;
        let mut make = || {
            made += 1;
            format!("new{made}")
        };
        let plan = |positions: &[usize]| ReadPlan {
            positions: Resolved::Many(positions.iter().map(|&p| Pos::At(p)).chain([Pos::Fill]).collect()),
            form: Form::List,
            one_hot: false,
            host_scalars: false,
            fill_spec: FillSpec::Raw,
        };
        assert!(!core.share_read_infos(FieldName::Actions, &plan(&[0]), &mut make), "only infos");
        assert!(core.share_read_infos(FieldName::Infos, &plan(&[0, 2, 9]), &mut make));
        assert!(!core.share_read_infos(FieldName::Infos, &plan(&[0, 2]), &mut make), "made once");
        assert_eq!(texts(&core.infos), vec!["new1", "", "new2"]);
    }

    #[test]
    fn compression_needs_a_typed_column() {
        let mut core = episode(4);
        assert_eq!(core.set_field_compression(FieldName::Observations, Some(2)), Ok(()));
        assert_eq!(core.observations.compression(), Some(2));
        let err = core.set_field_compression(FieldName::Infos, Some(2)).unwrap_err();
        assert_eq!(err, EpisodeError::NoTypedColumn { field: "infos" });
        assert!(err.to_string().starts_with("_set_compression: the infos field holds no typed column"));
        assert_eq!(
            Core::default().set_field_compression(FieldName::Extra("k"), None),
            Err(EpisodeError::MissingKey("k".into()))
        );
        assert_eq!(
            Core::default().set_field_compression(FieldName::Actions, Some(2)),
            Err(EpisodeError::NoTypedColumn { field: "actions" }),
            "an untyped field is refused (a multi-agent setting goes through Field::set_compression)"
        );
    }

    #[test]
    fn only_a_blank_episode_is_copied_blank() {
        let mut blank = Core::default();
        blank.observations.spec = Some(Arc::new(Space(true)));
        assert_eq!(blank.blank_copy().as_ref(), Ok(&blank));
        assert_eq!(episode(0).blank_copy(), Err(EpisodeError::NotBlank));
    }

    #[test]
    fn to_numpy_needs_an_observation() {
        let mut core = Core::default();
        assert_eq!(core.to_numpy(), Err(EpisodeError::NoObservations));
        assert!(!core.observations.finalized);
        let mut core = episode(0);
        core.to_numpy().unwrap();
        assert!(core.observations.finalized);
    }

    #[test]
    fn a_slice_step_of_zero_is_an_index_error() {
        for steps in [0, 3] {
            let mut core = episode(steps);
            let r = core.slice_sharing_infos(None, None, Some(0), None, String::new);
            assert_eq!(r.err(), Some(EpisodeError::Index(IndexError::ZeroStep)));
        }
    }
}
