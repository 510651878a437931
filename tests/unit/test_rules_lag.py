"""The correctness proof for the consumer-lag rules (streaming.rules.lag): tables of observation
sequences (t seconds, committed, HW), one observation per probe interval (10 s), -> the status
after every observation, the lag in seconds, and the transitions (and nothing else).

Statuses are written as run-length strings: "OK*19 STALL*21 STOP*10" is 19 OK observations,
then 21 STALL, then 10 STOP.  Default config unless a case says otherwise: window 10, stall
after 90 s / stop after 300 s or 3 x / 6 x the commit cadence, rewind_confirmations 2, blips
at most 30 s, WARN from a 30 s rise, ConsumerLagHigh above 10 000 offsets or 300 s held 60 s.
The reasoning behind each rule: docs/lag-rules.md.
"""

from __future__ import annotations

import dataclasses
import copy
import json
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.rules import lag as L
from streaming.rules import lag_config as LC
from streaming.rules import lag_estimate as LE
from streaming.rules import lag_status as LS
from streaming.rules.base import Alert, Severity
from streaming.rules.lag_config import LagConfig
from streaming.rules.lag_status import LagStatus

E = "group_partition|k|g|t|0"
CFG = LagConfig()
W, C = Severity.WARNING, Severity.CRITICAL
STATUS, HIGH = Alert.CONSUMER_LAG_STATUS, Alert.CONSUMER_LAG_HIGH


def feed(seq, cfg=CFG, state=None):
    """Feed (t_seconds, committed, hw) observations; return (statuses after each, transitions
    as (t_seconds, alert, action, severity, status named in the evidence), final state)."""
    s = state if state is not None else L.new_group_partition("k", "g", "t", 0)
    statuses, out = [], []
    for t, c, hw in seq:
        for x in L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, cfg):
            out.append((x.at // 1000, x.alert, x.action, x.severity, x.evidence.get("status")))
        statuses.append(s["status"])
    return statuses, out, s


def feed_raw(seq, cfg=CFG):
    s = L.new_group_partition("k", "g", "t", 0)
    out = []
    for t, c, hw in seq:
        out += L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, cfg)
    return out, s


def lag_seconds_after_each(seq, cfg=CFG):
    s = L.new_group_partition("k", "g", "t", 0)
    out = []
    for t, c, hw in seq:
        L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, cfg)
        out.append((s["lag_seconds"], s["lag_seconds_basis"]))
    return out


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

# A consumer committing at every observation, 50 records behind on 10 records/s, dies at ~95 s
# (last commit 1850, seen first at 90 s): the producers go on.  The monitor has seen it commit
# every 10 s, so STALL after 90 s and STOP after 300 s of sitting on 1850 with records waiting.
DEAD_WRITING = [(10 * i, 950 + 100 * i, 1000 + 100 * i) for i in range(10)] + \
    [(10 * i, 1850, 1000 + 100 * i) for i in range(10, 50)]
# The same consumer dies with 50 records waiting and the producers fall quiet: the HW stays at
# 4900.  Nobody will consume them: STALL, then STOP, exactly as when the lag grows.
DEAD_QUIET = [(10 * i, 3950 + 100 * i, 4000 + 100 * i) for i in range(10)] + \
    [(10 * i, 4850, 4900) for i in range(10, 50)]
