//! One agent's env-step -> agent-step map (RLlib's `env_t_to_agent_t` entry).

use crate::column::{Geometry, Index, IndexError, Pos, Resolved};

/// One agent's env-step -> agent-step map: `Some(t)` where the agent stepped (its agent
/// step `t`), `None` where it did not (RLlib's `"S"` skip tag). The first `lookback`
/// entries belong to the look-back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepMap {
    steps: Vec<Option<i64>>,
    lookback: usize,
}

impl StepMap {
    #[must_use]
    pub fn new(steps: Vec<Option<i64>>, lookback: usize) -> StepMap {
        StepMap { steps, lookback }
    }

    #[must_use]
    pub fn steps(&self) -> &[Option<i64>] {
        &self.steps
    }

    #[must_use]
    pub fn lookback(&self) -> usize {
        self.lookback
    }

    /// Sets the look-back. It may exceed the entries stored, as in RLlib (a chunk sliced
    /// or cut with more look-back than an agent has entries): int reads then still offset
    /// by it.
    pub fn set_lookback(&mut self, lookback: usize) {
        self.lookback = lookback;
    }

    /// Entries after the look-back.
    #[must_use]
    pub fn len(&self) -> usize {
        self.steps.len().saturating_sub(self.lookback)
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the map has at least `n` entries and the agent stepped at each of the
    /// last `n` (look-back included).
    #[must_use]
    pub fn stepped_at_last(&self, n: usize) -> bool {
        n <= self.steps.len() && self.steps[self.steps.len() - n..].iter().all(Option::is_some)
    }

    pub fn push(&mut self, step: Option<i64>) {
        self.steps.push(step);
    }

    pub fn extend(&mut self, steps: impl IntoIterator<Item = Option<i64>>) {
        self.steps.extend(steps);
    }

    /// Entries at `index` (RLlib's index semantics); positions outside the map read as
    /// skips with `fill`. `ignore_last` leaves the last entry out first: the env step
    /// an agent has just observed at has no action or reward yet.
    pub fn get(
        &self,
        index: &Index,
        neg_index_as_lookback: bool,
        fill: bool,
        ignore_last: bool,
    ) -> Result<MapRead, IndexError> {
        let total = self.steps.len() - usize::from(ignore_last && !self.steps.is_empty());
        // RLlib keeps the look-back as set even when `ignore_last` shortens the data (or
        // a cut or slice leaves fewer entries than the look-back): indices are offset by
        // the whole look-back and then bounds-checked against the entries there are.
        let geometry = Geometry { total, lookback: self.lookback };
        let read = |p: &Pos| match p {
            Pos::At(p) => self.steps[*p],
            Pos::Fill => None,
        };
        Ok(match geometry.resolve(index, neg_index_as_lookback, fill)? {
            Resolved::One(p) => MapRead::One(read(&p)),
            Resolved::Many(v) => MapRead::Many(v.iter().map(read).collect()),
        })
    }
}

impl StepMap {
    /// How many entries back (1 = the last) the agent last stepped, looking at
    /// `from..=to` entries back (clamped to the map); `None` if it did not step there.
    /// Used by `cut`: an agent whose action hangs keeps the observation it acted on.
    #[must_use]
    pub fn last_stepped(&self, from: usize, to: usize) -> Option<usize> {
        (from.max(1)..=to.min(self.steps.len())).find(|&back| self.steps[self.steps.len() - back].is_some())
    }

    /// The entries from this chunk's first env step on (look-back left out).
    fn chunk_entries(&self) -> &[Option<i64>] {
        &self.steps[self.lookback.min(self.steps.len())..]
    }

    /// Appends the `new_steps` env steps of the chunk that continues this one:
    /// `theirs`'s entries after the env step both chunks share, or skips where the agent
    /// takes no part in it (`theirs` is `None`). Every map keeps covering every env step
    /// (RLlib 2.60 leaves the maps of done or absent agents behind: ray issue 45542).
    pub fn append_chunk(&mut self, theirs: Option<&StepMap>, new_steps: usize) {
        match theirs {
            Some(m) => self.steps.extend(m.chunk_entries().iter().skip(1)),
            None => self.steps.extend(std::iter::repeat_n(None, new_steps)),
        }
    }

