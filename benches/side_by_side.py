"""Side by side in one process: the bare loop, RLlib 2.60 and fastrollout, in µs per env step.

Usage::

    python benches/side_by_side.py [--quick] [--json out.json] [--only NAME ...] [--no-rllib]
                                   [--processes N] [--rounds N] [--contenders NAME ...]
                                   [--pong] [--pong-num-envs 8 16]

For every workload the contenders run the same work in this process, one after the
other, each warmed up and then timed over several rounds (``--rounds``, default 9, 3 with
``--quick``; one run of each per round); the table shows each contender's median, and
each ratio is the median over the rounds of the ratio of the two runs of the same round
(runs next to each other in time, so that the VM's slow phases, which last seconds, move
both sides of a ratio alike). ``--only`` keeps the workloads whose name contains one of
its words, ``--contenders`` the contenders whose name does (both in any case).
Torch runs on one thread for all (``torch.set_num_threads(1)``), and numpy's OpenBLAS
too (``OPENBLAS_NUM_THREADS=1`` unless set), on the CPU unless
``--device`` names another (``cuda``: RLlib's local runner has no device option, so its
column is left out there, and it is also left out where ray is not installed or
``--no-rllib`` is given).
``--processes N`` runs the whole measurement in N fresh processes, one after the other,
and reports for each figure the median over them, with the lowest and highest ratio:
the same code on the same machine runs faster or slower by up to a tenth from one process
to the next (where the heap and the pages land), which one process cannot show.
``--num-envs`` sets the sub-env counts of the CartPole rows (default 1 and 8) and
``--vectorize-mode vector_entry_point`` steps the single-agent CartPole rows with
gymnasium's numpy-vectorized CartPole (in the bare loop and in fastrollout alike).

- **bare**: the limit. The same gymnasium vector env (or list of multi-agent envs) stepped
  with a policy of the same size (RLlib's default: 256x256 tanh MLP; forward + one
  categorical draw per module), recording nothing. The draw is :func:`_draw`: the same
  numbers ``torch.distributions.Categorical(logits=...).sample()`` draws, without the
  distribution object and ``multinomial``'s checks, which cost about 50 µs more per call
  on a small batch (fastrollout's runners draw the same way, and so should the limit).
  The multi-agent loop hands each sub-env its actions as numpy int64 scalars, as the
  single-agent rows' gymnasium vector env and both runners do.
- **rllib**: RLlib 2.60's ``SingleAgentEnvRunner`` / ``MultiAgentEnvRunner`` built
  directly from a ``PPOConfig`` (``num_env_runners=0``), ``sample(num_timesteps=...)``.
- **fastrollout**: ``fastrollout.SingleAgentEnvRunner`` / ``MultiAgentEnvRunner``,
  ``sample(num_timesteps=...)``.

Both runners' ``get_metrics()`` runs after every timed ``sample`` call, untimed, as a
training loop reduces the metrics every iteration: until then each runner keeps the
episodes it returned, and a measurement that never reduced them would time how the
allocator copes with a heap that only grows (for the image workload, 28 MB more per call).

Env steps are the transitions recorded (sub-env reset steps of gymnasium's next-step
autoreset, and EnvPool's, are not counted, in any contender). The episode workload times
``add_env_step`` x100 + ``cut`` + ``to_numpy`` of a ``MultiAgentEpisode`` (per env step);
the metrics workload one ``log_value`` call (per call). The image workload steps
``SyntheticImageEnv`` (84x84x4 uint8) with a policy that pools the image to 4 numbers before
the same MLP, so that the copies of the observations, not the network, are what differs.

**Pong** (only on request: ``--pong`` adds the rows, ``--only pong`` runs only them; a
missing ale-py, opencv or ray leaves them out with the reason, a missing envpool its two
contenders; they use RLlib's wrapper and config even with ``--no-rllib``, which leaves
out RLlib's runners). A real env and a real network, nobody here wrote either: ALE's
``ALE/Pong-v5`` made as RLlib's tuned PPO Atari example makes it (``frameskip=1``,
``full_action_space=False``, ``repeat_action_probability=0``) inside RLlib's
``wrap_atari_for_new_api_stack(env, dim=64, framestack=4)`` (frame skip 4 with the max of
the last two frames, 64x64 grayscale through opencv, 4 frames stacked, float32 in
[-1, 1]), and RLlib's default PPO CNN as the tuned example configures it
(``conv_filters=[[16,4,2],[32,4,2],[64,4,2],[128,4,2]]``, relu, one 256-unit head layer,
the value head on the shared encoder). One row per sub-env count (``--pong-num-envs``,
default 8 and 16), all its contenders taking turns in each round, one line each:

- **bare loop, SyncVectorEnv / AsyncVectorEnv**: the same sub-envs in gymnasium's vector
  env (in this process, or one process each), fastrollout's twin of RLlib's CNN
  (``DefaultCNNModule``, acting: encoder and pi head) and ``_draw``, recording nothing: the
  limit of a lockstep loop;
- **RLlib 2.60, sync / async**: RLlib's ``SingleAgentEnvRunner`` from that ``PPOConfig``
  (``gym_env_vectorize_mode`` ``"sync"`` or ``"async"``);
- **fastrollout, sync / async**: ``fastrollout.SingleAgentEnvRunner`` with RLlib's config
  (``env_runner_cls=fastrollout.SingleAgentEnvRunner``), the default sub-env backend;
- **fastrollout, shared memory (W workers, batch B)**: the same plus
  ``fastrollout.sub_env_backend(config, "shared_memory", num_workers=W, batch_size=B)``,
  W and B the backend's defaults (one worker per core but the runner's own; half the
  sub-envs): the runner acts for one half while the other steps;
- **fastrollout, EnvPool (batch B)**: ``envpool:Pong-v5`` with ``PONG_ENVPOOL_KWARGS`` (the
  wrapper's work done by EnvPool's C++ env: uint8 observations, turned channels-last with
  ``channels_last``) and ``sub_env_batch_size=B``;
- **bare loop, EnvPool send/recv (batch B)**: ``envpool.make`` with the same arguments,
  ``recv`` B sub-envs, the same forward pass and draw, ``send``, recording nothing.

The line after each row names what each runner built (its env's and module's classes),
so a setting that a build does not honour yet shows: a shared-memory line whose env reads
``SyncVectorEnv`` ran the default backend. Each ratio column is a reference's time over
the line's (per round, median): above 1, the line is faster than the reference.
What bounds the figures: per env step, the env's CPU time (4 ALE frames and 4 opencv
resizes with RLlib's wrapper, about 1.5 ms on one core of the 2-core VM; less with
EnvPool's C++), the CNN's forward pass (about 8 M multiply-adds per observation: on one
torch thread of that VM about 0.45 ms per observation in batches of 8 or 16, 1.7 ms
alone) and the machine's cores: a
lockstep loop in one process pays env and CNN one after the other, ``AsyncVectorEnv``
overlaps the sub-envs with each other but not with the CNN, and the pipelined backends
(shared memory, EnvPool) overlap the CNN with the other half's steps, so with enough
cores they approach the larger of the two, not their sum. The runner's own bookkeeping
(recording 64 KB float32 observations) is small beside both. Contenders that are not
running hold their processes, idle, and a pipelined contender's last batch finishes its
step at the start of the next contender's run.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# numpy's OpenBLAS threads spin in the background after each BLAS call and take a core of
# this 2-core machine from whichever contender runs next; none of the workloads needs
# them (torch runs on one thread too). Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import fastrollout as fr
from fastrollout.core import Columns as FrColumns
from fastrollout.env.examples import SyntheticImageEnv
from fastrollout.modules import RLModule, RLModuleSpec

#: The image workload's env config and observation compression (``--image-frames``,
#: ``--compress-observations``), the same for every contender.
IMAGE_ENV_CONFIG: dict[str, Any] = {}
COMPRESS_OBSERVATIONS = False

HIDDEN = (256, 256)


# -- policies ------------------------------------------------------------------------------


def _mlp(inp: int, out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in HIDDEN:
        layers += [nn.Linear(inp, h), nn.Tanh()]
        inp = h
    layers.append(nn.Linear(inp, out))
    return nn.Sequential(*layers)


def _pool(obs: torch.Tensor) -> torch.Tensor:
    """(B, 84, 84, 4) uint8 -> (B, 4) float: the image workload's cheap encoder."""
    return obs.float().mean(dim=(1, 2)) / 255.0


