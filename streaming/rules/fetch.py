"""Client fetch entity (cluster/group/topic/partition): one partition as the instrumented
consumer that fetches it reports it (``client_fetch`` events).  No alert decides on it yet: the
job keeps the latest report and the exporter serves it (``kafka_monitor_client_fetch_*``),
beside what the probe sees of the same group partition (``group_partition``).
"""

from __future__ import annotations

from typing import Any

from streaming.rules.base import Transition

#: the report's fields the entity keeps (event field -> entity field)
FIELDS = {"fetch_state": "fetch_state", "position": "position", "committed": "committed",
          "high_watermark": "hw", "last_stable_offset": "lso", "log_start_offset": "log_start",
          "consumer_lag": "lag", "leader": "leader"}


def new_client_fetch(cluster: str, group: str, topic: str, partition: int) -> dict:
    return {"cluster": cluster, "group": group, "topic": topic, "partition": partition, "last_seen": None,
            "open": {}, "source": None, **dict.fromkeys(FIELDS.values())}


def on_client_fetch(state: dict, ev: dict[str, Any], now: int, entity: str) -> list[Transition]:
    """The latest report wins, whichever consumer of the group sent it (after a rebalance the
    partition's new owner reports it)."""
    for src, dst in FIELDS.items():
        state[dst] = ev.get(src)
    state["source"] = ev.get("source")
    return []
