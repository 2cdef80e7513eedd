"""Column names of batches and episode data, as RLlib 2.60 spells them.

Connectors, modules and runners key their batches by these strings. They are RLlib's
strings on purpose: a module or connector written for RLlib reads the same keys here.
"""

from __future__ import annotations

__all__ = ["Columns"]


class Columns:
    """String keys of the data that flows between episodes, connectors and modules."""

    # Recorded per step in episodes.
    OBS = "obs"
    INFOS = "infos"
    ACTIONS = "actions"
    ACTIONS_FOR_ENV = "actions_for_env"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    NEXT_OBS = "new_obs"
    # Identity of a row in a train batch.
    EPS_ID = "eps_id"
    AGENT_ID = "agent_id"
    MODULE_ID = "module_id"
    T = "t"
    # Recurrent state.
    SEQ_LENS = "seq_lens"
    STATE_IN = "state_in"
    NEXT_STATE_IN = "next_state_in"
    STATE_OUT = "state_out"
    NEXT_STATE_OUT = "next_state_out"
    # Module outputs.
    EMBEDDINGS = "embeddings"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    ACTION_PROB = "action_prob"
    ACTION_LOGP = "action_logp"
    VF_PREDS = "vf_preds"
    # Learner-side postprocessing.
    VALUES_BOOTSTRAPPED = "values_bootstrapped"
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"
    INTRINSIC_REWARDS = "intrinsic_rewards"
    RETURNS_TO_GO = "returns_to_go"
    LOSS_MASK = "loss_mask"
