//! `concat_episode` of a multi-agent episode as a plan: what appending the chunk that
//! continues an episode does to each agent's books, decided before anything is written.
//!
//! The binding lists the agents of both chunks, asks [`plan_concat`] for the plan and
//! applies it through [`ConcatBooks`] (RLlib's dicts on the two Python episodes); the
//! tests apply it to a model.

use super::env_step::{Slot, CLEARED, TAKEN};

/// One agent of either chunk, as the two chunks hold it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)] // independent facts about one agent
pub struct ConcatAgent {
    /// Our episode of the agent: `None` without one, else whether it is done.
    pub ours: Option<bool>,
    /// The other chunk has an episode of the agent.
    pub theirs: bool,
    /// Each chunk has an env-step map of the agent.
    pub our_map: bool,
    pub their_map: bool,
    /// The other chunk ends with an action of the agent hanging.
    pub their_action_hangs: bool,
}

/// What appending the other chunk does to one agent's episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConcatPart {
    /// We have no episode of the agent: we take the other chunk's (and its
    /// `agent_t_started`).
    Adopt,
    /// Our episode of the agent is done, or the other chunk has none: it stays as it is.
    Idle,
    /// Our episode of the agent is continued by the other chunk's.
    Continue,
}

/// What appending the other chunk does to one agent's env-step map. Every map keeps
/// covering every env step (RLlib 2.60 leaves the maps of done or absent agents behind
/// and re-appends the other chunk's look-back: ray issue 45542).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConcatMap {
    /// Our map grows by the other chunk's entries after the shared env step
    /// (`theirs`), or by skips over its env steps.
    Append { theirs: bool },
    /// The agent is new to us: a map made by [`super::StepMap::joined`].
    Join,
}

/// The plan for one agent of [`ConcatInput::agents`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConcat {
    pub part: ConcatPart,
    pub map: ConcatMap,
    pub end: ConcatEnd,
}

/// What appending the other chunk does to what hangs at our end for one agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConcatEnd {
    /// It stays (the agent takes no part in the other chunk).
    Keep,
    /// It becomes what hangs at the other chunk's end: its action, that action's extra
    /// outputs and reward.
    Copy,
    /// Nothing hangs at the other chunk's end: an action of ours was used there (RLlib
    /// keeps the stale one, ray issue 45542).
    Clear,
}

/// A reward the other chunk collected for an agent before its first observation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BeginReward {
    pub agent: usize,
    pub reward: f64,
    /// A reward of the agent hung at our end when the other chunk was cut from us: the
    /// cut started the other chunk's begin rewards with it, so it is ours already.
    pub hung_at_cut: bool,
}

/// The two chunks, as [`plan_concat`] reads them. Agents are indices into the caller's
/// list, which starts with [`ConcatInput::agents`] and may go on with agents that only the
/// other chunk's hanging data names.
#[derive(Clone, Copy, Debug)]
pub struct ConcatInput<'a> {
    /// The agents with an episode in either chunk, in the order their parts are applied.
    pub agents: &'a [ConcatAgent],
    /// The agents the other chunk dropped (done with nothing to record), in its order.
    pub their_dropped: &'a [usize],
    /// The other chunk's begin rewards, in its order.
    pub their_begin: &'a [BeginReward],
    /// The agents whose episode in the other chunk is done, in its order.
    pub their_done: &'a [usize],
    /// Our chunk's and the other chunk's counters (`env_t_started`, `env_t`).
    pub ours: (i64, i64),
    pub theirs: (i64, i64),
    /// The look-back of our first env-step map (`None` without maps) and our episode's.
    pub map_lookback: Option<usize>,
    pub episode_lookback: usize,
}

impl ConcatInput<'_> {
    /// The look-back our maps share: the first map's, else the episode's.
    #[must_use]
    pub fn our_lookback(&self) -> usize {
        self.map_lookback.unwrap_or(self.episode_lookback)
    }
}

/// The env steps of a chunk with counters `(env_t_started, env_t)`; none if they are
/// reversed.
fn chunk_steps((started, t): (i64, i64)) -> usize {
    usize::try_from(t - started).unwrap_or(0)
}

/// The plan of one `concat_episode`.
#[derive(Clone, Debug, PartialEq)]
pub struct ConcatPlan {
    /// One entry per [`ConcatInput::agents`] entry, in the same order.
    pub agents: Vec<AgentConcat>,
    /// The other chunk's env steps; our map entries before the shared env step (look-back
    /// included) and our maps' look-back, for the maps of agents new to us.
    pub new_steps: usize,
    pub steps_before: usize,
    pub lookback: usize,
    /// Agents dropped in the other chunk: what hung for them before their first
    /// observation is gone, and they are dropped in the whole episode too.
    pub dropped: Vec<usize>,
    /// Begin rewards of the other chunk that add to ours, in its order.
    pub begin_rewards: Vec<(usize, f64)>,
    /// Agents done in the other chunk: none of their hanging data is left.
    pub cleared: Vec<usize>,
}

