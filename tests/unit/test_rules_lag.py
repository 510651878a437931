"""The correctness proof for the consumer-lag rules (streaming.rules_lag): tables of observation
sequences (t seconds, committed, HW), one observation per probe interval (10 s), -> the status
after every observation, the lag in seconds, and the transitions (and nothing else).

Statuses are written as run-length strings: "OK*10 STALL*22 STOP*3" is ten OK observations,
then 22 STALL, then 3 STOP.  Default config unless a case says otherwise: window 10, min_points
3, stop_after_ms 300 s, rewind_confirmations 2, lag_high_offsets 10 000, lag_high_seconds 300.
"""

from __future__ import annotations

import copy
import json
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming import rules
from streaming import rules_lag as L
from streaming.rules import Alert, Severity
from streaming.rules_lag import LagConfig, LagStatus

E = "group_partition|k|g|t|0"
CFG = LagConfig()


def feed(seq, cfg=CFG, state=None):
    """Feed (t_seconds, committed, hw) observations; return (statuses after each, transitions
    as (t_seconds, alert, action, severity, status named in the evidence), final state)."""
    s = state if state is not None else rules.new_group_partition("k", "g", "t", 0)
    statuses, out = [], []
    for t, c, hw in seq:
        for x in L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, cfg):
            out.append((x.at // 1000, x.alert, x.action, x.severity, x.evidence.get("status")))
        statuses.append(s["status"])
    return statuses, out, s


def feed_raw(seq, cfg=CFG):
    s = rules.new_group_partition("k", "g", "t", 0)
    out = []
    for t, c, hw in seq:
        out += L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, cfg)
    return out, s


def runs(spec: str) -> list:
    """"OK*2 WARN" -> ["OK", "OK", "WARN"]."""
    out = []
    for part in spec.split():
        name, _, n = part.partition("*")
        out += [None if name == "None" else name] * int(n or 1)
    return out


def moving(n, lag, step=1000, t0=0, c0=0):
    """A consumer committing ``step`` offsets per 10 s with the given lag per point."""
    lags = lag if isinstance(lag, list) else [lag] * n
    return [(t0 + 10 * i, c0 + step * i, c0 + step * i + lags[i]) for i in range(n)]


# --- scenarios --------------------------------------------------------------------------

# stopped consumer: caught up at t=0, then never commits again while 10 records/s arrive
STOPPED = [(10 * i, 1000, 1000 + 100 * i) for i in range(35)]
# slow topic: one record every 10 min, the consumer commits it by the next observation
SLOW_TOPIC = [(10 * i, 5000 + i // 60 - (1 if i % 60 == 0 and i else 0), 5000 + i // 60) for i in range(361)]
# idle topic, consumer caught up, nothing moves for an hour
IDLE_TOPIC = [(10 * i, 5000, 5000) for i in range(361)]
# a stuck consumer (lag 50) on a topic that receives nothing any more
STUCK_IDLE = [(10 * i, 4950, 5000) for i in range(40)]
# broker deploy: one observation reports an older commit, then the real one again; long enough
# for the point before the blip to leave the window (the blip must not then pass for a real offset)
BLIP = moving(5, 50) + [(50, 2000, 5050)] + moving(14, 50, t0=60, c0=6000)
# a blip on the last observation is held (not yet REWIND, not counted in the trend)
BLIP_LAST = moving(6, 50) + [(60, 1000, 6050)]
# a real reset to offset 0 that persists, the consumer then re-reads at 100 per 10 s
REWIND = moving(6, 50) + [(60 + 10 * k, 100 * k, 6050 + 1000 * k) for k in range(15)]
# reset, then the consumer races back past its old offset
REWIND_RECOVERS = moving(6, 50) + [(60, 1000, 6050), (70, 3000, 7050), (80, 8000, 8050), (90, 9000, 9050)]
# reset, and the re-read is so fast it is caught up at the next observation
REWIND_CAUGHT_UP = moving(6, 50) + [(60, 1000, 6050), (70, 7050, 7050)]
# lag rising with dips: Burrow's "lag grows between every pair" misses it
RISING_WITH_DIPS = moving(8, [100, 160, 140, 220, 200, 280, 260, 340])
# noise around a flat lag; over the last window slope > 0 and last > first
FLAT_NOISY = moving(10, [100, 104, 97, 103, 99, 102, 98, 105, 100, 103])
# consumer keeping up with a steady lag
STEADY = moving(15, 500)
# draining a backlog
DRAINING = moving(12, [5000 - 400 * i for i in range(12)])
# falling behind (WARN), then stops committing: with stop_after_ms 60 s, WARN -> STOP
WARN_THEN_STOP = (moving(8, [100 + 100 * i for i in range(8)])
                  + [(80 + 10 * k, 7000, 7900 + 1000 * (k + 1)) for k in range(10)])
# stuck for a while, then resumes and catches up
STALL_THEN_RESUMES = [(10 * i, 1000, 1000 + 10 * (i + 1)) for i in range(6)] + [(60, 1060, 1070), (70, 1080, 1080)]
# a stopped consumer whose commit blips lower once (broker deploy): the STOP timer keeps running
STOPPED_WITH_BLIP = [(10 * i, 1000 if i != 20 else 900, 1000 + 100 * i) for i in range(35)]

STATUS_CASES = [
    ("stopped consumer whose lag keeps growing between commits: STALL once the window holds no zero lag, "
     "STOP after 300 s", STOPPED, CFG, "OK*10 STALL*22 STOP*3"),
    ("slow topic, consumer caught up for an hour (lag 1 for one observation every 10 min): OK",
     SLOW_TOPIC, CFG, "OK*361"),
    ("idle topic, HW flat and committed == HW for an hour: OK, never STOP", IDLE_TOPIC, CFG, "OK*361"),
    ("stuck consumer on an idle topic: STALL, not STOP (its lag does not grow)", STUCK_IDLE, CFG, "OK*2 STALL*38"),
    ("broker deploy: one lower commit then back: not REWIND, no WARN", BLIP, CFG, "OK*20"),
    ("one lower commit at the latest observation is held, not REWIND yet", BLIP_LAST, CFG, "OK*7"),
    ("real rewind (reset to an earlier offset, persisted): REWIND from the confirmation while the drop is "
     "in the window, then the re-read's growing lag is WARN", REWIND, CFG, "OK*7 REWIND*8 WARN*6"),
    ("rewind_confirmations=3 needs three lower observations", REWIND, LagConfig(rewind_confirmations=3),
     "OK*8 REWIND*7 WARN*6"),
    ("rewind_confirmations=1: the first lower commit is a rewind", REWIND, LagConfig(rewind_confirmations=1),
     "OK*6 REWIND*9 WARN*6"),
    ("rewind then back past the old offset: REWIND ends", REWIND_RECOVERS, CFG, "OK*7 REWIND OK*2"),
    ("rewind but caught up: rule 1 wins", REWIND_CAUGHT_UP, CFG, "OK*8"),
    ("lag rising with dips: WARN", RISING_WITH_DIPS, CFG, "OK*3 WARN*5"),
    ("flat noisy lag: OK", FLAT_NOISY, CFG, "OK*10"),
    ("steady lag, consumer keeping up: OK", STEADY, CFG, "OK*15"),
    ("draining a backlog: OK", DRAINING, CFG, "OK*12"),
    ("falling behind, then stops: WARN -> STOP (stop_after_ms 60 s)", WARN_THEN_STOP, LagConfig(stop_after_ms=60_000),
     "OK*2 WARN*12 STOP*4"),
    ("stuck, then resumes and catches up: STALL -> OK", STALL_THEN_RESUMES, CFG, "OK*2 STALL*4 OK*2"),
    ("stopped consumer with one lower commit in between: the STOP timer is not reset", STOPPED_WITH_BLIP, CFG,
     "OK*10 STALL*22 STOP*3"),
]


@pytest.mark.parametrize("name, seq, cfg, expected", STATUS_CASES, ids=[c[0] for c in STATUS_CASES])
def test_status_after_each_observation(name, seq, cfg, expected):
    statuses, _, _ = feed(seq, cfg)
    assert statuses == runs(expected)


TRANSITION_CASES = [
    ("stopped consumer: STALL opens (warning), lag seconds > 300 opens ConsumerLagHigh, STOP replaces STALL (critical)",
     STOPPED, CFG,
     [(100, Alert.CONSUMER_LAG_STATUS, "open", Severity.WARNING, "STALL"),
      (310, Alert.CONSUMER_LAG_HIGH, "open", Severity.WARNING, None),
      (320, Alert.CONSUMER_LAG_STATUS, "resolve", Severity.WARNING, "STOP"),
      (320, Alert.CONSUMER_LAG_STATUS, "open", Severity.CRITICAL, "STOP")]),
    ("slow topic caught up for an hour: nothing", SLOW_TOPIC, CFG, []),
    ("idle topic: nothing", IDLE_TOPIC, CFG, []),
    ("broker deploy blip: nothing", BLIP, CFG, []),
    ("flat noisy lag: nothing", FLAT_NOISY, CFG, []),
    ("stuck on an idle topic: STALL, and its lag in seconds (from the stuck run) passes 300 s",
     STUCK_IDLE, CFG,
     [(20, Alert.CONSUMER_LAG_STATUS, "open", Severity.WARNING, "STALL"),
      (310, Alert.CONSUMER_LAG_HIGH, "open", Severity.WARNING, None)]),
    ("real rewind: REWIND (critical), then ConsumerLagHigh (offsets) and REWIND -> WARN", REWIND, CFG,
     [(70, Alert.CONSUMER_LAG_STATUS, "open", Severity.CRITICAL, "REWIND"),
      (110, Alert.CONSUMER_LAG_HIGH, "open", Severity.WARNING, None),
      (150, Alert.CONSUMER_LAG_STATUS, "resolve", Severity.CRITICAL, "WARN"),
      (150, Alert.CONSUMER_LAG_STATUS, "open", Severity.WARNING, "WARN")]),
    ("WARN -> STOP resolves the WARN and opens a STOP", WARN_THEN_STOP, LagConfig(stop_after_ms=60_000),
     [(20, Alert.CONSUMER_LAG_STATUS, "open", Severity.WARNING, "WARN"),
      (140, Alert.CONSUMER_LAG_STATUS, "resolve", Severity.WARNING, "STOP"),
      (140, Alert.CONSUMER_LAG_STATUS, "open", Severity.CRITICAL, "STOP"),
      (170, Alert.CONSUMER_LAG_HIGH, "open", Severity.WARNING, None)]),
    ("STALL then resumes: resolves", STALL_THEN_RESUMES, CFG,
     [(20, Alert.CONSUMER_LAG_STATUS, "open", Severity.WARNING, "STALL"),
      (60, Alert.CONSUMER_LAG_STATUS, "resolve", Severity.WARNING, "OK")]),
]


@pytest.mark.parametrize("name, seq, cfg, expected", TRANSITION_CASES, ids=[c[0] for c in TRANSITION_CASES])
def test_transitions(name, seq, cfg, expected):
    _, got, _ = feed(seq, cfg)
    assert got == expected


def test_stopped_consumer_lag_is_recomputed_at_every_observation_not_only_on_commit():
    """Burrow's "stale lag, updated only when the consumer commits": here each probe
    observation recomputes lag from the current HW, so a dead consumer's lag keeps growing."""
    s = rules.new_group_partition("k", "g", "t", 0)
    lags, secs = [], []
    for t, c, hw in STOPPED:
        L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, CFG)
        lags.append(s["lag"])
        secs.append(s["lag_seconds"])
    assert lags == [100 * i for i in range(35)]
    # the HW was at 1000 at t=0: the lag in seconds is the time since then, exactly, throughout
    assert secs == [float(10 * i) for i in range(35)]
    assert s["committed"] == 1000 and s["hw"] == 4400 and s["last_seen"] == 340_000


# --- lag in seconds ---------------------------------------------------------------------

def H(*pts):
    """History from (t seconds, hw) pairs; committed is irrelevant to the HW history."""
    return [[t * 1000, 0, hw] for t, hw in pts]


LINEAR = H(*[(10 * i, 1000 + 100 * i) for i in range(10)])  # 10 offsets/s, t 0..90

LAG_SECONDS_CASES = [
    # id, history, committed, now (s), cfg, behind_since (s), expected (seconds, basis)
    ("committed None -> None (no commit: no lag, not an infinite one)", LINEAR, None, 90, CFG, None, None),
    ("no history -> None", [], 10, 90, CFG, None, None),
    ("idle topic: HW flat, committed == HW -> 0", H((0, 5000), (10, 5000), (20, 5000), (30, 5000)), 5000, 30, CFG,
     None, (0.0, "caught-up")),
    ("committed above HW (HW read before the commit) -> 0, never negative", LINEAR, 5000, 90, CFG, None,
     (0.0, "caught-up")),
    ("interpolated between the two points that straddle it", H((0, 1000), (10, 2000)), 1500, 10, CFG, None,
     (5.0, "interpolated")),
    ("evaluated later than the latest point: grows with now", H((0, 1000), (10, 2000)), 1500, 40, CFG, None,
     (35.0, "interpolated")),
    ("HW flat for several points, committed behind: finite, interpolated where HW crossed it",
     H((0, 100), (10, 200), (20, 200), (30, 200), (40, 200)), 150, 40, CFG, None, (35.0, "interpolated")),
    ("HW flat at the committed value: the EARLIEST time HW reached it, not a later point with the same HW",
     H((0, 100), (10, 200), (20, 200), (30, 200), (40, 300)), 200, 40, CFG, None, (30.0, "interpolated")),
    ("HW regressed once (new leader with a lagging HW): still the first crossing, finite",
     H((0, 1000), (10, 2000), (20, 1500), (30, 2500)), 1800, 30, CFG, None, (22.0, "interpolated")),
    ("committed older than the oldest point: extrapolated with the window's HW rate", LINEAR, 500, 90, CFG, None,
     (140.0, "extrapolated")),
    ("extrapolation capped at max_extrapolation_ms before the oldest point: a lower bound", LINEAR, 0, 90,
     LagConfig(max_extrapolation_ms=60_000), None, (150.0, "lower-bound")),
    ("extrapolation cap 0: the oldest point's age, a lower bound", LINEAR, 500, 90,
     LagConfig(max_extrapolation_ms=0), None, (90.0, "lower-bound")),
    ("HW flat over the whole window, committed behind: no rate, the oldest point's age is a lower bound",
     H(*[(10 * i, 5000) for i in range(10)]), 4000, 90, CFG, None, (90.0, "lower-bound")),
    ("HW exactly at the committed offset at the oldest point: at least that old", LINEAR, 1000, 90, CFG, None,
     (90.0, "lower-bound")),
    ("single point behind: 0 s so far, a lower bound", H((0, 20)), 10, 0, CFG, None, (0.0, "lower-bound")),
    ("known behind since before the window (stuck run): at least now - that time",
     H(*[(10 * i, 5000) for i in range(10)]), 4000, 90, CFG, -600, (690.0, "lower-bound")),
    ("known behind since, but the interpolation is older already: the interpolation stands",
     H((0, 1000), (10, 2000)), 1500, 10, CFG, 8, (5.0, "interpolated")),
    ("now before the crossing (misuse): clamped to 0, never negative", H((0, 1000), (10, 2000)), 1500, 2, CFG, None,
     (0.0, "interpolated")),
]


@pytest.mark.parametrize("name, history, committed, now, cfg, behind, expected", LAG_SECONDS_CASES,
                         ids=[c[0] for c in LAG_SECONDS_CASES])
def test_lag_seconds(name, history, committed, now, cfg, behind, expected):
    behind_ms = None if behind is None else behind * 1000
    est = L.estimate_lag_seconds(history, committed, now * 1000, cfg, behind_since=behind_ms)
    got = None if est is None else (est.seconds, est.basis)
    assert got == expected
    number = L.lag_seconds(history, committed, now * 1000, cfg, behind_since=behind_ms)
    assert number == (None if expected is None else expected[0])
    if est is not None:
        assert est.lower_bound == (est.basis == "lower-bound")


def test_lag_seconds_evidence_says_when_it_is_a_lower_bound():
    """A consumer 1 000 000 offsets behind on a 10 offsets/s partition: 28 h by the rate,
    reported as max_extrapolation_ms (1 h) before the oldest point, flagged as a lower bound."""
    seq = [(10 * i, 0, 1_000_000 + 100 * i) for i in range(3)]
    out, s = feed_raw(seq, LagConfig(lag_high_offsets=None))
    assert s["lag_seconds"] == 3600.0 + 20.0 and s["lag_seconds_basis"] == "lower-bound"
    high = [x for x in out if x.alert is Alert.CONSUMER_LAG_HIGH]
    assert [x.at for x in high] == [10_000]  # one point: no rate yet, 0 s so far (a lower bound)
    assert high[0].evidence["lag_seconds"] == 3610.0 and high[0].evidence["lag_seconds_is_lower_bound"] is True
    assert high[0].evidence["tripped"] == ["seconds"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60_000), st.integers(0, 10_000)), min_size=1, max_size=20),
       st.integers(0, 200_000), st.integers(0, 3_600_000), st.integers(0, 7_200_000))
