"""Several Q networks of one shape run as one: SAC's twin critics (and their target copies) with
each layer's weights stacked, so that both critics take one batched matmul per layer instead of
one each.

On a CPU the small critics of continuous control (64-wide) are bound by the cost of each
operation, not by arithmetic, so half the operations is most of the gain (docs/benchmarks.md,
"Learner roofline", measures the whole update). The
members' own layout stays the checkpoint format: ``member_state_dict`` and ``to_members`` give
what separate ``SoftQNetwork``s and their optimizer held, so checkpoints are the same as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tianji_dask.algos.gaussian import SoftQNetwork


class QEnsemble(nn.Module):
    """``len(members)`` Q(s, a) networks evaluated together: ``forward`` returns [n, B]. Made from
    ``SoftQNetwork``s of one shape, whose weights it takes (so it starts where they were made);
    their encoders, where a config gives its own, stay separate modules, run one after another."""

    def __init__(self, members: Sequence[SoftQNetwork]):
        super().__init__()
        self.n = len(members)
        first = members[0]
        self.encoders = nn.ModuleList([m.encoder for m in members]) if first.encoder is not None else None
        #: the members' Linear layers in order, by their key prefix in a member's state dict
        self._layer_keys = [f"trunk.{i}" for i, m in enumerate(first.trunk) if isinstance(m, nn.Linear)] + ["head"]
        with torch.no_grad():
            layers = [[m.get_submodule(key) for key in self._layer_keys] for m in members]
            # weights [n, in, out] for x [n, B, in] @ w; biases [n, 1, out]
            self.weights = nn.ParameterList(torch.stack([ls[j].weight.T for ls in layers]).contiguous()
                                            for j in range(len(self._layer_keys)))
            self.biases = nn.ParameterList(torch.stack([ls[j].bias for ls in layers]).unsqueeze(1).contiguous()
                                           for j in range(len(self._layer_keys)))
        self._encoder_keys = list(first.encoder.state_dict()) if first.encoder is not None else []

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q of every member, [n, B], for flat float32 ``obs`` [B, obs_dim] and ``actions`` [B, A]."""
        if self.encoders is None:
            x = torch.cat([obs, actions], 1).expand(self.n, -1, -1)
        else:
            x = torch.stack([torch.cat([enc(obs), actions], 1) for enc in self.encoders])
        last = len(self.weights) - 1
        for j, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if j < last:
                x = torch.relu(x)
        return x.squeeze(-1)

    # ---- the members' layout: checkpoints and optimizer state ----------------------------------
    def member_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Member ``i``'s weights as its ``SoftQNetwork`` held them (copies)."""
        out = {} if self.encoders is None else {f"encoder.{k}": v.detach().clone()
                                                for k, v in self.encoders[i].state_dict().items()}
        for key, (w, b) in zip(self._layer_keys, self._member_layers(self.weights, self.biases, i)):
            out[f"{key}.weight"], out[f"{key}.bias"] = w.detach(), b.detach()
        return out

    @staticmethod
    def _member_layers(weights, biases, i: int):
        """Member ``i``'s (weight [out, in], bias [out]) of each layer, copied out of stacked
        ``weights`` [n, in, out] and ``biases`` [n, 1, out] (parameters or moments shaped so)."""
        return [(w[i].T.clone(memory_format=torch.contiguous_format), b[i, 0].clone()) for w, b in zip(weights, biases)]

    def load_member_state_dict(self, i: int, state: dict[str, torch.Tensor]) -> None:
        """Set member ``i`` from a ``SoftQNetwork``'s state dict of the same shape."""
        expected = {f"encoder.{k}" for k in self._encoder_keys} | {f"{k}.{p}" for k in self._layer_keys for p in ("weight", "bias")}
        if set(state) != expected:
            raise ValueError(f"Q network weights do not match its shape: got {sorted(state)}, expected {sorted(expected)}")
        if self.encoders is not None:
            self.encoders[i].load_state_dict({k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")})
        with torch.no_grad():
            for key, w, b in zip(self._layer_keys, self.weights, self.biases):
                w[i].copy_(torch.as_tensor(state[f"{key}.weight"]).T)
                b[i, 0].copy_(torch.as_tensor(state[f"{key}.bias"]))

    def _encoder_params(self) -> int:
        return 0 if self.encoders is None else len(list(self.encoders[0].parameters()))

    def to_members(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Tensors shaped as ``self.parameters()`` (an optimizer's moments, say: the encoders', then
        every layer's weight, then every layer's bias) re-laid as the separate members'
        parameters, one member after another."""
        k, n, layers = self._encoder_params(), self.n, len(self._layer_keys)
        enc, weights, biases = list(tensors[: n * k]), tensors[n * k:n * k + layers], tensors[n * k + layers:]
        out = []
        for i in range(n):
            out += [t.clone() for t in enc[i * k:(i + 1) * k]]
            out += [t for layer in self._member_layers(weights, biases, i) for t in layer]
        return out

    def from_members(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The inverse of ``to_members``."""
        k, n, per = self._encoder_params(), self.n, self._encoder_params() + 2 * len(self._layer_keys)
        if len(tensors) != n * per:
            raise ValueError(f"{len(tensors)} tensors for {n} Q networks of {per} parameters each")
        members = [list(tensors[i * per:(i + 1) * per]) for i in range(n)]
        layers = range(len(self._layer_keys))
        return ([t for m in members for t in m[:k]]
                + [torch.stack([torch.as_tensor(m[k + 2 * j]).T for m in members]).contiguous() for j in layers]
                + [torch.stack([torch.as_tensor(m[k + 2 * j + 1]) for m in members]).unsqueeze(1).contiguous() for j in layers])
