"""The learner's side of admission: report consumed chunks, ask credits for the explorer tasks
it wants to submit, take the controller's answer.

The decision is the controller's alone (``books.py``). One request is in flight at a time and
the learner goes on training while the scheduler answers. When the replay-ratio floor would
refuse one more key, the answer says how many samples the learner must have trained before it
can be granted; until then the learner does not ask (it still reports), so a paced learner costs
the scheduler no request per update.
"""

from __future__ import annotations

from dataclasses import dataclass

from tianji_dask import dask_internals
from tianji_dask.dataflow.controller.settings import LawSettings
from tianji_dask.dataflow.messages import (
    Consumption,
    ControllerParams,
    CycleReply,
    Progress,
    consumptions_to_wire,
)


@dataclass(frozen=True)
class Request:
    """The request in flight: the controller's answer to come, the (key, stream) asked, and the
    consumed chunks' futures, held until the answer."""

    answer: object
    want: list[tuple[str, int]]
    held: list


class AdmissionClient:
    def __init__(self, client, *, run_id: str, group: int, law: LawSettings, learner_address: str, chunk_env_steps: int,
                 rebuilt: bool = False):
        self._client = client
        self._run_id, self._group = run_id, group
        rebuilt_flag = {"rebuilt": True} if rebuilt else {}
        self.params = ControllerParams.from_wire(client.sync(
            client.scheduler.tianji_begin, run_id=run_id, law=law.to_wire(), learner_address=learner_address,
            chunk_env_steps=chunk_env_steps, group=group, **rebuilt_flag,
        ))
        self._request: Request | None = None
        #: the samples trained at which the controller's last answer said one more chunk can be granted
        self.ask_again_at: float | None = None
        #: the controller's count of workers joined or left, as of its last answer
        self.workers_epoch = 0

    def set_window(self, window: int) -> None:
        """Start this learner's books at ``window`` (a resumed run goes on with its window)."""
        self._client.sync(self._client.scheduler.tianji_configure, window=int(window), group=self._group,
                          run_id=self._run_id)

    @property
    def waiting(self) -> bool:
        """A request is in flight."""
        return self._request is not None

    @property
    def asked(self) -> int:
        """Keys asked for in the request in flight."""
        return len(self._request.want) if self._request is not None else 0

    def answered(self) -> bool:
        return self._request is not None and self._request.answer.done()

    def may_ask(self, samples_trained: float, starving: bool, in_flight: int) -> bool:
        """False while the controller's last answer still holds: fewer samples trained than it
        named, and the learner not starving with nothing in flight (which it always admits)."""
        return self.ask_again_at is None or samples_trained >= self.ask_again_at or (starving and in_flight == 0)

    def request(self, *, consumed: list[Consumption], held: list, want: list[tuple[str, int]], version: int,
                progress: Progress | None, status: dict | None) -> None:
        """Send one request: ``consumed`` (their ``held`` futures stay alive until the answer, or
        their credits would come back as forgotten), ``want`` as (key, stream)."""
        coro = self._client.scheduler.tianji_cycle(
            consumed=consumptions_to_wire(consumed), want=[key for key, _ in want], learner_version=version,
            progress=None if progress is None else progress.to_wire(), learner_status=status, group=self._group,
            run_id=self._run_id,
        )
        self._request = Request(dask_internals.on_client_loop(self._client, coro), want, held)

    def reply(self) -> tuple[list[tuple[str, int]], list]:
        """The answer to the request in flight (waiting for it if need be): the (key, stream)
        granted, in the order asked, and the futures held for it, which may go now that their
        consumption is on record. ``params`` is then the controller's current settings."""
        request = self._request
        answer = CycleReply.from_wire(request.answer.result())
        self._request = None
        self.params = answer.params
        self.ask_again_at = answer.ask_again_at_samples
        self.workers_epoch = answer.workers_epoch
        granted = set(answer.granted)
        return [(key, stream) for key, stream in request.want if key in granted], request.held

    def final(self, *, consumed: list[Consumption], version: int, progress: Progress | None, status: dict) -> None:
        """The last report, waited for: every consumed chunk is on record when the run ends."""
        self._client.sync(self._client.scheduler.tianji_cycle, consumed=consumptions_to_wire(consumed), want=[],
                          learner_version=version, progress=None if progress is None else progress.to_wire(),
                          learner_status=status, group=self._group, run_id=self._run_id)
