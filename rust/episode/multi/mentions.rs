//! The agents one env step mentions, and what the step gives each, as RLlib reads a
//! step's dicts:
//! - observations, actions, rewards, terminateds and truncateds name agents;
//! - infos and extra model outputs only add to agents named elsewhere;
//! - `"__all__"` is no agent: in terminateds/truncateds it sets the episode's flags and,
//!   when set, names every agent that has an episode;
//! - a value of `None` counts as not given, except that an agent whose key is in the
//!   rewards dict "has a reward" whatever its value ([`Mention::has_reward`]).
//!
//! Generic over the id type `K`, the value type `V` and what the host keeps per agent `H`
//! (its books' entries): the binding walks the Python dicts, and tells ids apart through
//! [`AgentIds`].

use smallvec::SmallVec;

use super::agent::AgentStepInput;
use super::env_step::episode_ends;

/// Per-agent values of one env step: inline up to eight agents (no heap block per step).
pub type AgentVec<T> = SmallVec<[T; 8]>;

/// How the agent ids of one step are told apart.
pub trait AgentIds<K> {
    type Error;

    /// Whether `a` and `b` are the very same id (no equality call: the dicts of one step
    /// usually list the same id objects in the same order).
    fn same(a: &K, b: &K) -> bool;

    /// Whether `id` is the key `"__all__"`.
    ///
    /// # Errors
    /// Where comparing the id fails.
    fn is_all(&mut self, id: &K) -> Result<bool, Self::Error>;

    /// The position of the first of `rows` whose id equals `id`.
    ///
    /// # Errors
    /// Where comparing ids fails.
    fn find<V, H>(&mut self, rows: &[Mention<K, V, H>], id: &K) -> Result<Option<usize>, Self::Error>;

    /// `id` was appended at position `at` of the ids [`Self::find`] is given.
    ///
    /// # Errors
    /// Where recording the id fails.
    fn added(&mut self, id: &K, at: usize) -> Result<(), Self::Error>;
}

/// One agent an env step mentions, with what the step gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct Mention<K, V, H = ()> {
    pub id: K,
    pub observation: Option<V>,
    pub action: Option<V>,
    pub reward: Option<V>,
    /// The agent is a key of the rewards dict (its value may be `None`).
    pub has_reward: bool,
    pub info: Option<V>,
    pub extra: Option<V>,
    pub terminated: bool,
    pub truncated: bool,
    /// What the host keeps for the agent (the core does not read it).
    pub host: H,
}

impl<K, V, H: Default> Mention<K, V, H> {
    fn new(id: K) -> Self {
        Mention {
            id,
            observation: None,
            action: None,
            reward: None,
            has_reward: false,
            info: None,
            extra: None,
            terminated: false,
            truncated: false,
            host: H::default(),
        }
    }

    /// The step's part of the agent's plan input; `book` gives the agent's own facts
    /// (episode, step map, hanging action), its step fields are replaced.
    #[must_use]
    #[inline]
    pub fn step_input(&self, book: AgentStepInput) -> AgentStepInput {
        AgentStepInput {
            has_observation: self.observation.is_some(),
            has_action: self.action.is_some(),
            has_reward: self.has_reward,
            has_any_data: self.observation.is_some()
                || self.action.is_some()
                || self.reward.is_some()
                || self.info.is_some()
                || self.extra.is_some(),
            terminated: self.terminated,
            truncated: self.truncated,
            ..book
        }
    }
}

/// The agents one env step mentions, in first-mention order, and its `"__all__"` flags.
///
/// The step's dicts are read in order: observations first ([`Self::observation`]), then
/// actions, rewards, terminateds and truncateds, then (when `"__all__"` is set) the ids of
/// the agents with an episode, then infos and extra model outputs. Each read takes the
/// entry's position in its dict as a hint: the row at that position usually holds the very
/// same id.
#[derive(Clone, Debug)]
pub struct Mentions<K, V, H = ()> {
    pub rows: AgentVec<Mention<K, V, H>>,
    pub all_terminated: bool,
    pub all_truncated: bool,
}

impl<K, V, H> Default for Mentions<K, V, H> {
    fn default() -> Self {
        Mentions { rows: AgentVec::new(), all_terminated: false, all_truncated: false }
    }
}

