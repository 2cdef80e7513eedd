//! One env step of a multi-agent episode as a plan: every agent's part decided, and the
//! whole step checked, before anything is recorded.
//!
//! The binding turns the step's dicts into one [`AgentStep`] per agent the step mentions,
//! asks [`plan_env_step`] for the plan, converts the values the plan records, and only
//! then applies it: an error anywhere leaves the episode as it was.

use super::agent::{plan_agent_step, AgentPlan, AgentStepError, AgentStepInput, Source};
use super::mentions::AgentVec;

/// One agent an env step mentions: what the step holds for it and its bookkeeping before
/// the step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStep {
    /// The step's data for the agent; `terminated`/`truncated` are the agent's own flags
    /// (the episode's are added by the plan).
    pub input: AgentStepInput,
    /// Steps in the agent's episode chunk before this env step (0 without an episode).
    pub agent_len: usize,
    /// The agent step at which the agent's chunk starts (`agent_t_started`), if set.
    pub t_started: Option<i64>,
}

/// An env step: the agents it mentions (in the order their parts are applied) and the
/// episode's counters before it.
#[derive(Clone, Copy, Debug)]
pub struct EnvStep<'a> {
    pub agents: &'a [AgentStep],
    /// The episode ends at this step (from [`episode_ends`]).
    pub terminated: bool,
    pub truncated: bool,
    /// The env step the chunk is at before this one, and the one it started at.
    pub env_t: i64,
    pub env_t_started: i64,
    /// Env steps of look-back at the chunk's start.
    pub lookback: usize,
}

/// What a step does to an agent's env-step map, besides the skip every existing map of an
/// agent that does not observe at this step gets first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapWrite {
    /// Nothing more.
    Nothing,
    /// The agent stepped: its agent step.
    Step(i64),
    /// The agent joins: a new map with `skips` skips (one per env step of the chunk before
    /// this one, look-back included), then agent step 0, under `lookback`.
    Join { skips: usize, lookback: usize },
}

/// What a step does to an agent's hanging data (its action waiting for an observation,
/// that action's extra outputs, and the rewards before its first and after its last
/// observation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Hanging {
    Keep,
    /// The hanging action, its extra outputs and reward were used by this step.
    TakeEnd,
    /// The agent is done: all its hanging data goes.
    Clear,
    /// The agent acted and waits: its action and extra outputs hang, with this reward.
    SetEnd(f64),
    /// A reward after the agent's last observation (its action hangs).
    AddEnd(f64),
    /// A reward before the agent's first observation.
    AddBegin(f64),
}

/// The plan for one agent the step mentions.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(clippy::struct_excessive_bools)] // independent facts about one agent's part
pub struct AgentOutcome {
    /// What to record in the agent's episode (RLlib's rules, [`plan_agent_step`]).
    pub plan: AgentPlan,
    /// The agent's flags with the episode's added.
    pub terminated: bool,
    pub truncated: bool,
    /// The reward a recorded step gets (`Step`): the step's, plus the hanging reward when
    /// the plan adds it (`hanging_reward_end` of the agent, given by the caller then).
    pub add_hanging_reward: bool,
    pub map: MapWrite,
    pub hanging: Hanging,
    /// `agent_t_started` is unset and the step sets it to 0 (RLlib's defaultdict).
    pub set_t_started: bool,
    /// The agent's hanging data was dropped without a record: a later `concat_episode`
    /// drops what the chunk before holds for it too.
    pub dropped: bool,
}

/// The plan of one env step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvStepPlan {
    /// The episode's env step and flags after the step.
    pub env_t: i64,
    pub terminated: bool,
    pub truncated: bool,
    /// One outcome per [`EnvStep::agents`] entry, in the same order (inline up to eight
    /// agents: no heap block per env step).
    pub agents: AgentVec<AgentOutcome>,
}

/// Whether the episode ends at a step: when `__all__` says so, or (as terminated) when
/// every agent whose episode is not done yet is flagged at this step (`live_flagged`: one
/// entry per such agent; it stops at the first `false`).
pub fn episode_ends(
    all_terminated: bool,
    all_truncated: bool,
    live_flagged: impl IntoIterator<Item = bool>,
) -> (bool, bool) {
    let every_agent_done = live_flagged.into_iter().all(|flagged| flagged);
    (all_terminated || every_agent_done, all_truncated)
}

