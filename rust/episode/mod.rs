//! Episodes: the bookkeeping of one agent's trajectory over typed fields.

pub mod field;
pub mod multi;
pub mod single;

pub use field::{Field, Item, Leaves, Storage};
pub use single::{EpisodeError, FieldName, SingleAgentCore, Step, ToObject};
