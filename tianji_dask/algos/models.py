"""Networks for the algorithms: a Q-network (optionally dueling) and an actor-critic.

Flat Box observations go through an MLP; image observations (3-d uint8 or bool Boxes) through a
convolutional encoder first: the Nature-DQN one for frames such as Atari's stacked 84x84 uint8
(C, H, W), the MinAtar paper's small one for grids too small for that (under 36x36), such as
MinAtar's 10x10xC bool (H, W, C). Actions are Discrete here; continuous actions' networks are in ``gaussian.py``
(PPO, IMPALA) and ``sac.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tianji_dask.algos.encoders import ImageObs, check_spaces, encode, encoder  # noqa: F401 - the networks' API

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights and constant bias, as in CleanRL's PPO."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], activation: str = "relu", ortho: bool = False) -> nn.Sequential:
    """Hidden layers only (each Linear followed by the activation); output width is hidden[-1]."""
    act = ACTIVATIONS[activation]
    layers: list[nn.Module] = []
    for width in hidden:
        lin = nn.Linear(in_dim, width)
        layers += [layer_init(lin) if ortho else lin, act()]
        in_dim = width
    return nn.Sequential(*layers)


def chain(modules: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``modules(x)`` without nn.Module's per-call machinery (hooks etc.), whose overhead is a
    large part of a small network's forward pass on CPU."""
    for m in modules:
        kind = type(m)
        if kind is nn.Linear:
            x = F.linear(x, m.weight, m.bias)
        elif kind is nn.ReLU:
            x = torch.relu(x)
        elif kind is nn.Tanh:
            x = torch.tanh(x)
        else:
            x = m(x)
    return x


class NumpyMLP:
    """Inference of a chain of Linear/ReLU/Tanh modules in numpy, reading the torch parameters
    through zero-copy views (so in-place updates, ``load_state_dict`` and optimiser steps are
    seen at once). For the small batches of the env-stepping loop this is about twice as fast as
    a torch forward pass, whose per-op overhead dominates there."""

    def __init__(self, *modules: nn.Module):
        self.layers: list[tuple] = []
        for m in modules:
            for layer in (m if isinstance(m, nn.Sequential) else [m]):
                if isinstance(layer, nn.Linear):
                    self.layers.append(("linear", layer.weight.detach().numpy().T, layer.bias.detach().numpy()))
                elif isinstance(layer, nn.ReLU):
                    self.layers.append(("relu",))
                elif isinstance(layer, nn.Tanh):
                    self.layers.append(("tanh",))
                else:
                    raise TypeError(f"NumpyMLP: unsupported layer {layer}")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.layers and self.layers[0][0] != "linear":
            x = x.copy()  # activations work in place: never on the caller's array
        for layer in self.layers:
            if layer[0] == "linear":
                x = x @ layer[1]
                x += layer[2]
            elif layer[0] == "relu":
                np.maximum(x, 0.0, out=x)
            else:
                np.tanh(x, out=x)
        return x


def as_batch(obs) -> np.ndarray:
    """Observations as a float32 [B, obs_dim] array (no copy when they already are)."""
    obs = np.asarray(obs, dtype=np.float32)
    return obs.reshape(len(obs), -1)


