//! The single-agent episode's bookkeeping: RLlib 2.60 `SingleAgentEpisode` semantics over
//! [`Field`]s.
//!
//! Observations and infos hold one item more than actions and rewards (the reset
//! observation). All fields share the look-back of the chunk: a cut keeps the last `k`
//! steps as look-back of its successor, so the successor can still read them.

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use super::field::{Field, Item, Storage, TypedItem};
use crate::column::{Column, ColumnError, Index, IndexError, Resolved};
use crate::schema::Schema;

/// Errors of episode operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EpisodeError {
    /// `add_env_reset` on an episode that already has observations.
    AlreadyReset,
    /// `add_env_step` before any observation.
    NotReset,
    /// `add_env_reset` on an episode that continues another (`t_started` is not 0).
    ResetNotAtStart {
        t_started: i64,
    },
    /// Data added to, or a cut of, a terminated or truncated episode.
    Done {
        what: &'static str,
    },
    /// The fields' lengths do not agree.
    Inconsistent(String),
    /// `concat_episode` of an episode that does not continue this one.
    NotContinuation(String),
    /// An item that does not fit its field (the binding layer checks first, so this
    /// means a bug there).
    Item {
        field: String,
    },
    Index(IndexError),
    /// A host value that its field does not take (the field's column is of another
    /// layout); `field` is the field's label ([`FieldName::label`]).
    DoesNotFit {
        field: String,
    },
    /// `to_numpy` of an episode without any observation.
    NoObservations,
    /// A field the episode lacks (only extra model outputs can be missing).
    MissingKey(String),
    /// `set_extra_model_outputs` of a key the episode lacks (RLlib asserts it exists).
    NoExtraToSet {
        key: String,
    },
    /// Extra model outputs put in whole whose items after the look-back are not one per
    /// step of the episode.
    ExtraLength {
        key: String,
        items: usize,
        lookback: usize,
        steps: usize,
    },
    /// `pop` of an item that is not stored (`field`: the field's host name).
    PopOutOfRange {
        index: i64,
        total: usize,
        field: &'static str,
    },
    /// A write into a field that holds no items it could overwrite (`field`: its label).
    NoData {
        field: String,
    },
    /// A column operation's error (a write's count, an item's layout).
    Column(ColumnError),
    /// A copy of a blank episode asked of one that holds data.
    NotBlank,
    /// Compression set on a field without a typed column (`field`: its host name).
    NoTypedColumn {
        field: &'static str,
    },
}

impl fmt::Display for EpisodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EpisodeError::AlreadyReset => {
                f.write_str("add_env_reset: the episode has already been reset (it holds observations)")
            }
            EpisodeError::NotReset => f.write_str("add_env_step: call add_env_reset first"),
            EpisodeError::ResetNotAtStart { t_started } => write!(
                f,
                "add_env_reset: a reset starts at t=0, this episode starts at t_started={t_started}"
            ),
            EpisodeError::Done { what } => {
                write!(f, "{what}: the episode is done (terminated or truncated)")
            }
            EpisodeError::Inconsistent(m) | EpisodeError::NotContinuation(m) => f.write_str(m),
            EpisodeError::Item { field } => write!(f, "the {field} item does not fit its column"),
            EpisodeError::Index(e) => e.fmt(f),
            EpisodeError::DoesNotFit { field } => write!(f, "{field} does not fit its column"),
            EpisodeError::NoObservations => {
                f.write_str("to_numpy: the episode holds no observations (call add_env_reset first)")
            }
            EpisodeError::MissingKey(key) => f.write_str(key),
            EpisodeError::NoExtraToSet { key } => {
                write!(f, "set_extra_model_outputs: there is no extra model output {key:?} to set")
            }
            EpisodeError::ExtraLength { key, items, lookback, steps } => write!(
                f,
                "extra_model_outputs[{key:?}]: {items} items after a look-back of {lookback}, but the \
                 episode has {steps} steps"
            ),
            EpisodeError::PopOutOfRange { index, total, field } => {
                write!(f, "pop index {index} out of range for {total} stored items of the {field}")
            }
            EpisodeError::NoData { field } => write!(f, "cannot set the {field}: the field holds no data"),
            EpisodeError::Column(e) => e.fmt(f),
            EpisodeError::NotBlank => {
                f.write_str("_blank_into: the episode holds data; only a blank episode is copied this way")
            }
            EpisodeError::NoTypedColumn { field } => write!(
                f,
                "_set_compression: the {field} field holds no typed column (give its space, or add data \
                 that fits one, first)"
            ),
        }
    }
}

impl std::error::Error for EpisodeError {}

impl From<IndexError> for EpisodeError {
    fn from(e: IndexError) -> Self {
        EpisodeError::Index(e)
    }
}

impl From<ColumnError> for EpisodeError {
    fn from(e: ColumnError) -> Self {
        EpisodeError::Column(e)
    }
}

/// Names a field of a single-agent episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldName<'a> {
    Observations,
    Infos,
    Actions,
    Rewards,
    Extra(&'a str),
}

impl<'a> FieldName<'a> {
    /// The field that the host names `field` (with `key` for an extra model output).
    #[must_use]
    pub fn parse(field: &str, key: Option<&'a str>) -> Option<FieldName<'a>> {
        Some(match (field, key) {
            ("observations", _) => FieldName::Observations,
            ("infos", _) => FieldName::Infos,
            ("actions", _) => FieldName::Actions,
            ("rewards", _) => FieldName::Rewards,
            ("extra_model_outputs", Some(k)) => FieldName::Extra(k),
            _ => return None,
        })
    }

    /// The host's name of the field (what [`Self::parse`] takes).
    #[must_use]
    pub fn host_name(self) -> &'static str {
        match self {
            FieldName::Observations => "observations",
            FieldName::Infos => "infos",
            FieldName::Actions => "actions",
            FieldName::Rewards => "rewards",
            FieldName::Extra(_) => "extra_model_outputs",
        }
    }

    /// How messages name one item of the field ("observation", "extra model output \"k\"").
    #[must_use]
    pub fn label(self) -> String {
        match self {
            FieldName::Observations => "observation".into(),
            FieldName::Infos => "infos".into(),
            FieldName::Actions => "action".into(),
            FieldName::Rewards => "reward".into(),
            FieldName::Extra(k) => format!("extra model output {k:?}"),
        }
    }
}