def test_lag_seconds_is_always_finite_non_negative_and_bounded(steps, committed, max_extra, later):
    t, hw, history = 0, 0, []
    for dt, dhw in steps:  # strictly increasing time, non-decreasing HW
        t, hw = t + dt, hw + dhw
        history.append([t, 0, hw])
    now = t + later
    cfg = LagConfig(max_extrapolation_ms=max_extra)
    est = L.estimate_lag_seconds(history, committed, now, cfg)
    assert math.isfinite(est.seconds) and est.seconds >= 0
    assert (est.basis == "caught-up") == (committed >= hw)
    # never more than the oldest point's age plus the extrapolation cap (ms precision)
    assert est.seconds <= (now - history[0][0] + max_extra) / 1000.0 + 0.001
    if est.basis == "interpolated":
        assert est.seconds <= (now - history[0][0]) / 1000.0 + 0.001


# --- evaluate_status: the rules in isolation --------------------------------------------

def P(*pts):
    """History from (t seconds, committed, hw)."""
    return [[t * 1000, c, hw] for t, c, hw in pts]


EVAL_CASES = [
    ("empty history", [], None, (LagStatus.OK, L.RULE_FEW_POINTS)),
    ("1: lag 0 at the latest point, committed unchanged for an hour", P((0, 5, 5), (3600, 5, 5)), None,
     (LagStatus.OK, L.RULE_CAUGHT_UP)),
    ("1: caught up at the latest point after a long stuck run", P((0, 5, 9), (10, 5, 9), (20, 5, 9), (30, 9, 9)), None,
     (LagStatus.OK, L.RULE_CAUGHT_UP)),
    ("2: confirmed rewind", P((0, 100, 150), (10, 200, 250), (20, 50, 300), (30, 60, 350)), None,
     (LagStatus.REWIND, L.RULE_REWIND)),
    ("2: a single lower commit at the end is not (yet) a rewind", P((0, 100, 150), (10, 200, 250), (20, 50, 300)), None,
     (LagStatus.OK, L.RULE_FEW_POINTS)),
    ("3: stuck beyond the window (the state's stuck run) with the HW moving -> STOP",
     P((400, 10, 500), (410, 10, 600), (420, 10, 700)), [0, 10, 20], (LagStatus.STOP, L.RULE_STOP)),
    ("3 needs the HW to have moved: stuck beyond stop_after_ms on a flat HW is STALL",
     P((400, 10, 20), (410, 10, 20), (420, 10, 20)), [0, 10, 20], (LagStatus.STALL, L.RULE_STALL)),
    ("3 needs lag > 0 throughout: an older stuck run of a different offset does not count",
     P((400, 11, 500), (410, 11, 600), (420, 11, 700)), [0, 10, 20], (LagStatus.STALL, L.RULE_STALL)),
    ("few points: OK even when stuck", P((0, 10, 20), (10, 10, 30)), None, (LagStatus.OK, L.RULE_FEW_POINTS)),
    ("4: stuck over the whole window", P((0, 10, 20), (10, 10, 30), (20, 10, 40)), None,
     (LagStatus.STALL, L.RULE_STALL)),
    ("4 needs lag > 0 at every point", P((0, 10, 10), (10, 10, 30), (20, 10, 40)), None, (LagStatus.OK, L.RULE_OK)),
    ("5: moving, lag rising", P((0, 0, 100), (10, 1000, 1200), (20, 2000, 2300)), None,
     (LagStatus.WARN, L.RULE_LAG_RISING)),
    ("5: rising but the last lag is not above the first", P((0, 0, 100), (10, 1000, 1400), (20, 2000, 2300),
                                                            (30, 3000, 3100)), None, (LagStatus.OK, L.RULE_OK)),
    ("6: moving, lag flat", P((0, 0, 100), (10, 1000, 1100), (20, 2000, 2100)), None, (LagStatus.OK, L.RULE_OK)),
]