class _PoolFr(RLModule):
    """fastrollout module of the image workload: pool, then the 256x256 MLP."""

    def setup(self) -> None:
        self.pi = _mlp(int(self.observation_space.shape[-1]), int(self.action_space.n))

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {FrColumns.ACTION_DIST_INPUTS: self.pi(_pool(batch[FrColumns.OBS]))}


def _rllib_pool_module() -> type:
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.torch import TorchRLModule

    class _PoolRLlib(TorchRLModule):
        """RLlib module of the image workload: pool, then the 256x256 MLP."""

        def setup(self) -> None:
            self.pi = _mlp(int(self.observation_space.shape[-1]), int(self.action_space.n))

        def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
            return {Columns.ACTION_DIST_INPUTS: self.pi(_pool(batch[Columns.OBS]))}

    return _PoolRLlib


# -- workloads -----------------------------------------------------------------------------


@dataclass
class Workload:
    """One workload: a name, a unit and its contenders.

    Each contender is a factory returning ``run() -> units done`` (a closure that keeps its
    env / runner / episode between calls). A factory raises :class:`Unavailable` for a
    contender this installation cannot run; it is left out, with the reason.

    The main table's workloads have the contenders ``CONTENDERS`` and its ``RATIOS``. A
    workload with ``references`` (the Pong rows) has any contenders, shown one line each,
    with the ratio of each reference's time to the line's.
    """

    name: str
    unit: str
    units_per_run: int
    contenders: dict[str, Callable[[], Callable[[], int]]] = field(default_factory=dict)
    #: Contenders every other contender is compared with (``"ref/who"`` ratios).
    references: tuple[str, ...] = ()
    #: Runs only when asked for (``--pong``, or ``--only`` matching its name).
    on_request: bool = False
    #: Why the workload cannot run here (a missing package), or None.
    unavailable: str | None = None

    def ratios(self) -> tuple[tuple[str, str], ...]:
        """The (numerator, denominator) contender pairs whose per-round ratios are taken."""
        if not self.references:
            return RATIOS
        return tuple((ref, who) for ref in self.references for who in self.contenders if who != ref)


class Unavailable(Exception):
    """Raised by a contender's factory where it cannot run here (the message says why)."""


def _draw(logits: torch.Tensor) -> torch.Tensor:
    """One category per row of ``(batch, n)`` logits: the argmax of ``probs / q`` with
    ``q ~ Exp(1)``, which is how ``torch.multinomial`` draws one sample."""
    probs = torch.softmax(logits, dim=-1)
    return torch.div(probs, torch.empty_like(probs).exponential_(1)).argmax(dim=-1)


def _cartpole_fns(n: int) -> list[Callable[[], gym.Env]]:
    return [lambda: gym.make("CartPole-v1") for _ in range(n)]


def _bare_single(
    make_env: Callable[[], gym.vector.VectorEnv],
    encode: Callable,
    steps: int,
    device: str,
    make_policy: Callable[[gym.vector.VectorEnv], Callable[[torch.Tensor], torch.Tensor]]
    | None = None,
):
    def factory() -> Callable[[], int]:
        env = make_env()
        if make_policy is None:
            space = env.single_observation_space
            dim = int(space.shape[-1]) if encode is _pool else int(np.prod(space.shape))
            policy = _mlp(dim, int(env.single_action_space.n)).to(device)
        else:
            policy = make_policy(env)
        obs, _ = env.reset(seed=0)
        state = {"obs": obs, "fresh": np.zeros(env.num_envs, bool)}

        def run() -> int:
            done_steps = 0
            obs, fresh = state["obs"], state["fresh"]
            while done_steps < steps:
                with torch.no_grad():
                    logits = policy(encode(torch.from_numpy(obs).to(device)))
                    actions = _draw(logits)
                obs, _, term, trunc, _ = env.step(actions.cpu().numpy())
                # Sub-envs that were done last step were only reset now (next-step autoreset).
                done_steps += int(env.num_envs - fresh.sum())
                fresh = term | trunc
            state["obs"], state["fresh"] = obs, fresh
            return done_steps

        run.close = env.close  # type: ignore[attr-defined]
        return run

    return factory


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x