/// Turns an item of a typed column (with its field's spec) into a host object.
pub trait ToObject<O, S>: FnMut(TypedItem<'_, S>) -> O {}
impl<O, S, F: FnMut(TypedItem<'_, S>) -> O> ToObject<O, S> for F {}

/// The data of one environment step, converted by the caller.
pub struct Step<'a, O, B = Vec<u8>, S = ()> {
    pub observation: Item<O, B, S>,
    pub action: Item<O, B, S>,
    pub reward: Item<O, B, S>,
    /// The step's infos; `None` when none were given (absent until first read).
    pub info: Option<O>,
    /// Extra model outputs by key (borrowed: a key is copied only when first seen).
    pub extra_model_outputs: Vec<(&'a str, Item<O, B, S>)>,
    pub terminated: bool,
    pub truncated: bool,
}

/// An episode's field sizes (items, look-back included), `t` and done flags.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpisodeSizes {
    pub t: i64,
    pub terminated: bool,
    pub truncated: bool,
    pub obs_lookback: usize,
    pub obs_total: usize,
    pub infos_total: usize,
    pub actions_total: usize,
    pub rewards_total: usize,
    /// Items per extra model output key, in the episode's key order.
    pub extra_totals: Vec<usize>,
}

impl EpisodeSizes {
    /// Whether the episode is terminated or truncated.
    #[must_use]
    pub fn done(&self) -> bool {
        self.terminated || self.truncated
    }
}

/// The fields and counters of a single-agent episode (`S`: the host's spec of a field's
/// items, see [`Field`]).
#[derive(Debug, PartialEq)]
pub struct SingleAgentCore<O, S = ()> {
    pub observations: Field<O, S>,
    pub infos: Field<O, S>,
    pub actions: Field<O, S>,
    pub rewards: Field<O, S>,
    /// Extra model outputs by key, in the order the keys first appeared.
    pub extra_model_outputs: Vec<(Arc<str>, Field<O, S>)>,
    /// RLlib gives its rewards buffer a float32 scalar space, which shapes the rewards'
    /// fills (float32) where no space of their own does; its `slice()` builds the buffer
    /// without one (RLlib 2.60), so a slice's fills are not cast.
    pub rewards_fill_f32: bool,
    pub t_started: i64,
    pub t: i64,
    pub is_terminated: bool,
    pub is_truncated: bool,
}

impl<O: Clone, S> Clone for SingleAgentCore<O, S> {
    fn clone(&self) -> Self {
        SingleAgentCore {
            observations: self.observations.clone(),
            infos: self.infos.clone(),
            actions: self.actions.clone(),
            rewards: self.rewards.clone(),
            extra_model_outputs: self.extra_model_outputs.clone(),
            rewards_fill_f32: self.rewards_fill_f32,
            t_started: self.t_started,
            t: self.t,
            is_terminated: self.is_terminated,
            is_truncated: self.is_truncated,
        }
    }
}

impl<O: Clone, S> Default for SingleAgentCore<O, S> {
    fn default() -> Self {
        SingleAgentCore {
            observations: Field::untyped(),
            infos: Field::sparse(),
            actions: Field::untyped(),
            rewards: Field::untyped(),
            extra_model_outputs: Vec::new(),
            rewards_fill_f32: true,
            t_started: 0,
            t: 0,
            is_terminated: false,
            is_truncated: false,
        }
    }
}

impl<O: Clone, S> SingleAgentCore<O, S> {
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.is_terminated || self.is_truncated
    }

    /// RLlib's `is_reset`: the chunk holds at least one observation.
    #[must_use]
    pub fn is_reset(&self) -> bool {
        !self.observations.is_empty()
    }

    /// Steps in the chunk (`t - t_started`).
    #[must_use]
    pub fn len(&self) -> usize {
        usize::try_from(self.t - self.t_started).unwrap_or(0)
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The extra-model-output field under `key`.
    #[must_use]
    pub fn extra(&self, key: &str) -> Option<&Field<O, S>> {
        self.extra_model_outputs.iter().find(|(k, _)| same_str(k, key)).map(|(_, f)| f)
    }

    pub fn extra_mut(&mut self, key: &str) -> Option<&mut Field<O, S>> {
        self.extra_model_outputs.iter_mut().find(|(k, _)| same_str(k, key)).map(|(_, f)| f)
    }

    /// The field `name`; `None` for an extra model output key the episode lacks.
    #[must_use]
    pub fn field(&self, name: FieldName<'_>) -> Option<&Field<O, S>> {
        match name {
            FieldName::Observations => Some(&self.observations),
            FieldName::Infos => Some(&self.infos),
            FieldName::Actions => Some(&self.actions),
            FieldName::Rewards => Some(&self.rewards),
            FieldName::Extra(k) => self.extra(k),
        }
    }

    /// [`Self::field`], mutable.
    pub fn field_mut(&mut self, name: FieldName<'_>) -> Option<&mut Field<O, S>> {
        match name {
            FieldName::Observations => Some(&mut self.observations),
            FieldName::Infos => Some(&mut self.infos),
            FieldName::Actions => Some(&mut self.actions),
            FieldName::Rewards => Some(&mut self.rewards),
            FieldName::Extra(k) => self.extra_mut(k),
        }
    }

    /// The extra model output `key`, made (empty, untyped, last) if the episode lacks it.
    pub fn extra_or_insert(&mut self, key: &str) -> &mut Field<O, S> {
        let found = self.extra_model_outputs.iter().position(|(k, _)| same_str(k, key));
        let i = found.unwrap_or_else(|| {
            self.extra_model_outputs.push((super::intern_key(key), Field::untyped()));
            self.extra_model_outputs.len() - 1
        });
        &mut self.extra_model_outputs[i].1
    }

    /// RLlib's `to_numpy`: from now on reads return batched arrays. Observations always
    /// switch; actions, rewards and extra model outputs only once the chunk has a step;
    /// infos never (they stay a list of dicts).
    ///
    /// Also gives back every buffer's spare capacity: a numpy'd chunk is what a runner
    /// hands out and a learner holds, usually without appending to it again (appending
    /// still works, growing the buffers anew).
    ///
    /// Errors: [`EpisodeError::NoObservations`] if the episode holds no observation (not
    /// even in its look-back), then the errors of [`Self::validate`]; nothing changes then.
    pub fn to_numpy(&mut self) -> Result<(), EpisodeError> {
        if self.observations.geometry().total == 0 {
            return Err(EpisodeError::NoObservations);
        }
        self.validate()?;
        self.shrink_to_fit();
        self.observations.finalized = true;
        if !self.is_empty() {
            self.actions.finalized = true;
            self.rewards.finalized = true;
            for (_, field) in &mut self.extra_model_outputs {
                field.finalized = true;
            }
        }
        Ok(())
    }

    /// Makes room in every typed column for the steps left until the episode is
    /// `expected_len` env steps long (its env step now is `t`), but for no more than
    /// `max_steps` more steps (the steps a runner has left before it cuts the chunk), so
    /// that the columns are not copied as they grow by doubling and, when the guess is
    /// right, not copied again when `to_numpy` shrinks them (runners pass the length of
    /// the episodes they saw end; see `single_agent_record_vector_step`). Small columns
    /// too: a CartPole chunk's columns would otherwise be reallocated five times on their
    /// way to 20 steps: about a quarter of the record's time with 1024 sub-envs.
    pub fn reserve_until(&mut self, expected_len: i64, max_steps: usize) {
        let Ok(left) = usize::try_from(expected_len - self.t) else { return };
        let left = left.min(max_steps);
        if left == 0 {
            return;
        }
        let fields = [&mut self.observations, &mut self.actions, &mut self.rewards]
            .into_iter()
            .chain(self.extra_model_outputs.iter_mut().map(|(_, f)| f));
        for field in fields {
            if let Storage::Typed { column, .. } = &mut field.storage {
                column.reserve(left);
            }
        }
    }

    /// Seals every item of the compressed typed columns (see [`Column::seal_all`]): for a
    /// chunk that receives no more steps (a done episode, a chunk a runner hands out).
    /// Reads are unchanged; a later step or concat still works.
    pub fn seal(&mut self) {
        let fields = [&mut self.observations, &mut self.actions, &mut self.rewards]
            .into_iter()
            .chain(self.extra_model_outputs.iter_mut().map(|(_, f)| f));
        for field in fields {
            if let Storage::Typed { column, .. } = &mut field.storage {
                column.seal_all();
            }
        }
    }

    /// Gives back the spare capacity of every field's buffers.
    pub fn shrink_to_fit(&mut self) {
        self.observations.shrink_to_fit();
        self.infos.shrink_to_fit();
        self.actions.shrink_to_fit();
        self.rewards.shrink_to_fit();
        for (_, field) in &mut self.extra_model_outputs {
            field.shrink_to_fit();
        }
        self.extra_model_outputs.shrink_to_fit();
    }

    /// Sum of the chunk's rewards, when they are stored typed as one numeric scalar leaf.
    #[must_use]
    pub fn typed_return(&self) -> Option<f64> {
        let crate::episode::Storage::Typed { column, .. } = &self.rewards.storage else {
            return if self.rewards.is_empty() { Some(0.0) } else { None };
        };
        let leaf = column.schema().leaves.first()?;
        if column.schema().leaves.len() != 1 || leaf.numel() != 1 {
            return None;
        }
        let g = column.geometry();
        let mut sum = 0.0;
        for p in g.lookback..g.total {
            sum += scalar_as_f64(leaf.dtype, &column.item(0, p))?;
        }
        Some(sum)
    }

    /// Checks that the fields' lengths agree (RLlib's `validate`).
    pub fn validate(&self) -> Result<(), EpisodeError> {
        let (obs, infos) = (self.observations.len(), self.infos.len());
        let (actions, rewards) = (self.actions.len(), self.rewards.len());
        let bad = |what: String| Err(EpisodeError::Inconsistent(what));
        if obs != infos {
            return bad(format!("validate: {obs} observations but {infos} infos"));
        }
        let steps = self.steps_observed();
        if obs == 0 && (actions != 0 || rewards != 0) || obs > 0 && (actions != steps || rewards != steps) {
            return bad(format!(
                "validate: {obs} observations/infos need {steps} actions and rewards, \
                 got {actions} actions and {rewards} rewards"
            ));
        }
        for (key, field) in &self.extra_model_outputs {
            if field.len() != steps {
                return bad(format!(
                    "validate: extra model output {key:?} has {} items, expected {steps}",
                    field.len()
                ));
            }
        }
        Ok(())
    }

    /// Whether the episode takes a reset observation now: not done, starting at t=0 (a
    /// continuation chunk takes none), and without observations yet.
    pub fn check_reset(&self) -> Result<(), EpisodeError> {
        if self.is_done() {
            return Err(EpisodeError::Done { what: "add_env_reset" });
        }
        if self.t_started != 0 {
            return Err(EpisodeError::ResetNotAtStart { t_started: self.t_started });
        }
        if self.is_reset() || self.t != self.t_started {
            return Err(EpisodeError::AlreadyReset);
        }
        Ok(())
    }

    /// Whether the episode takes a step now: not done, and reset.
    pub fn check_step(&self) -> Result<(), EpisodeError> {
        if self.is_done() {
            return Err(EpisodeError::Done { what: "add_env_step" });
        }
        if !self.is_reset() {
            return Err(EpisodeError::NotReset);
        }
        Ok(())
    }

    /// Gives field `name` the layout of a new space: `space` is its schema and spec, or
    /// `None` for a space without a fixed numeric layout. The storage follows while the
    /// field holds no items (keeping its compression setting); a field whose items
    /// already have the space's schema keeps them. Otherwise (other items, or Python
    /// objects) nothing changes: the old layout stays. Where it takes effect, the field's
    /// spec becomes the space's (`None` forgets the spec of observations and actions,
    /// whose spaces users replace). Returns whether it took effect.
    pub fn set_space(&mut self, name: FieldName<'_>, space: Option<(Arc<Schema>, Arc<S>)>) -> bool {
        let Some(f) = self.field_mut(name) else { return false };
        let compression = f.compression();
        let typed = |schema: &Arc<Schema>| {
            let mut typed = Field::<O, S>::typed(Arc::clone(schema), false);
            typed.set_compression(compression);
            typed.storage
        };
        match (&f.storage, &space) {
            (Storage::Untyped { .. }, Some((schema, _))) => f.storage = typed(schema),
            (Storage::Typed { column, .. }, Some((schema, _))) if column.total() == 0 => {
                f.storage = typed(schema);
            }
            (Storage::Typed { column, .. }, Some((schema, _))) if *column.schema() == **schema => {}
            (Storage::Typed { column, .. }, None) if column.total() == 0 => {
                f.storage = Storage::Untyped { compression };
            }
            _ => return false,
        }
        match space {
            Some((_, spec)) => f.spec = Some(spec),
            None if matches!(name, FieldName::Observations | FieldName::Actions) => f.spec = None,
            None => {}
        }
        true
    }

    /// Field `name` as RLlib's multi-agent episode reads an agent's data: with the last
    /// stored item left out (`ignore_last`: a value that belongs after the hanging one),
    /// and an extra model output the agent lacks read as an empty field. `None` only for
    /// a field this episode cannot have.
    #[must_use]
    pub fn view(&self, name: FieldName<'_>, ignore_last: bool) -> Option<Field<O, S>> {
        let mut view = match name {
            FieldName::Extra(k) => self.extra(k).cloned().unwrap_or_default(),
            _ => self.field(name)?.clone(),
        };
        if ignore_last {
            if let Some(last) = view.geometry().total.checked_sub(1) {
                view.remove(last);
            }
        }
        Some(view)
    }

    /// Whether field `name` infers its spec from the next item stored (it holds no items
    /// and no spec yet: [`crate::episode::Conversion::Infer`]; a missing extra key too).
    #[must_use]
    pub fn infers_spec(&self, name: FieldName<'_>) -> bool {
        self.field(name).is_none_or(|f| matches!(f.storage, Storage::Untyped { .. }) && f.spec.is_none())
    }

    /// Removes the extra model output `key`; false if there is none.
    pub fn remove_extra(&mut self, key: &str) -> bool {
        let Some(i) = self.extra_model_outputs.iter().position(|(k, _)| &**k == key) else { return false };
        self.extra_model_outputs.remove(i);
        true
    }

    /// Records the reset observation.
    pub fn add_reset<B: AsRef<[u8]>>(
        &mut self,
        observation: Item<O, B, S>,
        info: Option<O>,
        mut to_object: impl ToObject<O, S>,
    ) -> Result<(), EpisodeError> {
        self.check_reset()?;
        if !self.observations.accepts(&observation) {
            return Err(EpisodeError::Item { field: "observation".into() });
        }
        self.observations.push(observation, &mut to_object);
        self.infos.push_sparse(info);
        Ok(())
    }

    /// Records one step. All-or-nothing: every item is checked before any is stored.
    pub fn add_step<B: AsRef<[u8]>>(
        &mut self,
        step: Step<'_, O, B, S>,
        mut to_object: impl ToObject<O, S>,
    ) -> Result<(), EpisodeError> {
        self.check_step()?;
        let item_error = |field: &str| Err(EpisodeError::Item { field: field.into() });
        if !self.observations.accepts(&step.observation) {
            return item_error("observation");
        }
        if !self.actions.accepts(&step.action) {
            return item_error("action");
        }
        if !self.rewards.accepts(&step.reward) {
            return item_error("reward");
        }
        for (key, item) in &step.extra_model_outputs {
            if !self.extra(key).map_or_else(|| Field::<O, S>::untyped().accepts(item), |f| f.accepts(item)) {
                return item_error(&format!("extra model output {key:?}"));
            }
        }
        self.observations.push_accepted(step.observation, &mut to_object);
        self.actions.push_accepted(step.action, &mut to_object);
        self.rewards.push_accepted(step.reward, &mut to_object);
        self.infos.push_sparse(step.info);
        for (key, item) in step.extra_model_outputs {
            if let Some(field) = self.extra_mut(key) {
                field.push_accepted(item, &mut to_object);
            } else {
                // A key first seen mid-episode starts its own column without look-back,
                // as in RLlib.
                let mut field = Field::untyped();
                field.push_accepted(item, &mut to_object);
                self.extra_model_outputs.push((super::intern_key(key), field));
            }
        }
        self.t += 1;
        self.is_terminated = step.terminated;
        self.is_truncated = step.truncated;
        if self.is_done() {
            // The last observation is in: nothing more is appended.
            self.seal();
        }
        Ok(())
    }

    /// Position of extra `key` in `extra_model_outputs`, trying `hint` first (the runners
    /// give the keys in the order the episode first saw them, so the string compare
    /// usually hits at once).
    fn extra_position(&self, hint: usize, key: &str) -> Option<usize> {
        match self.extra_model_outputs.get(hint) {
            Some((k, _)) if same_str(k, key) => Some(hint),
            _ => self.extra_model_outputs.iter().position(|(k, _)| same_str(k, key)),
        }
    }

    /// The typed column of field `slot` of a row step, the extras at their positions in
    /// `extra_model_outputs` (`extra_at[slot - 3]`), for writing.
    fn row_column_at_mut(&mut self, slot: usize, extra_at: &[usize]) -> Option<&mut Column> {
        let field = match slot {
            0 => &mut self.observations,
            1 => &mut self.actions,
            2 => &mut self.rewards,
            k => &mut self.extra_model_outputs.get_mut(*extra_at.get(k - 3)?)?.1,
        };
        match &mut field.storage {
            Storage::Typed { column, .. } => Some(column),
            _ => None,
        }
    }

    /// The typed column of field `slot` of a row step: 0 observations, 1 actions, 2
    /// rewards, `3 + j` extra `extra_keys[j]`.
    fn row_column(&self, slot: usize, extra_keys: &[&str]) -> Option<&Column> {
        let field = match slot {
            0 => &self.observations,
            1 => &self.actions,
            2 => &self.rewards,
            k => {
                let j = k - 3;
                &self.extra_model_outputs[self.extra_position(j, extra_keys.get(j)?)?].1
            }
        };
        match &field.storage {
            Storage::Typed { column, .. } => Some(column),
            _ => None,
        }
    }

    /// Whether [`Self::add_row_step`] takes a step whose fields are laid out by
    /// `layouts` (observation, action, reward, then the extras `extra_keys`): the episode
    /// is reset, not done, and stores each of these fields typed with exactly that layout.
    #[must_use]
    pub fn fits_rows(&self, layouts: &[&Schema], extra_keys: &[&str]) -> bool {
        self.is_reset()
            && !self.is_done()
            && layouts.len() == 3 + extra_keys.len()
            && layouts.iter().enumerate().all(|(slot, &layout)| {
                self.row_column(slot, extra_keys).is_some_and(|c| {
                    // Columns of one layout share their schema: the address settles it
                    // without reading the leaves (a cache miss per field and episode).
                    std::ptr::eq(c.schema(), layout) || c.schema().leaves == layout.leaves
                })
            })
    }

    /// Stores one step given as raw bytes (the runners' hot path: rows of a vector
    /// env's batches, no per-item conversion). `leaves` holds one slice per leaf of each
    /// field in [`Self::fits_rows`] order.
    ///
    /// # Errors
    /// `Done`/`NotReset` as [`Self::add_step`]; `Item` if a field is missing, not typed,
    /// or a slice has the wrong size. Nothing is stored on error.
    pub fn add_row_step<B: AsRef<[u8]>, K: AsRef<str>>(
        &mut self,
        leaves: &[B],
        extra_keys: &[K],
        info: Option<O>,
        terminated: bool,
        truncated: bool,
    ) -> Result<(), EpisodeError> {
        if self.is_done() {
            return Err(EpisodeError::Done { what: "add_env_step" });
        }
        if !self.is_reset() {
            return Err(EpisodeError::NotReset);
        }
        let fields = 3 + extra_keys.len();
        // Each extra's position, found once by the check and used by the store (inline for
        // up to eight extras: no heap block per step).
        let mut inline = [0usize; 8];
        // Made only for more extras (no vector to drop on the usual step).
        let mut heap: Vec<usize>;
        let extra_at: &mut [usize] = if let Some(at) = inline.get_mut(..extra_keys.len()) {
            at
        } else {
            heap = vec![0; extra_keys.len()];
            &mut heap
        };
        // Check every field first (sizes against the columns), then store.
        let mut start = 0;
        for slot in 0..fields {
            let field = match slot {
                0 => Some(&self.observations),
                1 => Some(&self.actions),
                2 => Some(&self.rewards),
                k => self.extra_position(k - 3, extra_keys[k - 3].as_ref()).map(|pos| {
                    extra_at[k - 3] = pos;
                    &self.extra_model_outputs[pos].1
                }),
            };
            let Some(Field { storage: Storage::Typed { column, .. }, .. }) = field else {
                return Err(EpisodeError::Item { field: row_field_label(slot, extra_keys) });
            };
            let sizes = column.schema().leaf_sizes();
            let end = start + sizes.len();
            let fits = match (leaves.get(start..end), sizes) {
                // One leaf (the usual field) without the zip.
                (Some([b]), [n]) => b.as_ref().len() == *n,
                (Some(item), _) => item.iter().zip(sizes).all(|(b, &n)| b.as_ref().len() == n),
                (None, _) => false,
            };
            if !fits {
                return Err(EpisodeError::Item { field: row_field_label(slot, extra_keys) });
            }
            start = end;
        }
        if start != leaves.len() {
            return Err(EpisodeError::Item { field: "row step (more leaves than fields)".into() });
        }
        let mut start = 0;
        for slot in 0..fields {
            if let Some(column) = self.row_column_at_mut(slot, extra_at) {
                let end = start + column.schema().leaves.len();
                column.push_unchecked(&leaves[start..end]);
                start = end;
            }
        }
        self.infos.push_sparse(info);
        self.t += 1;
        self.is_terminated = terminated;
        self.is_truncated = truncated;
        if self.is_done() {
            self.seal();
        }
        Ok(())
    }

    /// The successor chunk: continues this episode at `t`, with the last
    /// `len_lookback_buffer` steps as its look-back. This episode is left as it was.
    pub fn cut(&self, len_lookback_buffer: usize) -> Result<SingleAgentCore<O, S>, EpisodeError> {
        if self.is_done() {
            return Err(EpisodeError::Done { what: "cut" });
        }
        Ok(self.cut_as_live(len_lookback_buffer))
    }

    /// [`Self::cut`] (with `keep_done`: [`Self::cut_as_live`], the successor keeping this
    /// episode's done flags) holding, as RLlib's successor does, the very info objects of
    /// its look-back: the absent ones are made here first (`make_info`), then shared.
    pub fn cut_sharing_infos(
        &mut self,
        len_lookback_buffer: usize,
        keep_done: bool,
        make_info: impl FnMut() -> O,
    ) -> Result<SingleAgentCore<O, S>, EpisodeError> {
        if keep_done || !self.is_done() {
            let shared = self.cut_info_positions(len_lookback_buffer)?;
            self.infos.materialize(&shared, make_info);
        }
        if !keep_done {
            return self.cut(len_lookback_buffer);
        }
        let mut core = self.cut_as_live(len_lookback_buffer);
        (core.is_terminated, core.is_truncated) = (self.is_terminated, self.is_truncated);
        Ok(core)
    }

    /// [`Self::slice`] holding the very info objects of this episode (see
    /// [`Self::cut_sharing_infos`]).
    pub fn slice_sharing_infos(
        &mut self,
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
        len_lookback_buffer: Option<usize>,
        make_info: impl FnMut() -> O,
    ) -> Result<SingleAgentCore<O, S>, EpisodeError> {
        // An error is left to `slice` to report.
        if let Ok(shared) = self.slice_info_positions(start, stop, step, len_lookback_buffer) {
            self.infos.materialize(&shared, make_info);
        }
        self.slice(start, stop, step, len_lookback_buffer)
    }

    /// Makes the chunk's absent infos (`make_info`; look-back excluded), so that an episode
    /// this chunk is appended to goes on with the same objects, as in RLlib.
    pub fn share_chunk_infos(&mut self, make_info: impl FnMut() -> O) {
        let g = self.infos.geometry();
        let chunk: Vec<usize> = (g.lookback..g.total).collect();
        self.infos.materialize(&chunk, make_info);
    }

    /// [`Self::cut`] without the check that the episode is not done: the successor of a
    /// done episode as if it were not (its flags are cleared). A multi-agent episode's cut
    /// keeps an agent that finished at its last env step that way.
    #[must_use]
    pub fn cut_as_live(&self, len_lookback_buffer: usize) -> SingleAgentCore<O, S> {
        let k = len_lookback_buffer;
        // The positions of the field's last `n` items, look-back included (RLlib's slice
        // `[-n:]` of the whole buffer, nothing for `n == 0`), on the stack for short tails.
        let tail = |field: &Field<O, S>, n: usize| -> SmallVec<[usize; 8]> {
            last_positions(field.geometry().total, n).collect()
        };
        let rewards_pos = tail(&self.rewards, k);
        // RLlib's "auto" look-back: everything kept before the new chunk starts.
        let lookback = rewards_pos.len();
        let obs_pos = tail(&self.observations, k.saturating_add(1));
        let infos_pos = tail(&self.infos, k.saturating_add(1));
        let actions_pos = tail(&self.actions, k);
        let mut extra_model_outputs = Vec::with_capacity(self.extra_model_outputs.len());
        for (key, field) in &self.extra_model_outputs {
            extra_model_outputs.push((key.clone(), field.select(&tail(field, k), lookback)));
        }
        SingleAgentCore {
            observations: self.observations.select(&obs_pos, lookback),
            infos: self.infos.select(&infos_pos, lookback),
            actions: self.actions.select(&actions_pos, lookback),
            rewards: self.rewards.select(&rewards_pos, lookback),
            extra_model_outputs,
            rewards_fill_f32: self.rewards_fill_f32,
            t_started: self.t,
            t: self.t,
            is_terminated: false,
            is_truncated: false,
        }
    }

    /// The fields' sizes (look-back included), `t` and the done flags: what a multi-agent
    /// cut's plan reads of an agent's episode.
    #[must_use]
    pub fn sizes(&self) -> EpisodeSizes {
        let total = |f: &Field<O, S>| f.lookback() + f.len();
        EpisodeSizes {
            t: self.t,
            terminated: self.is_terminated,
            truncated: self.is_truncated,
            obs_lookback: self.observations.lookback(),
            obs_total: total(&self.observations),
            infos_total: total(&self.infos),
            actions_total: total(&self.actions),
            rewards_total: total(&self.rewards),
            extra_totals: self.extra_model_outputs.iter().map(|(_, f)| total(f)).collect(),
        }
    }

    /// A new episode of the rows `observations` (and infos; with `infos` false, empty
    /// ones) and `actions` (and rewards, and extra outputs when `extras`; else it has no
    /// extra output keys) at absolute
    /// positions, the first `lookback` of each look-back, starting at `t_started`: what
    /// the constructor makes from those items (a multi-agent cut's agent). Positions must
    /// lie in the fields.
    #[must_use]
    pub fn select_rows(
        &self,
        observations: &[usize],
        actions: &[usize],
        extras: bool,
        infos: bool,
        lookback: usize,
        t_started: i64,
    ) -> SingleAgentCore<O, S> {
        let infos = if infos {
            self.infos.select(observations, lookback)
        } else {
            let mut empty = Field::sparse();
            for _ in observations {
                empty.push_sparse(None);
            }
            empty.set_lookback(lookback);
            empty
        };
        let extra_model_outputs = if extras {
            self.extra_model_outputs
                .iter()
                .map(|(key, f)| (key.clone(), f.select(actions, lookback)))
                .collect()
        } else {
            Vec::new()
        };
        let chunk = actions.len().saturating_sub(lookback) as i64;
        SingleAgentCore {
            observations: self.observations.select(observations, lookback),
            infos,
            actions: self.actions.select(actions, lookback),
            rewards: self.rewards.select(actions, lookback),
            extra_model_outputs,
            // The constructor's rewards buffer has RLlib's float32 space.
            rewards_fill_f32: true,
            t_started,
            t: t_started + chunk,
            is_terminated: false,
            is_truncated: false,
        }
    }

    /// The steps `start..stop` (by `step`) as a new episode, with up to
    /// `len_lookback_buffer` steps before `start` as look-back (default: as many as this
    /// episode's fields have). Bounds may be negative (from the end); RLlib 2.60 semantics.
    pub fn slice(
        &self,
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
        len_lookback_buffer: Option<usize>,
    ) -> Result<SingleAgentCore<O, S>, EpisodeError> {
        let (start, stop) = self.slice_bounds(start, stop);
        let keep_done = stop == self.len() as i64;
        let cut = |field: &Field<O, S>, extra_item: i64| -> Result<Field<O, S>, EpisodeError> {
            let (pos, lb) = slice_positions(field, start, stop, step, len_lookback_buffer, extra_item)?;
            Ok(field.select(&pos, lb))
        };
        let mut extra_model_outputs = Vec::with_capacity(self.extra_model_outputs.len());
        for (key, field) in &self.extra_model_outputs {
            extra_model_outputs.push((key.clone(), cut(field, 0)?));
        }
        let rewards = cut(&self.rewards, 0)?;
        let t_started = self.t_started + start;
        let mut sliced = SingleAgentCore {
            observations: cut(&self.observations, 1)?,
            infos: cut(&self.infos, 1)?,
            actions: cut(&self.actions, 0)?,
            t: t_started + rewards.len() as i64,
            rewards,
            extra_model_outputs,
            // RLlib 2.60's `slice()` builds the rewards buffer without its float32 space.
            rewards_fill_f32: false,
            t_started,
            is_terminated: keep_done && self.is_terminated,
            is_truncated: keep_done && self.is_truncated,
        };
        sliced.validate()?;
        if sliced.is_done() {
            sliced.seal();
        }
        Ok(sliced)
    }

    /// `slice`'s bounds made absolute within the chunk (negative ones count from its end).
    fn slice_bounds(&self, start: Option<i64>, stop: Option<i64>) -> (i64, i64) {
        let len = self.len() as i64;
        let start = match start {
            None => 0,
            Some(s) if s < 0 => len + s,
            Some(s) => s,
        };
        let stop = match stop {
            None => len,
            Some(s) if s < 0 => len + s,
            Some(s) => s,
        };
        (start, stop)
    }

    /// The absolute positions of the infos that [`Self::cut`] copies into the successor
    /// (so that the caller can give absent ones an object both episodes then share).
    pub fn cut_info_positions(&self, len_lookback_buffer: usize) -> Result<Vec<usize>, EpisodeError> {
        let n = len_lookback_buffer as i64 + 1;
        positions(&self.infos, &Index::Slice { start: Some(-n), stop: None, step: None }, false)
    }

    /// The absolute positions of the infos that [`Self::slice`] with these arguments copies.
    pub fn slice_info_positions(
        &self,
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
        len_lookback_buffer: Option<usize>,
    ) -> Result<Vec<usize>, EpisodeError> {
        let (start, stop) = self.slice_bounds(start, stop);
        Ok(slice_positions(&self.infos, start, stop, step, len_lookback_buffer, 1)?.0)
    }

    /// Whether `other` can be appended ([`Self::concat`]): this episode is not done, the
    /// other starts at this one's `t`, both pass [`Self::validate`], and an extra model
    /// output new to this episode starts where it has no step yet.
    pub fn check_concat(&self, other: &SingleAgentCore<O, S>) -> Result<(), EpisodeError> {
        if self.is_done() {
            return Err(EpisodeError::Done { what: "concat_episode" });
        }
        if self.t != other.t_started {
            return Err(EpisodeError::NotContinuation(format!(
                "concat_episode: this episode ends at t={} but the other starts at t_started={}",
                self.t, other.t_started
            )));
        }
        self.validate()?;
        other.validate()?;
        // A key this episode lacks can start with the other chunk only where this one has
        // no step yet (an agent that first acts after a cut): elsewhere its column would be
        // shorter than the steps.
        let missing = other.extra_model_outputs.iter().find(|(k, _)| self.extra(k).is_none());
        if let Some((key, _)) = missing.filter(|_| !self.actions.is_empty()) {
            return Err(EpisodeError::NotContinuation(format!(
                "concat_episode: extra model output {key:?} is not in this episode, which has \
                 {} steps without it",
                self.actions.len()
            )));
        }
        Ok(())
    }

    /// Appends `other`, the chunk that continues this episode (RLlib's `concat_episode`).
    ///
    /// The caller checks that both are the same episode and that `other`'s first
    /// observation equals this one's last; here the time steps and fields must line up.
    pub fn concat(
        &mut self,
        other: &SingleAgentCore<O, S>,
        mut to_object: impl ToObject<O, S>,
    ) -> Result<(), EpisodeError> {
        self.check_concat(other)?;
        let missing: Vec<Arc<str>> = other
            .extra_model_outputs
            .iter()
            .filter(|(k, _)| self.extra(k).is_none())
            .map(|(k, _)| Arc::clone(k))
            .collect();
        for key in missing {
            self.extra_model_outputs.push((key, Field::untyped()));
        }
        let last = self.observations.geometry().total.saturating_sub(1);
        self.observations.remove(last);
        self.infos.remove(last.min(self.infos.geometry().total.saturating_sub(1)));
        extend(&mut self.observations, &other.observations, &mut to_object);
        extend(&mut self.actions, &other.actions, &mut to_object);
        extend(&mut self.rewards, &other.rewards, &mut to_object);
        extend(&mut self.infos, &other.infos, &mut to_object);
        for (key, field) in &other.extra_model_outputs {
            if let Some(mine) = self.extra_mut(key) {
                extend(mine, field, &mut to_object);
            }
        }
        self.t = other.t;
        // Both flags: a step may end a chunk terminated and truncated at once (RLlib 2.60
        // keeps only the termination then).
        self.is_terminated |= other.is_terminated;
        self.is_truncated |= other.is_truncated;
        if self.is_done() {
            self.seal();
        }
        // `to_numpy` of a chunk without steps switches only its observations (RLlib's
        // rule): a numpy'd chunk without steps followed by a numpy'd chunk reads as
        // batches, as `to_numpy` of the whole would have made it (RLlib leaves the step
        // fields lists; a chunk that was not numpy'd keeps them lists here too).
        if self.observations.finalized && other.observations.finalized && !self.is_empty() {
            self.actions.finalized = true;
            self.rewards.finalized = true;
            for (_, field) in &mut self.extra_model_outputs {
                field.finalized = true;
            }
        }
        self.validate()
    }
}

fn scalar_as_f64(dtype: crate::schema::DType, b: &[u8]) -> Option<f64> {
    use crate::schema::Kind;
    match (dtype.kind, dtype.size) {
        (Kind::Float, 8) => Some(f64::from_ne_bytes(b.try_into().ok()?)),
        (Kind::Float, 4) => Some(f64::from(f32::from_ne_bytes(b.try_into().ok()?))),
        (Kind::Int | Kind::UInt | Kind::Bool, _) => dtype.read_int(b).map(|v| v as f64),
        _ => None,
    }
}

/// The positions of `field` that `slice(start..stop by step)` keeps (`extra_item`: 1 for
/// the fields with one item more per chunk), and the slice's look-back among them.
fn slice_positions<O: Clone, S>(
    field: &Field<O, S>,
    start: i64,
    stop: i64,
    step: Option<i64>,
    len_lookback_buffer: Option<usize>,
    extra_item: i64,
) -> Result<(Vec<usize>, usize), EpisodeError> {
    let own = field.lookback() as i64;
    let mut lb = len_lookback_buffer.map_or(own, |l| l as i64);
    // Never reach further back than the stored look-back allows.
    if start >= 0 && start - lb < 0 && own < lb - start {
        lb = own + start;
    }
    let index = Index::Slice { start: Some(start - lb), stop: Some(stop + extra_item), step };
    Ok((positions(field, &index, true)?, usize::try_from(lb).unwrap_or(0)))
}

/// Absolute positions of `index` (no fill) in `field`.
fn positions<O: Clone, S>(
    field: &Field<O, S>,
    index: &Index,
    neg_as_lookback: bool,
) -> Result<Vec<usize>, EpisodeError> {
    if let Some(tail) = tail_positions(field.geometry().total, index, neg_as_lookback) {
        return Ok(tail);
    }
    Ok(match field.resolve(index, neg_as_lookback, false)? {
        Resolved::One(pos) => vec![pos],
        Resolved::Many(v) => v,
    }
    .into_iter()
    .filter_map(|p| match p {
        crate::column::Pos::At(p) => Some(p),
        crate::column::Pos::Fill => None,
    })
    .collect())
}

/// The positions of the last `n` of `total` items, where `index` is `[-n:]` (a cut's
/// tail: RLlib's slice of the whole buffer, look-back included, without fill): what
/// [`Field::resolve`] gives, without its general slice rules.
fn tail_positions(total: usize, index: &Index, neg_as_lookback: bool) -> Option<Vec<usize>> {
    match *index {
        Index::Slice { start: Some(start), stop: None, step: None | Some(1) }
            if start < 0 && !neg_as_lookback =>
        {
            let n = usize::try_from(start.unsigned_abs()).unwrap_or(usize::MAX);
            Some(last_positions(total, n).collect())
        }
        _ => None,
    }
}

/// The positions of the last `n` of `total` items (all of them where `n` is larger).
fn last_positions(total: usize, n: usize) -> std::ops::Range<usize> {
    total.saturating_sub(n)..total
}

/// Appends `other`'s chunk to `mine`; if their storages differ (two inferred schemas that
/// disagree), both sides' items become objects first (each by its own spec) so that
/// nothing is lost. `mine` takes `other`'s spec if it has none.
fn extend<O: Clone, S>(mine: &mut Field<O, S>, other: &Field<O, S>, to_object: &mut impl ToObject<O, S>) {
    if !mine.extend_chunk(other) {
        let mut theirs = other.clone();
        theirs.make_objects(&mut *to_object);
        mine.make_objects(&mut *to_object);
        let merged = mine.extend_chunk(&theirs);
        debug_assert!(merged, "two object fields always merge");
    }
    mine.adopt_spec(other.spec.as_ref());
}

/// `a == b` for the short keys of the hot path, without a `memcmp` call: interned keys
/// share their bytes (the address settles it), and glibc's vectorized `memcmp` costs
/// ~80 ns per call on short inputs on the machines measured here (see `schema::Leaf`).
fn same_str(a: &str, b: &str) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.as_ptr() == b.as_ptr() {
        return true;
    }
    // Eight bytes at a time (an extra key is looked up twice per agent and step; a byte
    // loop took about 50 instructions for "action_logp"), the tail as the last eight bytes
    // (overlapping the words before) where the text has that many.
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or_default());
    let n = a.len();
    if n < 8 {
        return a.iter().eq(b.iter());
    }
    let (wa, wb) = (a.chunks_exact(8), b.chunks_exact(8));
    wa.zip(wb).all(|(x, y)| word(x) == word(y)) && word(&a[n - 8..]) == word(&b[n - 8..])
}

