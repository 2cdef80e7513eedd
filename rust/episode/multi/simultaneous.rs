//! The multi-agent `cut` of a chunk whose live agents all stepped at each env step it
//! keeps (a runner's chunks usually are): the fast twin of [`super::plan_cut`], tried
//! first by the same `cut`.
//!
//! Each kept agent's successor is its own episode's cut with the same look-back, and its
//! env-step map a plain run of agent steps ([`StepMap::run`]): what the rebuild from the
//! per-env-step reads gives for such chunks, without reading them. Which part each agent
//! takes is [`StepMap::simultaneous_cut`]; [`plan_simultaneous_cut`] adds the chunk's
//! conditions.

use super::step_map::{CutPart, StepMap};

/// One agent of the chunk that is cut, as the simultaneous path reads it.
#[derive(Clone, Debug)]
#[allow(clippy::struct_excessive_bools)] // independent facts about one agent
pub struct SimultaneousAgent<'a> {
    /// Its env-step map (`None`: it has none).
    pub map: Option<&'a StepMap>,
    /// Its episode is done.
    pub done: bool,
    /// Some of its data was turned to numpy (the rebuild turns it back into lists).
    pub numpy: bool,
    /// Its module id is set (a falsy one sends the rebuild to the mapping function).
    pub has_module: bool,
    /// It recorded extra model outputs.
    pub has_extra_keys: bool,
}

/// The chunk that is cut, as [`plan_simultaneous_cut`] reads it.
#[derive(Clone, Debug)]
pub struct SimultaneousInput<'a> {
    /// The agents with an episode, in the episode's order.
    pub agents: Vec<SimultaneousAgent<'a>>,
    /// How many env-step maps the chunk holds.
    pub maps: usize,
    /// Whether an action or extra model outputs hang at the chunk's end.
    pub hanging: bool,
    /// The env steps of look-back the successor keeps.
    pub lookback: usize,
    /// The chunk's env steps (`env_t - env_t_started`).
    pub env_steps: i64,
}

/// Each agent's part in the successor (in the episode's order); at least one is kept.
pub type SimultaneousCut = Vec<CutPart>;

/// The parts of a cut on the simultaneous path, or `None` where the cut is rebuilt: when
/// something hangs, the look-back reaches before the chunk, an agent has no map (or a map
/// has no agent), its data was turned to numpy, its module id is not set, it takes no
/// simultaneous part ([`StepMap::simultaneous_cut`]), or no agent is kept.
#[must_use]
pub fn plan_simultaneous_cut(input: &SimultaneousInput<'_>) -> Option<SimultaneousCut> {
    let reaches_before = i64::try_from(input.lookback).map_or(true, |k| k > input.env_steps);
    if input.agents.is_empty() || input.hanging || reaches_before || input.maps != input.agents.len() {
        return None;
    }
    let parts = input
        .agents
        .iter()
        .map(|a| {
            let map = a.map.filter(|_| !a.numpy && a.has_module)?;
            map.simultaneous_cut(a.done, input.lookback, a.has_extra_keys)
        })
        .collect::<Option<Vec<_>>>()?;
    parts.iter().any(|p| matches!(p, CutPart::Keep { .. })).then_some(parts)
}

impl StepMap {
    /// The env-step map of an agent that steps at each env step: its agent steps
    /// `t - lookback ..= t`, the first `lookback` of them look-back.
    #[must_use]
    pub fn run(t: i64, lookback: usize) -> StepMap {
        let first = t.saturating_sub(i64::try_from(lookback).unwrap_or(i64::MAX));
        StepMap::new((first..=t).map(Some).collect(), lookback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(map: &StepMap) -> SimultaneousAgent<'_> {
        SimultaneousAgent {
            map: Some(map),
            done: false,
            numpy: false,
            has_module: true,
            has_extra_keys: true,
        }
    }

    fn input(agents: Vec<SimultaneousAgent<'_>>, lookback: usize) -> SimultaneousInput<'_> {
        let maps = agents.len();
        SimultaneousInput { agents, maps, hanging: false, lookback, env_steps: 3 }
    }

    #[test]
    fn agents_that_step_together_are_kept() {
        let run = StepMap::run(3, 3);
        let plan = plan_simultaneous_cut(&input(vec![agent(&run), agent(&run)], 1));
        assert_eq!(plan, Some(vec![CutPart::Keep { finished_now: false }; 2]));
        // Done at the last env step: kept, done.
        let done = SimultaneousAgent { done: true, ..agent(&run) };
        let plan = plan_simultaneous_cut(&input(vec![agent(&run), done], 1));
        assert_eq!(
            plan,
            Some(vec![CutPart::Keep { finished_now: false }, CutPart::Keep { finished_now: true }])
        );
    }

    #[test]
    fn done_agents_are_dropped_or_left_out() {
        let run = StepMap::run(3, 3);
        let first_kept = StepMap::new(vec![Some(0), Some(1), Some(2), None], 0);
        let before = StepMap::new(vec![Some(0), None, None, None], 0);
        let dropped = SimultaneousAgent { done: true, ..agent(&first_kept) };
        let gone = SimultaneousAgent { done: true, ..agent(&before) };
        let plan = plan_simultaneous_cut(&input(vec![dropped.clone(), agent(&run), gone.clone()], 1));
        assert_eq!(plan, Some(vec![CutPart::Dropped, CutPart::Keep { finished_now: false }, CutPart::Gone]));
        // Nobody kept: no plan.
        assert_eq!(plan_simultaneous_cut(&input(vec![dropped, gone], 1)), None);
    }

    #[test]
    fn the_chunk_or_an_agent_can_send_the_cut_to_the_rebuild() {
        let run = StepMap::run(3, 3);
        let gap = StepMap::new(vec![Some(0), Some(1), None, Some(2)], 0);
        assert_eq!(plan_simultaneous_cut(&input(vec![], 1)), None);
        assert_eq!(plan_simultaneous_cut(&input(vec![agent(&run), agent(&gap)], 1)), None);
        for changed in [
            SimultaneousAgent { map: None, ..agent(&run) },
            SimultaneousAgent { numpy: true, ..agent(&run) },
            SimultaneousAgent { has_module: false, ..agent(&run) },
        ] {
            assert_eq!(plan_simultaneous_cut(&input(vec![agent(&run), changed], 1)), None);
        }
        // Extra outputs matter only without look-back.
        assert_eq!(plan_simultaneous_cut(&input(vec![agent(&run)], 0)), None);
        let plain = SimultaneousAgent { has_extra_keys: false, ..agent(&run) };
        assert!(plan_simultaneous_cut(&input(vec![plain], 0)).is_some());
        let ok = input(vec![agent(&run)], 1);
        assert!(plan_simultaneous_cut(&ok).is_some());
        assert_eq!(plan_simultaneous_cut(&SimultaneousInput { hanging: true, ..ok.clone() }), None);
        assert_eq!(plan_simultaneous_cut(&SimultaneousInput { maps: 2, ..ok.clone() }), None);
        assert_eq!(plan_simultaneous_cut(&SimultaneousInput { lookback: 4, ..ok }), None);
    }

    #[test]
    fn a_run_covers_the_look_back_and_the_current_step() {
        let run = StepMap::run(5, 2);
        assert_eq!(run.steps(), &[Some(3), Some(4), Some(5)]);
        assert_eq!(run.lookback(), 2);
        assert_eq!(StepMap::run(0, 0).steps(), &[Some(0)]);
    }
}
