//! The general `cut` and the `slice` of a multi-agent episode as plans: which rows of each
//! agent's episode the new chunk keeps, its env-step maps and what hangs at its end.
//!
//! The new chunk is what RLlib's rebuild gives: the kept env steps read per env step, then
//! the constructor's rules for agents given as per-env-step lists, then the cut's own
//! rules for done agents. [`plan_cut`] and [`plan_slice`] run those rules over the
//! structure (which agent has an observation, action or reward at each kept env step)
//! instead of over the values, so the binding copies rows instead of rebuilding agents.
//! Where the rebuild would not be a selection of rows (or would fail), there is no plan
//! and the caller rebuilds.

use crate::column::Index;
use crate::episode::EpisodeSizes;

use super::step_map::{MapRead, StepMap};

/// What hangs as extra model outputs for an agent at the end of the chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HangingExtras {
    /// Nothing.
    Absent,
    /// An empty (falsy) dict.
    Empty,
    /// A dict with outputs; `all_keys`: it holds every key the agent's episode stores.
    Holds { all_keys: bool },
}

/// One agent of the chunk that is cut, as its episode and books hold it.
#[derive(Clone, Debug)]
#[allow(clippy::struct_excessive_bools)] // independent facts about one agent
pub struct CutAgent<'a> {
    /// Its env-step map.
    pub map: &'a StepMap,
    /// `agent_t_started`, if the agent has an entry (the episode reads 0 otherwise, and
    /// its `defaultdict` then holds the 0).
    pub t_started: Option<i64>,
    /// Its episode: whether it holds an observation in this chunk, and its sizes.
    pub is_reset: bool,
    pub episode: EpisodeSizes,
    /// Its module id is set (a falsy one sends the rebuild to the mapping function).
    pub has_module: bool,
    /// What hangs at the chunk's end: an action (not `None`), its extra outputs, a reward.
    pub hanging_action: bool,
    pub hanging_extras: HangingExtras,
    pub hanging_reward: Option<f64>,
}

impl CutAgent<'_> {
    fn done(&self) -> bool {
        self.episode.done()
    }
}

/// The chunk that is cut, as [`plan_cut`] reads it.
#[derive(Clone, Debug)]
pub struct CutInput<'a> {
    /// The agents with an episode, in the episode's order.
    pub agents: Vec<CutAgent<'a>>,
    /// The same agents in the order Python iterates the set of their ids.
    pub set_order: Vec<usize>,
    /// The env steps of look-back the successor keeps.
    pub lookback: usize,
    /// The chunk's `env_t` (where the successor starts).
    pub env_t: i64,
}

/// One agent of the successor: its episode is the rows `observations` (and infos) and
/// `actions` (and rewards, and extra outputs when `extras`) of the agent's episode, the
/// first `lookback` of each look-back.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)] // independent facts about one agent's rows
pub struct AgentCut {
    pub agent: usize,
    pub observations: Vec<usize>,
    pub actions: Vec<usize>,
    pub extras: bool,
    /// Whether it keeps the infos of its observations (else it has empty ones).
    pub infos: bool,
    pub lookback: usize,
    pub t_started: i64,
    pub terminated: bool,
    pub truncated: bool,
}

/// The plan of one cut or slice: the new chunk's books, each in its dict order.
#[derive(Clone, Debug, PartialEq)]
pub struct CutPlan {
    /// The new chunk's env-step counters and flags.
    pub counters: Counters,
    /// The successor's `_len_lookback_buffers` (its maps' look-back).
    pub len_lookback_buffers: usize,
    /// The env steps with actions read (look-back included).
    pub action_rows: usize,
    /// `agent_episodes`.
    pub agents: Vec<AgentCut>,
    /// `env_t_to_agent_t`: agent and map.
    pub maps: Vec<(usize, StepMap)>,
    /// `agent_t_started`.
    pub t_started: Vec<(usize, i64)>,
    /// Agents that are in no book of the successor, nor in its module mapping.
    pub gone: Vec<usize>,
    /// `_hanging_actions_end` and `_hanging_extra_model_outputs_end`: each agent's
    /// action (and its extra outputs, those of the keys its episode stores) from a row
    /// of its episode or from what hangs at the chunk's end.
    pub hanging: Vec<(usize, ActionSource)>,
    /// `_hanging_rewards_end`: a value, or a row's reward (0.0 + it).
    pub hanging_rewards: Vec<(usize, RewardSum)>,
    /// Agents without an `agent_t_started` entry whose reads give them one (0) in the
    /// episode that is cut, in the order the reads do.
    pub t_started_read: Vec<usize>,
}

/// The env-step counters and episode flags of a cut's successor or of a slice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub env_t_started: i64,
    pub env_t: i64,
    pub is_terminated: bool,
    pub is_truncated: bool,
}