fn row_field_label<K: AsRef<str>>(slot: usize, extra_keys: &[K]) -> String {
    match slot {
        0 => FieldName::Observations.label(),
        1 => FieldName::Actions.label(),
        2 => FieldName::Rewards.label(),
        k => FieldName::Extra(extra_keys.get(k - 3).map_or("?", AsRef::as_ref)).label(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::column::Pos;
    use crate::episode::field::Storage;
    use crate::schema::{DType, Leaf, Schema};

    type Core = SingleAgentCore<String>;

    fn f32_item<S>(v: f32) -> Item<String, Vec<u8>, S> {
        Item::Bytes(vec![v.to_ne_bytes().to_vec()].into())
    }

    fn new_episode() -> Core {
        let scalar = || Schema::new(vec![Leaf::new(DType::F32, vec![])]);
        let mut core = Core {
            observations: Field::typed(scalar(), false),
            actions: Field::typed(scalar(), false),
            rewards: Field::typed(scalar(), false),
            extra_model_outputs: vec![("logp".into(), Field::typed(scalar(), false))],
            ..Core::default()
        };
        core.add_reset(f32_item(0.0), Some("i0".into()), |_: TypedItem<'_>| String::new()).unwrap();
        core
    }

    fn step(core: &mut Core, t: f32) {
        let s = Step {
            observation: f32_item(t),
            action: f32_item(t * 10.0),
            reward: f32_item(t * 100.0),
            info: (t as i64 % 2 == 0).then(|| format!("i{t}")),
            extra_model_outputs: vec![("logp", f32_item(-t))],
            terminated: false,
            truncated: false,
        };
        core.add_step(s, |_: TypedItem<'_>| String::new()).unwrap();
    }

    /// The layouts of `e`'s observation, action, reward and `logp` columns.
    fn layouts(e: &Core) -> Vec<Schema> {
        (0..4).map(|slot| e.row_column(slot, &["logp"]).unwrap().schema().clone()).collect()
    }

    #[test]
    fn row_step_equals_add_step() {
        let (mut by_rows, mut by_items) = (new_episode(), new_episode());
        for k in 1..5u8 {
            let t = f32::from(k);
            let bytes = [t, t * 10.0, t * 100.0, -t].map(f32::to_ne_bytes);
            let row: Vec<&[u8]> = bytes.iter().map(<[u8; 4]>::as_slice).collect();
            let info = (k % 2 == 0).then(|| format!("i{t}"));
            by_rows.add_row_step(&row, &["logp"], info, false, k == 4).unwrap();
            step(&mut by_items, t);
        }
        by_items.is_truncated = true;
        assert_eq!(by_rows, by_items);
        assert_eq!(read(&by_rows.extra("logp").unwrap().clone()), vec![-1.0, -2.0, -3.0, -4.0]);
    }

    /// (sealed, total) of the observations' column.
    fn obs_sealed(e: &Core) -> (usize, usize) {
        match &e.observations.storage {
            Storage::Typed { column, .. } => (column.sealed(), column.total()),
            _ => panic!("not typed"),
        }
    }

    #[test]
    fn a_chunk_that_takes_no_more_steps_seals_its_compressed_columns() {
        let mut e = new_episode();
        if let Storage::Typed { column, .. } = &mut e.observations.storage {
            column.set_compression(Some(4));
        }
        for k in 1..10u8 {
            step(&mut e, f32::from(k));
        }
        let (sealed, total) = obs_sealed(&e);
        assert!(sealed < total, "a running chunk keeps its newest items raw");
        // A chunk handed out: sealed; its successor (cut before) and a concat still work.
        let mut succ = e.cut(1).unwrap();
        let mut out = e.clone();
        out.seal();
        assert_eq!(obs_sealed(&out), (10, 10));
        assert_eq!(read(&out.observations), read(&e.observations));
        for k in 10..13u8 {
            step(&mut succ, f32::from(k));
        }
        // The done step seals (the row path and the item path alike).
        let bytes = [13.0f32, 130.0, 1300.0, -13.0].map(f32::to_ne_bytes);
        let row: Vec<&[u8]> = bytes.iter().map(<[u8; 4]>::as_slice).collect();
        let mut done = succ.clone();
        done.add_row_step(&row, &["logp"], None, false, true).unwrap();
        assert_eq!(obs_sealed(&done).0, obs_sealed(&done).1);
        out.concat(&done, |_: TypedItem<'_>| String::new()).unwrap();
        assert_eq!(obs_sealed(&out), (14, 14), "a concat that ends done is sealed");
        assert_eq!(read(&out.observations), (0..14u8).map(f32::from).collect::<Vec<_>>());
        let sliced = out.slice(Some(5), None, None, Some(1)).unwrap();
        assert_eq!(obs_sealed(&sliced).0, obs_sealed(&sliced).1, "a done slice is sealed");
        assert_eq!(read(&sliced.observations), (5..14u8).map(f32::from).collect::<Vec<_>>());
        // Not done: a concat keeps the newest items raw.
        let mut open = e.clone();
        open.seal();
        open.concat(&succ, |_: TypedItem<'_>| String::new()).unwrap();
        assert!(obs_sealed(&open).0 < obs_sealed(&open).1);
        assert_eq!(read(&open.observations), (0..13u8).map(f32::from).collect::<Vec<_>>());
    }

    #[test]
    fn reserve_until_makes_room_in_every_typed_column() {
        let capacity = |f: &Field<String>| match &f.storage {
            Storage::Typed { column, .. } => column.capacity_bytes(),
            _ => unreachable!(),
        };
        let mut e = new_episode();
        step(&mut e, 1.0);
        // Room for the 99 steps left (t is 1), in every column, small items included.
        e.reserve_until(100, usize::MAX);
        for f in [&e.observations, &e.actions, &e.rewards, e.extra("logp").unwrap()] {
            let stored = match &f.storage {
                Storage::Typed { column, .. } => column.total() * 4,
                _ => unreachable!(),
            };
            assert!(capacity(f) >= stored + 99 * 4, "{} < {}", capacity(f), stored + 99 * 4);
        }
        // No room asked for at or past the expected length; the data is unchanged.
        let reserved = capacity(&e.observations);
        e.reserve_until(1, usize::MAX);
        e.reserve_until(-5, usize::MAX);
        e.reserve_until(300, 0);
        assert_eq!(capacity(&e.observations), reserved);
        // At most `max_steps` more steps.
        let mut capped = new_episode();
        step(&mut capped, 1.0);
        capped.reserve_until(100, 10);
        let stored = match &capped.observations.storage {
            Storage::Typed { column, .. } => column.total() * 4,
            _ => unreachable!(),
        };
        assert!(capacity(&capped.observations) >= stored + 10 * 4);
        assert!(capacity(&capped.observations) < stored + 99 * 4);
        let mut plain = new_episode();
        step(&mut plain, 1.0);
        assert_eq!(e, plain);
    }

    #[test]
    fn fits_rows_needs_reset_not_done_and_each_layout() {
        let e = new_episode();
        let l = layouts(&e);
        let refs: Vec<&Schema> = l.iter().collect();
        assert!(e.fits_rows(&refs, &["logp"]));
        // Equal layouts in other allocations fit too (compared by leaves).
        let copies: Vec<Schema> = l.clone();
        assert!(e.fits_rows(&copies.iter().collect::<Vec<_>>(), &["logp"]));
        assert!(!e.fits_rows(&refs, &["other"]), "an extra the episode lacks");
        assert!(!e.fits_rows(&refs[..3], &["logp"]), "a layout per field");
        let f64_layout = Schema::new(vec![Leaf::new(DType::F64, vec![])]);
        let mut wrong = refs.clone();
        wrong[1] = &f64_layout;
        assert!(!e.fits_rows(&wrong, &["logp"]), "same size per item is not enough");
        assert!(!Core::default().fits_rows(&refs, &["logp"]), "not reset");
        let mut done = new_episode();
        done.is_terminated = true;
        assert!(!done.fits_rows(&refs, &["logp"]));
    }

    #[test]
    fn failed_row_steps_store_nothing() {
        let mut e = new_episode();
        let before = e.clone();
        let four = 1f32.to_ne_bytes();
        let eight = 1f64.to_ne_bytes();
        let ok: Vec<&[u8]> = vec![&four; 4];
        let short: Vec<&[u8]> = vec![&four; 3];
        let long: Vec<&[u8]> = vec![&four; 5];
        let wide: Vec<&[u8]> = vec![&four, &eight, &four, &four];
        for (row, keys) in [(&short, ["logp"]), (&long, ["logp"]), (&wide, ["logp"]), (&ok, ["other"])] {
            assert!(matches!(e.add_row_step(row, &keys, None, false, false), Err(EpisodeError::Item { .. })));
            assert_eq!(e, before);
        }
        let mut done = new_episode();
        done.is_truncated = true;
        assert_eq!(
            done.add_row_step(&ok, &["logp"], None, false, false),
            Err(EpisodeError::Done { what: "add_env_step" })
        );
        assert_eq!(
            Core::default().add_row_step(&ok, &["logp"], None, false, false),
            Err(EpisodeError::NotReset)
        );
    }

    #[test]
    fn row_steps_find_extras_stored_in_another_order() {
        let mut e = new_episode();
        let scalar = Schema::new(vec![Leaf::new(DType::F32, vec![])]);
        e.extra_model_outputs.insert(0, ("vf".into(), Field::typed(scalar, false)));
        // Both extras must have as many items as steps; this episode has none yet.
        let bytes = [1f32, 2.0, 3.0, 4.0, 5.0].map(f32::to_ne_bytes);
        let row: Vec<&[u8]> = bytes.iter().map(<[u8; 4]>::as_slice).collect();
        e.add_row_step(&row, &["logp", "vf"], None, false, false).unwrap();
        assert_eq!(read(e.extra("logp").unwrap()), vec![4.0]);
        assert_eq!(read(e.extra("vf").unwrap()), vec![5.0]);
    }

    #[test]
    fn same_str_compares_the_text() {
        let long = String::from("action_dist_inputs");
        for (a, b, same) in [
            ("action_logp", "action_logp", true),
            ("action_logp", "action_logq", false),
            ("action_logp", "bction_logp", false),
            ("vf", "vf", true),
            ("vf", "vg", false),
            ("", "", true),
            ("vf_preds", "vf_predz", false),
            ("vf", "vf_", false),
            ("action_logp", "action_lozp", false),
            ("vf_preds", "vf_preds", true),
            ("action_dist_inputs", "action_dist_inputz", false),
        ] {
            assert_eq!(same_str(a, &String::from(b)), same, "{a:?} {b:?}");
        }
        assert!(same_str(&long, &long));
    }

    #[test]
    fn row_steps_store_more_extras_than_fit_inline() {
        let mut e = new_episode();
        let scalar = Schema::new(vec![Leaf::new(DType::F32, vec![])]);
        let keys: Vec<String> = (0..10).map(|k| format!("x{k}")).collect();
        for k in keys.iter().rev() {
            e.extra_model_outputs.push((k.as_str().into(), Field::typed(scalar.clone(), false)));
        }
        e.extra_model_outputs.retain(|(k, _)| &**k != "logp");
        let bytes: Vec<[u8; 4]> = (0..13).map(|v| (v as f32).to_ne_bytes()).collect();
        let row: Vec<&[u8]> = bytes.iter().map(<[u8; 4]>::as_slice).collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        e.add_row_step(&row, &key_refs, None, false, false).unwrap();
        for (j, k) in keys.iter().enumerate() {
            assert_eq!(read(e.extra(k).unwrap()), vec![(3 + j) as f32], "{k}");
        }
        // A missing key among them stores nothing.
        let before = e.clone();
        let mut missing = key_refs.clone();
        missing[9] = "nope";
        assert!(matches!(e.add_row_step(&row, &missing, None, false, false), Err(EpisodeError::Item { .. })));
        assert_eq!(e, before);
    }

    fn read(field: &Field<String>) -> Vec<f32> {
        let g = field.geometry();
        match &field.storage {
            Storage::Typed { column, .. } => (g.lookback..g.total)
                .map(|p| f32::from_ne_bytes(column.item(0, p)[..].try_into().unwrap()))
                .collect(),
            _ => panic!("not typed"),
        }
    }

    #[test]
    fn reset_step_validate() {
        let mut e = new_episode();
        assert_eq!(
            e.add_reset(f32_item(0.0), None, |_: TypedItem<'_>| String::new()),
            Err(EpisodeError::AlreadyReset)
        );
        for t in 1..=3 {
            step(&mut e, t as f32);
        }
        assert_eq!((e.len(), e.t), (3, 3));
        e.validate().unwrap();
        assert_eq!(read(&e.observations), vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(read(e.extra("logp").unwrap()), vec![-1.0, -2.0, -3.0]);
    }

    #[test]
    fn reset_checks_done_then_start_then_data() {
        let mut e = Core { is_terminated: true, t_started: 3, ..Core::default() };
        assert_eq!(e.check_reset(), Err(EpisodeError::Done { what: "add_env_reset" }));
        e.is_terminated = false;
        let err = e.check_reset().unwrap_err();
        assert_eq!(err, EpisodeError::ResetNotAtStart { t_started: 3 });
        assert!(err.to_string().ends_with("this episode starts at t_started=3"));
        assert_eq!(new_episode().check_reset(), Err(EpisodeError::AlreadyReset));
        assert_eq!(Core::default().check_reset(), Ok(()));
        assert_eq!(Core::default().check_step(), Err(EpisodeError::NotReset));
        assert_eq!(new_episode().check_step(), Ok(()));
    }

    #[test]
    fn a_space_takes_effect_on_empty_fields_and_matching_items_only() {
        type Spaced = SingleAgentCore<String, &'static str>;
        let f32s = Arc::new(Schema::new(vec![Leaf::new(DType::F32, vec![])]));
        let i64s = Arc::new(Schema::new(vec![Leaf::new(DType::I64, vec![])]));
        let space = |schema: &Arc<Schema>, name| Some((Arc::clone(schema), Arc::new(name)));
        let mut e = Spaced::default();
        e.observations.set_compression(Some(4));
        assert!(e.set_space(FieldName::Observations, space(&i64s, "ints")));
        assert_eq!(e.observations.spec(), Some(&"ints"));
        assert_eq!(e.observations.compression(), Some(4), "the setting stays");
        assert!(e.set_space(FieldName::Observations, space(&f32s, "floats")), "still empty");
        e.add_reset(Item::Bytes(vec![1f32.to_ne_bytes().to_vec()].into()), None, |_: TypedItem<'_, _>| {
            String::new()
        })
        .unwrap();
        assert!(!e.set_space(FieldName::Observations, space(&i64s, "ints")), "items of another layout");
        assert!(!e.set_space(FieldName::Observations, None));
        assert_eq!(e.observations.spec(), Some(&"floats"));
        assert!(e.set_space(FieldName::Observations, space(&f32s, "same")), "items of its layout");
        assert_eq!((e.observations.spec(), e.observations.len()), (Some(&"same"), 1));

        assert!(e.set_space(FieldName::Actions, space(&i64s, "ints")));
        assert!(e.set_space(FieldName::Actions, None), "an empty column goes back to untyped");
        assert!(matches!(e.actions.storage, Storage::Untyped { .. }));
        assert_eq!(e.actions.spec(), None);
        assert!(!e.set_space(FieldName::Actions, None), "untyped already: nothing to do");
        e.rewards.spec = Some(Arc::new("kept"));
        e.rewards.storage = Field::<String, &str>::typed(Arc::clone(&f32s), false).storage;
        assert!(e.set_space(FieldName::Rewards, None));
        assert_eq!(e.rewards.spec(), Some(&"kept"), "only observations and actions forget theirs");
        e.infos = Field::objects(vec!["x".into()], 0);
        assert!(!e.set_space(FieldName::Infos, space(&f32s, "floats")), "objects stay");
        assert!(!e.set_space(FieldName::Extra("nope"), space(&f32s, "floats")));
    }

    #[test]
    fn views_leave_out_the_last_item_and_read_missing_keys_as_empty() {
        let mut e = new_episode();
        step(&mut e, 1.0);
        step(&mut e, 2.0);
        let view = e.view(FieldName::Actions, true).unwrap();
        assert_eq!((read(&view), read(&e.actions)), (vec![10.0], vec![10.0, 20.0]));
        assert_eq!(read(&e.view(FieldName::Observations, false).unwrap()), vec![0.0, 1.0, 2.0]);
        let missing = e.view(FieldName::Extra("vf"), true).unwrap();
        assert!(matches!(missing.storage, Storage::Untyped { .. }));
        assert_eq!(e.view(FieldName::Infos, true).unwrap().geometry().total, 2);
        assert!(!e.infers_spec(FieldName::Actions) && e.infers_spec(FieldName::Extra("vf")));
        assert!(Core::default().infers_spec(FieldName::Rewards));
        assert_eq!(FieldName::parse("extra_model_outputs", Some("vf")), Some(FieldName::Extra("vf")));
        assert_eq!(FieldName::parse("infos", Some("vf")), Some(FieldName::Infos));
        assert_eq!(FieldName::parse("extra_model_outputs", None), None);
        assert_eq!(FieldName::parse("states", None), None);
        assert!(e.remove_extra("logp") && !e.remove_extra("logp"));
        assert!(e.extra("logp").is_none());
    }

    #[test]
    fn cuts_slices_and_concats_share_the_info_objects_they_hold() {
        let mut e = new_episode();
        for t in 1..=3 {
            step(&mut e, t as f32);
        }
        // Infos at positions 0 ("i0") and 2 ("i2"); 1 and 3 absent.
        let made = || "made".to_string();
        let succ = e.cut_sharing_infos(1, false, made).unwrap();
        assert_eq!(infos(&e)[2..], [Some("i2".into()), Some("made".into())]);
        assert_eq!(infos(&succ), vec![Some("i2".into()), Some("made".into())]);
        assert_eq!(infos(&e)[1], None, "only what the successor holds is made");
        let slice = e.slice_sharing_infos(Some(0), Some(1), None, Some(0), made).unwrap();
        assert_eq!(infos(&slice), vec![Some("i0".into()), Some("made".into())]);
        assert_eq!(infos(&e)[1], Some("made".into()));

        let mut next = succ.clone();
        next.infos.push_sparse(None);
        next.share_chunk_infos(made);
        assert_eq!(infos(&next), vec![Some("i2".into()), Some("made".into()), Some("made".into())]);

        e.is_truncated = true;
        assert!(matches!(e.cut_sharing_infos(1, false, made), Err(EpisodeError::Done { .. })));
        let kept = e.cut_sharing_infos(1, true, made).unwrap();
        assert!(kept.is_truncated && !kept.is_terminated, "the done flags go with keep_done");
    }

    #[test]
    fn step_is_all_or_nothing() {
        let mut e = new_episode();
        step(&mut e, 1.0);
        let before = e.clone();
        let bad = Step {
            observation: f32_item(2.0),
            action: f32_item(2.0),
            reward: Item::Bytes(vec![vec![0u8; 3]].into()),
            info: None,
            extra_model_outputs: vec![],
            terminated: false,
            truncated: false,
        };
        assert!(matches!(e.add_step(bad, |_: TypedItem<'_>| String::new()), Err(EpisodeError::Item { .. })));
        assert_eq!(e, before);
    }

    #[test]
    fn done_episode_rejects_steps_and_cuts() {
        let mut e = new_episode();
        e.is_terminated = true;
        assert!(matches!(e.cut(0), Err(EpisodeError::Done { .. })));
        let mut fresh = Core::default();
        assert_eq!(
            fresh.add_step(
                Step::<String> {
                    observation: Item::Object("o".into()),
                    action: Item::Object("a".into()),
                    reward: Item::Object("r".into()),
                    info: None,
                    extra_model_outputs: vec![],
                    terminated: false,
                    truncated: false,
                },
                |_: TypedItem<'_>| String::new()
            ),
            Err(EpisodeError::NotReset)
        );
    }

    #[test]
    fn cut_keeps_lookback_and_concat_restores() {
        let mut e = new_episode();
        for t in 1..=5 {
            step(&mut e, t as f32);
        }
        let original = e.clone();
        for k in 0..=7 {
            let mut succ = e.cut(k).unwrap();
            assert_eq!(succ.t_started, 5);
            assert_eq!(succ.len(), 0);
            assert_eq!(succ.rewards.lookback(), k.min(5));
            assert_eq!(succ.observations.lookback(), k.min(5));
            assert_eq!(read(&succ.observations), vec![5.0]);
            step(&mut succ, 6.0);
            step(&mut succ, 7.0);
            let mut joined = e.clone();
            joined.concat(&succ, |_: TypedItem<'_>| String::new()).unwrap();
            assert_eq!(read(&joined.observations), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
            assert_eq!(read(&joined.rewards), vec![100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0]);
            assert_eq!(read(joined.extra("logp").unwrap()).len(), 7);
            assert_eq!(joined.t, 7);
        }
        assert_eq!(e, original, "cut leaves the episode unchanged");
    }

    #[test]
    fn tail_positions_are_those_the_general_slice_rules_resolve() {
        use crate::column::{Geometry, Pos, Resolved};
        for total in 0..8usize {
            for lookback in 0..=total {
                let g = Geometry { total, lookback };
                for start in -10i64..=2 {
                    for step in [None, Some(1)] {
                        for neg in [false, true] {
                            let index = Index::Slice { start: Some(start), stop: None, step };
                            let Some(fast) = super::tail_positions(total, &index, neg) else { continue };
                            let Ok(Resolved::Many(general)) = g.resolve(&index, neg, false) else {
                                panic!("no general positions for {index:?}");
                            };
                            let general: Vec<usize> = general
                                .into_iter()
                                .filter_map(|p| if let Pos::At(p) = p { Some(p) } else { None })
                                .collect();
                            assert_eq!(fast, general, "total {total} lookback {lookback} start {start}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn cut_as_live_cuts_a_done_episode_as_if_it_were_not() {
        let mut e = new_episode();
        for t in 1..=4 {
            step(&mut e, t as f32);
        }
        let live = e.cut(2).unwrap();
        e.is_truncated = true;
        assert!(e.cut(2).is_err());
        assert_eq!(e.cut_as_live(2), live);
    }

    /// The infos by position within the chunk and look-back (absent ones as `None`).
    fn infos(e: &Core) -> Vec<Option<String>> {
        (0..e.infos.geometry().total).map(|p| e.infos.object(p).cloned()).collect()
    }

    #[test]
    fn infos_stay_sparse_through_cut_slice_concat() {
        // Reset info "i0", then steps 1..=5 with infos only on even steps.
        let mut e = new_episode();
        for t in 1..=5 {
            step(&mut e, t as f32);
        }
        let some = |s: &str| Some(s.to_string());
        assert_eq!(infos(&e), vec![some("i0"), None, some("i2"), None, some("i4"), None]);
        let Storage::Sparse { items, .. } = &e.infos.storage else { panic!("infos not sparse") };
        assert_eq!(items.len(), 3, "absent infos take no room");

        assert_eq!(e.cut_info_positions(2).unwrap(), vec![3, 4, 5]);
        let succ = e.cut(2).unwrap();
        assert_eq!(infos(&succ), vec![None, some("i4"), None]);
        assert_eq!(e.slice_info_positions(Some(1), Some(3), None, Some(1)).unwrap(), vec![0, 1, 2, 3]);
        let sliced = e.slice(Some(1), Some(3), None, Some(1)).unwrap();
        assert_eq!(infos(&sliced), vec![some("i0"), None, some("i2"), None]);
        assert_eq!(e.slice_info_positions(Some(0), None, Some(2), Some(0)).unwrap(), vec![0, 2, 4]);

        let mut succ = succ;
        step(&mut succ, 6.0);
        let mut joined = e.clone();
        joined.concat(&succ, |_: TypedItem<'_>| String::new()).unwrap();
        assert_eq!(infos(&joined), vec![some("i0"), None, some("i2"), None, some("i4"), None, some("i6")]);
    }

    #[test]
    fn concat_takes_a_key_new_in_the_other_chunk_only_where_this_one_has_no_step() {
        let mut first = new_episode();
        first.extra_model_outputs.clear();
        let scalar = Schema::new(vec![Leaf::new(DType::F32, vec![])]);
        let mut second = first.cut(0).unwrap();
        second.extra_model_outputs.push(("logp".into(), Field::typed(scalar.clone(), false)));
        step(&mut second, 1.0);
        let mut joined = first.clone();
        joined.concat(&second, |_: TypedItem<'_>| String::new()).unwrap();
        assert_eq!(read(joined.extra("logp").unwrap()), vec![-1.0]);
        assert_eq!((joined.t, joined.extra("logp").unwrap().lookback()), (1, 0));

        // With a step here that has none of the key, the columns would not line up.
        let no_extras = Step {
            observation: f32_item(1.0),
            action: f32_item(1.0),
            reward: f32_item(1.0),
            info: None,
            extra_model_outputs: vec![],
            terminated: false,
            truncated: false,
        };
        first.add_step(no_extras, |_: TypedItem<'_>| String::new()).unwrap();
        let mut later = first.cut(0).unwrap();
        later.extra_model_outputs.push(("logp".into(), Field::typed(scalar, false)));
        step(&mut later, 2.0);
        let before = first.clone();
        let err = first.concat(&later, |_: TypedItem<'_>| String::new()).unwrap_err();
        assert!(err.to_string().contains("\"logp\" is not in this episode, which has 1 steps"), "{err}");
        assert_eq!(first, before, "nothing changes");
    }

    #[test]
    fn concat_onto_a_numpyd_chunk_without_steps_switches_the_step_fields() {
        let mut first = new_episode();
        first.to_numpy().unwrap();
        assert!(first.observations.finalized && !first.rewards.finalized, "no steps yet");
        let mut next = first.cut(0).unwrap();
        step(&mut next, 1.0);
        next.to_numpy().unwrap();
        let mut joined = first.clone();
        joined.concat(&next, |_: TypedItem<'_>| String::new()).unwrap();
        let mut whole = new_episode();
        step(&mut whole, 1.0);
        whole.to_numpy().unwrap();
        for (a, b) in [(&joined.actions, &whole.actions), (&joined.rewards, &whole.rewards)] {
            assert!(a.finalized && b.finalized);
        }
        assert!(joined.extra("logp").unwrap().finalized);
        // A chunk that was not numpy'd stays as it is, and so does one followed by a
        // chunk that was not.
        let mut plain = new_episode();
        plain.concat(&next, |_: TypedItem<'_>| String::new()).unwrap();
        assert!(!plain.rewards.finalized && !plain.observations.finalized);
        let mut lists = new_episode().cut(0).unwrap();
        step(&mut lists, 1.0);
        let mut mixed = first.clone();
        mixed.concat(&lists, |_: TypedItem<'_>| String::new()).unwrap();
        assert!(mixed.observations.finalized && !mixed.rewards.finalized);
    }

    #[test]
    fn concat_keeps_both_done_flags() {
        let e = new_episode();
        for (terminated, truncated) in [(true, true), (true, false), (false, true), (false, false)] {
            let mut next = e.cut(0).unwrap();
            step(&mut next, 1.0);
            next.is_terminated = terminated;
            next.is_truncated = truncated;
            let mut joined = e.clone();
            joined.concat(&next, |_: TypedItem<'_>| String::new()).unwrap();
            assert_eq!((joined.is_terminated, joined.is_truncated), (terminated, truncated));
        }
    }

    #[test]
    fn concat_rejects_gaps() {
        let mut e = new_episode();
        step(&mut e, 1.0);
        let mut other = e.cut(0).unwrap();
        other.t_started = 9;
        assert!(matches!(
            e.concat(&other, |_: TypedItem<'_>| String::new()),
            Err(EpisodeError::NotContinuation(_))
        ));
    }

    #[test]
    fn specs_travel_with_their_fields_through_cut_slice_and_concat() {
        // A spec per field (a name here), shared by pointer.
        let spec = |name: &'static str| Some(Arc::new(name));
        let scalar = || Schema::new(vec![Leaf::new(DType::F32, vec![])]);
        let typed = |name| Field { spec: spec(name), ..Field::typed(scalar(), false) };
        let mut e: SingleAgentCore<String, &'static str> = SingleAgentCore {
            observations: typed("obs"),
            actions: typed("act"),
            rewards: typed("rew"),
            extra_model_outputs: vec![("logp".into(), typed("logp"))],
            ..SingleAgentCore::default()
        };
        let no_object = |_: TypedItem<'_, &'static str>| String::new();
        e.add_reset(f32_item(0.0), None, no_object).unwrap();
        for t in 1..=3 {
            let s = Step {
                observation: f32_item(t as f32),
                action: f32_item(1.0),
                reward: f32_item(1.0),
                info: None,
                extra_model_outputs: vec![("logp", f32_item(-1.0))],
                terminated: false,
                truncated: false,
            };
            e.add_step(s, no_object).unwrap();
        }
        let specs = |c: &SingleAgentCore<String, &'static str>| {
            let mut v: Vec<_> = [&c.observations, &c.actions, &c.rewards].map(|f| f.spec().copied()).to_vec();
            v.push(c.extra("logp").and_then(|f| f.spec().copied()));
            v
        };
        let all = vec![Some("obs"), Some("act"), Some("rew"), Some("logp")];
        let cut = e.cut(1).unwrap();
        assert_eq!(specs(&cut), all);
        assert!(Arc::ptr_eq(cut.observations.spec.as_ref().unwrap(), e.observations.spec.as_ref().unwrap()));
        assert!(cut.rewards_fill_f32, "a cut keeps RLlib's float32 rewards space");
        let sliced = e.slice(Some(1), None, None, None).unwrap();
        assert_eq!(specs(&sliced), all);
        assert!(!sliced.rewards_fill_f32, "RLlib 2.60's slice() builds rewards without it");
        // A chunk without specs takes the continuation's; its own stay.
        let mut bare: SingleAgentCore<String, &'static str> = e.clone();
        bare.actions.spec = None;
        bare.observations.spec = spec("mine");
        bare.concat(&cut, no_object).unwrap();
        assert_eq!(bare.actions.spec(), Some(&"act"));
        assert_eq!(bare.observations.spec(), Some(&"mine"));
    }

    #[test]
    fn slice_matches_rllib_rules() {
        let mut e = new_episode();
        for t in 1..=6 {
            step(&mut e, t as f32);
        }
        let s = e.slice(Some(2), Some(4), None, None).unwrap();
        assert_eq!((s.t_started, s.t, s.len()), (2, 4, 2));
        assert_eq!(read(&s.observations), vec![2.0, 3.0, 4.0]);
        assert_eq!(read(&s.rewards), vec![300.0, 400.0]);
        let s = e.slice(Some(2), Some(4), None, Some(2)).unwrap();
        assert_eq!(s.rewards.lookback(), 2);
        let s = e.slice(Some(-2), None, None, Some(9)).unwrap();
        assert_eq!(read(&s.actions), vec![50.0, 60.0]);
        assert_eq!(s.actions.lookback(), 4, "look-back capped at what is stored");
        let mut done = e.clone();
        done.is_truncated = true;
        assert!(done.slice(Some(1), None, None, None).unwrap().is_truncated);
        assert!(!done.slice(Some(1), Some(3), None, None).unwrap().is_truncated);
    }

    #[test]
    fn objects_fall_back_and_merge() {
        let mut e: Core = Core::default();
        e.add_reset(
            Item::FirstTyped {
                schema: Schema::new(vec![Leaf::new(DType::I64, vec![])]).into(),
                leaves: vec![1i64.to_ne_bytes().to_vec()].into(),
                host_scalars: true,
                spec: None,
            },
            None,
            |_: TypedItem<'_>| String::new(),
        )
        .unwrap();
        let s = Step {
            observation: Item::Object("text".into()),
            action: Item::Object("a".into()),
            reward: f32_item(1.0),
            info: None,
            extra_model_outputs: vec![],
            terminated: false,
            truncated: false,
        };
        assert!(!e.rewards.accepts(&f32_item(1.0)), "untyped field needs FirstTyped");
        let s = Step {
            reward: Item::FirstTyped {
                schema: Schema::new(vec![Leaf::new(DType::F32, vec![])]).into(),
                leaves: vec![1f32.to_ne_bytes().to_vec()].into(),
                host_scalars: true,
                spec: None,
            },
            ..s
        };
        e.add_step(s, |t: TypedItem<'_>| format!("{:?}", t.column.item(0, t.pos))).unwrap();
        match &e.observations.storage {
            Storage::Objects { items, .. } => assert_eq!(items.len(), 2),
            _ => panic!("observations should have become objects"),
        }
        let g = e.observations.geometry();
        assert_eq!(g.resolve(&Index::Int(-1), false, false), Ok(Resolved::One(Pos::At(1))));
    }
}
