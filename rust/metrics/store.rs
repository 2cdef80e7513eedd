//! Nested keys mapped to stats.
//!
//! Keys are paths of string or integer parts (RLlib's nested dict keys: metric names,
//! module ids, agent ids). The tree keeps insertion order, as a nested dict does; stats
//! live in a slab so a binding can cache a key's slot and push without walking the tree.

use super::stat::Stat;
use super::MetricsError;

/// One part of a nested key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    Str(String),
    Int(i64),
}

impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Str(s) => write!(f, "'{}'", s.replace('\'', "\\'")),
            KeyPart::Int(i) => write!(f, "{i}"),
        }
    }
}

/// Renders a key path as Python would print the tuple.
#[must_use]
pub fn key_repr(path: &[KeyPart]) -> String {
    let parts: Vec<String> = path.iter().map(ToString::to_string).collect();
    if parts.len() == 1 {
        format!("({},)", parts[0])
    } else {
        format!("({})", parts.join(", "))
    }
}

/// A node of the key tree: a stat (its slab slot) or a branch of children.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Leaf(usize),
    Branch(Vec<(KeyPart, Node)>),
}

/// What a path leads to.
#[derive(Debug)]
pub enum Found<'a> {
    Leaf(usize),
    Branch(&'a [(KeyPart, Node)]),
    Missing,
}

/// The keyed stats of one logger.
#[derive(Debug, Clone)]
pub struct Store<T> {
    pub root: Vec<(KeyPart, Node)>,
    slots: Vec<Option<Stat<T>>>,
    free: Vec<usize>,
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Store { root: Vec::new(), slots: Vec::new(), free: Vec::new() }
    }
}

fn child<'a>(branch: &'a [(KeyPart, Node)], k: &KeyPart) -> Option<&'a Node> {
    branch.iter().find(|(p, _)| p == k).map(|(_, n)| n)
}