    /// The map, in the episode a chunk is appended to, of an agent first seen in that
    /// chunk: skips for the `steps_before` entries the episode has before the shared env
    /// step (look-back included), then the chunk's entries from the shared step on.
    #[must_use]
    pub fn joined(
        theirs: Option<&StepMap>,
        new_steps: usize,
        steps_before: usize,
        lookback: usize,
    ) -> StepMap {
        let mut steps = vec![None; steps_before];
        match theirs {
            Some(m) => steps.extend_from_slice(m.chunk_entries()),
            None => steps.extend(std::iter::repeat_n(None, new_steps + 1)),
        }
        StepMap { steps, lookback }
    }

    /// The look-back a cut keeps: at least `requested`, and for every agent whose action
    /// hangs (`hanging`), back to the observation it acted on. (RLlib 2.60 starts this
    /// search at the chunk's first step for `requested == 0` and loses the agent: ray
    /// issue 44677.)
    #[must_use]
    pub fn cut_lookback<'a>(requested: usize, hanging: impl IntoIterator<Item = &'a StepMap>) -> usize {
        hanging
            .into_iter()
            .filter_map(|m| m.last_stepped(requested.max(1), m.steps.len()))
            .map(|back| back - 1)
            .fold(requested, usize::max)
    }
}

impl StepMap {
    /// An agent's part in a cut that keeps `lookback` env steps, when the cut takes the
    /// simultaneous path (each kept agent's successor is its own episode's cut, its map a
    /// plain run of agent steps); `None` where that path does not apply and the cut is
    /// rebuilt from the per-env-step reads. `done`: the agent's episode is done;
    /// `has_extra_keys`: it recorded extra model outputs.
    ///
    /// A live agent takes that path when it stepped at each kept env step (and, without
    /// look-back, has no extra outputs: the rebuilt cut gives such agents no keys). A done
    /// agent: kept, done, if it finished at the last env step having stepped at each kept
    /// one; dropped if its last step is the first kept env step; left out if it finished
    /// before the kept env steps; anything else is rebuilt.
    #[must_use]
    pub fn simultaneous_cut(&self, done: bool, lookback: usize, has_extra_keys: bool) -> Option<CutPart> {
        let kept = lookback + 1;
        if done {
            match self.last_stepped(1, kept) {
                None => return Some(CutPart::Gone),
                Some(last) if last == kept && last > 1 => return Some(CutPart::Dropped),
                Some(1) => {}
                Some(_) => return None,
            }
        }
        let steps_together = self.stepped_at_last(kept) && !(lookback == 0 && has_extra_keys);
        steps_together.then_some(CutPart::Keep { finished_now: done })
    }
}

/// An agent's part in a simultaneous cut ([`StepMap::simultaneous_cut`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutPart {
    /// In the successor, cut from its episode (done if it finished at the last env step).
    Keep { finished_now: bool },
    /// Done at the first kept env step: not in the successor, nor in its module map.
    Dropped,
    /// Finished before the kept env steps: not in the successor.
    Gone,
}

