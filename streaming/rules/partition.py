"""Partition rules (entity cluster/topic/partition, from ``partition_metadata`` and
``partition_offsets`` events): IsrShrink, UnderReplicated, OfflinePartition, UnderMinIsr /
AtMinIsr, LeaderChanged, PreferredLeaderImbalance, HighWatermarkStalled, PartitionUnobserved.

Entry points: ``on_partition_metadata`` and ``on_partition_offsets`` per observation,
``tick_partition`` once per micro-batch (and on a state timeout) before eviction.  Pure
functions of (entity state, one observation, now): the conventions of
:mod:`streaming.rules.base`.  How each alert decides, and the state keys: docs/rules.md.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, TypedDict

from streaming.rules.base import Alert, Transition, _open, _resolve


from streaming.rules.partition_config import DEFAULT_CONFIG, PartitionRulesConfig
from streaming.rules.writes import (CHANGED_AT, CONFIRMED, GIVEN, INTS, LATEST, TIME, TIME_KINDS, VALUE, Write, write,
                                    write_ints)

_UNDER, _AT = Alert.UNDER_MIN_ISR, Alert.AT_MIN_ISR
_LC, _PLI = Alert.LEADER_CHANGED, Alert.PREFERRED_LEADER_IMBALANCE
_HWS, _PU = Alert.HIGH_WATERMARK_STALLED, Alert.PARTITION_UNOBSERVED

class PartitionState(TypedDict, total=False):
    """A partition entity's state: what ``new_partition`` creates, the keys ``_ensure`` adds
    lazily (a state stored before they existed works unchanged), the schedule and the state
    layer's own (``kind``, ``applied``, ``sent``).  Stored as a plain dict; the type lets the
    checker see every field the rules and the partition table use."""

    cluster: str
    topic: str
    partition: int
    kind: str
    leader: Optional[int]
    leader_epoch: Optional[int]
    replicas: Optional[list[int]]
    isr: Optional[list[int]]
    min_isr: Optional[int]
    hw: Optional[int]
    log_start: Optional[int]
    lso: Optional[int]
    last_seen: Optional[int]
    open: dict[str, Any]
    observed_at: Optional[int]
    interval_ms: Optional[int]
    md_at: Optional[int]
    leader_seen: Optional[int]
    epoch_seen: Optional[int]
    epoch_regressions: int
    leader_episode: Optional[dict[str, Any]]
    imbalanced_since: Optional[int]
    hw_seen: Optional[int]
    hw_changed_at: Optional[int]
    hw_observed_at: Optional[int]
    pending_writes_at: Optional[int]
    pending_since: Optional[int]
    md_confirmed_at: Optional[int]
    elr: dict[str, list[int]]  # eligible leader replicas and last-known ELR, while known and the ISR short
    due: Optional[int]
    due_pw: Optional[int]
    applied: dict[Any, Any]
    sent: Any


_PARTITION_KEYS = {
    "observed_at": None, "interval_ms": None, "md_at": None, "leader_seen": None, "epoch_seen": None,
    "epoch_regressions": 0, "leader_episode": None, "imbalanced_since": None, "hw_seen": None,
    "hw_changed_at": None, "hw_observed_at": None, "pending_writes_at": None, "pending_since": None,
    "md_confirmed_at": None,  # a new key goes last: _ensure looks for the last one first
}
_LAST_KEY = next(reversed(_PARTITION_KEYS))


def _int(v: Any) -> Optional[int]:
    """None stays None; numpy / pandas integers become Python ints (JSON-able)."""
    return None if v is None else int(v)


def _ensure(state: PartitionState) -> None:
    if _LAST_KEY not in state:  # keys are added together and never removed: the last one says all are there
        for k, v in _PARTITION_KEYS.items():
            state.setdefault(k, v)  # type: ignore[misc]  # the keys of _PARTITION_KEYS are PartitionState's
    last_seen = state.get("last_seen")
    if state["observed_at"] is None and last_seen is not None:
        state["observed_at"] = int(last_seen)  # a state from before this module


def _view_at(state: PartitionState) -> Optional[int]:
    """When the partition's leader view was last known current: its last partition_metadata,
    or a later offsets observation whose ``metadata_at`` confirms the source's view was unchanged.
    None before the first partition_metadata."""
    md, confirmed = state["md_at"], state.get("md_confirmed_at")
    if md is None or confirmed is None:
        return md
    return max(md, confirmed)


def _is_open(state: PartitionState, alert: Alert) -> bool:
    return alert.value in state["open"]


# ---------------------------------------------------------------------------------------------
# What an observation writes into a partition's fields, declared once (``Write``s, their kinds
# in streaming/rules/writes.py): the rules below apply them to one partition's dict
# (``write``); the partition table applies the same declarations to many quiet partitions'
# columns (streaming/state/table.py ``apply_writes``) and builds new settled partitions from
# them (streaming/state/columns.py ``fold_new``).  A change to what a field records is a
# change to one line here.
# ---------------------------------------------------------------------------------------------

#: every admitted observation of the partition, either type (``on_partition_observed``)
OBSERVED_WRITES = (Write("observed_at", LATEST),)
#: a partition_metadata observation: the replication view (``_replication``, always) ...
VIEW_WRITES = (Write("replicas", INTS, "replicas"), Write("isr", INTS, "isr"), Write("leader", VALUE, "leader"),
               Write("leader_epoch", VALUE, "leader_epoch"), Write("min_isr", GIVEN, "min_insync_replicas"),
               Write("last_seen", LATEST))
#: ... and the leader view, once believed (``_leadership``: in order, no stale epoch)
LEADER_WRITES = (Write("leader_seen", VALUE, "leader"), Write("epoch_seen", VALUE, "leader_epoch"), Write("md_at", TIME))
#: a partition_offsets observation: its offsets (``_offsets``, always) ...
OFFSETS_WRITES = (Write("hw", VALUE, "high_watermark"), Write("log_start", VALUE, "log_start_offset"),
                  Write("lso", VALUE, "last_stable_offset"), Write("last_seen", LATEST))
#: ... and the high watermark's progress (``_progress``: in order).  CHANGED_AT before the
#: write of the field it compares with.
PROGRESS_WRITES = (Write("hw_changed_at", CHANGED_AT, "high_watermark", of="hw_seen"),
                   Write("hw_seen", VALUE, "high_watermark"), Write("hw_observed_at", TIME),
                   Write("md_confirmed_at", CONFIRMED, "metadata_at"))
#: the writes of each observation type the partition table applies in columns to quiet
#: partitions (a quiet metadata observation repeats the view: only its time kinds change)
QUIET_WRITES = {"partition_offsets": OFFSETS_WRITES + PROGRESS_WRITES + OBSERVED_WRITES,
                "partition_metadata": tuple(w for w in VIEW_WRITES + LEADER_WRITES + OBSERVED_WRITES
                                            if w.how in TIME_KINDS)}
#: the fields the partition table holds as columns: what quiet observations change
QUIET_FIELDS = tuple(dict.fromkeys(w.field for ws in QUIET_WRITES.values() for w in ws))


def settled_view(leader: Any, replicas: Any, isr: Any, min_isr: Any) -> Optional[tuple[list[int], list[int]]]:
    """(replicas, isr) as int lists when a partition's first partition_metadata with these values
    opens nothing and starts no timer — a leader, the preferred one; every replica in the ISR,
    none twice; min.insync.replicas (None: unknown) neither above nor at the ISR — else None.
    What ``fold_new`` may put straight into the partition table."""
    if leader is None or leader < 0 or replicas is None or isr is None or len(replicas) == 0:
        return None
    try:
        rep, inr = write_ints(replicas), write_ints(isr)
    except (TypeError, ValueError):
        return None
    if rep[0] != leader or sorted(rep) != sorted(inr) or len(set(rep)) != len(rep):
        return None
    if min_isr is not None and min_isr_status(len(inr), len(rep), min_isr) is not None:
        return None
    return rep, inr


# ---------------------------------------------------------------------------------------------
# Partition: observation
# ---------------------------------------------------------------------------------------------


def partition_labels(state: PartitionState) -> dict[str, Any]:
    return {"cluster": state["cluster"], "topic": state["topic"], "partition": state["partition"]}


def new_partition(cluster: str, topic: str, partition: int) -> PartitionState:
    return {"cluster": cluster, "topic": topic, "partition": partition, "leader": None,
            "leader_epoch": None, "replicas": None, "isr": None, "min_isr": None, "hw": None,
            "log_start": None, "lso": None, "last_seen": None, "open": {}}


def blame(labels: dict, brokers: list) -> dict:
    """A partition alert's labels, with ``broker`` when exactly one broker explains it (the
    replica that left the ISR or is missing, the leader it lost): Alertmanager inhibits it while
    that broker's own alert (BrokerDown, BrokerUnderReplicating) fires, and groups by it."""
    return {**labels, "broker": int(brokers[0])} if len(brokers) == 1 else labels