/// Plans one env step for every agent it mentions, rewards as given per agent
/// (`rewards[i]` for `step.agents[i]`, 0 where absent).
///
/// Returns the index of the first agent whose part breaks RLlib's rules, with why; no
/// part of a failed plan is applied.
pub fn plan_env_step(step: &EnvStep<'_>, rewards: &[f64]) -> Result<EnvStepPlan, (usize, AgentStepError)> {
    let mut plan = EnvStepPlan::default();
    plan_env_step_into(step, rewards, &mut plan)?;
    Ok(plan)
}

/// [`plan_env_step`] into `plan` (the caller's, filled in place: a plan moved out of a
/// call is copied whole, its agents inline). On error `plan` holds the agents planned
/// before the failing one.
///
/// # Errors
/// As [`plan_env_step`].
pub fn plan_env_step_into(
    step: &EnvStep<'_>,
    rewards: &[f64],
    plan: &mut EnvStepPlan,
) -> Result<(), (usize, AgentStepError)> {
    let env_t = step.env_t + 1;
    let agents = &mut plan.agents;
    agents.clear();
    for (i, agent) in step.agents.iter().enumerate() {
        let terminated = agent.input.terminated || step.terminated;
        let truncated = agent.input.truncated || step.truncated;
        let input = AgentStepInput { terminated, truncated, ..agent.input };
        let plan = plan_agent_step(&input).map_err(|e| (i, e))?;
        let reward = rewards.get(i).copied().unwrap_or(0.0);
        let mut outcome = AgentOutcome {
            plan,
            terminated,
            truncated,
            add_hanging_reward: false,
            map: MapWrite::Nothing,
            hanging: Hanging::Keep,
            set_t_started: false,
            dropped: false,
        };
        match plan {
            AgentPlan::Step { action, add_hanging_reward, .. } => {
                let t_started = agent.t_started.unwrap_or(0);
                outcome.add_hanging_reward = add_hanging_reward;
                outcome.set_t_started = agent.t_started.is_none();
                outcome.map = MapWrite::Step(t_started + agent.agent_len as i64 + 1);
                outcome.hanging = if terminated || truncated {
                    Hanging::Clear
                } else if action == Source::Hanging {
                    Hanging::TakeEnd
                } else {
                    Hanging::Keep
                };
            }
            AgentPlan::Join => {
                // RLlib 2.60 counts the skips from the episode's start (env_t), which
                // misplaces agents that join in a later chunk; counted from the chunk's.
                let skips = env_t - step.env_t_started + step.lookback as i64;
                outcome.map =
                    MapWrite::Join { skips: usize::try_from(skips).unwrap_or(0), lookback: step.lookback };
                outcome.hanging = Hanging::AddBegin(reward);
            }
            AgentPlan::Hang => outcome.hanging = Hanging::SetEnd(reward),
            AgentPlan::AddReward { begin } => {
                outcome.hanging = if begin { Hanging::AddBegin(reward) } else { Hanging::AddEnd(reward) };
            }
            AgentPlan::Drop => {
                outcome.hanging = Hanging::Clear;
                outcome.dropped = true;
            }
        }
        agents.push(outcome);
    }
    (plan.env_t, plan.terminated, plan.truncated) = (env_t, step.terminated, step.truncated);
    Ok(())
}

/// One piece of an agent's hanging data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The action it was asked for and has not been rewarded for yet.
    Action,
    /// That action's extra model outputs.
    ExtraOutputs,
    /// Rewards collected since that action.
    RewardEnd,
    /// Rewards collected before its first observation.
    RewardBegin,
}

/// What a taken hanging action leaves behind: nothing of it.
pub(super) const TAKEN: [Slot; 3] = [Slot::Action, Slot::ExtraOutputs, Slot::RewardEnd];
/// What a done agent leaves behind: none of its hanging data.
pub(super) const CLEARED: [Slot; 4] = [Slot::RewardBegin, Slot::Action, Slot::ExtraOutputs, Slot::RewardEnd];

