"""When the probe starts a periodic metadata refresh (``ProbeTopologyMixin._refresh_start_in``):
timed to the statistics document nearest the metadata's expiry, never twice per max age.

A simulated clock drives the probe's loop (monitor/probe.py ``run``: a refresh when the method
says 0, an observation every interval) with a real ``MetadataCache``; the statistics documents
come every ``period`` seconds, a little slower than their 5-s interval as librdkafka's do (its
timer restarts after writing one).  Before the nearest document was chosen, the last one before
the expiry was: each refresh started its successor's countdown a little early, and at 100,000
partitions (a listing of ~1.3 s) the probe refreshed every 5.2 s instead of every 10.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from monitor import topology
from monitor.cluster_view import BrokerView, ClusterView
from monitor.metadata import MetadataCache
from monitor.topology import ProbeTopologyMixin

MAX_AGE_S, INTERVAL_S = 10.0, 10.0


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t


def _simulate(monkeypatch: pytest.MonkeyPatch, period: float, list_s: float, seconds: float = 600.0,
              obs_drift_s: float = 0.0) -> tuple[list[float], list[tuple[float, float]], list[float]]:
    """(refresh starts, (each refresh's response time, the first statistics document after it),
    observation times) over ``seconds`` of the probe's loop."""
    clock = _Clock()
    monkeypatch.setattr(topology.time, "monotonic", clock.monotonic)
    cache = MetadataCache(metadata_max_age_ms=int(MAX_AGE_S * 1000), refresh_backoff_ms=1000,
                          clock=lambda: int(clock.t * 1000))
    view = ClusterView("kc", 1, (BrokerView(1, "b1", 9092),), {})
    first_tick = clock.t + 0.3
    stats = SimpleNamespace(ts=0.0, supported=True, period=period, after_s=0.5)
    probe = SimpleNamespace(metadata=cache, _epochs=stats, _list_s=None, _next_observation=None,
                            _now_ms=lambda: int(clock.t * 1000))
    start_in = ProbeTopologyMixin._refresh_start_in.__get__(probe)

    def tick_stats() -> None:
        k = math.floor((clock.t - first_tick) / period)
        if k >= 0:
            stats.ts = first_tick + k * period

    def refresh() -> None:
        sent = clock.t
        clock.t += list_s
        cache.update(view, sent_at=int(sent * 1000))
        probe._list_s = list_s
        responses.append((clock.t, first_tick + math.ceil((clock.t - first_tick) / period) * period))
        starts.append(sent)

    starts: list[float] = []
    responses: list[tuple[float, float]] = []
    observations: list[float] = []
    end, next_obs = clock.t + seconds, 0.0
    while clock.t < end:
        tick_stats()
        if start_in() <= 0:
            refresh()
        tick_stats()
        if clock.t >= next_obs:
            observations.append(clock.t)
            next_obs = probe._next_observation = clock.t + INTERVAL_S
            clock.t += obs_drift_s
        tick_stats()
        clock.t += max(0.05, min(start_in(), next_obs - clock.t))
    return starts, responses, observations


@pytest.mark.parametrize("period,list_s", [(5.0, 0.2), (5.2, 1.3), (5.25, 2.0), (4.9, 0.5)])
def test_periodic_refreshes_come_once_per_max_age(monkeypatch: pytest.MonkeyPatch, period: float,
                                                  list_s: float) -> None:
    starts, responses, _ = _simulate(monkeypatch, period, list_s, obs_drift_s=0.3)
    gaps = [b - a for a, b in zip(starts[1:], starts[2:])]  # after the bootstrap one
    assert len(gaps) > 40
    mean = sum(gaps) / len(gaps)
    # once per max age on average (a multiple of the statistics period near it), not twice: a
    # refresh one period after the last only when the document nearest the expiry would come
    # after the next observation (it must come before: the one before is taken)
    assert MAX_AGE_S - period / 2 <= mean <= MAX_AGE_S + period / 2, (period, list_s, mean, gaps)
    short = [g for g in gaps if g < MAX_AGE_S - period / 2]
    assert len(short) <= len(gaps) / 8, gaps
    # each response comes just before a statistics document: a short wait for the leader epochs
    waits = sorted(tick - at for at, tick in responses[1:])
    assert waits[len(waits) // 2] < 0.5 * period, waits


def test_no_refresh_is_late_by_more_than_half_a_period(monkeypatch: pytest.MonkeyPatch) -> None:
    starts, _, _ = _simulate(monkeypatch, 5.2, 1.3)
    for a, b in zip(starts[1:], starts[2:]):
        assert b - a <= MAX_AGE_S + 5.2 / 2 + 0.06, (a, b)  # + one step of the simulated loop