def _bare_multi(n: int, agents: int, steps: int, device: str):
    def factory() -> Callable[[], int]:
        env_cls = fr.env.make_multi_agent("CartPole-v1")
        envs = [env_cls({"num_agents": agents}) for _ in range(n)]
        policies = [_mlp(4, 2).to(device) for _ in range(2)]
        obs = [e.reset(seed=i)[0] for i, e in enumerate(envs)]

        def run() -> int:
            done_steps = 0
            while done_steps < steps:
                actions: list[dict[Any, np.int64]] = [{} for _ in range(n)]
                for m, policy in enumerate(policies):
                    rows = [(i, a) for i in range(n) for a in obs[i] if a % 2 == m]
                    if not rows:
                        continue
                    batch = np.stack([obs[i][a] for i, a in rows])
                    with torch.no_grad():
                        logits = policy(torch.from_numpy(batch).to(device))
                        act = _draw(logits)
                        act = act.cpu().numpy()
                    # Each action as the numpy int64 scalar that iterating the array gives,
                    # as gymnasium's vector envs hand their sub-envs (the single-agent rows)
                    # and both runners hand theirs: a sub-env's own checks cost more on
                    # one than on a Python int (CartPole's step about 0.6 µs more).
                    for (i, a), x in zip(rows, act, strict=True):
                        actions[i][a] = x
                for i, e in enumerate(envs):
                    o, _, term, trunc, _ = e.step(actions[i])
                    done_steps += 1
                    if term["__all__"] or trunc["__all__"]:
                        o, _ = e.reset()
                    else:
                        # Agents that are done observe once more but do not act again.
                        o = {a: x for a, x in o.items() if not (term.get(a) or trunc.get(a))}
                    obs[i] = o
            return done_steps

        return run

    return factory


def _mapping(aid: Any, episode: Any, **kwargs: Any) -> str:
    return f"p{int(aid) % 2}"


def _fr_runner(
    n: int, agents: int, steps: int, device: str, image: bool = False, mode: str = "sync"
):
    def factory() -> Callable[[], int]:
        c = fr.RunnerConfig().resources(device=device).debugging(seed=0)
        c = c.env_runners(num_envs_per_env_runner=n, gym_env_vectorize_mode=mode)
        if image:
            c = c.env_runners(compress_observations=COMPRESS_OBSERVATIONS)
            c = c.environment(SyntheticImageEnv, env_config=IMAGE_ENV_CONFIG).rl_module(
                rl_module_spec=RLModuleSpec(module_class=_PoolFr)
            )
            runner: Any = fr.SingleAgentEnvRunner(config=c)
        elif agents:
            c = c.environment(
                fr.env.make_multi_agent("CartPole-v1"), env_config={"num_agents": agents}
            )
            c = c.multi_agent(policies={"p0", "p1"}, policy_mapping_fn=_mapping)
            runner = fr.MultiAgentEnvRunner(config=c)
        else:
            runner = fr.SingleAgentEnvRunner(config=c.environment("CartPole-v1"))
        return _sampler(runner, steps, agents)

    return factory


def _rllib_runner(n: int, agents: int, steps: int, image: bool = False, mode: str = "sync"):
    def factory() -> Callable[[], int]:
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec
        from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
        from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

        c = PPOConfig().debugging(seed=0).env_runners(num_env_runners=0)
        c = c.env_runners(num_envs_per_env_runner=n, gym_env_vectorize_mode=mode)
        if image:
            c = c.env_runners(compress_observations=COMPRESS_OBSERVATIONS)
            c = c.environment(SyntheticImageEnv, env_config=IMAGE_ENV_CONFIG).rl_module(
                rl_module_spec=RLModuleSpec(module_class=_rllib_pool_module())
            )
            runner: Any = SingleAgentEnvRunner(config=c)
        elif agents:
            c = c.environment(MultiAgentCartPole, env_config={"num_agents": agents})
            c = c.multi_agent(policies={"p0", "p1"}, policy_mapping_fn=_mapping)
            runner = MultiAgentEnvRunner(config=c)
        else:
            runner = SingleAgentEnvRunner(config=c.environment("CartPole-v1"))
        return _sampler(runner, steps, agents)

    return factory


def _sampler(runner: Any, steps: int, agents: int) -> Callable[[], int]:
    def run() -> int:
        episodes = runner.sample(num_timesteps=steps)
        if agents:
            return sum(e.env_steps() for e in episodes)
        return sum(len(e) for e in episodes)

    # Both runners keep the episodes they return until their metrics are reduced; a
    # training loop reduces them every iteration. `measure` does so between timed runs
    # (untimed), so that neither runner holds every episode of the whole measurement.
    run.between = runner.get_metrics  # type: ignore[attr-defined]
    return run


def _episode(impl: str, n_agents: int, steps: int):
    def factory() -> Callable[[], int]:
        if impl == "rllib":
            from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as cls
        else:
            cls = fr.MultiAgentEpisode
        agents = [f"agent_{i}" for i in range(n_agents)]
        obs_space = {a: gym.spaces.Box(-1.0, 1.0, (4,), np.float32) for a in agents}
        act_space = {a: gym.spaces.Discrete(2) for a in agents}
        obs = {a: np.zeros(4, np.float32) for a in agents}
        actions = {a: 1 for a in agents}
        rewards = {a: 1.0 for a in agents}
        extras = {a: {"action_logp": np.float32(-0.69)} for a in agents}

        def run() -> int:
            ep = cls(observation_space=obs_space, action_space=act_space)
            ep.add_env_reset(observations=obs)
            for _ in range(steps):
                ep.add_env_step(obs, actions, rewards, extra_model_outputs=extras)
            ep.cut(len_lookback_buffer=1)
            ep.to_numpy()
            return steps

        return run

    return factory