/// The episode's per-agent books as an [`EnvStepPlan`] writes them, wherever they are held
/// (the binding: RLlib's dicts on the Python episode; the tests: a model). `agent` is an
/// index into the plan's agents.
pub trait Books {
    type Error;
    /// Appends a skip to the map of every agent that has a map and does not observe at
    /// this step (called first).
    fn skip_unobserved(&mut self) -> Result<(), Self::Error>;
    /// Records the agent's own part of the plan ([`AgentOutcome::plan`]) from the values
    /// converted for it: its step, its first observation, or its action left hanging.
    fn record(&mut self, agent: usize, outcome: &AgentOutcome) -> Result<(), Self::Error>;
    /// Appends `count` entries `step` to the agent's map (made empty if it has none).
    fn push_map(&mut self, agent: usize, step: Option<i64>, count: usize) -> Result<(), Self::Error>;
    fn set_map_lookback(&mut self, agent: usize, lookback: usize) -> Result<(), Self::Error>;
    fn set_t_started(&mut self, agent: usize, t: i64) -> Result<(), Self::Error>;
    /// Removes one piece of the agent's hanging data (nothing if it has none).
    fn remove(&mut self, agent: usize, slot: Slot) -> Result<(), Self::Error>;
    /// Sets a hanging reward ([`Slot::RewardEnd`] or [`Slot::RewardBegin`]), replacing it.
    fn set_reward(&mut self, agent: usize, slot: Slot, reward: f64) -> Result<(), Self::Error>;
    /// Adds to a hanging reward (0 if it has none).
    fn add_reward(&mut self, agent: usize, slot: Slot, reward: f64) -> Result<(), Self::Error>;
    /// Marks the agent dropped in this chunk (see [`AgentOutcome::dropped`]).
    fn mark_dropped(&mut self, agent: usize) -> Result<(), Self::Error>;
}