# A freshly started monitor (no commit cadence known yet) sees a stuck consumer with 50 records
# waiting on a quiet topic: STALL after 90 s (it had all it needed to commit), STOP after 300 s.
STUCK_IDLE_FRESH = [(10 * i, 4950, 5000) for i in range(40)]
# A freshly started monitor sees a consumer caught up at 0 s that never commits again while 10
# records/s arrive.  Without a known cadence that is also a consumer filling a 1 000-record
# batch: nothing until stop_after_ms, then STOP.
STOPPED_FRESH = [(10 * i, 1000, 1000 + 100 * i) for i in range(35)]
# slow topic: one record every 10 min, the consumer commits it by the next observation
SLOW_TOPIC = [(10 * i, 5000 + i // 60 - (1 if i % 60 == 0 and i else 0), 5000 + i // 60) for i in range(361)]
# idle topic, consumer caught up, nothing moves for an hour
IDLE_TOPIC = [(10 * i, 5000, 5000) for i in range(361)]
# The issue's idle topic: caught up for 20 min; 100 records land at 1203 s and are consumed
# within 7 s; the probe observes at 1210 s before the commit, at 1220 s after it.
IDLE_THEN_100 = [(10 * i, 5000, 5000) for i in range(121)] + [(1210, 5000, 5100), (1220, 5100, 5100)]
# broker deploy: one observation reports an older commit, then the real one again; long enough
# for the point before the blip to leave the window (the blip must not then pass for a real offset)
BLIP = moving(5, 50) + [(50, 2000, 5050)] + moving(14, 50, t0=60, c0=6000)
# a blip on the last observation is held (not yet REWIND, not counted)
BLIP_LAST = moving(6, 50) + [(60, 1000, 6050)]
# One lower commit, then the HW is unknown for 90 s, then the consumer is past its old offset:
# the lower offset may have stood for up to 110 s (40 s -> 150 s), far longer than a broker
# blip.  Counting observations called it a blip; by time it is a rewind, reported when seen.
DROP_WITH_GAP = moving(5, 50) + [(50, 1000, 5050)] + [(60 + 10 * k, 1000, None) for k in range(9)] + \
    [(150, 15000, 15050), (160, 16000, 16050)]
# The same with the probe observing every 60 s: one lower commit, back at the next observation.
DROP_SPARSE = [(0, 0, 50), (60, 6000, 6050), (120, 12000, 12050), (180, 3000, 18050), (240, 24000, 24050),
               (300, 30000, 30050)]
# a real reset to offset 0 that persists, the consumer then re-reads at 100 per 10 s while
# 1 000 per 10 s arrive: its lag in seconds rises 27 s per 30 s
REWIND = moving(6, 50) + [(60 + 10 * k, 100 * k, 6050 + 1000 * k) for k in range(15)]
# reset, then the consumer races back past its old offset
REWIND_RECOVERS = moving(6, 50) + [(60, 1000, 6050), (70, 3000, 7050), (80, 8000, 8050), (90, 9000, 9050)]
# reset, and the re-read is so fast it is caught up at the next observation
REWIND_CAUGHT_UP = moving(6, 50) + [(60, 1000, 6050), (70, 7050, 7050)]
# reset confirmed (two lower observations), then caught up at the next one
REWIND_CONFIRMED_CAUGHT_UP = moving(6, 50) + [(60, 1000, 6050), (70, 2000, 7050), (80, 8050, 8050)]
# A consumer at 80 % of its producers' speed (8 of 10 records/s), caught up at 0 s: its lag in
# seconds grows 0.2 s per second (2i - 0.05 s at observation i).  Once it is more than the
# window (90 s) behind, its commit samples (every 30 s) show a 54 s rise: WARN.
FALLING_BEHIND = [(10 * i, 80 * i, 100 * i) for i in range(60)]
# ... then it stops committing at 590 s (4 720) while the producers go on
WARN_THEN_STOP = FALLING_BEHIND + [(10 * i, 4720, 100 * i) for i in range(60, 95)]
# noise around a flat lag in offsets (a consumer keeping up): OK however its slope looks
FLAT_NOISY = moving(10, [100, 104, 97, 103, 99, 102, 98, 105, 100, 103])
# the lag in offsets rising with dips while the consumer is seconds behind: OK (kept up)
RISING_OFFSETS_KEPT_UP = moving(8, [100, 160, 140, 220, 200, 280, 260, 340])
# consumer keeping up with a steady lag
STEADY = moving(15, 500)
# draining a backlog
DRAINING = moving(12, [5000 - 400 * i for i in range(12)])
# Commits every 10 s, stuck on 900 from 90 s to 240 s while records arrive, then resumes and
# catches up: STALL from 190 s (past 90 s), resolved at the commit.
STALL_THEN_RESUMES = [(10 * i, 100 * i, 100 * i + 50) for i in range(10)] + \
    [(10 * i, 900, 100 * i + 50) for i in range(10, 25)] + [(250, 2400, 2550), (260, 2600, 2600)]
# a stopped consumer whose commit blips lower once (broker deploy): the stuck timer keeps running
DEAD_WRITING_WITH_BLIP = [(t, 1750 if t == 200 else c, hw) for t, c, hw in DEAD_WRITING]


def every_n(n_obs, records_per_obs, every=1000):
    """A consumer that keeps up but commits every ``every`` records: at each observation its
    commit is the last multiple of ``every`` the HW had reached by the previous observation
    (it reads at once and commits seconds later)."""
    hw, out = 0, []
    for i in range(n_obs):
        prev = hw
        hw += records_per_obs(i) if i else 0
        out.append((10 * i, every * (prev // every), hw))
    return out


# 10 records/s, commits every 1 000 records (every 100 s); from 600 s the producers slow to
# 4 records/s (every 250 s).  True lag: the age of record `committed`, up to 250 s.
SLOW_COMMITTER = every_n(150, lambda i: 100 if i <= 60 else 40)

STATUS_CASES = [
    ("dead consumer, producers writing: STALL 100 s after its last commit was seen (90 s: 3 x its 10 s cadence "
     "is less), STOP after 310 s; never WARN", DEAD_WRITING, CFG, "OK*19 STALL*21 STOP*10"),
    ("dead consumer with records waiting, producers quiet: the same STALL then STOP", DEAD_QUIET, CFG,
     "OK*19 STALL*21 STOP*10"),
    ("fresh monitor, stuck consumer on a quiet topic: STALL after 90 s, STOP after 300 s", STUCK_IDLE_FRESH, CFG,
     "OK*10 STALL*21 STOP*9"),
    ("fresh monitor, consumer not committing while records arrive (cadence unknown): STOP after 300 s",
     STOPPED_FRESH, CFG, "OK*32 STOP*3"),
    ("slow topic, consumer caught up for an hour (lag 1 for one observation every 10 min): OK",
     SLOW_TOPIC, CFG, "OK*361"),
    ("idle topic, HW flat and committed == HW for an hour: OK, never STOP", IDLE_TOPIC, CFG, "OK*361"),
    ("idle topic, 100 records consumed within 7 s: OK", IDLE_THEN_100, CFG, "OK*123"),
    ("consumer committing every 1 000 records, minutes apart, producers slowing 2.5x: OK throughout",
     SLOW_COMMITTER, CFG, "OK*150"),
    ("broker deploy: one lower commit then back within 20 s: a blip, not REWIND", BLIP, CFG, "OK*20"),
    ("one lower commit at the latest observation is held, not REWIND yet", BLIP_LAST, CFG, "OK*7"),
    ("a lower commit that may have stood for 110 s (HW unknown meanwhile): REWIND when seen back, held "
     "(rewind_hold_ms 120 s)", DROP_WITH_GAP, CFG, "OK*15 REWIND*2"),
    ("... without the hold: REWIND for the one observation that shows it", DROP_WITH_GAP,
     LagConfig(rewind_hold_ms=0), "OK*15 REWIND OK"),
    ("probe every 60 s: a lower commit seen once, back 120 s after the observation before it: REWIND, "
     "held at the next observation", DROP_SPARSE, CFG, "OK*4 REWIND*2"),
    ("real rewind (reset to an earlier offset, persisted): REWIND from the confirmation, held 120 s, then "
     "the re-read's growing lag in seconds is WARN", REWIND, CFG, "OK*7 REWIND*12 WARN*2"),
    ("... without the hold: REWIND while the drop is in the window", REWIND, LagConfig(rewind_hold_ms=0),
     "OK*7 REWIND*8 WARN*6"),
    ("rewind_confirmations=3 needs three lower observations", REWIND,
     LagConfig(rewind_confirmations=3, rewind_hold_ms=0), "OK*8 REWIND*7 WARN*6"),
    ("rewind_confirmations=1: the first lower commit is a rewind", REWIND,
     LagConfig(rewind_confirmations=1, rewind_hold_ms=0), "OK*6 REWIND*9 WARN*6"),
    ("rewind then back past the old offset at the next observations: REWIND held", REWIND_RECOVERS, CFG,
     "OK*7 REWIND*3"),
    ("... without the hold: REWIND ends", REWIND_RECOVERS, LagConfig(rewind_hold_ms=0), "OK*7 REWIND OK*2"),
    ("rewind but caught up: rule 1 wins", REWIND_CAUGHT_UP, CFG, "OK*8"),
    ("a confirmed rewind, caught up at the next observation: still REWIND (held), not OK",
     REWIND_CONFIRMED_CAUGHT_UP, CFG, "OK*7 REWIND*2"),
    ("... without the hold: caught up wins", REWIND_CONFIRMED_CAUGHT_UP, LagConfig(rewind_hold_ms=0),
     "OK*7 REWIND OK"),
    ("consumer at 80 % of its producers' speed: WARN once more than the window behind with a 54 s rise",
     FALLING_BEHIND, CFG, "OK*46 WARN*14"),
    ("falling behind, then stops committing: WARN -> STALL -> STOP", WARN_THEN_STOP, CFG,
     "OK*46 WARN*23 STALL*21 STOP*5"),
    ("flat noisy lag in offsets: OK", FLAT_NOISY, CFG, "OK*10"),
    ("lag in offsets rising with dips, a few seconds behind: OK", RISING_OFFSETS_KEPT_UP, CFG, "OK*8"),
    ("steady lag, consumer keeping up: OK", STEADY, CFG, "OK*15"),
    ("draining a backlog: OK", DRAINING, CFG, "OK*12"),
    ("stuck, then resumes and catches up: STALL -> OK", STALL_THEN_RESUMES, CFG, "OK*19 STALL*6 OK*2"),
    ("dead consumer with one lower commit in between: a blip, the stuck timer is not reset",
     DEAD_WRITING_WITH_BLIP, CFG, "OK*19 STALL*21 STOP*10"),
]


@pytest.mark.parametrize("name, seq, cfg, expected", STATUS_CASES, ids=[c[0] for c in STATUS_CASES])
def test_status_after_each_observation(name, seq, cfg, expected):
    statuses, _, _ = feed(seq, cfg)
    assert statuses == runs(expected)


TRANSITION_CASES = [
    ("dead consumer, producers writing: STALL (warning) at 190 s, STOP (critical) replaces it at 400 s, "
     "ConsumerLagHigh once its lag has been over 300 s for 60 s (390 -> 450 s)", DEAD_WRITING, CFG,
     [(190, STATUS, "open", W, "STALL"),
      (400, STATUS, "resolve", W, "STOP"), (400, STATUS, "open", C, "STOP"),
      (450, HIGH, "open", W, None)]),
    ("dead consumer, producers quiet: the same", DEAD_QUIET, CFG,
     [(190, STATUS, "open", W, "STALL"),
      (400, STATUS, "resolve", W, "STOP"), (400, STATUS, "open", C, "STOP"),
      (450, HIGH, "open", W, None)]),
    ("fresh monitor, stuck on a quiet topic: STALL, STOP, and its lag in seconds (a lower bound from the "
     "first observation) over 300 s for 60 s", STUCK_IDLE_FRESH, CFG,
     [(100, STATUS, "open", W, "STALL"),
      (310, STATUS, "resolve", W, "STOP"), (310, STATUS, "open", C, "STOP"),
      (370, HIGH, "open", W, None)]),
    ("fresh monitor, not committing while records arrive: STOP only", STOPPED_FRESH, CFG,
     [(320, STATUS, "open", C, "STOP")]),
    ("slow topic caught up for an hour: nothing", SLOW_TOPIC, CFG, []),
    ("idle topic: nothing", IDLE_TOPIC, CFG, []),
    ("idle topic, a batch consumed in seconds: nothing", IDLE_THEN_100, CFG, []),
    ("slow committer: nothing", SLOW_COMMITTER, CFG, []),
    ("broker deploy blip: nothing", BLIP, CFG, []),
    ("flat noisy lag: nothing", FLAT_NOISY, CFG, []),
    ("a lower commit that may have stood 110 s: REWIND (critical) opened, held past the run's end",
     DROP_WITH_GAP, CFG, [(150, STATUS, "open", C, "REWIND")]),
    ("... resolved at the next observation without the hold", DROP_WITH_GAP, LagConfig(rewind_hold_ms=0),
     [(150, STATUS, "open", C, "REWIND"), (160, STATUS, "resolve", C, "OK")]),
    ("real rewind: REWIND (critical), held 120 s, then REWIND -> WARN; ConsumerLagHigh once the lag in "
     "offsets has been over 10 000 for 60 s (110 -> 170 s)", REWIND, CFG,
     [(70, STATUS, "open", C, "REWIND"),
      (170, HIGH, "open", W, None),
      (190, STATUS, "resolve", C, "WARN"), (190, STATUS, "open", W, "WARN")]),
    ("falling behind: WARN", FALLING_BEHIND, CFG, [(460, STATUS, "open", W, "WARN")]),
    ("falling behind then stops: WARN -> STALL -> STOP; ConsumerLagHigh after 300 s + 60 s", WARN_THEN_STOP, CFG,
     [(460, STATUS, "open", W, "WARN"),
      (690, STATUS, "resolve", W, "STALL"), (690, STATUS, "open", W, "STALL"),
      (840, HIGH, "open", W, None),
      (900, STATUS, "resolve", W, "STOP"), (900, STATUS, "open", C, "STOP")]),
    ("STALL then resumes: resolves", STALL_THEN_RESUMES, CFG,
     [(190, STATUS, "open", W, "STALL"), (250, STATUS, "resolve", W, "OK")]),
]


@pytest.mark.parametrize("name, seq, cfg, expected", TRANSITION_CASES, ids=[c[0] for c in TRANSITION_CASES])
def test_transitions(name, seq, cfg, expected):
    _, got, _ = feed(seq, cfg)
    assert got == expected


def test_dead_consumer_lag_is_recomputed_at_every_observation_not_only_on_commit():
    """Burrow's "stale lag, updated only when the consumer commits": here each probe
    observation recomputes lag from the current HW, so a dead consumer's lag keeps growing.
    Its lag in seconds is the age of record 1850, written between 80 s (HW 1800) and 90 s (HW
    1900): at 85.05 s (the middle of its slot), growing exactly 1 s per second."""
    s = L.new_group_partition("k", "g", "t", 0)
    lags, secs = [], []
    for t, c, hw in DEAD_WRITING:
        L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, CFG)
        lags.append(s["lag"])
        secs.append(s["lag_seconds"])
    assert lags == [50] * 10 + [1000 + 100 * i - 1850 for i in range(10, 50)]
    assert secs[9:] == [pytest.approx(10 * i - 85.05, abs=1e-6) for i in range(9, 50)]
    assert s["committed"] == 1850 and s["hw"] == 5900 and s["last_seen"] == 490_000
    assert s["anchor"] == [1850, 85_050]


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
    ("between two points: record 1004 is the 5th of 10 written in 0..10 s -> at 4.5 s", H((0, 1000), (10, 1010)),
     1004, 10, CFG, None, (5.5, "interpolated")),
    ("evaluated later than the latest point: grows with now", H((0, 1000), (10, 1010)), 1004, 40, CFG, None,
     (35.5, "interpolated")),
    ("a single record between two points: the middle (at most half an interval off)", H((0, 100), (10, 101)),
     100, 10, CFG, None, (5.0, "interpolated")),
    ("the issue's idle topic: HW flat at 5000 for 20 min, 100 records by 1210 s, committed 5000 -> the first new "
     "record was written after 1200 s: 9.95 s, not 1210 s nor a 90 s lower bound",
     H((0, 5000), (600, 5000), (1200, 5000), (1210, 5100)), 5000, 1210, CFG, None, (9.95, "interpolated")),
    ("HW flat at the committed value: the LAST point of the flat run counts, not the first",
     H((0, 100), (10, 200), (20, 200), (30, 200), (40, 300)), 200, 40, CFG, None, (9.95, "interpolated")),
    ("HW flat for several points, committed behind: finite, placed where the HW first passed it",
     H((0, 100), (10, 200), (20, 200), (30, 200), (40, 200)), 150, 40, CFG, None, (34.95, "interpolated")),
    ("HW regressed once (new leader with a lagging HW): the first time the HW passed it counts",
     H((0, 1000), (10, 2000), (20, 1500), (30, 2500)), 1800, 30, CFG, None, (21.995, "interpolated")),
    ("HW exactly at the committed offset at the oldest point: written just after it",
     LINEAR, 1000, 90, CFG, None, (89.95, "interpolated")),
    ("committed older than the oldest point: extrapolated with the history's HW rate", LINEAR, 500, 90, CFG, None,
     (139.95, "extrapolated")),
    ("extrapolation capped at max_extrapolation_ms before the oldest point: a lower bound", LINEAR, 0, 90,
     LagConfig(max_extrapolation_ms=60_000), None, (150.0, "lower-bound")),
    ("extrapolation cap 0: the oldest point's age, a lower bound", LINEAR, 500, 90,
     LagConfig(max_extrapolation_ms=0), None, (90.0, "lower-bound")),
    ("HW flat over the whole history, committed behind: no rate, the oldest point's age is a lower bound",
     H(*[(10 * i, 5000) for i in range(10)]), 4000, 90, CFG, None, (90.0, "lower-bound")),
    ("single point behind: 0 s so far, a lower bound", H((0, 20)), 10, 0, CFG, None, (0.0, "lower-bound")),
    ("known behind since before the history (stuck run): at least now - that time",
     H(*[(10 * i, 5000) for i in range(10)]), 4000, 90, CFG, -600, (690.0, "lower-bound")),
    ("known behind since, but the interpolation is older already: the interpolation stands",
     H((0, 1000), (10, 1010)), 1004, 10, CFG, 8, (5.5, "interpolated")),
    ("now before the record's time (misuse): clamped to 0, never negative", H((0, 1000), (10, 1010)), 1004, 2, CFG,
     None, (0.0, "interpolated")),
]


@pytest.mark.parametrize("name, history, committed, now, cfg, behind, expected", LAG_SECONDS_CASES,
                         ids=[c[0] for c in LAG_SECONDS_CASES])
def test_lag_seconds(name, history, committed, now, cfg, behind, expected):
    behind_ms = None if behind is None else behind * 1000
    est = LE.estimate_lag_seconds(history, committed, now * 1000, cfg, behind_since=behind_ms)
    got = None if est is None else (est.seconds, est.basis)
    assert got == expected
    number = LE.lag_seconds(history, committed, now * 1000, cfg, behind_since=behind_ms)
    assert number == (None if expected is None else expected[0])
    if est is not None:
        assert est.lower_bound == (est.basis == "lower-bound")
    # the HW marks ([t, hw]) give the same answer as full points ([t, committed, hw])
    marks = [[p[0], p[2]] for p in history]
    assert LE.estimate_lag_seconds(marks, committed, now * 1000, cfg, behind_since=behind_ms) == est


@pytest.mark.parametrize("window", [10, 64])
def test_idle_topic_lag_seconds_is_the_age_of_the_first_new_record_whatever_the_window(window):
    """The issue's finding: caught up on an idle topic, 100 records land at 1203 s and are
    consumed within 7 s; at 1210 s (before the commit) the lag was 90 s (a lower bound) with
    the default window and 630 s with window 64 — enough for ConsumerLagHigh.  It is 9.95 s
    (the record was written between 1200 s and 1210 s; true 7 s), whatever the window."""
    got = lag_seconds_after_each(IDLE_THEN_100, LagConfig(window=window))
    assert got[-2] == (9.95, "interpolated") and got[-1] == (0.0, "caught-up")
    assert all(g == (0.0, "caught-up") for g in got[:-2])


def test_slow_committer_lag_seconds_is_the_age_of_its_oldest_uncommitted_record():
    """Committing every 1 000 records: the committed record was read (and written) just before
    the previous observation; while the commit does not move its age grows 1 s per second,
    also when the producers slow down 2.5x — no extrapolation with the new, lower rate (which
    overshot by up to 3.4x).  Reference: the record's time with the HW rising evenly between
    observations (the middle of its slot)."""
    got = lag_seconds_after_each(SLOW_COMMITTER)
    hw = [(t, h) for t, _, h in SLOW_COMMITTER]

    def truth(t, c):
        k = next(k for k, (_, h) in enumerate(hw) if h > c)
        (t0, h0), (t1, h1) = hw[k - 1], hw[k]
        return t - (t0 + (t1 - t0) * (c - h0 + 0.5) / (h1 - h0))

    for (t, c, h), (sec, basis) in zip(SLOW_COMMITTER, got):
        if c >= h:
            assert (sec, basis) == (0.0, "caught-up")
        else:
            assert basis == "interpolated" and sec == pytest.approx(truth(t, c), abs=0.002), (t, c, h)
    assert max(s for s, _ in got) == pytest.approx(249.875, abs=0.001)  # 4 records/s: 250 s between commits


def test_lag_seconds_evidence_says_when_it_is_a_lower_bound():
    """A consumer 1 000 000 offsets behind on a 10 offsets/s partition: 28 h by the rate,
    reported as max_extrapolation_ms (1 h) before the oldest point, flagged as a lower bound;
    ConsumerLagHigh opens once that has held for 60 s."""
    seq = [(10 * i, 0, 1_000_000 + 100 * i) for i in range(8)]
    out, s = feed_raw(seq, LagConfig(lag_high_offsets=None))
    assert s["lag_seconds"] == 3600.0 + 70.0 and s["lag_seconds_basis"] == "lower-bound"
    high = [x for x in out if x.alert is HIGH]
    assert [x.at for x in high] == [70_000]  # tripped from 10 s (one point at 0 s: no rate, 0 s so far)
    ev = high[0].evidence
    assert ev["lag_seconds"] == 3670.0 and ev["lag_seconds_is_lower_bound"] is True
    assert ev["tripped"] == ["seconds"] and ev["tripped_since"] == 10_000 and ev["lag_high_for_ms"] == 60_000


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
    est = LE.estimate_lag_seconds(history, committed, now, cfg)
    assert math.isfinite(est.seconds) and est.seconds >= 0
    assert (est.basis == "caught-up") == (committed >= hw)
    # never more than the oldest point's age plus the extrapolation cap (ms precision)
    assert est.seconds <= (now - history[0][0] + max_extra) / 1000.0 + 0.001
    if est.basis == "interpolated":
        # within the two points that show the record: after the last with HW <= committed,
        # by the first with HW > committed
        k = next(k for k, p in enumerate(history) if p[2] > committed)
        assert (now - history[k][0]) / 1000.0 - 0.001 <= est.seconds <= (now - history[k - 1][0]) / 1000.0 + 0.001


# --- the long HW history (marks) ----------------------------------------------------------

def test_marks_stay_bounded_and_cover_hours_at_a_resolution_proportional_to_age():
    marks: list = []
    for i in range(12 * 360):  # 12 h at 10 s, 10 records/s
        LE.add_mark(marks, 10_000 * i, 100 * i, CFG.hw_marks)
        assert len(marks) <= CFG.hw_marks
    now = marks[-1][0]
    assert now - marks[0][0] >= 5 * 3600_000  # hours back
    for a, b in zip(marks, marks[1:]):  # each gap under MARK_RATIO x the younger mark's age, or one interval
        assert b[0] - a[0] <= max(10_000, LE.MARK_RATIO * (now - b[0]))
    assert marks[-1] == [now, 100 * (12 * 360 - 1)]


def test_a_flat_hw_keeps_the_first_and_last_point_of_the_run():
    marks: list = []
    for t, hw in [(0, 100), (10, 200), (20, 200), (30, 200), (40, 200), (50, 300)]:
        LE.add_mark(marks, t * 1000, hw, 32)
    assert marks == [[0, 100], [10_000, 200], [40_000, 200], [50_000, 300]]


# --- evaluate_status: the rules in isolation --------------------------------------------

def P(*pts):
    """History from (t seconds, committed, hw)."""
    return [[t * 1000, c, hw] for t, c, hw in pts]


def S(*pts):
    """Commit samples from (t seconds, lag seconds)."""
    return [[t * 1000, lag * 1000] for t, lag in pts]


OK, WARN, STALL, STOP, REWIND_ = LagStatus.OK, LagStatus.WARN, LagStatus.STALL, LagStatus.STOP, LagStatus.REWIND
BEHIND = P((0, 0, 5000), (30, 300, 5300), (60, 600, 5600))  # committing, far more than the window behind
KEPT_UP = P((0, 0, 100), (10, 1000, 1200), (20, 2000, 2300))  # committing, less than the window behind

EVAL_CASES = [
    # id, history, state (stuck [t s, c, hw], waits ms, trend), expected
    ("empty history", [], {}, (OK, LS.RULE_FEW_POINTS)),
    ("1: lag 0 at the latest point, committed unchanged for an hour", P((0, 5, 5), (3600, 5, 5)), {},
     (OK, LS.RULE_CAUGHT_UP)),
    ("1: caught up at the latest point after a long stuck run", P((0, 5, 9), (10, 5, 9), (20, 5, 9), (30, 9, 9)), {},
     (OK, LS.RULE_CAUGHT_UP)),
    ("2: confirmed rewind", P((0, 100, 150), (10, 200, 250), (20, 50, 300), (30, 60, 350)), {},
     (REWIND_, LS.RULE_REWIND)),
    ("2: a single lower commit at the end is held, not (yet) a rewind",
     P((0, 100, 150), (10, 200, 250), (20, 50, 300)), {}, (OK, LS.RULE_KEPT_UP)),
    ("2: a lower commit back 20 s after the observation before it: a blip",
     P((0, 100, 150), (10, 200, 250), (20, 50, 300), (30, 300, 350)), {}, (OK, LS.RULE_KEPT_UP)),
    ("2: ... back only 120 s after it (it may have stood that long): a rewind, reported at that observation",
     P((0, 100, 150), (60, 200, 250), (120, 50, 300), (180, 300, 350)), {}, (REWIND_, LS.RULE_REWIND)),
    ("3: stuck 420 s, commits every 10 s, records arriving -> STOP",
     P((400, 10, 500), (410, 10, 600), (420, 10, 700)), {"stuck": [0, 10, 20], "waits": [10_000]},
     (STOP, LS.RULE_STOP)),
    ("3: stuck 420 s on a flat HW (records waiting, producers quiet) -> STOP too",
     P((400, 10, 20), (410, 10, 20), (420, 10, 20)), {"stuck": [0, 10, 20], "waits": [10_000]},
     (STOP, LS.RULE_STOP)),
    ("3: stuck 420 s by a consumer that usually waits 200 s: within 3 x -> not stuck",
     P((400, 10, 500), (410, 10, 600), (420, 10, 700)), {"stuck": [0, 10, 20], "waits": [200_000]},
     (OK, LS.RULE_FEW_POINTS)),
    ("3: ... 1 210 s: past 6 x -> STOP", P((1200, 10, 500), (1210, 10, 600)),
     {"stuck": [0, 10, 20], "waits": [200_000, 150_000]}, (STOP, LS.RULE_STOP)),
    ("3: an older stuck run of a different offset does not count",
     P((400, 11, 500), (410, 11, 600), (420, 11, 700)), {"stuck": [0, 10, 20], "waits": [10_000]},
     (OK, LS.RULE_FEW_POINTS)),
    ("4: stuck 100 s, commits every 10 s -> STALL", P(*[(10 * i, 10, 20 + i) for i in range(11)]),
     {"waits": [10_000]}, (STALL, LS.RULE_STALL)),
    ("4: stuck 100 s, cadence unknown, HW flat (it had all it needed to commit) -> STALL",
     P((0, 10, 20), (50, 10, 20), (100, 10, 20)), {}, (STALL, LS.RULE_STALL)),
    ("4: stuck 100 s, cadence unknown, records arriving (it may be filling a batch) -> not yet",
     P((0, 10, 20), (50, 10, 30), (100, 10, 40)), {}, (OK, LS.RULE_FEW_POINTS)),
    ("4: stuck 100 s by a consumer that usually waits 60 s -> not yet",
     P((0, 10, 20), (50, 10, 30), (100, 10, 40)), {"waits": [60_000]}, (OK, LS.RULE_FEW_POINTS)),
    ("4: ... 190 s: past 3 x 60 s -> STALL", P((0, 10, 20), (100, 10, 30), (190, 10, 40)), {"waits": [60_000]},
     (STALL, LS.RULE_STALL)),
    ("4: the run starts at the first point with lag > 0", P((0, 10, 10), (10, 10, 30), (100, 10, 40)),
     {"waits": [10_000]}, (OK, LS.RULE_KEPT_UP)),
    ("5: the latest commit is past the window's oldest HW: kept up (Burrow's 'lag 0 in the window', widened)",
     P((0, 0, 100), (10, 1000, 1200), (20, 2000, 2300)), {}, (OK, LS.RULE_KEPT_UP)),
    ("5: the long series (3 min apart) rises 2 -> 18 s: drifting, although less than a window behind -> WARN",
     KEPT_UP, {"drift": S((0, 2), (180, 6), (360, 10), (540, 14), (720, 18))}, (WARN, LS.RULE_DRIFT)),
    ("5: ... a rise of 8 s (2 -> 10 s) is within a consumer's usual wobble: kept up, OK", KEPT_UP,
     {"drift": S((0, 2), (180, 4), (360, 6), (540, 8), (720, 10))}, (OK, LS.RULE_KEPT_UP)),
    ("5: a slow consumer's lag wandering 60 -> 84 s: less than the lag it rose from, OK", BEHIND,
     {"drift": S((0, 60), (180, 66), (360, 72), (540, 78), (720, 84))}, (OK, LS.RULE_FEW_POINTS)),
    ("5: flat, then one high sample (a burst being drained): not without it, OK", KEPT_UP,
     {"drift": S((0, 1), (180, 1), (360, 2), (540, 1), (720, 2), (900, 25))}, (OK, LS.RULE_KEPT_UP)),
    ("5: four samples are too few for a drift", KEPT_UP, {"drift": S((0, 2), (180, 20), (360, 40), (540, 60))},
     (OK, LS.RULE_KEPT_UP)),
    ("6: lag in seconds at commits 100, 130, 160 s -> WARN", BEHIND, {"trend": S((0, 100), (30, 130), (60, 160))},
     (WARN, LS.RULE_LAG_RISING)),
    ("6: rising with dips -> WARN (Burrow's 'never decreasing between commits' misses it)", BEHIND,
     {"trend": S((0, 100), (30, 130), (60, 120), (90, 150), (120, 140), (150, 170))}, (WARN, LS.RULE_LAG_RISING)),
    ("6: flat with noise (slope > 0, last > first): OK", BEHIND,
     {"trend": S((0, 100), (30, 104), (60, 97), (90, 103), (120, 99), (150, 105))}, (OK, LS.RULE_OK)),
    ("6: a clean rise of 20 s, below warn_min_rise_ms: OK", BEHIND, {"trend": S((0, 100), (30, 110), (60, 120))},
     (OK, LS.RULE_OK)),
    ("6: a 60 s rise drowned in noise (2 x 48 s): OK", BEHIND,
     {"trend": S((0, 100), (30, 160), (60, 95), (90, 190), (120, 100), (150, 200))}, (OK, LS.RULE_OK)),
    ("6: last not above first: OK", BEHIND, {"trend": S((0, 100), (30, 190), (60, 100))}, (OK, LS.RULE_OK)),
    ("6: two samples are too few for a trend", BEHIND, {"trend": S((0, 100), (30, 200))},
     (OK, LS.RULE_FEW_POINTS)),
    ("6: no samples given (a window alone has none): OK", BEHIND, {}, (OK, LS.RULE_FEW_POINTS)),
]


@pytest.mark.parametrize("name, history, state, expected", EVAL_CASES, ids=[c[0] for c in EVAL_CASES])
def test_evaluate_status(name, history, state, expected):
    stuck = state.get("stuck")
    stuck_ms = None if stuck is None else [stuck[0] * 1000, stuck[1], stuck[2]]
    now = history[-1][0] if history else 0
    assert LS.evaluate_status(history, CFG, now, stuck=stuck_ms, waits=state.get("waits"),
                             trend=state.get("trend"), drift=state.get("drift")) == expected


def test_flat_noisy_samples_would_fool_a_naive_slope_rule():
    """The noise test is what keeps noisy samples OK: their least-squares slope is > 0 and the
    last is above the first, which is all a naive rule asks."""
    tr = LS._trend(S((0, 100), (30, 104), (60, 97), (90, 103), (120, 99), (150, 105)))
    assert tr["slope"] > 0 and tr["last_lag_s"] > tr["first_lag_s"]
    assert tr["rise_s"] * 1000 < CFG.warn_min_rise_ms
    tr = LS._trend(S((0, 100), (30, 160), (60, 95), (90, 190), (120, 100), (150, 200)))
    assert tr["rise_s"] * 1000 >= CFG.warn_min_rise_ms and tr["rise_s"] <= LS.TREND_NOISE_FACTOR * tr["noise_s"]


def test_warn_holds_while_the_lag_in_seconds_still_rises():
    """WARN opens on a clear rise (30 s, beyond noise) and holds while the lag in seconds rises
    at all: a producer speeding up for a minute, which slows the rise, does not end it."""
    slow_rise = S((0, 100), (30, 110), (60, 120))  # 20 s: not enough to open WARN
    assert LS.evaluate(BEHIND, CFG, 60_000, trend=slow_rise).status is OK
    v = LS.evaluate(BEHIND, CFG, 60_000, trend=slow_rise, warned=True)
    assert (v.status, v.rule, v.detail["held"]) == (WARN, LS.RULE_LAG_RISING, True)
    assert LS.evaluate(BEHIND, CFG, 60_000, trend=S((0, 100), (30, 130), (60, 90)), warned=True).status is OK
    assert LS.evaluate(BEHIND, CFG, 60_000, trend=S((0, 100), (30, 130), (60, 101), (90, 100)),
                      warned=True).status is OK  # slope < 0: no longer rising


def test_a_stall_is_not_taken_back_while_the_run_lasts():
    """Cadence unknown, HW flat: STALL after 90 s.  Then records arrive (a consumer filling a
    batch would look like this, so a fresh run with records arriving is not called stuck): the
    run is the same, the STALL stays, and becomes STOP after 300 s."""
    seq = [(10 * i, 4950, 5000) for i in range(12)] + [(10 * i, 4950, 5000 + 10 * i) for i in range(12, 32)]
    statuses, _, _ = feed(seq)
    assert statuses == runs("OK*10 STALL*21 STOP")


def test_commit_cadence_samples_are_the_waits_between_commits():
    """A wait is how long the consumer sat on one committed offset with records waiting; the
    run under way at the monitor's first observation is not one (its start is unknown), nor an
    outage that reached STOP; at most CADENCE_SAMPLES are kept."""
    _, _, s = feed(STALL_THEN_RESUMES)
    # t=20..90: 10 s each (t=10 ends the first run), 160 s (the STALL), 10 s (250 -> 260 s); the last 8
    assert s["waits"] == [10_000] * 6 + [160_000, 10_000]
    _, _, s = feed(DEAD_WRITING + [(500, 7000, 7050)])
    assert s["waits"] == [10_000] * 8  # the 410 s outage (STOP) is not a cadence sample
    assert len(s["waits"]) == L.CADENCE_SAMPLES


def test_a_slow_committer_is_judged_by_its_own_cadence():
    """SLOW_COMMITTER waits 100 s, then 250 s between commits.  By the end the monitor has
    learned that: a wait of 250 s is normal; STALL would take 750 s, STOP 1 500 s."""
    _, _, s = feed(SLOW_COMMITTER)
    assert max(s["waits"]) == 250_000
    v = LS.evaluate(s["history"], CFG, s["last_seen"], s["stuck"], s["waits"], s["trend"])
    stall, stop, cadence = LS.stuck_limits(CFG, s["waits"], True)
    assert (stall, stop, cadence) == (750_000, 1_500_000, 250_000) and v.status is LagStatus.OK


def _renumbered(seq):
    return [(10 * i, c, hw) for i, (_, c, hw) in enumerate(seq)]


# 3 records/s, a commit every 1 000 records (every 340 s), the monitor starting 300 s into a gap
LOW_RATE_EVERY_N = _renumbered(every_n(400, lambda i: 30)[30:])


def test_a_committer_slower_than_stop_after_ms_is_judged_by_its_commit_step_from_its_first_commit():
    """Issue 35: cadence unknown, a wait over stop_after_ms (300 s) was STOP, and a wait that
    reached STOP was never learned: STOP at every 340 s gap.  Now, until a wait is known, the
    time the producers took to write the last commit step (1 000 records: ~333 s) stands for
    the cadence (STOP after 6 x that); then the waits are learned as usual."""
    statuses, out, s = feed(LOW_RATE_EVERY_N)
    assert out == [] and set(statuses) == {"OK"}
    assert s["step"] == 1000 and s["waits"] and set(s["waits"]) <= {330_000, 340_000}
    assert L._step_cadence({"step": 1000, "marks": [[0, 0], [340_000, 1020]]}, 1020, 340_000, CFG) == [333_166]


def test_a_first_wait_that_reached_stop_is_learned_while_no_cadence_is_known():
    """The monitor saw it caught up at 0 s, then its first gap (330 s) reached STOP: one page.
    With no wait known, that wait is learned all the same (an outage that reaches STOP once
    the cadence is known is not: test_commit_cadence_samples_are_the_waits_between_commits)."""
    statuses, out, s = feed(every_n(120, lambda i: 30))
    assert [(t, a, act, st) for t, a, act, _, st in out] == [(320, STATUS, "open", "STOP"),
                                                            (350, STATUS, "resolve", "OK")]
    assert s["waits"][0] == 340_000 and set(statuses[36:]) == {"OK"}


# 3 records/s, a commit every 1 200 records (every 400 s): its lag in seconds passes 300 s for
# ~100 s before every commit; it then dies (last commit seen at 2 460 s), the producers go on
EVERY_400_S = _renumbered(every_n(300, lambda i: 30, every=1200)[35:])
EVERY_400_S_DIES = EVERY_400_S + [(EVERY_400_S[-1][0] + 10 * k, EVERY_400_S[-1][1], EVERY_400_S[-1][2] + 30 * k)
                                  for k in range(1, 200)]


def test_consumer_lag_high_on_seconds_does_not_count_the_consumers_own_wait_between_commits():
    """Issue 35: a consumer committing every 400 s has records 300-400 s old before every commit;
    ConsumerLagHigh on seconds paged at every gap.  Its seconds half now discounts the time
    the consumer has sat on its offset, up to its cadence less one interval (390 s): it opens
    once the lag is 300 s beyond that — 750 s after the last commit of the dead one, still
    before its STALL (3 x 400 s)."""
    out, s = feed_raw(EVERY_400_S_DIES)
    high = [x for x in out if x.alert is HIGH]
    assert [x.at for x in high] == [3_210_000]
    ev = high[0].evidence
    assert ev["tripped"] == ["seconds"] and ev["lag_seconds_between_commits"] == 390.0
    assert ev["lag_seconds"] == pytest.approx(759.833) and ev["tripped_since"] == 3_150_000
    status = [x for x in out if x.alert is STATUS]
    assert [(x.at, x.evidence["status"]) for x in status] == [(3_670_000, "STALL")]


def test_an_auto_committing_consumer_has_nothing_discounted():
    """Its cadence is one observation interval: the discount is 0 and a dead one trips
    ConsumerLagHigh as soon as before (test_consumer_lag_high_by_seconds_says_which_threshold_tripped)."""
    _, _, s = feed(DEAD_WRITING)
    assert L.between_commits_ms(s["stuck"], s["waits"], s["history"], s["last_seen"]) == 0
    assert L.between_commits_ms(None, [400_000], s["history"], s["last_seen"]) == 0
    assert L.between_commits_ms([0, 1, 2], [400_000], [[0, 1, 2], [10_000, 1, 3]], 100_000) == 100_000
    assert L.between_commits_ms([0, 1, 2], [400_000], [[0, 1, 2], [10_000, 1, 3]], 500_000) == 390_000


# A consumer at 99 % of its producers' speed (990 of 1 000 records per 10 s), caught up at 0 s:
# its lag in seconds rises 0.01 s per second, 9 s in 15 min; it never falls a window behind.
DRIFTING_99 = [(10 * i, 990 * i, 1000 * i) for i in range(300)]


def test_a_consumer_slightly_slower_than_its_producers_is_warn_from_the_long_series():
    """Issue 35: rule 5 (kept up) called it OK for hours.  The long series of commit samples
    (3 min apart) shows the rise: WARN once it is 10 s and beyond noise, with and without the
    latest sample: 21 min in."""
    statuses, out, s = feed(DRIFTING_99)
    first = statuses.index("WARN")
    assert first * 10 == 21 * 60 and set(statuses[first:]) == {"WARN"}
    opened = [x for x in feed_raw(DRIFTING_99)[0] if x.alert is STATUS][0]
    assert opened.evidence["rule"] == LS.RULE_DRIFT and opened.evidence["rise_s"] >= LS.DRIFT_MIN_RISE_S
    assert len(s["drift"]) == LC.DRIFT_POINTS
    assert all(b[0] - a[0] >= LC.DRIFT_STEP_MS for a, b in zip(s["drift"], s["drift"][1:]))


# --- ConsumerLagHigh: held, not a single observation -------------------------------------

def test_consumer_lag_high_needs_the_threshold_exceeded_for_lag_high_for_ms():
    """Lag 20 000 for two observations (a burst): nothing.  Lag 15 000 from 80 s: opens at
    140 s (held 60 s), resolves at the first observation under the threshold (160 s) with the
    same id; exceeded again from 180 s: a new episode, opened at 240 s with a new id."""
    seq = moving(3, 500) + moving(2, 20_000, t0=30, c0=3000) + moving(3, 500, t0=50, c0=5000) + \
        moving(8, 15_000, t0=80, c0=8000) + moving(2, 500, t0=160, c0=16000) + moving(7, 15_000, t0=180, c0=18000)
    out, s = feed_raw(seq, LagConfig(lag_high_seconds=None))
    high = [x for x in out if x.alert is HIGH]
    assert [(x.at, x.action) for x in high] == [(140_000, "open"), (160_000, "resolve"), (240_000, "open")]
    opened, resolved, again = high
    assert opened.evidence["tripped"] == ["offsets"] and opened.evidence["lag"] == 15_000
    assert opened.evidence["tripped_since"] == 80_000 and opened.evidence["lag_high_for_ms"] == 60_000
    assert opened.evidence["lag_high_offsets"] == 10_000 and opened.evidence["lag_high_seconds"] is None
    assert opened.labels == {"cluster": "k", "group": "g", "topic": "t", "partition": 0}
    assert opened.severity is Severity.WARNING
    assert resolved.alert_id == opened.alert_id and resolved.evidence["open_since"] == 140_000
    assert resolved.evidence["tripped"] == [] and resolved.evidence["lag"] == 500
    assert again.alert_id != opened.alert_id
    assert s["open"][HIGH.value]["id"] == again.alert_id


def test_a_burst_drained_in_20_s_raises_nothing():
    """The issue's burst: a consumer keeping up (50 behind at 10 records/s); 30 000 records land
    at 95 s and are drained within 20 s.  The lag in offsets is over 10 000 at two observations
    (25 050, 12 050), the records are seconds old: no ConsumerLagHigh, status OK throughout.
    With lag_high_for_ms 0 (a single observation, as before) it would open and resolve."""
    seq = [(10 * i, 100 * i, 100 * i + 50) for i in range(10)] + \
        [(100, 6000, 31050), (110, 19150, 31150), (120, 31200, 31250)] + \
        [(10 * i, 100 * i + 30000, 100 * i + 30050) for i in range(13, 30)]
    statuses, out, s = feed(seq)
    assert out == [] and statuses == ["OK"] * len(seq)
    _, out, _ = feed(seq, LagConfig(lag_high_for_ms=0))
    assert out == [(100, HIGH, "open", W, None), (120, HIGH, "resolve", W, None)]


def test_consumer_lag_high_by_seconds_says_which_threshold_tripped():
    out, _ = feed_raw(DEAD_WRITING)
    high = [x for x in out if x.alert is HIGH][0]
    assert high.at == 450_000
    assert high.evidence["tripped"] == ["seconds"] and high.evidence["tripped_since"] == 390_000
    assert high.evidence["lag_seconds"] == pytest.approx(364.95) and high.evidence["lag"] == 3650


def test_consumer_lag_high_disabled_when_both_thresholds_are_none():
    out, _ = feed_raw(DEAD_WRITING, LagConfig(lag_high_offsets=None, lag_high_seconds=None))
    assert [x for x in out if x.alert is HIGH] == []


def test_unknown_hw_neither_extends_nor_breaks_the_hold():
    """ConsumerLagHigh held across an observation without HW: that observation counts neither way."""
    seq = [(10 * i, 0, 20_000 + i) for i in range(4)] + [(40, 0, None)] + [(10 * i, 0, 20_000 + i) for i in range(5, 8)]
    out, _ = feed_raw(seq, LagConfig(lag_high_seconds=None))
    assert [(x.at, x.action) for x in out if x.alert is HIGH] == [(60_000, "open")]


# --- transitions: ids, evidence, severities ---------------------------------------------

def test_status_change_resolves_the_old_alert_and_opens_a_new_one_with_a_new_id_and_severity():
    out, s = feed_raw(WARN_THEN_STOP)
    status = [x for x in out if x.alert is STATUS]
    warn_open, warn_resolve, stall_open, stall_resolve, stop_open = status
    assert (warn_open.action, warn_open.evidence["status"], warn_open.severity) == ("open", "WARN", W)
    assert warn_resolve.action == "resolve" and warn_resolve.alert_id == warn_open.alert_id
    assert warn_resolve.severity is W and warn_resolve.evidence["open_since"] == warn_open.at
    assert (stall_open.evidence["status"], stall_open.severity) == ("STALL", W)
    assert stall_open.alert_id != warn_open.alert_id and stall_open.at == warn_resolve.at
    assert (stop_open.action, stop_open.evidence["status"], stop_open.severity) == ("open", "STOP", C)
    assert stall_resolve.alert_id == stall_open.alert_id and stall_resolve.severity is W
    assert s["open"][STATUS.value]["id"] == stop_open.alert_id
    # WARN's evidence: the commit samples of the lag in seconds and the fitted rise
    ev = warn_open.evidence
    assert ev["rule"] == LS.RULE_LAG_RISING and ev["samples"] == 10 and ev["warn_min_rise_ms"] == 30_000
    assert [x[0] for x in ev["lag_samples"]] == [30_000 * k for k in range(6, 16)]
    assert ev["rise_s"] == pytest.approx(54.0) and ev["noise_s"] == pytest.approx(0.0, abs=0.01)
    assert ev["first_lag_s"] == pytest.approx(35.95) and ev["last_lag_s"] == pytest.approx(89.95)
    # STALL's and STOP's: the stuck run and the limits from the commit cadence
    for x, rule in ((stall_open, LS.RULE_STALL), (stop_open, LS.RULE_STOP)):
        assert x.evidence["rule"] == rule and x.evidence["stuck_since"] == 590_000
        assert x.evidence["commit_cadence_ms"] == 10_000
        assert (x.evidence["stall_limit_ms"], x.evidence["stop_limit_ms"]) == (90_000, 300_000)
    assert stop_open.evidence["stuck_for_ms"] == 310_000
    assert len(stop_open.evidence["points"]) == CFG.window
    assert all(p[3] == p[2] - p[1] for p in stop_open.evidence["points"])


def test_rewind_evidence_names_the_offsets():
    out, _ = feed_raw(REWIND)
    rw = [x for x in out if x.alert is STATUS][0]
    assert rw.evidence["status"] == "REWIND" and rw.evidence["rule"] == LS.RULE_REWIND
    assert (rw.evidence["from_offset"], rw.evidence["to_offset"], rw.evidence["at"]) == (5000, 0, 60_000)
    assert rw.evidence["confirmations"] == 2


def test_a_rewind_recognised_by_time_says_it_has_recovered_and_how_long_it_may_have_lasted():
    out, s = feed_raw(DROP_WITH_GAP)
    rw = [x for x in out if x.alert is STATUS][0]
    assert (rw.evidence["from_offset"], rw.evidence["to_offset"], rw.evidence["at"]) == (4000, 1000, 50_000)
    assert rw.evidence["recovered"] is True and rw.evidence["lasted_at_most_ms"] == 110_000
    assert [p[0] for p in s["history"]][:7] == [0, 10_000, 20_000, 30_000, 40_000, 50_000, 150_000]  # kept


def test_a_held_blip_is_shown_as_set_aside():
    statuses, _, s = feed(BLIP_LAST)
    v = LS.evaluate(s["history"], CFG, 60_000, s["stuck"])
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
    assert s["hw"] == 4900 and len(s["marks"]) <= CFG.hw_marks  # the HW history is kept


def test_committed_offset_disappearing_resolves_open_alerts():
    statuses, out, s = feed(DEAD_WRITING + [(500, None, 6000)])
    assert statuses[-1] is None and s["lag"] is None and s["lag_seconds"] is None and s["stuck"] is None
    assert out[-2:] == [(500, HIGH, "resolve", W, None), (500, STATUS, "resolve", C, None)]
    assert s["open"] == {} and s["high_since"] is None and s["trend"] == []


def test_unknown_hw_changes_neither_status_nor_alerts():
    _, _, s = feed(DEAD_WRITING)
    before = copy.deepcopy(s)
    assert L.on_group_offsets(s, {"committed_offset": 1850, "high_watermark": None}, 500_000, E, CFG) == []
    assert s["lag"] is None and s["lag_seconds"] is None and s["last_seen"] == 500_000
    for key in ("status", "open", "history", "marks", "stuck", "waits", "trend", "high_since", "anchor"):
        assert s[key] == before[key], key


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
    from streaming.sinks.catalogue import LAG_STATUS_VALUE
    assert LAG_STATUS_VALUE == {s.name: int(s) for s in LagStatus}


def test_every_status_is_produced_by_a_table_case_and_alerts_with_its_severity():
    seen = {}
    for _, seq, cfg, _ in STATUS_CASES:
        statuses, out, _ = feed(seq, cfg)
        for name in statuses:
            seen.setdefault(name, [])
        for _t, alert, action, sev, status in out:
            if alert is STATUS and action == "open":
                seen[status].append(sev)
    assert set(seen) == {s.name for s in LagStatus}
    for status in LagStatus:
        expected = L.STATUS_SEVERITY[status]
        assert seen[status.name] == [] if expected is None else (seen[status.name] and
                                                                 set(seen[status.name]) == {expected})


def test_every_rule_is_named_by_a_table_case():
    assert {c[3][1] for c in EVAL_CASES} == {LS.RULE_CAUGHT_UP, LS.RULE_REWIND, LS.RULE_STOP, LS.RULE_STALL,
                                              LS.RULE_DRIFT, LS.RULE_KEPT_UP, LS.RULE_LAG_RISING, LS.RULE_OK,
                                              LS.RULE_FEW_POINTS}


# --- bounded, ordered, deterministic, serialisable --------------------------------------

def _bounded(s, cfg):
    return (len(s["history"]) <= cfg.window and len(s.get("marks", [])) <= cfg.hw_marks
            and len(s.get("waits", [])) <= L.CADENCE_SAMPLES and len(s.get("trend", [])) <= LC.TREND_POINTS
            and len(s.get("drift", [])) <= LC.DRIFT_POINTS)


def test_state_never_exceeds_its_bounds():
    for cfg in (CFG, LagConfig(window=3), LagConfig(window=64, hw_marks=3)):
        s = L.new_group_partition("k", "g", "t", 0)
        long_run = [(500 + 10 * i, 2000 + 8 * i, 6000 + 10 * i) for i in range(2000)]
        for t, c, hw in DEAD_WRITING + long_run:
            L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, cfg)
            assert _bounded(s, cfg)
        assert len(s["history"]) == cfg.window and 3 <= len(s["marks"]) <= cfg.hw_marks
        assert s["history"][-1] == [20_490_000, 17992, 25990]


@pytest.mark.parametrize("t", [490, 300, 0], ids=["replay of the latest", "older", "much older"])
def test_observations_at_or_before_the_last_one_are_ignored(t):
    _, _, s = feed(DEAD_WRITING)
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
        s = L.new_group_partition("k", "g", "t", 0)
        for t, c, hw in seq:
            L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, cfg)
            assert _plain(s), s
        assert json.loads(json.dumps(s)) == s
        assert pickle.loads(pickle.dumps(s)) == s


def test_state_round_trip_mid_stream_gives_the_same_result():
    """The state store serialises between micro-batches: resuming from a JSON copy changes nothing."""
    for seq in (DEAD_WRITING, WARN_THEN_STOP, SLOW_COMMITTER, DRIFTING_99, LOW_RATE_EVERY_N):
        _, straight = feed_raw(seq)
        s = L.new_group_partition("k", "g", "t", 0)
        for t, c, hw in seq:
            s = json.loads(json.dumps(s))
            L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, CFG)
        assert s == straight