@pytest.mark.parametrize("name, history, stuck, expected", EVAL_CASES, ids=[c[0] for c in EVAL_CASES])
def test_evaluate_status(name, history, stuck, expected):
    stuck_ms = None if stuck is None else [stuck[0] * 1000, stuck[1], stuck[2]]
    now = history[-1][0] if history else 0
    assert L.evaluate_status(history, CFG, now, stuck=stuck_ms) == expected


def test_flat_noisy_window_would_fool_a_naive_slope_rule():
    """The noise test is what keeps FLAT_NOISY OK: on its last window the least-squares slope
    is > 0 and the last lag is above the first, which is all a naive rule asks."""
    view = [[t * 1000, c, hw] for t, c, hw in FLAT_NOISY]
    tr = L._trend(view)
    assert tr["slope_per_s"] > 0 and tr["last_lag"] > tr["first_lag"]
    assert tr["rise"] <= L.TREND_NOISE_FACTOR * tr["noise"]
    assert L.evaluate_status(view, CFG, view[-1][0]) == (LagStatus.OK, L.RULE_OK)


def test_rising_with_dips_is_not_monotone_so_burrows_rule_3_would_miss_it():
    lags = [hw - c for _, c, hw in RISING_WITH_DIPS]
    assert any(b < a for a, b in zip(lags, lags[1:]))
    assert L.evaluate_status(P(*RISING_WITH_DIPS), CFG)[0] is LagStatus.WARN