impl<T> Store<T> {
    /// The node at `path` (the whole tree for an empty path).
    #[must_use]
    pub fn find(&self, path: &[KeyPart]) -> Found<'_> {
        let mut branch: &[(KeyPart, Node)] = &self.root;
        for (i, k) in path.iter().enumerate() {
            match child(branch, k) {
                None => return Found::Missing,
                Some(Node::Leaf(id)) => {
                    return if i + 1 == path.len() { Found::Leaf(*id) } else { Found::Missing };
                }
                Some(Node::Branch(b)) => branch = b,
            }
        }
        Found::Branch(branch)
    }

    /// The stat in `slot`.
    #[must_use]
    pub fn get(&self, slot: usize) -> Option<&Stat<T>> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Stat<T>> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Puts `stat` at `path` (replacing a stat there); returns its slot.
    ///
    /// A path through an existing stat, or onto a branch of other keys, is an error: a key
    /// is either a metric or a group of metrics.
    pub fn insert(&mut self, path: &[KeyPart], stat: Stat<T>) -> Result<usize, MetricsError> {
        if path.is_empty() {
            return Err(MetricsError::Value("a metric key must not be empty".into()));
        }
        let mut branch = &mut self.root;
        for (i, k) in path.iter().enumerate() {
            let last = i + 1 == path.len();
            let pos = if let Some(pos) = branch.iter().position(|(p, _)| p == k) {
                pos
            } else {
                branch.push((k.clone(), Node::Branch(Vec::new())));
                branch.len() - 1
            };
            let node = &mut branch[pos].1;
            match node {
                Node::Leaf(id) if last => {
                    let id = *id;
                    self.slots[id] = Some(stat);
                    return Ok(id);
                }
                Node::Leaf(_) => {
                    return Err(MetricsError::Value(format!(
                        "cannot log under key {}: {} already holds a metric",
                        key_repr(path),
                        key_repr(&path[..=i])
                    )))
                }
                Node::Branch(b) if last => {
                    if !b.is_empty() {
                        return Err(MetricsError::Value(format!(
                            "cannot log to key {}: it holds nested metrics",
                            key_repr(path)
                        )));
                    }
                    let id = if let Some(id) = self.free.pop() {
                        self.slots[id] = Some(stat);
                        id
                    } else {
                        self.slots.push(Some(stat));
                        self.slots.len() - 1
                    };
                    *node = Node::Leaf(id);
                    return Ok(id);
                }
                Node::Branch(b) => branch = b,
            }
        }
        // The loop returns at the last part of the (non-empty) path.
        Err(MetricsError::Value("a metric key must not be empty".into()))
    }

    /// Checks that `insert(path, ..)` would not fail on the tree's shape.
    pub fn check_insert(&self, path: &[KeyPart]) -> Result<(), MetricsError> {
        if path.is_empty() {
            return Err(MetricsError::Value("a metric key must not be empty".into()));
        }
        let mut branch: &[(KeyPart, Node)] = &self.root;
        for (i, k) in path.iter().enumerate() {
            match child(branch, k) {
                None => return Ok(()),
                Some(Node::Leaf(_)) if i + 1 == path.len() => return Ok(()),
                Some(Node::Leaf(_)) => {
                    return Err(MetricsError::Value(format!(
                        "cannot log under key {}: {} already holds a metric",
                        key_repr(path),
                        key_repr(&path[..=i])
                    )))
                }
                Some(Node::Branch(b)) if i + 1 == path.len() && !b.is_empty() => {
                    return Err(MetricsError::Value(format!(
                        "cannot log to key {}: it holds nested metrics",
                        key_repr(path)
                    )))
                }
                Some(Node::Branch(b)) => branch = b,
            }
        }
        Ok(())
    }

    /// Removes the stat or group of stats at `path`; returns the removed stats.
    pub fn remove(&mut self, path: &[KeyPart]) -> Result<Vec<Stat<T>>, MetricsError> {
        let missing = || MetricsError::Key(format!("key {} not found", key_repr(path)));
        let Some((last, prefix)) = path.split_last() else { return Err(missing()) };
        let mut branch = &mut self.root;
        for k in prefix {
            match branch.iter_mut().find(|(p, _)| p == k) {
                Some((_, Node::Branch(b))) => branch = b,
                _ => return Err(missing()),
            }
        }
        let pos = branch.iter().position(|(p, _)| p == last).ok_or_else(missing)?;
        let (_, node) = branch.remove(pos);
        let mut removed = Vec::new();
        self.free_node(node, &mut removed);
        Ok(removed)
    }

    fn free_node(&mut self, node: Node, out: &mut Vec<Stat<T>>) {
        match node {
            Node::Leaf(id) => {
                if let Some(s) = self.slots[id].take() {
                    out.push(s);
                }
                self.free.push(id);
            }
            Node::Branch(children) => {
                for (_, n) in children {
                    self.free_node(n, out);
                }
            }
        }
    }

    /// Removes everything; returns the removed stats.
    pub fn clear(&mut self) -> Vec<Stat<T>> {
        self.root.clear();
        self.free.clear();
        std::mem::take(&mut self.slots).into_iter().flatten().collect()
    }

    /// Every (path, slot) under `node`, depth first in insertion order.
    pub fn leaves(
        branch: &[(KeyPart, Node)],
        prefix: &mut Vec<KeyPart>,
        out: &mut Vec<(Vec<KeyPart>, usize)>,
    ) {
        for (k, n) in branch {
            prefix.push(k.clone());
            match n {
                Node::Leaf(id) => out.push((prefix.clone(), *id)),
                Node::Branch(b) => Self::leaves(b, prefix, out),
            }
            prefix.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Config, Reduce};

    fn s() -> Stat<i32> {
        Stat::new(Config::new(Reduce::Sum), false, true, 0.0)
    }

    fn k(parts: &[&str]) -> Vec<KeyPart> {
        parts.iter().map(|p| KeyPart::Str((*p).to_string())).collect()
    }

    #[test]
    fn insert_find_remove() {
        let mut st = Store::default();
        let a = st.insert(&k(&["a"]), s()).unwrap();
        let b = st.insert(&k(&["g", "b"]), s()).unwrap();
        st.insert(&[KeyPart::Str("g".into()), KeyPart::Int(3)], s()).unwrap();
        assert!(matches!(st.find(&k(&["a"])), Found::Leaf(i) if i == a));
        assert!(matches!(st.find(&k(&["g", "b"])), Found::Leaf(i) if i == b));
        assert!(matches!(st.find(&k(&["g"])), Found::Branch(br) if br.len() == 2));
        assert!(matches!(st.find(&k(&["a", "x"])), Found::Missing));
        assert!(st.check_insert(&k(&["a", "x"])).is_err());
        assert!(st.insert(&k(&["a", "x"]), s()).is_err());
        assert!(st.check_insert(&k(&["g"])).is_err());
        assert!(st.insert(&k(&["g"]), s()).is_err());
        assert!(st.check_insert(&k(&["g", "new"])).is_ok() && st.check_insert(&k(&["a"])).is_ok());
        assert_eq!(st.remove(&k(&["g"])).unwrap().len(), 2);
        assert!(matches!(st.remove(&k(&["g"])), Err(MetricsError::Key(_))));
        // Freed slots are reused.
        let c = st.insert(&k(&["c"]), s()).unwrap();
        assert!(c == b || c == b + 1);
        let mut out = Vec::new();
        Store::<i32>::leaves(&st.root, &mut Vec::new(), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(st.clear().len(), 2);
        assert!(matches!(st.find(&k(&["a"])), Found::Missing));
    }
}
