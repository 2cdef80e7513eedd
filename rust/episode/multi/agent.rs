//! What one env step means for one agent (RLlib 2.60 `MultiAgentEpisode` rules).

use std::fmt;

/// What one env step holds for one agent, and the agent's state before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)] // one flag per dict the env step may mention the agent in
pub struct AgentStepInput {
    pub has_observation: bool,
    pub has_action: bool,
    /// The agent is a key of the step's rewards dict.
    pub has_reward: bool,
    /// Any of observation, action, reward, infos, extra model outputs is given (not None).
    pub has_any_data: bool,
    pub terminated: bool,
    pub truncated: bool,
    /// The agent has an episode (it observed before).
    pub has_episode: bool,
    pub episode_done: bool,
    /// The agent has a step map (it was seen before, possibly without an episode).
    pub has_step_map: bool,
    pub has_hanging_action: bool,
}

/// Where a recorded step's action, observation, reward and extra outputs come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// This env step's value.
    Given,
    /// The agent's hanging value (popped).
    Hanging,
    /// The agent's last recorded observation/infos (an agent terminated right after
    /// acting gets no new observation).
    Last,
}

/// What to do for one agent at one env step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentPlan {
    /// Record a step in the agent's episode. The reward is this step's plus, with
    /// `add_hanging_reward`, the agent's hanging reward.
    Step { observation: Source, action: Source, extra_model_outputs: Source, add_hanging_reward: bool },
    /// The agent's first observation: it joins at this env step (reset its episode,
    /// skips in its step map for the env steps before); the reward counts as "before
    /// its first observation".
    Join,
    /// The agent acted but observes later: its action, extra outputs and reward hang.
    Hang,
    /// A reward for an agent without an observation: added to its hanging reward,
    /// `begin` (before its first observation) or at the end (after its last).
    AddReward { begin: bool },
    /// The agent is done with nothing to record: drop its hanging data.
    Drop,
}

/// Why an env step cannot be recorded for an agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentStepError {
    /// Data for an agent whose episode is done.
    AlreadyDone,
    /// An observation and an action without a reward.
    NoReward,
    /// Truncated right after acting, without a last observation to bootstrap from.
    TruncatedWithoutObservation,
    /// Acted again while its previous action still waits for an observation.
    ActedWhileHanging,
    /// An observation without an action from an agent that already has a step map
    /// (it observed before and never acted).
    ObservedWithoutActing,
    /// An action from an agent that never observed (it was not asked to act).
    NotAskedToAct,
}

impl fmt::Display for AgentStepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AgentStepError::AlreadyDone => "is already done but received data",
            AgentStepError::NoReward => "acted and observed but received no reward",
            AgentStepError::TruncatedWithoutObservation => {
                "acted and was truncated without a last observation (needed to bootstrap its value)"
            }
            AgentStepError::ActedWhileHanging => {
                "acted again before observing the result of its previous action"
            }
            AgentStepError::ObservedWithoutActing => {
                "observed again without having acted on its previous observation"
            }
            AgentStepError::NotAskedToAct => {
                "sent an action but was not asked to act (it has no observation to act on)"
            }
        })
    }
}

impl std::error::Error for AgentStepError {}