# --- transitions: ids, evidence, severities ---------------------------------------------

def test_consumer_lag_high_by_offsets_opens_and_resolves_with_the_same_id_then_reopens_with_a_new_one():
    seq = moving(3, 500) + moving(2, 20_000, t0=30, c0=3000) + moving(2, 500, t0=50, c0=5000) + \
        moving(1, 15_000, t0=70, c0=7000)
    out, s = feed_raw(seq, LagConfig(lag_high_seconds=None))
    high = [x for x in out if x.alert is Alert.CONSUMER_LAG_HIGH]
    assert [(x.at, x.action) for x in high] == [(30_000, "open"), (50_000, "resolve"), (70_000, "open")]
    opened, resolved, again = high
    assert opened.evidence["tripped"] == ["offsets"] and opened.evidence["lag"] == 20_000
    assert opened.evidence["lag_high_offsets"] == 10_000 and opened.evidence["lag_high_seconds"] is None
    assert opened.labels == {"cluster": "k", "group": "g", "topic": "t", "partition": 0}
    assert opened.severity is Severity.WARNING
    assert resolved.alert_id == opened.alert_id and resolved.evidence["open_since"] == 30_000
    assert resolved.evidence["tripped"] == [] and resolved.evidence["lag"] == 500
    assert again.alert_id not in (opened.alert_id,)
    assert s["open"][Alert.CONSUMER_LAG_HIGH.value]["id"] == again.alert_id