def test_state_from_before_issue_14_is_picked_up():
    """A state stored by the previous version (no marks, waits, trend, anchor, high_since) is
    carried on: the missing parts start empty."""
    s = L.new_group_partition("k", "g", "t", 0)
    s.update(history=[[0, 950, 1000], [10_000, 1050, 1100]], stuck=[10_000, 1050, 1100], status="OK",
             lag_seconds=4.95, lag_seconds_basis="interpolated", last_seen=10_000, committed=1050, hw=1100, lag=50)
    for t, c, hw in DEAD_WRITING[2:]:
        L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, CFG)
    assert s["status"] == "STOP" and _bounded(s, CFG)


def test_the_stored_state_carries_the_drift_series_and_the_commit_step():
    """A group partition is a plain dict in its bucket's stored value: the codec carries the
    fields issue 35 added (drift, drift_clear, step) as they are, no migration needed."""
    from streaming.state import codec
    from streaming.state.table import PartitionTable

    _, _, s = feed(DRIFTING_99)
    s["kind"] = "group_partition"
    value = codec.encode_state({"format": codec._FORMAT, "entities": {E: s}, "run": "r", "fields": codec.FIELDS,
                                "partitions": PartitionTable(None, run_id="r").state({})})
    got = codec.stored_entities(value, "r")[E]
    assert (got["drift"], got["drift_clear"], got["step"], got["status"]) == (s["drift"], s["drift_clear"], 990, "WARN")
    assert len(got["drift"]) == LC.DRIFT_POINTS