def _log_value(impl: str, calls: int, windowed: bool):
    def factory() -> Callable[[], int]:
        if impl == "rllib":
            from ray.rllib.utils.metrics.metrics_logger import MetricsLogger as cls
        else:
            cls = fr.MetricsLogger
        log = cls().log_value
        values = [float(i % 17) * 0.5 for i in range(calls)]

        def run_ema() -> int:
            for v in values:
                log("key", v)
            return calls

        def run_window() -> int:
            for v in values:
                log("key", v, reduce="mean", window=100)
            return calls

        return run_window if windowed else run_ema

    return factory


def _rllib_available() -> bool:
    try:
        import ray.rllib  # noqa: F401
    except ImportError:
        return False
    return True


def _vector_cartpole(n: int, mode: str) -> gym.vector.VectorEnv:
    if mode == "vector_entry_point":
        return gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode=mode)
    return gym.vector.SyncVectorEnv(_cartpole_fns(n))


# -- Pong: RLlib's Atari wrapper and CNN ---------------------------------------------------

#: The Pong rows' env: ALE's Pong through RLlib's ``wrap_atari_for_new_api_stack``, made
#: as RLlib's tuned PPO Atari example makes it (ALE's own frame skip and sticky actions
#: off: the wrapper skips 4 frames, keeping the brighter pixels).
PONG_ENV_ID = "ale_py:ALE/Pong-v5"
PONG_ENV_CONFIG: dict[str, Any] = {
    "frameskip": 1,
    "full_action_space": False,
    "repeat_action_probability": 0.0,
}
#: The wrapper's arguments: 64x64 grayscale frames, 4 of them stacked (float32 in [-1, 1]).
PONG_WRAPPER: dict[str, Any] = {"dim": 64, "framestack": 4}
#: RLlib's default PPO module for it, as in the tuned example: 4 convolutions, one 256-unit
#: head layer, the value head on the shared encoder.
PONG_MODEL_CONFIG: dict[str, Any] = {
    "conv_filters": [[16, 4, 2], [32, 4, 2], [64, 4, 2], [128, 4, 2]],
    "conv_activation": "relu",
    "head_fcnet_hiddens": [256],
    "vf_share_layers": True,
}
#: The name the runners' configs give the env (``ray.tune.register_env``).
PONG_ENV_NAME = "fastrollout_bench_pong"
#: The same game on EnvPool: its C++ Atari env doing what the wrapper does (frame skip 4,
#: 64x64 grayscale, 4 frames, up to 30 no-ops and FIRE at reset, no reward clipping,
#: 27,000 steps at most). Its observations are uint8 and channels-first; fastrollout's
#: backend turns them channels-last with ``channels_last`` (the bare loop with a view).
PONG_ENVPOOL_ID = "envpool:Pong-v5"
PONG_ENVPOOL_KWARGS: dict[str, Any] = {
    "img_height": 64,
    "img_width": 64,
    "stack_num": 4,
    "gray_scale": True,
    "frame_skip": 4,
    "noop_max": 30,
    "use_fire_reset": True,
    "episodic_life": True,
    "reward_clip": False,
    "repeat_action_probability": 0.0,
    "full_action_space": False,
    "max_episode_steps": 27000,
}

# The Pong rows' contenders (keys in the results), and those every other one is compared to.
BARE_SYNC = "bare loop, SyncVectorEnv"
BARE_ASYNC = "bare loop, AsyncVectorEnv"
RLLIB_SYNC = "RLlib 2.60, sync"
RLLIB_ASYNC = "RLlib 2.60, async"
PONG_REFERENCES = (RLLIB_SYNC, RLLIB_ASYNC, BARE_SYNC, BARE_ASYNC)


def make_pong(config: Any) -> gym.Env:
    """Pong through RLlib's Atari wrapper (the env of every Pong contender but EnvPool's).

    Args:
        config: ``gymnasium.make``'s keyword arguments (from the runners, an EnvContext).

    Returns:
        The wrapped env: (64, 64, 4) float32 observations, 6 actions.
    """
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

    return wrap_atari_for_new_api_stack(gym.make(PONG_ENV_ID, **config), **PONG_WRAPPER)


def _pong_missing() -> str | None:
    """Why the Pong rows cannot run here (a missing package), or None."""
    for module, package in (("ray", "ray[rllib]==2.60.0"), ("ale_py", "ale-py"), ("cv2", "opencv")):
        if importlib.util.find_spec(module) is None:
            return (
                f"{package} is not installed (the Pong rows need RLlib's Atari wrapper, "
                "ale-py and opencv: pip install 'fastrollout[atari]' 'ray[rllib]==2.60.0')"
            )
    return None


