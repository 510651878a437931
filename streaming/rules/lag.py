"""Consumer lag of one group-partition: lag in seconds, a Burrow-style status, ConsumerLagHigh.

Pure functions of (previous entity state, one ``group_offsets`` observation, ``now``): no clock
is read, nothing is written but the state dict, so replaying the same observations gives the
same state and transitions.  How the status and the lag in seconds are decided, and why:
``docs/lag-rules.md``; the rules are proved by ``tests/unit/test_rules_lag.py`` (tables) and
``tests/unit/test_lag_simulation.py`` (simulated healthy and dead consumers).

Rules of :func:`evaluate` (first match wins; the verdict names its rule):

1. ``1-caught-up``  lag 0 at the latest point → OK.
2. ``2-rewind``     the committed offset went back, confirmed → REWIND.
3. ``3-stop``       committed unchanged with lag > 0 for longer than the stop limit → STOP.
4. ``4-stall``      … for longer than the stall limit → STALL.  Both limits scale with the
   partition's observed commit cadence (Burrow's STOP does too).
5. ``5-kept-up``    the latest commit is at or past the oldest HW of the window → OK.
6. ``6-lag-rising`` the lag in seconds, sampled when the consumer commits, rises beyond noise
   and by at least ``warn_min_rise_ms`` → WARN; held while it still rises at all.
7. ``7-ok`` / ``7-ok-few-points`` → OK.

State per group-partition (plain JSON values, every list bounded): ``history`` (the last
``window`` observations ``[t, committed, hw]``), ``marks`` (at most ``hw_marks`` ``[t, hw]``
points, thinned geometrically with age), ``anchor`` (``[committed, written_at]``), ``stuck``
(``[t, committed, hw]``), ``waits`` (at most :data:`CADENCE_SAMPLES` ms), ``trend`` (at most
:data:`TREND_POINTS` ``[t, lag_ms]``), ``high_since`` and ``first_seen`` (ms), ``lag_seconds``,
``lag_seconds_basis``, ``status``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Sequence

from streaming.rules import base as rules
from streaming.rules.base import Alert, Severity, Transition

#: hard cap on ``LagConfig.window``: the state of every group-partition holds this many points
WINDOW_CAP = 64
#: hard cap on ``LagConfig.hw_marks``
MARKS_CAP = 128
#: HW marks: an inner mark is dropped when its neighbours are within this fraction of the
#: younger neighbour's age of each other (the HW history's resolution: under 40 % of the age)
MARK_RATIO = 0.4
#: rule 6: the fitted rise must exceed this many residual standard deviations
TREND_NOISE_FACTOR = 2.0
#: rule 6: commit samples of the lag in seconds: at most this many, at least this far apart
TREND_POINTS = 10
TREND_STEP_MS = 30_000
#: rules 3-4: the commit cadence is the longest of the last this-many waits
CADENCE_SAMPLES = 8

RULE_CAUGHT_UP = "1-caught-up"
RULE_REWIND = "2-rewind"
RULE_STOP = "3-stop"
RULE_STALL = "4-stall"
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


_NAMES = {s: s.name for s in LagStatus}  # enum .name is a slow descriptor; this runs per observation
_WARN, _STALL, _STOP = LagStatus.WARN.name, LagStatus.STALL.name, LagStatus.STOP.name
_HIGH_ALERT, _STATUS_ALERT = Alert.CONSUMER_LAG_HIGH.value, Alert.CONSUMER_LAG_STATUS.value

#: severity of the ConsumerLagStatus alert per status (None: no alert).  STOP and REWIND page:
#: a stopped consumer's lag grows without bound (data goes unprocessed until someone acts, and
#: past retention it is lost), and a confirmed rewind means records are being processed twice
#: (duplicate side effects) or the group fell back to auto.offset.reset.  WARN and STALL are
#: working-hours problems: the consumer still moves (WARN), or has been stuck for less than the
#: stop limit (STALL) — STALL escalates to STOP by itself.
STATUS_SEVERITY: dict[LagStatus, Optional[Severity]] = {
    LagStatus.OK: None,
    LagStatus.WARN: Severity.WARNING,
    LagStatus.STALL: Severity.WARNING,
    LagStatus.STOP: Severity.CRITICAL,
    LagStatus.REWIND: Severity.CRITICAL,
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


@dataclass(frozen=True)
class LagConfig:
    """Settings of the lag rules (config section ``lag``); validated when built.  Defaults are
    for a probe that observes every 10 s; ``docs/lag-rules.md`` says why each is what it is.

    - ``window`` 10 observations: the span of rule 5 (kept up) and of the status evidence,
      and where blips and rewinds are recognised.  At most 64.
    - ``lag_high_offsets`` 10 000, ``lag_high_seconds`` 300 (None disables that half) and
      ``lag_high_for_ms`` 60 000: ConsumerLagHigh opens once a threshold has been exceeded at
      every observation for at least that long (0: at the first observation).
    - ``stall_after_ms`` 90 000 and ``stop_after_ms`` 300 000 (Kafka's default
      ``max.poll.interval.ms``): how long a consumer may sit on one committed offset with
      records waiting before STALL / STOP, at least; ``cadence_factor`` 3: and at least 3 ×
      (STALL) and 6 × (STOP) its longest recent wait between commits.
    - ``rewind_confirmations`` 2 and ``blip_max_ms`` 30 000: a lower commit seen at 2
      observations is a rewind; one that is back before that is a blip only if it cannot have
      lasted longer than ``blip_max_ms`` (the observations around it are that close).
    - ``warn_min_rise_ms`` 30 000: WARN needs the lag in seconds to have risen by this much
      over its commit samples (3 probe intervals: above the estimate's error).
    - ``min_points`` 3: a least-squares trend needs a residual to tell a rise from noise.
    - ``hw_marks`` 32: points of the long HW history (at one per 10 s: about 6 h, each gap
      under 40 % of its age).
    - ``max_extrapolation_ms`` 3 600 000: how far before the oldest HW mark the lag in seconds
      may be extrapolated; past that it is reported as a lower bound.
    """

    window: int = 10
    lag_high_offsets: Optional[int] = 10_000
    lag_high_seconds: Optional[float] = 300.0
    lag_high_for_ms: int = 60_000
    stall_after_ms: int = 90_000
    stop_after_ms: int = 300_000
    cadence_factor: float = 3.0
    rewind_confirmations: int = 2
    blip_max_ms: int = 30_000
    warn_min_rise_ms: int = 30_000
    min_points: int = 3
    hw_marks: int = 32
    max_extrapolation_ms: int = 3_600_000

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "LagConfig":
        """Raise ValueError naming the setting (``lag.<name>: ...``)."""
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"lag.{name}: {rule}, got {getattr(self, name)!r}")

        def non_negative_int(name: str) -> None:
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "must be an integer >= 0")

        if not _is_int(self.window) or not 3 <= self.window <= WINDOW_CAP:
            raise bad("window", f"must be an integer within 3..{WINDOW_CAP}")
        if self.lag_high_offsets is not None and (not _is_int(self.lag_high_offsets) or self.lag_high_offsets < 0):
            raise bad("lag_high_offsets", "must be an integer >= 0, or None to disable")
        if self.lag_high_seconds is not None and (not _is_number(self.lag_high_seconds) or self.lag_high_seconds < 0):
            raise bad("lag_high_seconds", "must be a finite number >= 0, or None to disable")
        non_negative_int("lag_high_for_ms")
        if not _is_int(self.stop_after_ms) or self.stop_after_ms <= 0:
            raise bad("stop_after_ms", "must be an integer > 0")
        if not _is_int(self.stall_after_ms) or self.stall_after_ms <= 0:
            raise bad("stall_after_ms", "must be an integer > 0")
        if not _is_number(self.cadence_factor) or self.cadence_factor < 1:
            raise bad("cadence_factor", "must be a finite number >= 1")
        if not _is_int(self.rewind_confirmations) or not 1 <= self.rewind_confirmations < self.window:
            raise bad("rewind_confirmations", f"must be an integer within 1..window-1 ({self.window - 1})")
        non_negative_int("blip_max_ms")
        non_negative_int("warn_min_rise_ms")
        if not _is_int(self.min_points) or not 3 <= self.min_points <= TREND_POINTS:
            raise bad("min_points", f"must be an integer within 3..{TREND_POINTS}")
        if not _is_int(self.hw_marks) or not 3 <= self.hw_marks <= MARKS_CAP:
            raise bad("hw_marks", f"must be an integer within 3..{MARKS_CAP}")
        non_negative_int("max_extrapolation_ms")
        return self


DEFAULT_CONFIG = LagConfig()

Point = Sequence[int]  # [t, committed, hw]; HW histories: [t, hw] or [t, committed, hw] (the HW is last)


def _lag(p: Point) -> int:
    return max(0, p[2] - p[1])


def _with_lag(points: Sequence[Point]) -> list[list[int]]:
    return [[p[0], p[1], p[2], _lag(p)] for p in points]


# --- lag in seconds -----------------------------------------------------------------------

class LagSeconds(NamedTuple):
    """``seconds`` ≥ 0 and finite; ``basis`` says how it was obtained:

    - ``caught-up``: committed ≥ the latest HW, 0;
    - ``interpolated``: the record at the committed offset was written between two points of
      the HW history (the first with HW > committed and the one before it); placed within them;
    - ``extrapolated``: it was written before the oldest point; estimated with the history's
      HW rate;
    - ``lower-bound``: before the oldest point, and the estimate hit ``max_extrapolation_ms``,
      or there is no rate: the true lag is at least ``seconds``.
    """

    seconds: float
    basis: str

    @property
    def lower_bound(self) -> bool:
        return self.basis == "lower-bound"


def written_at(history: Sequence[Point], committed: int, cfg: LagConfig = DEFAULT_CONFIG) -> tuple[float, str]:
    """(epoch ms, basis): when the record at offset ``committed`` — the oldest one the group
    has not consumed — was written, from the ``(t, HW)`` history (oldest first, HW last in each
    point); ``committed`` must be below the latest HW.

    The record was written by the first point whose HW is above ``committed`` and after the
    point before it (on a flat HW, the *last* point of the flat run, not the first).  Between
    those two points the HW is taken to rise evenly and the record is placed in the middle of
    its slot: the ``(committed - h0 + 1)``-th of the ``h1 - h0`` records written between them.
    The divisor is > 0 by construction (no Inf, no NaN).  When already the oldest point has
    HW > committed, the time is extrapolated back from it with the history's HW rate, at most
    ``max_extrapolation_ms`` (then a lower bound), or is the oldest point's (a lower bound)."""
    k = 0
    for p in history:
        if p[-1] > committed:
            break
        k += 1
    if k > 0:  # k < len: the latest HW is above committed
        t0, h0 = history[k - 1][0], history[k - 1][-1]
        t1, h1 = history[k][0], history[k][-1]
        return t0 + (t1 - t0) * (committed - h0 + 0.5) / (h1 - h0), "interpolated"
    t_first, hw_first = history[0][0], history[0][-1]
    t_last, hw_last = history[-1][0], history[-1][-1]
    if hw_last > hw_first and t_last > t_first:
        back = (hw_first - committed - 0.5) * (t_last - t_first) / (hw_last - hw_first)
        if back > cfg.max_extrapolation_ms:
            return float(t_first - cfg.max_extrapolation_ms), "lower-bound"
        return t_first - back, "extrapolated"
    return float(t_first), "lower-bound"


def estimate_lag_seconds(history: Sequence[Point], committed: Optional[int], now: int,
                         cfg: LagConfig = DEFAULT_CONFIG, behind_since: Optional[int] = None) -> Optional[LagSeconds]:
    """The lag in seconds: the age at ``now`` of the record at offset ``committed`` (the
    oldest record the group has not consumed), from the ``(t, HW)`` history — see
    :func:`written_at`.

    - None when ``committed`` is None (nothing committed: no lag, not an infinite one) or
      there is no history.
    - 0 when ``committed`` ≥ the latest HW: caught up, including an idle topic whose HW has
      been flat for hours.
    - A flat HW at the committed offset counts up to its *last* point: on an idle topic the
      first new record was written after the HW last stood at the committed offset, not when
      the HW first got there.  A HW that went back (a new leader whose HW lags) does not
      unwrite records: the first time the HW was above ``committed`` counts.
    - ``behind_since``: a time at which the HW is known to have been above ``committed``
      already (the start of the stuck run); the result is never less than ``now - behind_since``.
    - Never negative (``now`` before the record's time is clamped to 0).
    """
    if committed is None or not history:
        return None
    if committed >= history[-1][-1]:
        return LagSeconds(0.0, "caught-up")
    at, basis = written_at(history, committed, cfg)
    if behind_since is not None and behind_since < at:
        at, basis = float(behind_since), "lower-bound"
    return LagSeconds(round(max(0.0, (now - at) / 1000.0), 3), basis)


def lag_seconds(history: Sequence[Point], committed: Optional[int], now: int,
                cfg: LagConfig = DEFAULT_CONFIG, behind_since: Optional[int] = None) -> Optional[float]:
    """The number of :func:`estimate_lag_seconds` (use that one to know whether it is a lower bound)."""
    est = estimate_lag_seconds(history, committed, now, cfg, behind_since)
    return None if est is None else est.seconds


def add_mark(marks: list, t: int, hw: int, cap: int) -> None:
    """Append ``[t, hw]`` to the long HW history and keep it bounded: the middle of three
    equal HWs carries nothing (a flat run keeps its first and last point); an inner mark goes
    when its two neighbours are within ``MARK_RATIO`` × the younger neighbour's age of each
    other (the resolution falls with age: under 40 %); past ``cap`` the oldest goes.  The thinning
    pass runs when the list is full or its length a multiple of 8 (in between the marks are
    only finer than that)."""
    if marks and t <= marks[-1][0]:
        return
    marks.append([t, hw])
    n = len(marks)
    if n >= 3 and marks[-3][1] == marks[-2][1] == hw:
        del marks[-2]
        return
    if n <= cap and n & 7:
        return
    i = 1
    while i < len(marks) - 1:
        if marks[i + 1][0] - marks[i - 1][0] <= MARK_RATIO * (t - marks[i + 1][0]):
            del marks[i]
        else:
            i += 1
    if len(marks) > cap:
        del marks[:len(marks) - cap]


# --- status --------------------------------------------------------------------------------

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


def evaluate(history: Sequence[Point], cfg: LagConfig, now: int, stuck: Optional[Sequence[int]] = None,
             waits: Optional[Sequence[int]] = None, trend: Optional[Sequence[Sequence[int]]] = None,
             stalled: bool = False, warned: bool = False) -> Verdict:
    """:func:`evaluate_status` with everything it found (for evidence and the state).

    ``stuck``: the state's stuck run from the previous observation; ``waits``: the recent
    waits between commits (None or empty: cadence unknown); ``trend``: the commit samples of
    the lag in seconds, ``[t, lag ms]`` (None: none — a window alone cannot give them: when
    rule 6 is reached, every commit in it is older than its oldest HW); ``stalled``:
    the previous observation was already STALL or STOP in this same stuck run (a STALL is not
    taken back while the run lasts); ``warned``: the previous observation was WARN (WARN then
    holds while the lag in seconds still rises at all: a producer speeding up for a minute
    does not end it)."""
    if not history:
        return Verdict(LagStatus.OK, RULE_FEW_POINTS, [], [], [], None, {})
    view, blips, pending, rewind = _scan(history, cfg.rewind_confirmations, cfg.blip_max_ms)
    new_stuck = _stuck(view, stuck)

    def v(status: LagStatus, rule: str, **detail: Any) -> Verdict:
        return Verdict(status, rule, view, blips + pending, blips, new_stuck, detail)

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
                    trend: Optional[Sequence[Sequence[int]]] = None) -> tuple[LagStatus, str]:
    """(status, rule) for the window ``history`` (``[t, committed, hw]`` points, oldest first,
    strictly increasing t) at time ``now`` (default: the latest point's time).  ``stuck``,
    ``waits``, ``trend``: the state's values (see :func:`evaluate`); without them the stuck run
    starts in the window, the commit cadence is unknown and there are no commit samples (no
    WARN).  Rules: see the module docstring."""
    if now is None:
        now = history[-1][0] if history else 0
    verdict = evaluate(history, cfg, now, stuck, waits, trend)
    return verdict.status, verdict.rule