impl EnvStepPlan {
    /// Applies the plan to `books`: the skips of agents that do not observe, then per
    /// agent in the plan's order its record, `agent_t_started`, its map entries, its
    /// hanging data and its dropped mark.
    ///
    /// Errors: the first error of `books` (the binding's only come from Python code that
    /// replaced RLlib's dicts with objects that refuse the writes).
    pub fn apply<B: Books>(&self, books: &mut B) -> Result<(), B::Error> {
        books.skip_unobserved()?;
        for (i, o) in self.agents.iter().enumerate() {
            books.record(i, o)?;
            if o.set_t_started {
                books.set_t_started(i, 0)?;
            }
            match o.map {
                MapWrite::Nothing => {}
                MapWrite::Step(t) => books.push_map(i, Some(t), 1)?,
                MapWrite::Join { skips, lookback } => {
                    books.push_map(i, None, skips)?;
                    books.push_map(i, Some(0), 1)?;
                    books.set_map_lookback(i, lookback)?;
                }
            }
            let remove_all =
                |books: &mut B, slots: &[Slot]| slots.iter().try_for_each(|s| books.remove(i, *s));
            match o.hanging {
                Hanging::Keep => {}
                Hanging::TakeEnd => remove_all(books, &TAKEN)?,
                Hanging::Clear => remove_all(books, &CLEARED)?,
                Hanging::SetEnd(r) => books.set_reward(i, Slot::RewardEnd, r)?,
                Hanging::AddEnd(r) => books.add_reward(i, Slot::RewardEnd, r)?,
                Hanging::AddBegin(r) => books.add_reward(i, Slot::RewardBegin, r)?,
            }
            if o.dropped {
                books.mark_dropped(i)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::struct_excessive_bools, clippy::float_cmp)] // flag-per-dict test data; exact binary rewards
mod tests {
    use super::super::StepMap;
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A test model of the episode's bookkeeping, to which plans are applied by
    /// [`EnvStepPlan::apply`] as the binding's are:
    /// per agent its map, chunk length, `agent_t_started`, done flag and hanging data.
    #[derive(Clone, Debug, Default, PartialEq)]
    struct Book {
        env_t: i64,
        terminated: bool,
        truncated: bool,
        agents: BTreeMap<&'static str, Agent>,
        /// Rewards given and then dropped or overwritten without being recorded.
        discarded: f64,
    }

    #[derive(Clone, Default, Debug, PartialEq)]
    struct Agent {
        map: Option<StepMap>,
        /// Recorded rewards (None for the join's observation-only entry).
        rewards: Vec<f64>,
        has_episode: bool,
        done: bool,
        t_started: Option<i64>,
        hanging_action: bool,
        reward_end: f64,
        reward_begin: f64,
        dropped: bool,
    }

    /// What one step holds for one agent.
    #[derive(Clone, Copy, Debug, Default)]
    struct Data {
        obs: bool,
        action: bool,
        reward: Option<f64>,
        terminated: bool,
        truncated: bool,
    }

    impl Book {
        fn reset(&mut self, agents: &[&'static str]) {
            for a in agents {
                let agent = self.agents.entry(a).or_default();
                agent.map = Some(StepMap::new(vec![Some(0)], 0));
                agent.has_episode = true;
            }
        }

        /// One env step; `all`: `__all__` terminated.
        fn step(&mut self, data: &[(&'static str, Data)], all: bool) -> Result<(), (usize, AgentStepError)> {
            let steps: Vec<AgentStep> = data
                .iter()
                .map(|(a, d)| {
                    let agent = self.agents.get(a);
                    AgentStep {
                        input: AgentStepInput {
                            has_observation: d.obs,
                            has_action: d.action,
                            has_reward: d.reward.is_some(),
                            has_any_data: d.obs || d.action || d.reward.is_some(),
                            terminated: d.terminated,
                            truncated: d.truncated,
                            has_episode: agent.is_some_and(|g| g.has_episode),
                            episode_done: agent.is_some_and(|g| g.done),
                            has_step_map: agent.is_some_and(|g| g.map.is_some()),
                            has_hanging_action: agent.is_some_and(|g| g.hanging_action),
                        },
                        agent_len: agent.map_or(0, |g| g.rewards.len()),
                        t_started: agent.and_then(|g| g.t_started),
                    }
                })
                .collect();
            let flagged = |a: &str| data.iter().any(|(b, d)| *b == a && (d.terminated || d.truncated));
            let (terminated, truncated) = episode_ends(
                all,
                false,
                self.agents.iter().filter(|(_, g)| g.has_episode && !g.done).map(|(a, _)| flagged(a)),
            );
            let rewards: Vec<f64> = data.iter().map(|(_, d)| d.reward.unwrap_or(0.0)).collect();
            let plan = plan_env_step(
                &EnvStep {
                    agents: &steps,
                    terminated,
                    truncated,
                    env_t: self.env_t,
                    env_t_started: 0,
                    lookback: 0,
                },
                &rewards,
            )?;
            let mut applying =
                Applying { book: self, data, rewards: &rewards, used_end: vec![false; data.len()] };
            match plan.apply(&mut applying) {
                Ok(()) => {}
                Err(never) => match never {},
            }
            (self.env_t, self.terminated, self.truncated) = (plan.env_t, plan.terminated, plan.truncated);
            Ok(())
        }

        fn map(&self, a: &str) -> Vec<Option<i64>> {
            self.agents[a].map.as_ref().map(|m| m.steps().to_vec()).unwrap_or_default()
        }
    }

    /// The model's books while one step's plan is applied: the step's agents and rewards,
    /// and whether a recorded step used the agent's hanging reward.
    struct Applying<'a> {
        book: &'a mut Book,
        data: &'a [(&'static str, Data)],
        rewards: &'a [f64],
        used_end: Vec<bool>,
    }

    impl Applying<'_> {
        fn agent(&mut self, i: usize) -> &mut Agent {
            self.book.agents.entry(self.data[i].0).or_default()
        }
    }

    impl Books for Applying<'_> {
        type Error = std::convert::Infallible;

        fn skip_unobserved(&mut self) -> Result<(), Self::Error> {
            for (a, agent) in &mut self.book.agents {
                if !self.data.iter().any(|(b, d)| b == a && d.obs) {
                    if let Some(m) = &mut agent.map {
                        m.push(None);
                    }
                }
            }
            Ok(())
        }

        fn record(&mut self, i: usize, o: &AgentOutcome) -> Result<(), Self::Error> {
            let reward = self.rewards[i];
            self.used_end[i] = o.add_hanging_reward;
            let agent = self.agent(i);
            match o.plan {
                AgentPlan::Step { .. } => {
                    let hanging = if o.add_hanging_reward { agent.reward_end } else { 0.0 };
                    agent.rewards.push(hanging + reward);
                    agent.done = o.terminated || o.truncated;
                }
                AgentPlan::Join => agent.has_episode = true,
                AgentPlan::Hang => agent.hanging_action = true,
                AgentPlan::AddReward { .. } | AgentPlan::Drop => {}
            }
            Ok(())
        }

        fn push_map(&mut self, i: usize, step: Option<i64>, count: usize) -> Result<(), Self::Error> {
            self.agent(i).map.get_or_insert_with(StepMap::default).extend(std::iter::repeat_n(step, count));
            Ok(())
        }

        fn set_map_lookback(&mut self, i: usize, lookback: usize) -> Result<(), Self::Error> {
            if let Some(m) = &mut self.agent(i).map {
                m.set_lookback(lookback);
            }
            Ok(())
        }

        fn set_t_started(&mut self, i: usize, t: i64) -> Result<(), Self::Error> {
            self.agent(i).t_started = Some(t);
            Ok(())
        }

        fn remove(&mut self, i: usize, slot: Slot) -> Result<(), Self::Error> {
            let used = self.used_end[i];
            let agent = self.book.agents.entry(self.data[i].0).or_default();
            let discarded = match slot {
                Slot::Action => {
                    agent.hanging_action = false;
                    0.0
                }
                Slot::ExtraOutputs => 0.0,
                // A hanging reward that the step recorded is not lost.
                Slot::RewardEnd if used => {
                    agent.reward_end = 0.0;
                    0.0
                }
                Slot::RewardEnd => std::mem::take(&mut agent.reward_end),
                Slot::RewardBegin => std::mem::take(&mut agent.reward_begin),
            };
            self.book.discarded += discarded;
            Ok(())
        }

        fn set_reward(&mut self, i: usize, slot: Slot, reward: f64) -> Result<(), Self::Error> {
            let agent = self.book.agents.entry(self.data[i].0).or_default();
            let old = match slot {
                Slot::RewardBegin => std::mem::replace(&mut agent.reward_begin, reward),
                _ => std::mem::replace(&mut agent.reward_end, reward),
            };
            // An overwritten hanging reward was never recorded.
            self.book.discarded += old;
            Ok(())
        }

        fn add_reward(&mut self, i: usize, slot: Slot, reward: f64) -> Result<(), Self::Error> {
            let agent = self.agent(i);
            *match slot {
                Slot::RewardBegin => &mut agent.reward_begin,
                _ => &mut agent.reward_end,
            } += reward;
            Ok(())
        }

        fn mark_dropped(&mut self, i: usize) -> Result<(), Self::Error> {
            // A dropped agent's reward at this step is not kept either.
            self.book.discarded += self.rewards[i];
            self.agent(i).dropped = true;
            Ok(())
        }
    }

