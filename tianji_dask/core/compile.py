"""``learner.compile``: an algorithm's declared losses compiled with ``torch.compile`` on a thread
of their own while the learner trains eager, and swapped in between two updates once compiled and
checked against eager. Nothing waits for it: a run that ends first simply trained eager all along.

How. The first eager update records each declared loss's inputs (tensors cloned), whether grad
mode was on, and the ``requires_grad`` of every parameter at that call. Between that update and
the next, a shadow of the algorithm is made: the same object with its modules and tensors copied.
The thread compiles the class's function and runs it on the shadow with those inputs and flags,
forward and backward (``torch.autograd.grad``: no ``.grad`` is touched), so both graphs are built
as the learner will call them. It then runs the eager function on the same inputs and compares
outputs and gradients. Dynamo keeps its compiled graphs on the function's code, guarded on the
tensors' properties rather than on the modules' identity, so the learner's own calls then use the
graphs built on the shadow with no recompilation (the first compiled update takes as long as the
ones after it: ``benchmarks/learner_compile.py --background``).

Which losses: ``Algorithm.compilable`` names them (SAC's critic and actor losses, DQN's loss):
functions of tensors whose shapes do not change from one update to the next, that draw no random
numbers of their own (SAC's noise is an input). ``auto`` compiles on CUDA only: on CPU compiled
updates measured slower (docs/benchmarks.md, the learner roofline). No Dask.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import types

import torch
from torch.utils._pytree import tree_flatten, tree_map

log = logging.getLogger(__name__)

#: ``auto`` leaves a run with a shorter time budget eager: it would end before compiling paid back
AUTO_MIN_BUDGET_S = 120.0
RTOL, ATOL = 1e-4, 1e-5
#: the compiling thread's name, as a stack dump or a profiler shows it
THREAD_NAME = "tianji-compile"
#: a declared loss not called through ``Algorithm.compiled`` in this many updates is never compiled
UNSEEN_UPDATES = 3


def resolve(setting: str, algo, device: torch.device, budget_s: float | None) -> tuple[str | None, str]:
    """(the ``torch.compile`` mode to use, or None for eager; why) for ``learner.compile``."""
    if setting == "off":
        return None, "learner.compile is off"
    if not algo.compilable:
        return None, f"{type(algo).__name__} declares no compilable losses (Algorithm.compilable)"
    if setting == "auto":
        if device.type != "cuda":
            return None, "auto: eager on CPU, where compiled updates measured slower"
        if budget_s is not None and budget_s < AUTO_MIN_BUDGET_S:
            return None, f"auto: eager for a run budget under {AUTO_MIN_BUDGET_S:g} s"
    return ("reduce-overhead" if device.type == "cuda" else "default"), setting


def _clone(tree):
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


def _grad_flags(algo) -> dict[tuple[str, str], bool]:
    return {(k, n): p.requires_grad for k, m in algo.networks() for n, p in m.named_parameters()}


def _shadow(algo, flags: dict[tuple[str, str], bool]):
    """``algo`` with its modules and tensors copied, the parameters' ``requires_grad`` as ``flags``."""
    shadow = copy.copy(algo)
    for k, v in vars(algo).items():
        if isinstance(v, (torch.nn.Module, torch.Tensor)):
            setattr(shadow, k, copy.deepcopy(v))
    for k, m in shadow.networks():
        for n, p in m.named_parameters():
            p.requires_grad_(flags.get((k, n), p.requires_grad))
    return shadow


def _loss_and_grads(fn, shadow, args, kwargs):
    out = fn(shadow, *args, **kwargs)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    params = [p for _, m in shadow.networks() for p in m.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True) if loss.requires_grad else ()
    return tree_flatten(out)[0], list(grads)


def _differs(a: list, b: list) -> float | None:
    """The largest absolute difference between two lists of tensors beyond tolerance, else None."""
    worst = None
    for x, y in zip(a, b):
        if not isinstance(x, torch.Tensor) or y is None:
            continue
        x, y = x.detach().float(), y.detach().float()
        if x.shape != y.shape or not torch.allclose(x, y, rtol=RTOL, atol=ATOL):
            gap = float((x - y).abs().max()) if x.shape == y.shape else float("inf")
            worst = gap if worst is None else max(worst, gap)
    return worst


