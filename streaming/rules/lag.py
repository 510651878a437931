"""Consumer lag of one group-partition: lag in seconds, a Burrow-style status, ConsumerLagHigh.

Pure functions of (previous entity state, one ``group_offsets`` observation, ``now``): no clock
is read, nothing is written but the state dict, so replaying the same observations gives the
same state and transitions.  How the status and the lag in seconds are decided, and why:
``docs/lag-rules.md``; the rules are proved by ``tests/unit/test_rules_lag.py`` (tables) and
``tests/unit/test_lag_simulation.py`` (simulated healthy and dead consumers).

This module folds each observation into the state and opens and resolves the alerts.  The
settings are in ``lag_config``, the lag in seconds in ``lag_estimate`` and the status rules in
``lag_status`` (all in ``streaming.rules``).

State per group-partition (plain JSON values, every list bounded): ``history`` (the last
``window`` observations ``[t, committed, hw]``), ``marks`` (at most ``hw_marks`` ``[t, hw]``
points, thinned geometrically with age), ``anchor`` (``[committed, written_at]``), ``stuck``
(``[t, committed, hw]``), ``waits`` (at most :data:`CADENCE_SAMPLES` ms), ``trend`` (at most
:data:`TREND_POINTS` ``[t, lag_ms]``), ``drift`` (at most :data:`DRIFT_POINTS` ``[t, lag_ms]``, at
least :data:`DRIFT_STEP_MS` apart), ``drift_clear`` (the time of the drift's latest sample when
rule 5 found no drift in it: not tested again until the next), ``step`` (offsets the last
commit moved forward), ``high_since`` and ``first_seen`` (ms), ``lag_seconds``,
``lag_seconds_basis``, ``status``, ``lag_from`` (when its lag last rose from 0), ``rewound`` (``[first seen at, from, to]`` of the last
rewind, while ``rewind_hold_ms`` holds it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from streaming.rules import base as rules
from streaming.rules.base import Alert, Severity, Transition
from streaming.rules.lag_config import (DEFAULT_CONFIG, DRIFT_POINTS, DRIFT_STEP_MS, TREND_POINTS, TREND_STEP_MS,
                                       LagConfig)
from streaming.rules.lag_estimate import LagSeconds, Point, add_mark, written_at
from streaming.rules.lag_status import RULE_DRIFT, RULE_REWIND, LagStatus, _lag, drifting, evaluate

#: rules 3-4: the commit cadence is the longest of the last this-many waits
CADENCE_SAMPLES = 8

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


def _with_lag(points: Sequence[Point]) -> list[list[int]]:
    return [[p[0], p[1], p[2], _lag(p)] for p in points]


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


def _lag_high(lag: Optional[int], seconds: Optional[float], cfg: LagConfig) -> list[str]:
    tripped = []
    if lag is not None and cfg.lag_high_offsets is not None and lag > cfg.lag_high_offsets:
        tripped.append("offsets")
    if seconds is not None and cfg.lag_high_seconds is not None and seconds > cfg.lag_high_seconds:
        tripped.append("seconds")
    return tripped


def between_commits_ms(stuck: Optional[Sequence[int]], waits: Sequence[int], history: Sequence[Point],
                       now: int) -> int:
    """How much of the lag in seconds is the consumer's own wait between two commits, which
    ConsumerLagHigh's seconds half does not count: the time it has sat on its committed
    offset (since the stuck run's first observation), at most its cadence (the longest recent
    wait) less one observation interval (a wait of k intervals is at least k - 1 intervals on
    one offset).  An auto-committing consumer's cadence is one interval: nothing is
    discounted, its lag in seconds is what it was; a stopped consumer's discount stops growing
    at its cadence, so it trips the threshold that much later, never later than that."""
    if stuck is None or not waits or len(history) < 2:
        return 0
    interval = history[-1][0] - history[-2][0]
    return int(max(0, min(now - stuck[0], max(waits) - interval)))


#: observations in a row with the commit at the LSO and the HW past it before the group is taken
#: to be read_committed and its lag blamed on the transaction
AT_LSO_OBSERVATIONS = 2


def transaction_cause(state: dict, obs: dict) -> dict:
    """The evidence that blames an open transaction, not the consumer, for a lag alert: the
    commit has sat at the last stable offset with records past it for AT_LSO_OBSERVATIONS
    observations (the group is inferred to be read_committed: the broker never learns a
    consumer's isolation level), with the transaction the probe found holding that offset when
    it knows it.  {} otherwise."""
    if (state.get("at_lso") or 0) < AT_LSO_OBSERVATIONS:
        return {}
    tid, pid = obs.get("held_by_transaction"), obs.get("held_by_producer")
    return {"cause": "open_transaction", "read_committed": "inferred", "last_stable_offset": state["committed"],
            "transaction": None if pid is None else {"transactional_id": tid, "producer_id": int(pid)}}


def _with_severity(ts: list[Transition], severity: Optional[Severity]) -> list[Transition]:
    return [dataclasses.replace(t, severity_override=severity) for t in ts]


def _resolve_status(state: dict, entity: str, labels: dict, now: int, evidence: dict) -> list[Transition]:
    was = state["open"].get(Alert.CONSUMER_LAG_STATUS.value)
    if was is None:
        return []
    severity = STATUS_SEVERITY[LagStatus[was["evidence"]["status"]]]
    return _with_severity(rules._resolve(state, Alert.CONSUMER_LAG_STATUS, entity, labels, now, evidence), severity)


def _step_cadence(state: dict, hw: int, now: int, cfg: LagConfig) -> list[int]:
    """While no wait is known: the time the producers took to write the records of the
    consumer's last commit step (its last committed offset less the one before), as a
    provisional cadence, ``[ms]`` (``[]``: no step seen yet).  A consumer that commits every
    5 s, every N records or every few minutes moves its commit by about what was written in
    one of its waits; so this is its cadence at today's rate, from its first commit on."""
    step = state["step"]
    if not step or step >= hw:
        return []
    at, _ = written_at(state["marks"], hw - step, cfg)
    return [int(max(0, now - at))]


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
    # a commit that sits at the LSO while records lie past it: read_committed, held by a transaction
    at_lso = committed is not None and committed == lso and hw is not None and lso < hw
    state["at_lso"] = (state.get("at_lso") or 0) + 1 if at_lso else None
    # when this partition's lag began (its own first event with lag since it was last 0): a time
    # of its own ordered events, so GroupEmptyWithLag's timer does not depend on micro-batches
    if state["lag"] is not None:
        state["lag_from"] = (state.get("lag_from") or int(now)) if state["lag"] > 0 else None
    for key, empty in (("status", None), ("stuck", None), ("marks", []), ("anchor", None), ("waits", []),
                       ("trend", []), ("drift", []), ("drift_clear", None), ("step", None),
                       ("high_since", None), ("rewound", None)):
        state.setdefault(key, empty)
    if hw is None:
        state.update(lag_seconds=None, lag_seconds_basis=None)
        return []
    add_mark(state["marks"], int(now), hw, cfg.hw_marks)
    if committed is None:
        state.update(lag_seconds=None, lag_seconds_basis=None, status=None, stuck=None, anchor=None, trend=[],
                     drift=[], high_since=None)
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
    # unless no wait is known yet: STOP is then stop_after_ms, and a consumer whose every wait
    # is longer (every 1 000 records at 3 records/s) would never have its cadence learned
    if (old_stuck is not None and committed > old_stuck[1] and old_stuck[0] > first_seen
            and (state["status"] != _STOP or not state["waits"])):
        state["waits"] = (state["waits"] + [int(now - old_stuck[0])])[-CADENCE_SAMPLES:]
    est = _lag_now(state, committed, hw, now, cfg,
                   old_stuck[0] if old_stuck is not None and old_stuck[1] == committed else None)
    trend, drift = state["trend"], state["drift"]
    if committed >= hw:
        state["trend"] = [[int(now), 0]]
        state["drift"] = [[int(now), 0]]
    elif prev_committed is not None and committed < prev_committed:
        state["trend"] = state["drift"] = []
    elif prev_committed is not None and committed > prev_committed and est.basis == "interpolated":
        sample = [int(now), int(round(est.seconds * 1000))]
        if not trend or now - trend[-1][0] >= TREND_STEP_MS:
            state["trend"] = (trend + [sample])[-TREND_POINTS:]
        if not drift or now - drift[-1][0] >= DRIFT_STEP_MS:
            state["drift"] = (drift + [sample])[-DRIFT_POINTS:]
    if prev_committed is not None and committed > prev_committed:
        state["step"] = committed - prev_committed
    waits = state["waits"] or _step_cadence(state, hw, now, cfg)
    previous = state["status"]
    rewound = state["rewound"]
    warned = previous == _WARN
    was = state["open"].get(_STATUS_ALERT)  # each WARN rule holds its own WARN
    drift_warned = warned and was is not None and was["evidence"].get("rule") == RULE_DRIFT
    drift = state["drift"]
    if drift and not drift_warned:  # rule 5's drift test, once per sample (the series changes every 3 min)
        if state["drift_clear"] != drift[-1][0] and drifting(drift) is None:
            state["drift_clear"] = drift[-1][0]
        if state["drift_clear"] == drift[-1][0]:
            drift = []
    verdict = evaluate(history, cfg, now, old_stuck, waits, state["trend"], drift=drift,
                       stalled=previous in (_STALL, _STOP), warned=warned, rewound=rewound,
                       drift_warned=drift_warned)
    if verdict.rule == RULE_REWIND:  # held from when this rewind was first seen
        d = verdict.detail
        if rewound is None or rewound[2] != d["to_offset"] or now - rewound[0] >= cfg.rewind_hold_ms:
            state["rewound"] = [int(now), int(d["from_offset"]), int(d["to_offset"])]
    elif rewound is not None and now - rewound[0] >= cfg.rewind_hold_ms:
        state["rewound"] = None
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
    discount = between_commits_ms(verdict.stuck, waits, history, now)
    tripped = _lag_high(lag, max(0.0, est.seconds - discount / 1000.0), cfg)
    if not tripped:
        state["high_since"] = None
    elif state["high_since"] is None:
        state["high_since"] = int(now)
    is_open = _HIGH_ALERT in state["open"]
    held = bool(tripped) and now - state["high_since"] >= cfg.lag_high_for_ms
    if (held and not is_open) or (not tripped and is_open):
        high_ev = {"lag": lag, "lag_seconds": est.seconds, "lag_seconds_basis": est.basis,
                   "lag_seconds_is_lower_bound": est.lower_bound,
                   "lag_seconds_between_commits": round(discount / 1000.0, 3),
                   "lag_high_offsets": cfg.lag_high_offsets, "lag_high_seconds": cfg.lag_high_seconds,
                   "lag_high_for_ms": cfg.lag_high_for_ms, "tripped": tripped,
                   "tripped_since": state["high_since"], "committed": committed, "hw": hw}
        if held:
            out += rules._open(state, Alert.CONSUMER_LAG_HIGH, entity, labels, now,
                               {**high_ev, **transaction_cause(state, obs)})
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
            status_ev.update(transaction_cause(state, obs))
            out += _with_severity(rules._open(state, Alert.CONSUMER_LAG_STATUS, entity, labels, now, status_ev),
                                  STATUS_SEVERITY[status])
    return out
