"""learner.compile: losses compiled on a thread of their own while the learner trains eager, swapped
in between updates once checked against eager (core/compile.py)."""

from __future__ import annotations

import time

import pytest
import torch

from tianji_dask.algos import Algorithm
from tianji_dask.config import PipelineError, load_pipeline
from tianji_dask.core.compile import THREAD_NAME, BackgroundCompile, resolve
from tianji_dask.run import Run
from tianji_dask.run.checks import check_pipeline


class Toy:
    """One linear layer, a pure loss and (optionally) one that draws its own random numbers."""

    def __init__(self, compilable=("loss",)):
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 2)
        self.compilable = compilable

    networks = Algorithm.networks  # the networks, as an Algorithm lists them
    compiled, use_loss = Algorithm.compiled, Algorithm.use_loss  # how learn() reaches a compiled loss

    def loss(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.net(x)
        return (y ** 2).mean(), y.detach()

    def noisy(self, x: torch.Tensor) -> torch.Tensor:
        return (self.net(x) * torch.rand(x.shape[0], 1)).mean()

    def learn(self, x: torch.Tensor) -> None:
        for name in self.compilable:
            out = self.compiled(name)(x)
            (out[0] if isinstance(out, tuple) else out).backward()


def _train_until_settled(toy: Toy, compiler: BackgroundCompile, x: torch.Tensor, limit_s: float = 240) -> int:
    deadline, updates = time.time() + limit_s, 0
    while compiler.state in ("waiting", "compiling"):
        assert time.time() < deadline, f"compilation still {compiler.state} after {limit_s} s"
        compiler.before_update()
        toy.learn(x)
        updates += 1
        compiler.after_update(updates)
        time.sleep(0.01)
    return updates


def test_auto_is_eager_on_cpu_and_for_short_runs_and_off_or_undeclared_never_compiles():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve("auto", Toy(), cpu, None)[0] is None
    assert resolve("auto", Toy(), cuda, None) == ("reduce-overhead", "auto")
    assert resolve("auto", Toy(), cuda, 60.0)[0] is None  # a short run would end before it paid back
    assert resolve("on", Toy(), cpu, 60.0) == ("default", "on")
    assert resolve("off", Toy(), cuda, None)[0] is None
    mode, why = resolve("on", Toy(compilable=()), cpu, None)
    assert mode is None and "declares no compilable losses" in why


def test_compile_on_for_an_algorithm_without_compilable_losses_is_refused_before_any_cluster():
    p = load_pipeline("cartpole_ppo", overrides={"learner.compile": "on"})
    with pytest.raises(PipelineError, match=r"^learner\.compile: on, but ppo declares no losses to compile"):
        check_pipeline(p, has_client=False)
    assert load_pipeline("cartpole_dqn", overrides={"learner.compile": True}).learner.compile == "on"  # YAML's on


def test_compilable_naming_no_method_is_refused_before_any_cluster():
    from tianji_dask.algos.dqn import DQN

    class Typo(DQN):
        compilable = ("los",)

    with pytest.raises(PipelineError, match=r"^algo\.name: .*Typo\.compilable names 'los', which the class does not"):
        check_pipeline(load_pipeline("cartpole_dqn", overrides={"algo.name": Typo}), has_client=False)


@pytest.mark.slow  # torch.compile: seconds
def test_compiled_loss_is_swapped_in_between_updates_and_matches_eager():
    toy, x = Toy(), torch.randn(8, 4)
    compiler = BackgroundCompile(toy, "default")
    assert compiler.state == "waiting" and toy.compiled("loss") != toy.loss  # recording the first call's inputs
    updates = _train_until_settled(toy, compiler, x)
    s = compiler.summary()
    assert s["state"] == "on", s
    assert 1 <= s["eager_updates"] == s["installed_at_update"] == updates  # trained eager until then
    eager_out, eager_y = Toy.loss(toy, x)
    eager_grads = torch.autograd.grad(eager_out, list(toy.net.parameters()))
    out, y = toy.compiled("loss")(x)  # now the compiled function, bound to the learner's own algorithm
    assert toy.compiled("loss").__func__ is not Toy.loss and toy.loss.__func__ is Toy.loss  # the method stays
    grads = torch.autograd.grad(out, list(toy.net.parameters()))
    assert torch.allclose(out, eager_out, rtol=1e-5) and torch.allclose(y, eager_y, rtol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads, eager_grads))