def sample_categorical(logits: np.ndarray, rng: np.random.Generator, greedy: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(actions, float32 log-probabilities of those actions) for a batch of categorical logits
    [B, A]: sampled by inverse CDF, or the most likely action with ``greedy``. Overwrites
    ``logits``."""
    logits -= logits.max(axis=1, keepdims=True)
    logp_all = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    if greedy:
        actions = logp_all.argmax(axis=1)
    else:
        cdf = np.cumsum(np.exp(logp_all), axis=1)
        u = rng.random((len(logits), 1), dtype=np.float32) * cdf[:, -1:]
        actions = np.minimum((cdf < u).sum(axis=1), logits.shape[1] - 1)
    logp = logp_all[np.arange(len(logits)), actions]
    return actions, logp.astype(np.float32, copy=False)


class QNetwork(nn.Module):
    """Q(s, ·) for Discrete actions; with ``dueling`` Q = V + A - mean(A)."""

    def __init__(self, obs_dim: int | ImageObs, n_actions: int, hidden: Sequence[int] = (64, 64),
                 activation: str = "relu", dueling: bool = False):
        super().__init__()
        self.encoder, in_dim = encoder(obs_dim)
        self.trunk = mlp(in_dim, hidden, activation)
        width = hidden[-1] if hidden else in_dim
        self.dueling = dueling
        self._np = None  # numpy views for numpy_forward, made on first use
        if dueling:
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, n_actions)
        else:
            self.head = nn.Linear(width, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = chain(self.trunk, encode(self.encoder, obs))
        if self.dueling:
            adv = F.linear(h, self.advantage.weight, self.advantage.bias)
            return F.linear(h, self.value.weight, self.value.bias) + adv - adv.mean(dim=1, keepdim=True)
        return F.linear(h, self.head.weight, self.head.bias)

    def __getstate__(self):
        # numpy views would be pickled as copies, detached from the parameters: rebuild them
        return {**self.__dict__, "_np": None}

    def _apply(self, *args, **kwargs):
        self._np = None  # .to(device) and friends replace the parameters the views read
        return super()._apply(*args, **kwargs)

    def numpy_forward(self, obs: np.ndarray) -> np.ndarray:
        """``forward`` in numpy, for acting (see NumpyMLP); through torch with an image encoder."""
        if self._np is None:
            device = next(self.parameters()).device
            if self.encoder is not None or device.type != "cpu":  # convolutions, or weights off the CPU: torch
                self._np = device
        if isinstance(self._np, torch.device):
            with torch.no_grad():
                return self.forward(torch.from_numpy(np.ascontiguousarray(obs)).to(self._np)).cpu().numpy()
        if self._np is None:
            if self.dueling:
                self._np = (NumpyMLP(self.trunk), NumpyMLP(self.value), NumpyMLP(self.advantage))
            else:
                self._np = (NumpyMLP(self.trunk, self.head),)
        if not self.dueling:
            return self._np[0](as_batch(obs))
        trunk, value, advantage = self._np
        h = trunk(as_batch(obs))
        adv = advantage(h)
        return value(h) + adv - adv.mean(axis=1, keepdims=True)


class ActorCritic(nn.Module):
    """Categorical policy logits and state values, with separate trunks (CleanRL's default) or a
    shared one. Orthogonal init: hidden gain sqrt(2), policy head 0.01, value head 1."""

    def __init__(self, obs_dim: int | ImageObs, n_actions: int, hidden: Sequence[int] = (64, 64),
                 activation: str = "tanh", shared: bool = False):
        super().__init__()
        self.actor_encoder, in_dim = encoder(obs_dim, ortho=True)
        self.critic_encoder = None if shared else encoder(obs_dim, ortho=True)[0]
        width = hidden[-1] if hidden else in_dim
        self.shared = shared
        self._np_actor = None  # numpy views for numpy_logits, made on first use
        self.actor_trunk = mlp(in_dim, hidden, activation, ortho=True)
        self.critic_trunk = None if shared else mlp(in_dim, hidden, activation, ortho=True)
        self.actor_head = layer_init(nn.Linear(width, n_actions), gain=0.01)
        self.critic_head = layer_init(nn.Linear(width, 1), gain=1.0)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        h = chain(self.actor_trunk, encode(self.actor_encoder, obs))
        return F.linear(h, self.actor_head.weight, self.actor_head.bias)

    def __getstate__(self):
        # numpy views would be pickled as copies, detached from the parameters: rebuild them
        return {**self.__dict__, "_np_actor": None}

    def _apply(self, *args, **kwargs):
        self._np_actor = None  # .to(device) and friends replace the parameters the views read
        return super()._apply(*args, **kwargs)

    def numpy_logits(self, obs: np.ndarray) -> np.ndarray:
        """``logits`` in numpy, for acting (see NumpyMLP); through torch with an image encoder."""
        if self._np_actor is None:
            device = self.actor_head.weight.device
            if self.actor_encoder is not None or device.type != "cpu":  # convolutions, or weights off the CPU: torch
                self._np_actor = device
        if isinstance(self._np_actor, torch.device):
            with torch.no_grad():
                return self.logits(torch.from_numpy(np.ascontiguousarray(obs)).to(self._np_actor)).cpu().numpy()
        if self._np_actor is None:
            self._np_actor = NumpyMLP(self.actor_trunk, self.actor_head)
        return self._np_actor(as_batch(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.shared:
            h = chain(self.actor_trunk, encode(self.actor_encoder, obs))
        else:
            h = chain(self.critic_trunk, encode(self.critic_encoder, obs))
        return F.linear(h, self.critic_head.weight, self.critic_head.bias).squeeze(-1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, A], values [B])."""
        x = encode(self.actor_encoder, obs)
        h = chain(self.actor_trunk, x)
        if self.shared:
            hv = h
        else:
            hv = chain(self.critic_trunk, x if self.critic_encoder is None else encode(self.critic_encoder, obs))
        logits = F.linear(h, self.actor_head.weight, self.actor_head.bias)
        return logits, F.linear(hv, self.critic_head.weight, self.critic_head.bias).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-probabilities of ``actions`` [B], policy entropies [B], values [B])."""
        logits, value = self(obs)
        logp_all = torch.log_softmax(logits, dim=1)
        logprob = logp_all.gather(1, actions.long().unsqueeze(1)).squeeze(1)
        return logprob, -(logp_all.exp() * logp_all).sum(1), value


class Adam:
    """Adam, as torch.optim.Adam with its default options (no weight decay, no amsgrad).

    Written out because constructing any torch.optim optimizer imports torch._dynamo on first
    use, which costs seconds of start-up: a large share of a CartPole run's time to solve. The
    step is torch's fused Adam kernel (what ``torch.optim.Adam(fused=True)`` calls: one pass over
    every parameter) rather than seven multi-tensor ops, each a loop over the tensors on a CPU;
    where that kernel is missing, or the parameters are of more than one device or
    dtype, the same update in a handful of multi-tensor ops.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = float(lr), betas, float(eps)
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        # the fused kernel's step counter (the optimizer is made once the parameters are on their
        # device); None: the multi-tensor ops
        self._step_count = torch.zeros((), dtype=torch.float32, device=self.params[0].device) if self._fusable() else None

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _fusable(self) -> bool:
        if not self.params or not hasattr(torch, "_fused_adam_"):
            return False
        first = self.params[0]
        return (first.device.type in ("cpu", "cuda") and first.dtype in (torch.float32, torch.float64)
                and all(p.device == first.device and p.dtype == first.dtype for p in self.params))

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        self.steps += 1
        grads = [p.grad for p in self.params]
        if self._step_count is not None:
            self._step_count.fill_(self.steps)  # read, never written, by the kernel: one counter for every parameter
            torch._fused_adam_(self.params, grads, self.exp_avg, self.exp_avg_sq, [], [self._step_count] * len(self.params),
                               lr=self.lr, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=self.eps,
                               amsgrad=False, maximize=False)
            return
        torch._foreach_lerp_(self.exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(self.exp_avg_sq, beta2)
        torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, 1 - beta2)
        bias_correction1 = 1 - beta1**self.steps
        bias_correction2_sqrt = math.sqrt(1 - beta2**self.steps)
        denom = torch._foreach_sqrt(self.exp_avg_sq)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(self.params, self.exp_avg, denom, -self.lr / bias_correction1)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "lr": self.lr, "betas": tuple(self.betas), "eps": self.eps,
                "exp_avg": [t.clone() for t in self.exp_avg], "exp_avg_sq": [t.clone() for t in self.exp_avg_sq]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError("optimizer state does not match the parameters")
        # the moments and the step count are state; lr, betas and eps stay as configured, so a run
        # resumed (or a PBT member that took another's checkpoint) with new settings trains with them
        self.steps = int(state["steps"])
        with torch.no_grad():
            torch._foreach_copy_(self.exp_avg, state["exp_avg"])
            torch._foreach_copy_(self.exp_avg_sq, state["exp_avg_sq"])


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients in place so their global L2 norm is at most ``max_norm``; returns the
    norm before clipping. Same result as torch.nn.utils.clip_grad_norm_, with fewer ops."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp_(max=1.0))
    return total


