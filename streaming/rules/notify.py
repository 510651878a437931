"""When an alert the job opens at once notifies (``[job.rules.notify]``).

IsrShrink, OfflinePartition, BrokerDown and the others below open in the job at the first
observation that shows them: on ``/metrics`` (``kafka_monitor_alert_active``) and the alerts
topic every episode is there, flaps of a few seconds included.  Whether an episode pages is a
second decision: once it has been open for its hold here.  The exporter serves these holds as
``kafka_monitor_alert_notify_after_seconds`` and each open alert's start as
``kafka_monitor_alert_opened_timestamp_seconds``; the shipped Prometheus rules compare the two
and add no `for:` of their own, so the job's settings are the only thresholds.  Why each
default: docs/rules.md, "Notify holds".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from streaming.rules.base import Alert


@dataclass(frozen=True)
class NotifyConfig:
    """How long each alert is open before its Prometheus rule fires, in milliseconds."""

    #: a replica out of the ISR for less than this is a flap (a broker restart, a GC pause)
    isr_shrink_after_ms: int = 300_000
    under_replicated_after_ms: int = 300_000
    #: fewer in-sync replicas than min.insync.replicas: acks=all writes fail now
    under_min_isr_after_ms: int = 0
    at_min_isr_after_ms: int = 300_000
    #: no leader: the partition can be neither written nor read now
    offline_partition_after_ms: int = 0
    #: the controller already waited out the broker's session (broker.session.timeout.ms)
    broker_down_after_ms: int = 0
    broker_under_replicating_after_ms: int = 300_000
    leader_changed_after_ms: int = 60_000
    partition_count_changed_after_ms: int = 60_000
    metadata_refresh_storm_after_ms: int = 120_000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"NotifyConfig.{f.name}: must be an integer >= 0 (milliseconds), got {v!r}")

    def holds_s(self) -> dict[str, float]:
        """Alert name -> its hold in seconds (what the exporter serves)."""
        return {alert.value: getattr(self, field) / 1000.0 for field, alert in FIELDS.items()}


#: setting -> the alert it holds
FIELDS: dict[str, Alert] = {
    "isr_shrink_after_ms": Alert.ISR_SHRINK,
    "under_replicated_after_ms": Alert.UNDER_REPLICATED,
    "under_min_isr_after_ms": Alert.UNDER_MIN_ISR,
    "at_min_isr_after_ms": Alert.AT_MIN_ISR,
    "offline_partition_after_ms": Alert.OFFLINE_PARTITION,
    "broker_down_after_ms": Alert.BROKER_DOWN,
    "broker_under_replicating_after_ms": Alert.BROKER_UNDER_REPLICATING,
    "leader_changed_after_ms": Alert.LEADER_CHANGED,
    "partition_count_changed_after_ms": Alert.PARTITION_COUNT_CHANGED,
    "metadata_refresh_storm_after_ms": Alert.METADATA_REFRESH_STORM,
}
