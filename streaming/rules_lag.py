"""Consumer lag of one group-partition: lag in seconds and a Burrow-style status.

Pure functions of (previous entity state, one ``group_offsets`` observation, ``now``): no clock
is read, nothing is written anywhere but the state dict, so replaying the same observations
gives the same state and the same transitions.

The entity state is the dict of :func:`streaming.rules.new_group_partition`, plus these keys
(all plain JSON/pickle values):

``history``
    the last ``cfg.window`` complete observations, oldest first, each ``[t, committed, hw]``
    (epoch ms, offsets; ``t`` is the observation's ``now`` — the probe reads the commit and
    the HW together, so ``hw_observed_at`` is not used).  One point per probe observation,
    whether or not the consumer
    committed in between: the status is evaluated at *observation* time against the current
    HW, so the lag of a consumer that stopped committing keeps growing (Burrow only updates
    lag when a commit arrives, which freezes the lag of a dead consumer).
``stuck``
    ``[t, committed, hw]`` of the first observation of the current "stuck" run — committed
    offset unchanged and lag > 0 at every observation since — or None.  It outlives the window,
    so ``stop_after_ms`` may be longer than the window spans.
``lag_seconds`` / ``lag_seconds_basis``
    see :func:`estimate_lag_seconds`.
``status``
    the :class:`LagStatus` name, or None while there is no committed offset.

Rules of :func:`evaluate_status` (first match wins; the decision names its rule):

1. ``1-caught-up`` — lag 0 at the latest point → OK, however long the committed offset has
   not moved (an idle or slow topic is not a stopped consumer: Burrow issue #38 and kin).
2. ``2-rewind`` — the committed offset went below the previous one and stayed below it for
   ``rewind_confirmations`` consecutive observations → REWIND, until the consumer is back where
   it was or the point before the drop leaves the window.  Lower commits followed by the old
   offset again before they were confirmed (a broker deploy, a coordinator move: Burrow issue
   #150) are *blips*: set aside, never counted, neither as a rewind nor in rules 3-5, and
   dropped from the stored history once recognised (at the window's start they would pass for
   a real older offset).  An unconfirmed drop at the latest point is held: rules 1, 3-6 judge
   the window without it.
3. ``3-stop`` — committed offset unchanged with lag > 0 for longer than ``stop_after_ms`` and
   the HW moved on meanwhile (the lag grew) → STOP: nobody is consuming although records keep
   arriving.
4. ``4-stall`` — at least ``min_points`` points, committed offset unchanged and lag > 0 at
   every point of the window → STALL (stuck with work waiting, not yet long enough — or not
   with a growing lag — to be called stopped).  A stuck consumer on a topic that receives
   nothing stays STALL; its lag in seconds keeps growing and trips ConsumerLagHigh.
5. ``5-lag-rising`` — at least ``min_points`` points, committed offset moving, and the lag
   trends up: least-squares slope of lag over time > 0, last lag > first lag, and the fitted
   rise over the window above twice the residual standard deviation → WARN.  Unlike Burrow's
   "lag grows between every pair of commits" (issues #155, #453), a rising lag with dips is
   WARN; the noise test keeps a flat lag with jitter OK (slope > 0 and last > first alone
   are often both true for pure noise).
6. ``6-ok`` → OK; ``6-ok-few-points`` when fewer than ``min_points`` points were available
   for rules 4 and 5.

Limit: the observation carries the committed offset, not when it was committed, so "the
consumer commits the same offset" (Burrow's STALL) and "the consumer does not commit" (Burrow's
STOP) look the same here.  STALL is the early stage of a stuck consumer, STOP the persistent
one with a growing lag.  Tune ``window`` × probe interval above the consumers' commit interval.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Sequence

from streaming import rules
from streaming.rules import Alert, Severity, Transition

#: hard cap on ``LagConfig.window``: the state of every group-partition holds this many points
WINDOW_CAP = 64
#: rule 5: the fitted rise over the window must exceed this many residual standard deviations
TREND_NOISE_FACTOR = 2.0

RULE_CAUGHT_UP = "1-caught-up"
RULE_REWIND = "2-rewind"
RULE_STOP = "3-stop"
RULE_STALL = "4-stall"
RULE_LAG_RISING = "5-lag-rising"
RULE_OK = "6-ok"
RULE_FEW_POINTS = "6-ok-few-points"


class LagStatus(enum.IntEnum):
    """Status of one group-partition, ordered by severity (the exporter's gauge value)."""

    OK = 0      # caught up, or consuming without a rising lag: nothing to do
    WARN = 1    # committing, but the lag trends up over the window: slower than the producers
    STALL = 2   # committed offset unchanged with records waiting over the whole window: stuck
    STOP = 3    # unchanged, with records waiting, longer than stop_after_ms while the lag grew: gone
    REWIND = 4  # committed offset went back and stayed back: records are being processed again


#: severity of the ConsumerLagStatus alert per status (None: no alert).  STOP and REWIND page:
#: a stopped consumer's lag grows without bound (data goes unprocessed until someone acts, and
#: past retention it is lost), and a confirmed rewind means records are being processed twice
#: (duplicate side effects) or the group fell back to auto.offset.reset.  WARN and STALL are
#: working-hours problems: the consumer still moves (WARN), or has been stuck for less than
#: stop_after_ms / on a topic whose lag is not growing (STALL) — STALL escalates to STOP by itself.
STATUS_SEVERITY: dict[LagStatus, Optional[Severity]] = {
    LagStatus.OK: None,
    LagStatus.WARN: Severity.WARNING,
    LagStatus.STALL: Severity.WARNING,
    LagStatus.STOP: Severity.CRITICAL,
    LagStatus.REWIND: Severity.CRITICAL,
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class LagConfig:
    """Settings of the lag rules (config section ``lag``); validated when built.

    Defaults, for a probe that observes every 10 s:

    - ``window`` 10 points (Burrow's default ``intervals``): 90 s of history at 10 s, enough for
      a trend and for an interpolated lag in seconds up to 1.5 min; beyond it the lag in
      seconds is extrapolated.  At most 64 (``WINDOW_CAP``): state per partition is bounded.
    - ``lag_high_offsets`` 10 000 and ``lag_high_seconds`` 300 (5 min, Kafka's default
      ``max.poll.interval.ms``); None disables that half of ConsumerLagHigh.
    - ``stop_after_ms`` 300 000: longer than the window (10 × 10 s), so STALL comes first and
      STOP needs persistent evidence; and Kafka's default ``max.poll.interval.ms``: a live
      consumer may legally go 5 min between polls (and so between commits) while processing a
      batch, one that has not moved for longer with new records arriving has been evicted from
      its group or is wedged.  Burrow's "no commit for longer than the window span" would call
      such a consumer stopped after 90 s.
    - ``rewind_confirmations`` 2: one lower commit is a blip (a broker restart or coordinator
      move that briefly serves an older commit); the same lower offset one probe interval
      later is a reset.
    - ``max_extrapolation_ms`` 3 600 000: how far before the oldest point the lag in seconds
      may be extrapolated with the window's HW rate.  The rate of 90 s says little about the
      last hour; past the cap the value is reported as a lower bound.  12 × the seconds
      threshold, so the cap never hides a ConsumerLagHigh.
    - ``min_points`` 3: a least-squares trend needs a residual (n - 2 ≥ 1) to tell a rise
      from noise; with two points every change would be "significant".
    """

    window: int = 10
    lag_high_offsets: Optional[int] = 10_000
    lag_high_seconds: Optional[float] = 300.0
    stop_after_ms: int = 300_000
    rewind_confirmations: int = 2
    max_extrapolation_ms: int = 3_600_000
    min_points: int = 3

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "LagConfig":
        """Raise ValueError naming the setting (``lag.<name>: ...``)."""
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"lag.{name}: {rule}, got {getattr(self, name)!r}")

        if not _is_int(self.window) or not 3 <= self.window <= WINDOW_CAP:
            raise bad("window", f"must be an integer within 3..{WINDOW_CAP}")
        if self.lag_high_offsets is not None and (not _is_int(self.lag_high_offsets) or self.lag_high_offsets < 0):
            raise bad("lag_high_offsets", "must be an integer >= 0, or None to disable")
        if self.lag_high_seconds is not None and (
                isinstance(self.lag_high_seconds, bool) or not isinstance(self.lag_high_seconds, (int, float))
                or not math.isfinite(self.lag_high_seconds) or self.lag_high_seconds < 0):
            raise bad("lag_high_seconds", "must be a finite number >= 0, or None to disable")
        if not _is_int(self.stop_after_ms) or self.stop_after_ms <= 0:
            raise bad("stop_after_ms", "must be an integer > 0")
        if not _is_int(self.rewind_confirmations) or not 1 <= self.rewind_confirmations < self.window:
            raise bad("rewind_confirmations", f"must be an integer within 1..window-1 ({self.window - 1})")
        if not _is_int(self.max_extrapolation_ms) or self.max_extrapolation_ms < 0:
            raise bad("max_extrapolation_ms", "must be an integer >= 0")
        if not _is_int(self.min_points) or not 3 <= self.min_points <= self.window:
            raise bad("min_points", f"must be an integer within 3..window ({self.window})")
        return self


DEFAULT_CONFIG = LagConfig()

Point = Sequence[int]  # [t, committed, hw]


def _lag(p: Point) -> int:
    return max(0, p[2] - p[1])


def _with_lag(points: Sequence[Point]) -> list[list[int]]:
    return [[p[0], p[1], p[2], _lag(p)] for p in points]


# --- lag in seconds -----------------------------------------------------------------------

class LagSeconds(NamedTuple):
    """``seconds`` ≥ 0 and finite; ``basis`` says how it was obtained:

    - ``caught-up``: committed ≥ the latest HW, 0;
    - ``interpolated``: the HW crossed the committed offset between two points of the window;
    - ``extrapolated``: it crossed before the oldest point; estimated with the window's HW rate;
    - ``lower-bound``: it crossed before the oldest point and the estimate hit
      ``max_extrapolation_ms``, or the HW did not move over the window (no rate): the true lag
      is at least ``seconds``.
    """

    seconds: float
    basis: str

    @property
    def lower_bound(self) -> bool:
        return self.basis == "lower-bound"


def estimate_lag_seconds(history: Sequence[Point], committed: Optional[int], now: int,
                         cfg: LagConfig = DEFAULT_CONFIG, behind_since: Optional[int] = None) -> Optional[LagSeconds]:
    """How long ago the partition's HW was at ``committed``: ``now`` minus the time the HW
    history first reached it (kafka-lag-exporter's interpolation), without its faults.

    - None when ``committed`` is None (nothing committed: no lag, not an infinite one) or
      there is no history.
    - 0 when ``committed`` ≥ the latest HW — caught up, including an idle topic whose HW has
      been flat for hours (kafka-lag-exporter issue #111 reported NaN there).
    - Flat segments: the *earliest* point at which the HW reached the value counts, never a
      later one with the same HW (issue #121: bumping the time of an unchanged HW made the lag
      of a draining consumer grow).  The interpolation divides by an HW difference that is
      > 0 by construction, so there is no Inf/NaN.
    - Committed older than the oldest point: extrapolated back with the window's HW rate, at
      most ``max_extrapolation_ms`` before the oldest point (then ``lower-bound``); without a
      rate, ``now`` minus the oldest point, a lower bound.
    - ``behind_since``: a time the HW is known to have been above ``committed`` already (the
      start of the stuck run, kept beyond the window); the result is never less than
      ``now - behind_since``.
    - Never negative (``now`` may precede a point only through misuse; it is clamped).
    """
    if committed is None or not history:
        return None
    if committed >= history[-1][2]:
        return LagSeconds(0.0, "caught-up")
    i = next(k for k, p in enumerate(history) if p[2] >= committed)  # exists: the latest HW is above
    if i > 0:
        (t0, _, h0), (t1, _, h1) = history[i - 1][:3], history[i][:3]
        at = t0 + (t1 - t0) * (committed - h0) / (h1 - h0)  # h0 < committed <= h1
        basis = "interpolated"
    else:
        t_first, hw_first = history[0][0], history[0][2]
        t_last, hw_last = history[-1][0], history[-1][2]
        if hw_first > committed and hw_last > hw_first and t_last > t_first:
            back = (hw_first - committed) * (t_last - t_first) / (hw_last - hw_first)
            if back > cfg.max_extrapolation_ms:
                back, basis = float(cfg.max_extrapolation_ms), "lower-bound"
            else:
                basis = "extrapolated"
            at = t_first - back
        else:  # no rate to extrapolate with, or the HW was exactly there already at the oldest point
            at, basis = float(t_first), "lower-bound"
    if behind_since is not None and behind_since < at:
        at, basis = float(behind_since), "lower-bound"
    seconds = max(0.0, (now - at) / 1000.0)
    return LagSeconds(round(seconds, 3), basis)


def lag_seconds(history: Sequence[Point], committed: Optional[int], now: int,
                cfg: LagConfig = DEFAULT_CONFIG, behind_since: Optional[int] = None) -> Optional[float]:
    """The number of :func:`estimate_lag_seconds` (use that one to know whether it is a lower bound)."""
    est = estimate_lag_seconds(history, committed, now, cfg, behind_since)
    return None if est is None else est.seconds


# --- status --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    status: LagStatus
    rule: str
    #: the points rules 1 and 3-6 looked at (the history without set-aside lower commits)
    view: list
    #: lower commits set aside: blips that came back, then a drop not yet confirmed
    set_aside: list
    #: the blips among them (on_group_offsets drops these from the stored history)
    blips: list
    #: new value of state["stuck"]
    stuck: Optional[list]
    detail: dict


def _scan(history: Sequence[Point], confirmations: int) -> tuple[list, list, list, Optional[dict]]:
    """Split the history into the points the rules use, the blips (lower commits that came
    back before being confirmed) and a pending drop, and find a confirmed rewind that has not
    recovered yet."""
    view: list = []
    pending: list = []      # consecutive points below the last accepted committed offset
    aside: list = []
    rewind: Optional[dict] = None
    for p in history:
        if view and p[1] < view[-1][1]:
            pending.append(p)
            if len(pending) >= confirmations:
                frm = max(view[-1][1], rewind["from_offset"]) if rewind else view[-1][1]
                rewind = {"from_offset": frm, "to_offset": pending[0][1], "at": pending[0][0],
                          "confirmations": len(pending)}
                view.extend(pending)
                pending = []
            continue
        aside.extend(pending)  # back at (or above) the offset before the drop: it was a blip
        pending = []
        view.append(p)
        if rewind and p[1] >= rewind["from_offset"]:
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


def _trend(view: list) -> dict:
    """Least-squares line of lag (offsets) over time (seconds) on the view."""
    n = len(view)
    xs = [(p[0] - view[0][0]) / 1000.0 for p in view]
    ys = [float(_lag(p)) for p in view]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return {"slope_per_s": 0.0, "rise": 0.0, "noise": 0.0, "first_lag": ys[0], "last_lag": ys[-1]}
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    sse = max(0.0, sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(xs, ys)))
    noise = math.sqrt(sse / (n - 2)) if n > 2 else 0.0
    return {"slope_per_s": round(slope, 6), "rise": round(slope * (xs[-1] - xs[0]), 3),
            "noise": round(noise, 3), "first_lag": int(ys[0]), "last_lag": int(ys[-1])}