def test_consumer_lag_high_by_seconds_says_which_threshold_tripped():
    out, _ = feed_raw(STOPPED)
    high = [x for x in out if x.alert is Alert.CONSUMER_LAG_HIGH][0]
    assert high.at == 310_000
    assert high.evidence["tripped"] == ["seconds"]
    assert high.evidence["lag_seconds"] == 310.0 and high.evidence["lag"] == 3100


def test_consumer_lag_high_disabled_when_both_thresholds_are_none():
    out, _ = feed_raw(STOPPED, LagConfig(lag_high_offsets=None, lag_high_seconds=None))
    assert [x for x in out if x.alert is Alert.CONSUMER_LAG_HIGH] == []


def test_status_change_resolves_the_old_alert_and_opens_a_new_one_with_a_new_id_and_severity():
    out, s = feed_raw(WARN_THEN_STOP, LagConfig(stop_after_ms=60_000))
    status = [x for x in out if x.alert is Alert.CONSUMER_LAG_STATUS]
    warn_open, warn_resolve, stop_open = status
    assert (warn_open.action, warn_open.evidence["status"], warn_open.severity) == ("open", "WARN", Severity.WARNING)
    assert warn_resolve.action == "resolve" and warn_resolve.alert_id == warn_open.alert_id
    assert warn_resolve.severity is Severity.WARNING and warn_resolve.evidence["open_since"] == warn_open.at
    assert (stop_open.action, stop_open.evidence["status"], stop_open.severity) == ("open", "STOP", Severity.CRITICAL)
    assert stop_open.alert_id != warn_open.alert_id and stop_open.at == warn_resolve.at
    assert s["open"][Alert.CONSUMER_LAG_STATUS.value]["id"] == stop_open.alert_id
    # evidence: the rule and the (t, committed, hw, lag) points it looked at
    assert warn_open.evidence["rule"] == L.RULE_LAG_RISING
    assert warn_open.evidence["points"] == [[0, 0, 100, 100], [10_000, 1000, 1200, 200], [20_000, 2000, 2300, 300]]
    assert warn_open.evidence["slope_per_s"] == 10.0
    assert stop_open.evidence["rule"] == L.RULE_STOP
    assert stop_open.evidence["stuck_since"] == 70_000 and stop_open.evidence["stuck_for_ms"] == 70_000
    assert len(stop_open.evidence["points"]) == CFG.window
    assert all(p[3] == p[2] - p[1] for p in stop_open.evidence["points"])