impl<K: Clone, V, H: Default> Mentions<K, V, H> {
    /// An entry of the observations dict, read first: its ids are distinct, so each
    /// agent gets a new row.
    ///
    /// # Errors
    /// Where [`AgentIds::is_all`] fails.
    #[inline]
    pub fn observation<I: AgentIds<K>>(
        &mut self,
        ids: &mut I,
        id: &K,
        value: Option<V>,
    ) -> Result<(), I::Error> {
        if !ids.is_all(id)? {
            let mut row = Mention::new(id.clone());
            row.observation = value;
            self.rows.push(row);
        }
        Ok(())
    }

    /// An entry of the actions dict at position `hint`.
    ///
    /// # Errors
    /// Where telling the id apart fails.
    #[inline]
    pub fn action<I: AgentIds<K>>(
        &mut self,
        ids: &mut I,
        id: &K,
        hint: usize,
        value: Option<V>,
    ) -> Result<(), I::Error> {
        if let Some(row) = self.agent(ids, id, hint)? {
            row.action = value;
        }
        Ok(())
    }

    /// An entry of the rewards dict at position `hint`.
    ///
    /// # Errors
    /// Where telling the id apart fails.
    #[inline]
    pub fn reward<I: AgentIds<K>>(
        &mut self,
        ids: &mut I,
        id: &K,
        hint: usize,
        value: Option<V>,
    ) -> Result<(), I::Error> {
        if let Some(row) = self.agent(ids, id, hint)? {
            row.has_reward = true;
            row.reward = value;
        }
        Ok(())
    }

    /// An entry of the terminateds (or with `truncated`, the truncateds) dict at position
    /// `hint`, set or not (`on`); `"__all__"` sets the episode's flag.
    ///
    /// # Errors
    /// Where telling the id apart fails.
    #[inline]
    pub fn flag<I: AgentIds<K>>(
        &mut self,
        ids: &mut I,
        id: &K,
        hint: usize,
        on: bool,
        truncated: bool,
    ) -> Result<(), I::Error> {
        let (terminated_flag, truncated_flag) = match self.agent(ids, id, hint)? {
            Some(row) => (&mut row.terminated, &mut row.truncated),
            None => (&mut self.all_terminated, &mut self.all_truncated),
        };
        *if truncated { truncated_flag } else { terminated_flag } = on;
        Ok(())
    }

    /// Whether `"__all__"` ends the episode at this step; then every agent with an
    /// episode is mentioned ([`Self::named`]).
    #[must_use]
    #[inline]
    pub fn all_flagged(&self) -> bool {
        self.all_terminated || self.all_truncated
    }

    /// An agent with an episode, at position `hint` of the episode's agents, mentioned
    /// because `"__all__"` ends the episode.
    ///
    /// # Errors
    /// Where telling the id apart fails.
    #[inline]
    pub fn named<I: AgentIds<K>>(&mut self, ids: &mut I, id: &K, hint: usize) -> Result<(), I::Error> {
        self.agent(ids, id, hint).map(drop)
    }

    /// An entry of the infos dict at position `hint`: kept for a mentioned agent only.
    ///
    /// # Errors
    /// Where telling the id apart fails.
    #[inline]
    pub fn info<I: AgentIds<K>>(
        &mut self,
        ids: &mut I,
        id: &K,
        hint: usize,
        value: Option<V>,
    ) -> Result<(), I::Error> {
        self.add_to_mentioned(ids, id, hint, value, |row| &mut row.info)
    }

    /// An entry of the extra model outputs dict at position `hint`: kept for a mentioned
    /// agent only.
    ///
    /// # Errors
    /// Where telling the id apart fails.
    #[inline]
    pub fn extra<I: AgentIds<K>>(
        &mut self,
        ids: &mut I,
        id: &K,
        hint: usize,
        value: Option<V>,
    ) -> Result<(), I::Error> {
        self.add_to_mentioned(ids, id, hint, value, |row| &mut row.extra)
    }

    /// Puts a given `value` into the `slot` of `id`'s row, if the step mentions the agent.
    #[inline]
    fn add_to_mentioned<I: AgentIds<K>>(
        &mut self,
        ids: &mut I,
        id: &K,
        hint: usize,
        value: Option<V>,
        slot: impl FnOnce(&mut Mention<K, V, H>) -> &mut Option<V>,
    ) -> Result<(), I::Error> {
        let Some(value) = value else { return Ok(()) };
        if let Some(i) = self.find(ids, id, hint)? {
            *slot(&mut self.rows[i]) = Some(value);
        }
        Ok(())
    }