def evaluate(history: Sequence[Point], cfg: LagConfig, now: int, stuck: Optional[Sequence[int]] = None) -> Verdict:
    """:func:`evaluate_status` with everything it found (for evidence and the state)."""
    if not history:
        return Verdict(LagStatus.OK, RULE_FEW_POINTS, [], [], [], None, {})
    view, blips, pending, rewind = _scan(history, cfg.rewind_confirmations)
    new_stuck = _stuck(view, stuck)

    def v(status: LagStatus, rule: str, **detail: Any) -> Verdict:
        return Verdict(status, rule, view, blips + pending, blips, new_stuck, detail)

    # 1. caught up at the latest point (or at the latest point before an unconfirmed lower commit)
    if _lag(history[-1]) == 0 or _lag(view[-1]) == 0:
        return v(LagStatus.OK, RULE_CAUGHT_UP)
    # 2. a lower committed offset that persisted
    if rewind is not None:
        return v(LagStatus.REWIND, RULE_REWIND, **rewind)
    # 3. stuck with work waiting for longer than stop_after_ms while the lag grew
    if new_stuck is not None:
        stuck_for = now - new_stuck[0]
        if stuck_for > cfg.stop_after_ms and view[-1][2] > new_stuck[2]:
            return v(LagStatus.STOP, RULE_STOP, stuck_since=new_stuck[0], stuck_for_ms=stuck_for,
                     stop_after_ms=cfg.stop_after_ms, hw_at_stuck_since=new_stuck[2], hw=view[-1][2])
    if len(view) < cfg.min_points:
        return v(LagStatus.OK, RULE_FEW_POINTS, n_points=len(view), min_points=cfg.min_points)
    # 4. unchanged with lag > 0 over the whole window
    if new_stuck is not None and new_stuck[0] <= view[0][0]:
        return v(LagStatus.STALL, RULE_STALL, stuck_since=new_stuck[0], stuck_for_ms=now - new_stuck[0],
                 stop_after_ms=cfg.stop_after_ms)
    # 5. moving, but the lag trends up beyond the noise
    if any(p[1] != view[0][1] for p in view):
        tr = _trend(view)
        if tr["slope_per_s"] > 0 and tr["last_lag"] > tr["first_lag"] and tr["rise"] > TREND_NOISE_FACTOR * tr["noise"]:
            return v(LagStatus.WARN, RULE_LAG_RISING, **tr)
    return v(LagStatus.OK, RULE_OK)