#: the cause an ISR shrink carries when the controller has the replicas that left offline
OFFLINE_CAUSE = "replica offline: on an offline log dir (LogDirOffline names it) or on a stopped broker"


def offline_cause(obs: dict, out_of_isr: list) -> dict:
    """``{"offline_replicas", "cause"}`` for those of ``out_of_isr`` the observation says are offline
    (the controller's offline replicas: a stopped broker's, or on a log dir its broker reports
    offline); {} when none is."""
    offline = sorted({int(r) for r in obs.get("offline_replicas") or []} & set(out_of_isr))
    return {"offline_replicas": offline, "cause": OFFLINE_CAUSE} if offline else {}


def _replication(state: PartitionState, obs: dict, now: int, entity: str) -> list[Transition]:
    """Fold one partition_metadata observation into ``state`` (mutated); return transitions.

    - IsrShrink opens when replicas left the ISR since the previous observation while the
      replica set stayed the same (a reassignment that drops a replica is not a shrink); it
      resolves (IsrExpand) once every replica is back in the ISR.
    - UnderReplicated is open while |ISR| < |replicas|.
    - OfflinePartition is open while the partition has no leader (leader = -1).
    """
    labels = partition_labels(state)
    replicas = [int(r) for r in obs["replicas"]]
    isr = [int(r) for r in obs["isr"]]
    prev_replicas, prev_isr = state["replicas"], state["isr"]
    out: list[Transition] = []

    removed = sorted(set(prev_isr) - set(isr)) if prev_isr is not None else []
    missing = sorted(set(replicas) - set(isr))
    if removed and set(prev_replicas or []) == set(replicas):
        out += _open(state, Alert.ISR_SHRINK, entity, blame(labels, removed), now,
                     {"isr_before": prev_isr, "isr_after": isr, "removed": removed, "replicas": replicas,
                      **offline_cause(obs, removed)})
    opened = state["open"]  # evidence for a resolve is only built when something is open
    if opened and set(isr) >= set(replicas):
        out += _resolve(state, Alert.ISR_SHRINK, entity, labels, now,
                        {"isr_before": prev_isr, "isr_after": isr, "replicas": replicas})

    if len(isr) < len(replicas):
        out += _open(state, Alert.UNDER_REPLICATED, entity, blame(labels, missing), now,
                     {"isr": isr, "replicas": replicas, "missing": missing, **offline_cause(obs, missing)})
    elif opened:
        out += _resolve(state, Alert.UNDER_REPLICATED, entity, labels, now, {"isr": isr, "replicas": replicas})

    leader = int(obs["leader"])
    elr = eligible_leaders(obs)
    if leader < 0:
        last = state["leader"]  # the leader it lost (unknown when first seen offline)
        evidence = {"leader": leader, "replicas": replicas, "offline_replicas": list(obs.get("offline_replicas") or [])}
        if elr is not None:
            evidence.update(elr)
        out += _open(state, Alert.OFFLINE_PARTITION, entity,
                     blame(labels, [last] if last is not None and last >= 0 else []), now, evidence)
        if elr is not None and not isr and not elr["eligible_leader_replicas"]:
            out += _open(state, Alert.PARTITION_NO_ELIGIBLE_LEADER, entity, labels, now,
                         {**evidence, "isr": isr})
        elif elr is not None and opened:  # an ELR member to elect again: recoverable without data loss
            out += _resolve(state, Alert.PARTITION_NO_ELIGIBLE_LEADER, entity, labels, now, {**evidence, "isr": isr})
    elif opened:
        out += _resolve(state, Alert.OFFLINE_PARTITION, entity, labels, now, {"leader": leader})
        out += _resolve(state, Alert.PARTITION_NO_ELIGIBLE_LEADER, entity, labels, now, {"leader": leader, "isr": isr})
    if elr is not None:
        state["elr"] = elr  # served (state/rows.py)
    elif leader >= 0 and len(isr) >= len(replicas):
        state.pop("elr", None)  # a full ISR: no replica left to be eligible (an unknown one keeps the last)

    write(state, VIEW_WRITES, obs, now)
    return out


