"""Env runners: step environments with a torch policy and return episodes.

RLlib 2.60's ``EnvRunner`` API, for single- and multi-agent environments.
"""

from fastrollout.runners.env_runner import EnvRunner
from fastrollout.runners.multi_agent_env_runner import MultiAgentEnvRunner
from fastrollout.runners.single_agent_env_runner import SingleAgentEnvRunner

__all__ = ["EnvRunner", "MultiAgentEnvRunner", "SingleAgentEnvRunner"]
