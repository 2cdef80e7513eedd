//! The bookkeeping of a multi-agent runner's per-module inference batches: which module
//! each gathered row goes to, which sub-env and agent each module row came from, and how a
//! module's output columns go back to the sub-envs and agents.
//!
//! Generic over the host's agent ids (`A`), so the binding keeps its Python objects here
//! and `cargo test` needs none.

use std::sync::Arc;

use super::{scatter_plan, BatchError, EnvIndices, ModuleBatch};
use crate::schema::Schema;

/// Per-module batches of one gather, reused across gathers (their buffers keep their
/// capacity), with the agent ids of each gathered row.
#[derive(Clone, Debug)]
pub struct Batcher<A> {
    /// Module id and its batch, in the order the modules were given.
    modules: Vec<(String, ModuleBatch)>,
    /// Per row of the last gather: the agent id of each agent slot (a module batch's index
    /// map names `(row, slot)`).
    agents: Vec<Vec<A>>,
    /// The sub-env of each row of the last gather.
    envs: EnvIndices,
}

impl<A> Batcher<A> {
    /// A batcher for `modules` (module id, observation layout), with no gather yet.
    pub fn new(modules: impl IntoIterator<Item = (String, Arc<Schema>)>) -> Batcher<A> {
        let modules = modules.into_iter().map(|(id, schema)| (id, ModuleBatch::new(schema))).collect();
        Batcher { modules, agents: Vec::new(), envs: EnvIndices::all(0) }
    }

    /// The module ids, in the order given.
    pub fn module_ids(&self) -> impl Iterator<Item = &str> {
        self.modules.iter().map(|(id, _)| id.as_str())
    }

    /// The position of module `id`.
    #[must_use]
    pub fn module_index(&self, id: &str) -> Option<usize> {
        self.modules.iter().position(|(m, _)| m == id)
    }

    /// The batch of the module at `module` (a [`Self::module_index`]).
    #[must_use]
    pub fn batch(&self, module: usize) -> Option<&ModuleBatch> {
        self.modules.get(module).map(|(_, b)| b)
    }

    /// The modules with at least one row in the last gather: position, id and batch.
    pub fn gathered(&self) -> impl Iterator<Item = (usize, &str, &ModuleBatch)> {
        self.modules
            .iter()
            .enumerate()
            .filter(|(_, (_, b))| !b.is_empty())
            .map(|(m, (id, b))| (m, id.as_str(), b))
    }

    /// Starts a gather of one row per entry of `envs` (the caller checked its inputs
    /// against them): empties every batch and the rows' agents.
    pub fn begin(&mut self, envs: EnvIndices) {
        for (_, b) in &mut self.modules {
            b.clear();
        }
        self.agents.clear();
        self.agents.resize_with(envs.len(), Vec::new);
        self.envs = envs;
    }

    /// The rows of the last gather.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.agents.len()
    }

    /// The sub-env of row `row` of the last gather.
    #[must_use]
    pub fn env(&self, row: usize) -> usize {
        self.envs.env(row)
    }

    /// Appends `agent`'s observation `item` (one slice per leaf) of row `row` to the batch
    /// of the module at `module`. On error nothing changes.
    pub fn push<B: AsRef<[u8]>>(
        &mut self,
        row: usize,
        module: usize,
        agent: A,
        item: &[B],
    ) -> Result<(), BatchError> {
        // `let else`, not `ok_or`: an eager error would be dropped on every push (a call:
        // `BatchError` holds strings).
        let Some(agents) = self.agents.get_mut(row) else { return Err(BatchError::NoRow { row }) };
        let Some((_, batch)) = self.modules.get_mut(module) else { return Err(BatchError::StaleIndex) };
        batch.push(row, agents.len(), item)?;
        agents.push(agent);
        Ok(())
    }

    /// Where each row of a module's batch came from: `(sub-env, agent id)`.
    pub fn index_map(&self, module: usize) -> Result<Vec<(usize, &A)>, BatchError> {
        let batch = self.batch(module).ok_or(BatchError::StaleIndex)?;
        batch
            .index()
            .iter()
            .map(|&(row, slot)| {
                let agent = self.agents.get(row).and_then(|a| a.get(slot)).ok_or(BatchError::StaleIndex)?;
                Ok((self.envs.env(row), agent))
            })
            .collect()
    }

    /// The scatter plan of a module's outputs: per row of the last gather, the
    /// `(module batch row, agent id)` of each of its agents in the module's batch.
    #[must_use]
    pub fn plan(&self, module: usize) -> Vec<Vec<(usize, &A)>> {
        let Some(batch) = self.batch(module) else { return vec![Vec::new(); self.rows()] };
        scatter_plan(batch.index(), self.rows())
            .into_iter()
            .zip(&self.agents)
            .map(|(rows, agents)| {
                rows.into_iter().filter_map(|(r, slot)| Some((r, agents.get(slot)?))).collect()
            })
            .collect()
    }

    /// Checks that a module's output column `output` has `rows` rows, one per batch row.
    pub fn check_output(&self, module: usize, output: &str, rows: usize) -> Result<(), BatchError> {
        let Some((id, batch)) = self.modules.get(module) else { return Err(BatchError::StaleIndex) };
        if rows == batch.len() {
            return Ok(());
        }
        Err(BatchError::OutputRows {
            module: id.clone(),
            output: output.to_owned(),
            rows,
            batch: batch.len(),
        })
    }
}

