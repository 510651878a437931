"""Alert rules: pure functions of (previous entity state, one observation, now).

No clock is read here: ``now`` is an argument, so replaying the same events gives the same
transitions.  Entity states are plain dicts (they are stored as JSON in Spark's state store);
each carries ``open``: alert name -> {"id", "since", "evidence"} for its open alerts.

A transition is an open or a resolve of one alert on one entity.  The alert id is stable for
one episode: the resolve carries the id of the open it ends.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional


class Severity(enum.IntEnum):
    """Ordered: a higher value pages harder."""

    INFO = 1       # worth a line on a dashboard
    WARNING = 2    # redundancy or latency at risk; look during working hours
    CRITICAL = 3   # data unavailable or about to be; page


class Alert(str, enum.Enum):
    """The alert catalogue (DESIGN §4); the names are part of the product."""

    # partition
    ISR_SHRINK = "IsrShrink"                          # a replica left the ISR, replica set unchanged
    UNDER_REPLICATED = "UnderReplicated"              # |ISR| < |replicas|
    UNDER_MIN_ISR = "UnderMinIsr"                     # |ISR| < min.insync.replicas: acks=all writes fail
    AT_MIN_ISR = "AtMinIsr"                           # |ISR| == min.insync.replicas: one more loss stops writes
    OFFLINE_PARTITION = "OfflinePartition"            # no leader
    LEADER_CHANGED = "LeaderChanged"                  # leader or leader epoch changed (info)
    PREFERRED_LEADER_IMBALANCE = "PreferredLeaderImbalance"  # leader != first replica
    HIGH_WATERMARK_STALLED = "HighWatermarkStalled"   # HW flat while writes are known to be pending
    PARTITION_UNOBSERVED = "PartitionUnobserved"      # a partition stopped being reported
    # topic
    PARTITION_COUNT_CHANGED = "PartitionCountChanged"
    # group / group partition
    CONSUMER_LAG_HIGH = "ConsumerLagHigh"             # lag in offsets or seconds above threshold
    CONSUMER_LAG_STATUS = "ConsumerLagStatus"         # Burrow-style WARN / STALL / STOP / REWIND
    REBALANCE_STORM = "RebalanceStorm"                # >= N rebalances in window W
    REBALANCE_STUCK = "RebalanceStuck"                # Preparing/CompletingRebalance longer than T
    GROUP_EMPTY_WITH_LAG = "GroupEmptyWithLag"        # no members while lag > 0 for T
    # client / source
    METADATA_STALE = "MetadataStale"                  # no successful refresh for 2 x metadata.max.age
    METADATA_REFRESH_STORM = "MetadataRefreshStorm"   # invalidation-driven refreshes above N per minute
    SOURCE_SILENT = "SourceSilent"                    # no heartbeat for 3 x its interval


SEVERITY = {
    Alert.ISR_SHRINK: Severity.WARNING,
    Alert.UNDER_REPLICATED: Severity.WARNING,
    Alert.UNDER_MIN_ISR: Severity.CRITICAL,
    Alert.AT_MIN_ISR: Severity.WARNING,
    Alert.OFFLINE_PARTITION: Severity.CRITICAL,
    Alert.LEADER_CHANGED: Severity.INFO,
    Alert.PREFERRED_LEADER_IMBALANCE: Severity.INFO,
    Alert.HIGH_WATERMARK_STALLED: Severity.CRITICAL,
    Alert.PARTITION_UNOBSERVED: Severity.WARNING,
    Alert.PARTITION_COUNT_CHANGED: Severity.INFO,
    Alert.CONSUMER_LAG_HIGH: Severity.WARNING,
    Alert.CONSUMER_LAG_STATUS: Severity.WARNING,
    Alert.REBALANCE_STORM: Severity.WARNING,
    Alert.REBALANCE_STUCK: Severity.CRITICAL,
    Alert.GROUP_EMPTY_WITH_LAG: Severity.WARNING,
    Alert.METADATA_STALE: Severity.WARNING,
    Alert.METADATA_REFRESH_STORM: Severity.WARNING,
    Alert.SOURCE_SILENT: Severity.CRITICAL,
}


@dataclass(frozen=True)
class Transition:
    alert: Alert
    action: str  # "open" | "resolve"
    alert_id: str
    at: int
    entity: str
    labels: dict[str, Any]
    evidence: dict[str, Any] = field(default_factory=dict)
    #: a rule may raise the catalogue's default (e.g. ConsumerLagStatus STOP is critical)
    severity_override: Optional[Severity] = None

    @property
    def severity(self) -> Severity:
        return self.severity_override or SEVERITY[self.alert]


def alert_id(alert: Alert, entity: str, since: int) -> str:
    return hashlib.sha1(f"{alert.value}|{entity}|{since}".encode()).hexdigest()[:20]


def _open(state: dict, alert: Alert, entity: str, labels: dict, now: int, evidence: dict) -> list[Transition]:
    if alert.value in state["open"]:
        return []
    aid = alert_id(alert, entity, now)
    state["open"][alert.value] = {"id": aid, "since": now, "evidence": evidence}
    return [Transition(alert, "open", aid, now, entity, labels, evidence)]


def _resolve(state: dict, alert: Alert, entity: str, labels: dict, now: int, evidence: dict) -> list[Transition]:
    if not state["open"]:  # the common case: nothing open on the entity
        return []
    was = state["open"].pop(alert.value, None)
    if was is None:
        return []
    return [Transition(alert, "resolve", was["id"], now, entity, labels,
                       {**evidence, "open_since": was["since"]})]


def partition_labels(state: dict) -> dict[str, Any]:
    return {"cluster": state["cluster"], "topic": state["topic"], "partition": state["partition"]}


def new_partition(cluster: str, topic: str, partition: int) -> dict:
    return {"cluster": cluster, "topic": topic, "partition": partition, "leader": None,
            "leader_epoch": None, "replicas": None, "isr": None, "min_isr": None, "hw": None,
            "log_start": None, "lso": None, "last_seen": None, "open": {}}


def on_partition_metadata(state: dict, obs: dict, now: int, entity: str) -> list[Transition]:
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
    if removed and set(prev_replicas or []) == set(replicas):
        out += _open(state, Alert.ISR_SHRINK, entity, labels, now,
                     {"isr_before": prev_isr, "isr_after": isr, "removed": removed, "replicas": replicas})
    opened = state["open"]  # evidence for a resolve is only built when something is open
    if opened and set(isr) >= set(replicas):
        out += _resolve(state, Alert.ISR_SHRINK, entity, labels, now,
                        {"isr_before": prev_isr, "isr_after": isr, "replicas": replicas})

    if len(isr) < len(replicas):
        out += _open(state, Alert.UNDER_REPLICATED, entity, labels, now,
                     {"isr": isr, "replicas": replicas, "missing": sorted(set(replicas) - set(isr))})
    elif opened:
        out += _resolve(state, Alert.UNDER_REPLICATED, entity, labels, now, {"isr": isr, "replicas": replicas})

    leader = int(obs["leader"])
    if leader < 0:
        out += _open(state, Alert.OFFLINE_PARTITION, entity, labels, now,
                     {"leader": leader, "replicas": replicas, "offline_replicas": list(obs.get("offline_replicas") or [])})
    elif opened:
        out += _resolve(state, Alert.OFFLINE_PARTITION, entity, labels, now, {"leader": leader})

    state.update(replicas=replicas, isr=isr, leader=leader, leader_epoch=obs.get("leader_epoch"),
                 last_seen=now)
    if obs.get("min_insync_replicas") is not None:
        state["min_isr"] = int(obs["min_insync_replicas"])
    return out


def on_partition_offsets(state: dict, obs: dict, now: int) -> list[Transition]:
    """Record the partition's offsets.  The HW only moves forward on a given leader; a lower
    value is kept as reported (it is what the broker says) — rules on HW history come later."""
    state.update(hw=int(obs["high_watermark"]), log_start=obs.get("log_start_offset"),
                 lso=obs.get("last_stable_offset"), last_seen=now)
    return []


def new_group_partition(cluster: str, group: str, topic: str, partition: int) -> dict:
    return {"cluster": cluster, "group": group, "topic": topic, "partition": partition,
            "committed": None, "hw": None, "lag": None, "last_seen": None, "open": {}}


def lag(committed: Optional[int], hw: Optional[int]) -> Optional[int]:
    """Lag in offsets from one consistent observation: None when either side is unknown (no
    commit yet, or HW not observed), never negative (a commit read after the HW — or a
    just-moved leader whose HW lags — would otherwise show as negative lag)."""
    if committed is None or hw is None:
        return None
    return max(0, int(hw) - int(committed))


def evict(state: dict, now: int, ttl_ms: int, entity: str, labels: dict) -> Optional[list[Transition]]:
    """None when the entity is still alive; otherwise the transitions that resolve its open
    alerts (an entity that disappeared — a deleted topic, a group that went away — must not
    leave alerts open forever)."""
    if state["last_seen"] is not None and now - state["last_seen"] <= ttl_ms:
        return None
    out = []
    for name in list(state["open"]):
        out += _resolve(state, Alert(name), entity, labels, now, {"reason": "entity no longer observed"})
    return out
