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


DICT_FORM_SCRIPT = """
import sys
sys.modules["ray"] = None  # any import of ray now fails
import gymnasium as gym
import numpy as np
import fastrollout as fr
from fastrollout.core.spaces import space_to_dict

obs = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,)), "b": gym.spaces.Discrete(3)})
act = gym.spaces.MultiDiscrete([2, 3])
episode = fr.SingleAgentEpisode(observation_space=obs, action_space=act)
episode.add_env_reset({"a": np.zeros(2, np.float32), "b": 1})
episode.add_env_step({"a": np.ones(2, np.float32), "b": 2}, np.array([1, 2]), 1.0)
state = episode.get_state()
# RLlib's form, as a state written where RLlib runs holds it.
state["_observation_space"] = space_to_dict(obs)
state["_action_space"] = space_to_dict(act)
assert isinstance(state["_observation_space"], dict)
back = fr.SingleAgentEpisode.from_state(state)
assert back.observation_space == obs and back.action_space == act
assert list(back.get_rewards()) == [1.0]
"""


def test_dict_form_state_loads_without_ray():
    done = subprocess.run(
        [sys.executable, "-c", DICT_FORM_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