@pytest.mark.slow  # torch.compile: seconds
def test_a_loss_learn_does_not_call_through_compiled_is_named_and_the_learner_stays_eager():
    class Direct(Toy):
        def learn(self, x):  # calls its loss directly: compilation cannot reach it
            self.loss(x)[0].backward()

    toy, x = Direct(), torch.randn(8, 4)
    compiler = BackgroundCompile(toy, "default")
    updates = _train_until_settled(toy, compiler, x)
    s = compiler.summary()
    assert s["state"] == "failed" and updates == s["eager_updates"] == 3, s
    assert "without calling loss through self.compiled(name)" in s["reason"] and toy.compiled("loss") == toy.loss


@pytest.mark.slow  # torch.compile: seconds
def test_a_loss_that_differs_from_eager_leaves_the_learner_eager_with_the_reason():
    toy, x = Toy(compilable=("loss", "noisy")), torch.randn(8, 4)
    compiler = BackgroundCompile(toy, "default")
    _train_until_settled(toy, compiler, x)
    s = compiler.summary()
    assert s["state"] == "failed" and s["installed_at_update"] is None, s
    assert s["reason"].startswith("ValueError: compiled noisy outputs differ from eager"), s["reason"]
    assert toy.compiled("loss") == toy.loss and toy.compiled("noisy") == toy.noisy  # the class's own methods, eager


def _compile_stacks(client) -> dict:
    """Each worker's compile thread's innermost frames: what a stalled compile waits on."""
    def stacks(name=THREAD_NAME):
        import sys
        import threading
        import traceback
        names = {t.ident: t.name for t in threading.enumerate()}
        return ["".join(traceback.format_stack(f)[-12:]) for i, f in sys._current_frames().items()
                if names.get(i) == name]
    return {w: s for w, s in client.run(stacks).items() if s}


@pytest.mark.slow  # a real run on a cluster: DQN trains eager while its loss compiles, then compiled
@pytest.mark.timeout(600)  # the suite's 300 s would cut the test's own 480 s deadline short
def test_a_run_with_compile_on_trains_eager_then_compiled(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "compiled", overrides={
        "learner.compile": "on", "stop.target_return": None, "stop.max_seconds": 540})
    run.start()
    # usually 13-22 s; in some full suites still compiling after 240 s (cause not isolated)
    deadline, seen = time.time() + 480, []
    while (state := run.status().get("learner_compile")) != "on":
        if time.time() >= deadline or state not in ("waiting", "compiling"):  # where the compile thread stands
            pytest.fail(f"learner.compile went {seen + [state]}; the compile thread: {_compile_stacks(tianji_client)}")
        seen += [state] if not seen or seen[-1] != state else []
        time.sleep(0.2)
    installed = run.status()["updates"]
    while run.status()["updates"] < installed + 5:  # a few compiled updates
        assert time.time() < deadline, "no update after the compiled loss was installed"
        time.sleep(0.2)
    run.stop()
    r = run.wait()
    c = r["learner_compile"]
    assert "compiling" in seen and c["state"] == "on" and c["losses"] == ["loss"] and c["mode"] == "default", (seen, c)
    assert 0 < c["eager_updates"] == c["installed_at_update"] < r["updates"]  # eager first, compiled after
    assert r["error"] is None and r["replay"]["replayable"] is False  # compiled numerics: no exact replay
