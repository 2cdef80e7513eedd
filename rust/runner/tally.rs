//! The step counts of a multi-agent record: one step per observing agent, for the agent
//! and for its module, tallied over a call's sub-envs and written out once per key.

/// Counts by key, for a few distinct keys (a vector step's agents or modules) counted many
/// times. Generic over the host's key objects: a key is matched first by a cheap test (the
/// same object: agent ids recur across steps and sub-envs), then by equality, which may
/// fail (a Python `==`). A dict update per agent and sub-env cost about an eighth of the
/// multi-agent record.
#[derive(Clone, Debug)]
pub struct Tally<K> {
    counts: Vec<(K, i64)>,
}

impl<K> Default for Tally<K> {
    fn default() -> Self {
        Tally { counts: Vec::new() }
    }
}

impl<K> Tally<K> {
    /// Counts `key` once: for the first counted key that `same` matches, else the first
    /// that `equal` matches, else as a new key (in order of first count).
    pub fn add<E>(
        &mut self,
        key: &K,
        same: impl Fn(&K, &K) -> bool,
        mut equal: impl FnMut(&K, &K) -> Result<bool, E>,
    ) -> Result<(), E>
    where
        K: Clone,
    {
        if let Some(entry) = self.counts.iter_mut().find(|(k, _)| same(k, key)) {
            entry.1 += 1;
            return Ok(());
        }
        for entry in &mut self.counts {
            if equal(&entry.0, key)? {
                entry.1 += 1;
                return Ok(());
            }
        }
        self.counts.push((key.clone(), 1));
        Ok(())
    }

    /// The keys and their counts, in order of first count.
    pub fn iter(&self) -> impl Iterator<Item = (&K, i64)> {
        self.counts.iter().map(|(k, n)| (k, *n))
    }
}

/// A multi-agent record's step counts: per agent, and per module.
#[derive(Clone, Debug)]
pub struct StepCounts<K> {
    pub agents: Tally<K>,
    pub modules: Tally<K>,
}

impl<K> Default for StepCounts<K> {
    fn default() -> Self {
        StepCounts { agents: Tally::default(), modules: Tally::default() }
    }
}

impl<K: Clone> StepCounts<K> {
    /// Counts the step of one sub-env: one for each agent in `observing` (the agents
    /// with an observation in it) and one for that agent's module, `module(agent)`
    /// (`None`: the agent maps to no module). Keys match as in [`Tally::add`].
    ///
    /// An agent that first observes in its episode's terminal step has no agent episode
    /// and so no mapping yet; its step still counts, for the module the mapping function
    /// gives it (as RLlib's `module_for` does): `module` looks it up.
    ///
    /// # Errors
    /// `no_module(agent)` for an agent that maps to no module (the agents before it stay
    /// counted), or an error of `module` or `equal`.
    pub fn add_step<E>(
        &mut self,
        observing: impl IntoIterator<Item = K>,
        mut module: impl FnMut(&K) -> Result<Option<K>, E>,
        no_module: impl FnOnce(&K) -> E,
        same: impl Fn(&K, &K) -> bool,
        mut equal: impl FnMut(&K, &K) -> Result<bool, E>,
    ) -> Result<(), E> {
        for agent in observing {
            let Some(m) = module(&agent)? else { return Err(no_module(&agent)) };
            self.agents.add(&agent, &same, &mut equal)?;
            self.modules.add(&m, &same, &mut equal)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never<K>(_: &K, _: &K) -> bool {
        false
    }

    #[test]
    fn counts_equal_keys_together_in_order_of_first_count() {
        let mut t = Tally::default();
        for k in ["b", "a", "b", "b", "c", "a"] {
            t.add::<()>(&k.to_owned(), never, |x, y| Ok(x == y)).unwrap();
        }
        let got: Vec<(&str, i64)> = t.iter().map(|(k, n)| (k.as_str(), n)).collect();
        assert_eq!(got, vec![("b", 3), ("a", 2), ("c", 1)]);
    }

    #[test]
    fn the_cheap_match_spares_the_equality_test() {
        let mut t = Tally::default();
        t.add::<()>(&1, |a, b| a == b, |_, _| panic!("no key to compare yet")).unwrap();
        // The same key again: matched by the cheap test alone.
        t.add::<()>(&1, |a, b| a == b, |_, _| panic!("matched without equality")).unwrap();
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![(&1, 2)]);
    }

    #[test]
    fn each_observing_agent_counts_for_itself_and_its_module() {
        let mut c = StepCounts::default();
        let module = |a: &&str| Ok::<_, String>(Some(if a.starts_with('a') { "m1" } else { "m2" }));
        let none = |a: &&str| format!("no module for {a}");
        c.add_step(["a0", "b0"], module, none, |x, y| x == y, |_, _| Ok(false)).unwrap();
        c.add_step(["a1", "a0"], module, none, |x, y| x == y, |_, _| Ok(false)).unwrap();
        assert_eq!(c.agents.iter().collect::<Vec<_>>(), vec![(&"a0", 2), (&"b0", 1), (&"a1", 1)]);
        assert_eq!(c.modules.iter().collect::<Vec<_>>(), vec![(&"m1", 3), (&"m2", 1)]);
    }

    #[test]
    fn an_agent_without_a_module_is_an_error_after_the_agents_before_it() {
        let mut c = StepCounts::default();
        let module = |a: &&str| Ok::<_, String>((*a != "lost").then_some("m"));
        let err = c.add_step(
            ["a", "lost", "b"],
            module,
            |a| format!("{a}: no module"),
            |x, y| x == y,
            |_, _| Ok(false),
        );
        assert_eq!(err, Err("lost: no module".to_owned()));
        assert_eq!(c.agents.iter().collect::<Vec<_>>(), vec![(&"a", 1)]);
        assert_eq!(c.modules.iter().collect::<Vec<_>>(), vec![(&"m", 1)]);
        let failing = c.add_step(
            ["x"],
            |_| Err("lookup raised".to_owned()),
            |_| unreachable!(),
            |x, y| x == y,
            |_, _| Ok(false),
        );
        assert_eq!(failing, Err("lookup raised".to_owned()));
    }

    #[test]
    fn a_failing_equality_leaves_the_counts_as_they_were() {
        let mut t = Tally::default();
        t.add::<&str>(&1, never, |_, _| Ok(false)).unwrap();
        assert_eq!(t.add(&2, never, |_, _| Err("eq raised")), Err("eq raised"));
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![(&1, 1)]);
    }
}
