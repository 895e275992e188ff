"""``tianji_*`` series on the scheduler's ``/metrics``.

The scheduler serves ``prometheus_client``'s global registry, so one collector registered in the
scheduler's process is enough. It reads the staleness controller's state when scraped: nothing
runs between scrapes, and a scrape costs O(explorers).
"""

from __future__ import annotations

import math

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    SummaryMetricFamily,
)

_collector = None


class TianjiCollector:
    def __init__(self):
        self.controller = None

    def describe(self):
        return []  # collected lazily: the controller may not exist at registration

    def collect(self):
        ctl = self.controller
        if ctl is None:
            return
        families: dict[str, object] = {}

        def family(kind, name, doc):
            if name not in families:
                families[name] = kind(f"tianji_{name}", doc, labels=["run", "group"])
            return families[name]

        for run, books in ctl.all_books():
            view = books.view()
            labels = [run, str(view.group)]
            learner = view.learner

            def gauge(name, doc, value):
                family(GaugeMetricFamily, name, doc).add_metric(labels, float("nan") if value is None else float(value))

            def counter(name, doc, value):
                family(CounterMetricFamily, name, doc).add_metric(labels, float(value))

            gauge("learner_version", "Learner version (optimizer updates)", view.learner_version)
            gauge("simulated", "1 when explorer env steps carry a simulated cost (env.step_cost_ms)", int(view.simulated))
            counter("chunks_consumed", "Sample chunks consumed by the learner", view.chunks_consumed)
            counter("chunks_dropped", "Chunks consumed but not trained on (filters, lag)", view.chunks_dropped)
            counter("env_steps_consumed", "Env steps in consumed chunks", view.env_steps_consumed)
            counter("credits_granted", "Explorer tasks admitted by the controller", view.credits_granted)
            gauge("chunks_in_flight", "Explorer chunks admitted and not yet consumed", view.chunks_in_flight)
            gauge("window", "The controller's window (chunks in flight allowed)", view.window)
            gauge("staleness_target", "Staleness target (versions); NaN when off", view.staleness_target)
            for name, verdict in (("staleness_target_held", view.target_verdict),
                                  ("replay_staleness_target_held", view.replay_target_verdict)):
                state = verdict["state"]
                gauge(name, "1 while the last period held the target, 0 settling, -1 out of reach "
                      "(the reason: the run's status); NaN when off",
                      None if state == "off" else {"held": 1, "settling": 0, "unreachable": -1}[state])
            family(SummaryMetricFamily, "staleness_versions", "Staleness of consumed chunks (versions)").add_metric(
                labels, count_value=view.chunks_consumed, sum_value=view.staleness_sum)
            gauge("staleness_max_versions", "Largest staleness seen (versions)", view.staleness_max)
            gauge("mean_return", "Running mean of training episode returns", learner.get("mean_return"))
            gauge("eval_return", "Mean return of the latest evaluation; NaN before the first", learner.get("eval_mean_return"))
            gauge("updates", "Learner updates", learner.get("updates"))
            gauge("replay_ratio", "Samples trained per env step", learner.get("replay_ratio"))
            elapsed = learner.get("elapsed_s")
            busy = learner.get("learn_s")
            gauge("learner_busy_fraction", "Fraction of wall time the learner spent in updates",
                  busy / elapsed if busy is not None and elapsed else None)
            solved = learner.get("solved_s")
            if solved is not None and not math.isnan(solved):
                gauge("time_to_solve_seconds", "Seconds from run start to the solve", solved)
        yield from families.values()


def watch(controller) -> None:
    """Point the process's collector at ``controller`` (registering it once per process)."""
    global _collector
    if _collector is None:
        _collector = TianjiCollector()
        try:
            REGISTRY.register(_collector)
        except ValueError:  # already registered by an earlier import of this module
            pass
    _collector.controller = controller
