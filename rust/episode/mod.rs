//! Episodes: the bookkeeping of one agent's trajectory over typed fields.

pub mod field;
pub mod multi;
pub mod read;
pub mod single;

pub use field::{Field, FieldSpec, Item, Leaves, Storage, TypedItem};
pub use single::{EpisodeError, FieldName, SingleAgentCore, Step, ToObject};

use std::sync::{Arc, Mutex, PoisonError};

/// Extra-model-output keys seen so far, shared by every episode that uses them.
static KEYS: Mutex<Vec<Arc<str>>> = Mutex::new(Vec::new());
/// Bounded: past this many, the oldest key goes first.
const MAX_KEYS: usize = 256;

/// The shared copy of an extra-model-output key.
///
/// Every episode of a runner has the same few keys; sharing them saves an allocation per
/// key per episode (and per cut or slice, which copy the keys).
#[must_use]
pub fn intern_key(key: &str) -> Arc<str> {
    // A poisoned lock only means a panic elsewhere while it was held; the table (complete
    // entries) is still valid.
    let mut keys = KEYS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(k) = keys.iter().find(|k| ***k == *key) {
        return Arc::clone(k);
    }
    let k: Arc<str> = Arc::from(key);
    if keys.len() == MAX_KEYS {
        // The oldest goes (its users keep their copy).
        keys.remove(0);
    }
    keys.push(Arc::clone(&k));
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_shared() {
        let a = intern_key("action_logp");
        let b = intern_key(&String::from("action_logp"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*intern_key("vf_preds"), "vf_preds");
        assert!(!Arc::ptr_eq(&a, &intern_key("vf_preds")));
    }
}
