"""Client produce entity (cluster/source/topic/partition): one partition as an instrumented
producer's statistics report it (``client_produce`` events: what it holds queued and in flight,
what it sent, its requests to the partition's leader).  The job keeps the latest report for the
exporter (``kafka_monitor_client_produce_*``); writes in flight tell the partition's rules that
writes are pending (HighWatermarkStalled), like the canary's.
"""

from __future__ import annotations

from typing import Any

from streaming.rules.base import Transition, report_int


def new_client_produce(cluster: str, source: str, topic: str, partition: int) -> dict:
    return {"cluster": cluster, "source": source, "topic": topic, "partition": partition, "last_seen": None,
            "open": {}, "report": None, "leader": None}


def on_client_produce(state: dict, ev: dict[str, Any], now: int, entity: str) -> list[Transition]:
    """The latest report wins (its counters are the client's since it started)."""
    state["report"] = ev.get("report")
    state["leader"] = ev.get("leader")
    return []


def in_flight(ev: dict[str, Any]) -> bool:
    """Whether the report says writes were sent and not acknowledged at its time."""
    return (report_int(ev, "in_flight_messages") or 0) > 0
