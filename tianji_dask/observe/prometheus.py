"""``tianji_*`` series on the scheduler's ``/metrics``.

The scheduler serves ``prometheus_client``'s global registry, so one collector registered in the
scheduler's process is enough. It reads the staleness controller's state when scraped: nothing
runs between scrapes, and a scrape costs O(explorers).
"""

from __future__ import annotations

import math

from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

_collector = None


class TianjiCollector:
    def __init__(self):
        self.controller = None

    def describe(self):
        return []  # collected lazily: the controller may not exist at registration

    def collect(self):
        ctl = self.controller
        if ctl is None or ctl.run_id is None:
            return
        run = ctl.run_id
        learner = ctl.learner_series[-1] if ctl.learner_series else {}

        def gauge(name, doc, value):
            g = GaugeMetricFamily(f"tianji_{name}", doc, labels=["run"])
            g.add_metric([run], float("nan") if value is None else float(value))
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(f"tianji_{name}", doc, labels=["run"])
            c.add_metric([run], float(value))
            return c

        yield gauge("learner_version", "Learner version (optimizer updates)", ctl.learner_version)
        yield counter("chunks_consumed", "Sample chunks consumed by the learner", ctl.chunks_consumed)
        yield counter("chunks_dropped", "Chunks consumed but not trained on (filters, lag)", ctl.chunks_dropped)
        yield counter("env_steps_consumed", "Env steps in consumed chunks", ctl.env_steps_consumed)
        yield counter("credits_granted", "Explorer tasks admitted by the controller", ctl.granted_total)
        yield gauge("chunks_in_flight", "Explorer chunks admitted and not yet consumed", ctl.chunks_in_flight)
        yield gauge("window", "The controller's window (chunks in flight allowed)", ctl.window)
        yield gauge("staleness_target", "Staleness target (versions); NaN when off", ctl.law.target)
        n = ctl.chunks_consumed
        s = SummaryMetricFamily("tianji_staleness_versions", "Staleness of consumed chunks (versions)", labels=["run"])
        s.add_metric([run], count_value=n, sum_value=ctl.staleness_sum)
        yield s
        yield gauge("staleness_max_versions", "Largest staleness seen (versions)", ctl.staleness_max if n else None)
        yield gauge("mean_return", "Running mean of training episode returns", learner.get("mean_return"))
        yield gauge("updates", "Learner updates", learner.get("updates"))
        yield gauge("replay_ratio", "Samples trained per env step", learner.get("replay_ratio"))
        elapsed = learner.get("elapsed_s")
        busy = learner.get("learn_s")
        yield gauge("learner_busy_fraction", "Fraction of wall time the learner spent in updates",
                    busy / elapsed if busy is not None and elapsed else None)
        solved = learner.get("solved_s")
        if solved is not None and not math.isnan(solved):
            yield gauge("time_to_solve_seconds", "Seconds from run start to the solve", solved)


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