# --- the entity ----------------------------------------------------------------------------

def new_group_partition(cluster: str, group: str, topic: str, partition: int) -> dict:
    return {"cluster": cluster, "group": group, "topic": topic, "partition": partition,
            "committed": None, "hw": None, "lag": None, "last_seen": None, "open": {}}


def offset_lag(committed: Optional[int], hw: Optional[int]) -> Optional[int]:
    """Lag in offsets from one consistent observation: None when either side is unknown (no
    commit yet, or HW not observed), never negative (a commit read after the HW — or a
    just-moved leader whose HW lags — would otherwise show as negative lag)."""
    if committed is None or hw is None:
        return None
    return max(0, int(hw) - int(committed))


def group_partition_labels(state: dict) -> dict[str, Any]:
    return {"cluster": state["cluster"], "group": state["group"], "topic": state["topic"],
            "partition": state["partition"]}


def _offset(v: Any) -> Optional[int]:
    """An offset from an observation; None for missing and for Kafka's negative 'no offset'
    sentinels (-1, -1001), which the contract turns into null before they get here."""
    if v is None:
        return None
    v = int(v)
    return None if v < 0 else v


def _lag_high(lag: Optional[int], est: Optional[LagSeconds], cfg: LagConfig) -> list[str]:
    tripped = []
    if lag is not None and cfg.lag_high_offsets is not None and lag > cfg.lag_high_offsets:
        tripped.append("offsets")
    if est is not None and cfg.lag_high_seconds is not None and est.seconds > cfg.lag_high_seconds:
        tripped.append("seconds")
    return tripped


