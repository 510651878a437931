"""Source rules (entity cluster/source, a probe or instrumented client seen through its
``heartbeat`` events): SourceSilent, restarts and dropped events.  Settings in
``SourceRulesConfig`` (``[job.rules.source]``); how each alert decides: docs/rules.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from streaming.rules.base import Alert, Transition, _open, _resolve
from streaming.rules.group import _age, _int, _positive, check_factor, check_grace, check_settings

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceRulesConfig:
    """Thresholds of the source rules (validated on construction)."""

    #: SourceSilent after this many announced heartbeat intervals without one (catalogue: 3)
    silent_factor: float = 3.0
    #: heartbeat interval assumed when a heartbeat announces none (the probe's default, 10 s)
    heartbeat_interval_default_ms: int = 10_000
    #: added to SourceSilent's limit: how long the events topic may hold a source's events back
    #: without the source being at fault.  A follower of its partitions that stops fetching
    #: (paused, in a long GC) holds every acks=all write, and what consumers may read, until the
    #: leader drops it from the ISR: the events cluster's replica.lag.time.max.ms (Kafka's
    #: default, 30 s) and a fetch later
    silence_grace_ms: int = 30_000
    #: an HA group's shard (docs/ha.md): events with an epoch older than the newest seen are
    #: dropped (fenced) until the newest has sent nothing for this long; then a lower epoch is
    #: taken again (the shard topic made again: its epochs start over)
    fence_hold_ms: int = 600_000
    #: an HA group's shard: ShardUnobserved when its last observation is older than its owner's
    #: interval plus this (a dead member's shards move within the session timeout, 10 s, and are
    #: observed at the new owner's next cycle)
    shard_unobserved_after_ms: int = 60_000

    def __post_init__(self) -> None:
        check_settings(self, ("heartbeat_interval_default_ms", "fence_hold_ms", "shard_unobserved_after_ms"))
        check_grace(self)
        check_factor(self, "silent_factor")


DEFAULT_CONFIG = SourceRulesConfig()

# ---------------------------------------------------------------------------------------------
# Source entity (a probe or instrumented client, seen through its heartbeats)
# ---------------------------------------------------------------------------------------------


def source_labels(state: dict) -> dict[str, Any]:
    return {"cluster": state["cluster"], "source": state["source"]}


def new_source(cluster: str, source: str) -> dict:
    return {
        "cluster": cluster, "source": source, "last_seen": None, "open": {},
        "last_heartbeat_at": None,
        "interval_ms": None,          # as announced in the last heartbeat
        "events_sent": None, "events_dropped": None,  # the source's counters (since it started)
        "started_at": None, "seq": None,
        "restarts": 0, "last_restart_at": None,
        "dropped_since_last": None,   # drops between the two last heartbeats (None: first one)
        "dropped_total": 0,           # every drop reported, across restarts
        "late_heartbeats": 0,
        "cycle_duration_ms": None, "observation_lag_ms": None,  # the last heartbeat's cycle figures
        "ha_group": None,             # an HA group's member: its silence is the group's (rules.ha)
    }


def _interval(state: dict, cfg: SourceRulesConfig) -> int:
    return state["interval_ms"] if state["interval_ms"] is not None else cfg.heartbeat_interval_default_ms


def on_heartbeat(state: dict, obs: dict, now: int, entity: str,
                 cfg: SourceRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one heartbeat: resolves SourceSilent, records restarts and drops."""
    now = int(now)
    previous_at = state["last_heartbeat_at"]
    if previous_at is not None and now < previous_at:
        state["late_heartbeats"] += 1  # older than what we know: nothing new
        return []
    if state["last_seen"] is None or now > state["last_seen"]:
        state["last_seen"] = now
    sent, dropped = _int(obs.get("events_sent")), _int(obs.get("events_dropped"))
    started_at, seq = _int(obs.get("started_at")), _int(obs.get("seq"))
    restarted = False
    if previous_at is not None:
        def went_back(new: Optional[int], old: Optional[int]) -> bool:
            return new is not None and old is not None and new < old

        restarted = ((started_at is not None and state["started_at"] is not None and started_at != state["started_at"])
                     or went_back(sent, state["events_sent"]) or went_back(dropped, state["events_dropped"])
                     or went_back(seq, state["seq"]))
    if restarted:
        state["restarts"] += 1
        state["last_restart_at"] = now
    if dropped is None:
        since_last = None
    elif previous_at is None:
        since_last = None
        state["dropped_total"] += max(0, dropped)
    elif restarted or state["events_dropped"] is None:
        since_last = max(0, dropped)
    else:
        since_last = max(0, dropped - state["events_dropped"])
    if since_last is not None:
        state["dropped_total"] += since_last
    state["dropped_since_last"] = since_last

    interval = _positive(obs.get("interval_ms"))
    state.update(cycle_duration_ms=_int(obs.get("cycle_duration_ms")),
                 observation_lag_ms=_int(obs.get("observation_lag_ms")))
    state.update(last_heartbeat_at=now, events_sent=sent, events_dropped=dropped,
                 started_at=started_at if started_at is not None else (None if restarted else state["started_at"]),
                 seq=seq)
    if interval is not None:
        state["interval_ms"] = interval
    state["ha_group"] = obs.get("ha_group") or None
    return _resolve(state, Alert.SOURCE_SILENT, entity, source_labels(state), now, {
        "last_heartbeat_at": now, "previous_heartbeat_at": previous_at,
        "silent_for_ms": None if previous_at is None else _age(now, previous_at), "restarted": restarted})


def tick_source(state: dict, now: int, entity: str, cfg: SourceRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Time-driven source check: SourceSilent opens after ``silent_factor`` x the announced
    interval and ``silence_grace_ms`` without a heartbeat."""
    at = state["last_heartbeat_at"]
    if at is None or Alert.SOURCE_SILENT.value in state["open"] or state.get("ha_group"):
        return []  # an HA group's member: the group's silence is judged (rules.ha)
    now = int(now)
    interval = _interval(state, cfg)
    limit = _silent_limit(interval, cfg)
    silent = _age(now, at)
    if silent <= limit:
        return []
    return _open(state, Alert.SOURCE_SILENT, entity, source_labels(state), now, {
        "last_heartbeat_at": at, "silent_for_ms": silent, "interval_ms": interval, "limit_ms": limit,
        "grace_ms": cfg.silence_grace_ms,
        "events_sent": state["events_sent"], "events_dropped": state["events_dropped"]})


def source_due_at(state: dict, cfg: SourceRulesConfig = DEFAULT_CONFIG) -> Optional[int]:
    """Earliest time at which :func:`tick_source` can open SourceSilent (None: not pending)."""
    at = state["last_heartbeat_at"]
    if at is None or Alert.SOURCE_SILENT.value in state["open"] or state.get("ha_group"):
        return None
    return at + _silent_limit(_interval(state, cfg), cfg) + 1


def _silent_limit(interval: int, cfg: SourceRulesConfig) -> int:
    """``silent_factor`` intervals, and the time the events topic may hold heartbeats back
    (``silence_grace_ms``)."""
    return int(cfg.silent_factor * interval) + cfg.silence_grace_ms