def eligible_leaders(obs: dict) -> Optional[dict[str, list[int]]]:
    """A partition_metadata row's eligible leader replicas and last-known ELR (KIP-966), from its
    report (streaming/ingest/parsing.py: only for a partition without a leader or a full ISR, and
    only when the probe knew them); None: not known (the feature off, not asked yet, a v1 probe)."""
    rep = obs.get("report")
    if not rep:
        return None
    try:
        d = json.loads(rep)
        return {"eligible_leader_replicas": [int(r) for r in d.get("eligible_leader_replicas") or []],
                "last_known_elr": [int(r) for r in d.get("last_known_elr") or []]}
    except (ValueError, TypeError, AttributeError):
        return None


def _offsets(state: PartitionState, obs: dict, now: int) -> list[Transition]:
    """Record the partition's offsets.  The HW only moves forward on a given leader; a lower
    value is kept as reported (it is what the broker says) — rules on HW history come later."""
    write(state, OFFSETS_WRITES, obs, now)
    return []


def unobserved_window_ms(state: PartitionState, cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> int:
    interval = state.get("interval_ms")
    if interval:
        return cfg.unobserved_intervals * int(interval)
    return cfg.unobserved_after_ms


def on_partition_observed(state: PartitionState, now: int, entity: str, cfg: PartitionRulesConfig = DEFAULT_CONFIG,
                          interval_ms: Optional[int] = None) -> list[Transition]:
    """The partition was reported at ``now``: resolve PartitionUnobserved.  ``interval_ms``: the
    observing source's interval, when the caller knows it (sets the unobserved window).  An
    observation older than the newest one seen changes nothing."""
    _ensure(state)
    if interval_ms and int(interval_ms) != state["interval_ms"]:
        state["interval_ms"] = int(interval_ms)
        _schedule(state, cfg)
    prev = state["observed_at"]
    write(state, OBSERVED_WRITES, {}, now)
    if prev is not None and now <= prev:
        return []
    out: list[Transition] = []
    if _is_open(state, _PU):
        out = _resolve(state, _PU, entity, partition_labels(state), now,
                       {"observed_at": now, "last_observed_at": prev,
                        "unobserved_for_ms": None if prev is None else now - prev})
    _schedule(state, cfg)
    return out


def _leadership(state: PartitionState, obs: dict, now: int, entity: str,
                cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one partition_metadata observation (``obs``: leader, leader_epoch, replicas, isr,
    min_insync_replicas) into ``state`` for UnderMinIsr / AtMinIsr, LeaderChanged and
    PreferredLeaderImbalance; also resolves PartitionUnobserved.  Order-independent with
    ``_replication`` (docs/rules.md)."""
    out = on_partition_observed(state, now, entity, cfg)
    if state["md_at"] is not None and now < state["md_at"]:
        return out  # out of order: older than what the rules already reflect
    labels = partition_labels(state)
    leader = int(obs["leader"])
    epoch = _int(obs.get("leader_epoch"))
    replicas = [int(r) for r in obs["replicas"]]
    isr = [int(r) for r in obs["isr"]]

    # -- stale view of another client (lower leader epoch): ignore, unless it persists -------
    epoch_reset = False
    prev_epoch = state["epoch_seen"]
    if state["md_at"] is not None and epoch is not None and prev_epoch is not None and epoch < prev_epoch:
        state["epoch_regressions"] += 1
        if state["epoch_regressions"] < cfg.epoch_reset_after:
            return out
        epoch_reset = True
    state["epoch_regressions"] = 0

    # -- LeaderChanged ------------------------------------------------------------------------
    first = state["md_at"] is None
    prev_leader = state["leader_seen"]
    changed = not first and (leader != prev_leader or epoch_reset
                             or (epoch is not None and prev_epoch is not None and epoch != prev_epoch))
    if changed:
        out += _leader_change(state, now, entity, labels, cfg, prev_leader, leader, prev_epoch, epoch,
                              replicas, epoch_reset)
    write(state, LEADER_WRITES, obs, now)

    # -- UnderMinIsr / AtMinIsr ---------------------------------------------------------------
    min_isr = _int(obs.get("min_insync_replicas"))
    if min_isr is None:
        min_isr = _int(state.get("min_isr"))
    if min_isr is not None and min_isr >= 1 and leader >= 0:
        out += _min_isr(state, now, entity, labels, isr, replicas, min_isr, eligible_leaders(obs))

    # -- PreferredLeaderImbalance -------------------------------------------------------------
    imbalanced = leader >= 0 and bool(replicas) and leader != replicas[0]
    if not imbalanced:
        state["imbalanced_since"] = None
        if state["open"]:
            out += _resolve(state, _PLI, entity, labels, now,
                            {"leader": leader, "preferred_leader": replicas[0] if replicas else None,
                             "offline": leader < 0})
    else:
        if state["imbalanced_since"] is None:
            state["imbalanced_since"] = now
        out += _maybe_open_imbalance(state, now, entity, labels, cfg, leader, replicas)

    _schedule(state, cfg)
    return out


def _leader_change(state: PartitionState, now: int, entity: str, labels: dict, cfg: PartitionRulesConfig,
                   old_leader: Optional[int], new_leader: int, old_epoch: Optional[int],
                   new_epoch: Optional[int], replicas: list[int], epoch_reset: bool) -> list[Transition]:
    out: list[Transition] = []
    ep = state["leader_episode"]
    if ep is not None and now - ep["last_change_at"] >= cfg.leader_quiet_ms:
        out += _resolve_leader_episode(state, now, entity, labels)  # no tick ran in between
        ep = None
    record = [now, old_leader, new_leader, old_epoch, new_epoch]
    if ep is None:
        state["leader_episode"] = {"changes": 1, "first_change_at": now, "last_change_at": now,
                                   "history": [record]}
        out += _open(state, _LC, entity, labels, now,
                     {"old_leader": old_leader, "new_leader": new_leader, "old_epoch": old_epoch,
                      "new_epoch": new_epoch, "changes": 1, "preferred_leader": replicas[0] if replicas else None,
                      "epoch_reset": epoch_reset})
    else:
        ep["changes"] += 1
        ep["last_change_at"] = now
        ep["history"].append(record)
        del ep["history"][:-cfg.leader_history_max]
    return out


def _resolve_leader_episode(state: PartitionState, now: int, entity: str, labels: dict) -> list[Transition]:
    ep = state["leader_episode"]
    state["leader_episode"] = None
    if ep is None:
        return []
    history = [{"at": at, "old_leader": ol, "new_leader": nl, "old_epoch": oe, "new_epoch": ne}
               for at, ol, nl, oe, ne in ep["history"]]
    return _resolve(state, _LC, entity, labels, now,
                    {"changes": ep["changes"], "first_change_at": ep["first_change_at"],
                     "last_change_at": ep["last_change_at"], "quiet_for_ms": now - ep["last_change_at"],
                     "leader": state["leader_seen"], "leader_epoch": state["epoch_seen"],
                     "history": history, "history_truncated": ep["changes"] - len(history)})


def min_isr_status(n_isr: int, n_replicas: int, min_isr: int) -> Optional[str]:
    """"under" (acks=all writes refused), "at" (one more loss refuses them: replicas missing, or
    min.insync.replicas >= 2 equal to the ISR) or None, for distinct ISR and replica counts."""
    if n_isr < min_isr:
        return "under"
    if n_isr == min_isr and (n_isr < n_replicas or min_isr >= 2):
        return "at"
    return None


def _min_isr(state: PartitionState, now: int, entity: str, labels: dict, isr: list[int], replicas: list[int],
             min_isr: int, elr: Optional[dict] = None) -> list[Transition]:
    n_isr, n_rep = len(set(isr)), len(set(replicas))
    target = {None: None, "under": _UNDER, "at": _AT}[min_isr_status(n_isr, n_rep, min_isr)]
    if target is None and not state["open"]:
        return []  # healthy, nothing open to resolve
    evidence = {"isr": isr, "isr_size": n_isr, "min_insync_replicas": min_isr, "replicas": replicas,
                "replication_factor": n_rep, "configured_margin": n_rep - min_isr}
    if elr is not None and target is _UNDER:
        # KIP-966: an eligible leader replica holds every committed record; with one, the
        # partition comes back without data loss once it (or the ISR) returns
        evidence.update(elr, recoverable_without_data_loss=bool(isr or elr["eligible_leader_replicas"]))
    out: list[Transition] = []
    now_is = {None: "healthy", _UNDER: "under_min_isr", _AT: "at_min_isr"}[target]
    for alert in (_UNDER, _AT):
        if alert is not target:
            out += _resolve(state, alert, entity, labels, now, {**evidence, "now": now_is})
    if target is not None:
        out += _open(state, target, entity, blame(labels, sorted(set(replicas) - set(isr))), now, evidence)
    return out


def _maybe_open_imbalance(state: PartitionState, now: int, entity: str, labels: dict, cfg: PartitionRulesConfig,
                          leader: Optional[int], replicas: Optional[list[int]]) -> list[Transition]:
    since = state["imbalanced_since"]
    if since is None or _is_open(state, _PLI) or now - since < cfg.imbalance_after_ms:
        return []
    return _open(state, _PLI, entity, labels, now,
                 {"leader": leader, "preferred_leader": replicas[0] if replicas else None,
                  "replicas": replicas, "imbalanced_since": since, "imbalanced_for_ms": now - since,
                  "last_observed_at": state["md_at"]})


# ---------------------------------------------------------------------------------------------
# Partition: offsets and HighWatermarkStalled
# ---------------------------------------------------------------------------------------------


def note_pending_writes(state: PartitionState, at: int) -> None:
    """Some client saw writes pending on this partition at ``at`` (epoch ms): an offset beyond
    the HW, or acks=all writes not acknowledged (the canary's reports, streaming/rules/canary.py)."""
    _ensure(state)
    at = int(at)
    if state["pending_writes_at"] is None or at > state["pending_writes_at"]:
        state["pending_writes_at"] = at
    _sync_pending(state)


def note_write_waited(state: PartitionState, at: int, waited_ms: int, entity: str,
                      cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """The canary reports at ``at`` an acks=all write unacknowledged for ``waited_ms``: the leader
    acknowledges once the high watermark passes the write, so the HW has not passed it for that
    long -- a stall seen without two HW observations (which a probe waiting for a paused broker
    may not make in time).  HighWatermarkStalled opens at ``hw_stall_ms``; it resolves as
    always, when an observation shows the HW moved."""
    _ensure(state)
    if waited_ms < cfg.hw_stall_ms or _is_open(state, _HWS):
        return []
    return _open(state, _HWS, entity, partition_labels(state), at,
                 {"high_watermark": state["hw_seen"], "hw_unchanged_since": state["hw_changed_at"],
                  "oldest_unacknowledged_write_sent_at": at - waited_ms, "waited_ms": waited_ms,
                  "last_hw_observation_at": state["hw_observed_at"]})


def _sync_pending(state: PartitionState) -> None:
    """pending_since = the first pending-writes time seen after the HW's last move."""
    pw, changed = state["pending_writes_at"], state["hw_changed_at"]
    if state["pending_since"] is None and pw is not None and changed is not None and pw > changed:
        state["pending_since"] = int(pw)


def _maybe_open_stall(state: PartitionState, now: int, entity: str, cfg: PartitionRulesConfig) -> list[Transition]:
    since, seen = state["pending_since"], state["hw_observed_at"]
    if since is None or seen is None or _is_open(state, _HWS) or seen - since < cfg.hw_stall_ms:
        return []
    return _open(state, _HWS, entity, partition_labels(state), now,
                 {"high_watermark": state["hw_seen"], "hw_unchanged_since": state["hw_changed_at"],
                  "pending_writes_since": since, "pending_writes_last_seen_at": state["pending_writes_at"],
                  "last_hw_observation_at": seen, "stalled_for_at_least_ms": seen - since})


def _progress(state: PartitionState, obs: dict, now: int, entity: str,
              cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one partition_offsets observation (``obs["high_watermark"]``) for
    HighWatermarkStalled; also resolves PartitionUnobserved.  Order-independent with
    ``_offsets``."""
    out = on_partition_observed(state, now, entity, cfg)
    if state["hw_observed_at"] is not None and now < state["hw_observed_at"]:
        return out  # out of order
    prev = state["hw_seen"]
    write(state, PROGRESS_WRITES, obs, now)
    hw = state["hw_seen"]
    if prev is None or hw != prev:
        state["pending_since"] = None
        opened = state["open"].get(_HWS.value) if state["open"] else None
        # an observation older than the stall (opened from a canary report, whose events may
        # overtake the probe's) does not show the HW moving since: it does not resolve it
        if prev is not None and (opened is None or now >= opened["since"]):
            out += _resolve(state, _HWS, entity, partition_labels(state), now, {"hw_before": prev, "hw_after": hw})
    _sync_pending(state)
    out += _maybe_open_stall(state, now, entity, cfg)
    _schedule(state, cfg)
    return out


# ---------------------------------------------------------------------------------------------
# Partition: time
# ---------------------------------------------------------------------------------------------


def _schedule(state: PartitionState, cfg: PartitionRulesConfig) -> None:
    """state["due"] = the earliest time at which tick_partition has something to decide."""
    due: Optional[int] = None
    unobserved = _is_open(state, _PU)
    if not unobserved and state["observed_at"] is not None:
        due = state["observed_at"] + unobserved_window_ms(state, cfg)
    ep = state["leader_episode"]
    if ep is not None:
        t = ep["last_change_at"] + cfg.leader_quiet_ms
        due = t if due is None else min(due, t)
    if state["imbalanced_since"] is not None and not _is_open(state, _PLI):
        t = state["imbalanced_since"] + cfg.imbalance_after_ms
        view_at = _view_at(state)  # set: the imbalance was seen in a metadata observation
        if view_at is not None and t < view_at + unobserved_window_ms(state, cfg):  # else only a new observation can open it
            due = t if due is None else min(due, t)
    state["due"] = due
    state["due_pw"] = state["pending_writes_at"]


def tick_partition(state: PartitionState, now: int, entity: str, cfg: PartitionRulesConfig = DEFAULT_CONFIG,
                   *, blind: bool = False) -> list[Transition]:
    """Time-driven checks for one partition state: PartitionUnobserved opens, LeaderChanged
    resolves after the quiet window, PreferredLeaderImbalance opens once it lasted long enough,
    a ``pending_writes_at`` written directly into the state is taken into account.  O(1); when
    nothing is due (``now < state["due"]`` and ``pending_writes_at`` unchanged) it returns at
    once without touching the state.  ``blind``: the job's sources are silent — do not open
    PartitionUnobserved (SourceSilent says it once)."""
    if "due" in state and state.get("pending_writes_at") == state["due_pw"]:
        due = state["due"]
        if due is None or now < due:
            return []
    _ensure(state)
    labels = partition_labels(state)
    out: list[Transition] = []
    last = state["observed_at"]
    window = unobserved_window_ms(state, cfg)
    if not blind and last is not None and not _is_open(state, _PU) and now - last >= window:
        # stamped with the moment it fell due, not the tick's: a job that ticks at another moment
        # (restarted, slower, processing time) opens it with the same id
        at = min(now, last + window)
        out += _open(state, _PU, entity, labels, at,
                     {"last_observed_at": last, "unobserved_for_ms": at - last, "window_ms": window,
                      "interval_ms": state["interval_ms"]})
    ep = state["leader_episode"]
    if ep is not None and now - ep["last_change_at"] >= cfg.leader_quiet_ms:
        out += _resolve_leader_episode(state, now, entity, labels)
    view_at = _view_at(state)
    if view_at is not None and now - view_at < window:  # the leader view is current
        out += _maybe_open_imbalance(state, now, entity, labels, cfg, state["leader_seen"], state.get("replicas"))
    _sync_pending(state)
    out += _maybe_open_stall(state, now, entity, cfg)
    _schedule(state, cfg)
    return out


# ---------------------------------------------------------------------------------------------
# Quiet partitions: what the partition table may apply without these rules
# ---------------------------------------------------------------------------------------------


def signature(leader: Any, epoch: Any, replicas: Any, isr: Any) -> tuple:
    """What a partition_metadata observation must repeat to change nothing."""
    return (int(leader), None if epoch is None else int(epoch), tuple(map(int, replicas)), tuple(map(int, isr)))


def is_quiet(state: PartitionState, cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> bool:
    """Whether these rules would do nothing with a newer ``partition_offsets`` observation of
    this partition but record its offsets and move its observation times (``hw_*``,
    ``md_confirmed_at``, ``observed_at``, ``last_seen``, ``due``): no alert open, no leader
    episode or imbalance timer running, no writes pending, the plain unobserved-window schedule.
    ``repeat_signature`` says which ``partition_metadata`` observation is quiet too.

    The partition table (streaming/state/table.py) applies such rows in columns, without
    calling the rules.  A rule that reacts to an offsets row of a partition in this state (an HW
    going back, say) must make this return False for it; the table and the rules are checked
    against each other by tests/unit/test_partition_table_stateful.py."""
    return (state.get("kind") == "partition" and not state["open"] and _LAST_KEY in state and "due" in state
            and state["pending_writes_at"] is None and state["pending_since"] is None
            and state["leader_episode"] is None and state["imbalanced_since"] is None
            and state["observed_at"] is not None and state["last_seen"] is not None and state["hw"] is not None
            and state["due"] == state["observed_at"] + unobserved_window_ms(state, cfg)
            and state.get("due_pw") is None)


def repeat_signature(state: PartitionState) -> Optional[tuple]:
    """For a quiet partition (``is_quiet``): the ``signature`` a ``partition_metadata``
    observation must repeat (with the same min.insync.replicas, or none) to change nothing but
    ``md_at``; None when no metadata observation is quiet (the leader view is not settled:
    an epoch regression counted, no leader, or the view not yet confirmed)."""
    if (state["epoch_regressions"] == 0 and state["md_at"] is not None and state["leader"] is not None
            and state["leader"] >= 0 and state["leader"] == state["leader_seen"]
            and state["leader_epoch"] == state["epoch_seen"]
            and state["replicas"] is not None and state["isr"] is not None):
        return signature(state["leader_seen"], state["epoch_seen"], state["replicas"], state["isr"])
    return None


def on_partition_metadata(state: PartitionState, obs: dict, now: int, entity: str,
                          cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one ``partition_metadata`` observation into ``state`` (mutated): every partition
    alert it feeds (ISR, replication, leadership, min ISR, imbalance, being observed)."""
    return _leadership(state, obs, now, entity, cfg) + _replication(state, obs, now, entity)


def on_partition_offsets(state: PartitionState, obs: dict, now: int, entity: str,
                         cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one ``partition_offsets`` observation: the offsets, HighWatermarkStalled, being
    observed."""
    return _offsets(state, obs, now) + _progress(state, obs, now, entity, cfg)


# ---------------------------------------------------------------------------------------------
# Partition: writes another entity's report says are pending (canary, client_produce)
# ---------------------------------------------------------------------------------------------


def on_pending_writes(obs: dict, now: Optional[int], pending: bool, waited_ms: Optional[int],
                      find: Callable[[str], Optional[PartitionState]],
                      cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """A canary's or an instrumented producer's report ``obs`` at ``now`` says writes are
    ``pending`` on its partition (a canary's also how long the oldest has waited, ``waited_ms``):
    the partition's state (``find(key)``; None while it is not observed: nothing to stall) notes
    them (``note_pending_writes``), and the wait may open HighWatermarkStalled
    (``note_write_waited``)."""
    if now is None or not pending:
        return []
    key = f"partition|{obs['cluster']}/{obs['topic']}/{int(obs['partition'])}"
    state = find(key)
    if state is None:
        return []
    note_pending_writes(state, now)
    return [] if waited_ms is None else note_write_waited(state, now, waited_ms, key, cfg)