def _with_severity(ts: list[Transition], severity: Optional[Severity]) -> list[Transition]:
    return [dataclasses.replace(t, severity_override=severity) for t in ts]


def _resolve_status(state: dict, entity: str, labels: dict, now: int, evidence: dict) -> list[Transition]:
    was = state["open"].get(Alert.CONSUMER_LAG_STATUS.value)
    if was is None:
        return []
    severity = STATUS_SEVERITY[LagStatus[was["evidence"]["status"]]]
    return _with_severity(rules._resolve(state, Alert.CONSUMER_LAG_STATUS, entity, labels, now, evidence), severity)


def _lag_now(state: dict, committed: int, hw: int, now: int, cfg: LagConfig,
             behind_since: Optional[int]) -> LagSeconds:
    """The lag in seconds of this observation, from the anchor when it is the same committed
    offset (its record's time does not change while the offset does not), else from the HW
    marks (and the anchor is set when the time was interpolated)."""
    if committed >= hw:
        state["anchor"] = None
        return LagSeconds(0.0, "caught-up")
    anchor = state.get("anchor")
    if anchor is not None and anchor[0] == committed:
        at, basis = float(anchor[1]), "interpolated"
    else:
        at, basis = written_at(state["marks"], committed, cfg)
        state["anchor"] = [committed, int(round(at))] if basis == "interpolated" else None
    if behind_since is not None and behind_since < at:
        at, basis = float(behind_since), "lower-bound"
    return LagSeconds(round(max(0.0, (now - at) / 1000.0), 3), basis)