/// The plan of appending the other chunk (see [`ConcatInput`]).
#[must_use]
pub fn plan_concat(input: &ConcatInput<'_>) -> ConcatPlan {
    let agents = input
        .agents
        .iter()
        .map(|a| {
            let (part, map) = match a.ours {
                None if a.our_map => (ConcatPart::Adopt, ConcatMap::Append { theirs: a.their_map }),
                None => (ConcatPart::Adopt, ConcatMap::Join),
                Some(done) if done || !a.theirs => (ConcatPart::Idle, ConcatMap::Append { theirs: false }),
                Some(_) => (ConcatPart::Continue, ConcatMap::Append { theirs: a.their_map }),
            };
            let end = match part {
                ConcatPart::Idle => ConcatEnd::Keep,
                _ if a.their_action_hangs => ConcatEnd::Copy,
                _ => ConcatEnd::Clear,
            };
            AgentConcat { part, map, end }
        })
        .collect();
    ConcatPlan {
        agents,
        new_steps: chunk_steps(input.theirs),
        steps_before: input.our_lookback() + chunk_steps(input.ours),
        lookback: input.our_lookback(),
        dropped: input.their_dropped.to_vec(),
        begin_rewards: input
            .their_begin
            .iter()
            .filter(|b| !b.hung_at_cut)
            .map(|b| (b.agent, b.reward))
            .collect(),
        cleared: input.their_done.to_vec(),
    }
}

/// The books of the two chunks as a [`ConcatPlan`] writes them: ours, with the other
/// chunk's read where the plan takes from it. `agent` is an index into the caller's list.
pub trait ConcatBooks {
    type Error;
    /// Takes the other chunk's episode of the agent and its `agent_t_started`.
    fn adopt(&mut self, agent: usize) -> Result<(), Self::Error>;
    /// Appends the other chunk's episode of the agent to ours.
    fn continue_episode(&mut self, agent: usize) -> Result<(), Self::Error>;
    /// Appends to our map of the agent: the other chunk's entries after the shared env
    /// step (`theirs`), else `new_steps` skips.
    fn append_map(&mut self, agent: usize, theirs: bool, new_steps: usize) -> Result<(), Self::Error>;
    /// Gives the agent the map [`super::StepMap::joined`] makes of the other chunk's.
    fn join_map(
        &mut self,
        agent: usize,
        new_steps: usize,
        steps_before: usize,
        lookback: usize,
    ) -> Result<(), Self::Error>;
    /// Sets our hanging action, its extra outputs and its reward from the other chunk's.
    fn copy_end(&mut self, agent: usize) -> Result<(), Self::Error>;
    /// Removes one piece of the agent's hanging data (nothing if it has none).
    fn remove(&mut self, agent: usize, slot: Slot) -> Result<(), Self::Error>;
    /// Adds to a hanging reward (0 if it has none).
    fn add_reward(&mut self, agent: usize, slot: Slot, reward: f64) -> Result<(), Self::Error>;
    fn mark_dropped(&mut self, agent: usize) -> Result<(), Self::Error>;
}

