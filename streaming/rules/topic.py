"""Topic rules (entity cluster/topic, from the ``partition_count_change`` reports of every
client): PartitionCountChanged.  Settings in ``PartitionRulesConfig`` (``[job.rules.partition]``);
how it decides: docs/rules.md.
"""

from __future__ import annotations

from typing import Any, Optional

from streaming.rules.base import Alert, Transition, _resolve, alert_id
from streaming.rules.partition_config import DEFAULT_CONFIG, PartitionRulesConfig
from streaming.rules.writes import _int

_PCC = Alert.PARTITION_COUNT_CHANGED

# ---------------------------------------------------------------------------------------------
# Topic entity: PartitionCountChanged
# ---------------------------------------------------------------------------------------------


def new_topic(cluster: str, topic: str) -> dict:
    return {"kind": "topic", "cluster": cluster, "topic": topic, "partition_count": None,
            "changed_after": None, "changed_by": None, "episode": None, "last_since": None,
            "last_seen": None, "open": {}}


def topic_labels(state: dict) -> dict[str, Any]:
    return {"cluster": state["cluster"], "topic": state["topic"]}


def on_partition_count_change(state: dict, change: dict, now: int, entity: str,
                              cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """One client (``change["source"]``) saw the topic's partition count change from
    ``old_count`` to ``new_count`` in a refresh at ``seen_at`` (default ``now``);
    ``unseen_for_at_most_ms`` bounds how long before that the change happened (may be None)."""
    old, new = int(change["old_count"]), int(change["new_count"])
    source = str(change.get("source"))
    seen_at = _int(change.get("seen_at"))
    seen_at = now if seen_at is None else seen_at
    unseen = _int(change.get("unseen_for_at_most_ms"))
    state["last_seen"] = now if state["last_seen"] is None else max(state["last_seen"], now)
    if old == new:
        return []
    labels = topic_labels(state)
    current = state["partition_count"]
    ep = state["episode"]
    out: list[Transition] = []

    if current is not None and new == current:
        if ep is not None:
            _add_client(ep, state, source, seen_at, old, unseen, cfg)
            return []
        # a client caught up after the episode closed: it ran stale for longer than the window
        return _open_count_episode(state, now, entity, labels, cfg, old, new, source, seen_at, old, unseen,
                                   late=True)

    is_new_change = current is None or new > current or old == current
    if not is_new_change:  # a late report of an earlier change: this client is still stale
        if ep is not None:
            ep["stale_reports"] += 1
        return []

    if ep is not None:
        out += _resolve_count_episode(state, now, entity, labels, {
            "reason": "superseded", "superseded_by": {"old_count": current, "new_count": new}})
    state.update(partition_count=new, changed_after=None, changed_by=None)
    out += _open_count_episode(state, now, entity, labels, cfg, current if current is not None else old,
                               new, source, seen_at, old, unseen, late=False)
    return out


def _bound(state: dict, seen_at: int, unseen: Optional[int]) -> None:
    """The change happened in (seen_at - unseen, seen_at] for every reporting client."""
    state["changed_by"] = seen_at if state["changed_by"] is None else min(state["changed_by"], seen_at)
    if unseen is not None:
        lo = seen_at - unseen
        state["changed_after"] = lo if state["changed_after"] is None else max(state["changed_after"], lo)


def _add_client(ep: dict, state: dict, source: str, seen_at: int, old: int, unseen: Optional[int],
                cfg: PartitionRulesConfig) -> None:
    if any(c[0] == source for c in ep["clients"]):
        return  # a replay, or a client reporting twice: its first catch-up is the one that counts
    _bound(state, seen_at, unseen)
    if len(ep["clients"]) < cfg.count_change_clients_max:
        ep["clients"].append([source, seen_at, old, unseen])
    else:
        ep["clients_not_listed"] += 1  # not de-duplicated: may count a replayed report twice


def _open_count_episode(state: dict, now: int, entity: str, labels: dict, cfg: PartitionRulesConfig,
                        old_count: int, new_count: int, source: str, seen_at: int, client_old: int,
                        unseen: Optional[int], late: bool) -> list[Transition]:
    state["episode"] = {"old_count": old_count, "new_count": new_count, "late_catch_up": late,
                        "clients": [], "clients_not_listed": 0, "stale_reports": 0}
    _add_client(state["episode"], state, source, seen_at, client_old, unseen, cfg)
    # ids are alert|entity|since: keep ``since`` strictly increasing per topic so two episodes
    # opened in the same millisecond (two changes in one batch) never share an id
    since = now if state["last_since"] is None or now > state["last_since"] else state["last_since"] + 1
    state["last_since"] = since
    evidence = {"old_count": old_count, "new_count": new_count, "first_seen_by": source,
                "first_seen_at": seen_at, "unseen_for_at_most_ms": unseen, "late_catch_up": late,
                "changed_by": state["changed_by"], "changed_after": state["changed_after"]}
    aid = alert_id(_PCC, entity, since)
    state["open"][_PCC.value] = {"id": aid, "since": since, "evidence": evidence}
    return [Transition(_PCC, "open", aid, now, entity, labels, evidence)]


def _bounds_consistent(state: dict) -> bool:
    """False when no instant fits every client's (seen_at - unseen, seen_at]: clients' clocks
    disagree, or a client refreshed from a broker whose metadata cache still had the old count
    after another client had seen the new one.  Then no "at most" is claimed."""
    by, after = state["changed_by"], state["changed_after"]
    return after is None or by is None or after < by


def _client_evidence(state: dict, c: list) -> dict:
    source, seen_at, old, unseen = c
    by, after = state["changed_by"], state["changed_after"]
    at_least = max(0, seen_at - by) if by is not None else None
    at_most = seen_at - after if after is not None and _bounds_consistent(state) else None
    return {"source": source, "seen_at": seen_at, "old_count": old, "unseen_for_at_most_ms": unseen,
            "stale_for_at_least_ms": at_least, "stale_for_at_most_ms": at_most}


def _resolve_count_episode(state: dict, now: int, entity: str, labels: dict, extra: dict) -> list[Transition]:
    ep = state["episode"]
    state["episode"] = None
    clients = [_client_evidence(state, c) for c in ep["clients"]]
    return _resolve(state, _PCC, entity, labels, now,
                    {"old_count": ep["old_count"], "new_count": ep["new_count"], "late_catch_up": ep["late_catch_up"],
                     "changed_after": state["changed_after"], "changed_by": state["changed_by"],
                     "bounds_consistent": _bounds_consistent(state), "clients": clients,
                     "clients_reported": len(clients) + ep["clients_not_listed"],
                     "clients_not_listed": ep["clients_not_listed"],
                     "stale_reports_of_earlier_changes": ep["stale_reports"], **extra})


def tick_topic(state: dict, now: int, entity: str, cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Resolve PartitionCountChanged ``count_change_window_ms`` after it opened.  O(1)."""
    if state.get("episode") is None:
        return []
    opened = state["open"].get(_PCC.value)
    if opened is None:  # resolved elsewhere (rules.evict): drop the episode
        state["episode"] = None
        return []
    if now - opened["since"] < cfg.count_change_window_ms:
        return []
    return _resolve_count_episode(state, now, entity, topic_labels(state),
                                  {"reason": "window elapsed", "window_ms": cfg.count_change_window_ms})
