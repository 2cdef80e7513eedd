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
    fn a_failing_equality_leaves_the_counts_as_they_were() {
        let mut t = Tally::default();
        t.add::<&str>(&1, never, |_, _| Ok(false)).unwrap();
        assert_eq!(t.add(&2, never, |_, _| Err("eq raised")), Err("eq raised"));
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![(&1, 1)]);
    }
}