/// Where an action (with its reward and extra outputs) of a kept env step comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionSource {
    /// The episode's row.
    Row(usize),
    /// What hangs at the chunk's end.
    Hanging,
}

/// The keys of an agent's hanging extra outputs in the successor, each read like its
/// action (see [`ActionSource::output_keys`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputKeys {
    /// The keys the agent's episode stores.
    Stored,
    /// The keys of the outputs that hang at the chunk's end.
    Hanging,
    /// No outputs.
    None,
}

impl ActionSource {
    /// Which keys the successor's hanging extra outputs have: the stored ones, or, where
    /// the agent stores none and its action hangs, those of what hangs with it.
    #[must_use]
    pub fn output_keys(self, stores_keys: bool, outputs_hang: bool) -> OutputKeys {
        match self {
            _ if stores_keys => OutputKeys::Stored,
            Self::Hanging if outputs_hang => OutputKeys::Hanging,
            _ => OutputKeys::None,
        }
    }
}

/// A reward sum of the rebuild (which starts at 0.0 and adds one term per kept env step):
/// a known value, or one row of the episode (adding zeros keeps it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RewardSum {
    Known(f64),
    Row(usize),
}

/// A reward term read at a kept env step.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Term {
    Zero,
    Known(f64),
    Row(usize),
}

impl RewardSum {
    fn add(self, term: Term) -> Option<RewardSum> {
        match (self, term) {
            (RewardSum::Known(x), Term::Zero) => Some(RewardSum::Known(x + 0.0)),
            (RewardSum::Known(x), Term::Known(h)) => Some(RewardSum::Known(x + h)),
            (RewardSum::Known(x), Term::Row(p)) => (x == 0.0).then_some(RewardSum::Row(p)),
            (RewardSum::Row(p), Term::Zero) => Some(RewardSum::Row(p)),
            _ => None,
        }
    }
}

/// A dict of the rebuild: insertion-ordered, small.
struct Ordered<V>(Vec<(usize, V)>);

impl<V: Copy> Ordered<V> {
    fn new() -> Self {
        Ordered(Vec::new())
    }

    fn get(&self, agent: usize) -> Option<V> {
        self.0.iter().find(|(a, _)| *a == agent).map(|(_, v)| *v)
    }

    fn set(&mut self, agent: usize, value: V) {
        match self.0.iter_mut().find(|(a, _)| *a == agent) {
            Some((_, v)) => *v = value,
            None => self.0.push((agent, value)),
        }
    }

    fn remove(&mut self, agent: usize) -> Option<V> {
        let at = self.0.iter().position(|(a, _)| *a == agent)?;
        Some(self.0.remove(at).1)
    }
}

/// The index of agent `i`'s entry in `list` (an insertion-ordered dict of the rebuild,
/// `at` its index by agent), made empty if it has none.
fn entry<T>(list: &mut Vec<(usize, Vec<T>)>, at: &mut [Option<usize>], i: usize) -> usize {
    *at[i].get_or_insert_with(|| {
        list.push((i, Vec::new()));
        list.len() - 1
    })
}

/// One agent's reads of the kept env steps, as positions in its episode's fields.
struct Reads {
    /// Per env step: the observation's position, if it observed.
    observations: Vec<Option<usize>>,
    /// Per env step with an action: the action's source, if it acted.
    actions: Vec<Option<ActionSource>>,
    /// Per env step with an action: the reward read there.
    rewards: Vec<Term>,
}

fn entries(read: MapRead) -> Vec<Option<i64>> {
    match read {
        MapRead::One(e) => vec![e],
        MapRead::Many(v) => v,
    }
}

/// Position in the agent's fields (look-back included) of its agent step `entry`.
fn position(agent: &CutAgent<'_>, entry: i64) -> Option<usize> {
    usize::try_from(entry - agent.t_started.unwrap_or(0) + i64::try_from(agent.episode.obs_lookback).ok()?)
        .ok()
}

