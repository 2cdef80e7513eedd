"""Environments: RLlib's ``MultiAgentEnv`` API, env specs and creation, checks, adapters.

- :class:`MultiAgentEnv` and :func:`make_multi_agent`, compatible with RLlib 2.60's;
- :class:`EnvContext`, the config dict env creators receive;
- :func:`register_env`, :func:`make_env_creator`, :func:`create_env`: every form of env
  spec (registered name, gymnasium id, env class, creator callable) made into envs;
- :func:`check_env`, the check run at creation unless ``disable_env_checking``;
- :class:`PettingZooEnv` and :class:`ParallelPettingZooEnv` adapters;
- :class:`ExternalEnv` and :class:`ExternalMultiAgentEnv`, simulators that run their own
  loop and ask for actions (RLlib 2.60's API);
- small test envs in :mod:`fastrollout.env.examples`.
"""

from fastrollout.env.check import EnvCheckError, check_env, space_mismatch
from fastrollout.env.env_context import EnvContext
from fastrollout.env.external_env import ExternalEnv, ExternalMultiAgentEnv
from fastrollout.env.multi_agent_env import MultiAgentEnv, make_multi_agent
from fastrollout.env.pettingzoo import ParallelPettingZooEnv, PettingZooEnv
from fastrollout.env.registry import (
    EnvCreator,
    create_env,
    get_registered_env,
    is_multi_agent_env,
    make_env_creator,
    register_env,
    registered_envs,
)

__all__ = [
    "EnvCheckError",
    "EnvContext",
    "EnvCreator",
    "ExternalEnv",
    "ExternalMultiAgentEnv",
    "MultiAgentEnv",
    "ParallelPettingZooEnv",
    "PettingZooEnv",
    "check_env",
    "create_env",
    "get_registered_env",
    "is_multi_agent_env",
    "make_env_creator",
    "make_multi_agent",
    "register_env",
    "registered_envs",
    "space_mismatch",
]
