"""Data-parallel learner replicas: one policy trained by N learners, each on its own chunks.

Every gradient step, each replica computes gradients on its own minibatch; the gradients are
averaged across the replicas (one flat all-reduce per step, not one per tensor) before clipping and
the optimizer step, so every replica takes the same step and the weights stay identical (compared
by hash every ``check_every`` versions). Which replicas update, and when all of them stop, is
agreed by a small all-reduce (``agree``): a collective that one replica skips would hang the
others, so no replica trains or leaves on its own. torch.distributed only (gloo on CPU, NCCL on
CUDA); no Dask: the run arranges the rendezvous and passes it in ``ReplicaSpec``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch

from tianji_dask.algos import normalize, optim
from tianji_dask.core.exact_replay_log import weights_digest


@dataclass(frozen=True)
class ReplicaSpec:
    """This learner's place among the replicas: ``rank`` of ``world``; ``init_method``: the
    rendezvous (``tcp://host:port`` on rank 0's machine); ``timeout_s``: the longest any
    collective waits for a replica before it fails naming it; ``workers``: each rank's worker
    (for the lines that name one); ``host``: the address this replica's worker listens on (its
    replicas talk over the interface that holds it); ``check_every``: versions between
    weight-hash comparisons."""

    rank: int
    world: int
    init_method: str
    timeout_s: float = 120.0
    workers: tuple[str, ...] = ()
    host: str | None = None
    check_every: int = 20


class ReplicaError(RuntimeError):
    """The replicas cannot go on together: one did not answer, or their weights diverged."""


class Replicas:
    """This process's membership of the replicas' process group (joined on construction)."""

    def __init__(self, spec: ReplicaSpec, device: torch.device):
        import torch.distributed as dist

        self.spec, self.device, self._dist = spec, device, dist
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        if dist.is_initialized():  # a learner rebuilt in this process: the old group goes first
            dist.destroy_process_group()
        _talk_where_dask_does(spec, self.backend)
        try:
            dist.init_process_group(self.backend, init_method=spec.init_method, rank=spec.rank, world_size=spec.world,
                                    timeout=timedelta(seconds=spec.timeout_s))
        except Exception as err:  # noqa: BLE001 - re-raised as one line naming the rendezvous
            raise ReplicaError(f"learner replica {spec.rank}: the {spec.world} replicas did not meet at "
                               f"{spec.init_method} within {spec.timeout_s:.0f} s ({_first_line(err)})") from None
        self.allreduce_s = 0.0  # time in gradient all-reduces
        self.allreduce_calls = 0
        self.allreduce_bytes = 0
        self.agree_s = 0.0  # time in the agreements (mostly waiting for the slowest replica)
        self.agreements = 0
        self.checks = 0  # weight-hash comparisons made
        self.ended = False  # an agreement said stop: no collective follows
        self.broken: str | None = None  # a collective failed: none may follow

    # ---- training -----------------------------------------------------------------------------
    def attach(self, algo) -> None:
        """Average every gradient step of this process across the replicas (``optim.set_grad_hook``),
        and start every replica from rank 0's networks."""
        optim.set_grad_hook(self.average)
        normalize.set_pending_hook(self.pool_statistics)
        with torch.no_grad():
            for _, module in algo.networks():
                for tensor in module.state_dict().values():
                    if tensor.is_floating_point():
                        self._collective(self._dist.broadcast, tensor, 0)
        if self.spec.rank:  # each replica draws its own minibatches
            algo.seed_acting([algo.seed, self.spec.rank])

    def updated(self, algo, version: int) -> None:
        """After an update: ReplicaError when it took no averaged gradient step (the algorithm
        steps an optimizer of its own); every ``check_every`` versions the weights compared."""
        if self.allreduce_calls == 0:
            self.broken = "no averaged gradient step"
            raise ReplicaError(f"learner.replicas: {type(algo).__name__}'s update made no gradient step through "
                               "tianji_dask.algos.optim.Adam, so the replicas' gradients were not averaged; allowed: "
                               "replicas 1 for it")
        if version % self.spec.check_every == 0:
            self.check(algo.get_weights(), version)

    def average(self, params: list[torch.Tensor]) -> None:
        """Replace each parameter's gradient by its mean over the replicas: one flat buffer, one
        all-reduce (a parameter without a gradient counts as zeros, so every replica's buffer has
        the same layout)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        t0 = time.perf_counter()
        self._collective(self._dist.all_reduce, flat)
        self.allreduce_s += time.perf_counter() - t0
        self.allreduce_calls += 1
        self.allreduce_bytes += flat.numel() * flat.element_size()
        flat.div_(self.spec.world)
        for p, piece in zip(params, torch.split(flat, [g.numel() for g in grads])):
            p.grad = piece.view_as(p)

    def pool_statistics(self, mean: np.ndarray, var: np.ndarray, count: float) -> tuple[np.ndarray, np.ndarray, float]:
        """Every replica's collected (mean, variance, count) summary of one running statistic,
        combined in rank order (the same result on every replica), so that the observation
        normalization and reward scaling the policy carries stay identical."""
        mine = torch.from_numpy(np.concatenate([[count], np.ravel(mean), np.ravel(var)]).astype(np.float64)).to(self.device)
        every = [torch.zeros_like(mine) for _ in range(self.spec.world)]
        self._collective(self._dist.all_gather, every, mine)
        n = np.size(mean)
        total_mean, total_var, total = np.zeros_like(mean), np.zeros_like(var), 0.0
        for row in (t.cpu().numpy() for t in every):
            if row[0] > 0:
                total_mean, total_var, total = normalize.RunningMeanStd.merge(
                    total_mean, total_var, total, row[1:1 + n].reshape(np.shape(mean)),
                    row[1 + n:].reshape(np.shape(var)), float(row[0]))
        return total_mean, total_var, total

    def agree(self, ready: bool, stop: bool, checkpoint: bool = False) -> tuple[bool, bool, bool]:
        """(every replica is ready to update, some replica stops, some replica has a checkpoint due
        after this update), from each one's own ``ready``, ``stop`` and ``checkpoint``: one
        all-reduce. Every replica calls this the same number of times; after a True first answer
        each makes one update (writing a checkpoint after it on the third), after a True second
        one none calls again."""
        if self.ended or self.broken:
            return False, True, False
        votes = torch.tensor([0 if ready else 1, int(stop), int(checkpoint)], dtype=torch.int64, device=self.device)
        t0 = time.perf_counter()
        self._collective(self._dist.all_reduce, votes)
        self.agree_s += time.perf_counter() - t0
        self.agreements += 1
        not_ready, stopping, checkpoints = (int(v) for v in votes.cpu())
        self.ended = stopping > 0
        return not_ready == 0 and not self.ended, self.ended, checkpoints > 0

    def leave(self) -> None:
        """This replica's loop ended (its stop, or an error): tell the others with a last vote
        unless an agreement already ended them all or a collective broke."""
        if not self.ended and not self.broken:
            try:
                self.agree(False, True)
            except ReplicaError:
                pass

    def check(self, weights: dict[str, np.ndarray], version: int) -> None:
        """Compare the policy weights' hash across the replicas: ReplicaError naming the replicas
        whose weights differ from rank 0's."""
        if self.ended or self.broken:
            return
        mine = torch.tensor([int(weights_digest(weights)[:15], 16)], dtype=torch.int64, device=self.device)
        every = [torch.zeros_like(mine) for _ in range(self.spec.world)]
        self._collective(self._dist.all_gather, every, mine)
        self.checks += 1
        hashes = [int(h) for h in every]
        differ = [rank for rank, h in enumerate(hashes) if h != hashes[0]]
        if differ:
            self.broken = "weights diverged"
            raise ReplicaError(f"learner replicas: weights differ from replica 0's at version {version} on "
                               f"{self._names(differ)}")

    # ---- reading and ending ---------------------------------------------------------------------
    def figures(self, updates: int) -> dict:
        """This replica's share of the time and traffic, for the run's results."""
        return {"rank": self.spec.rank, "backend": self.backend, "allreduce_s": self.allreduce_s,
                "allreduce_calls": self.allreduce_calls, "allreduce_mib": self.allreduce_bytes / 2**20,
                "agree_s": self.agree_s, "agreements": self.agreements, "weight_checks": self.checks,
                "updates": updates}

    def close(self) -> None:
        optim.set_grad_hook(None)
        normalize.set_pending_hook(None)
        dist = self._dist
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken group may not close cleanly; the process goes on
                pass

    def _names(self, ranks: list[int]) -> str:
        workers = self.spec.workers
        return ", ".join(f"replica {r}" + (f" ({workers[r]})" if r < len(workers) else "") for r in ranks)

    def _collective(self, op, *args) -> None:
        if self.broken:
            raise ReplicaError(f"learner replica {self.spec.rank}: the replicas' group is broken ({self.broken})")
        try:
            op(*args)
        except Exception as err:  # noqa: BLE001 - a replica died, hung or left: one line naming them
            self.broken = _first_line(err)
            others = [r for r in range(self.spec.world) if r != self.spec.rank]
            raise ReplicaError(f"learner replica {self.spec.rank}: lost contact with {self._names(others)} "
                               f"(no answer within learner.replica_timeout_s, {self.spec.timeout_s:.0f} s, or gone: "
                               f"{self.broken})") from None


def _talk_where_dask_does(spec: ReplicaSpec, backend: str) -> None:
    """Unless told otherwise (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME), the replicas talk over the
    network interface that holds the address this replica's Dask worker listens on: gloo would
    otherwise take the address its host name resolves to, which on many machines (and in network
    namespaces) the other hosts cannot reach."""
    import os

    import psutil

    variable = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    if os.environ.get(variable) or spec.host is None:
        return
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == spec.host for a in addresses):
            os.environ[variable] = name
            return


def _first_line(err: BaseException) -> str:
    """The gist of a torch.distributed error: its first sentence, without the source location."""
    import re

    text = re.sub(r"^\[[^\]]*\]\s*", "", str(err).strip().split("\n")[0])
    return (text.split(". ")[0] if text else type(err).__name__)[:300]
