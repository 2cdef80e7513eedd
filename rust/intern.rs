//! Bounded tables of shared, immutable values: equal values built again and again (the
//! specs of a runner's episodes, their extra-model-output keys) are kept once and shared.

use std::sync::{Arc, Mutex, PoisonError};

/// A table of at most `max` shared values; when it is full the oldest goes first (its
/// users keep their pointer), so a long-lived process that has seen many values still
/// shares the ones it uses now.
pub struct Interner<T: ?Sized> {
    entries: Mutex<Vec<Arc<T>>>,
    max: usize,
}

impl<T: ?Sized> Interner<T> {
    /// An empty table that keeps at most `max` entries (at least one).
    #[must_use]
    pub const fn new(max: usize) -> Interner<T> {
        Interner { entries: Mutex::new(Vec::new()), max: if max == 0 { 1 } else { max } }
    }

    /// The entry that `same` finds equal to `probe`, else `make(probe)`, added.
    ///
    /// An evicted entry is dropped after the lock is released: dropping a host value may
    /// run host code, which may intern again.
    pub fn get_or_insert<Q>(
        &self,
        probe: Q,
        same: impl Fn(&T, &Q) -> bool,
        make: impl FnOnce(Q) -> Arc<T>,
    ) -> Arc<T> {
        // A poisoned lock only means a panic elsewhere while it was held; the table (a Vec
        // of complete entries) is still valid.
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = entries.iter().find(|e| same(e, &probe)) {
            return Arc::clone(e);
        }
        let item = make(probe);
        let evicted = (entries.len() >= self.max).then(|| entries.remove(0));
        entries.push(Arc::clone(&item));
        drop(entries);
        drop(evicted);
        item
    }

    /// The entry that `pred` picks, if any.
    pub fn find(&self, pred: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.iter().find(|e| pred(e)).cloned()
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_are_shared_and_the_oldest_goes_first() {
        let table: Interner<str> = Interner::new(2);
        let a = table.get_or_insert("a", |k, q| k == *q, Arc::from);
        assert!(Arc::ptr_eq(&a, &table.get_or_insert(&*String::from("a"), |k, q| k == *q, Arc::from)));
        let b = table.get_or_insert("b", |k, q| k == *q, Arc::from);
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(table.len(), 2);
        table.get_or_insert("c", |k, q| k == *q, Arc::from);
        assert_eq!(table.len(), 2, "bounded");
        assert!(table.find(|k| k == "a").is_none(), "the oldest went");
        assert!(table.find(|k| k == "b").is_some_and(|k| Arc::ptr_eq(&k, &b)));
        assert_eq!(&*a, "a", "an evicted entry's users keep it");
    }

    #[test]
    fn a_table_of_zero_keeps_one() {
        let table: Interner<u8> = Interner::new(0);
        table.get_or_insert(1, |a, b| a == b, Arc::new);
        table.get_or_insert(2, |a, b| a == b, Arc::new);
        assert_eq!((table.len(), table.find(|v| *v == 2).is_some()), (1, true));
        assert!(!table.is_empty());
    }
}
