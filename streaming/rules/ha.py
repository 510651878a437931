"""An HA group's coverage of its cluster (entity ``ha|<cluster>/ha:<group>``, labels ``cluster``
and ``source`` = ``ha:<group>``), from the ``ha_member`` event each probe of the group sends
after each observation cycle (docs/ha.md).  Settings in ``[job.rules.source]``.

- Per shard: its owner, the owner's epoch, its last observation and how many topics and groups it
  held.  A shard's owner changes when a member reports it with a larger epoch (a handover); a
  report with an older epoch (a member back from a pause, before it learns it lost the shard)
  changes nothing.
- **ShardUnobserved (warning)**: a shard's last observation is older than its owner's interval
  plus ``shard_unobserved_after_ms``, or a shard no member has reported since the group was first
  seen for as long.  The evidence names the shards, their last owner and what they held.
  Resolves when every shard is observed again.
- **SourceSilent (critical)** for the group, when no member has reported for ``silent_factor``
  intervals and ``silence_grace_ms``: the cluster is unwatched.  A member's own heartbeats say
  ``ha_group``, and its own SourceSilent and MetadataStale are not raised (the group's coverage
  judges it).  Resolves at the next member's report.
- Gauges: probes alive, shards per probe, shards unobserved, the last handover.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from streaming.rules.base import Alert, Transition, _open, _resolve
from streaming.rules.source import SourceRulesConfig

#: members remembered per group (the one heard from longest ago is forgotten past it)
MAX_MEMBERS = 64


def new_ha(cluster: str, group: str) -> dict:
    return {"cluster": cluster, "ha_group": group, "source": f"ha:{group}", "last_seen": None, "open": {},
            "shards": None, "since": None, "members": {}, "seen": {}, "handovers": 0, "last_handover_at": None,
            "report": None}


def ha_labels(state: dict) -> dict:
    return {"cluster": state["cluster"], "source": state["source"]}


def _ints(v: Any) -> list:
    return [x if isinstance(x, int) and not isinstance(x, bool) else None for x in v] if isinstance(v, list) else []


def _silent_limit(interval: int, cfg: SourceRulesConfig) -> int:
    return int(cfg.silent_factor * interval) + cfg.silence_grace_ms


def alive(state: dict, now: int, cfg: SourceRulesConfig) -> dict[str, list]:
    """The members heard from within their silence limit at ``now``."""
    return {m: v for m, v in state["members"].items() if now - v[0] <= _silent_limit(v[1], cfg)}


def on_ha_member(state: dict, r: dict[str, Any], now: int, entity: str,
                 cfg: SourceRulesConfig) -> list[Transition]:
    try:
        rep = json.loads(r.get("report") or "{}")
    except ValueError:
        rep = {}
    shards, interval = rep.get("shards"), r.get("interval_ms")
    if not isinstance(shards, int) or shards < 1 or not isinstance(interval, (int, float)):
        return []
    interval = int(interval)
    now = int(now)
    if state["since"] is None:
        state["since"] = now
    if state["shards"] != shards:  # the group's count changed (its topic made again): other shards
        state["seen"] = {s: v for s, v in state["seen"].items() if s < shards}
        state["shards"] = shards
    if state["last_seen"] is None or now > state["last_seen"]:
        state["last_seen"] = now
    member = r.get("source") or ""
    held, epochs, watched = _ints(rep.get("held")), _ints(rep.get("epochs")), _ints(rep.get("watched"))
    members = state["members"]
    old = members.get(member)
    if old is None or now >= old[0]:
        members[member] = [now, interval, 0, rep.get("handovers")]
    if len(members) > MAX_MEMBERS:
        del members[min(members, key=lambda m: (members[m][0], m))]
    seen = state["seen"]
    for i, (s, e) in enumerate(zip(held, epochs)):
        if s is None or e is None or not 0 <= s < shards:
            continue
        was = seen.get(s)
        if was is not None and (e < was[2] or (e == was[2] and now < was[0])):
            continue  # an older claim (a member back from a pause) or an older report
        if was is not None and e > was[2] and was[1] != member:
            state["handovers"] += 1
            state["last_handover_at"] = now
        seen[s] = [now, member, e, watched[i] if i < len(watched) else None, interval]
    if len(seen) > shards:
        state["seen"] = seen = {s: v for s, v in seen.items() if s < shards}
    for m in members:  # shards per member: those whose newest claim is its
        members[m][2] = 0
    for v in seen.values():
        if v[1] in members:
            members[v[1]][2] += 1
    out = _resolve(state, Alert.SOURCE_SILENT, entity, ha_labels(state), now, {"member": member})
    out += tick_ha(state, now, entity, cfg)
    state["report"] = ha_report(state, now, cfg)
    return out


def _unobserved(state: dict, now: int, cfg: SourceRulesConfig) -> list[dict]:
    out = []
    seen = state["seen"]
    for s in range(state["shards"] or 0):
        v = seen.get(s)
        if v is None:
            since = state["since"] or now
            if now - since > cfg.shard_unobserved_after_ms + _newest_interval(state):
                out.append({"shard": s, "owner": None, "last_observed_at": None, "held": None})
        elif now - v[0] > v[4] + cfg.shard_unobserved_after_ms:
            out.append({"shard": s, "owner": v[1], "epoch": v[2], "last_observed_at": v[0], "held": v[3]})
    return out


def _newest_interval(state: dict) -> int:
    newest = max(state["members"].values(), default=None, key=lambda v: v[0])
    return newest[1] if newest is not None else 0


def tick_ha(state: dict, now: int, entity: str, cfg: SourceRulesConfig) -> list[Transition]:
    now = int(now)
    labels = ha_labels(state)
    out: list[Transition] = []
    if state["shards"] is None:
        return out
    gone = _unobserved(state, now, cfg)
    if gone:
        out += _open(state, Alert.SHARD_UNOBSERVED, entity, labels, now, {
            "shards": gone[:64], "count": len(gone), "of": state["shards"],
            "held": sum(g["held"] or 0 for g in gone), "threshold_ms": cfg.shard_unobserved_after_ms,
            "probes": sorted(alive(state, now, cfg))})
    else:
        out += _resolve(state, Alert.SHARD_UNOBSERVED, entity, labels, now, {"of": state["shards"]})
    if state["members"] and not alive(state, now, cfg) and Alert.SOURCE_SILENT.value not in state["open"]:
        last = max(v[0] for v in state["members"].values())
        out += _open(state, Alert.SOURCE_SILENT, entity, labels, now, {
            "ha_group": state["ha_group"], "last_report_at": last, "silent_for_ms": now - last,
            "members": {m: v[0] for m, v in sorted(state["members"].items())}})
    return out


def ha_due_at(state: dict, cfg: SourceRulesConfig) -> Optional[int]:
    """Earliest time at which :func:`tick_ha` can open or resolve something without a new event."""
    if state["shards"] is None:
        return None
    due: list[int] = []
    if Alert.SHARD_UNOBSERVED.value not in state["open"]:
        seen = state["seen"]
        for s in range(state["shards"]):
            v = seen.get(s)
            due.append((state["since"] or 0) + cfg.shard_unobserved_after_ms + _newest_interval(state) + 1
                       if v is None else v[0] + v[4] + cfg.shard_unobserved_after_ms + 1)
    if state["members"] and Alert.SOURCE_SILENT.value not in state["open"]:
        due.append(max(v[0] + _silent_limit(v[1], cfg) for v in state["members"].values()) + 1)
    return min(due) if due else None


def ha_report(state: dict, now: Optional[int], cfg: SourceRulesConfig) -> str:
    """What the exporter shows of the group (its row's report)."""
    at = now if now is not None else state.get("last_seen") or 0
    live = alive(state, at, cfg) if state["shards"] is not None else {}
    return json.dumps({"shards": state["shards"], "probes": len(live),
                       "held": {m: v[2] for m, v in sorted(live.items())},
                       "unobserved": len(_unobserved(state, at, cfg)) if state["shards"] is not None else 0,
                       "last_handover_at": state["last_handover_at"], "handovers": state["handovers"]},
                      separators=(",", ":"))