/// The per-env-step reads of `get_observations`/`get_actions`/`get_rewards`/
/// `get_extra_model_outputs` over the kept env steps; `None` where they would fail or
/// read something other than whole rows.
fn reads(agent: &CutAgent<'_>, obs_index: &Index, act_index: &Index, neg: bool) -> Option<Reads> {
    let obs_entries = entries(agent.map.get(obs_index, neg, true, false).ok()?);
    let act_entries = entries(agent.map.get(act_index, neg, true, true).ok()?);
    let mut observations = Vec::with_capacity(obs_entries.len());
    for entry in obs_entries {
        observations.push(match entry {
            None => None,
            Some(e) => {
                let p = position(agent, e)?;
                (p < agent.episode.obs_total && p < agent.episode.infos_total).then_some(p)?;
                Some(p)
            }
        });
    }
    // Extra outputs follow the actions row for row, or are absent: anything else is no
    // selection of rows.
    let keys = !agent.episode.extra_totals.is_empty();
    if keys {
        let hanging_extras = agent.hanging_extras != HangingExtras::Absent;
        let aligned = agent.episode.extra_totals.iter().all(|&n| n == agent.episode.actions_total)
            && hanging_extras == agent.hanging_action
            && (!agent.hanging_action || agent.hanging_extras == HangingExtras::Holds { all_keys: true });
        if !aligned {
            return None;
        }
    }
    // Without keys of its own, an agent's hanging outputs read as an item appended to
    // empty fields: only its first agent step can be read.
    let only_hanging_extras = !keys && matches!(agent.hanging_extras, HangingExtras::Holds { .. });
    let action_view = agent.episode.actions_total + usize::from(agent.hanging_action);
    let reward_view = agent.episode.rewards_total + usize::from(agent.hanging_reward.is_some());
    let mut actions = Vec::with_capacity(act_entries.len());
    let mut rewards = Vec::with_capacity(act_entries.len());
    for entry in act_entries {
        let Some(e) = entry else {
            actions.push(None);
            rewards.push(Term::Zero);
            continue;
        };
        let p = position(agent, e)?;
        if only_hanging_extras && p != 0 {
            return None;
        }
        actions.push(if p == action_view {
            None
        } else if p < agent.episode.actions_total {
            Some(ActionSource::Row(p))
        } else if p == agent.episode.actions_total && agent.hanging_action {
            Some(ActionSource::Hanging)
        } else {
            return None;
        });
        rewards.push(if p == reward_view {
            Term::Zero
        } else if p < agent.episode.rewards_total {
            Term::Row(p)
        } else if let (true, Some(h)) = (p == agent.episode.rewards_total, agent.hanging_reward) {
            Term::Known(h)
        } else {
            return None;
        });
    }
    Some(Reads { observations, actions, rewards })
}

/// The successor's books as RLlib's constructor makes them from the per-env-step reads
/// (`obs_index` for observations, `act_index` for actions, rewards and extra outputs),
/// before the caller's own rules.
struct Rebuild<'b, 'a> {
    agents: &'b [CutAgent<'a>],
    set_order: &'b [usize],
    reads: Vec<Reads>,
    rows: usize,
    action_rows: usize,
    /// The constructor's `len_lookback_buffer` (`None`: "auto", the action rows).
    lookback: Option<usize>,
    /// Its `agent_t_started`, `terminateds` and `truncateds`.
    t_started: Vec<(usize, i64)>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    /// Agents the caller's reads gave an `agent_t_started` entry before these reads.
    t_started_read: Vec<usize>,
}

/// What [`Rebuild::run`] made.
struct Rebuilt {
    len_lookback_buffers: usize,
    action_rows: usize,
    /// Per agent that observed (in that order): its observations' positions.
    observed: Vec<(usize, Vec<usize>)>,
    actions: Vec<Vec<usize>>,
    done: Vec<bool>,
    terminated: Vec<bool>,
    lookbacks: Vec<i64>,
    maps: Vec<(usize, Vec<Option<i64>>)>,
    hanging: Ordered<ActionSource>,
    rewards: Ordered<RewardSum>,
    /// `agent_t_started` so far, and the agents the reads gave an entry in the episode
    /// that was read.
    t_started: Vec<(usize, i64)>,
    t_started_read: Vec<usize>,
}