/// What a module's output column gives each agent in a scatter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputRole {
    /// The actions the module chose (also the env's, unless a column gives those).
    Actions,
    /// The actions to send to the env.
    ActionsForEnv,
    /// An extra model output, in the agent's dict of them.
    Extra,
}

impl OutputRole {
    /// The role of output column `name`; `None` where the scatter skips it: the env's
    /// actions when they are the actions column itself (`same_as_actions`: the actions
    /// give them, one read per row instead of two), and extras handed over as rows of the
    /// module's arrays (`extras_as_rows`).
    #[must_use]
    pub fn of(
        name: &str,
        actions_key: &str,
        actions_for_env_key: &str,
        same_as_actions: bool,
        extras_as_rows: bool,
    ) -> Option<OutputRole> {
        let (actions, for_env) = (name == actions_key, name == actions_for_env_key);
        match () {
            () if for_env && same_as_actions => None,
            () if actions => Some(OutputRole::Actions),
            () if for_env => Some(OutputRole::ActionsForEnv),
            () if extras_as_rows => None,
            () => Some(OutputRole::Extra),
        }
    }

    /// Whether the actions column gives the env's actions too: unless a column of its
    /// own (role [`OutputRole::ActionsForEnv`]) does, whichever comes first.
    pub fn env_from_actions(roles: impl IntoIterator<Item = OutputRole>) -> bool {
        !roles.into_iter().any(|r| r == OutputRole::ActionsForEnv)
    }