    /// Whether the episode ends at this step, `(terminated, truncated)`: as `"__all__"`
    /// says, or (as terminated) when every agent whose episode is not done is flagged now.
    /// `agents` gives each agent with an episode and whether that episode is done, in the
    /// episode's order; `flagged` whether an agent this step does not mention is flagged
    /// (by a flag dict entry that named no row). The walk stops at the first live agent
    /// that is not flagged. (Agents are usually mentioned in the order of their episodes:
    /// the `j`-th agent is looked for in row `j` first.)
    ///
    /// # Errors
    /// Where `agents` or `flagged` fail.
    pub fn episode_ends<I: AgentIds<K>, E>(
        &self,
        agents: impl IntoIterator<Item = Result<(K, bool), E>>,
        mut flagged: impl FnMut(&K) -> Result<bool, E>,
    ) -> Result<(bool, bool), E> {
        let mut every_live_agent_flagged = true;
        for (j, agent) in agents.into_iter().enumerate() {
            let (id, done) = agent?;
            if done {
                continue;
            }
            let row = self.rows.get(j).filter(|r| I::same(&r.id, &id));
            let on = match row.or_else(|| self.rows.iter().find(|r| I::same(&r.id, &id))) {
                Some(r) => r.terminated || r.truncated,
                None => flagged(&id)?,
            };
            if !on {
                every_live_agent_flagged = false;
                break;
            }
        }
        Ok(episode_ends(self.all_terminated, self.all_truncated, [every_live_agent_flagged]))
    }

    /// The row of agent `id`; `None` for `"__all__"`. The usual case inline: `id` is the
    /// very id of row `hint` (then an agent), found without a call.
    #[inline]
    fn agent<I: AgentIds<K>>(
        &mut self,
        ids: &mut I,
        id: &K,
        hint: usize,
    ) -> Result<Option<&mut Mention<K, V, H>>, I::Error> {
        if self.rows.get(hint).is_some_and(|r| I::same(&r.id, id)) {
            return Ok(Some(&mut self.rows[hint]));
        }
        self.other_agent(ids, id)
    }

    /// [`Self::agent`] where the hint fails: `"__all__"`, a row found by equality, or a
    /// new row.
    #[inline(never)]
    fn other_agent<I: AgentIds<K>>(
        &mut self,
        ids: &mut I,
        id: &K,
    ) -> Result<Option<&mut Mention<K, V, H>>, I::Error> {
        if ids.is_all(id)? {
            return Ok(None);
        }
        let i = if let Some(i) = ids.find(&self.rows, id)? {
            i
        } else {
            let i = self.rows.len();
            ids.added(id, i)?;
            self.rows.push(Mention::new(id.clone()));
            i
        };
        Ok(Some(&mut self.rows[i]))
    }