    fn obs_act(r: f64) -> Data {
        Data { obs: true, action: true, reward: Some(r), ..Data::default() }
    }

    #[test]
    fn simultaneous_agents_step_together_and_end_when_all_are_done() {
        let mut b = Book::default();
        b.reset(&["a", "b"]);
        b.step(&[("a", obs_act(1.0)), ("b", obs_act(2.0))], false).unwrap();
        b.step(&[("a", Data { terminated: true, ..obs_act(1.0) }), ("b", obs_act(2.0))], false).unwrap();
        assert!(!b.terminated && b.agents["a"].done);
        assert_eq!(b.map("a"), [Some(0), Some(1), Some(2)]);
        // Data for a done agent is refused, and nothing of that step applies.
        let err = b.step(&[("b", obs_act(2.0)), ("a", obs_act(1.0))], false).unwrap_err();
        assert_eq!(err, (1, AgentStepError::AlreadyDone));
        assert_eq!((b.env_t, b.map("b")), (2, vec![Some(0), Some(1), Some(2)]));
        b.step(&[("b", Data { truncated: true, ..obs_act(2.0) })], false).unwrap();
        // b was the last live agent: the episode ends (terminated, as RLlib's does).
        assert!(b.terminated && !b.truncated);
        assert_eq!(b.agents["b"].rewards, [2.0, 2.0, 2.0]);
        // a's map keeps covering every env step with skips.
        assert_eq!(b.map("a"), [Some(0), Some(1), Some(2), None]);
    }

