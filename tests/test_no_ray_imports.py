"""Using episodes never imports ray: RLlib's forms are produced only where RLlib is loaded."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import pickle, sys
import gymnasium as gym
import fastrollout as fr

episode = fr.SingleAgentEpisode(observation_space=gym.spaces.Box(-1, 1, (2,)))
episode.add_env_reset([0.0, 0.0])
episode.add_env_step([1.0, 1.0], 0, 1.0)
state = episode.get_state()
assert isinstance(state["_observation_space"], gym.spaces.Box)
back = fr.SingleAgentEpisode.from_state(state)
assert list(back.get_rewards()) == [1.0]
pickle.loads(pickle.dumps(episode))
list(episode.observations)
assert "ray" not in sys.modules, sorted(m for m in sys.modules if m.startswith("ray"))
"""


def test_episode_state_and_views_do_not_import_ray():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