def evaluate_status(history: Sequence[Point], cfg: LagConfig = DEFAULT_CONFIG, now: Optional[int] = None,
                    stuck: Optional[Sequence[int]] = None) -> tuple[LagStatus, str]:
    """(status, rule) for the window ``history`` (``[t, committed, hw]`` points, oldest first,
    strictly increasing t) at time ``now`` (default: the latest point's time).  ``stuck`` is the
    state's value from the previous observation; without it, STOP can only be seen within the
    window.  Rules: see the module docstring."""
    if now is None:
        now = history[-1][0] if history else 0
    verdict = evaluate(history, cfg, now, stuck)
    return verdict.status, verdict.rule


# --- the entity ----------------------------------------------------------------------------

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


def on_group_offsets(state: dict, obs: dict, now: int, entity: str,
                     cfg: LagConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one ``group_offsets`` observation into ``state`` (mutated); return transitions.

    - An observation at or before ``state["last_seen"]`` (a replay, or out of order) changes
      nothing and returns no transition.
    - HW unknown: committed is recorded, lag and lag in seconds become None, the history, the
      status and open alerts stay as they are (not knowing is not recovering).
    - No committed offset: lag, lag in seconds and status become None, the stuck run is
      forgotten, open ConsumerLagHigh / ConsumerLagStatus resolve (there is no position to be
      late with; an empty group with lag is GroupEmptyWithLag's business).  The history keeps
      its earlier points, so a commit that comes back lower is seen as a rewind.
    - Otherwise the point ``[now, committed, hw]`` joins the history (at most ``cfg.window``),
      lag = max(0, hw - committed), lag in seconds and status are recomputed, and:
      ConsumerLagHigh is open while lag > ``lag_high_offsets`` or lag in seconds >
      ``lag_high_seconds`` (evidence says which tripped); ConsumerLagStatus is open while the
      status is not OK, with the severity of :data:`STATUS_SEVERITY`; when the status changes
      from one non-OK status to another, the old alert resolves and a new one opens (new id),
      so the severity follows the status.
    """
    last_seen = state.get("last_seen")
    if last_seen is not None and now <= last_seen:
        return []
    committed = _offset(obs.get("committed_offset"))
    hw = _offset(obs.get("high_watermark"))
    labels = group_partition_labels(state)
    history = state.setdefault("history", [])
    state.update(committed=committed, hw=hw, lag=rules.lag(committed, hw), last_seen=now)
    state.setdefault("status", None)
    state.setdefault("stuck", None)
    if hw is None:
        state.update(lag_seconds=None, lag_seconds_basis=None)
        return []
    if committed is None:
        state.update(lag_seconds=None, lag_seconds_basis=None, status=None, stuck=None)
        why = {"reason": "no committed offset", "committed": None, "hw": hw}
        return (rules._resolve(state, Alert.CONSUMER_LAG_HIGH, entity, labels, now, dict(why))
                + _resolve_status(state, entity, labels, now, dict(why)))

    history.append([int(now), committed, hw])
    del history[:-cfg.window]
    verdict = evaluate(history, cfg, now, state["stuck"])
    if verdict.blips:  # recognised blips are forgotten: once the point before them leaves the
        gone = {p[0] for p in verdict.blips}  # window, they would look like a real older offset
        history[:] = [p for p in history if p[0] not in gone]
    stuck = verdict.stuck
    est = estimate_lag_seconds(history, committed, now, cfg,
                               behind_since=stuck[0] if stuck is not None and stuck[1] == committed else None)
    state.update(stuck=stuck, lag_seconds=est.seconds, lag_seconds_basis=est.basis, status=verdict.status.name)
    lag = state["lag"]
    out: list[Transition] = []

    # the evidence is built only for a transition (an alert opens or resolves): most
    # observations change nothing, and the status evidence copies the whole window
    tripped = _lag_high(lag, est, cfg)
    if bool(tripped) != (Alert.CONSUMER_LAG_HIGH.value in state["open"]):
        high_ev = {"lag": lag, "lag_seconds": est.seconds, "lag_seconds_basis": est.basis,
                   "lag_seconds_is_lower_bound": est.lower_bound,
                   "lag_high_offsets": cfg.lag_high_offsets, "lag_high_seconds": cfg.lag_high_seconds,
                   "tripped": tripped, "committed": committed, "hw": hw}
        if tripped:
            out += rules._open(state, Alert.CONSUMER_LAG_HIGH, entity, labels, now, high_ev)
        else:
            out += rules._resolve(state, Alert.CONSUMER_LAG_HIGH, entity, labels, now, high_ev)

    status = verdict.status
    was = state["open"].get(Alert.CONSUMER_LAG_STATUS.value)
    changed = was is not None and was["evidence"]["status"] != status.name
    if changed or (status is not LagStatus.OK and was is None):
        status_ev = {"status": status.name, "rule": verdict.rule, "points": _with_lag(verdict.view),
                     "set_aside": _with_lag(verdict.set_aside), "lag": lag, "lag_seconds": est.seconds,
                     "lag_seconds_basis": est.basis, **verdict.detail}
        if changed:
            out += _resolve_status(state, entity, labels, now, status_ev)
        if status is not LagStatus.OK:
            out += _with_severity(rules._open(state, Alert.CONSUMER_LAG_STATUS, entity, labels, now, status_ev),
                                  STATUS_SEVERITY[status])
    return out
