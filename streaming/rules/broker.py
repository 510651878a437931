"""Broker entity (cluster/node_id), from ``broker_state`` events (one per broker per probe
metadata refresh, counted over every partition of the response): BrokerDown, BrokerUnderReplicating.

- **BrokerDown (critical)**: the broker holds replicas but the metadata does not list it
  (stopped, or fenced by the controller).  Opens on the first such observation (the Prometheus
  rule waits 1 min), resolves when it is listed again.
- **BrokerUnderReplicating (warning)**: the broker is listed and some partitions it holds a
  replica of do not have it in their ISR (its fetchers are behind or stopped).  Opens on the
  first such observation, resolves when none is left.  A broker that is down is only BrokerDown.
- **BrokerStallingWrites (critical)**: the canary's acks=all writes have waited ``STALLING_AFTER_MS``
  for this broker (``writes_waiting_since``: the probe found it a follower in the ISR of every
  canary partition whose writes wait while their leader answers, monitor.canary.writes_held_by),
  so it holds their high watermark: the partitions' HighWatermarkStalled, named.  Resolves when
  the writes no longer wait for it (acknowledged, or it left the ISR: then IsrShrink names it).

Both name the broker (label ``broker``): the per-partition alerts of the same incident (IsrShrink,
UnderReplicated, ...) are the same cause seen partition by partition.
"""

from __future__ import annotations

from typing import Any

from streaming.rules.base import Alert, Transition, _open, _resolve, report_int

FIELDS = ("registered", "leader_partitions", "replica_partitions", "out_of_sync_replicas", "host", "port", "rack")
#: the fields that come in the row's report (streaming/ingest/parsing.py REPORT_FIELDS)
REPORTED = ("writes_waiting_since", "writes_waiting_partitions")

#: how long the canary's writes wait for one broker before BrokerStallingWrites opens: the
#: HighWatermarkStalled window (streaming.rules.partition_config.PartitionRulesConfig.hw_stall_ms)
STALLING_AFTER_MS = 10_000


def new_broker(cluster: str, node_id: int) -> dict:
    return {"cluster": cluster, "broker": node_id, "last_seen": None, "open": {}, "source": None,
            "observed_at": None, "down_since": None, **dict.fromkeys(FIELDS), **dict.fromkeys(REPORTED)}


def broker_labels(state: dict) -> dict:
    return {"cluster": state["cluster"], "broker": state["broker"]}


def on_broker_state(state: dict, ev: dict[str, Any], now: int, entity: str) -> list[Transition]:
    if state["observed_at"] is not None and now < state["observed_at"]:
        return []  # older than what the entity shows
    state["observed_at"] = now
    for f in FIELDS:
        state[f] = ev.get(f)
    for f in REPORTED:
        state[f] = report_int(ev, f)
    state["source"] = ev.get("source")
    labels = broker_labels(state)
    out: list[Transition] = []
    registered = bool(state["registered"])
    holds = state["replica_partitions"] or 0
    behind = state["out_of_sync_replicas"] or 0
    down = not registered and holds > 0
    if down:
        if state["down_since"] is None:
            state["down_since"] = now
        out += _open(state, Alert.BROKER_DOWN, entity, labels, now,
                     {"replica_partitions": holds, "leader_partitions": state["leader_partitions"],
                      "out_of_sync_replicas": behind, "unlisted_since": state["down_since"]})
    else:
        state["down_since"] = None
        out += _resolve(state, Alert.BROKER_DOWN, entity, labels, now, {"registered": registered})
    if registered and behind > 0:
        out += _open(state, Alert.BROKER_UNDER_REPLICATING, entity, labels, now,
                     {"out_of_sync_replicas": behind, "replica_partitions": holds})
    else:
        out += _resolve(state, Alert.BROKER_UNDER_REPLICATING, entity, labels, now,
                        {"out_of_sync_replicas": behind, "registered": registered})
    since = state["writes_waiting_since"]
    if since is not None and registered and now - int(since) >= STALLING_AFTER_MS:
        out += _open(state, Alert.BROKER_STALLING_WRITES, entity, labels, now,
                     {"writes_waiting_since": int(since), "waiting_partitions": state["writes_waiting_partitions"],
                      "waited_ms": now - int(since)})
    elif since is None or not registered:
        out += _resolve(state, Alert.BROKER_STALLING_WRITES, entity, labels, now, {"registered": registered})
    return out
