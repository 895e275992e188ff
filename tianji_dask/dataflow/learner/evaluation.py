"""Evaluation during training, the learner's side: when one is due, submit an evaluation task
(``explorer.evaluate_policy``) with the newest published weights; take its episodes when it ends.

One evaluation is out at a time. It runs on an explorer worker like a chunk, but the controller
never sees it: it holds no window credit, its episodes are never trained on, and the learner
never waits for it.
"""

from __future__ import annotations

import logging
import time

from tianji_dask.dataflow.explorer.tasks import evaluate_policy
from tianji_dask.dataflow.keys import eval_key
from tianji_dask.dataflow.learner.spec import EvalSpec

logger = logging.getLogger("tianji_dask.evaluation")


class EvalClient:
    def __init__(self, client, spec: EvalSpec, *, run_id: str, tag: str, hosts=None):
        self._client, self.spec, self._run_id, self._tag = client, spec, run_id, tag
        self._hosts = None if hosts is None else list(hosts)  # the explorer workers this run may use
        self._future = None
        self._last_t = time.time()
        self._last_version = 0
        self._serial = 0
        self.failed = 0

    def due(self, now: float, version: int) -> bool:
        s = self.spec
        return self._future is None and bool(
            (s.every_s is not None and now - self._last_t >= s.every_s)
            or (s.every_versions is not None and version - self._last_version >= s.every_versions))

    def submit(self, weights, weights_version: int, version: int, now: float) -> None:
        """Evaluate the published weights ``weights_version`` (futures or inline arrays); each
        evaluation plays the same env seeds, so their means differ by the policy alone."""
        self._last_t, self._last_version = now, version
        self._serial += 1
        self._future = self._client.submit(
            evaluate_policy, self._run_id, weights, weights_version, self.spec.episodes, self.spec.seed,
            self.spec.deterministic, key=eval_key(self._tag, self._serial), resources={"EXPLORER": 1},
            workers=self._hosts, pure=False)

    def poll(self) -> dict | None:
        """The finished evaluation's result (version, returns, lengths, t_end), or None."""
        future = self._future
        if future is None or not future.done():
            return None
        self._future = None
        if future.status != "finished":  # its worker died, or the env failed: the next one is due as usual
            self.failed += 1
            logger.warning("tianji: an evaluation failed (%s)", future.exception() if future.status == "error" else future.status)
            return None
        return future.result()

    def cancel(self) -> None:
        if self._future is not None:
            self._client.cancel([self._future])
            self._future = None
