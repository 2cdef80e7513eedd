//! The nesting of a field's items over their leaves: which leaf sits under which Dict key
//! and Tuple entry. Generic over the host's keys (Python objects in the binding).

/// A nested layout over a schema's leaves (`Leaf(i)`: the schema's leaf `i`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tree<K> {
    Leaf(usize),
    Dict(Vec<(K, Tree<K>)>),
    Tuple(Vec<Tree<K>>),
}

impl<K> Tree<K> {
    /// Whether both trees nest the same leaves the same way, with keys that `same_key`
    /// finds equal.
    pub fn same_as(&self, other: &Tree<K>, same_key: &impl Fn(&K, &K) -> bool) -> bool {
        match (self, other) {
            (Tree::Leaf(i), Tree::Leaf(j)) => i == j,
            (Tree::Dict(x), Tree::Dict(y)) => {
                x.len() == y.len()
                    && x.iter().zip(y).all(|((k, s), (l, t))| same_key(k, l) && s.same_as(t, same_key))
            }
            (Tree::Tuple(x), Tree::Tuple(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(s, t)| s.same_as(t, same_key))
            }
            _ => false,
        }
    }

    /// Rebuilds the nesting around per-leaf values: each leaf's value is taken from
    /// `leaves` (`missing()` if it is absent or was taken already), then `dict` and
    /// `tuple` make the containers from their entries' values, innermost first.
    pub fn nest<V, E>(
        &self,
        leaves: &mut [Option<V>],
        dict: &mut impl FnMut(Vec<(&K, V)>) -> Result<V, E>,
        tuple: &mut impl FnMut(Vec<V>) -> Result<V, E>,
        missing: &impl Fn() -> E,
    ) -> Result<V, E> {
        match self {
            Tree::Leaf(i) => leaves.get_mut(*i).and_then(Option::take).ok_or_else(missing),
            Tree::Dict(entries) => {
                let values = entries
                    .iter()
                    .map(|(k, sub)| Ok((k, sub.nest(leaves, dict, tuple, missing)?)))
                    .collect::<Result<Vec<_>, E>>()?;
                dict(values)
            }
            Tree::Tuple(entries) => {
                let values = entries
                    .iter()
                    .map(|sub| sub.nest(leaves, dict, tuple, missing))
                    .collect::<Result<_, E>>()?;
                tuple(values)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{"a": leaf 0, "b": (leaf 1, leaf 2)}`.
    fn nested() -> Tree<&'static str> {
        Tree::Dict(vec![("a", Tree::Leaf(0)), ("b", Tree::Tuple(vec![Tree::Leaf(1), Tree::Leaf(2)]))])
    }

    #[test]
    fn same_as_compares_structure_leaves_and_keys() {
        let eq = |a: &&str, b: &&str| a == b;
        assert!(nested().same_as(&nested(), &eq));
        let other_key =
            Tree::Dict(vec![("a", Tree::Leaf(0)), ("c", Tree::Tuple(vec![Tree::Leaf(1), Tree::Leaf(2)]))]);
        assert!(!nested().same_as(&other_key, &eq));
        let other_leaf =
            Tree::Dict(vec![("a", Tree::Leaf(0)), ("b", Tree::Tuple(vec![Tree::Leaf(2), Tree::Leaf(1)]))]);
        assert!(!nested().same_as(&other_leaf, &eq));
        assert!(!Tree::<&str>::Tuple(vec![Tree::Leaf(0)]).same_as(&Tree::Leaf(0), &eq));
        assert!(!Tree::<&str>::Tuple(vec![]).same_as(&Tree::Tuple(vec![Tree::Leaf(0)]), &eq));
        assert!(!nested().same_as(&nested(), &|_, _| false), "keys decide");
    }

    #[test]
    fn nest_rebuilds_containers_and_takes_each_leaf_once() {
        let mut dict = |e: Vec<(&&str, String)>| -> Result<String, String> {
            Ok(format!("{{{}}}", e.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")))
        };
        let mut tuple = |e: Vec<String>| -> Result<String, String> { Ok(format!("({})", e.join(", "))) };
        let leaf_values = &mut [Some("1".to_string()), Some("2".into()), Some("3".into())];
        let missing = || "missing".to_string();
        assert_eq!(
            nested().nest(leaf_values, &mut dict, &mut tuple, &missing),
            Ok("{a: 1, b: (2, 3)}".into())
        );
        assert_eq!(nested().nest(leaf_values, &mut dict, &mut tuple, &missing), Err("missing".into()));
        let twice: Tree<&str> = Tree::Tuple(vec![Tree::Leaf(0), Tree::Leaf(0)]);
        assert_eq!(
            twice.nest(&mut [Some("x".into())], &mut dict, &mut tuple, &missing),
            Err("missing".into())
        );
        assert_eq!(
            Tree::<&str>::Leaf(5).nest(&mut [None::<String>], &mut dict, &mut tuple, &missing),
            Err("missing".into())
        );
    }
}