impl<'b, 'a> Rebuild<'b, 'a> {
    /// The reads of the kept env steps; `None` where they fail or are no whole rows.
    fn read(
        agents: &'b [CutAgent<'a>],
        obs_index: &Index,
        act_index: &Index,
        neg: bool,
    ) -> Option<(Vec<Reads>, usize, usize)> {
        if agents.is_empty() {
            return None;
        }
        let reads: Vec<Reads> =
            agents.iter().map(|a| reads(a, obs_index, act_index, neg)).collect::<Option<_>>()?;
        let rows = reads[0].observations.len();
        let action_rows = reads[0].actions.len();
        if reads.iter().any(|r| r.observations.len() < rows || r.actions.len() < action_rows) {
            return None;
        }
        Some((reads, rows, action_rows))
    }

    #[allow(clippy::too_many_lines)] // one pass of the constructor's rules, kept in its order
    fn run(mut self) -> Option<Rebuilt> {
        let (agents, reads, n) = (self.agents, &self.reads, self.agents.len());
        let (rows, action_rows) = (self.rows, self.action_rows);
        let lookback = self.lookback.unwrap_or(action_rows);
        for idx in 0..rows {
            for (i, r) in reads.iter().enumerate() {
                let missing = agents[i].t_started.is_none() && !self.t_started_read.contains(&i);
                if r.observations[idx].is_some() && missing {
                    self.t_started_read.push(i);
                }
            }
        }
        let t_started_of =
            |t_started: &[(usize, i64)], i: usize| t_started.iter().find(|(a, _)| *a == i).map(|(_, t)| *t);
        // The agents' first agent steps: those with observations in the look-back count back
        // (from their `agent_t_started`, which the `defaultdict` gives them, in the order
        // of their first observations).
        let mut current_t: Vec<Option<i64>> = vec![None; n];
        let mut in_lookback_order: Vec<usize> = Vec::new();
        for idx in 0..rows.min(lookback) {
            for (i, r) in reads.iter().enumerate() {
                if r.observations[idx].is_some() && !in_lookback_order.contains(&i) {
                    in_lookback_order.push(i);
                }
            }
        }
        for &i in &in_lookback_order {
            if t_started_of(&self.t_started, i).is_none() {
                self.t_started.push((i, 0));
            }
        }
        for i in 0..n {
            let seen = &reads[i].observations;
            let in_lookback = seen[..rows.min(lookback)].iter().filter(|o| o.is_some()).count();
            if in_lookback > 0 {
                let total = seen[..rows].iter().filter(|o| o.is_some()).count();
                let base = t_started_of(&self.t_started, i).unwrap_or(0) - i64::try_from(in_lookback).ok()?;
                current_t[i] = Some(if total > in_lookback { base } else { base + 1 });
            }
        }
        let mut observed: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut observed_at: Vec<Option<usize>> = vec![None; n];
        let mut actions: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut maps: Vec<(usize, Vec<Option<i64>>)> = Vec::new();
        let mut map_at: Vec<Option<usize>> = vec![None; n];
        let mut lookbacks: Vec<i64> = vec![i64::try_from(lookback).ok()?; n];
        let mut done = vec![false; n];
        let mut hanging: Ordered<ActionSource> = Ordered::new();
        let mut rewards: Ordered<RewardSum> = Ordered::new();
        let mut in_row = vec![false; n];
        let terminated = &mut self.terminated;
        for idx in 0..rows {
            for i in 0..n {
                in_row[i] = reads[i].observations[idx].is_some();
            }
            for i in (0..n).filter(|&i| in_row[i]) {
                let p = reads[i].observations[idx]?;
                let slot = entry(&mut observed, &mut observed_at, i);
                observed[slot].1.push(p);
                if observed[slot].1.len() > 1 {
                    // The action, its extra outputs and reward that waited for this observation.
                    let (ActionSource::Row(a), RewardSum::Row(r)) = (hanging.remove(i)?, rewards.remove(i)?)
                    else {
                        return None;
                    };
                    if a != r {
                        return None;
                    }
                    actions[i].push(a);
                } else if map_at[i].is_none() {
                    let m = entry(&mut maps, &mut map_at, i);
                    maps[m].1.resize(idx, None);
                    lookbacks[i] -= i64::try_from(idx).ok()?;
                }
                let acted = reads[i].actions.get(idx).copied().flatten();
                if let Some(src) = acted {
                    hanging.set(i, src);
                    let sum = rewards.get(i).unwrap_or(RewardSum::Known(0.0));
                    rewards.set(i, sum.add(reads[i].rewards[idx])?);
                } else if terminated[i] || self.truncated[i] {
                    done[i] = true;
                } else if idx + 1 < rows {
                    done[i] = true;
                    terminated[i] = true;
                }
                let t = current_t[i].unwrap_or_else(|| t_started_of(&self.t_started, i).unwrap_or(0));
                let m = entry(&mut maps, &mut map_at, i);
                maps[m].1.push(Some(t));
                current_t[i] = Some(t + 1);
            }
            for &i in self.set_order {
                if in_row[i] || done[i] {
                    continue;
                }
                let m = entry(&mut maps, &mut map_at, i);
                maps[m].1.push(None);
                if maps[m].1.len() <= lookback {
                    lookbacks[i] -= 1;
                }
                let term = reads[i].rewards.get(idx).copied().unwrap_or(Term::Zero);
                let sum = rewards.get(i).unwrap_or(RewardSum::Known(0.0));
                rewards.set(i, sum.add(term)?);
            }
        }
        // Maps of agents that never observed go.
        maps.retain(|(i, _)| observed_at[*i].is_some());
        let rebuilt = Rebuilt {
            len_lookback_buffers: lookback,
            action_rows,
            observed,
            actions,
            done,
            terminated: self.terminated,
            lookbacks,
            maps,
            hanging,
            rewards,
            t_started: self.t_started,
            t_started_read: self.t_started_read,
        };
        Some(rebuilt)
    }
}

