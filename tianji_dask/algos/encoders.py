"""Observation encoders: which observations are images, and the convolutional encoders that
turn them into features. The Nature-DQN encoder for frames such as Atari's stacked 84x84 uint8
(C, H, W); the MinAtar paper's small one for grids too small for it (under 36x36), such as
MinAtar's 10x10xC bool (H, W, C). Flat Box observations need none (an MLP takes them); Dict and
Tuple observations a multi-input encoder (``multi_input.py``). A config's ``encoder``,
``"module:factory"``, replaces them all with the user's own network."""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import AfterValidator
from torch import nn

from tianji_dask.chunk import tree_leaves
from tianji_dask.importing import load_object

ALLOWED = ("'module:factory', a function of an importable module taking the observation space and "
           "returning (torch.nn.Module, output width)")


@dataclass(frozen=True)
class ImageObs:
    """An image observation space as the networks take it: the env's array ``shape``, whether
    its channels come last (H, W, C) or first (C, H, W), and the factor to [0, 1] (1/255 for
    uint8 pixels, 1/high for uint8 codes bounded lower, such as MiniGrid's, 1 for bool grids)."""

    shape: tuple[int, int, int]
    channels_last: bool = False
    scale: float = 1.0 / 255.0

    @property
    def chw(self) -> tuple[int, int, int]:
        h, w, c = self.shape
        return (c, h, w) if self.channels_last else self.shape

    @staticmethod
    def of(obs_space) -> ImageObs | None:
        """The image description of a Box space, or None for a flat one. Images: 3-d uint8 or
        bool. Channels come first when the first dimension is smaller than the last (Atari's
        stacked frames, 4x84x84), else last (gymnasium's convention: MinAtar's 10x10xC)."""
        shape = tuple(int(d) for d in obs_space.shape)
        if len(shape) != 3 or obs_space.dtype not in (np.uint8, np.bool_):
            return None
        high = float(np.max(obs_space.high)) if obs_space.dtype == np.uint8 else 1.0
        return ImageObs(shape, channels_last=not shape[0] < shape[2], scale=1.0 / max(1.0, min(high, 255.0)))


def space_leaves(space) -> dict:
    """The leaf spaces of a Dict or Tuple space (nested), by path (keys and indices joined with
    dots, as ``chunk.obs_leaves`` names an observation's leaves); any other space is its own one
    leaf, path "". ValueError for a Dict key that is not a string or holds a dot."""
    def children(sub):
        kids = getattr(sub, "spaces", None)
        if isinstance(kids, dict):
            bad = next((k for k in kids if not isinstance(k, str) or "." in k or not k), None)
            if bad is not None:
                raise ValueError(f"observation key {bad!r}: allowed: non-empty strings without dots")
        return kids if isinstance(kids, (dict, tuple)) else None

    return tree_leaves(space, children)


def _as_image(obs: torch.Tensor, image: ImageObs) -> torch.Tensor:
    """Observations (possibly flattened; uint8, bool or float) as float (B, C, H, W) in [0, 1]."""
    x = obs.reshape(-1, *image.shape).float()
    if image.channels_last:
        x = x.permute(0, 3, 1, 2)
    return x * image.scale if image.scale != 1.0 else x


class NatureCNN(nn.Module):
    """The convolutional encoder of Mnih et al. 2015 (Nature DQN): pixels in [0, 255] (or an
    ``ImageObs``'s range) -> 512 features. Input may come flattened; it is reshaped to the
    image's shape (and channels moved first). Frames must be at least 36x36."""

    features = 512
    min_size = 36  # what its strides and kernels need

    def __init__(self, shape: tuple[int, int, int] | ImageObs):
        super().__init__()
        self.image = shape if isinstance(shape, ImageObs) else ImageObs(tuple(shape))
        self.shape = self.image.shape
        c, h, w = self.image.chw
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, c, h, w)).shape[1]
        self.fc = nn.Linear(flat, self.features)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(self.convs(_as_image(obs, self.image))))


class MinAtarCNN(nn.Module):
    """The network of Young & Tian 2019 (MinAtar) up to its heads: one 3x3 convolution, 16
    channels, stride 1, ReLU, then 128 ReLU units. For small grids such as MinAtar's 10x10xC
    bool observations (cast to float32); input may come flattened."""

    features = 128

    def __init__(self, image: ImageObs):
        super().__init__()
        self.image = image
        c, h, w = image.chw
        self.conv = nn.Conv2d(c, 16, 3, stride=1)
        self.fc = nn.Linear(16 * (h - 2) * (w - 2), self.features)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(_as_image(obs, self.image)))
        return torch.relu(self.fc(x.flatten(1)))


def check_encoder_spec(spec: str | None) -> str | None:
    """A config's ``encoder``: None, or a spec whose module imports and whose attribute is
    callable. ValueError, one line, otherwise."""
    if spec is not None:
        factory = load_object(spec, ALLOWED)
        if not callable(factory):
            raise ValueError(f"{spec} is {_brief(factory)}, not callable; allowed: {ALLOWED}")
    return spec


#: the type of the configs' ``encoder`` field
EncoderSpec = Annotated[str | None, AfterValidator(check_encoder_spec)]


