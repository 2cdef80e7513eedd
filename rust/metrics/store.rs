//! Nested keys mapped to stats.
//!
//! Keys are paths of string or integer parts (RLlib's nested dict keys: metric names,
//! module ids, agent ids). The tree keeps insertion order, as a nested dict does; stats
//! live in a slab so a binding can cache a key's slot and push without walking the tree.

use std::collections::HashMap;

use super::config::Config;
use super::snapshot::Snapshot;
use super::stat::{Payload, Stat, Throughput};
use super::state::StatState;
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

/// Checks a key path: a metric key names at least one part.
pub fn check_key(path: &[KeyPart]) -> Result<(), MetricsError> {
    if path.is_empty() {
        return Err(MetricsError::Value("a metric key must not be empty".into()));
    }
    Ok(())
}

/// A value per stat under a key, nested as the keys are (in insertion order): one value for
/// a stat, a branch for a group.
#[derive(Debug, Clone, PartialEq)]
pub enum Tree<R> {
    Leaf(R),
    Branch(Vec<(KeyPart, Tree<R>)>),
}

/// Drops the stats without a throughput and the groups left empty, and names each
/// throughput after its stat with `_throughput` added (RLlib's throughput keys).
fn named_throughputs(branch: Vec<(KeyPart, Tree<Option<Throughput>>)>) -> Vec<(KeyPart, Tree<Throughput>)> {
    let mut out = Vec::new();
    for (k, t) in branch {
        match t {
            Tree::Leaf(None) => {}
            Tree::Leaf(Some(tp)) => out.push((
                KeyPart::Str(match k {
                    KeyPart::Str(s) => format!("{s}_throughput"),
                    KeyPart::Int(i) => format!("{i}_throughput"),
                }),
                Tree::Leaf(tp),
            )),
            Tree::Branch(b) => {
                let b = named_throughputs(b);
                if !b.is_empty() {
                    out.push((k, Tree::Branch(b)));
                }
            }
        }
    }
    out
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
        check_key(path)?;
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
        check_key(path)?;
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

    /// The slot of the stat at `path`; when there is none, `make()` is inserted there (and
    /// called only once the key is known to fit the tree).
    pub fn slot_or_insert<E: From<MetricsError>>(
        &mut self,
        path: &[KeyPart],
        make: impl FnOnce() -> Result<Stat<T>, E>,
    ) -> Result<usize, E> {
        if let Found::Leaf(id) = self.find(path) {
            return Ok(id);
        }
        self.check_insert(path)?;
        Ok(self.insert(path, make()?)?)
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

    /// `f` of the stat at `path`, or of every stat under it as a tree (the whole store for
    /// an empty path; groups emptied by deletes stay as empty branches); `None` if there
    /// is nothing at `path`.
    pub fn map<R, E>(
        &mut self,
        path: &[KeyPart],
        mut f: impl FnMut(&mut Stat<T>) -> Result<R, E>,
    ) -> Result<Option<Tree<R>>, E> {
        let node = match self.find(path) {
            Found::Missing => return Ok(None),
            Found::Leaf(id) => Node::Leaf(id),
            // The keys are cloned so the stats can be borrowed mutably.
            Found::Branch(b) => Node::Branch(b.to_vec()),
        };
        self.map_node(&node, &mut f)
    }

    fn map_node<R, E>(
        &mut self,
        node: &Node,
        f: &mut impl FnMut(&mut Stat<T>) -> Result<R, E>,
    ) -> Result<Option<Tree<R>>, E> {
        Ok(match node {
            Node::Leaf(id) => match self.get_mut(*id) {
                Some(s) => Some(Tree::Leaf(f(s)?)),
                None => None,
            },
            Node::Branch(children) => {
                let mut out = Vec::with_capacity(children.len());
                for (k, n) in children {
                    if let Some(t) = self.map_node(n, f)? {
                        out.push((k.clone(), t));
                    }
                }
                Some(Tree::Branch(out))
            }
        })
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

/// The incoming reductions for one key of `Store::aggregate`, with the first one's configuration.
type Group<'a, T> = (Vec<KeyPart>, &'a Config, Vec<&'a Payload<T>>);

/// The operations that read or merge stats (item values are cloned).
impl<T: Clone> Store<T> {
    /// Pushes numbers into the stat in `slot` (deferred values reaching it; a freed slot
    /// takes none).
    pub fn push_numbers(&mut self, slot: usize, values: &[f64]) -> Result<(), MetricsError> {
        if let Some(stat) = self.get_mut(slot) {
            for v in values {
                stat.push(*v)?;
            }
        }
        Ok(())
    }

    /// The throughput(s) at `path` (the whole tree for an empty path): a stat's, or those of
    /// the stats under a group that track one, named by [`named_throughputs`]. `None` when
    /// there is nothing there or no stat under the group tracks one; a stat that tracks
    /// none is an error.
    pub fn throughputs(
        &mut self,
        path: &[KeyPart],
        now: f64,
    ) -> Result<Option<Tree<Throughput>>, MetricsError> {
        match self.map(path, |s| Ok::<_, MetricsError>(s.throughput(now)))? {
            None => Ok(None),
            Some(Tree::Leaf(Some(tp))) => Ok(Some(Tree::Leaf(tp))),
            Some(Tree::Leaf(None)) => Err(MetricsError::Value(format!(
                "key {} does not track a throughput (log it with with_throughput=True)",
                key_repr(path)
            ))),
            Some(Tree::Branch(b)) => {
                let named = named_throughputs(b);
                Ok((!named.is_empty()).then_some(Tree::Branch(named)))
            }
        }
    }

    /// Every stat's path and checkpoint state, depth first in insertion order.
    #[must_use]
    pub fn states(&self) -> Vec<(Vec<KeyPart>, StatState<T>)> {
        let mut leaves = Vec::new();
        Self::leaves(&self.root, &mut Vec::new(), &mut leaves);
        leaves.into_iter().filter_map(|(p, id)| Some((p, self.get(id)?.to_state()))).collect()
    }

    /// A store restored from `states` (see [`Store::states`]); `now` restarts the
    /// throughput clocks.
    pub fn from_states(
        states: Vec<(Vec<KeyPart>, StatState<T>)>,
        now: f64,
    ) -> Result<Store<T>, MetricsError> {
        let mut store = Store::default();
        for (path, st) in states {
            store.insert(&path, Stat::from_state(st, now)?)?;
        }
        Ok(store)
    }

    /// Merges the snapshots of n loggers' `reduce()` (each under its key path) into
    /// aggregators, one per key, created with the key's first snapshot's configuration
    /// where missing (`is_root`, throughput clock from `created`).
    ///
    /// Everything is checked before anything is merged, so a failing aggregate leaves the
    /// store as it was; errors name the key.
    pub fn aggregate(
        &mut self,
        snapshots: Vec<(Vec<KeyPart>, &Snapshot<T>)>,
        is_root: bool,
        created: f64,
    ) -> Result<(), MetricsError> {
        // Grouped by key, in first-seen order.
        let mut index: HashMap<Vec<KeyPart>, usize> = HashMap::new();
        let mut groups: Vec<Group<'_, T>> = Vec::new();
        for (path, snap) in snapshots {
            if let Some(&i) = index.get(&path) {
                groups[i].2.push(&snap.payload);
            } else {
                index.insert(path.clone(), groups.len());
                groups.push((path, &snap.config, vec![&snap.payload]));
            }
        }
        let with_key = |path: &[KeyPart], e: MetricsError| match e {
            MetricsError::Value(m) => MetricsError::Value(format!("key {}: {m}", key_repr(path))),
            other @ (MetricsError::Key(_) | MetricsError::Type(_)) => other,
        };
        for (path, config, incoming) in &groups {
            let checked = match self.find(path) {
                Found::Leaf(id) => self.get(id).map_or(Ok(()), |s| s.check_merge(incoming)),
                _ => self.check_insert(path).and_then(|()| Stat::check_payloads(config.reduce, incoming)),
            };
            checked.map_err(|e| with_key(path, e))?;
        }
        for (path, config, incoming) in groups {
            let slot = if let Found::Leaf(id) = self.find(&path) {
                id
            } else {
                let stat = Stat::aggregator(config.clone(), is_root, created);
                self.insert(&path, stat).map_err(|e| with_key(&path, e))?
            };
            if let Some(stat) = self.get_mut(slot) {
                stat.merge(&incoming).map_err(|e| with_key(&path, e))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Config, Reduce, Value};

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

    fn sum_with_throughput(now: f64) -> Stat<i32> {
        Stat::new(Config { with_throughput: true, ..Config::new(Reduce::Sum) }, false, true, now)
    }

    #[test]
    fn keys_must_not_be_empty() {
        assert!(check_key(&k(&["a"])).is_ok());
        let e = MetricsError::Value("a metric key must not be empty".into());
        assert_eq!(check_key(&[]), Err(e.clone()));
        assert_eq!(Store::<i32>::default().check_insert(&[]), Err(e));
    }

    #[test]
    fn slot_or_insert_makes_only_fitting_new_stats() {
        let mut st = Store::default();
        let a = st.slot_or_insert(&k(&["a"]), || Ok::<_, MetricsError>(s())).unwrap();
        let again =
            st.slot_or_insert(&k(&["a"]), || -> Result<Stat<i32>, MetricsError> { panic!("made twice") });
        assert_eq!(again, Ok(a));
        for bad in [k(&["a", "b"]), Vec::new()] {
            let r = st
                .slot_or_insert(&bad, || -> Result<Stat<i32>, MetricsError> { panic!("made for a bad key") });
            assert!(matches!(r, Err(MetricsError::Value(_))));
        }
        let failed = st.slot_or_insert(&k(&["c"]), || Err(MetricsError::Value("bad options".into())));
        assert_eq!(failed, Err(MetricsError::Value("bad options".into())));
        assert!(matches!(st.find(&k(&["c"])), Found::Missing));
    }

    #[test]
    fn push_numbers_reaches_live_slots_only() {
        let mut st = Store::default();
        let a = st.insert(&k(&["a"]), s()).unwrap();
        st.push_numbers(a, &[1.0, 2.0]).unwrap();
        st.push_numbers(a + 7, &[1.0]).unwrap();
        assert_eq!(st.get_mut(a).unwrap().reduce(0.0), crate::metrics::Payload::Series(3.0));
    }

    #[test]
    fn throughputs_of_a_stat_and_of_a_group() {
        let mut st = Store::default();
        let a = st.insert(&k(&["g", "a"]), sum_with_throughput(0.0)).unwrap();
        st.insert(&[KeyPart::Str("g".into()), KeyPart::Int(1)], sum_with_throughput(0.0)).unwrap();
        st.insert(&k(&["g", "plain"]), s()).unwrap();
        st.insert(&k(&["other", "plain"]), s()).unwrap();
        st.get_mut(a).unwrap().push(8.0).unwrap();
        assert_eq!(st.throughputs(&k(&["g", "a"]), 2.0), Ok(Some(Tree::Leaf(Throughput::Sum(4.0)))));
        let nan = |t: &Tree<Throughput>| matches!(t, Tree::Leaf(Throughput::Sum(v)) if v.is_nan());
        let Ok(Some(Tree::Branch(top))) = st.throughputs(&[], 2.0) else { panic!() };
        assert_eq!(top.len(), 1, "groups without throughputs are left out");
        let (g, Tree::Branch(inner)) = &top[0] else { panic!() };
        assert_eq!(g, &KeyPart::Str("g".into()));
        assert_eq!(inner[0], (KeyPart::Str("a_throughput".into()), Tree::Leaf(Throughput::Sum(4.0))));
        assert!(inner[1].0 == KeyPart::Str("1_throughput".into()) && nan(&inner[1].1));
        assert_eq!(inner.len(), 2);
        let e = st.throughputs(&k(&["g", "plain"]), 2.0).unwrap_err();
        assert!(e.to_string().starts_with("key ('g', 'plain') does not track a throughput"));
        assert_eq!(st.throughputs(&k(&["nope"]), 2.0), Ok(None));
        assert_eq!(st.throughputs(&k(&["other"]), 2.0), Ok(None));
    }

    #[test]
    fn map_mirrors_the_key_tree() {
        let mut st = Store::default();
        st.insert(&k(&["a"]), s()).unwrap();
        st.insert(&k(&["g", "b"]), s()).unwrap();
        st.insert(&k(&["g", "c"]), s()).unwrap();
        st.insert(&k(&["e", "x"]), s()).unwrap();
        st.remove(&k(&["e", "x"])).unwrap();
        let kind = |s: &mut Stat<i32>| Ok::<_, MetricsError>(s.reduce_kind());
        let leaf = || Tree::Leaf(Reduce::Sum);
        assert_eq!(st.map(&k(&["a"]), kind), Ok(Some(leaf())));
        assert_eq!(st.map(&k(&["zz"]), kind), Ok(None));
        let str_key = |s: &str| KeyPart::Str(s.into());
        let g = Tree::Branch(vec![(str_key("b"), leaf()), (str_key("c"), leaf())]);
        assert_eq!(st.map(&k(&["g"]), kind), Ok(Some(g.clone())));
        let all = Tree::Branch(vec![
            (str_key("a"), leaf()),
            (str_key("g"), g),
            (str_key("e"), Tree::Branch(vec![])),
        ]);
        assert_eq!(st.map(&[], kind), Ok(Some(all)));
        let failing = st.map(&[], |_| Err::<(), _>(MetricsError::Key("stop".into())));
        assert_eq!(failing, Err(MetricsError::Key("stop".into())));
    }

    #[test]
    fn states_round_trip() {
        let mut st = Store::default();
        let a = st.insert(&k(&["g", "a"]), s()).unwrap();
        st.insert(&k(&["b"]), Stat::new(Config::new(Reduce::Item), false, true, 0.0)).unwrap();
        st.get_mut(a).unwrap().push_value(Value::Number(2.0)).unwrap();
        let states = st.states();
        assert_eq!(
            states.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
            vec![k(&["g", "a"]), k(&["b"])]
        );
        let mut back = Store::from_states(states.clone(), 5.0).unwrap();
        // Debug output, since NaN (an item stat's running value) is not equal to itself.
        assert_eq!(format!("{:?}", back.states()), format!("{states:?}"));
        let Found::Leaf(id) = back.find(&k(&["g", "a"])) else { panic!() };
        assert_eq!(back.get_mut(id).unwrap().reduce(0.0), crate::metrics::Payload::Series(2.0));
        let clash = vec![states[0].clone(), (k(&["g", "a", "x"]), states[1].1.clone())];
        assert!(Store::from_states(clash, 0.0).is_err());
    }

    #[test]
    fn aggregate_groups_by_key_and_is_all_or_nothing() {
        use crate::metrics::{Payload, Snapshot};
        let snap = |reduce: Reduce, payload: Payload<i32>| Snapshot {
            config: Config::new(reduce),
            is_root: false,
            is_leaf: true,
            payload,
        };
        let (one, two) = (snap(Reduce::Sum, Payload::Series(1.0)), snap(Reduce::Sum, Payload::Series(2.0)));
        let mut st = Store::default();
        st.aggregate(vec![(k(&["a"]), &one), (k(&["g", "b"]), &two), (k(&["a"]), &two)], true, 0.0).unwrap();
        let Found::Leaf(a) = st.find(&k(&["a"])) else { panic!() };
        assert!(st.get(a).is_some_and(|s| s.is_root() && !s.is_leaf()));
        let before = st.states();
        let ema = snap(Reduce::Ema, Payload::Ema(1.0));
        let e = st.aggregate(vec![(k(&["g", "c"]), &one), (k(&["a"]), &ema)], true, 0.0).unwrap_err();
        assert!(e.to_string().starts_with("key ('a',): cannot merge a different kind"), "{e}");
        assert_eq!(st.states(), before, "nothing merged");
        st.insert(&k(&["leaf"]), s()).unwrap();
        let e = st.aggregate(vec![(k(&["leaf"]), &one)], true, 0.0).unwrap_err();
        assert!(e.to_string().contains("logged to directly"));
        let e = st.aggregate(vec![(k(&["a", "x"]), &one)], true, 0.0).unwrap_err();
        assert!(e.to_string().contains("already holds a metric"));
        assert_eq!(st.get_mut(a).unwrap().reduce(0.0), Payload::Series(3.0));
    }
}
