"""Which rules an event and an entity go through: the state function (``streaming.state.function``)
looks them up here and calls nothing by name.

``EVENTS``: contract type -> ``On`` (its rule, the settings family it takes, the partition hook
for writes it reports pending).  ``TEMPLATES``: entity kind -> a new entity.  ``DUE``: the kinds
whose timers are ticked at their moments (``catch_up``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from streaming.rules import (broker, canary, client, fetch, group, ha, lag, logdirs, partition, partition_config,
                             produce, quorum, source, topic, transactions)
from streaming.rules.base import Transition, report_int

#: a new entity of each kind from its identifying fields (an input row, or a stored entity to
#: complete after a field was added)
TEMPLATES: dict[str, Callable[[dict], Any]] = {
    "partition": lambda e: partition.new_partition(e["cluster"], e["topic"], e["partition"]),
    "group_partition": lambda e: lag.new_group_partition(e["cluster"], e["group"], e["topic"], e["partition"]),
    "client_fetch": lambda e: fetch.new_client_fetch(e["cluster"], e["group"], e["topic"], e["partition"]),
    "canary": lambda e: canary.new_canary(e["cluster"], e["topic"], e["partition"]),
    "client_produce": lambda e: produce.new_client_produce(e["cluster"], e["source"], e["topic"], e["partition"]),
    "broker": lambda e: broker.new_broker(e["cluster"], e.get("node_id") or 0),
    "group": lambda e: group.new_group(e["cluster"], e["group"]),
    "client": lambda e: client.new_client(e["cluster"], e["source"]),
    "source": lambda e: source.new_source(e["cluster"], e["source"]),
    "topic": lambda e: topic.new_topic(e["cluster"], e["topic"]),
    "quorum": lambda e: quorum.new_quorum(e["cluster"]),
    "log_dirs": lambda e: logdirs.new_log_dirs(e["cluster"], e.get("node_id") or 0),
    "transactions": lambda e: transactions.new_transactions(e["cluster"]),
    "ha": lambda e: ha.new_ha(e["cluster"], e.get("ha_group") or ""),
}


def new_entity(kind: str, r: dict) -> Any:
    """A new entity of ``kind`` (an unknown kind: a topic's) for row ``r``."""
    s = TEMPLATES.get(kind, TEMPLATES["topic"])(r)
    s["kind"] = kind
    s.setdefault("open", {})
    s.setdefault("last_seen", None)
    return s


def labels(s: dict) -> dict:
    """The labels of an entity's alerts and series."""
    kind = s["kind"]
    if kind == "broker" or kind == "log_dirs":
        return broker.broker_labels(s)
    if kind in ("partition", "canary"):
        return {"cluster": s["cluster"], "topic": s["topic"], "partition": s["partition"]}
    if kind == "client_produce":
        return {"cluster": s["cluster"], "source": s["source"], "topic": s["topic"], "partition": s["partition"]}
    if kind in ("group_partition", "client_fetch"):
        return {"cluster": s["cluster"], "group": s["group"], "topic": s["topic"], "partition": s["partition"]}
    if kind == "group":
        return {"cluster": s["cluster"], "group": s["group"]}
    if kind == "topic":
        return {"cluster": s["cluster"], "topic": s["topic"]}
    if kind == "quorum":
        return quorum.quorum_labels(s)
    if kind == "transactions":
        return {"cluster": s["cluster"]}
    return {"cluster": s["cluster"], "source": s["source"]}


class On(NamedTuple):
    """What a row of one event type does: ``rule(state, row, now, key)``, with the settings of
    ``family`` (a ``StateConfig`` field) as a fifth argument unless it is None; then
    ``writes(row, now, find, partition settings)``, unless None: the writes the row reports
    pending, noted on their partition (``partition.on_pending_writes``; ``find(key)``: the
    state's entity, or None)."""

    rule: Callable[..., list[Transition]]
    family: Optional[str] = None
    writes: Optional[Callable[..., list[Transition]]] = None


# the rows' own names for what a rule reads under another


def _group_state(s: dict, r: dict, t: int, key: str, cfg: group.GroupRulesConfig) -> list[Transition]:
    return group.on_group_state(s, {**r, "state": r["group_state"]}, t, key, cfg)


def _rebalance(s: dict, r: dict, t: int, key: str, cfg: group.GroupRulesConfig) -> list[Transition]:
    return group.on_rebalance(s, {**r, "reason": None}, t, key, cfg)


def _metadata_refresh(s: dict, r: dict, t: int, key: str, cfg: client.ClientRulesConfig) -> list[Transition]:
    return client.on_metadata_refresh(s, {**r, "reason": r["refresh_reason"]}, t, key, cfg)


def _partition_count_change(s: dict, r: dict, t: int, key: str,
                            cfg: partition_config.PartitionRulesConfig) -> list[Transition]:
    return topic.on_partition_count_change(
        s, {"topic": r["topic"], "old_count": r["old_count"], "new_count": r["new_count"],
            "unseen_for_at_most_ms": r["unseen_for_at_most_ms"], "source": r["source"], "seen_at": t},
        t, key, cfg)


def _canary_writes(r: dict, t: Optional[int], find: Callable[[str], Any],
                   cfg: partition_config.PartitionRulesConfig) -> list[Transition]:
    return partition.on_pending_writes(r, t, canary.pending_writes(r), report_int(r, "oldest_pending_ms"), find, cfg)


def _produce_writes(r: dict, t: Optional[int], find: Callable[[str], Any],
                    cfg: partition_config.PartitionRulesConfig) -> list[Transition]:
    return partition.on_pending_writes(r, t, produce.in_flight(r), None, find, cfg)


#: contract type -> its rule (the gone types are not here: the state function forgets)
EVENTS: dict[str, On] = {
    "partition_metadata": On(partition.on_partition_metadata, "partition"),
    "partition_offsets": On(partition.on_partition_offsets, "partition"),
    "group_offsets": On(lag.on_group_offsets, "lag"),
    "group_state": On(_group_state, "group"),
    "rebalance": On(_rebalance, "group"),
    "metadata_refresh": On(_metadata_refresh, "client"),
    "client_fetch": On(fetch.on_client_fetch),
    "broker_state": On(broker.on_broker_state),
    "canary": On(canary.on_canary, writes=_canary_writes),
    "client_produce": On(produce.on_client_produce, writes=_produce_writes),
    "heartbeat": On(source.on_heartbeat, "source"),
    "quorum_state": On(quorum.on_quorum_state, "quorum"),
    "log_dirs": On(logdirs.on_log_dirs, "log_dirs"),
    "transactions": On(transactions.on_transactions, "transactions"),
    "ha_member": On(ha.on_ha_member, "source"),
    "partition_count_change": On(_partition_count_change, "partition"),
}


class Due(NamedTuple):
    """A kind's timers: ``due_at(state, settings)``, when ``tick(state, now, key, settings)`` can
    next open or resolve something; ``family``: the settings (a ``StateConfig`` field)."""

    due_at: Callable[..., Optional[int]]
    tick: Callable[..., list[Transition]]
    family: str


#: the kinds whose time-driven checks depend on the entity's own events only: they are ticked
#: at the moments they fall due, not at a batch's end (``state.fold.catch_up``)
DUE = {"client": Due(client.client_due_at, client.tick_client, "client"),
       "source": Due(source.source_due_at, source.tick_source, "source"),
       "ha": Due(ha.ha_due_at, ha.tick_ha, "source")}
