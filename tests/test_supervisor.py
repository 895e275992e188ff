"""The driver's side of a learner's handoff, with the learner and the cluster stood in for: a
report that says a handoff is due starts the fresh learner worker it will need."""

from __future__ import annotations

import time
from types import SimpleNamespace

from tianji_dask.config import load_pipeline
from tianji_dask.dataflow.learner.report import LearnerReport
from tianji_dask.run.supervisor import HANDOFF_LEAD_S, LearnerSupervisor


class _Answer:
    def __init__(self, report):
        self.report = report

    def result(self, timeout=None):
        return self.report


class _Learner:
    def __init__(self, report):
        self.report = report

    def status(self, wait_s):
        return _Answer(self.report)


class _Cluster:
    """The cluster the run opened: it only records the learner workers it is asked to start."""

    def __init__(self):
        self.started = []

    def start_learner(self, name):
        self.started.append(name)


def _supervisor(overrides: dict, handoff_at: float) -> tuple[LearnerSupervisor, _Cluster]:
    plan = SimpleNamespace(pipeline=load_pipeline("cartpole_dqn", overrides=overrides), out="run")
    opened = _Cluster()
    supervisor = LearnerSupervisor(None, plan, opened, make_spec=None, published=lambda: None)
    report = LearnerReport(status={"version": 3}, handoff_at=handoff_at)
    supervisor.learners, supervisor.names = [_Learner(report)], ["tianji-learner-0"]
    return supervisor, opened


def test_a_preempted_learner_asked_before_its_handoff_is_made_has_its_successor_started_at_once():
    # a preemption sets the handoff for now; the driver can ask between that and the handoff being
    # made, and with no learner_lifetime set it once failed there on the lifetime's lead
    supervisor, opened = _supervisor({}, handoff_at=time.time())
    assert supervisor.plan.pipeline.cluster.learner_lifetime is None
    reports = supervisor.reports(0.0)
    assert reports is not None and reports[0].status == {"version": 3}
    assert opened.started == ["tianji-learner-n1"] and supervisor._successors == {0: "tianji-learner-n1"}
    supervisor.reports(0.0)  # asked again before the handoff: no second worker
    assert opened.started == ["tianji-learner-n1"]


def test_a_learner_with_a_lifetime_has_its_successor_started_only_within_the_lead():
    overrides = {"cluster.kind": "slurm", "cluster.learner_lifetime": "20m", "cluster.jobqueue.walltime": "01:00:00"}
    far, opened = _supervisor(overrides, handoff_at=time.time() + 10 * HANDOFF_LEAD_S)
    far.reports(0.0)
    assert opened.started == []
    near, opened = _supervisor(overrides, handoff_at=time.time() + HANDOFF_LEAD_S / 2)
    near.reports(0.0)
    assert opened.started == ["tianji-learner-n1"]