class BackgroundCompile:
    """One learner's compilation. States: ``waiting`` (for the first update's inputs),
    ``compiling`` (on its thread; the learner trains eager), ``on`` (compiled losses in use),
    ``failed`` (eager to the end; ``reason`` says why). Call ``before_update`` and
    ``after_update`` around every ``algo.learn()``, on the learner's thread."""

    def __init__(self, algo, mode: str):
        self.algo, self.mode = algo, mode
        self.names = tuple(algo.compilable)
        self.state, self.reason = "waiting", None
        self.eager_updates, self.installed_at_update, self.compile_s = 0, None, None
        self._inputs: dict[str, tuple] = {}
        self._result: tuple[str, object] | None = None
        self._thread: threading.Thread | None = None
        for name in self.names:
            algo.use_loss(name, self._recorder(name, getattr(algo, name)))

    def _recorder(self, name: str, bound):
        def record(*args, **kwargs):
            if name not in self._inputs:
                self._inputs[name] = (_clone(args), _clone(kwargs), _grad_flags(self.algo), torch.is_grad_enabled())
            return bound(*args, **kwargs)
        return record

    def before_update(self) -> None:
        if self.state == "on" and self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the last update's graph outputs may be reused

    def after_update(self, updates: int) -> bool:
        """Start compiling once every loss has been seen, install the compiled losses once ready
        (between two updates, never inside one); True when they were installed just now."""
        if self.state == "waiting":
            self.eager_updates += 1
            unseen = [n for n in self.names if n not in self._inputs]
            if unseen and self.eager_updates >= UNSEEN_UPDATES:
                for name in self.names:
                    self.algo.use_loss(name, None)
                self.state = "failed"
                self.reason = (f"learn() made {self.eager_updates} updates without calling {', '.join(unseen)} through "
                               f"self.compiled(name) (Algorithm.compilable); the learner trains eager")
                log.warning("learner.compile: %s", self.reason)
                return False
            if not unseen:
                for name in self.names:
                    self.algo.use_loss(name, None)  # the class's own method again, until the compiled one
                shadows = {n: _shadow(self.algo, self._inputs[n][2]) for n in self.names}
                self.state, self._t0 = "compiling", time.perf_counter()
                self._thread = threading.Thread(target=self._work, args=(shadows,), name=THREAD_NAME, daemon=True)
                self._thread.start()
            return False
        if self.state != "compiling":
            return False
        self.eager_updates += 1
        if self._thread.is_alive():
            return False
        status, payload = self._result
        self.compile_s = time.perf_counter() - self._t0
        self._inputs.clear()
        if status == "failed":
            self.state, self.reason = "failed", payload
            log.warning("learner.compile: %s; the learner trains eager", payload)
            return False
        for name, fn in payload.items():
            self.algo.use_loss(name, types.MethodType(fn, self.algo))
        self.state, self.installed_at_update = "on", updates
        return True

    def _work(self, shadows: dict) -> None:
        cls = type(self.algo)
        compiled = {}
        try:
            for name in self.names:
                args, kwargs, _, grad_mode = self._inputs[name]
                fn = torch.compile(getattr(cls, name), mode=self.mode)
                with torch.set_grad_enabled(grad_mode):
                    got = _loss_and_grads(fn, shadows[name], args, kwargs)
                    want = _loss_and_grads(getattr(cls, name), shadows[name], args, kwargs)
                for what, a, b in (("outputs", got[0], want[0]), ("gradients", got[1], want[1])):
                    gap = _differs(a, b)
                    if gap is not None:
                        raise ValueError(f"compiled {name} {what} differ from eager (largest gap {gap:.3g}, "
                                         f"tolerance rtol {RTOL:g}, atol {ATOL:g})")
                compiled[name] = fn
            self._result = ("ok", compiled)
        except Exception as err:  # noqa: BLE001 - any failure leaves the learner eager, said once
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            self._result = ("failed", f"{type(err).__name__}: {first}"[:300])

    def summary(self) -> dict:
        """What the results and the live status say about it."""
        return {"state": self.state, "mode": self.mode, "losses": list(self.names), "reason": self.reason,
                "eager_updates": self.eager_updates, "installed_at_update": self.installed_at_update,
                "compile_s": None if self.compile_s is None else round(self.compile_s, 2)}
