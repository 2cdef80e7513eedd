"""Env runners: step environments with a torch policy and return episodes.

RLlib 2.60's ``EnvRunner`` API, for single- and multi-agent environments, and
``EnvRunnerGroup``, a local runner plus runners in Ray actors.
"""

from fastrollout.runners.env_runner import EnvRunner
from fastrollout.runners.env_runner_group import EnvRunnerGroup
from fastrollout.runners.multi_agent_env_runner import MultiAgentEnvRunner
from fastrollout.runners.single_agent_env_runner import SingleAgentEnvRunner

__all__ = ["EnvRunner", "EnvRunnerGroup", "MultiAgentEnvRunner", "SingleAgentEnvRunner"]
