"""The ``applyInPandasWithState`` function and the layout of the state.

Grouping keys are *buckets*, not entities: every entity (a partition, a group's partition, a
source) is hashed into one of ``buckets`` keys, and one key's state holds the states of all its
entities (JSON in one string column).  Spark pays a fixed cost per grouping key and
micro-batch (a pandas frame and a Python call each, about 1.5-2.5 ms on 2 cores), so with one
key per partition 10,000 partitions cost 15-25 s per batch; with buckets that cost is fixed and
the work inside follows the number of rows that arrived.  Bucket ``-1`` carries the rows the
parser quarantined; it keeps no state and turns them into counted ``quarantine`` rows.

The function stays thin: handle the timeout first, unpack the state, call the pure rules in
``streaming.rules`` in event order, write the state back, set the timeout.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

import pandas as pd

from streaming import rules

QUARANTINE_BUCKET = -1

#: the rows the state function emits (one schema for gauges, removals, alerts and quarantine)
OUTPUT_COLUMNS: list[tuple[str, str]] = [
    ("kind", "string"),          # partition | group_partition | source | alert | quarantine
    ("action", "string"),        # upsert | remove | open | resolve | count
    ("cluster", "string"),
    ("topic", "string"),
    ("partition", "long"),
    ("consumer_group", "string"),
    ("source", "string"),
    ("leader", "long"),
    ("replicas", "long"),
    ("isr", "long"),
    ("high_watermark", "long"),
    ("log_start_offset", "long"),
    ("last_stable_offset", "long"),
    ("committed_offset", "long"),
    ("lag", "long"),
    ("alert", "string"),
    ("alert_id", "string"),
    ("severity", "string"),
    ("evidence", "string"),
    ("at", "long"),
    ("count", "long"),
    ("interval_ms", "long"),
]
OUTPUT_SCHEMA = ", ".join(f"{n} {t}" for n, t in OUTPUT_COLUMNS)
STATE_SCHEMA = "entities string"
_INT_COLS = [n for n, t in OUTPUT_COLUMNS if t == "long"]


def _row(**kw: Any) -> dict:
    return {n: kw.get(n) for n, _ in OUTPUT_COLUMNS}


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=[n for n, _ in OUTPUT_COLUMNS])
    for c in _INT_COLS:
        df[c] = df[c].astype("Int64")
    for n, t in OUTPUT_COLUMNS:
        if t == "string":
            df[n] = df[n].astype(object)
    return df


def _opt(v: Any) -> Any:
    """pandas/numpy missing values -> None, numpy scalars -> Python scalars."""
    if v is None:
        return None
    if isinstance(v, float) and v != v:
        return None
    if v is pd.NA:
        return None
    if hasattr(v, "item") and not hasattr(v, "__len__"):
        return v.item()
    return v


def _transition_row(t: rules.Transition) -> dict:
    lab = t.labels
    return _row(kind="alert", action=t.action, cluster=lab.get("cluster"), topic=lab.get("topic"),
                partition=lab.get("partition"), consumer_group=lab.get("group"), alert=t.alert.value,
                alert_id=t.alert_id, severity=t.severity.name.lower(),
                evidence=json.dumps(t.evidence, sort_keys=True, default=str), at=t.at)


def _entity_row(kind: str, s: dict, action: str = "upsert") -> dict:
    if kind == "partition":
        return _row(kind=kind, action=action, cluster=s["cluster"], topic=s["topic"], partition=s["partition"],
                    leader=s["leader"], replicas=None if s["replicas"] is None else len(s["replicas"]),
                    isr=None if s["isr"] is None else len(s["isr"]), high_watermark=s["hw"],
                    log_start_offset=s["log_start"], last_stable_offset=s["lso"], at=s["last_seen"])
    if kind == "group_partition":
        return _row(kind=kind, action=action, cluster=s["cluster"], topic=s["topic"], partition=s["partition"],
                    consumer_group=s["group"], committed_offset=s["committed"], high_watermark=s["hw"],
                    lag=s["lag"], at=s["last_seen"])
    return _row(kind=kind, action=action, cluster=s["cluster"], source=s["source"], at=s["last_seen"],
                count=s.get("events_dropped"), interval_ms=s.get("interval_ms"))


def _labels(kind: str, s: dict) -> dict:
    if kind == "group_partition":
        return {"cluster": s["cluster"], "group": s["group"], "topic": s["topic"], "partition": s["partition"]}
    if kind == "source":
        return {"cluster": s["cluster"], "source": s["source"]}
    return rules.partition_labels(s)


def fold(entities: dict[str, dict], rows: pd.DataFrame, now: int) -> tuple[list[dict], set[str]]:
    """Apply the batch's rows (in event order) to the entities; return (alert rows, touched keys)."""
    out: list[dict] = []
    touched: set[str] = set()
    rows = rows.sort_values(["observed_at", "seq"], kind="stable")
    for r in rows.to_dict("records"):
        r = {k: _opt(v) for k, v in r.items()}
        etype, key, t = r["type"], r["entity"], r["observed_at"]
        if etype in ("partition_metadata", "partition_offsets"):
            s = entities.get(key) or rules.new_partition(r["cluster"], r["topic"], r["partition"])
            s.setdefault("kind", "partition")
            if etype == "partition_metadata":
                out += [_transition_row(x) for x in rules.on_partition_metadata(s, r, t, key)]
            else:
                rules.on_partition_offsets(s, r, t)
        elif etype == "group_offsets":
            s = entities.get(key) or rules.new_group_partition(r["cluster"], r["group"], r["topic"], r["partition"])
            s.setdefault("kind", "group_partition")
            rules.on_group_offsets(s, r, t)
        elif etype == "heartbeat":
            s = entities.get(key) or {"kind": "source", "cluster": r["cluster"], "source": r["source"], "open": {}}
            s.update(last_seen=t, interval_ms=r.get("interval_ms"), events_dropped=r.get("events_dropped"))
        else:
            continue
        entities[key] = s
        touched.add(key)
    return out, touched


