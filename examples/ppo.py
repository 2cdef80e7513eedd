"""A compact PPO trainer that learns from fastrollout episodes.

    python examples/ppo.py --env CartPole-v1 --timesteps 200000 --seed 0
    python examples/ppo.py --env CartPole-v1 --multi-agent 2 --timesteps 200000
    python examples/ppo.py --env CartPole-v1 --num-env-runners 2   # Ray actors
    python examples/ppo.py --env StatelessCartPole --lstm --max-seq-len 20   # recurrent

(With ``--multi-agent N`` the mean return is the episode's, summed over the agents.)

The runners are a ``fastrollout.EnvRunnerGroup``: one ``SingleAgentEnvRunner`` (or
``MultiAgentEnvRunner`` over N copies of the env sharing one module) in this process, or
``--num-env-runners`` of them in Ray actors. Each iteration samples
``num_envs * rollout_fragment_length`` env steps per runner in ``truncate_episodes`` mode
with one step of look-back, computes GAE per episode chunk (bootstrapping from each
chunk's last observation, 0 after a terminal step), runs PPO epochs on a full
``DefaultMLPModule`` (policy and value function), and sends the new weights to every
runner with ``sync_weights`` (one ``ray.put``, a rising ``weights_seq_no``). The learner
pieces live in ``fastrollout.learners.ppo``.

With ``--lstm`` the module is a ``DefaultLSTMModule`` (``--hiddens`` is its tokenizer MLP,
``--lstm-cell-size`` its LSTM) and PPO trains on sequences of ``--max-seq-len`` steps,
each starting from the recurrent state the runner recorded. ``--env StatelessCartPole``
is CartPole without the velocities (``fastrollout.env.examples``), which a policy
without memory cannot balance for long.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fastrollout import EnvRunnerGroup, MultiAgentEnvRunner, RunnerConfig, SingleAgentEnvRunner
from fastrollout.env import make_multi_agent
from fastrollout.env.examples import StatelessCartPole
from fastrollout.learners import PPOConfig, PPOLearner
from fastrollout.modules import MultiRLModuleSpec, RLModuleSpec, resolve_device

#: ``--env`` names of fastrollout's example envs (other names are gymnasium ids).
EXAMPLE_ENVS: dict[str, Any] = {"StatelessCartPole": StatelessCartPole}


class EpisodeReturns:
    """Returns of the last ``window`` finished episodes, adding up their chunks."""

    def __init__(self, window: int = 100) -> None:
        self.partial: dict[str, float] = {}
        self.finished: collections.deque[float] = collections.deque(maxlen=window)

    def add(self, episodes: Sequence[Any]) -> None:
        for episode in episodes:
            total = self.partial.pop(episode.id_, 0.0) + float(episode.get_return())
            if episode.is_done:
                self.finished.append(total)
            else:
                self.partial[episode.id_] = total

    def mean(self) -> float:
        return sum(self.finished) / len(self.finished) if self.finished else math.nan


def make_config(args: argparse.Namespace) -> RunnerConfig:
    """The runners' config: truncate_episodes with one step of look-back, the PPO model."""
    config = RunnerConfig()
    env = EXAMPLE_ENVS.get(args.env, args.env)
    if args.multi_agent:
        config.environment(make_multi_agent(env), env_config={"num_agents": args.multi_agent})
    else:
        config.environment(env)
    config.env_runners(
        num_env_runners=args.num_env_runners,
        num_cpus_per_env_runner=args.num_cpus_per_env_runner,
        num_envs_per_env_runner=args.num_envs,
        rollout_fragment_length=args.rollout_fragment_length,
        batch_mode="truncate_episodes",
        episode_lookback_horizon=1,
    )
    config.rl_module(model_config=model_config(args))
    config.resources(device=args.device)
    config.debugging(seed=args.seed)
    return config


def make_runner(args: argparse.Namespace) -> Any:
    """One runner in this process (what the group's local runner is)."""
    runner_cls = MultiAgentEnvRunner if args.multi_agent else SingleAgentEnvRunner
    return runner_cls(config=make_config(args))


def make_env_runner_group(args: argparse.Namespace) -> EnvRunnerGroup:
    """The runners: ``--num-env-runners`` Ray actors (Ray started if needed), or one here."""
    if args.num_env_runners:
        import ray

        if not ray.is_initialized():
            # A new local instance unless RAY_ADDRESS names a cluster.
            ray.init(address=os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False)
    return EnvRunnerGroup(config=make_config(args))


def model_config(args: argparse.Namespace) -> dict[str, Any]:
    """The default module's settings (RLlib's names): an MLP, or with ``--lstm`` an LSTM."""
    config: dict[str, Any] = {"fcnet_hiddens": list(args.hiddens), "fcnet_activation": "tanh"}
    if args.lstm:
        config.update(
            use_lstm=True,
            max_seq_len=args.max_seq_len,
            lstm_cell_size=args.lstm_cell_size,
            vf_share_layers=args.vf_share_layers,
        )
    return config


def make_learner(args: argparse.Namespace, runner: Any) -> PPOLearner:
    """Full modules (with value functions) for the runner's module ids and spaces."""
    spaces = {mid: sp for mid, sp in runner.get_spaces().items() if not mid.startswith("__")}
    spec = MultiRLModuleSpec(
        rl_module_specs={
            mid: RLModuleSpec(
                observation_space=obs_space,
                action_space=act_space,
                model_config=model_config(args),
            )
            for mid, (obs_space, act_space) in spaces.items()
        }
    )
    modules = spec.build().to(resolve_device(args.device))
    ppo = PPOConfig(
        gamma=args.gamma,
        lambda_=args.lambda_,
        clip_param=args.clip_param,
        vf_loss_coeff=args.vf_loss_coeff,
        entropy_coeff=args.entropy_coeff,
        lr=args.lr,
        num_epochs=args.num_epochs,
        minibatch_size=args.minibatch_size,
        grad_clip=args.grad_clip,
        seed=args.seed,
    )
    return PPOLearner(modules, ppo)