def seeded_init(seed: int, build):
    """Call ``build()`` with torch's global RNG seeded, restoring that RNG afterwards, so that
    making an algorithm neither depends on nor disturbs anyone else's random stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict that later updates of ``module`` don't change (state_dict() shares storage)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def weights_of(module: nn.Module, keys=None) -> dict[str, np.ndarray]:
    """Parameters and buffers (all, or those named in ``keys``) as independent CPU float32
    numpy arrays."""
    state = module.state_dict()
    keys = state.keys() if keys is None else keys
    return {k: state[k].detach().to("cpu", torch.float32).numpy().copy() for k in keys}


def load_weights(module: nn.Module, weights: dict[str, np.ndarray], keys=None) -> None:
    """Copy a ``weights_of`` dict into ``module`` in place; it must hold exactly ``keys`` (default:
    every entry of the module's state dict), with matching shapes."""
    state = module.state_dict()
    expected = set(state.keys() if keys is None else keys)
    missing = expected - weights.keys()
    extra = weights.keys() - expected
    if missing or extra:
        raise ValueError(f"weights do not match the network: missing {sorted(missing)}, unexpected {sorted(extra)}")
    with torch.no_grad():
        for k in expected:
            v = state[k]
            src = torch.as_tensor(np.asarray(weights[k]))
            if src.shape != v.shape:
                raise ValueError(f"weights[{k!r}]: shape {tuple(src.shape)} != {tuple(v.shape)}")
            v.copy_(src)


class PerAgentMLP(nn.Module):
    """One independent MLP per agent, all evaluated together by batched matrix products: input
    (n_agents, B, in_dim) -> output (n_agents, B, out_dim). Layers are initialised as nn.Linear's
    default; the output layer's weights are scaled by ``out_gain`` (small: near-uniform logits)."""

    def __init__(self, n_agents: int, in_dim: int, hidden: Sequence[int], out_dim: int,
                 activation: str = "relu", out_gain: float = 1.0):
        super().__init__()
        self.activation = activation
        widths = [in_dim, *hidden, out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(n_agents, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n_agents, 1, fan_out).uniform_(-bound, bound)))
        with torch.no_grad():
            self.weights[-1].mul_(out_gain)
        self._np = None  # numpy views for numpy_forward, made on first use

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = torch.relu if self.activation == "relu" else torch.tanh
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = act(x)
        return x

    def __getstate__(self):
        # numpy views would be pickled as copies, detached from the parameters: rebuild them
        return {**self.__dict__, "_np": None}

    def numpy_forward(self, x: np.ndarray) -> np.ndarray:
        """``forward`` in numpy on zero-copy views of the parameters, for acting."""
        if self._np is None:
            self._np = [(w.detach().numpy(), b.detach().numpy()) for w, b in zip(self.weights, self.biases)]
        last = len(self._np) - 1
        for i, (w, b) in enumerate(self._np):
            x = np.matmul(x, w) + b
            if i < last:
                x = np.maximum(x, 0.0, out=x) if self.activation == "relu" else np.tanh(x, out=x)
        return x