def evict_stale(entities: dict[str, dict], now: int, ttl_ms: int) -> list[dict]:
    out = []
    for key in list(entities):
        s = entities[key]
        kind = s["kind"]
        gone = rules.evict(s, now, ttl_ms, key, _labels(kind, s))
        if gone is not None:
            out += [_transition_row(x) for x in gone]
            out.append(_entity_row(kind, s, action="remove"))
            del entities[key]
    return out


def quarantine_rows(rows: pd.DataFrame) -> list[dict]:
    out = []
    for reason, grp in rows.groupby("reason", dropna=False):
        sample = str(grp["raw"].iloc[0])[:300] if "raw" in grp else ""
        out.append(_row(kind="quarantine", action="count", evidence=json.dumps({"reason": reason, "sample": sample}),
                        alert=str(reason), count=len(grp), at=int(grp["observed_at"].max()) if grp["observed_at"].notna().any() else None))
    return out


def make_state_function(ttl_ms: int, clock=time.time):
    """The function handed to ``applyInPandasWithState`` (a closure over its settings)."""

    def update_bucket(key: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        bucket = int(key[0])
        if state.hasTimedOut:
            entities = json.loads(state.get[0]) if state.exists else {}
            out = evict_stale(entities, int(clock() * 1000), ttl_ms)
            _store(state, entities, ttl_ms)
            if out:
                yield _frame(out)
            return
        rows = pd.concat(list(pdfs), ignore_index=True)
        if bucket == QUARANTINE_BUCKET:
            yield _frame(quarantine_rows(rows))
            return
        entities = json.loads(state.get[0]) if state.exists else {}
        now = int(rows["observed_at"].max())
        out, touched = fold(entities, rows, now)
        out += [_entity_row(entities[k]["kind"], entities[k]) for k in sorted(touched)]
        out += evict_stale(entities, now, ttl_ms)
        _store(state, entities, ttl_ms)
        yield _frame(out)

    return update_bucket


def _store(state: Any, entities: dict, ttl_ms: int) -> None:
    if entities:
        state.update((json.dumps(entities, separators=(",", ":")),))
        state.setTimeoutDuration(ttl_ms)
    else:
        state.remove()