    #[test]
    fn turn_based_actions_hang_and_collect_rewards_until_the_next_observation() {
        let act = |r| Data { action: true, reward: Some(r), ..Data::default() };
        let observe = |r| Data { obs: true, reward: Some(r), ..Data::default() };
        let mut b = Book::default();
        b.reset(&["x"]);
        // Observing again without acting on the reset observation is refused.
        assert_eq!(
            b.step(&[("x", Data { obs: true, ..Data::default() })], false),
            Err((0, AgentStepError::ObservedWithoutActing))
        );
        assert_eq!((b.env_t, b.map("x")), (0, vec![Some(0)]));
        // x acts and o observes (joins): x's action hangs with its reward.
        b.step(&[("x", act(0.5)), ("o", Data { obs: true, ..Data::default() })], false).unwrap();
        assert!(b.agents["x"].hanging_action);
        assert_eq!(b.agents["x"].reward_end, 0.5);
        assert_eq!(b.map("o"), [None, Some(0)]);
        // o acts, x gets a reward while it waits, then observes: its hanging action is
        // recorded with every reward since.
        b.step(&[("o", act(0.0)), ("x", Data { reward: Some(0.25), ..Data::default() })], false).unwrap();
        assert_eq!(b.agents["x"].reward_end, 0.75);
        b.step(&[("x", observe(1.0))], false).unwrap();
        assert_eq!(b.agents["x"].rewards, [1.75]);
        assert!(!b.agents["x"].hanging_action);
        assert_eq!(b.map("x"), [Some(0), None, None, Some(1)]);
        // Acting twice without observing in between is refused.
        b.step(&[("x", act(0.0)), ("o", observe(0.0))], false).unwrap();
        assert_eq!(b.step(&[("x", act(0.0))], false), Err((0, AgentStepError::ActedWhileHanging)));
        // An agent that never observed was not asked to act.
        assert_eq!(b.step(&[("z", act(0.0))], false), Err((0, AgentStepError::NotAskedToAct)));
    }

    #[test]
    fn late_joiners_get_skips_and_keep_rewards_before_their_first_observation() {
        let mut b = Book::default();
        b.reset(&["a"]);
        b.step(&[("a", obs_act(1.0)), ("late", Data { reward: Some(3.0), ..Data::default() })], false)
            .unwrap();
        assert_eq!(b.agents["late"].reward_begin, 3.0);
        assert!(b.agents["late"].map.is_none());
        b.step(
            &[("a", obs_act(1.0)), ("late", Data { obs: true, reward: Some(1.0), ..Data::default() })],
            false,
        )
        .unwrap();
        // One skip per env step before this one (reset included), then its agent step 0.
        assert_eq!(b.map("late"), [None, None, Some(0)]);
        assert_eq!(b.agents["late"].reward_begin, 4.0);
        // Its next step is agent step 1 (t_started set to 0 by the step).
        b.step(&[("a", obs_act(1.0)), ("late", obs_act(1.0))], false).unwrap();
        assert_eq!(b.map("late"), [None, None, Some(0), Some(1)]);
        assert_eq!(b.agents["late"].t_started, Some(0));
    }

    /// a acted (its action hangs) and b stepped, after a reset of both.
    fn a_waits_b_steps() -> Book {
        let mut b = Book::default();
        b.reset(&["a", "b"]);
        let acts = Data { action: true, reward: Some(1.0), ..Data::default() };
        b.step(&[("a", acts), ("b", obs_act(0.0))], false).unwrap();
        b
    }

