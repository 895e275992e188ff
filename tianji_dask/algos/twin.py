"""SAC's twin Q networks as one module: the two critics' layers stacked, weights (2, out, in) and
biases (2, 1, out), applied to both at once by batched matrix products (``torch.baddbmm``), so a
pass through both costs the ops of one. Member m computes what a ``SoftQNetwork`` with its weights
computes (same initialisation, same layout as ``nn.Linear``'s, one slice each); ``pair_state``
maps two ``SoftQNetwork`` state dicts (or any dicts of their parameters, e.g. optimizer moments)
onto this module's, for checkpoints written when the critics were two networks.

On one CPU thread the stacked form was faster than ``torch.func.stack_module_state`` + ``vmap``
(whose per-call overhead outweighs the small networks' own ops) for 64-64 and 256-256 critics.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tianji_dask.algos.encoders import EncoderFactory
from tianji_dask.algos.gaussian import SoftQNetwork

MEMBERS = 2


class TwinQNetwork(nn.Module):
    """Q_1(s, a) and Q_2(s, a) for actions in [-1, 1], stacked: ``forward`` returns (2, B). Each
    member is initialised as a ``SoftQNetwork`` (drawn in the same order as two of them); with an
    own encoder each member keeps its own instance (``encoders[m]``)."""

    def __init__(self, obs_dim: int | EncoderFactory, action_dim: int, hidden: Sequence[int]):
        super().__init__()
        pair = [SoftQNetwork(obs_dim, action_dim, hidden) for _ in range(MEMBERS)]
        self.n_hidden = len(hidden)
        self.encoders = None if pair[0].encoder is None else nn.ModuleList(q.encoder for q in pair)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for layer in range(self.n_hidden + 1):
            linears = [self._linear(q, layer) for q in pair]
            self.weights.append(nn.Parameter(torch.stack([lin.weight.detach() for lin in linears])))
            self.biases.append(nn.Parameter(torch.stack([lin.bias.detach() for lin in linears]).unsqueeze(1)))

    def _linear(self, q: SoftQNetwork, layer: int) -> nn.Linear:
        return q.head if layer == self.n_hidden else q.trunk[2 * layer]

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Both members' Q of flat float32 ``obs`` [B, obs_dim] and ``actions`` [B, A]: (2, B)."""
        if self.encoders is None:
            x = torch.cat([obs, actions], 1).expand(MEMBERS, -1, -1)
        else:
            features = torch.stack([enc(obs) for enc in self.encoders])
            x = torch.cat([features, actions.expand(MEMBERS, -1, -1)], 2)
        for layer, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w.transpose(1, 2))
            if layer < self.n_hidden:
                x = torch.relu(x)
        return x.squeeze(-1)

    # ---- the two-network format ----------------------------------------------------------
    def member_parameter_names(self) -> list[str]:
        """A ``SoftQNetwork``'s parameter names, in its ``parameters()`` order."""
        names = [] if self.encoders is None else [f"encoder.{name}" for name, _ in self.encoders[0].named_parameters()]
        for layer in range(self.n_hidden):
            names += [f"trunk.{2 * layer}.weight", f"trunk.{2 * layer}.bias"]
        return names + ["head.weight", "head.bias"]

    def pair_state(self, first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This module's state (or the part of it the dicts cover) from two ``SoftQNetwork``-keyed
        dicts of the same keys, member 1's and member 2's. KeyError on a key of neither form."""
        if first.keys() != second.keys():
            raise KeyError(f"the two critics' keys differ: {sorted(first.keys() ^ second.keys())}")
        out = {}
        for key in first:
            pair = (first[key], second[key])
            if key.startswith("encoder."):
                for m, tensor in enumerate(pair):
                    out[f"encoders.{m}.{key[len('encoder.'):]}"] = tensor
                continue
            layer = self._layer_of(key)
            if key.endswith(".weight"):
                out[f"weights.{layer}"] = torch.stack(pair)
            else:
                out[f"biases.{layer}"] = torch.stack(pair).unsqueeze(1)
        return out

    def _layer_of(self, key: str) -> int:
        module, _, kind = key.rpartition(".")
        if kind in ("weight", "bias"):
            if module == "head":
                return self.n_hidden
            prefix, _, index = module.partition(".")
            if prefix == "trunk" and index.isdigit() and int(index) % 2 == 0 and int(index) // 2 < self.n_hidden:
                return int(index) // 2
        raise KeyError(f"not a key of a SoftQNetwork of {self.n_hidden} hidden layer(s): {key!r}")