    /// Whether a module's extra outputs can reach its agents as rows of its arrays, given
    /// each extra column's name and whether it has rows (`rowable`: an array with a row
    /// axis) and which names the constants given to every agent take (`is_constant`): every
    /// extra column must be rowable, and no constant may share a column's name (an agent's
    /// dict would then hold the constant there, which a row cannot give).
    ///
    /// # Errors
    /// The first error of `is_constant`.
    pub fn extras_as_rows<'a, E>(
        extras: impl IntoIterator<Item = (&'a str, bool)>,
        mut is_constant: impl FnMut(&str) -> Result<bool, E>,
    ) -> Result<bool, E> {
        for (name, rowable) in extras {
            if !rowable || is_constant(name)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{DType, Leaf};

    fn batcher() -> Batcher<&'static str> {
        let schema = Arc::new(Schema::new(vec![Leaf::new(DType::BOOL, vec![])]));
        Batcher::new([("even".to_owned(), schema.clone()), ("odd".to_owned(), schema)])
    }

    #[test]
    fn gathers_rows_per_module_and_maps_them_back_to_sub_envs_and_agents() {
        let mut b = batcher();
        assert_eq!(b.module_ids().collect::<Vec<_>>(), vec!["even", "odd"]);
        assert_eq!((b.module_index("odd"), b.module_index("nope")), (Some(1), None));
        // Rows for sub-envs 6 and 2 (a subset of 8): agents a0, a1 in one, b0 in the other.
        b.begin(EnvIndices::subset(&[6, 2], 8).unwrap());
        b.push(0, 0, "a0", &[[10u8]]).unwrap();
        b.push(0, 1, "a1", &[[11u8]]).unwrap();
        b.push(1, 0, "b0", &[[20u8]]).unwrap();
        assert_eq!(b.rows(), 2);
        assert_eq!(b.index_map(0).unwrap(), vec![(6, &"a0"), (2, &"b0")]);
        assert_eq!(b.index_map(1).unwrap(), vec![(6, &"a1")]);
        assert_eq!(b.batch(0).unwrap().leaf(0), &[10, 20]);
        assert_eq!(b.plan(0), vec![vec![(0, &"a0")], vec![(1, &"b0")]]);
        assert_eq!(b.plan(1), vec![vec![(0, &"a1")], vec![]]);
        // A new gather starts empty, and only modules with rows are gathered.
        b.begin(EnvIndices::all(3));
        b.push(2, 1, "c", &[[1u8]]).unwrap();
        assert_eq!(b.gathered().map(|(m, id, _)| (m, id)).collect::<Vec<_>>(), vec![(1, "odd")]);
        assert_eq!(b.index_map(1).unwrap(), vec![(2, &"c")]);
        assert!(b.index_map(0).unwrap().is_empty());
        assert_eq!(b.plan(1), vec![vec![], vec![], vec![(0, &"c")]]);
    }

    #[test]
    fn a_bad_push_changes_nothing() {
        let mut b = batcher();
        b.begin(EnvIndices::all(1));
        assert_eq!(
            b.push(0, 0, "a", &[[1u8, 2]]),
            Err(BatchError::ItemSize { leaf: 0, expected: 1, got: 2 })
        );
        assert_eq!(b.push(1, 0, "a", &[[1u8]]), Err(BatchError::NoRow { row: 1 }));
        assert_eq!(b.push(0, 5, "a", &[[1u8]]), Err(BatchError::StaleIndex));
        assert!(b.index_map(0).unwrap().is_empty());
        // The agent slot numbering was not advanced by the failed pushes.
        b.push(0, 0, "a", &[[1u8]]).unwrap();
        assert_eq!(b.plan(0), vec![vec![(0, &"a")]]);
        assert_eq!(b.index_map(7), Err(BatchError::StaleIndex));
    }

    #[test]
    fn output_columns_must_have_a_row_per_batch_row() {
        let mut b = batcher();
        b.begin(EnvIndices::all(2));
        b.push(0, 0, "a", &[[1u8]]).unwrap();
        b.push(1, 0, "b", &[[1u8]]).unwrap();
        assert!(b.check_output(0, "actions", 2).is_ok());
        let err = b.check_output(0, "vf", 3).unwrap_err();
        assert_eq!(err.to_string(), "module \"even\": output \"vf\" has 3 rows, the batch has 2");
    }

    #[test]
    fn output_roles() {
        let role = |name, same, rows| OutputRole::of(name, "actions", "actions_for_env", same, rows);
        assert_eq!(role("actions", false, false), Some(OutputRole::Actions));
        assert_eq!(role("actions_for_env", false, true), Some(OutputRole::ActionsForEnv));
        assert_eq!(role("actions_for_env", true, false), None, "read from the actions instead");
        assert_eq!(role("vf", false, false), Some(OutputRole::Extra));
        assert_eq!(role("vf", false, true), None, "handed over as rows");
        assert_eq!(role("actions", false, true), Some(OutputRole::Actions));
    }

    #[test]
    fn the_env_takes_the_actions_unless_a_column_gives_its_own() {
        use OutputRole::{Actions, ActionsForEnv, Extra};
        assert!(OutputRole::env_from_actions([Actions, Extra]));
        assert!(!OutputRole::env_from_actions([Actions, ActionsForEnv]));
        assert!(!OutputRole::env_from_actions([ActionsForEnv, Extra, Actions]), "in any order");
        // The env column that is the actions column itself has no role: the actions give it.
        let role = |name, same| OutputRole::of(name, "actions", "actions_for_env", same, false);
        let roles = [role("actions", true), role("actions_for_env", true)];
        assert!(OutputRole::env_from_actions(roles.into_iter().flatten()));
    }

    #[test]
    fn extras_go_as_rows_only_when_every_column_has_rows_and_no_constant_shadows_one() {
        let rows = |extras: &[(&'static str, bool)], constants: &[&str]| {
            OutputRole::extras_as_rows(extras.iter().copied(), |n| Ok::<_, ()>(constants.contains(&n)))
                .unwrap()
        };
        assert!(rows(&[("vf", true), ("logp", true)], &["weights_seq_no"]));
        assert!(rows(&[], &["weights_seq_no"]), "no extras: nothing to refuse");
        assert!(!rows(&[("vf", true), ("logp", false)], &[]), "a column without rows");
        assert!(!rows(&[("vf", true)], &["vf"]), "a constant with a column's name");
        let err = OutputRole::extras_as_rows([("vf", true)], |_| Err("lookup failed"));
        assert_eq!(err, Err("lookup failed"));
    }
}
