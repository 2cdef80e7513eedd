"""Episodes: the trajectories a runner records, with RLlib 2.60's API."""

from fastrollout.episodes.multi_agent_episode import MultiAgentEpisode
from fastrollout.episodes.single_agent_episode import SingleAgentEpisode

__all__ = ["MultiAgentEpisode", "SingleAgentEpisode"]