impl Rebuilt {
    /// The plan: the agents the constructor keeps (`gone` marks those it drops, and
    /// the caller's), each as its rows, and the books without the agents gone.
    fn plan(
        self,
        agents: &[CutAgent<'_>],
        truncated: &[bool],
        infos: bool,
        leave_out: impl Fn(usize, &[usize]) -> bool,
        flags: impl Fn(usize, bool, bool) -> (bool, bool),
    ) -> Option<CutPlan> {
        let n = agents.len();
        let mut t_started = self.t_started;
        let mut gone = vec![false; n];
        let mut kept: Vec<AgentCut> = Vec::new();
        for (i, obs) in &self.observed {
            let i = *i;
            if obs.len() == 1 && self.done[i] {
                gone[i] = true;
                continue;
            }
            if !agents[i].has_module {
                return None;
            }
            let taken = self.actions[i].len();
            let lookback = usize::try_from(self.lookbacks[i].max(0)).ok()?.min(taken);
            let (terminated, truncated) = flags(i, self.terminated[i], truncated[i]);
            // (Its `agent_t_started`, which the `defaultdict` gives it.)
            if !t_started.iter().any(|(a, _)| *a == i) {
                t_started.push((i, 0));
            }
            kept.push(AgentCut {
                agent: i,
                observations: obs.clone(),
                actions: self.actions[i].clone(),
                extras: taken > 0 && !agents[i].episode.extra_totals.is_empty(),
                infos,
                lookback,
                t_started: t_started.iter().find(|(a, _)| *a == i).map_or(0, |(_, t)| *t),
                terminated,
                truncated,
            });
        }
        let kept_ids: Vec<usize> = kept.iter().map(|a| a.agent).collect();
        for (i, g) in gone.iter_mut().enumerate() {
            *g |= leave_out(i, &kept_ids);
        }
        kept.retain(|a| !gone[a.agent]);
        let mut maps = self.maps;
        maps.retain(|(i, _)| !gone[*i]);
        t_started.retain(|(i, _)| !gone[*i]);
        let mut hanging = self.hanging;
        hanging.0.retain(|(i, _)| !gone[*i]);
        let mut rewards = self.rewards;
        rewards.0.retain(|(i, _)| !gone[*i]);
        Some(CutPlan {
            counters: Counters::default(),
            len_lookback_buffers: self.len_lookback_buffers,
            action_rows: self.action_rows,
            agents: kept,
            maps: maps
                .into_iter()
                .map(|(i, steps)| (i, StepMap::new(steps, self.len_lookback_buffers)))
                .collect(),
            t_started,
            gone: (0..n).filter(|&i| gone[i]).collect(),
            hanging: hanging.0,
            hanging_rewards: rewards.0,
            t_started_read: self.t_started_read,
        })
    }
}

/// The successor of a cut that keeps `lookback` env steps of look-back, or `None` where
/// RLlib's rebuild is not a selection of each agent's rows (or fails): the caller then
/// rebuilds. Agents that finish at the last env step stay, done; agents that finished
/// before are left out (see `MultiAgentEpisode.cut`).
#[must_use]
pub fn plan_cut(input: &CutInput<'_>) -> Option<CutPlan> {
    let agents = &input.agents;
    let n = agents.len();
    if input.set_order.len() != n {
        return None;
    }
    let k = i64::try_from(input.lookback).ok()?;
    let obs_index = Index::Slice { start: Some(-k - 1), stop: None, step: None };
    let act_index = if k > 0 {
        Index::Slice { start: Some(-k), stop: None, step: None }
    } else {
        Index::Slice { start: None, stop: Some(0), step: None }
    };
    let (reads, rows, action_rows) = Rebuild::read(agents, &obs_index, &act_index, false)?;
    let any_reset = agents.iter().any(|a| a.is_reset);
    let mut t_started_read = Vec::new();
    // Agents that observed at the last env step and are done: kept, as if live.
    let mut finished = vec![false; n];
    if any_reset {
        for (i, a) in agents.iter().enumerate() {
            // (Every agent's map is read: one that fails fails the cut.)
            let last = matches!(a.map.get(&Index::Int(-1), false, false, false).ok()?, MapRead::One(Some(_)));
            if last && a.t_started.is_none() {
                t_started_read.push(i);
            }
            finished[i] = a.done() && last;
        }
    }
    let truncated: Vec<bool> = (0..n).map(|i| agents[i].episode.truncated && !finished[i]).collect();
    let rebuild = Rebuild {
        agents,
        set_order: &input.set_order,
        reads,
        rows,
        action_rows,
        lookback: None,
        t_started: (0..n)
            .filter(|&i| !agents[i].done() || finished[i])
            .map(|i| (i, agents[i].episode.t))
            .collect(),
        terminated: (0..n).map(|i| agents[i].episode.terminated && !finished[i]).collect(),
        truncated: truncated.clone(),
        t_started_read,
    };
    let plan = rebuild.run()?.plan(
        agents,
        &truncated,
        true,
        // Agents that finished before the last env step are left out, wherever they are.
        |i, kept| agents[i].done() && !finished[i] && kept.contains(&i),
        // An agent that finished at the last env step gets its flags back.
        |i, terminated, truncated| {
            if finished[i] {
                (agents[i].episode.terminated, agents[i].episode.truncated)
            } else {
                (terminated, truncated)
            }
        },
    )?;
    // (One that finished at the last env step must be kept, to get its flags back.)
    if (0..n).any(|i| finished[i] && !plan.agents.iter().any(|a| a.agent == i)) {
        return None;
    }
    // Only what hangs at the chunk's end can hang at the successor's.
    let ends = plan.hanging.iter().all(|(_, s)| *s == ActionSource::Hanging)
        && plan.hanging_rewards.iter().all(|(_, r)| matches!(r, RewardSum::Known(_)));
    // The successor starts where the chunk ends, not done.
    let counters = Counters { env_t_started: input.env_t, env_t: input.env_t, ..Counters::default() };
    ends.then_some(CutPlan { counters, ..plan })
}

/// The chunk that is sliced, as [`plan_slice`] reads it.
#[derive(Clone, Debug)]
pub struct SliceInput<'a> {
    /// The agents with an episode, in the episode's order.
    pub agents: Vec<CutAgent<'a>>,
    /// The same agents in the order Python iterates the set of their ids.
    pub set_order: Vec<usize>,
    /// The chunk's `env_t_started`.
    pub env_t_started: i64,
    /// The env steps `start..stop` of the chunk (bounds already resolved) and the
    /// look-back before `start`.
    pub start: usize,
    pub stop: usize,
    pub lookback: usize,
    /// Each agent's episode's steps in the chunk.
    pub lengths: Vec<usize>,
}

