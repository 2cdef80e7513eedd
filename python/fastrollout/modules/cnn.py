"""``DefaultCNNModule``: the default actor-critic module for image observations.

RLlib 2.60's catalog gives a 3-D ``Box`` observation (height, width, channels) a CNN
encoder instead of an MLP; its default PPO torch module is then a policy CNN and a value
CNN (PPO's ``vf_share_layers=False``), each flattened, and the same linear (or MLP) pi and
vf heads as for vector observations. This module builds those layers with RLlib's
parameter names (``encoder.actor_encoder.net.0.cnn.1.weight``, ``pi.net.mlp.0.weight``,
...), so an RLlib default PPO module's state loads into it and both compute the same
outputs.

The encoder, per ``model_config["conv_filters"]`` entry ``[out_channels, kernel, stride]``
or ``[out_channels, kernel, stride, padding]`` (``kernel`` and ``stride`` an int or a
``[height, width]`` pair, ``padding`` ``"same"`` (the default) or ``"valid"``): a zero
padding layer (``"same"`` only, split as TensorFlow's SAME with the odd pixel after), the
``Conv2d`` and ``conv_activation``. Images come in channels-last, go through the
convolutions channels-first and are flattened channels-last, as RLlib's ``TorchCNN``.
Without ``conv_filters`` the filters are RLlib's defaults for 96, 84, 64, 42 and 10 pixel
images.

One deliberate difference: observations of any dtype are cast to float32 (RLlib's module
fails on ``uint8`` images; neither scales them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import torch
from torch import nn

from fastrollout.modules.default import (
    _UNSUPPORTED_AT_DEFAULT,
    DEFAULT_MODEL_CONFIG,
    DefaultMLPModule,
    _activation,
)

__all__ = ["CNN_MODEL_CONFIG", "DefaultCNNModule", "default_conv_filters"]

#: The settings ``DefaultCNNModule`` reads, with their defaults (RLlib's names).
#: ``fcnet_hiddens`` and ``fcnet_activation`` are accepted and unused, as in RLlib, whose
#: CNN encoder has no dense layers.
CNN_MODEL_CONFIG: dict[str, Any] = {
    **DEFAULT_MODEL_CONFIG,
    "conv_filters": None,
    "conv_activation": "relu",
}

# RLlib's default filters by image size (``ray.rllib.models.utils.get_filter_config``),
# checked in this order.
_DEFAULT_FILTERS: tuple[tuple[int, list[list[Any]]], ...] = (
    (96, [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 2]]),
    (84, [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1]]),
    (64, [[16, [4, 4], 2], [32, [4, 4], 2], [64, [4, 4], 2], [128, [4, 4], 2]]),
    (42, [[16, [4, 4], 2], [32, [4, 4], 2], [256, [11, 11], 1]]),
    (10, [[16, [5, 5], 2], [32, [5, 5], 2]]),
)


def default_conv_filters(shape: Sequence[int]) -> list[list[Any]]:
    """RLlib's default ``conv_filters`` for an image of this shape.

    As RLlib, a size matches when the first two or the last two dimensions are it.

    Args:
        shape: The observation shape, e.g. ``(84, 84, 4)``.

    Returns:
        The filter specs (a new list).

    Raises:
        ValueError: If RLlib has no default for this size (names ``conv_filters``).
    """
    dims = [int(d) for d in shape]
    for size, filters in _DEFAULT_FILTERS:
        if dims[:2] == [size, size] or dims[1:] == [size, size]:
            return [list(f) for f in filters]
    sizes = ", ".join(f"{s}x{s}" for s, _ in _DEFAULT_FILTERS)
    raise ValueError(
        f"no default conv_filters for image observations of shape {tuple(dims)} (defaults "
        f"exist for {sizes}); set model_config['conv_filters'], e.g. "
        "[[16, 4, 2], [32, 4, 2]], or give your own module with "
        "rl_module(rl_module_spec=RLModuleSpec(module_class=...))"
    )


def _pair(value: Any, what: str) -> tuple[int, int]:
    """An int or a pair of ints >= 1 as a pair (``what`` names it in errors)."""
    items = [value, value] if isinstance(value, int) else value
    if (
        not isinstance(items, Sequence)
        or len(items) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in items)
    ):
        raise ValueError(f"{what} must be an int >= 1 or a pair of them, got {value!r}")
    return int(items[0]), int(items[1])


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int, int]:
    """Padding before and after one image dimension, and its size after the conv.

    TensorFlow's SAME rule as RLlib computes it: the output is ``ceil(size / stride)``;
    the padding total is not clamped at 0 (a kernel smaller than its stride crops),
    and its odd pixel goes after.
    """
    out = math.ceil(size / stride)
    total = (out - 1) * stride + kernel - size
    before = total // 2
    return before, total - before, out


#: One convolution of a plan: zero padding (left, right, top, bottom) or None for
#: "valid", in and out channels, kernel and stride (height, width).
_Conv = tuple[tuple[int, int, int, int] | None, int, int, tuple[int, int], tuple[int, int]]


def _conv_plan(shape: Sequence[int], filters: Any) -> tuple[tuple[_Conv, ...], int]:
    """The convolutions ``conv_filters`` describe for an image, and the flattened output size.

    Args:
        shape: The image shape ``(height, width, channels)``.
        filters: ``model_config["conv_filters"]``.

    Returns:
        ``(convolutions, latent_dim)``.

    Raises:
        ValueError: For a malformed filter spec, or filters that leave no pixels (both
            name ``conv_filters``).
    """
    if isinstance(filters, str) or not isinstance(filters, Sequence) or not filters:
        raise ValueError(
            "model_config['conv_filters'] must be a non-empty list of [out_channels, "
            f"kernel, stride(, padding)], got {filters!r}"
        )
    height, width, channels = (int(d) for d in shape)
    plan: list[_Conv] = []
    for i, spec in enumerate(filters):
        what = f"model_config['conv_filters'][{i}]"
        if isinstance(spec, str) or not isinstance(spec, Sequence) or len(spec) not in (3, 4):
            raise ValueError(
                f"{what} must be [out_channels, kernel, stride] or [out_channels, kernel, "
                f"stride, padding], got {spec!r}"
            )
        out_channels, kernel, stride = spec[0], spec[1], spec[2]
        padding = spec[3] if len(spec) == 4 else "same"
        if isinstance(out_channels, bool) or not isinstance(out_channels, int) or out_channels < 1:
            raise ValueError(f"{what}: out_channels must be an int >= 1, got {out_channels!r}")
        kh, kw = _pair(kernel, f"{what}: kernel")
        sh, sw = _pair(stride, f"{what}: stride")
        pad: tuple[int, int, int, int] | None = None
        if padding == "same":
            top, bottom, out_h = _same_padding(height, kh, sh)
            left, right, out_w = _same_padding(width, kw, sw)
            pad = (left, right, top, bottom)
        elif padding == "valid":
            out_h = math.ceil((height - kh + 1) / sh)
            out_w = math.ceil((width - kw + 1) / sw)
        else:
            raise ValueError(f'{what}: padding must be "same" or "valid", got {padding!r}')
        if out_h < 1 or out_w < 1:
            raise ValueError(
                f"{what} leaves no pixels of the {height}x{width} input "
                f"(kernel {kh}x{kw}, stride {sh}x{sw}, padding {padding!r})"
            )
        plan.append((pad, channels, out_channels, (kh, kw), (sh, sw)))
        height, width, channels = out_h, out_w, out_channels
    return tuple(plan), height * width * channels


class _ChannelsLastCNN(nn.Module):
    """Holds ``cnn``; takes and returns channels-last images (as RLlib's ``TorchCNN``)."""

    def __init__(self, cnn: nn.Sequential) -> None:
        super().__init__()
        self.cnn = cnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cnn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class _CNNEncoder(nn.Module):
    """``net`` = the CNN then a flatten (parameter names ``net.0.cnn.N``, as RLlib's)."""

    def __init__(self, cnn: nn.Sequential) -> None:
        super().__init__()
        self.net = nn.Sequential(_ChannelsLastCNN(cnn), nn.Flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _cnn_encoder(plan: Sequence[_Conv], activation: Callable[[], nn.Module] | None) -> nn.Module:
    """A CNN encoder from a :func:`_conv_plan` (RLlib's layer order: pad, conv, activation)."""
    layers: list[nn.Module] = []
    for pad, in_channels, out_channels, kernel, stride in plan:
        if pad is not None:
            layers.append(nn.ZeroPad2d(pad))
        layers.append(nn.Conv2d(in_channels, out_channels, kernel, stride))
        if activation is not None:
            layers.append(activation())
    return _CNNEncoder(nn.Sequential(*layers))


def _float_images(x: torch.Tensor) -> torch.Tensor:
    """A batch of images as float32 (as they come when they are already)."""
    return x if x.dtype == torch.float32 else x.float()


class DefaultCNNModule(DefaultMLPModule):
    """Actor-critic CNN, the default module for image observations (RLlib's PPO module).

    The same module as :class:`DefaultMLPModule` (outputs, heads, ``compute_values``,
    inference-only form, state) with CNN encoders for a 3-D ``Box`` observation space
    ``(height, width, channels)``.

    ``model_config`` keys (RLlib's names): ``conv_filters`` (default: RLlib's filters
    for the image size), ``conv_activation`` (``"relu"``), ``head_fcnet_hiddens``
    (``[]``), ``head_fcnet_activation`` (``"relu"``), ``vf_share_layers`` (False),
    ``free_log_std`` (False), ``log_std_clip_param`` (20.0); ``fcnet_hiddens`` and
    ``fcnet_activation`` are accepted and unused, as in RLlib. Other keys of RLlib's
    DefaultModelConfig are accepted at their "off" value only.

    Raises:
        TypeError: For an observation space that is not a 3-D Box, or an action space
            it cannot handle.
        ValueError: For a bad model config value, or an image size without default
            filters and no ``conv_filters`` (named).
    """

    _MODEL_CONFIG: ClassVar[dict[str, Any]] = CNN_MODEL_CONFIG
    _OFF_ONLY: ClassVar[dict[str, Any]] = {
        k: v for k, v in _UNSUPPORTED_AT_DEFAULT.items() if k not in CNN_MODEL_CONFIG
    }

    def _encoder_factory(self, cfg: Mapping[str, Any]) -> tuple[Callable[[], nn.Module], int]:
        space = self.observation_space
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 3):
            raise TypeError(
                f"{type(self).__name__} needs a 3-D Box observation space (height, width, "
                f"channels), got {space}"
            )
        filters = cfg["conv_filters"] or default_conv_filters(space.shape)
        activation = _activation(cfg["conv_activation"], "conv_activation")
        plan, latent = _conv_plan(space.shape, filters)
        self._preprocess = _float_images
        return functools.partial(_cnn_encoder, plan, activation), latent

    def _plain_actor_layers(self) -> tuple[nn.Module, ...] | None:
        """None: the layer-by-layer path serves MLP encoders only.

        A CNN's forward time is in its convolutions, not in the module calls that path
        saves.
        """
        return None
