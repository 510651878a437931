"""Canary entity (cluster/topic/partition): one partition of the probe's canary topic as the
canary reports it (``canary`` events: its acks=all writes, read back; cumulative counters and
latency histograms).  The job keeps the latest report for the exporter
(``kafka_monitor_canary_*``), and writes the canary knows to be pending make the partition's
HighWatermarkStalled decidable (``partition.on_pending_writes``, through ``dispatch``).
"""

from __future__ import annotations

from typing import Any

from streaming.rules.base import Transition, report_int


def new_canary(cluster: str, topic: str, partition: int) -> dict:
    return {"cluster": cluster, "topic": topic, "partition": partition, "last_seen": None, "open": {},
            "source": None, "report": None, "leader": None}


def on_canary(state: dict, ev: dict[str, Any], now: int, entity: str) -> list[Transition]:
    """The latest report wins (the counters are cumulative: a lost or replayed report changes
    nothing the next one does not restate)."""
    state["report"] = ev.get("report")
    state["leader"] = ev.get("leader")
    state["source"] = ev.get("source")
    return []


def pending_writes(ev: dict[str, Any]) -> bool:
    """Whether the report says writes were sent and not acknowledged at its time."""
    return (report_int(ev, "pending") or 0) > 0
