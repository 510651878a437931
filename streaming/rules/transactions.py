"""A cluster's open transactions (entity ``transactions|<cluster>``), from ``transactions`` events
(ListTransactions, DescribeTransactions and DescribeProducers, asked by the unshared probe or
share 1 of n every ``probe.transactions_interval_s``; monitor/transactions.py).  Reasoning:
docs/transactions.md.

- **HangingTransaction (critical)**, labels {cluster}: open while a transaction is hanging:
  - open for ``hanging_after_ms`` or longer (``tripped`` "age"); Kafka's own limit,
    transaction.max.timeout.ms, is 15 minutes, and producers default to 1 minute;
  - older than its own transaction.timeout.ms by ``timeout_grace_ms`` (``tripped`` "timeout"):
    its coordinator should have aborted it;
  - a producer with a transaction open on a partition (DescribeProducers) that no coordinator
    lists, at the same first offset for ``unknown_after_ms`` since the job first saw it so
    (``tripped`` "unknown_to_coordinator"): KIP-664's hanging transaction, which holds the
    partition's LSO until an operator aborts it.  Its own setting, longer than Kafka's
    transaction.max.timeout.ms (15 min): ListTransactions leaves out, silently, the ids the
    probe's user may not DESCRIBE, and a transaction of one of those ends within that limit.  Judged only on an answer that listed every broker and was not
    cut, and only for the partitions of the listed transactions (what DescribeProducers is
    asked for).
  The evidence names each (at most EVIDENCE_MAX): transactional id, producer, age, timeout, its
  partitions and, per partition it holds, the first offset, the LSO and HW the probe saw and the
  records held back.  A hanging transaction that joins an open alert resolves it and opens a new
  one naming all (so it is announced); one that ends leaves the alert open while others hang.
  Resolves when none is.  An answer that failed (``ok`` false) changes nothing.

The entity's report (the exporter's gauges): transactions open, hanging, the oldest's age and the
partitions held.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from streaming.rules.base import Alert, Transition, _open, _resolve
from streaming.rules.group import check_settings

#: hanging transactions named in an alert's evidence, partitions named per transaction
EVIDENCE_MAX, EVIDENCE_PARTITIONS = 20, 20
#: producers kept under watch for holding a partition unknown to their coordinator
MAX_ORPHANS = 1000


@dataclass(frozen=True)
class TransactionRulesConfig:
    """``[job.rules.transactions]``."""

    #: HangingTransaction once a transaction is open this long (5 min)
    hanging_after_ms: int = 300_000
    #: or once it is older than its own timeout by this much (the coordinator aborts expired
    #: transactions every 10 s by default)
    timeout_grace_ms: int = 30_000
    #: or once a producer has held a partition at one first offset this long with no coordinator
    #: listing it (16 min: past Kafka's default transaction.max.timeout.ms, 15 min)
    unknown_after_ms: int = 960_000

    def __post_init__(self) -> None:
        check_settings(self, ("hanging_after_ms", "unknown_after_ms"))
        if self.timeout_grace_ms < 0:
            raise ValueError(f"TransactionRulesConfig.timeout_grace_ms: must be >= 0, got {self.timeout_grace_ms!r}")


DEFAULT_CONFIG = TransactionRulesConfig()


def new_transactions(cluster: str) -> dict:
    return {"cluster": cluster, "last_seen": None, "open": {}, "observed_at": None, "report": None,
            "orphans": {}, "hanging": []}


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _report(ev: dict[str, Any]) -> Optional[dict]:
    try:
        rep = json.loads(ev.get("report") or "{}")
    except ValueError:
        return None
    return rep if isinstance(rep, dict) else None


def _held(h: dict) -> dict:
    lso, hw = _int(h.get("last_stable_offset")), _int(h.get("high_watermark"))
    return {"partition": f"{h['topic']}-{h['partition']}", "first_offset": h.get("first_offset"),
            "last_stable_offset": lso, "high_watermark": hw,
            "held_back": max(0, hw - lso) if lso is not None and hw is not None else None}


def hanging(rep: dict, state: dict, now: int, cfg: TransactionRulesConfig) -> list[dict]:
    """The hanging transactions of one answer, the oldest first (``state["orphans"]`` updated)."""
    txns = [t for t in rep.get("transactions") or [] if isinstance(t, dict)]
    held = [h for h in rep.get("held_partitions") or [] if isinstance(h, dict)]
    held_by: dict[int, list[dict]] = {}
    for h in held:
        held_by.setdefault(h["producer_id"], []).append(h)
    out = []
    for t in txns:
        age, timeout = _int(t.get("started_ms_ago")), _int(t.get("timeout_ms"))
        if age is None:
            continue  # not described: its age is not known
        tripped = ("age" if age >= cfg.hanging_after_ms else
                   "timeout" if timeout is not None and age >= timeout + cfg.timeout_grace_ms else None)
        if tripped is None:
            continue
        mine = held_by.get(t["producer_id"], [])
        out.append({"transactional_id": t["transactional_id"], "producer_id": t["producer_id"],
                    "producer_epoch": t.get("producer_epoch"), "state": t.get("state"),
                    "coordinator": t.get("coordinator"), "age_ms": age, "timeout_ms": timeout, "tripped": tripped,
                    "partitions": list(t.get("partitions") or [])[:EVIDENCE_PARTITIONS],
                    "partitions_count": t.get("partitions_count"),
                    "held": [_held(h) for h in mine[:EVIDENCE_PARTITIONS]]})
    # producers holding a partition that no listed transaction has
    complete = (not rep.get("unlisted_brokers") and rep.get("transactions_count") == len(txns)
                and rep.get("held_partitions_count") == len(held))
    orphans: dict[str, int] = state["orphans"]
    if complete:
        listed = {t["producer_id"] for t in txns}
        seen: dict[str, int] = {}
        for pid, hs in held_by.items():
            if pid in listed:
                continue
            for h in hs:
                key = f"{pid}/{h['topic']}-{h['partition']}/{h.get('first_offset')}"
                seen[key] = orphans.get(key, now)
        state["orphans"] = orphans = dict(sorted(seen.items(), key=lambda kv: kv[1])[:MAX_ORPHANS])
        late: dict[int, list[int]] = {}
        for key, since in orphans.items():
            if now - since >= cfg.unknown_after_ms:
                late.setdefault(int(key.split("/", 1)[0]), []).append(since)
        for pid, sinces in late.items():
            mine = held_by[pid]
            out.append({"transactional_id": None, "producer_id": pid,
                        "producer_epoch": mine[0].get("producer_epoch"), "state": None, "coordinator": None,
                        "age_ms": now - min(sinces), "timeout_ms": None, "tripped": "unknown_to_coordinator",
                        "partitions": [f"{h['topic']}-{h['partition']}" for h in mine[:EVIDENCE_PARTITIONS]],
                        "partitions_count": len(mine), "held": [_held(h) for h in mine[:EVIDENCE_PARTITIONS]]})
    out.sort(key=lambda x: -x["age_ms"])
    return out


def _key(t: dict) -> str:
    return f"{t['transactional_id']}/{t['producer_id']}"


def on_transactions(state: dict, ev: dict[str, Any], now: int, entity: str,
                    cfg: TransactionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    if state["observed_at"] is not None and now < state["observed_at"]:
        return []  # older than what the entity shows
    state["observed_at"] = now
    rep = _report(ev)
    if rep is None or not rep.get("ok"):
        return []  # not knowing is not recovering
    found = hanging(rep, state, now, cfg)
    txns = [t for t in rep.get("transactions") or [] if isinstance(t, dict)]
    ages = [_int(t.get("started_ms_ago")) for t in txns]
    state["report"] = json.dumps({
        "open": _int(rep.get("transactions_count")) or len(txns), "hanging": len(found),
        "oldest_age_ms": max([a for a in ages if a is not None], default=0),
        "held_partitions": len({(h.get("topic"), h.get("partition")) for h in rep.get("held_partitions") or []
                                if isinstance(h, dict)}),
        "unlisted_brokers": rep.get("unlisted_brokers") or []}, separators=(",", ":"))
    labels = {"cluster": state["cluster"]}
    keys = [_key(t) for t in found]
    out: list[Transition] = []
    name = Alert.HANGING_TRANSACTION.value
    if found and name in state["open"] and not set(keys) <= set(state["hanging"]):
        out += _resolve(state, Alert.HANGING_TRANSACTION, entity, labels, now,
                        {"reason": "more transactions hanging: reopened naming all", "hanging_count": len(found)})
    if found:
        if name not in state["open"]:
            state["hanging"] = keys[:MAX_ORPHANS]
        else:  # the ones that ended leave; the alert stays open
            state["hanging"] = [k for k in state["hanging"] if k in set(keys)]
        out += _open(state, Alert.HANGING_TRANSACTION, entity, labels, now,
                     {"transactions": found[:EVIDENCE_MAX], "hanging_count": len(found),
                      "hanging_after_ms": cfg.hanging_after_ms, "timeout_grace_ms": cfg.timeout_grace_ms,
                      "unknown_after_ms": cfg.unknown_after_ms})
    else:
        state["hanging"] = []
        out += _resolve(state, Alert.HANGING_TRANSACTION, entity, labels, now,
                        {"open_transactions": len(txns), "hanging_count": 0})
    return out