def test_rewind_evidence_names_the_offsets():
    out, _ = feed_raw(REWIND)
    rw = [x for x in out if x.alert is Alert.CONSUMER_LAG_STATUS][0]
    assert rw.evidence["status"] == "REWIND" and rw.evidence["rule"] == L.RULE_REWIND
    assert (rw.evidence["from_offset"], rw.evidence["to_offset"], rw.evidence["at"]) == (5000, 0, 60_000)
    assert rw.evidence["confirmations"] == 2


def test_a_held_blip_is_shown_as_set_aside():
    statuses, _, s = feed(BLIP_LAST)
    v = L.evaluate(s["history"], CFG, 60_000, s["stuck"])
    assert v.set_aside == [[60_000, 1000, 6050]] and v.view[-1] == [50_000, 5000, 5050]


def test_a_recognised_blip_is_dropped_from_the_stored_history():
    _, _, s = feed(BLIP[:7])
    assert [p[0] for p in s["history"]] == [0, 10_000, 20_000, 30_000, 40_000, 60_000]
    assert all(b[1] >= a[1] for a, b in zip(s["history"], s["history"][1:]))


def test_no_committed_offset_means_no_lag_and_no_alerts():
    seq = [(10 * i, None, 1000 + 100 * i) for i in range(40)]
    statuses, out, s = feed(seq)
    assert out == [] and statuses == [None] * 40
    assert (s["committed"], s["lag"], s["lag_seconds"], s["status"]) == (None, None, None, None)
    assert s["hw"] == 4900


