//! Logged values whose conversion into numbers waits for the stat's next read.
//!
//! Some values cost a round trip each to convert (a torch tensor on a GPU: one device sync
//! per value); for the stats that allow it ([`Stat::defers_numbers`]) a binding keeps them
//! here, per stat slot and in logging order, and converts each stat's batch at once when
//! the stat is read, logged to without deferral, or its slot may be reused.
//!
//! [`Stat::defers_numbers`]: super::Stat::defers_numbers

/// Deferred values per stat slot, slots in the order they were first deferred to.
#[derive(Debug, Clone, PartialEq)]
pub struct Deferred<T> {
    pending: Vec<(usize, Vec<T>)>,
}

impl<T> Default for Deferred<T> {
    fn default() -> Self {
        Deferred { pending: Vec::new() }
    }
}

impl<T> Deferred<T> {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Defers `v`, logged to the stat in `slot`.
    pub fn push(&mut self, slot: usize, v: T) {
        match self.pending.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, vs)) => vs.push(v),
            None => self.pending.push((slot, vec![v])),
        }
    }

    /// Removes and returns the deferred values of every slot (`None`) or of one.
    pub fn take(&mut self, slot: Option<usize>) -> Vec<(usize, Vec<T>)> {
        if slot.is_none() || self.pending.is_empty() {
            return std::mem::take(&mut self.pending);
        }
        let (due, keep) = std::mem::take(&mut self.pending).into_iter().partition(|(s, _)| slot == Some(*s));
        self.pending = keep;
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_one_slot_or_all_in_order() {
        let mut d = Deferred::default();
        assert!(d.is_empty() && d.take(None).is_empty());
        d.push(3, 'a');
        d.push(1, 'b');
        d.push(3, 'c');
        assert_eq!(d.take(Some(7)), vec![]);
        assert_eq!(d.take(Some(3)), vec![(3, vec!['a', 'c'])]);
        d.push(2, 'd');
        assert_eq!(d.take(None), vec![(1, vec!['b']), (2, vec!['d'])]);
        assert!(d.is_empty());
    }
}