def _cnn_policy(
    observation_space: gym.Space, action_space: gym.Space
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The bare loops' policy: fastrollout's twin of RLlib's PPO CNN, acting (logits)."""
    from fastrollout.modules import DefaultCNNModule

    module = RLModuleSpec(
        module_class=DefaultCNNModule,
        observation_space=observation_space,
        action_space=action_space,
        inference_only=True,
        model_config=PONG_MODEL_CONFIG,
    ).build()

    def policy(obs: torch.Tensor) -> torch.Tensor:
        return module.forward_inference({FrColumns.OBS: obs})[FrColumns.ACTION_DIST_INPUTS]

    return policy


def _pong_vector_env(n: int, mode: str) -> gym.vector.VectorEnv:
    fns = [functools.partial(make_pong, dict(PONG_ENV_CONFIG)) for _ in range(n)]
    if mode == "async":
        return gym.vector.AsyncVectorEnv(fns)
    return gym.vector.SyncVectorEnv(fns)


def _pong_config(n: int, mode: str) -> Any:
    """RLlib's PPOConfig of the Pong rows (one local runner, ``n`` sub-envs)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import register_env

    register_env(PONG_ENV_NAME, make_pong)
    c = PPOConfig().debugging(seed=0).environment(PONG_ENV_NAME, env_config=PONG_ENV_CONFIG)
    c = c.env_runners(num_env_runners=0, num_envs_per_env_runner=n, gym_env_vectorize_mode=mode)
    return c.rl_module(model_config=DefaultModelConfig(**PONG_MODEL_CONFIG))


def _built(run: Callable[[], int], runner: Any) -> Callable[[], int]:
    """``run`` with what its runner built (env and module classes) and its ``close``."""
    env = getattr(runner, "env", None)
    base = getattr(env, "unwrapped", env)
    env_name = type(env).__name__
    if base is not env:
        env_name += f" of {type(base).__name__}"  # RLlib's wrapper of the vector env
    module = getattr(runner, "module", None)
    run.built = f"env {env_name}, module {type(module).__name__}"  # type: ignore[attr-defined]
    run.close = runner.stop  # type: ignore[attr-defined]
    return run


def _rllib_pong(n: int, steps: int, mode: str):
    def factory() -> Callable[[], int]:
        from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

        runner = SingleAgentEnvRunner(config=_pong_config(n, mode))
        return _built(_sampler(runner, steps, 0), runner)

    return factory


def _fr_pong(
    n: int,
    steps: int,
    mode: str = "sync",
    *,
    backend: str = "default",
    workers: int | None = None,
    batch_size: int | None = None,
    envpool: bool = False,
):
    def factory() -> Callable[[], int]:
        c = _pong_config(n, mode).env_runners(env_runner_cls=fr.SingleAgentEnvRunner)
        if backend != "default" or batch_size is not None:
            fr.sub_env_backend(c, backend, num_workers=workers, batch_size=batch_size)
        if not envpool:
            runner = fr.SingleAgentEnvRunner(config=c)
            return _built(_sampler(runner, steps, 0), runner)
        if importlib.util.find_spec("envpool") is None:
            raise Unavailable("envpool is not installed (pip install 'fastrollout[envpool]')")
        c = c.environment(PONG_ENVPOOL_ID)
        # (RLlib's environment() merges env_config into the gymnasium env's: replaced.)
        c.env_config = {**PONG_ENVPOOL_KWARGS, "channels_last": True}
        try:
            runner = fr.SingleAgentEnvRunner(config=c)
        except (ValueError, TypeError, ImportError, NotImplementedError) as e:
            # The backend is younger than this row: say what stopped it, run the others.
            first = str(e).splitlines()[0][:200]
            raise Unavailable(f"fastrollout's EnvPool backend: {type(e).__name__}: {first}") from e
        return _built(_sampler(runner, steps, 0), runner)

    return factory


def _bare_envpool(n: int, batch_size: int, steps: int):
    def factory() -> Callable[[], int]:
        try:
            import envpool
        except ImportError as e:
            raise Unavailable(
                "envpool is not installed (pip install 'fastrollout[envpool]')"
            ) from e
        task = PONG_ENVPOOL_ID.partition(":")[2]
        env = envpool.make(
            task,
            env_type="gymnasium",
            num_envs=n,
            batch_size=batch_size,
            seed=0,
            **PONG_ENVPOOL_KWARGS,
        )
        stack, height, width = env.observation_space.shape
        space = gym.spaces.Box(0, 255, (height, width, stack), np.uint8)
        policy = _cnn_policy(space, env.action_space)
        env.async_reset()
        # A sub-env whose last step ended its episode returns its reset observation next
        # (EnvPool resets at the next send), which is not a transition.
        fresh = np.ones(n, bool)

        def run() -> int:
            done_steps = 0
            while done_steps < steps:
                obs, _, term, trunc, info = env.recv()
                ids = info["env_id"]
                done_steps += int(len(ids) - fresh[ids].sum())
                fresh[ids] = term | trunc
                with torch.no_grad():
                    # Channels-last as a view: the CNN takes (B, H, W, C) and permutes back.
                    actions = _draw(policy(torch.from_numpy(obs).permute(0, 2, 3, 1)))
                env.send(actions.numpy(), ids)
            return done_steps

        threads = env.config["num_threads"]  # 0: EnvPool's default
        run.close = env.close  # type: ignore[attr-defined]
        built = f"envpool {envpool.__version__}, num_threads {threads}"
        run.built = built  # type: ignore[attr-defined]
        return run

    return factory


def pong_workloads(
    steps: int, num_envs: tuple[int, ...], with_rllib: bool = True, device: str = "cpu"
) -> list[Workload]:
    """The Pong rows: one per sub-env count, every way of stepping Pong in it.

    Args:
        steps: Env steps per timed run (at least 10 vector steps).
        num_envs: The sub-env counts (each at least 2).
        with_rllib: Whether RLlib's runners are contenders (RLlib's Atari wrapper and
            config are used either way).
        device: The torch device; the rows run on the CPU only.

    Returns:
        The workloads, to run on request (``--pong``, or ``--only pong``).
    """
    missing = _pong_missing()
    if device != "cpu":
        missing = "the Pong rows run on the CPU only (RLlib's local runner has no device)"
    out = []
    for n in num_envs:
        k = max(steps, 10 * n)
        # Half the sub-envs step while the runner acts for the other half.
        batch = max(1, n // 2)
        try:
            from fastrollout.runners.sub_envs.shared_memory import default_num_workers

            workers: int | None = default_num_workers(n)
        except ImportError:  # a build without the backend (before_after.py's earlier one)
            workers = None
        w = Workload(
            f"Pong-v5 64x64x4 (RLlib's Atari wrapper) + RLlib's PPO CNN, {n} sub-envs",
            "µs/env step",
            k,
            references=PONG_REFERENCES if with_rllib else (BARE_SYNC, BARE_ASYNC),
            on_request=True,
            unavailable=missing,
        )
        c = w.contenders

        def policy(env: gym.vector.VectorEnv) -> Callable[[torch.Tensor], torch.Tensor]:
            return _cnn_policy(env.single_observation_space, env.single_action_space)

        for mode, name in (("sync", BARE_SYNC), ("async", BARE_ASYNC)):
            c[name] = _bare_single(
                lambda n=n, mode=mode: _pong_vector_env(n, mode), _flat, k, "cpu", policy
            )
        if with_rllib:
            c[RLLIB_SYNC] = _rllib_pong(n, k, "sync")
            c[RLLIB_ASYNC] = _rllib_pong(n, k, "async")
        c["fastrollout, sync"] = _fr_pong(n, k, "sync")
        c["fastrollout, async"] = _fr_pong(n, k, "async")
        c[f"fastrollout, shared memory ({workers} workers, batch {batch})"] = _fr_pong(
            n, k, backend="shared_memory", workers=workers, batch_size=batch
        )
        c[f"fastrollout, EnvPool (batch {batch})"] = _fr_pong(n, k, batch_size=batch, envpool=True)
        c[f"bare loop, EnvPool send/recv (batch {batch})"] = _bare_envpool(n, batch, k)
        out.append(w)
    return out


def workloads(
    steps: int,
    device: str = "cpu",
    num_envs: tuple[int, ...] = (1, 8),
    mode: str = "sync",
    with_rllib: bool = True,
) -> list[Workload]:
    """The table's rows.

    Args:
        steps: Env steps per timed run of the runner workloads (at least 50 vector steps
            are timed per run, whatever the number of sub-envs).
        device: The torch device of the bare loop's and fastrollout's policies.
        num_envs: The sub-env counts of the CartPole rows.
        mode: The vectorize mode of the single-agent CartPole rows (``"sync"`` or
            ``"vector_entry_point"``).
        with_rllib: Whether RLlib is a contender (where it is installed). Without it,
            RLlib is neither imported nor built in the process.

    Returns:
        The workloads in table order.
    """
    have_rllib = with_rllib and _rllib_available()
    rllib = device == "cpu" and have_rllib
    impls = ("rllib", "fastrollout") if have_rllib else ("fastrollout",)
    out = []
    for n in num_envs:
        k = max(steps, 50 * n)
        label = "" if mode == "sync" else f", {mode}"
        w = Workload(f"CartPole-v1, {n} sub-env(s){label}", "µs/env step", k)
        w.contenders["bare"] = _bare_single(lambda n=n: _vector_cartpole(n, mode), _flat, k, device)
        if rllib:
            w.contenders["rllib"] = _rllib_runner(n, 0, k, mode=mode)
        w.contenders["fastrollout"] = _fr_runner(n, 0, k, device, mode=mode)
        out.append(w)
    for agents in (2, 8):
        for n in num_envs:
            k = max(steps, 50 * n)
            w = Workload(
                f"MA CartPole, {agents} agents / 2 modules, {n} sub-env(s)", "µs/env step", k
            )
            w.contenders["bare"] = _bare_multi(n, agents, k, device)
            if rllib:
                w.contenders["rllib"] = _rllib_runner(n, agents, k)
            w.contenders["fastrollout"] = _fr_runner(n, agents, k, device)
            out.append(w)
    w = Workload("84x84x4 uint8 image env, 8 sub-envs", "µs/env step", steps)
    w.contenders["bare"] = _bare_single(
        lambda: gym.vector.SyncVectorEnv(
            [lambda: SyntheticImageEnv(IMAGE_ENV_CONFIG) for _ in range(8)]
        ),
        _pool,
        steps,
        device,
    )
    if rllib:
        w.contenders["rllib"] = _rllib_runner(8, 0, steps, image=True)
    w.contenders["fastrollout"] = _fr_runner(8, 0, steps, device, image=True)
    out.append(w)
    for agents in (2, 8):
        w = Workload(
            f"MultiAgentEpisode add_env_step x100+cut+to_numpy, {agents} agents",
            "µs/env step",
            100,
        )
        for impl in impls:
            w.contenders[impl] = _episode(impl, agents, 100)
        out.append(w)
    for windowed in (False, True):
        w = Workload(
            f"MetricsLogger.log_value ({'mean, window=100' if windowed else 'ema'})",
            "µs/call",
            1000,
        )
        for impl in impls:
            w.contenders[impl] = _log_value(impl, 1000, windowed)
        out.append(w)
    return out


# -- timing --------------------------------------------------------------------------------


def measure(
    factories: dict[str, Callable[[], Callable[[], int]]],
    repeats: int,
    warmup: int,
    ratios: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    """Median time per unit (µs) of each contender over ``repeats`` timed runs, and the
    median ratios of the given pairs of contenders.

    The contenders take turns (one run each per round), so that a change in the machine's
    load during the measurement hits all of them alike; a ratio is taken within each round
    (``"fastrollout/bare"``: fastrollout's run over the bare loop's run of the same round),
    and its median over the rounds is what the table shows. A contender whose factory
    raises :class:`Unavailable` is left out (``"left out"``: its reason). After the last
    round each contender's ``close`` (where it has one) stops its processes.

    Args:
        factories: Contender name -> factory of its run closure.
        repeats: Timed runs per contender.
        warmup: Untimed runs per contender first.
        ratios: The (numerator, denominator) pairs (default: ``RATIOS``).

    Returns:
        Contender name -> median µs per unit, ``"a/b"`` -> median ratio of a's to b's time
        for each pair where both ran, and, where any, ``"built"`` (contender -> what its
        runner built) and ``"left out"`` (contender -> why).
    """
    runs: dict[str, Callable[[], int]] = {}
    left_out: dict[str, str] = {}
    for who, factory in factories.items():
        try:
            runs[who] = factory()
        except Unavailable as e:
            left_out[who] = str(e)
            print(f"  left out {who}: {e}", flush=True)
    times: dict[str, list[float]] = {who: [] for who in runs}
    try:
        for run in runs.values():
            for _ in range(warmup):
                run()
                _between(run)
        gc.collect()
        for _ in range(repeats):
            for who, run in runs.items():
                t0 = time.perf_counter()
                units = run()
                times[who].append((time.perf_counter() - t0) / units * 1e6)
                _between(run)
    finally:
        for run in runs.values():
            close = getattr(run, "close", None)
            if close is not None:
                close()
    out: dict[str, Any] = {who: statistics.median(t) for who, t in times.items()}
    for a, b in ratios or RATIOS:
        if a in times and b in times:
            pairs = zip(times[a], times[b], strict=True)
            out[f"{a}/{b}"] = statistics.median(x / y for x, y in pairs)
    built = {who: run.built for who, run in runs.items() if hasattr(run, "built")}
    if built:
        out["built"] = built
    if left_out:
        out["left out"] = left_out
    return out


# The contenders, in the table's column order.
CONTENDERS = ("bare", "rllib", "fastrollout")
# The table's ratio columns: (numerator, denominator) contenders.
RATIOS = (("rllib", "fastrollout"), ("fastrollout", "bare"))


def _between(run: Callable[[], int]) -> None:
    """The untimed work a contender does between two runs (see ``_sampler``)."""
    between = getattr(run, "between", None)
    if between is not None:
        between()


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """The machine and versions, for the table's header.

    Returns:
        A dict of names to strings.
    """
    cpu = cpu_model()
    # From the installed metadata: importing ray here would put it (and what it loads) in
    # every process, `--no-rllib` ones included, and imports move the figures.
    try:
        ray_version = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        ray_version = "not installed"
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "load average (1/5/15 min) at start": load,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "ray": ray_version,
        "fastrollout": getattr(fr, "__version__", "dev"),
        "torch threads": str(torch.get_num_threads()),
    }


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 1 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _contenders_of(r: dict[str, Any]) -> tuple[str, ...]:
    """A result's contender names: its ``"contenders"``, else the main table's."""
    return tuple(r.get("contenders", CONTENDERS))


def _ratio_keys_of(r: dict[str, Any]) -> list[str]:
    """A result's ratio keys: each reference over each other contender, else ``RATIOS``."""
    if "references" not in r:
        return [f"{a}/{b}" for a, b in RATIOS]
    return [f"{a}/{b}" for a in r["references"] for b in _contenders_of(r) if b != a]


