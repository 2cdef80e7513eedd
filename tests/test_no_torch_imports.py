"""Episodes, metrics and the config work in a process where torch cannot be imported.

torch loads only where a module, runner or learner needs it; the package's runner names
load on first use.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# Refuses every import of torch before fastrollout is imported.
NO_TORCH = """
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked in this test ({name})")
        return None

sys.meta_path.insert(0, _NoTorch())
"""

EPISODES_AND_METRICS = """
import gymnasium as gym
import numpy as np

import fastrollout as fr
from fastrollout import MetricsLogger, MultiAgentEpisode, SingleAgentEpisode

box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
episode = SingleAgentEpisode(observation_space=box, action_space=gym.spaces.Discrete(2))
episode.add_env_reset(np.zeros(2, np.float32))
for t in range(4):
    episode.add_env_step(np.full(2, 0.1 * t, np.float32), t % 2, 1.0)
successor = episode.cut(len_lookback_buffer=1)
successor.add_env_step(np.ones(2, np.float32), 1, 2.0, terminated=True)
episode.to_numpy()
successor.to_numpy()
assert list(episode.get_rewards()) == [1.0] * 4
assert list(successor.get_rewards()) == [2.0]
assert SingleAgentEpisode.from_state(successor.get_state()).get_return() == 2.0

multi = MultiAgentEpisode()
multi.add_env_reset(observations={"a": np.zeros(2), "b": np.zeros(2)})
multi.add_env_step(
    observations={"a": np.ones(2), "b": np.ones(2)},
    actions={"a": 0, "b": 1},
    rewards={"a": 1.0, "b": 0.5},
)
multi_successor = multi.cut()
multi.to_numpy()
assert multi.get_return() == 1.5
assert multi_successor.env_steps() == 0

logger = MetricsLogger()
for value in (1.0, 2.0, 3.0):
    logger.log_value("episode_return_mean", value, reduce="mean", window=10)
    logger.log_value(("counts", "steps"), 1, reduce="sum")
results = logger.reduce()
assert results["episode_return_mean"] == 2.0, results
assert results["counts"]["steps"] == 3, results

config = fr.RunnerConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2)
config.validate()
fr.register_env("no_torch_env", lambda cfg: gym.make("CartPole-v1"))

assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
assert "fastrollout.runners" not in sys.modules
print("ok")
"""


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )


def test_episodes_metrics_and_config_work_where_torch_cannot_be_imported():
    done = _run(NO_TORCH + EPISODES_AND_METRICS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_runner_name_loads_torch_on_first_use():
    script = (
        "import sys\n"
        "import fastrollout\n"
        "assert 'torch' not in sys.modules\n"
        "from fastrollout import SingleAgentEnvRunner\n"
        "assert 'torch' in sys.modules\n"
        "assert fastrollout.SingleAgentEnvRunner is SingleAgentEnvRunner\n"
        "assert SingleAgentEnvRunner.__module__ == 'fastrollout.runners.single_agent_env_runner'\n"
        "assert set(fastrollout.__all__) <= set(dir(fastrollout))\n"
        "print('ok')\n"
    )
    done = _run(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_runner_name_without_torch_fails_with_torchs_import_error():
    done = _run(NO_TORCH + "import fastrollout\nfastrollout.SingleAgentEnvRunner\n")
    assert done.returncode != 0
    assert "ImportError: torch is blocked in this test" in done.stderr


def test_an_unknown_name_is_an_attribute_error():
    import fastrollout

    with pytest.raises(AttributeError, match="NoSuchRunner"):
        fastrollout.NoSuchRunner  # noqa: B018