/// What [`StepMap::get`] read: one entry or several (`None` = skip).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapRead {
    One(Option<i64>),
    Many(Vec<Option<i64>>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simultaneous_cut_parts() {
        let map = |steps: &[Option<i64>]| StepMap::new(steps.to_vec(), 0);
        let run = map(&[Some(0), Some(1), Some(2)]);
        assert_eq!(run.simultaneous_cut(false, 1, true), Some(CutPart::Keep { finished_now: false }));
        // Without look-back, extra outputs send the cut down the rebuilt path.
        assert_eq!(run.simultaneous_cut(false, 0, true), None);
        assert_eq!(run.simultaneous_cut(false, 0, false), Some(CutPart::Keep { finished_now: false }));
        // Done at the last env step, having stepped at each kept one.
        assert_eq!(run.simultaneous_cut(true, 1, false), Some(CutPart::Keep { finished_now: true }));
        // A live agent that skipped a kept env step.
        let gap = map(&[Some(0), None, Some(1)]);
        assert_eq!(gap.simultaneous_cut(false, 1, false), None);
        // Done with its last step the first kept env step (look-back 1): dropped.
        let first_kept = map(&[Some(0), Some(1), None]);
        assert_eq!(first_kept.simultaneous_cut(true, 1, false), Some(CutPart::Dropped));
        // ... and without look-back that step is the last one: kept.
        assert_eq!(
            map(&[Some(0), Some(1)]).simultaneous_cut(true, 0, false),
            Some(CutPart::Keep { finished_now: true })
        );
        // Finished before the kept env steps: gone.
        assert_eq!(map(&[Some(0), None, None]).simultaneous_cut(true, 1, false), Some(CutPart::Gone));
        // Done between the first kept and the last env step: rebuilt.
        assert_eq!(map(&[Some(0), None, Some(1), None]).simultaneous_cut(true, 2, false), None);
        assert_eq!(
            map(&[Some(0), Some(1), None, None]).simultaneous_cut(true, 2, false),
            Some(CutPart::Dropped)
        );
    }

    #[test]
    fn step_map_reads_with_skips_fill_and_ignore_last() {
        // Lookback 1; the agent stepped at env steps 0, 2 and 3 (agent steps 0, 1, 2).
        let m = StepMap::new(vec![Some(0), None, Some(1), Some(2)], 1);
        assert_eq!(m.len(), 3);
        assert_eq!(m.get(&Index::All, false, false, false), Ok(MapRead::Many(vec![None, Some(1), Some(2)])));
        assert_eq!(m.get(&Index::All, false, false, true), Ok(MapRead::Many(vec![None, Some(1)])));
        assert_eq!(m.get(&Index::Int(-1), false, false, true), Ok(MapRead::One(Some(1))));
        assert_eq!(m.get(&Index::Int(-1), true, false, false), Ok(MapRead::One(Some(0))));
        assert_eq!(m.get(&Index::Int(7), false, true, false), Ok(MapRead::One(None)));
        assert!(m.get(&Index::Int(7), false, false, false).is_err());
        assert!(m.stepped_at_last(2) && m.stepped_at_last(0));
        assert!(!m.stepped_at_last(3) && !m.stepped_at_last(5));
        let mut m = m;
        m.push(None);
        m.extend([Some(3)]);
        m.set_lookback(9);
        assert_eq!((m.lookback(), m.len(), m.is_empty()), (9, 0, true));
    }

    #[test]
    fn step_map_int_reads_keep_a_lookback_longer_than_the_data() {
        // Two entries under a look-back of 2 with the last ignored: one entry is left,
        // and RLlib still offsets int indices by 2.
        let m = StepMap::new(vec![Some(-1), Some(0)], 2);
        assert_eq!(m.get(&Index::Int(-2), true, false, true), Ok(MapRead::One(Some(-1))));
        assert!(m.get(&Index::Int(-1), true, false, true).is_err());
        assert_eq!(m.get(&Index::List(vec![-2]), true, false, true), Ok(MapRead::Many(vec![Some(-1)])));
        assert_eq!(m.get(&Index::Int(-1), true, true, true), Ok(MapRead::One(None)));
    }

    #[test]
    fn cut_lookback_keeps_the_observation_a_hanging_action_came_from() {
        // Stepped at entries 0 and 1, then two skips: its action hangs since entry 1.
        let m = StepMap::new(vec![Some(0), Some(1), None, None], 0);
        assert_eq!(m.last_stepped(1, 4), Some(3));
        assert_eq!(m.last_stepped(1, 2), None);
        assert_eq!(StepMap::cut_lookback(0, [&m]), 2);
        assert_eq!(StepMap::cut_lookback(5, [&m]), 5);
        // A requested look-back of 0 searches from the last entry (not the chunk's first).
        let last = StepMap::new(vec![None, Some(0)], 0);
        assert_eq!(StepMap::cut_lookback(0, [&last, &m]), 2);
        assert_eq!(StepMap::cut_lookback(3, std::iter::empty()), 3);
    }

    #[test]
    fn concat_keeps_every_map_covering_every_env_step() {
        // Ours: look-back 1 + 2 env steps; theirs starts at our last env step with
        // look-back 1 and 3 new env steps.
        let mut ours = StepMap::new(vec![Some(0), Some(1), Some(2)], 1);
        let theirs = StepMap::new(vec![Some(1), Some(2), None, Some(3), Some(4)], 1);
        ours.append_chunk(Some(&theirs), 3);
        assert_eq!(ours.steps(), &[Some(0), Some(1), Some(2), None, Some(3), Some(4)]);
        // An agent that takes no part in the next chunk gets one skip per new env step.
        let mut done = StepMap::new(vec![Some(0), Some(1)], 0);
        done.append_chunk(None, 3);
        assert_eq!(done.steps(), &[Some(0), Some(1), None, None, None]);
        // An agent first seen in the next chunk lines up with the others.
        let j = StepMap::joined(Some(&StepMap::new(vec![None, None, Some(0)], 1)), 1, 3, 1);
        assert_eq!((j.steps(), j.lookback()), (&[None, None, None, None, Some(0)][..], 1));
        let absent = StepMap::joined(None, 2, 1, 0);
        assert_eq!(absent.steps(), &[None, None, None, None]);
    }
}