def test_state_from_before_issue_35_is_picked_up():
    """A state stored before issue 35 (no drift, no step) is carried on: they start empty."""
    _, _, s = feed(DRIFTING_99[:100])
    del s["drift"], s["step"]
    for t, c, hw in DRIFTING_99[100:]:
        L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t * 1000, E, CFG)
    assert s["status"] == "WARN" and s["step"] == 990 and _bounded(s, CFG)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 120_000), st.one_of(st.none(), st.integers(0, 5000)),
                          st.one_of(st.none(), st.integers(0, 5000))), min_size=1, max_size=80))
def test_any_observation_stream_keeps_the_invariants(steps):
    s = L.new_group_partition("k", "g", "t", 0)
    t = 0
    for dt, c, hw in steps:
        t += dt
        for x in L.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t, E, CFG):
            assert x.alert in (HIGH, STATUS)
        assert _bounded(s, CFG)
        assert s["lag"] is None or s["lag"] >= 0
        assert s["lag_seconds"] is None or (math.isfinite(s["lag_seconds"]) and s["lag_seconds"] >= 0)
        assert s["status"] is None or s["status"] in LagStatus.__members__
        if STATUS.value in s["open"]:
            assert s["status"] not in (None, "OK")
    assert _plain(s)


# --- configuration ----------------------------------------------------------------------