def test_committed_offset_disappearing_resolves_open_alerts():
    statuses, out, s = feed(STOPPED + [(350, None, 4500)])
    assert statuses[-1] is None and s["lag"] is None and s["lag_seconds"] is None and s["stuck"] is None
    assert out[-2:] == [(350, Alert.CONSUMER_LAG_HIGH, "resolve", Severity.WARNING, None),
                        (350, Alert.CONSUMER_LAG_STATUS, "resolve", Severity.CRITICAL, None)]
    assert s["open"] == {}


def test_unknown_hw_changes_neither_status_nor_alerts():
    _, _, s = feed(STOPPED)
    before = copy.deepcopy(s)
    assert L.on_group_offsets(s, {"committed_offset": 1000, "high_watermark": None}, 350_000, E, CFG) == []
    assert s["lag"] is None and s["lag_seconds"] is None and s["last_seen"] == 350_000
    assert (s["status"], s["open"], s["history"]) == (before["status"], before["open"], before["history"])


def test_lag_is_never_negative():
    _, _, s = feed([(0, 120, 100)])  # commit read after the HW
    assert (s["lag"], s["lag_seconds"], s["status"]) == (0, 0.0, "OK")


# --- every status handled ---------------------------------------------------------------

def test_statuses_are_ordered_and_every_status_has_a_severity_mapping():
    assert list(LagStatus) == sorted(LagStatus)
    assert [s.name for s in LagStatus] == ["OK", "WARN", "STALL", "STOP", "REWIND"]
    assert set(L.STATUS_SEVERITY) == set(LagStatus)
    assert L.STATUS_SEVERITY[LagStatus.OK] is None
    non_ok = [L.STATUS_SEVERITY[s] for s in LagStatus if s is not LagStatus.OK]
    assert all(isinstance(v, Severity) for v in non_ok)
    assert non_ok == sorted(non_ok)  # more severe status -> no lighter page


def test_exporter_gauge_values_are_the_status_values():
    from streaming.exporter import LAG_STATUS_VALUE
    assert LAG_STATUS_VALUE == {s.name: int(s) for s in LagStatus}


def test_every_status_is_produced_by_a_table_case_and_alerts_with_its_severity():
    seen = {}
    for _, seq, cfg, _ in STATUS_CASES:
        statuses, out, _ = feed(seq, cfg)
        for name in statuses:
            seen.setdefault(name, [])
        for t, alert, action, sev, status in out:
            if alert is Alert.CONSUMER_LAG_STATUS and action == "open":
                seen[status].append(sev)
    assert set(seen) == {s.name for s in LagStatus}
    for status in LagStatus:
        expected = L.STATUS_SEVERITY[status]
        assert seen[status.name] == [] if expected is None else (seen[status.name] and
                                                                 set(seen[status.name]) == {expected})


# --- bounded, ordered, deterministic, serialisable --------------------------------------

def test_history_never_exceeds_the_window():
    for cfg in (CFG, LagConfig(window=3), LagConfig(window=64, min_points=3)):
        s = rules.new_group_partition("k", "g", "t", 0)
        for t, c, hw in STOPPED * 1 + [(350 + 10 * i, 1000 + i, 5000 + i) for i in range(100)]:
            L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, cfg)
            assert len(s["history"]) <= cfg.window
        assert len(s["history"]) == cfg.window
        assert s["history"][-1] == [1_340_000, 1099, 5099]


