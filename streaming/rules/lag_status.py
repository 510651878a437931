"""The status of one group-partition's consumer lag, Burrow-style: OK, WARN, STALL, STOP, REWIND.

:func:`evaluate` decides it from the window of observations and the stuck run, commit cadence
and commit samples ``streaming.rules.lag`` keeps in the state.  How and why:
``docs/lag-rules.md``.

Rules of :func:`evaluate` (first match wins; the verdict names its rule):

0. ``2-rewind-held`` a rewind first seen less than ``rewind_hold_ms`` ago → REWIND, even when
   the consumer is back or caught up since (so every scrape and batch in between shows it).
1. ``1-caught-up``  lag 0 at the latest point → OK.
2. ``2-rewind``     the committed offset went back, confirmed → REWIND.
3. ``3-stop``       committed unchanged with lag > 0 for longer than the stop limit → STOP.
4. ``4-stall``      … for longer than the stall limit → STALL.  Both limits scale with the
   partition's observed commit cadence (Burrow's STOP does too).
5. ``5-lag-drifting`` the lag in seconds, sampled at commits at least 3 min apart over up to
   27 min, rises beyond noise, by at least 10 s and by at least the lag it rose from → WARN,
   even when the consumer is less than a window behind; held while it still rises at all.
   ``5-kept-up``  the latest commit is at or past the oldest HW of the window → OK.
6. ``6-lag-rising`` the lag in seconds, sampled when the consumer commits, rises beyond noise
   and by at least ``warn_min_rise_ms`` → WARN; held while it still rises at all.
7. ``7-ok`` / ``7-ok-few-points`` → OK.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from streaming.rules.lag_config import DEFAULT_CONFIG, LagConfig
from streaming.rules.lag_estimate import Point

#: rules 5 and 6: the fitted rise must exceed this many residual standard deviations
TREND_NOISE_FACTOR = 2.0
#: rule 5 (drift): commit samples needed (at least DRIFT_STEP_MS apart: 12 min at 5)
DRIFT_MIN_POINTS = 5
#: rule 5 (drift): the smallest fitted rise, s, whatever the span
DRIFT_MIN_RISE_S = 10.0
#: rule 5 (drift): … and at least this × the lag it rose from (the fitted line at the first
#: sample): the lag of a slow but stable consumer, 50-130 s behind, wanders by up to 0.73 × that
#: within the series' 27 min (simulated, 240 h); one falling behind from a few seconds doubles
DRIFT_MIN_RISE_RATIO = 1.0

RULE_CAUGHT_UP = "1-caught-up"
RULE_REWIND = "2-rewind"
RULE_REWIND_HELD = "2-rewind-held"
RULE_STOP = "3-stop"
RULE_STALL = "4-stall"
RULE_DRIFT = "5-lag-drifting"
RULE_KEPT_UP = "5-kept-up"
RULE_LAG_RISING = "6-lag-rising"
RULE_OK = "7-ok"
RULE_FEW_POINTS = "7-ok-few-points"


class LagStatus(enum.IntEnum):
    """Status of one group-partition, ordered by severity (the exporter's gauge value)."""

    OK = 0      # caught up, keeping up, or within its usual commit cadence: nothing to do
    WARN = 1    # committing, but its lag in seconds grows from commit to commit: slower than the producers
    STALL = 2   # committed offset unchanged with records waiting, well past its usual cadence: stuck
    STOP = 3    # … for longer than the stop limit: gone (or wedged for good)
    REWIND = 4  # committed offset went back: records are being processed again


def _lag(p: Point) -> int:
    return max(0, p[2] - p[1])


@dataclass(frozen=True)
class Verdict:
    status: LagStatus
    rule: str
    #: the points rules 1 and 3-7 looked at (the history without set-aside lower commits)
    view: list
    #: lower commits set aside: blips that came back, then a drop not yet confirmed
    set_aside: list
    #: the blips among them (on_group_offsets drops these from the stored history)
    blips: list
    #: new value of state["stuck"]
    stuck: Optional[list]
    detail: dict


def _scan(history: Sequence[Point], confirmations: int,
          blip_max_ms: int) -> tuple[list, list, list, Optional[dict]]:
    """Split the history into the points the rules use, the blips and a pending drop, and
    find a rewind that has not recovered yet — or that is recognised by the latest point.

    A lower commit is a rewind once seen at ``confirmations`` consecutive observations.  One
    that is back (at or above the offset before it) sooner is a blip — set aside — only if it
    cannot have lasted longer than ``blip_max_ms``: the observation before the drop and the
    one back are at most that far apart.  Otherwise it was a rewind that has recovered; when
    the latest observation is the one that shows this, the rewind is reported there."""
    view: list = []
    pending: list = []      # consecutive points below the last accepted committed offset
    aside: list = []
    rewind: Optional[dict] = None
    last = len(history) - 1
    for i, p in enumerate(history):
        if view and p[1] < view[-1][1]:
            pending.append(p)
            if len(pending) >= confirmations:
                frm = max(view[-1][1], rewind["from_offset"]) if rewind else view[-1][1]
                rewind = {"from_offset": frm, "to_offset": pending[0][1], "at": pending[0][0],
                          "confirmations": len(pending)}
                view.extend(pending)
                pending = []
            continue
        if pending:
            lasted = p[0] - view[-1][0]
            if lasted <= blip_max_ms:
                aside.extend(pending)  # back before it could have lasted long: a blip
            else:
                if i == last:
                    rewind = {"from_offset": view[-1][1], "to_offset": pending[0][1], "at": pending[0][0],
                              "confirmations": len(pending), "recovered": True, "lasted_at_most_ms": lasted}
                view.extend(pending)
            pending = []
        view.append(p)
        if rewind and p[1] >= rewind["from_offset"] and not (i == last and rewind.get("recovered")):
            rewind = None      # the consumer is back where it was before the rewind
    return view, aside, pending, rewind


def _stuck(view: list, prev: Optional[Sequence[int]]) -> Optional[list]:
    """First point of the trailing run with the latest committed offset and lag > 0; carried
    over from ``prev`` (the previous observation's value) when the run spans the whole view."""
    last = view[-1]
    if _lag(last) == 0:
        return None
    i = len(view) - 1
    while i > 0 and view[i - 1][1] == last[1] and _lag(view[i - 1]) > 0:
        i -= 1
    start = view[i]
    if i == 0 and prev is not None and prev[1] == last[1] and prev[0] <= start[0]:
        return [int(prev[0]), int(prev[1]), int(prev[2])]
    return [int(start[0]), int(start[1]), int(start[2])]


def stuck_limits(cfg: LagConfig, waits: Optional[Sequence[int]], grew: bool) -> tuple[float, float, Optional[int]]:
    """(stall limit ms, stop limit ms, cadence ms or None) for a stuck run.

    The cadence is the longest of the recent waits (how long the consumer sat on a committed
    offset with records waiting before committing past it).  Known: STALL after
    max(``stall_after_ms``, factor × cadence), STOP after max(``stop_after_ms``, 2 × factor ×
    cadence); a stall limit above the stop limit is the stop limit (no STALL before STOP).
    Unknown (the monitor has not yet seen it commit past a wait): STALL after
    ``stall_after_ms`` if no record arrived during the run (the consumer had all it needed to
    commit), else not before ``stop_after_ms`` (it may be filling a batch); STOP after
    ``stop_after_ms``."""
    if waits:
        cadence = max(waits)
        stop = max(cfg.stop_after_ms, 2 * cfg.cadence_factor * cadence)
        return min(stop, max(cfg.stall_after_ms, cfg.cadence_factor * cadence)), stop, int(cadence)
    return (cfg.stop_after_ms if grew else min(cfg.stall_after_ms, cfg.stop_after_ms)), cfg.stop_after_ms, None


def _fit(samples: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """(slope, fitted rise s, residual sd s) of the least-squares line through ``[t ms, lag ms]``."""
    n = len(samples)
    t0 = samples[0][0]
    sx = sy = sxx = sxy = syy = 0.0
    for t, y in samples:
        x = (t - t0) / 1000.0
        y = y / 1000.0
        sx += x
        sy += y
        sxx += x * x
        sxy += x * y
        syy += y * y
    vxx = sxx - sx * sx / n
    if vxx <= 0:
        return 0.0, 0.0, 0.0
    vxy = sxy - sx * sy / n
    slope = vxy / vxx
    sse = max(0.0, (syy - sy * sy / n) - slope * vxy)
    noise = math.sqrt(sse / (n - 2)) if n > 2 else 0.0
    return slope, slope * (samples[-1][0] - t0) / 1000.0, noise


def _trend(samples: Sequence[Sequence[float]]) -> dict:
    """The least-squares line of the lag in seconds over time through the commit samples
    (``[t ms, lag ms]``), as the WARN evidence shows it."""
    slope, rise, noise = _fit(samples)
    return {"samples": len(samples), "first_lag_s": round(samples[0][1] / 1000.0, 3),
            "last_lag_s": round(samples[-1][1] / 1000.0, 3),
            "span_s": round((samples[-1][0] - samples[0][0]) / 1000.0, 3),
            "slope": round(slope, 6), "rise_s": round(rise, 3), "noise_s": round(noise, 3)}


def _drift_fit(samples: Sequence[Sequence[int]]) -> Optional[tuple[float, float]]:
    """(fitted rise s, the lag it rose from s) when ``samples`` show a drift beyond noise and
    by at least the floors, else None."""
    n = len(samples)
    if n < DRIFT_MIN_POINTS - 1 or samples[-1][1] <= samples[0][1]:
        return None
    slope, rise, noise = _fit(samples)
    rose_from = max(0.0, _start(samples, slope))
    if (slope <= 0 or rise <= TREND_NOISE_FACTOR * noise or rise < DRIFT_MIN_RISE_S
            or rise < DRIFT_MIN_RISE_RATIO * rose_from):
        return None
    return rise, rose_from


def _start(samples: Sequence[Sequence[int]], slope: float) -> float:
    """The least-squares line's value at the first sample, s."""
    n = len(samples)
    t0 = samples[0][0]
    mx = sum((s[0] - t0) / 1000.0 for s in samples) / n
    my = sum(s[1] / 1000.0 for s in samples) / n
    return my - slope * mx


def drifting(samples: Sequence[Sequence[int]], warned: bool = False) -> Optional[dict]:
    """Rule 5's test of the long series of commit samples (``[t ms, lag ms]``, at least
    ``DRIFT_STEP_MS`` apart): the WARN evidence of a drift, or None.

    A drift: at least ``DRIFT_MIN_POINTS`` samples, the last at least half
    ``DRIFT_MIN_RISE_S`` above the first (a cheap test first: most series fail it), a
    least-squares rise beyond noise (``TREND_NOISE_FACTOR``), of at least ``DRIFT_MIN_RISE_S``
    and at least ``DRIFT_MIN_RISE_RATIO`` × the lag it rose from (the line at the first
    sample); and all of this already without the latest sample (one high sample — a burst
    being drained — is not a drift).  ``warned``: held while the line still rises at all and
    the last sample is above the first.  The floors are absolute, not relative to the
    producers' rate: a consumer at 99 % of their speed (0.01 s/s) is WARN ~21 min after it
    slowed down at 5 or at 500 records/s."""
    if len(samples) < DRIFT_MIN_POINTS or samples[-1][1] <= samples[0][1]:
        return None
    if not warned and samples[-1][1] - samples[0][1] < DRIFT_MIN_RISE_S * 500:  # cheap: no fit
        return None
    if warned:
        slope = _fit(samples)[0]
        if slope <= 0:
            return None
        rose_from = max(0.0, _start(samples, slope))
    else:
        fit = _drift_fit(samples)
        if fit is None or _drift_fit(samples[:-1]) is None:
            return None
        rose_from = fit[1]
    return {**_trend(samples), "min_rise_s": max(DRIFT_MIN_RISE_S, round(DRIFT_MIN_RISE_RATIO * rose_from, 3)),
            "held": warned, "lag_samples": [list(s) for s in samples]}


def evaluate(history: Sequence[Point], cfg: LagConfig, now: int, stuck: Optional[Sequence[int]] = None,
             waits: Optional[Sequence[int]] = None, trend: Optional[Sequence[Sequence[int]]] = None,
             stalled: bool = False, warned: bool = False, rewound: Optional[Sequence[int]] = None,
             drift: Optional[Sequence[Sequence[int]]] = None, drift_warned: bool = False) -> Verdict:
    """:func:`evaluate_status` with everything it found (for evidence and the state).

    ``stuck``: the state's stuck run from the previous observation; ``waits``: the recent
    waits between commits (None or empty: cadence unknown); ``trend``: the commit samples of
    the lag in seconds, ``[t, lag ms]`` (None: none — a window alone cannot give them: when
    rule 6 is reached, every commit in it is older than its oldest HW); ``stalled``:
    the previous observation was already STALL or STOP in this same stuck run (a STALL is not
    taken back while the run lasts); ``warned``: the previous observation was WARN (WARN then
    holds while the lag in seconds still rises at all: a producer speeding up for a minute
    does not end it); ``rewound``: the last confirmed rewind, ``[first seen at, from offset,
    to offset]`` (rule 0 holds it); ``drift``: the long series of commit samples,
    ``[t, lag ms]`` at least ``DRIFT_STEP_MS`` apart (rule 5, :func:`drifting`);
    ``drift_warned``: the WARN now open was opened by rule 5 (it then holds while the series
    still rises at all; ``warned`` holds rule 6's)."""
    if not history:
        return Verdict(LagStatus.OK, RULE_FEW_POINTS, [], [], [], None, {})
    view, blips, pending, rewind = _scan(history, cfg.rewind_confirmations, cfg.blip_max_ms)
    new_stuck = _stuck(view, stuck)

    def v(status: LagStatus, rule: str, **detail: Any) -> Verdict:
        return Verdict(status, rule, view, blips + pending, blips, new_stuck, detail)

    # 0. a rewind seen less than rewind_hold_ms ago, now recovered or out of the window
    if rewind is None and rewound is not None and now - rewound[0] < cfg.rewind_hold_ms:
        return v(LagStatus.REWIND, RULE_REWIND_HELD, rewound_at=rewound[0], from_offset=rewound[1],
                 to_offset=rewound[2], held_until=rewound[0] + cfg.rewind_hold_ms)
    # 1. caught up at the latest point (or at the latest point before an unconfirmed lower commit)
    if _lag(history[-1]) == 0 or _lag(view[-1]) == 0:
        return v(LagStatus.OK, RULE_CAUGHT_UP)
    # 2. a lower committed offset that persisted (or that could have lasted longer than a blip)
    if rewind is not None:
        return v(LagStatus.REWIND, RULE_REWIND, **rewind)
    # 3-4. sitting on one committed offset with records waiting, past its usual cadence
    if new_stuck is not None:
        stuck_for = now - new_stuck[0]
        grew = view[-1][2] > new_stuck[2]
        stall_ms, stop_ms, cadence = stuck_limits(cfg, waits, grew)
        why = {"stuck_since": new_stuck[0], "stuck_for_ms": stuck_for, "committed": new_stuck[1],
               "hw_at_stuck_since": new_stuck[2], "hw": view[-1][2], "commit_cadence_ms": cadence,
               "stall_limit_ms": int(stall_ms), "stop_limit_ms": int(stop_ms)}
        if stuck_for > stop_ms:
            return v(LagStatus.STOP, RULE_STOP, **why)
        if stuck_for > stall_ms or (stalled and stuck is not None and stuck[0] == new_stuck[0]):
            return v(LagStatus.STALL, RULE_STALL, **why)
    # 5. its lag in seconds drifts up over the long series of commit samples (before rule 5:
    #    a consumer slightly slower than its producers is less than a window behind for hours)
    if drift:
        d = drifting(drift, drift_warned)
        if d is not None:
            return v(LagStatus.WARN, RULE_DRIFT, **d)
    # 5. the consumer has consumed everything the partition held at the window's start
    if view[-1][1] >= view[0][2]:
        return v(LagStatus.OK, RULE_KEPT_UP, committed=view[-1][1], oldest_hw=view[0][2], since=view[0][0])
    # 6. its lag in seconds grows from commit to commit
    samples = list(trend or ())
    if len(samples) < cfg.min_points:
        return v(LagStatus.OK, RULE_FEW_POINTS, n_samples=len(samples), min_points=cfg.min_points)
    if samples[-1][1] <= samples[0][1]:  # not higher than at the first sample: not rising (and cheap)
        return v(LagStatus.OK, RULE_OK)
    slope, rise, noise = _fit(samples)
    if slope > 0 and (warned or (rise > TREND_NOISE_FACTOR * noise and rise * 1000 >= cfg.warn_min_rise_ms)):
        return v(LagStatus.WARN, RULE_LAG_RISING, **_trend(samples), warn_min_rise_ms=cfg.warn_min_rise_ms,
                 held=warned, lag_samples=[list(s) for s in samples])
    return v(LagStatus.OK, RULE_OK)


def evaluate_status(history: Sequence[Point], cfg: LagConfig = DEFAULT_CONFIG, now: Optional[int] = None,
                    stuck: Optional[Sequence[int]] = None, waits: Optional[Sequence[int]] = None,
                    trend: Optional[Sequence[Sequence[int]]] = None,
                    drift: Optional[Sequence[Sequence[int]]] = None) -> tuple[LagStatus, str]:
    """(status, rule) for the window ``history`` (``[t, committed, hw]`` points, oldest first,
    strictly increasing t) at time ``now`` (default: the latest point's time).  ``stuck``,
    ``waits``, ``trend``, ``drift``: the state's values (see :func:`evaluate`); without them the
    stuck run starts in the window, the commit cadence is unknown and there are no commit
    samples (no WARN).  Rules: see the module docstring."""
    if now is None:
        now = history[-1][0] if history else 0
    verdict = evaluate(history, cfg, now, stuck, waits, trend, drift=drift)
    return verdict.status, verdict.rule