/// Decides what one env step means for one agent (RLlib 2.60's rules).
pub fn plan_agent_step(s: &AgentStepInput) -> Result<AgentPlan, AgentStepError> {
    if s.episode_done && s.has_any_data {
        return Err(AgentStepError::AlreadyDone);
    }
    if s.has_action && !s.has_episode {
        return Err(AgentStepError::NotAskedToAct);
    }
    let done = s.terminated || s.truncated;
    Ok(match (s.has_observation, s.has_action) {
        (true, true) => {
            if !s.has_reward {
                return Err(AgentStepError::NoReward);
            }
            AgentPlan::Step {
                observation: Source::Given,
                action: Source::Given,
                extra_model_outputs: Source::Given,
                add_hanging_reward: false,
            }
        }
        (true, false) => {
            if s.has_hanging_action {
                AgentPlan::Step {
                    observation: Source::Given,
                    action: Source::Hanging,
                    extra_model_outputs: Source::Hanging,
                    add_hanging_reward: true,
                }
            } else if done {
                AgentPlan::Drop
            } else if s.has_step_map {
                return Err(AgentStepError::ObservedWithoutActing);
            } else {
                AgentPlan::Join
            }
        }
        (false, true) => {
            if s.truncated {
                return Err(AgentStepError::TruncatedWithoutObservation);
            }
            if s.terminated {
                AgentPlan::Step {
                    observation: Source::Last,
                    action: Source::Given,
                    extra_model_outputs: Source::Given,
                    add_hanging_reward: false,
                }
            } else if s.has_hanging_action {
                return Err(AgentStepError::ActedWhileHanging);
            } else {
                AgentPlan::Hang
            }
        }
        (false, false) => {
            if done {
                if !s.has_hanging_action {
                    AgentPlan::Drop
                } else if s.truncated {
                    return Err(AgentStepError::TruncatedWithoutObservation);
                } else {
                    AgentPlan::Step {
                        observation: Source::Last,
                        action: Source::Hanging,
                        extra_model_outputs: Source::Hanging,
                        add_hanging_reward: true,
                    }
                }
            } else {
                AgentPlan::AddReward { begin: !s.has_episode }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> AgentStepInput {
        AgentStepInput {
            has_episode: true,
            has_step_map: true,
            has_any_data: true,
            ..AgentStepInput::default()
        }
    }

    #[test]
    fn observed_and_acted_is_a_step_and_needs_a_reward() {
        let s = AgentStepInput { has_observation: true, has_action: true, has_reward: true, ..input() };
        assert!(matches!(plan_agent_step(&s), Ok(AgentPlan::Step { action: Source::Given, .. })));
        let s = AgentStepInput { has_reward: false, ..s };
        assert_eq!(plan_agent_step(&s), Err(AgentStepError::NoReward));
    }

    #[test]
    fn turn_based_actions_hang_until_the_next_observation() {
        let acted = AgentStepInput { has_action: true, ..input() };
        assert_eq!(plan_agent_step(&acted), Ok(AgentPlan::Hang));
        let again = AgentStepInput { has_hanging_action: true, ..acted };
        assert_eq!(plan_agent_step(&again), Err(AgentStepError::ActedWhileHanging));
        let observes = AgentStepInput { has_observation: true, has_hanging_action: true, ..input() };
        assert_eq!(
            plan_agent_step(&observes),
            Ok(AgentPlan::Step {
                observation: Source::Given,
                action: Source::Hanging,
                extra_model_outputs: Source::Hanging,
                add_hanging_reward: true
            })
        );
    }

    #[test]
    fn rewards_without_observation_are_kept_begin_or_end() {
        let waiting = AgentStepInput { has_reward: true, ..input() };
        assert_eq!(plan_agent_step(&waiting), Ok(AgentPlan::AddReward { begin: false }));
        let before_first = AgentStepInput { has_episode: false, has_step_map: false, ..waiting };
        assert_eq!(plan_agent_step(&before_first), Ok(AgentPlan::AddReward { begin: true }));
    }

    #[test]
    fn joining_and_leaving() {
        let joins =
            AgentStepInput { has_observation: true, has_episode: false, has_step_map: false, ..input() };
        assert_eq!(plan_agent_step(&joins), Ok(AgentPlan::Join));
        let observed_twice = AgentStepInput { has_step_map: true, ..joins };
        assert_eq!(plan_agent_step(&observed_twice), Err(AgentStepError::ObservedWithoutActing));
        let leaves = AgentStepInput { terminated: true, has_any_data: false, ..input() };
        assert_eq!(plan_agent_step(&leaves), Ok(AgentPlan::Drop));
        let leaves_after_acting = AgentStepInput { has_hanging_action: true, ..leaves };
        assert!(matches!(
            plan_agent_step(&leaves_after_acting),
            Ok(AgentPlan::Step { observation: Source::Last, action: Source::Hanging, .. })
        ));
        let truncated_after_acting =
            AgentStepInput { terminated: false, truncated: true, ..leaves_after_acting };
        assert_eq!(
            plan_agent_step(&truncated_after_acting),
            Err(AgentStepError::TruncatedWithoutObservation)
        );
        let done = AgentStepInput { episode_done: true, ..input() };
        assert_eq!(plan_agent_step(&done), Err(AgentStepError::AlreadyDone));
        let stranger = AgentStepInput { has_action: true, has_episode: false, ..input() };
        assert_eq!(plan_agent_step(&stranger), Err(AgentStepError::NotAskedToAct));
    }
}
