"""The optimizer every algorithm uses, and its one gradient step: gradients cleared, computed,
averaged across learner replicas where there are several, clipped, applied (no Dask)."""

from __future__ import annotations

import math

import torch


#: called with an optimizer's parameters once their gradients are computed, before clipping:
#: learner replicas average the gradients there (core/replicas.py); None: nothing. A process holds
#: one learner, so one hook serves every optimizer in it, those an algorithm makes late included.
_grad_hook = None


_steps_taken = 0  # gradient steps taken in this process (``steps_taken``)


def steps_taken() -> int:
    """Gradient steps ``Adam.minimize`` has taken in this process."""
    return _steps_taken


def set_grad_hook(hook) -> None:
    """Have every ``Adam.minimize`` in this process call ``hook(params)`` (None: nothing)."""
    global _grad_hook
    _grad_hook = hook


class Adam:
    """Adam, as torch.optim.Adam with its default options (no weight decay, no amsgrad).

    Written out because constructing any torch.optim optimizer imports torch._dynamo on first
    use, which costs seconds of start-up: a large share of a CartPole run's time to solve. The
    step is torch's fused Adam kernel (what ``torch.optim.Adam(fused=True)`` calls: one pass over
    every parameter) rather than seven multi-tensor ops, each a loop over the tensors on a CPU;
    where that kernel is missing, or the parameters are of more than one device or
    dtype, the same update in a handful of multi-tensor ops.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 fused: bool | None = None):
        """``fused``: the fused kernel (None: wherever it can run)."""
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = float(lr), betas, float(eps)
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        # the fused kernel's step counter (the optimizer is made once the parameters are on their
        # device); None: the multi-tensor ops
        fused = self._fusable() if fused is None else fused and self._fusable()
        self.fused = fused
        self._step_count = torch.zeros((), dtype=torch.float32, device=self.params[0].device) if fused else None

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def minimize(self, loss: torch.Tensor, max_grad_norm: float | None = None) -> None:
        """One gradient step on ``loss``: gradients cleared and computed, their global norm
        clipped to ``max_grad_norm`` (None: not clipped), the step applied."""
        global _steps_taken
        _steps_taken += 1
        self.zero_grad()
        loss.backward()
        if _grad_hook is not None:
            _grad_hook(self.params)
        if max_grad_norm is not None:
            clip_grad_norm(self.params, max_grad_norm)
        self.step()

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
