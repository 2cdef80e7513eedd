"""``DefaultLSTMModule``: the default recurrent actor-critic, shaped like RLlib 2.60's.

With ``model_config["use_lstm"]`` RLlib's PPO catalog builds, per encoder, an MLP
"tokenizer" (``fcnet_hiddens`` with ``fcnet_activation`` after every layer) followed by
one LSTM layer of ``lstm_cell_size`` units, batch-major; the policy and value heads read
the LSTM's output. Without ``vf_share_layers`` the actor and the critic each have their
own tokenizer and LSTM, and so their own recurrent state. This module has the same
layers under the same parameter names (``encoder.actor_encoder.tokenizer.net.mlp.0.weight``,
``encoder.actor_encoder.lstm.weight_ih_l0``, ``pi.net.mlp.0.weight``, ...), so an RLlib
module's state loads as it is and both compute the same outputs.

Data layout (RLlib's): inputs have a time axis, ``batch[Columns.OBS]`` is
``(B, T, *obs_shape)``; ``batch[Columns.STATE_IN]`` is the state at the first step,
without a time axis: ``{"h": (B, 1, cell), "c": (B, 1, cell)}`` with shared layers,
``{"actor": {"h", "c"}, "critic": {"h", "c"}}`` without. Outputs keep the time axis
(``(B, T, ...)``) and ``Columns.STATE_OUT`` is the state after the last step, laid out as
``STATE_IN``. ``get_initial_state()`` is that state without the batch axis (zeros).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from fastrollout.core import Columns
from fastrollout.core.tree import leaves, tree_map
from fastrollout.modules.default import (
    _UNSUPPORTED_AT_DEFAULT,
    DEFAULT_MODEL_CONFIG,
    _activation,
    _Encoder,
    _Head,
    _layers,
    checked_model_config,
    obs_preprocessor,
)
from fastrollout.modules.distributions import TorchDiagGaussian, get_action_dist_cls
from fastrollout.modules.rl_module import RLModule

__all__ = ["LSTM_MODEL_CONFIG", "DefaultLSTMModule"]

#: The settings DefaultLSTMModule reads, with their defaults (RLlib's
#: DefaultModelConfig names and values; ``vf_share_layers`` False as PPO sets it).
LSTM_MODEL_CONFIG: dict[str, Any] = {
    **DEFAULT_MODEL_CONFIG,
    "use_lstm": True,
    "max_seq_len": 20,
    "lstm_cell_size": 256,
}

_LSTM_UNSUPPORTED_AT_DEFAULT = {
    k: v for k, v in _UNSUPPORTED_AT_DEFAULT.items() if k not in LSTM_MODEL_CONFIG
}

# RLlib's keys of the two states of separate actor and critic encoders.
ACTOR = "actor"
CRITIC = "critic"


class _LSTMEncoder(nn.Module):
    """Tokenizer MLP, then one batch-major LSTM layer (RLlib's ``TorchLSTMEncoder``)."""

    def __init__(self, tokenizer: nn.Sequential, in_dim: int, cell_size: int) -> None:
        super().__init__()
        self.tokenizer = _Encoder(tokenizer)
        self.lstm = nn.LSTM(in_dim, cell_size, 1, batch_first=True)

    def forward(
        self, x: torch.Tensor, batch_size: int, state: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Encodes ``(B * T, features)`` rows given the state at the first step.

        Args:
            x: The flattened observations, batch-major: row ``b * T + t``.
            batch_size: ``B``.
            state: ``{"h": (B, layers, cell), "c": (B, layers, cell)}``.

        Returns:
            ``(out, state_out)``: the LSTM's outputs ``(B, T, cell)`` and the state
            after the last step, laid out as ``state``.
        """
        tokens = self.tokenizer(x)
        if tokens.shape[0] == batch_size and not torch.is_grad_enabled():
            # One step (the runners' case): the cell alone, without nn.LSTM's sequence
            # machinery, is about 4x faster at batch 8 x 256 cells on one CPU thread.
            w_ih, w_hh, b_ih, b_hh = self.lstm.all_weights[0]
            h1, c1 = torch.lstm_cell(
                tokens, (state["h"][:, 0], state["c"][:, 0]), w_ih, w_hh, b_ih, b_hh
            )
            return h1[:, None], {"h": h1[:, None], "c": c1[:, None]}
        tokens = tokens.reshape(batch_size, -1, tokens.shape[-1])
        # The LSTM wants layers-first states; the batches carry them batch-first.
        h = state["h"].transpose(0, 1).contiguous()
        c = state["c"].transpose(0, 1).contiguous()
        out, (h_out, c_out) = self.lstm(tokens, (h, c))
        return out, {"h": h_out.transpose(0, 1), "c": c_out.transpose(0, 1)}


class _StatefulActorCriticEncoder(nn.Module):
    def __init__(self, make: Any, *, shared: bool) -> None:
        super().__init__()
        if shared:
            self.encoder = make()
        else:
            self.actor_encoder = make()
            self.critic_encoder = make()


class DefaultLSTMModule(RLModule):
    """Actor-critic with an LSTM encoder (RLlib's default PPO module with ``use_lstm``).

    ``forward_inference`` and ``forward_exploration`` return
    ``Columns.ACTION_DIST_INPUTS`` ``(B, T, A)`` and ``Columns.STATE_OUT``;
    ``forward_train`` also returns ``Columns.EMBEDDINGS`` (the critic's LSTM output,
    ``(B, T, cell)``) and ``Columns.VF_PREDS`` ``(B, T)``; ``compute_values(batch)``
    returns ``(B, T)``.

    ``model_config`` keys (RLlib's names): ``lstm_cell_size`` (256), ``max_seq_len``
    (20; the learners' sequence length), ``use_lstm`` (True; False is an error here),
    ``fcnet_hiddens`` (``[256, 256]``, the tokenizer MLP) and ``fcnet_activation``
    (``"tanh"``), ``head_fcnet_hiddens`` (``[]``) and ``head_fcnet_activation``
    (``"relu"``), ``vf_share_layers`` (False), ``free_log_std`` (False),
    ``log_std_clip_param`` (20.0). Other DefaultModelConfig keys are accepted at their
    "off" value only. The resolved ``max_seq_len`` is written into ``model_config``.

    Unlike RLlib, the weights an inference-only module needs include the critic's
    encoder: without separate layers the critic's recurrent state is part of the state
    the runner carries, and RLlib's inference-only weights leave that encoder out, so
    RLlib's runners advance the critic's state with the critic's initial weights.

    Raises:
        ValueError: For an unknown model_config key, a bad value (named), or an RLlib
            option this module does not implement.
        TypeError: For an observation or action space it cannot handle (named).
    """

    def setup(self) -> None:
        """Builds the tokenizers, LSTMs and heads from the spaces and the model config."""
        cfg = checked_model_config(
            self.model_config, LSTM_MODEL_CONFIG, _LSTM_UNSUPPORTED_AT_DEFAULT, "DefaultLSTMModule"
        )
        if cfg["use_lstm"] is not True:
            raise ValueError(
                f"DefaultLSTMModule needs model_config['use_lstm'] = True, got {cfg['use_lstm']!r}"
            )
        for key in ("lstm_cell_size", "max_seq_len"):
            value = cfg[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model_config[{key!r}] must be an int >= 1, got {value!r}")
        self.model_config["max_seq_len"] = cfg["max_seq_len"]
        assert self.observation_space is not None and self.action_space is not None
        in_dim, self._preprocess = obs_preprocessor(self.observation_space)
        self.action_dist_cls = get_action_dist_cls(self.action_space)
        hiddens = [int(h) for h in cfg["fcnet_hiddens"]]
        act = _activation(cfg["fcnet_activation"], "fcnet_activation")
        head_hiddens = [int(h) for h in cfg["head_fcnet_hiddens"]]
        head_act = _activation(cfg["head_fcnet_activation"], "head_fcnet_activation")
        self._cell = int(cfg["lstm_cell_size"])
        self._shared = bool(cfg["vf_share_layers"])
        token_dim = hiddens[-1] if hiddens else in_dim
        make = functools.partial(
            _make_lstm_encoder, functools.partial(_layers, in_dim, hiddens, act, None), token_dim
        )
        self.encoder = _StatefulActorCriticEncoder(
            functools.partial(make, self._cell), shared=self._shared
        )
        gaussian = issubclass(self.action_dist_cls, TorchDiagGaussian)
        if cfg["free_log_std"] and not gaussian:
            raise ValueError(
                f"model_config['free_log_std'] needs a Box action space, got {self.action_space}"
            )
        self.pi = _Head(
            self._cell,
            head_hiddens,
            head_act,
            self.action_dist_cls.required_input_dim(self.action_space),
            clip_log_std=gaussian,
            clip_param=float(cfg["log_std_clip_param"]),
            free_log_std=bool(cfg["free_log_std"]),
        )
        if not self.inference_only:
            self.vf = _Head(
                self._cell,
                head_hiddens,
                head_act,
                1,
                clip_log_std=False,
                clip_param=float(cfg["log_std_clip_param"]),
            )

    def get_initial_state(self) -> dict[str, Any]:
        """Zeros, without a batch axis: ``{"h": (1, cell), "c": (1, cell)}`` per encoder.

        Returns:
            The state for shared layers, or ``{"actor": ..., "critic": ...}``.
        """
        device = self.device
        one = {
            "h": torch.zeros(1, self._cell, device=device),
            "c": torch.zeros(1, self._cell, device=device),
        }
        if self._shared:
            return one
        return {ACTOR: one, CRITIC: {k: v.clone() for k, v in one.items()}}

    def get_non_inference_attributes(self) -> list[str]:
        """The value head (the critic's encoder carries state, so acting needs it).

        Returns:
            ``["vf"]``.
        """
        return ["vf"]

    def _inputs(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, int, Any]:
        """The flattened ``(B * T, features)`` observations, ``B`` and the state in."""
        missing = [k for k in (Columns.OBS, Columns.STATE_IN) if k not in batch]
        if missing:
            raise KeyError(
                f"{type(self).__name__} needs batch[{missing[0]!r}], got keys {sorted(batch)}"
            )
        obs = batch[Columns.OBS]
        first = next(leaves(obs))
        space = self.observation_space
        if first.dim() < 2 or (
            isinstance(space, gym.spaces.Box) and first.dim() != len(space.shape) + 2
        ):
            raise ValueError(
                f"{type(self).__name__} needs observations shaped (B, T, *obs_shape), got "
                f"{tuple(first.shape)} for the observation space {space}"
            )
        b, t = int(first.shape[0]), int(first.shape[1])
        folded = tree_map(lambda x: x.reshape(b * t, *x.shape[2:]), obs)
        return self._preprocess(folded), b, batch[Columns.STATE_IN]

    def _encode(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """``(actor_out, critic_out, state_out)`` of both encoders (one if shared)."""
        x, b, state = self._inputs(batch)
        enc = self.encoder
        if self._shared:
            out, state_out = enc.encoder(x, b, state)
            return out, out, state_out
        actor, actor_state = enc.actor_encoder(x, b, state[ACTOR])
        critic, critic_state = enc.critic_encoder(x, b, state[CRITIC])
        return actor, critic, {ACTOR: actor_state, CRITIC: critic_state}

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        actor, _, state_out = self._encode(batch)
        return {Columns.ACTION_DIST_INPUTS: self.pi(actor), Columns.STATE_OUT: state_out}

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        actor, critic, state_out = self._encode(batch)
        return {
            Columns.ACTION_DIST_INPUTS: self.pi(actor),
            Columns.EMBEDDINGS: critic,
            Columns.STATE_OUT: state_out,
            Columns.VF_PREDS: self.vf(critic).squeeze(-1),
        }

    def compute_values(
        self, batch: dict[str, Any], embeddings: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Value estimates of the observations in ``batch`` (shape ``(B, T)``).

        Args:
            batch: ``Columns.OBS`` ``(B, T, ...)`` and ``Columns.STATE_IN`` (the full
                state; the critic's part is read).
            embeddings: The critic's LSTM output if already computed
                (``forward_train``'s ``Columns.EMBEDDINGS``); saves the encoder pass.

        Returns:
            Shape ``(B, T)``.

        Raises:
            RuntimeError: If the module is inference-only (it has no value head).
        """
        if self.inference_only:
            raise RuntimeError(
                "compute_values() needs the value function, which an inference_only "
                "DefaultLSTMModule does not build"
            )
        if embeddings is None:
            x, b, state = self._inputs(batch)
            if self._shared:
                embeddings, _ = self.encoder.encoder(x, b, state)
            else:
                embeddings, _ = self.encoder.critic_encoder(x, b, state[CRITIC])
        return self.vf(embeddings).squeeze(-1)


def _make_lstm_encoder(make_tokenizer: Any, token_dim: int, cell_size: int) -> _LSTMEncoder:
    return _LSTMEncoder(make_tokenizer(), token_dim, cell_size)