    #[test]
    fn done_agents_without_a_record_drop_their_hanging_data() {
        let mut b = a_waits_b_steps();
        // `__all__` terminated (the binding then mentions every agent with an episode): a's
        // hanging action is recorded from its last observation; its map gets the skip of an
        // agent that does not observe and then its step (one entry more, as in RLlib).
        let c = Data { reward: Some(2.0), ..Data::default() };
        b.step(&[("b", obs_act(0.0)), ("c", c), ("a", Data::default())], true).unwrap();
        assert!(b.terminated);
        assert_eq!(b.agents["a"].rewards, [1.0]);
        assert_eq!(b.map("a"), [Some(0), None, None, Some(1)]);
        // c has no episode and is done: nothing to record, its reward is dropped.
        assert!(b.agents["c"].dropped && b.agents["c"].reward_begin == 0.0);
        let mut b = Book::default();
        b.reset(&["a"]);
        b.step(&[("a", obs_act(0.0)), ("c", Data { reward: Some(2.0), ..Data::default() })], false).unwrap();
        b.step(&[("a", obs_act(0.0)), ("c", Data { obs: true, terminated: true, ..Data::default() })], false)
            .unwrap();
        assert!(b.agents["c"].dropped && b.agents["c"].reward_begin == 0.0);
        // Truncated right after acting, with no observation to bootstrap from.
        let mut b = a_waits_b_steps();
        assert_eq!(
            b.step(&[("a", Data { truncated: true, ..Data::default() })], false),
            Err((0, AgentStepError::TruncatedWithoutObservation))
        );
    }

    #[test]
    fn joins_in_a_later_chunk_count_skips_from_the_chunks_start() {
        let join = AgentStep {
            input: AgentStepInput { has_observation: true, has_any_data: true, ..AgentStepInput::default() },
            ..AgentStep::default()
        };
        let plan = plan_env_step(
            &EnvStep {
                agents: &[join],
                terminated: false,
                truncated: false,
                env_t: 10,
                env_t_started: 8,
                lookback: 1,
            },
            &[0.5],
        )
        .unwrap();
        // Env steps 8 (look-back 1 before it: 7), 9, 10 before; RLlib would count 11.
        assert_eq!(plan.agents[0].map, MapWrite::Join { skips: 4, lookback: 1 });
        assert_eq!(plan.agents[0].hanging, Hanging::AddBegin(0.5));
        assert_eq!(plan.env_t, 11);
    }

    #[test]
    fn a_plan_made_into_a_used_plan_is_the_plan_made_afresh() {
        let step = |has_observation| AgentStep {
            input: AgentStepInput {
                has_observation,
                has_any_data: true,
                has_episode: true,
                has_step_map: true,
                ..AgentStepInput::default()
            },
            ..AgentStep::default()
        };
        let (two, one) = ([step(true), step(false)], [step(false)]);
        let env_step = |agents| EnvStep {
            agents,
            terminated: false,
            truncated: true,
            env_t: 3,
            env_t_started: 0,
            lookback: 0,
        };
        let mut plan = plan_env_step(&env_step(&two), &[1.0, 2.0]).unwrap();
        plan_env_step_into(&env_step(&one), &[4.0], &mut plan).unwrap();
        assert_eq!(plan, plan_env_step(&env_step(&one), &[4.0]).unwrap());
        assert_eq!((plan.agents.len(), plan.env_t, plan.truncated), (1, 4, true));
    }

    #[test]
    fn the_episode_ends_on_all_or_when_every_live_agent_is_flagged() {
        assert_eq!(episode_ends(false, false, [true, true]), (true, false));
        assert_eq!(episode_ends(false, false, [true, false]), (false, false));
        assert_eq!(episode_ends(false, true, [false]), (false, true));
        assert_eq!(episode_ends(true, false, [false]), (true, false));
        // No live agent left: it ends (RLlib 2.60 does too).
        assert_eq!(episode_ends(false, false, []), (true, false));
    }