@pytest.mark.parametrize("t", [340, 300, 0], ids=["replay of the latest", "older", "much older"])
def test_observations_at_or_before_the_last_one_are_ignored(t):
    _, _, s = feed(STOPPED)
    before = copy.deepcopy(s)
    assert L.on_group_offsets(s, {"committed_offset": 1, "high_watermark": 99_999}, t * 1000, E, CFG) == []
    assert s == before


def test_same_input_same_output():
    for _, seq, cfg, _ in STATUS_CASES:
        a, b = feed_raw(seq, cfg), feed_raw(seq, cfg)
        assert a[0] == b[0] and a[1] == b[1]


def _plain(v) -> bool:
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    if isinstance(v, list):
        return all(_plain(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str))


def test_state_is_plain_json_and_pickle_serialisable_in_every_status():
    for _, seq, cfg, _ in STATUS_CASES:
        s = rules.new_group_partition("k", "g", "t", 0)
        for t, c, hw in seq:
            L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, cfg)
            assert _plain(s), s
        assert json.loads(json.dumps(s)) == s
        assert pickle.loads(pickle.dumps(s)) == s


def test_state_round_trip_mid_stream_gives_the_same_result():
    """The state store serialises between micro-batches: resuming from a JSON copy changes nothing."""
    _, straight = feed_raw(STOPPED)
    s = rules.new_group_partition("k", "g", "t", 0)
    for t, c, hw in STOPPED:
        s = json.loads(json.dumps(s))
        L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, CFG)
    assert s == straight


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 120_000), st.one_of(st.none(), st.integers(0, 5000)),
                          st.one_of(st.none(), st.integers(0, 5000))), min_size=1, max_size=80))
def test_any_observation_stream_keeps_the_invariants(steps):
    s = rules.new_group_partition("k", "g", "t", 0)
    t = 0
    for dt, c, hw in steps:
        t += dt
        for x in L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t, E, CFG):
            assert x.alert in (Alert.CONSUMER_LAG_HIGH, Alert.CONSUMER_LAG_STATUS)
        assert len(s["history"]) <= CFG.window
        assert s["lag"] is None or s["lag"] >= 0
        assert s["lag_seconds"] is None or (math.isfinite(s["lag_seconds"]) and s["lag_seconds"] >= 0)
        assert s["status"] is None or s["status"] in LagStatus.__members__
        if Alert.CONSUMER_LAG_STATUS.value in s["open"]:
            assert s["status"] not in (None, "OK")
    assert _plain(s)


# --- configuration ----------------------------------------------------------------------

def test_defaults():
    assert (CFG.window, CFG.lag_high_offsets, CFG.lag_high_seconds, CFG.stop_after_ms, CFG.rewind_confirmations,
            CFG.max_extrapolation_ms, CFG.min_points) == (10, 10_000, 300.0, 300_000, 2, 3_600_000, 3)
    with pytest.raises(Exception):
        CFG.window = 5  # frozen


@pytest.mark.parametrize("kw, path", [
    ({"window": 2}, "lag.window"),
    ({"window": 65}, "lag.window"),
    ({"window": 10.0}, "lag.window"),
    ({"window": True}, "lag.window"),
    ({"lag_high_offsets": -1}, "lag.lag_high_offsets"),
    ({"lag_high_seconds": float("nan")}, "lag.lag_high_seconds"),
    ({"lag_high_seconds": -1.0}, "lag.lag_high_seconds"),
    ({"stop_after_ms": 0}, "lag.stop_after_ms"),
    ({"rewind_confirmations": 0}, "lag.rewind_confirmations"),
    ({"rewind_confirmations": 10}, "lag.rewind_confirmations"),  # needs the point before the drop in the window
    ({"max_extrapolation_ms": -1}, "lag.max_extrapolation_ms"),
    ({"min_points": 2}, "lag.min_points"),
    ({"min_points": 11}, "lag.min_points"),
])
def test_invalid_config_names_the_setting(kw, path):
    with pytest.raises(ValueError, match=f"^{path}: "):
        LagConfig(**kw)


def test_valid_edge_configs():
    assert LagConfig(window=64, rewind_confirmations=63, min_points=64).validate().window == 64
    assert LagConfig(lag_high_offsets=None, lag_high_seconds=None, max_extrapolation_ms=0).lag_high_seconds is None