def on_group_offsets(state: dict, obs: dict, now: int, entity: str,
                     cfg: LagConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one ``group_offsets`` observation into ``state`` (mutated); return transitions.

    - An observation at or before ``state["last_seen"]`` (a replay, or out of order) changes
      nothing and returns no transition.
    - HW unknown: committed is recorded, lag and lag in seconds become None, the histories,
      the status and open alerts stay as they are (not knowing is not recovering).
    - No committed offset: the HW joins the HW marks; lag, lag in seconds and status become
      None, the stuck run and the commit samples are forgotten, open ConsumerLagHigh /
      ConsumerLagStatus resolve (there is no position to be late with; an empty group with lag
      is GroupEmptyWithLag's business).  The history keeps its earlier points, so a commit that
      comes back lower is seen as a rewind.
    - Otherwise the point ``[now, committed, hw]`` joins the history (at most ``cfg.window``)
      and the HW marks, lag = max(0, hw - committed), the lag in seconds and the status are
      recomputed, and: ConsumerLagHigh opens once lag > ``lag_high_offsets`` or lag in seconds
      > ``lag_high_seconds`` has held at every observation for ``lag_high_for_ms`` (evidence
      says which tripped), and resolves at the first observation where neither does;
      ConsumerLagStatus is open while the status is not OK, with the severity of
      :data:`STATUS_SEVERITY`; when the status changes from one non-OK status to another, the
      old alert resolves and a new one opens (new id), so the severity follows the status.
    """
    last_seen = state.get("last_seen")
    if last_seen is not None and now <= last_seen:
        return []
    committed = _offset(obs.get("committed_offset"))
    hw = _offset(obs.get("high_watermark"))
    labels = group_partition_labels(state)
    history = state.setdefault("history", [])
    lso = _offset(obs.get("last_stable_offset"))
    state.update(committed=committed, hw=hw, lag=offset_lag(committed, hw), last_seen=now,
                 rc_lag=offset_lag(committed, lso))  # a read_committed consumer's lag: to the LSO
    for key, empty in (("status", None), ("stuck", None), ("marks", []), ("anchor", None), ("waits", []),
                       ("trend", []), ("high_since", None)):
        state.setdefault(key, empty)
    if hw is None:
        state.update(lag_seconds=None, lag_seconds_basis=None)
        return []
    add_mark(state["marks"], int(now), hw, cfg.hw_marks)
    if committed is None:
        state.update(lag_seconds=None, lag_seconds_basis=None, status=None, stuck=None, anchor=None, trend=[],
                     high_since=None)
        why = {"reason": "no committed offset", "committed": None, "hw": hw}
        return (rules._resolve(state, Alert.CONSUMER_LAG_HIGH, entity, labels, now, dict(why))
                + _resolve_status(state, entity, labels, now, dict(why)))

    prev_committed = history[-1][1] if history else None
    history.append([int(now), committed, hw])
    del history[:-cfg.window]
    old_stuck = state["stuck"]
    first_seen = state.setdefault("first_seen", int(now))
    # the stuck run ended with a commit past it: one more sample of the commit cadence — not
    # a run already under way at the first observation (its start is unknown, the wait would
    # be too short), not an outage that reached STOP (not how this consumer usually commits)
    if (old_stuck is not None and committed > old_stuck[1] and old_stuck[0] > first_seen
            and state["status"] != _STOP):
        state["waits"] = (state["waits"] + [int(now - old_stuck[0])])[-CADENCE_SAMPLES:]
    est = _lag_now(state, committed, hw, now, cfg,
                   old_stuck[0] if old_stuck is not None and old_stuck[1] == committed else None)
    trend = state["trend"]
    if committed >= hw:
        state["trend"] = [[int(now), 0]]
    elif prev_committed is not None and committed < prev_committed:
        state["trend"] = []
    elif (prev_committed is not None and committed > prev_committed and est.basis == "interpolated"
          and (not trend or now - trend[-1][0] >= TREND_STEP_MS)):
        state["trend"] = (trend + [[int(now), int(round(est.seconds * 1000))]])[-TREND_POINTS:]
    previous = state["status"]
    verdict = evaluate(history, cfg, now, old_stuck, state["waits"], state["trend"],
                       stalled=previous in (_STALL, _STOP), warned=previous == _WARN)
    if verdict.blips:  # recognised blips are forgotten: once the point before them leaves the
        gone = {p[0] for p in verdict.blips}  # window, they would look like a real older offset
        history[:] = [p for p in history if p[0] not in gone]
    status = verdict.status
    name = _NAMES[status]
    state.update(stuck=verdict.stuck, lag_seconds=est.seconds, lag_seconds_basis=est.basis, status=name)
    lag = state["lag"]
    out: list[Transition] = []

    # ConsumerLagHigh: a threshold exceeded at every observation for lag_high_for_ms.  The
    # evidence is built only for a transition: most observations change nothing.
    tripped = _lag_high(lag, est, cfg)
    if not tripped:
        state["high_since"] = None
    elif state["high_since"] is None:
        state["high_since"] = int(now)
    is_open = _HIGH_ALERT in state["open"]
    held = bool(tripped) and now - state["high_since"] >= cfg.lag_high_for_ms
    if (held and not is_open) or (not tripped and is_open):
        high_ev = {"lag": lag, "lag_seconds": est.seconds, "lag_seconds_basis": est.basis,
                   "lag_seconds_is_lower_bound": est.lower_bound,
                   "lag_high_offsets": cfg.lag_high_offsets, "lag_high_seconds": cfg.lag_high_seconds,
                   "lag_high_for_ms": cfg.lag_high_for_ms, "tripped": tripped,
                   "tripped_since": state["high_since"], "committed": committed, "hw": hw}
        if held:
            out += rules._open(state, Alert.CONSUMER_LAG_HIGH, entity, labels, now, high_ev)
        else:
            out += rules._resolve(state, Alert.CONSUMER_LAG_HIGH, entity, labels, now, high_ev)

    was = state["open"].get(_STATUS_ALERT)
    changed = was is not None and was["evidence"]["status"] != name
    if changed or (status is not LagStatus.OK and was is None):
        status_ev = {"status": name, "rule": verdict.rule, "points": _with_lag(verdict.view),
                     "set_aside": _with_lag(verdict.set_aside), "lag": lag, "lag_seconds": est.seconds,
                     "lag_seconds_basis": est.basis, **verdict.detail}
        if changed:
            out += _resolve_status(state, entity, labels, now, status_ev)
        if status is not LagStatus.OK:
            out += _with_severity(rules._open(state, Alert.CONSUMER_LAG_STATUS, entity, labels, now, status_ev),
                                  STATUS_SEVERITY[status])
    return out