    fn data() -> impl Strategy<Value = Data> {
        (
            any::<bool>(),
            any::<bool>(),
            prop::option::of(0u8..4),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.05),
        )
            .prop_map(|(obs, action, reward, terminated, truncated)| Data {
                obs,
                action,
                reward: reward.map(|r| f64::from(r) * 0.5),
                terminated,
                truncated,
            })
    }

    /// A script: per env step, what it holds for each of three agents (None: not mentioned)
    /// and whether `__all__` ends it.
    fn script() -> impl Strategy<Value = Vec<(Vec<Option<Data>>, bool)>> {
        prop::collection::vec(
            (prop::collection::vec(prop::option::weighted(0.7, data()), 3), prop::bool::weighted(0.03)),
            1..40,
        )
    }

    const AGENTS: [&str; 3] = ["a", "b", "c"];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Over random scripts (most steps break a rule and are refused whole): a refused
        /// step changes nothing; each map holds its agent's steps 0, 1, 2, ... in order and
        /// spans every env step (as in RLlib, one entry more per step recorded from the
        /// last observation, one fewer per observation of a done agent); no reward is created or lost; a done agent records
        /// nothing more; the episode ends when `__all__` says so or every live agent is flagged.
        #[test]
        fn plans_keep_the_books_consistent(script in script()) {
            let mut b = Book::default();
            b.reset(&["a", "b"]);
            let mut given = 0.0;
            // Per agent: map entries more (a step recorded from the last observation) and
            // fewer (an observation that recorded nothing: a done agent's) than env steps.
            let mut entries_off: BTreeMap<&str, i64> = BTreeMap::new();
            for (per_agent, all) in script {
                if b.terminated || b.truncated {
                    break;
                }
                let mut data: Vec<(&'static str, Data)> = AGENTS
                    .iter()
                    .zip(&per_agent)
                    .filter_map(|(a, d)| d.map(|d| (*a, d)))
                    .collect();
                if all {
                    // `__all__` mentions every agent with an episode (as the binding does).
                    for a in AGENTS {
                        if b.agents.get(a).is_some_and(|g| g.has_episode) && !data.iter().any(|(x, _)| *x == a) {
                            data.push((a, Data::default()));
                        }
                    }
                }
                let before = b.clone();
                let done_before: Vec<&str> = AGENTS.iter().copied().filter(|a| b.agents.get(a).is_some_and(|g| g.done)).collect();
                if b.step(&data, all).is_err() {
                    prop_assert_eq!(&b, &before);
                } else {
                        given += data.iter().map(|(_, d)| d.reward.unwrap_or(0.0)).sum::<f64>();
                        prop_assert_eq!(b.env_t, before.env_t + 1);
                        for (a, d) in &data {
                            let recorded = b.agents[a].rewards.len() > before.agents.get(a).map_or(0, |g| g.rewards.len());
                            prop_assert!(!(recorded && done_before.contains(a)), "done agent {} recorded a step", a);
                            if recorded && !d.obs {
                                *entries_off.entry(a).or_default() += 1;
                            }
                            let had_map = before.agents.get(a).is_some_and(|g| g.map.is_some());
                            if had_map && d.obs && !recorded {
                                *entries_off.entry(a).or_default() -= 1;
                            }
                        }
                        let every_live_flagged = before
                            .agents
                            .iter()
                            .filter(|(_, g)| g.has_episode && !g.done)
                            .all(|(a, _)| data.iter().any(|(x, d)| x == a && (d.terminated || d.truncated)));
                        prop_assert_eq!(b.terminated, all || every_live_flagged);
                }
                for (a, agent) in &b.agents {
                    if let Some(m) = &agent.map {
                        let steps: Vec<i64> = m.steps().iter().flatten().copied().collect();
                        let expected: Vec<i64> = (0..=agent.rewards.len() as i64).collect();
                        prop_assert_eq!(steps, expected, "agent {}", a);
                        let off = entries_off.get(a).copied().unwrap_or(0);
                        prop_assert_eq!(m.steps().len() as i64, b.env_t + 1 + off, "agent {}", a);
                    }
                }
                let held: f64 = b.agents.values().map(|g| g.rewards.iter().sum::<f64>() + g.reward_end + g.reward_begin).sum();
                prop_assert_eq!(held + b.discarded, given);
            }
        }
    }
}
