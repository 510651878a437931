"""Healthy consumers raise no lag alert; dead ones are called STOP: a seeded simulator of
ordinary consumers, observed as the probe observes them, run through the lag rules.

The simulator, its profiles and bounds: tests/support/lag_simulation.py (how it writes, consumes,
commits and observes, and how it knows the true lag).

What is asserted (the bounds docs/lag-rules.md quotes):

- healthy profiles (``HEALTHY``: steady rates with auto-commit, bursts drained in seconds, an
  idle topic, a low-volume topic, commits every 1 000 records, a slow consumer with a bounded
  lag, producers following the day, producers writing for minutes at a time, commits every
  1 000 records at 2-4 records/s, a consumer processing every few minutes): no
  ConsumerLagHigh and no ConsumerLagStatus at all, the status OK at every observation — for the
  two whose commit gaps are longer than 300 s (``long_gaps``), from the first commit the monitor
  sees (the gap under way at its start may alert: nothing is known of the consumer yet);
- the lag in seconds: within max(``ERR_ABS_S`` 12 s — one probe interval and a little —,
  ``ERR_REL`` 10 %) of the true value at every observation once the monitor has ``WARMUP_S``
  (10 min) of history; before that it never overstates beyond that bound (it may be a lower
  bound: the partition's past is unknown);
- dead consumers (``DEAD``: stopped while the producers write; dead with records waiting and
  the producers quiet; a consumer committing every 1 000 records that dies): never WARN, STALL
  first, then STOP for good.  STALL then STOP, not STOP at once: STALL (a warning) says "stuck
  past its usual commit cadence", STOP (a page) "past Kafka's max.poll.interval.ms as well — no
  live consumer waits that long"; STOP within ``DEAD_STOP_BOUND_S`` (330 s) of the death for a
  consumer that committed every few seconds, within ``DEAD_SLOW_STOP_BOUND_S`` (1 500 s) for the
  one committing every 1 000 records (its limits scale with its cadence);
- a consumer slowed to 64-78 % of its producers' speed is WARN within ``FALLING_WARN_BOUND_S``
  (450 s) of slowing down, stays WARN, and is nothing worse;
- a consumer slowed to 90, 95 or 99 % of its producers' speed (``DRIFT``: 5, 50 and 500
  records/s, written evenly) is WARN within ``DRIFT_WARN_BOUND_S`` (30 min) of slowing down,
  whatever the rate, stays WARN, and is nothing worse.

CI runs ``SIM_HOURS`` (12 h) per healthy profile and ``DEAD_RUNS`` (8) deaths per dead profile
in a few seconds; ``KAFKA_MONITOR_LAG_SIM_HOURS`` and ``KAFKA_MONITOR_LAG_SIM_DEAD_RUNS`` run
more.  ``bench/lag_sim_bench.py`` runs the same profiles against the rules before issue 14,
before issue 35 and now, and writes the figures to ``bench/results/lag-simulation.json``.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

from tests.support.lag_simulation import (DEAD, DEAD_SLOW_STOP_BOUND_S, DEAD_STOP_BOUND_S, DRIFT, DRIFT_WARN_BOUND_S,
                                          ERR_ABS_S, ERR_REL, FALLING, FALLING_WARN_BOUND_S, HEALTHY, PROFILES,
                                          START_ERR_REL, WARMUP_S, Run, alerts_opened, dead_figures,
                                          first_status_after, seed_of, simulate)

SIM_HOURS = float(os.environ.get("KAFKA_MONITOR_LAG_SIM_HOURS", "12"))
DEAD_RUNS = int(os.environ.get("KAFKA_MONITOR_LAG_SIM_DEAD_RUNS", "8"))
DRIFT_RUNS = 2


@functools.lru_cache(maxsize=None)
def _healthy_run(name: str) -> Run:
    return simulate(PROFILES[name], SIM_HOURS, seed_of(name))


@pytest.mark.parametrize("profile", HEALTHY, ids=[p.name for p in HEALTHY])
def test_healthy_consumers_raise_no_lag_alert(profile):
    run = _healthy_run(profile.name)
    # a long_gaps profile: the gap under way at the monitor's start may alert (nothing known yet)
    since = run.first_commit_ms if profile.long_gaps else 0
    assert since is not None
    assert [x for x in run.transitions if x[0] >= since and x[2] == "open"] == [], \
        (profile.what, run.transitions[:10])
    not_ok = [(int(t), s) for t, s in zip(run.t_ms, run.statuses) if s != "OK" and t >= since]
    assert not_ok == [], not_ok[:10]
    if not profile.long_gaps:
        assert alerts_opened(run) == {}


@pytest.mark.parametrize("profile", HEALTHY + [FALLING], ids=[p.name for p in HEALTHY + [FALLING]])
def test_lag_seconds_estimate_is_close_to_the_true_age_of_the_oldest_unconsumed_record(profile):
    run = _healthy_run(profile.name) if profile.kind == "healthy" else simulate(profile, 2.0, seed_of(profile.name))
    t = (run.t_ms - run.t_ms[0]) / 1000.0
    late = t >= WARMUP_S
    err = run.est - run.true
    bound = np.maximum(ERR_ABS_S, ERR_REL * run.true)
    bad = late & (np.abs(err) > bound)
    assert not bad.any(), [(float(t[i]), float(run.true[i]), float(run.est[i]), run.basis[i])
                           for i in np.flatnonzero(bad)[:10]]
    # before WARMUP_S of history, the estimate never overshoots beyond the bound (a long_gaps
    # profile: its first records were written long before the monitor's first observation)
    start = np.maximum(ERR_ABS_S, (START_ERR_REL if profile.long_gaps else ERR_REL) * run.true)
    assert not (~late & (err > start)).any()
    assert np.isfinite(run.est).all() and (run.est >= 0).all()


@pytest.mark.parametrize("profile", DEAD, ids=[p.name for p in DEAD])
def test_dead_consumers_are_stall_then_stop_never_warn(profile):
    bound = DEAD_SLOW_STOP_BOUND_S if profile.commit == "records" else DEAD_STOP_BOUND_S
    hours = (profile.dies_at_s + bound + 300.0) / 3600.0
    for i in range(DEAD_RUNS):
        run = simulate(profile, hours, seed_of(profile.name, i))
        f = dead_figures(run)
        assert f["alerts_before_death"] == 0 and f["not_ok_before_death"] == 0, f
        assert f["warn_after_death"] == 0, f
        assert f["first_status_after_death"] == "STALL", f
        assert f["stall_s"] is not None and f["stop_s"] is not None and f["stall_s"] < f["stop_s"] <= bound, f
        after = [s for t, s in zip(run.t_ms.tolist(), run.statuses) if t >= run.death_t_ms + f["stop_s"] * 1000]
        assert set(after) == {"STOP"}, f   # STOP stays


@pytest.mark.parametrize("i", range(4))
def test_a_consumer_slower_than_its_producers_is_warn_and_nothing_worse(i):
    run = simulate(FALLING, 1.0, seed_of(FALLING.name, i))
    seen = {s for s in run.statuses}
    assert seen <= {"OK", "WARN"}, seen
    slow_from = int(run.t_ms[0]) + int(FALLING.slow_from_s * 1000)
    assert "WARN" not in [s for t, s in zip(run.t_ms.tolist(), run.statuses) if t < slow_from]
    first = first_status_after(run, "WARN", slow_from)
    assert first is not None and first <= FALLING_WARN_BOUND_S, first
    # once WARN, it stays WARN: the lag keeps growing
    k = run.statuses.index("WARN")
    assert set(run.statuses[k:]) == {"WARN"}


@pytest.mark.parametrize("profile", DRIFT, ids=[p.name for p in DRIFT])
def test_a_consumer_slightly_slower_than_its_producers_is_warn_within_the_bound_whatever_their_rate(profile):
    """Issue 35: at 90-99 % of the producers' speed the lag in seconds rises 0.01-0.1 s per s;
    the long series of commit samples makes it WARN within DRIFT_WARN_BOUND_S of slowing down
    (records written evenly: the slope is steady), never before, and it stays WARN."""
    for i in range(DRIFT_RUNS):
        run = simulate(profile, 1.0, seed_of(profile.name, i))
        slow_from = int(run.t_ms[0]) + int(profile.slow_from_s * 1000)
        assert {s for s in run.statuses} <= {"OK", "WARN"}
        assert "WARN" not in [s for t, s in zip(run.t_ms.tolist(), run.statuses) if t < slow_from]
        first = first_status_after(run, "WARN", slow_from)
        assert first is not None and first <= DRIFT_WARN_BOUND_S, (i, first)
        k = run.statuses.index("WARN")
        assert set(run.statuses[k:]) == {"WARN"}, i


def test_the_simulator_knows_the_true_lag():
    """The truth the estimates are compared with: a stopped consumer's true lag grows 1 s per
    second, an auto-committing one that keeps up is never more than a few seconds behind."""
    run = simulate(DEAD[0], 0.5, 1)
    after = run.t_ms >= run.death_t_ms + 20_000
    d = np.diff(run.true[after])
    assert np.allclose(d, np.diff(run.t_ms[after]) / 1000.0, atol=0.25)
    run = simulate(HEALTHY[0], 0.5, 1)
    assert run.true.max() <= 6.0