class CustomEncoder(nn.Module):
    """The network an ``encoder`` factory made, as the algorithms' encoder: observations (possibly
    flattened, of any dtype) go to it as float32 (B, *obs_space.shape), values as the env gives
    them (bool as 0/1, uint8 pixels unscaled), and come out as (B, ``features``). For a Dict or
    Tuple space, a dict ``{path: float32 (B, *leaf shape)}`` of its leaves (``space_leaves``' paths;
    an ``action_mask`` leaf is not among them: it masks the actions)."""

    def __init__(self, module: nn.Module, shape: tuple[int, ...] | dict, features: int):
        super().__init__()
        self.module = module
        self.shape = shape
        self.features = features

    def forward(self, obs) -> torch.Tensor:
        if isinstance(self.shape, dict):
            return self.module({k: obs[k].reshape(-1, *s).float() for k, s in self.shape.items()})
        return self.module(obs.reshape(-1, *self.shape).float())


@dataclass(frozen=True)
class EncoderFactory:
    """What the networks take as ``obs_dim`` when a config names an ``encoder``: each ``encoder()``
    call makes a new instance with ``factory(obs_space)``."""

    spec: str
    obs_space: Any

    def build(self) -> tuple[CustomEncoder, int]:
        """(the factory's network, its output width), checked: a torch.nn.Module and an int > 0,
        and a batch of two zero observations comes out as (2, width). ValueError, one line,
        otherwise."""
        leaves = space_leaves(self.obs_space)
        structured = list(leaves) != [""]
        shape = ({k: tuple(int(d) for d in s.shape) for k, s in leaves.items()} if structured
                 else tuple(int(d) for d in self.obs_space.shape))
        where = f"encoder: {self.spec}(obs_space)"
        try:
            made = load_object(self.spec, ALLOWED)(self.obs_space)
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's factory may raise anything
            raise ValueError(f"{where} raised {type(err).__name__}: {_line(err)}") from None
        if not (isinstance(made, (tuple, list)) and len(made) == 2):
            raise ValueError(f"{where} returned {_brief(made)}; allowed: {ALLOWED}")
        module, width = made
        if not isinstance(module, nn.Module):
            raise ValueError(f"{where} returned ({_brief(module)}, {_brief(width)}): the first must be a torch.nn.Module; "
                             f"allowed: {ALLOWED}")
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width <= 0:
            raise ValueError(f"{where} returned (module, {width!r}): the output width must be an int > 0")
        width = int(width)
        sample = ({k: torch.zeros((2, *s), dtype=torch.float32) for k, s in shape.items()} if structured
                  else torch.zeros((2, *shape), dtype=torch.float32))
        described = {k: tuple(v.shape) for k, v in sample.items()} if structured else tuple(sample.shape)
        training = module.training
        module.eval()  # no dropout draws, no batch-norm statistics from the zeros
        try:
            with torch.no_grad():
                out = module(sample)
        except Exception as err:  # noqa: BLE001
            raise ValueError(f"{where}: its module fails on float32 observations {described}: "
                             f"{type(err).__name__}: {_line(err)}") from None
        finally:
            module.train(training)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, width):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else _brief(out)
            raise ValueError(f"{where}: its module maps float32 observations {described} to {got}, "
                             f"not (2, {width}) (the output width it returned)")
        return CustomEncoder(module, shape, width), width


def _brief(value) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 60 else f"a {type(value).__name__}"


def _line(err: Exception) -> str:
    return " ".join(str(err).split())


def network_input(spec: str | None, obs_space, builtin):
    """What the networks take as ``obs_dim``: the factory ``spec`` names for ``obs_space`` (a Dict
    less its ``action_mask``: ``builtin.space``), or without one ``builtin`` (the flat size,
    ``ImageObs`` or ``multi_input.DictObs`` that ``spaces.check_spaces`` found)."""
    if spec is None:
        return builtin
    return EncoderFactory(spec, getattr(builtin, "space", obs_space))


def encoder(obs_dim, ortho: bool = False) -> tuple[nn.Module | None, int]:
    """(encoder or None, width of what the MLP trunk receives). A config's own encoder is made by
    its factory, anew at each call; images smaller than the Nature CNN takes (MinAtar's 10x10)
    get MinAtar's network; a bare tuple is (C, H, W) uint8. ``ortho``: the built-in encoders'
    layers get orthogonal weights of gain sqrt(2) and zero biases, as CleanRL's and SB3's PPO
    initialise theirs (otherwise torch's defaults, as the DQN papers' networks); a config's own
    encoder keeps the initialisation its factory gave it. A Dict or Tuple observation
    (``multi_input.DictObs``) builds its multi-input encoder."""
    if isinstance(obs_dim, EncoderFactory):
        return obs_dim.build()
    if not isinstance(obs_dim, (int, tuple, ImageObs)):  # a structured input (multi_input.DictObs) builds its own
        return obs_dim.build(ortho)
    if isinstance(obs_dim, tuple):
        obs_dim = ImageObs(tuple(obs_dim))
    if isinstance(obs_dim, ImageObs):
        _, h, w = obs_dim.chw
        if min(h, w) < NatureCNN.min_size:
            if min(h, w) < 3:
                raise ValueError(f"image observations {obs_dim.shape}: at least 3x3 needed")
            enc, width = MinAtarCNN(obs_dim), MinAtarCNN.features
        else:
            enc, width = NatureCNN(obs_dim), NatureCNN.features
        if ortho:
            for layer in enc.modules():
                if isinstance(layer, (nn.Conv2d, nn.Linear)):
                    nn.init.orthogonal_(layer.weight, math.sqrt(2))
                    nn.init.zeros_(layer.bias)
        return enc, width
    return None, obs_dim


def encode(enc: nn.Module | None, obs: torch.Tensor) -> torch.Tensor:
    """Features for the trunk: the encoder's, or the flattened float observation."""
    return enc(obs) if enc is not None else obs.flatten(1).float()
