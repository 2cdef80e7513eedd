//! Episodes: the bookkeeping of one agent's trajectory over typed fields.

pub mod clock;
pub mod field;
pub mod multi;
pub mod packed;
pub mod read;
pub mod single;
pub mod write;

pub use clock::{perf_counter, StepTimes};
pub use field::{Conversion, Field, FieldSpec, Item, Leaves, Storage, TypedItem};
pub use single::{EpisodeError, EpisodeSizes, FieldName, SingleAgentCore, Step, ToObject};
pub use write::SplitBatch;

use std::sync::Arc;

use crate::intern::Interner;

/// Extra-model-output keys seen so far, shared by every episode that uses them (bounded:
/// past 256, the oldest key goes first).
static KEYS: Interner<str> = Interner::new(256);

/// The shared copy of an extra-model-output key.
///
/// Every episode of a runner has the same few keys; sharing them saves an allocation per
/// key per episode (and per cut or slice, which copy the keys).
#[must_use]
pub fn intern_key(key: &str) -> Arc<str> {
    KEYS.get_or_insert(key, |k, key| k == *key, Arc::from)
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