/// The episode of a slice (`MultiAgentEpisode.slice`), or `None` where RLlib's rebuild
/// is not a selection of each agent's rows (or fails). The slice's agents have no infos
/// (the rebuild passes none), and an agent is done where `stop` is its last step.
#[must_use]
pub fn plan_slice(input: &SliceInput<'_>) -> Option<CutPlan> {
    let agents = &input.agents;
    let n = agents.len();
    if input.set_order.len() != n || input.lengths.len() != n {
        return None;
    }
    let (start, stop, lb) = (
        i64::try_from(input.start).ok()?,
        i64::try_from(input.stop).ok()?,
        i64::try_from(input.lookback).ok()?,
    );
    let obs_index = Index::Slice { start: Some(start - lb), stop: Some(stop + 1), step: None };
    let act_index = Index::Slice { start: Some(start - lb), stop: Some(stop), step: None };
    let (reads, rows, action_rows) = Rebuild::read(agents, &obs_index, &act_index, true)?;
    let mut terminated = vec![false; n];
    let mut truncated = vec![false; n];
    let mut ends_here = vec![false; n];
    let mut t_started = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let map_len = a.map.len();
        let at = |j: usize| -> Option<Option<i64>> {
            match a.map.get(&Index::Int(i64::try_from(j).ok()?), false, false, false).ok()? {
                MapRead::One(e) => Some(e),
                MapRead::Many(_) => None,
            }
        };
        if input.stop < map_len {
            if let Some(t) = at(input.stop)? {
                if i64::try_from(input.lengths[i]).ok()? == t {
                    (terminated[i], truncated[i], ends_here[i]) =
                        (a.episode.terminated, a.episode.truncated, true);
                }
            }
        }
        for j in input.start..map_len {
            if let Some(t) = at(j)? {
                t_started.push((i, t));
                break;
            }
        }
    }
    let is_terminated = (0..n).all(|i| ends_here[i] && terminated[i]);
    let is_truncated = (0..n).all(|i| ends_here[i] && truncated[i]);
    let rebuild = Rebuild {
        agents,
        set_order: &input.set_order,
        reads,
        rows,
        action_rows,
        lookback: Some(input.lookback),
        t_started,
        terminated,
        truncated: truncated.clone(),
        t_started_read: Vec::new(),
    };
    let plan = rebuild.run()?.plan(agents, &truncated, false, |_, _| false, |_, t, u| (t, u))?;
    // The slice starts `start` env steps into the chunk and spans its action rows past the
    // look-back.
    let env_t_started = input.env_t_started.checked_add(start)?;
    let env_t = env_t_started.checked_add(i64::try_from(plan.action_rows).ok()?)?.checked_sub(lb)?;
    Some(CutPlan { counters: Counters { env_t_started, env_t, is_terminated, is_truncated }, ..plan })
}

#[cfg(test)]
mod tests {
    #[test]
    fn hanging_output_keys_are_the_stored_ones_else_those_that_hang_with_the_action() {
        use super::{ActionSource as A, OutputKeys as K};
        assert_eq!(A::Row(3).output_keys(true, true), K::Stored);
        assert_eq!(A::Hanging.output_keys(true, true), K::Stored);
        assert_eq!(A::Hanging.output_keys(false, true), K::Hanging);
        assert_eq!(A::Hanging.output_keys(false, false), K::None);
        // A row's action never takes what hangs.
        assert_eq!(A::Row(0).output_keys(false, true), K::None);
    }