    /// The row of `id` if the step mentions it: row `hint` when it holds this very id
    /// (inline), else looked up.
    #[inline]
    fn find<I: AgentIds<K>>(&self, ids: &mut I, id: &K, hint: usize) -> Result<Option<usize>, I::Error> {
        if self.rows.get(hint).is_some_and(|r| I::same(&r.id, id)) {
            return Ok(Some(hint));
        }
        ids.find(&self.rows, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids are strings; "same" is equality of the text and its hint position being kept
    /// apart is checked through `finds` (the lookups made).
    #[derive(Default)]
    struct Ids {
        finds: usize,
    }

    impl AgentIds<&'static str> for Ids {
        type Error = ();
        fn same(a: &&'static str, b: &&'static str) -> bool {
            std::ptr::eq(*a, *b)
        }
        fn is_all(&mut self, id: &&'static str) -> Result<bool, ()> {
            Ok(*id == "__all__")
        }
        fn find<V, H>(
            &mut self,
            rows: &[Mention<&'static str, V, H>],
            id: &&'static str,
        ) -> Result<Option<usize>, ()> {
            self.finds += 1;
            Ok(rows.iter().position(|r| r.id == *id))
        }
        fn added(&mut self, _: &&'static str, _: usize) -> Result<(), ()> {
            Ok(())
        }
    }

    type M = Mentions<&'static str, i32>;

    #[test]
    fn observations_actions_rewards_and_flags_name_agents_in_first_mention_order() {
        let (a, b, c, all) = ("a", "b", "c", "__all__");
        let mut ids = Ids::default();
        let mut m = M::default();
        m.observation(&mut ids, &a, Some(1)).unwrap();
        m.observation(&mut ids, &all, Some(9)).unwrap();
        m.action(&mut ids, &b, 0, Some(2)).unwrap();
        m.reward(&mut ids, &a, 0, Some(3)).unwrap();
        m.flag(&mut ids, &c, 0, true, true).unwrap();
        let names: Vec<_> = m.rows.iter().map(|r| r.id).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!((m.rows[0].observation, m.rows[0].reward, m.rows[0].has_reward), (Some(1), Some(3), true));
        assert_eq!((m.rows[1].action, m.rows[1].has_reward), (Some(2), false));
        assert!(m.rows[2].truncated && !m.rows[2].terminated);
        // "__all__" got no row.
        assert!(!m.all_flagged());
    }

    #[test]
    fn a_reward_of_none_still_counts_as_having_a_reward_but_not_as_data() {
        let mut ids = Ids::default();
        let mut m = M::default();
        m.reward(&mut ids, &"a", 0, None).unwrap();
        let input = m.rows[0].step_input(AgentStepInput::default());
        assert!(input.has_reward && !input.has_any_data && !input.has_observation);
    }

    #[test]
    fn infos_and_extra_outputs_only_add_to_mentioned_agents() {
        let mut ids = Ids::default();
        let mut m = M::default();
        m.observation(&mut ids, &"a", Some(1)).unwrap();
        m.info(&mut ids, &"a", 0, Some(5)).unwrap();
        m.info(&mut ids, &"z", 1, Some(6)).unwrap();
        m.extra(&mut ids, &"z", 0, Some(7)).unwrap();
        m.extra(&mut ids, &"a", 0, None).unwrap();
        assert_eq!(m.rows.len(), 1);
        assert_eq!((m.rows[0].info, m.rows[0].extra), (Some(5), None));
        let input = m.rows[0].step_input(AgentStepInput::default());
        assert!(input.has_any_data && input.has_observation);
    }

    #[test]
    fn all_sets_the_episode_flags_and_names_the_agents_with_episodes() {
        let mut ids = Ids::default();
        let mut m = M::default();
        m.observation(&mut ids, &"a", Some(1)).unwrap();
        m.flag(&mut ids, &"__all__", 0, true, false).unwrap();
        assert!(m.all_flagged() && m.all_terminated && !m.all_truncated);
        m.named(&mut ids, &"a", 0).unwrap();
        m.named(&mut ids, &"b", 1).unwrap();
        let names: Vec<_> = m.rows.iter().map(|r| r.id).collect();
        assert_eq!(names, ["a", "b"]);
        // A later false entry clears it.
        m.flag(&mut ids, &"__all__", 0, false, false).unwrap();
        assert!(!m.all_flagged());
    }

    #[test]
    fn ids_at_their_hint_are_found_without_a_lookup() {
        let (a, b) = ("a", "b");
        let mut ids = Ids::default();
        let mut m = M::default();
        m.observation(&mut ids, &a, Some(1)).unwrap();
        m.observation(&mut ids, &b, Some(1)).unwrap();
        m.action(&mut ids, &a, 0, Some(0)).unwrap();
        m.action(&mut ids, &b, 1, Some(0)).unwrap();
        assert_eq!(ids.finds, 0);
        // Out of order: looked up, and still the same rows.
        m.reward(&mut ids, &b, 0, Some(1)).unwrap();
        assert_eq!((ids.finds, m.rows.len(), m.rows[1].has_reward), (1, 2, true));
    }

    #[test]
    fn the_episode_ends_when_all_says_so_or_every_live_agent_is_flagged() {
        let (a, b, c) = ("a", "b", "c");
        let mut ids = Ids::default();
        let mut m = M::default();
        m.observation(&mut ids, &a, Some(1)).unwrap();
        m.flag(&mut ids, &a, 0, true, false).unwrap();
        let agents = |list: Vec<(&'static str, bool)>| list.into_iter().map(Ok::<_, ()>);
        // b is done already; c is not mentioned and its flag entry is unset.
        let ends = m.episode_ends::<Ids, ()>(agents(vec![(a, false), (b, true)]), |_| Ok(false)).unwrap();
        assert_eq!(ends, (true, false));
        let ends = m.episode_ends::<Ids, ()>(agents(vec![(a, false), (c, false)]), |_| Ok(false)).unwrap();
        assert_eq!(ends, (false, false));
        // The walk stops at the first live agent that is not flagged.
        let mut asked = Vec::new();
        let ends = m
            .episode_ends::<Ids, ()>(agents(vec![(c, false), (b, false)]), |id| {
                asked.push(*id);
                Ok(false)
            })
            .unwrap();
        assert_eq!((ends, asked), ((false, false), vec!["c"]));
        m.flag(&mut ids, &"__all__", 0, true, true).unwrap();
        let ends = m.episode_ends::<Ids, ()>(agents(vec![(c, false)]), |_| Ok(false)).unwrap();
        assert_eq!(ends, (false, true));
    }
}