def train(
    args: argparse.Namespace, log: Callable[[str], None] | None = print
) -> list[dict[str, float]]:
    """Trains until ``args.timesteps`` env steps (or ``args.stop_return``).

    Returns:
        One record per iteration: ``env_steps`` (so far), ``return_mean`` (the mean
        return of the last 100 finished episodes; nan before the first one ends),
        ``time_s`` and the learner's statistics.
    """
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    group = make_env_runner_group(args)
    learner = make_learner(args, group)
    # weights_seq_no 1: the learner's initial weights, in every runner.
    group.sync_weights(from_worker_or_learner_group=learner)
    history: list[dict[str, float]] = []
    returns = EpisodeReturns()
    return_mean = math.nan
    steps = 0
    start = time.perf_counter()
    per_iteration = args.num_envs * args.rollout_fragment_length * max(1, args.num_env_runners)
    try:
        while steps < args.timesteps:
            if args.anneal_lr:
                # Linear decay to 0 over the step budget: late updates make small steps,
                # which keeps a solved policy from drifting off again.
                learner.set_lr(args.lr * (1.0 - steps / args.timesteps))
            episodes = group.sample(num_timesteps=min(per_iteration, args.timesteps - steps))
            stats = learner.update(episodes)
            group.sync_weights(from_worker_or_learner_group=learner)
            # len() of a chunk is its env steps (also for a multi-agent chunk).
            steps += sum(len(episode) for episode in episodes)
            returns.add(episodes)
            return_mean = returns.mean()
            # The runners' metrics are per get_metrics() call (RLlib's, on a runner);
            # they are read here so that their windows do not grow without bound.
            group.get_metrics()
            record = {"env_steps": float(steps), "return_mean": return_mean}
            record["time_s"] = time.perf_counter() - start
            for module_id, module_stats in stats.items():
                for key, value in module_stats.items():
                    record[f"{module_id}/{key}"] = value
            history.append(record)
            if log is not None:
                first = next(iter(stats.values()), {})
                log(
                    f"steps {steps:>8,}  return_mean {return_mean:7.1f}  "
                    f"vf_loss {first.get('vf_loss', math.nan):8.3f}  "
                    f"kl {first.get('mean_kl', math.nan):.4f}  "
                    f"entropy {first.get('entropy', math.nan):.3f}  "
                    f"{steps / record['time_s']:,.0f} steps/s"
                )
            if args.stop_return is not None and return_mean >= args.stop_return:
                break
    finally:
        group.stop()
    return history


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (defaults solve CartPole-v1)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--env",
        default="CartPole-v1",
        help="gymnasium id or StatelessCartPole (default CartPole-v1)",
    )
    p.add_argument("--timesteps", type=int, default=200_000, help="env steps to train")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-envs", type=int, default=8, help="sub-envs per runner")
    p.add_argument(
        "--num-env-runners",
        type=int,
        default=0,
        help="remote runners (Ray actors; needs fastrollout[ray]); 0 samples in this "
        "process (default)",
    )
    p.add_argument(
        "--num-cpus-per-env-runner",
        type=float,
        default=1.0,
        help="CPUs Ray reserves per remote runner (default 1)",
    )
    p.add_argument(
        "--rollout-fragment-length", type=int, default=128, help="steps per sub-env per update"
    )
    p.add_argument("--multi-agent", type=int, default=None, metavar="N", help="N agents")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument(
        "--hiddens", type=_hiddens, default=(256, 256), help="MLP sizes (default 256,256)"
    )
    p.add_argument(
        "--lstm",
        action="store_true",
        help="a recurrent module (DefaultLSTMModule), trained on sequences",
    )
    p.add_argument(
        "--max-seq-len", type=int, default=20, help="steps per training sequence (--lstm)"
    )
    p.add_argument(
        "--lstm-cell-size", type=int, default=256, help="LSTM units (--lstm; default 256)"
    )
    p.add_argument(
        "--vf-share-layers",
        action="store_true",
        help="one LSTM encoder for policy and value (--lstm; default: one each)",
    )
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument(
        "--anneal-lr",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decay the learning rate linearly to 0 over --timesteps (default on)",
    )
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lambda", dest="lambda_", type=float, default=0.95)
    p.add_argument("--clip-param", type=float, default=0.2)
    p.add_argument("--vf-loss-coeff", type=float, default=0.5)
    p.add_argument("--entropy-coeff", type=float, default=0.0)
    p.add_argument("--num-epochs", type=int, default=10)
    p.add_argument("--minibatch-size", type=int, default=256)
    p.add_argument(
        "--grad-clip",
        type=float,
        default=None,
        help="bound of the gradients' global norm (default none, as RLlib's PPO)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: faster for these small matrices, and several "
        "threads on a busy machine slow everything down; 0: torch's default)",
    )
    p.add_argument("--stop-return", type=float, default=None, help="stop at this mean return")
    return p.parse_args(argv)


def _hiddens(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    history = train(args)
    if history:
        last = history[-1]
        print(
            f"done: {int(last['env_steps']):,} env steps, mean return "
            f"{last['return_mean']:.1f}, {last['time_s']:.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