def test_defaults():
    assert (CFG.window, CFG.lag_high_offsets, CFG.lag_high_seconds, CFG.lag_high_for_ms, CFG.stall_after_ms,
            CFG.stop_after_ms, CFG.cadence_factor, CFG.rewind_confirmations, CFG.blip_max_ms, CFG.warn_min_rise_ms,
            CFG.min_points, CFG.hw_marks, CFG.max_extrapolation_ms) == (
        10, 10_000, 300.0, 60_000, 90_000, 300_000, 3.0, 2, 30_000, 30_000, 3, 32, 3_600_000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CFG.window = 5  # frozen


@pytest.mark.parametrize("kw, path", [
    ({"window": 2}, "lag.window"),
    ({"window": 65}, "lag.window"),
    ({"window": 10.0}, "lag.window"),
    ({"window": True}, "lag.window"),
    ({"lag_high_offsets": -1}, "lag.lag_high_offsets"),
    ({"lag_high_seconds": float("nan")}, "lag.lag_high_seconds"),
    ({"lag_high_seconds": -1.0}, "lag.lag_high_seconds"),
    ({"lag_high_for_ms": -1}, "lag.lag_high_for_ms"),
    ({"lag_high_for_ms": 1.5}, "lag.lag_high_for_ms"),
    ({"stall_after_ms": 0}, "lag.stall_after_ms"),
    ({"stop_after_ms": 0}, "lag.stop_after_ms"),
    ({"cadence_factor": 0.5}, "lag.cadence_factor"),
    ({"cadence_factor": float("inf")}, "lag.cadence_factor"),
    ({"cadence_factor": True}, "lag.cadence_factor"),
    ({"rewind_confirmations": 0}, "lag.rewind_confirmations"),
    ({"rewind_confirmations": 10}, "lag.rewind_confirmations"),  # needs the point before the drop in the window
    ({"blip_max_ms": -1}, "lag.blip_max_ms"),
    ({"warn_min_rise_ms": -1}, "lag.warn_min_rise_ms"),
    ({"min_points": 2}, "lag.min_points"),
    ({"min_points": 11}, "lag.min_points"),
    ({"hw_marks": 2}, "lag.hw_marks"),
    ({"hw_marks": 129}, "lag.hw_marks"),
    ({"max_extrapolation_ms": -1}, "lag.max_extrapolation_ms"),
])
def test_invalid_config_names_the_setting(kw, path):
    with pytest.raises(ValueError, match=f"^{path}: "):
        LagConfig(**kw)


def test_valid_edge_configs():
    assert LagConfig(window=64, rewind_confirmations=63, min_points=10, hw_marks=128).validate().window == 64
    assert LagConfig(lag_high_offsets=None, lag_high_seconds=None, max_extrapolation_ms=0,
                     lag_high_for_ms=0, blip_max_ms=0, warn_min_rise_ms=0, cadence_factor=1).lag_high_seconds is None
    # a stall limit above the stop limit: no STALL before STOP
    cfg = LagConfig(stall_after_ms=600_000, stop_after_ms=60_000)
    assert LS.stuck_limits(cfg, None, False)[:2] == (60_000, 60_000)
    assert LS.stuck_limits(cfg, [1000], False)[:2] == (60_000, 60_000)



# a consumer draining a 200 000-record backlog at 5 000 per observation while the producers
# write 1 record/s; it dies 390 s in, far behind
DRAINING_DIES = ([(10 * i, 5000 * i, 200_000 + 10 * i) for i in range(40)]
                 + [(390 + 10 * k, 5000 * 39, 200_390 + 10 * k) for k in range(1, 60)])


def test_a_consumer_that_dies_draining_a_backlog_is_stall_and_stop_as_one_committing_every_interval():
    """Its commit step (5 000 records) took the producers 5 000 s to write: as a cadence it
    would put STOP hours after the death.  It commits at every observation, so its waits (one
    interval) are known from its second commit on and the step is never used: STALL 100 s and
    STOP 310 s after the last commit."""
    statuses, out, s = feed(DRAINING_DIES)
    assert s["step"] == 5000 and set(s["waits"]) == {10_000}
    opened = [(t - 390, st) for t, a, act, _, st in out if a == STATUS and act == "open"]
    assert opened == [(100, "STALL"), (310, "STOP")], opened
