//! Multi-agent bookkeeping (RLlib 2.60 `MultiAgentEpisode` semantics): which env step each
//! agent step belongs to, and what an env step means for each agent.
//!
//! Agents act only on some env steps (turn-based games), join late and leave early. An
//! agent's action waits ("hangs") until its next observation arrives; rewards that arrive
//! while it waits add up, and rewards before its first observation are kept apart. The
//! agents' own data lives in single-agent episodes; this module keeps the env-step to
//! agent-step maps ([`StepMap`]), decides per agent what an env step records where
//! ([`plan_agent_step`]), and turns a whole env step into one plan checked before anything
//! is applied ([`plan_env_step`]), the plan of appending a chunk ([`plan_concat`]), and
//! the plans of a cut and a slice ([`plan_cut`], [`plan_slice`]; a simultaneous chunk's cut,
//! [`plan_simultaneous_cut`]). Which agents an env step mentions, and what it gives each,
//! is [`Mentions`]; when a reset may be recorded, [`check_reset`].

mod agent;
mod concat;
mod cut;
mod env_step;
mod mentions;
mod reset;
mod simultaneous;
mod step_map;

pub use agent::{plan_agent_step, AgentPlan, AgentStepError, AgentStepInput, Source};
pub use concat::{
    plan_concat, AgentConcat, BeginReward, ConcatAgent, ConcatBooks, ConcatEnd, ConcatInput, ConcatMap,
    ConcatPart, ConcatPlan,
};
pub use cut::{
    plan_cut, plan_slice, ActionSource, AgentCut, Counters, CutAgent, CutInput, CutPlan, HangingExtras,
    OutputKeys, RewardSum, SliceInput,
};
pub use env_step::{
    episode_ends, plan_env_step, plan_env_step_into, AgentOutcome, AgentStep, Books, EnvStep, EnvStepPlan,
    Hanging, MapWrite, Slot,
};
pub use mentions::{AgentIds, AgentVec, Mention, Mentions};
pub use reset::{check_reset, ResetError};
pub use simultaneous::{plan_simultaneous_cut, SimultaneousAgent, SimultaneousCut, SimultaneousInput};
pub use step_map::{CutPart, MapRead, StepMap};