impl ConcatPlan {
    /// Applies the plan: per agent its episode, map and hanging end; then the dropped
    /// agents, the begin rewards and the agents done in the other chunk.
    ///
    /// Errors: the first error of `books`; what was applied before it stays.
    pub fn apply<B: ConcatBooks>(&self, books: &mut B) -> Result<(), B::Error> {
        for (i, a) in self.agents.iter().enumerate() {
            match a.part {
                ConcatPart::Adopt => books.adopt(i)?,
                ConcatPart::Continue => books.continue_episode(i)?,
                ConcatPart::Idle => {}
            }
            match a.map {
                ConcatMap::Append { theirs } => books.append_map(i, theirs, self.new_steps)?,
                ConcatMap::Join => books.join_map(i, self.new_steps, self.steps_before, self.lookback)?,
            }
            match a.end {
                ConcatEnd::Keep => {}
                ConcatEnd::Copy => books.copy_end(i)?,
                ConcatEnd::Clear => TAKEN.iter().try_for_each(|s| books.remove(i, *s))?,
            }
        }
        for &i in &self.dropped {
            books.remove(i, Slot::RewardBegin)?;
        }
        for &i in &self.dropped {
            books.mark_dropped(i)?;
        }
        for &(i, reward) in &self.begin_rewards {
            books.add_reward(i, Slot::RewardBegin, reward)?;
        }
        for &i in &self.cleared {
            CLEARED.iter().try_for_each(|s| books.remove(i, *s))?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // exact binary rewards
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A call to [`ConcatBooks`], as the recording books log it.
    #[derive(Clone, Debug, PartialEq)]
    enum Call {
        Adopt(usize),
        Continue(usize),
        Append(usize, bool, usize),
        Join(usize, usize, usize, usize),
        CopyEnd(usize),
        Remove(usize, Slot),
        AddReward(usize, Slot, f64),
        Dropped(usize),
    }

    #[derive(Default)]
    struct Log(Vec<Call>);

    impl ConcatBooks for Log {
        type Error = ();
        fn adopt(&mut self, a: usize) -> Result<(), ()> {
            self.0.push(Call::Adopt(a));
            Ok(())
        }
        fn continue_episode(&mut self, a: usize) -> Result<(), ()> {
            self.0.push(Call::Continue(a));
            Ok(())
        }
        fn append_map(&mut self, a: usize, theirs: bool, n: usize) -> Result<(), ()> {
            self.0.push(Call::Append(a, theirs, n));
            Ok(())
        }
        fn join_map(&mut self, a: usize, n: usize, before: usize, lookback: usize) -> Result<(), ()> {
            self.0.push(Call::Join(a, n, before, lookback));
            Ok(())
        }
        fn copy_end(&mut self, a: usize) -> Result<(), ()> {
            self.0.push(Call::CopyEnd(a));
            Ok(())
        }
        fn remove(&mut self, a: usize, slot: Slot) -> Result<(), ()> {
            self.0.push(Call::Remove(a, slot));
            Ok(())
        }
        fn add_reward(&mut self, a: usize, slot: Slot, reward: f64) -> Result<(), ()> {
            self.0.push(Call::AddReward(a, slot, reward));
            Ok(())
        }
        fn mark_dropped(&mut self, a: usize) -> Result<(), ()> {
            self.0.push(Call::Dropped(a));
            Ok(())
        }
    }

    fn input(agents: &[ConcatAgent]) -> ConcatInput<'_> {
        ConcatInput {
            agents,
            their_dropped: &[],
            their_begin: &[],
            their_done: &[],
            ours: (10, 15),
            theirs: (15, 18),
            map_lookback: Some(2),
            episode_lookback: 1,
        }
    }

    #[test]
    fn counters_and_lookback_give_the_maps_geometry() {
        let agents = [live()];
        let plan = plan_concat(&input(&agents));
        assert_eq!((plan.new_steps, plan.steps_before, plan.lookback), (3, 7, 2));
        // Without maps the episode's look-back counts; reversed counters are no steps.
        let plan = plan_concat(&ConcatInput { map_lookback: None, theirs: (15, 12), ..input(&agents) });
        assert_eq!((plan.new_steps, plan.steps_before, plan.lookback), (0, 6, 1));
    }

    /// An agent that both chunks have, live, with maps.
    fn live() -> ConcatAgent {
        ConcatAgent { ours: Some(false), theirs: true, our_map: true, their_map: true, ..Default::default() }
    }

    fn part(agent: ConcatAgent) -> AgentConcat {
        plan_concat(&input(&[agent])).agents[0]
    }

    /// An action of ours that the other chunk used leaves nothing hanging (RLlib 2.60 keeps
    /// it: ray issue 45542; `test_concat_episode_drops_a_consumed_hanging_action`).
    #[test]
    fn each_agent_takes_its_part() {
        let live = live();
        let append = ConcatMap::Append { theirs: true };
        let idle = AgentConcat {
            part: ConcatPart::Idle,
            map: ConcatMap::Append { theirs: false },
            end: ConcatEnd::Keep,
        };
        // Continued: the other chunk's map entries; nothing hangs there, so nothing at our end.
        assert_eq!(
            part(live),
            AgentConcat { part: ConcatPart::Continue, map: append, end: ConcatEnd::Clear }
        );
        let hangs = ConcatAgent { their_action_hangs: true, ..live };
        assert_eq!(part(hangs).end, ConcatEnd::Copy);
        // Done with us, or absent from the other chunk: skips, and what hangs stays.
        assert_eq!(part(ConcatAgent { ours: Some(true), ..hangs }), idle);
        assert_eq!(part(ConcatAgent { theirs: false, ..hangs }), idle);
        // New to us: its episode is taken over; a map we hold (skips of an agent that had
        // only rewards) grows, else the agent joins.
        let new = ConcatAgent { ours: None, our_map: false, ..hangs };
        assert_eq!(
            part(new),
            AgentConcat { part: ConcatPart::Adopt, map: ConcatMap::Join, end: ConcatEnd::Copy }
        );
        let mapped = ConcatAgent { our_map: true, their_map: false, ..new };
        assert_eq!(part(mapped).map, ConcatMap::Append { theirs: false });
    }

    #[test]
    fn joined_maps_start_after_our_entries() {
        let new = ConcatAgent { theirs: true, their_map: true, ..Default::default() };
        let mut log = Log::default();
        plan_concat(&input(&[new])).apply(&mut log).unwrap();
        assert_eq!(
            log.0,
            [
                Call::Adopt(0),
                Call::Join(0, 3, 7, 2),
                Call::Remove(0, Slot::Action),
                Call::Remove(0, Slot::ExtraOutputs),
                Call::Remove(0, Slot::RewardEnd)
            ]
        );
    }

    /// A reward that hung at the cut counts once (`test_concat_episode_counts_hanging_rewards_once`);
    /// an agent the other chunk dropped loses what hung before its first observation (RLlib
    /// 2.60 keeps it: `test_concat_episode_drops_the_reward_of_an_agent_dropped_later`).
    #[test]
    fn hanging_data_of_the_other_chunk_applies_after_the_agents_in_its_order() {
        let live = live();
        let agents = [live, ConcatAgent { ours: Some(true), ..live }];
        // Agent 2 has only begin rewards in the other chunk; 0's reward hung at the cut.
        let begin = [
            BeginReward { agent: 2, reward: 1.5, hung_at_cut: false },
            BeginReward { agent: 0, reward: 4.0, hung_at_cut: true },
            BeginReward { agent: 1, reward: -1.0, hung_at_cut: false },
        ];
        let plan = plan_concat(&ConcatInput {
            their_dropped: &[2],
            their_begin: &begin,
            their_done: &[0],
            ..input(&agents)
        });
        assert_eq!(plan.begin_rewards, [(2, 1.5), (1, -1.0)]);
        let mut log = Log::default();
        plan.apply(&mut log).unwrap();
        let tail: Vec<Call> = log.0.into_iter().skip_while(|c| !matches!(c, Call::Remove(2, _))).collect();
        assert_eq!(
            tail,
            [
                Call::Remove(2, Slot::RewardBegin),
                Call::Dropped(2),
                Call::AddReward(2, Slot::RewardBegin, 1.5),
                Call::AddReward(1, Slot::RewardBegin, -1.0),
                Call::Remove(0, Slot::RewardBegin),
                Call::Remove(0, Slot::Action),
                Call::Remove(0, Slot::ExtraOutputs),
                Call::Remove(0, Slot::RewardEnd),
            ]
        );
    }

    fn agent() -> impl Strategy<Value = ConcatAgent> {
        (proptest::option::of(any::<bool>()), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(ours, theirs, our_map, their_map, their_action_hangs)| ConcatAgent {
                ours,
                theirs: theirs || ours.is_none(),
                our_map,
                their_map,
                their_action_hangs,
            })
    }

    proptest! {
        /// Every agent gets one map write and at most one episode write; only the agents
        /// that take part in the other chunk change what hangs at our end.
        #[test]
        fn every_map_keeps_up(agents in proptest::collection::vec(agent(), 0..8)) {
            let plan = plan_concat(&input(&agents));
            let mut log = Log::default();
            plan.apply(&mut log).unwrap();
            for (i, a) in agents.iter().enumerate() {
                let calls: Vec<&Call> = log.0.iter().filter(|c| match c {
                    Call::Adopt(j) | Call::Continue(j) | Call::Append(j, ..) | Call::Join(j, ..)
                    | Call::CopyEnd(j) | Call::Remove(j, _) | Call::AddReward(j, ..) | Call::Dropped(j) => *j == i,
                }).collect();
                let maps = calls.iter().filter(|c| matches!(c, Call::Append(..) | Call::Join(..))).count();
                prop_assert_eq!(maps, 1);
                let takes_part = a.ours.is_none() || (a.ours == Some(false) && a.theirs);
                prop_assert_eq!(calls.len() > 1, takes_part);
                prop_assert_eq!(calls.contains(&&Call::Adopt(i)), a.ours.is_none());
                if calls.contains(&&Call::Append(i, true, 3)) {
                    prop_assert!(a.their_map && takes_part);
                }
            }
        }
    }
}