def _progress(r: dict[str, Any], prefix: str = "") -> None:
    """Prints one workload's times as they come (each contender that ran)."""
    line = ", ".join(f"{who} {_fmt(r[who])}" for who in _contenders_of(r) if who in r)
    print(f"  {prefix}{r['name']}: {line} {r['unit']}", flush=True)


def _ratio(r: dict[str, Any], a: str, b: str) -> str:
    x = r.get(f"{a}/{b}")  # the median of the per-round ratios (`measure`)
    if x is None:
        return "-"
    spread = r.get(f"{a}/{b} range")  # over processes (`combine`)
    if spread is None:
        return f"{x:.2f}x"
    return f"{x:.2f}x ({spread[0]:.2f} to {spread[1]:.2f})"


def combine(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One result per workload from the results of several processes.

    Each figure (a contender's time, a ratio) is the median of the processes' figures; a
    ratio also gets ``"a/b range"``: its lowest and highest value over the processes.
    Workloads keep the order of their first appearance; a figure missing from some
    processes is the median of those that have it.

    Args:
        runs: Per process, its results (``measure``'s dicts with ``name`` and ``unit``).

    Returns:
        The combined results, with ``processes``: how many had each workload.
    """
    by_name: dict[str, list[dict[str, Any]]] = {}
    for results in runs:
        for r in results:
            by_name.setdefault(r["name"], []).append(r)
    out = []
    for name, rs in by_name.items():
        c: dict[str, Any] = {"name": name, "unit": rs[0]["unit"], "processes": len(rs)}
        contenders = dict.fromkeys(k for r in rs for k in _contenders_of(r))
        ratios = {k for r in rs for k in _ratio_keys_of(r)}
        if any("contenders" in r for r in rs):
            c["contenders"] = list(contenders)
        if any("references" in r for r in rs):
            c["references"] = list(dict.fromkeys(x for r in rs for x in r.get("references", ())))
        for extra in ("built", "left out"):
            found = next((r[extra] for r in rs if r.get(extra)), None)
            if found:
                c[extra] = found
        keys = dict.fromkeys(k for r in rs for k in r if k in ratios or k in contenders)
        for k in keys:
            values = [r[k] for r in rs if r.get(k) is not None]
            if not values:
                continue
            c[k] = statistics.median(values)
            if k in ratios:
                c[f"{k} range"] = (min(values), max(values))
        out.append(c)
    return out


def _in_processes(argv: list[str], n: int) -> list[dict[str, Any]]:
    """Runs this script with ``argv`` in ``n`` fresh processes, one after the other.

    Args:
        argv: The arguments, without ``--processes`` and ``--json``.
        n: How many processes.

    Returns:
        The combined results (``combine``).

    Raises:
        RuntimeError: If a process fails (its output is in the message).
    """
    import subprocess
    import tempfile

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            out = os.path.join(tmp, f"{i}.json")
            cmd = [sys.executable, os.path.abspath(__file__), *argv, "--json", out]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"process {i + 1} of {n} failed:\n{done.stdout}{done.stderr}")
            with open(out) as f:
                results = json.load(f)["results"]
            for r in results:
                _progress(r, f"[{i + 1}/{n}] ")
                if i == 0:
                    for who, why in r.get("left out", {}).items():
                        print(f"  left out {who}: {why}", flush=True)
            runs.append(results)
    return combine(runs)


def table(results: list[dict[str, Any]]) -> str:
    """The Markdown tables of the results: the main table, then the per-contender one.

    Args:
        results: One dict per workload (name, unit, bare, rllib, fastrollout, and the
            ratios `measure` adds); those with ``references`` (the Pong rows) go to
            :func:`contender_table`.

    Returns:
        The tables (each only where it has rows).
    """
    main = [r for r in results if "references" not in r]
    rows = [
        "| workload | unit | bare loop | RLlib 2.60 | fastrollout | RLlib / fastrollout "
        "| fastrollout / bare |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in main:
        rows.append(
            f"| {r['name']} | {r['unit']} | {_fmt(r.get('bare'))} | {_fmt(r.get('rllib'))} "
            f"| {_fmt(r.get('fastrollout'))} | {_ratio(r, 'rllib', 'fastrollout')} "
            f"| {_ratio(r, 'fastrollout', 'bare')} |"
        )
    per_contender = [r for r in results if "references" in r]
    tables = ["\n".join(rows)] if main or not per_contender else []
    if per_contender:
        tables.append(contender_table(per_contender))
    return "\n\n".join(tables)


def _reference_cell(r: dict[str, Any], ref: str, who: str) -> str:
    if who == ref:
        return "ref"
    if ref not in r.get("references", ()):
        return "-"
    return _ratio(r, ref, who)


def contender_table(results: list[dict[str, Any]]) -> str:
    """The Markdown table of workloads with ``references``: one line per contender.

    Each reference column holds the reference's time over the line's (the median over
    the rounds of that ratio): above 1, the line's contender is faster than the reference.

    Args:
        results: Results with ``contenders`` and ``references``.

    Returns:
        The table.
    """
    refs = list(dict.fromkeys(ref for r in results for ref in r["references"]))
    head = "| workload | contender | time | env steps/s | " + " | ".join(
        f"{ref} / this" for ref in refs
    )
    rows = [head + " |", "|---|---|---:|---:|" + "---:|" * len(refs)]
    for r in results:
        for who in _contenders_of(r):
            if who not in r:
                continue
            cells = [_reference_cell(r, ref, who) for ref in refs]
            rate = f"{1e6 / r[who]:,.0f}" if r["unit"] == "µs/env step" else "-"
            rows.append(
                f"| {r['name']} | {who} | {_fmt(r[who])} {r['unit']} | {rate} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(rows)


def _without_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """``argv`` without the options ``names`` and their values (``--x v`` or ``--x=v``).

    Args:
        argv: Command-line arguments.
        names: Options that take one value.

    Returns:
        The other arguments, in order.
    """
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in names:
            skip = True
        elif not any(a.startswith(f"{n}=") for n in names):
            out.append(a)
    return out


def _measure_workload(
    w: Workload,
    contenders: dict[str, Callable[[], Callable[[], int]]],
    repeats: int,
    warmup: int,
) -> dict[str, Any]:
    """Measures one workload's contenders and prints its figures.

    Args:
        w: The workload.
        contenders: The contenders to run (``--contenders`` may leave some of ``w``'s out).
        repeats: Timed rounds.
        warmup: Untimed runs per contender first.

    Returns:
        Its result: name, unit, ``measure``'s figures and, for a workload with
        references, the contenders and references that ran.
    """
    r: dict[str, Any] = {"name": w.name, "unit": w.unit}
    r.update(measure(contenders, repeats, warmup, w.ratios()))
    if w.references:
        r["contenders"] = [who for who in contenders if who in r]
        r["references"] = [ref for ref in w.references if ref in r]
    _progress(r)
    for who, what in r.get("built", {}).items():
        print(f"    {who}: {what}", flush=True)
    return r


def _selected(w: Workload, only: list[str] | None, pong: bool) -> bool:
    """Whether a workload runs: ``--only`` names it, or no ``--only`` and it is a default
    row (the Pong rows also with ``--pong``)."""
    if only:
        return any(s.lower() in w.name.lower() for s in only)
    return pong or not w.on_request


def _chosen(
    contenders: dict[str, Callable[[], Callable[[], int]]], names: list[str] | None
) -> dict[str, Callable[[], Callable[[], int]]]:
    """The contenders ``--contenders`` keeps (all without it)."""
    if not names:
        return contenders
    return {k: v for k, v in contenders.items() if any(s.lower() in k.lower() for s in names)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="run only workloads whose name contains one (any case); 'pong': the Pong rows",
    )
    parser.add_argument(
        "--contenders",
        nargs="+",
        default=None,
        help="run only contenders whose name contains one (any case), e.g. 'envpool'",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="timed rounds (default 9; 3 with --quick)"
    )
    parser.add_argument(
        "--pong",
        action="store_true",
        help="add the Pong rows (RLlib's Atari wrapper and CNN; ale-py, opencv, envpool)",
    )
    parser.add_argument(
        "--pong-num-envs",
        type=int,
        nargs="+",
        default=[8, 16],
        help="sub-envs of the Pong rows (default 8 16)",
    )
    parser.add_argument(
        "--device", default="cpu", help="torch device of the policies (cpu, cuda, auto)"
    )
    parser.add_argument(
        "--num-envs", type=int, nargs="+", default=[1, 8], help="sub-envs of the CartPole rows"
    )
    parser.add_argument(
        "--vectorize-mode",
        default="sync",
        choices=["sync", "vector_entry_point"],
        help="how the single-agent CartPole rows vectorize their sub-envs",
    )
    parser.add_argument(
        "--no-rllib",
        action="store_true",
        help="leave RLlib out (not imported): the bare loop and fastrollout only",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="run the measurement in this many fresh processes and report the medians",
    )
    parser.add_argument(
        "--image-frames",
        default="noise",
        choices=["noise", "scene"],
        help="the image workload's frames: random noise, or a moving-shapes scene",
    )
    parser.add_argument(
        "--compress-observations",
        action="store_true",
        help="the image workload's runners store observations compressed",
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    global COMPRESS_OBSERVATIONS
    IMAGE_ENV_CONFIG["frames"] = args.image_frames
    COMPRESS_OBSERVATIONS = args.compress_observations
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if any(n < 2 for n in args.pong_num_envs):
        parser.error("--pong-num-envs: each count must be at least 2 (half of them step)")
    warnings.simplefilter("ignore")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    torch.set_num_threads(1)
    steps, repeats, warmup = (200, 3, 1) if args.quick else (1000, 9, 2)
    repeats = args.rounds or repeats
    info = machine()
    print("machine:", "; ".join(f"{k}: {v}" for k, v in info.items()), flush=True)
    results: list[dict[str, Any]] = []
    from fastrollout.modules.device import resolve_device

    device = resolve_device(args.device)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    info["device"] = str(device)
    print(f"device: {device}", flush=True)
    pong_rows = pong_workloads(
        steps, tuple(args.pong_num_envs), not args.no_rllib, str(device.type)
    )
    if args.processes > 1:
        for w in pong_rows:
            if _selected(w, args.only, args.pong) and w.unavailable:
                print(f"  left out {w.name}: {w.unavailable}", flush=True)
        # The children get the same arguments but for these two (each writes its own json).
        child = _without_options(argv, ("--processes", "--json"))
        results = _in_processes(child, args.processes)
        info["processes"] = str(args.processes)
    else:
        rows = workloads(
            steps, str(device), tuple(args.num_envs), args.vectorize_mode, not args.no_rllib
        )
        for w in rows + pong_rows:
            if not _selected(w, args.only, args.pong):
                continue
            if w.unavailable:
                print(f"  left out {w.name}: {w.unavailable}", flush=True)
                continue
            contenders = _chosen(w.contenders, args.contenders)
            if contenders:
                results.append(_measure_workload(w, contenders, repeats, warmup))
    print()
    print(table(results))
    cmd = "python benches/side_by_side.py " + shlex.join(argv)
    print(f"\ncommand: {cmd.strip()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "command": cmd, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