    use super::*;
    use proptest::prelude::*;

    /// An agent of a chunk recorded from its reset (no look-back): it observed at the env
    /// steps where `observed` is true and acted after each observation but the last one
    /// at the chunk's last env step.
    fn agent<'a>(map: &'a StepMap, observed: &[bool]) -> CutAgent<'a> {
        let n_obs = observed.iter().filter(|o| **o).count();
        let hangs = n_obs > 0 && !observed[observed.len() - 1];
        let stored = n_obs.saturating_sub(1);
        CutAgent {
            map,
            t_started: Some(0),
            is_reset: n_obs > 0,
            episode: EpisodeSizes {
                t: i64::try_from(stored).unwrap(),
                obs_total: n_obs,
                infos_total: n_obs,
                actions_total: stored,
                rewards_total: stored,
                extra_totals: vec![stored],
                ..EpisodeSizes::default()
            },
            has_module: true,
            hanging_action: hangs,
            hanging_extras: if hangs {
                HangingExtras::Holds { all_keys: true }
            } else {
                HangingExtras::Absent
            },
            hanging_reward: hangs.then_some(0.5),
        }
    }

    fn map_of(observed: &[bool]) -> StepMap {
        let mut t = 0;
        let steps = observed
            .iter()
            .map(|&o| {
                o.then(|| {
                    t += 1;
                    t - 1
                })
            })
            .collect();
        StepMap::new(steps, 0)
    }

    #[test]
    fn turn_based_agents_keep_their_rows_and_the_hanging_action() {
        // Env steps 0..=4: a observes at 0, 2, 4; b at 1, 3 (its action hangs).
        let a_obs = [true, false, true, false, true];
        let b_obs = [false, true, false, true, false];
        let (a_map, b_map) = (map_of(&a_obs), map_of(&b_obs));
        let input = CutInput {
            agents: vec![agent(&a_map, &a_obs), agent(&b_map, &b_obs)],
            set_order: vec![1, 0],
            lookback: 1,
            env_t: 4,
        };
        let plan = plan_cut(&input).expect("a plan");
        assert_eq!(plan.len_lookback_buffers, 1);
        // The successor starts at the chunk's end, not done.
        assert_eq!(
            plan.counters,
            Counters { env_t_started: 4, env_t: 4, is_terminated: false, is_truncated: false }
        );
        // In the order of their first kept observation.
        let (b, a) = (&plan.agents[0], &plan.agents[1]);
        // b's observation at env step 3 is the first kept; a's at 4 is the only one.
        assert_eq!(
            (b.agent, b.observations.clone(), b.actions.clone(), b.lookback, b.t_started),
            (1, vec![1], vec![], 0, 1)
        );
        assert_eq!(
            (a.agent, a.observations.clone(), a.actions.clone(), a.lookback, a.t_started),
            (0, vec![2], vec![], 0, 2)
        );
        assert!(!a.extras && !b.extras);
        assert_eq!(
            plan.maps,
            vec![(1, StepMap::new(vec![Some(1), None], 1)), (0, StepMap::new(vec![None, Some(2)], 1))]
        );
        assert_eq!(plan.hanging, vec![(1, ActionSource::Hanging)]);
        // b's hanging reward carries over (0.0 + 0.5 + 0.0); a's skip adds a zero entry.
        assert_eq!(plan.hanging_rewards, vec![(1, RewardSum::Known(0.5)), (0, RewardSum::Known(0.0))]);
        assert!(plan.gone.is_empty());
    }

    #[test]
    fn a_slice_inside_the_chunk_hangs_the_actions_of_its_rows() {
        // a observes at env steps 0, 2, 4; b at 1, 3. The slice 1..3 (no look-back).
        let a_obs = [true, false, true, false, true];
        let b_obs = [false, true, false, true, false];
        let (a_map, b_map) = (map_of(&a_obs), map_of(&b_obs));
        let input = SliceInput {
            agents: vec![agent(&a_map, &a_obs), agent(&b_map, &b_obs)],
            set_order: vec![0, 1],
            env_t_started: 10,
            start: 1,
            stop: 3,
            lookback: 0,
            lengths: vec![2, 1],
        };
        let plan = plan_slice(&input).expect("a plan");
        assert_eq!(plan.action_rows, 2);
        // Env steps 11..13 of the episode: two action rows, no look-back.
        assert_eq!(
            plan.counters,
            Counters { env_t_started: 11, env_t: 13, is_terminated: false, is_truncated: false }
        );
        // b observes at 1 and 3 (acting in between, not after: the slice has no action
        // at 3); a at 2, and its action (row 1) hangs, with that row's reward.
        let (b, a) = (&plan.agents[0], &plan.agents[1]);
        assert_eq!(
            (b.agent, b.observations.clone(), b.actions.clone(), b.infos),
            (1, vec![0, 1], vec![0], false)
        );
        assert_eq!((a.agent, a.observations.clone(), a.actions.clone()), (0, vec![1], vec![]));
        assert_eq!(plan.hanging, vec![(0, ActionSource::Row(1))]);
        assert_eq!(plan.hanging_rewards, vec![(0, RewardSum::Row(1))]);
        assert_eq!(plan.t_started, vec![(0, 1), (1, 0)]);
    }

    #[test]
    fn agents_done_before_the_kept_steps_are_left_out() {
        let live_obs = [true, true, true, true];
        let live = map_of(&live_obs);
        let done_obs = [true, true, false, false];
        let done_map = map_of(&done_obs);
        let mut done = agent(&done_map, &done_obs);
        (done.episode.terminated, done.hanging_action, done.hanging_reward) = (true, false, None);
        done.hanging_extras = HangingExtras::Absent;
        let input = CutInput {
            agents: vec![agent(&live, &live_obs), done],
            set_order: vec![0, 1],
            lookback: 1,
            env_t: 3,
        };
        let plan = plan_cut(&input).expect("a plan");
        assert_eq!(plan.agents.len(), 1);
        let kept = &plan.agents[0];
        assert_eq!(
            (kept.observations.clone(), kept.actions.clone(), kept.lookback, kept.extras),
            (vec![2, 3], vec![2], 1, true)
        );
        // The done agent keeps its module and an empty hanging reward (its skips).
        assert!(plan.gone.is_empty());
        assert_eq!(plan.hanging_rewards, vec![(1, RewardSum::Known(0.0))]);
        assert_eq!(plan.t_started, vec![(0, 3)]);
    }

    #[test]
    fn rows_that_do_not_line_up_have_no_plan() {
        let obs = [true, true, false];
        let map = map_of(&obs);
        let mut a = agent(&map, &obs);
        a.episode.extra_totals = vec![0];
        assert!(plan_cut(&CutInput { agents: vec![a], set_order: vec![0], lookback: 2, env_t: 0 }).is_none());
        assert!(plan_cut(&CutInput { agents: vec![], set_order: vec![], lookback: 0, env_t: 0 }).is_none());
    }

    fn chunk() -> impl Strategy<Value = Vec<Vec<bool>>> {
        (1usize..5, 1usize..12)
            .prop_flat_map(|(agents, steps)| {
                proptest::collection::vec(proptest::collection::vec(any::<bool>(), steps), agents)
            })
            // Every agent has an episode, so it observed at least once.
            .prop_map(|mut observed| {
                for o in &mut observed {
                    if !o.contains(&true) {
                        o[0] = true;
                    }
                }
                observed
            })
    }

    proptest! {
        #[test]
        fn every_kept_agent_is_a_run_of_its_rows(observed in chunk(), lookback in 0usize..6, reversed in any::<bool>()) {
            let maps: Vec<StepMap> = observed.iter().map(|o| map_of(o)).collect();
            let agents: Vec<CutAgent<'_>> = maps.iter().zip(&observed).map(|(m, o)| agent(m, o)).collect();
            let mut set_order: Vec<usize> = (0..agents.len()).collect();
            if reversed {
                set_order.reverse();
            }
            let plan = plan_cut(&CutInput { agents, set_order, lookback, env_t: 0 }).expect("a plan for live agents");
            let rows = observed[0].len();
            // (Env steps before the chunk's first read as skips.)
            prop_assert_eq!(plan.len_lookback_buffers, lookback);
            for cut in &plan.agents {
                let obs = &observed[cut.agent];
                // Its last observation is kept, with the ones before in the kept steps.
                let n_obs = obs.iter().filter(|o| **o).count();
                prop_assert_eq!(*cut.observations.last().unwrap(), n_obs - 1);
                prop_assert!(cut.observations.windows(2).all(|w| w[1] == w[0] + 1));
                prop_assert_eq!(cut.actions.len() + 1, cut.observations.len());
                prop_assert_eq!(&cut.actions[..], &cut.observations[..cut.actions.len()]);
                prop_assert!(cut.lookback <= cut.actions.len());
                prop_assert_eq!(cut.t_started, i64::try_from(n_obs - 1).unwrap());
                let (_, map) = plan.maps.iter().find(|(a, _)| *a == cut.agent).unwrap();
                prop_assert_eq!(map.lookback(), plan.len_lookback_buffers);
                let stepped: Vec<i64> = map.steps().iter().flatten().copied().collect();
                prop_assert_eq!(stepped.len(), cut.observations.len());
                // The hanging action carries over exactly when it hung.
                prop_assert_eq!(plan.hanging.contains(&(cut.agent, ActionSource::Hanging)), !obs[rows - 1]);
            }
            // Every map covers the kept env steps.
            prop_assert!(plan.maps.iter().all(|(_, m)| m.steps().len() == plan.maps[0].1.steps().len()));
        }
    }
}
