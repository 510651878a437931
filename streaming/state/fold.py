"""The rules over a bucket's entities, one observation at a time: ``admit`` each once and in
order, ``fold`` it through its rule (``streaming.rules.dispatch``), ``forget`` what a gone
event names; the time-driven checks (``tick``, ``catch_up``) and the TTL (``evict_stale``).
The quiet and new partitions' rows go the column way first (``columns``).  docs/state.md.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import pandas as pd

from monitor.contract import LIVENESS_TYPES
from streaming.rules import base as rules
from streaming.rules import group as rules_group
from streaming.rules import partition as rules_partition
from streaming.rules import topic as rules_topic
from streaming.rules.dispatch import DUE, EVENTS, labels, new_entity
from streaming.state.rows import REMOVED_REASONS, _TEXT_COLUMNS, _column, _entity_row
from streaming.state.table import NULL
from streaming.state.table import event_keys as table_event_keys

if TYPE_CHECKING:
    from streaming.state.config import StateConfig

#: event ids remembered per (entity, type, source) at its latest event time
DEDUP_IDS = 16
#: sources remembered per (entity, type): a probe's source is ``probe-<hostname>``, so every
#: restart of a probe pod adds one; past this many the one that reported longest ago is forgotten
MAX_SOURCES = 8


def admit(s: dict, etype: str, source: Optional[str], t: int, event_id: Optional[int]) -> Optional[str]:
    """Whether an observation may be applied to entity state ``s``: None, or why it is dropped.
    ``event_id``: the event id's key (``table.event_keys``), or None.

    ``duplicate``: an event with this ``event_id`` was already applied (a producer retry, a
    replayed probe).  ``out_of_order``: older than the last observation of the same type from
    the same source already applied — applying it would move the entity back in time.  Both are
    decided per entity, type and source with O(1) memory: the latest event time and the ids
    seen at exactly that time, so a replay of an older event counts as ``out_of_order``.  This
    is stricter than a watermark: the entity's own latest observation is the watermark.
    (Different sources are independent: their clocks may differ.)  At most ``MAX_SOURCES``
    sources are remembered per type; a forgotten one (the one whose last event is the oldest,
    in practice a probe replaced long ago) is a new source again if it ever reports."""
    applied = s.setdefault("applied", {})
    k = (etype, source)
    last = applied.get(k)
    if last is None and len(applied) >= MAX_SOURCES:
        same = [x for x in applied if x[0] == etype]
        if len(same) >= MAX_SOURCES:
            del applied[min(same, key=lambda x: (applied[x][0], str(x[1])))]
    if last is not None:
        lt, ids = last
        seen = event_id is not None and event_id in ids
        if t < lt:
            return "duplicate" if seen else "out_of_order"
        if t == lt:
            if seen:
                return "duplicate"
            if len(ids) < DEDUP_IDS:
                ids.append(event_id)
            return None
    applied[k] = (t, [event_id])
    return None


#: columns of the input the rules never read (the quarantine path reads raw and reason)
_NOT_READ = frozenset({"raw", "raw_bytes", "reason", "bucket_key", "bucket"})


def _all_null(col: pd.Series) -> bool:
    """``col.isna().all()`` on its numpy values (a Series' isna costs ~20 us a call, ~70 calls
    a bucket)."""
    a = col.to_numpy()
    if a.dtype.kind == "f":
        return bool(np.isnan(a).all())
    if a.dtype.kind in "iub":
        return len(a) == 0
    return bool(pd.isna(a).all())


def _columns(frames: list[pd.DataFrame], names: list[str]) -> dict[str, list]:
    """Each column of the frames with a value in some row as one list of Python values; the
    columns left out are all null (most are: a row holds its own type's fields).  No
    ``pd.concat``: with columns that are all null in some frames it checks them value by
    value, ~0.4 s per bucket."""
    out: dict[str, list] = {}
    for c in names:
        series = [f[c] for f in frames]
        nulls = [_all_null(s) for s in series]
        if all(nulls):
            continue
        values: list = []
        for s, null in zip(series, nulls):
            values += [None] * len(s) if null else _column(s, text=c in _TEXT_COLUMNS)
        out[c] = values
    return out


def _ints(col: pd.Series) -> np.ndarray:
    """An integer column as int64 with ``NULL`` for missing values (Spark hands nullable longs
    over as float64 with NaN; hand-made frames may hold objects)."""
    kind = col.dtype.kind
    if kind in "iu":
        return col.to_numpy(np.int64)
    missing = col.isna().to_numpy()
    if kind == "f":
        out = np.where(missing, 0, col.to_numpy()).astype(np.int64)
    else:
        out = np.zeros(len(col), np.int64)
        out[~missing] = [int(v) for v in col.to_numpy(dtype=object)[~missing]]
    out[missing] = NULL
    return out


#: the contract's types that say an entity is gone -> the reason its alerts resolve with
GONE = {"partition_gone": "topic deleted", "group_gone": "group deleted",
        "group_partition_gone": "committed offset deleted"}

def _gone_with(entities: dict[str, Any], key: str, etype: str, r: dict) -> list[str]:
    """The keys a gone event takes away with its entity (in this bucket, which holds them): a
    deleted partition's producer entities; a deleted group's partitions and consumers."""
    cl = r["cluster"]
    if etype == "partition_gone":
        topic, part = r["topic"], r["partition"]
        return [k for k, v in entities.items() if k != key and v["kind"] == "client_produce"
                and v["cluster"] == cl and v["topic"] == topic and v["partition"] == part]
    if etype == "group_gone":
        group = r["group"]
        return [k for k, v in entities.items() if v["kind"] in ("group_partition", "client_fetch")
                and v["cluster"] == cl and v["group"] == group]
    return []


def forget(entities: dict[str, Any], key: str, etype: str, r: dict,
           t: int) -> tuple[list[rules.Transition], list[tuple[str, dict]], set[str]]:
    """A gone event (``GONE``) at ``t``: the entity ``key`` and what goes with it (``_gone_with``)
    resolve their open alerts with the reason, and leave ``entities``.  One observed after ``t``
    (the topic or group re-created since) stays.  Returns (transitions, their remove rows,
    the keys dropped)."""
    reason = GONE[etype]
    out: list[rules.Transition] = []
    rows: list[tuple[str, dict]] = []
    keys: set[str] = set()
    for k in [key] + _gone_with(entities, key, etype, r):
        v = entities.get(k)
        if v is None or (v.get("last_seen") is not None and v["last_seen"] > t):
            continue
        out += rules.gone(v, t, k, labels(v), reason)
        rows.append((k, _entity_row(v, action="remove") | {"evidence": REMOVED_REASONS[reason]}))
        del entities[k]
        keys.add(k)
    return out, rows, keys


def fold(entities: dict[str, Any], rows: Any, cfg: StateConfig,
         dropped: Optional[dict[str, int]] = None,
         take: Optional[Callable[[str], Any]] = None,
         removed: Optional[list[tuple[str, dict]]] = None) -> tuple[list[rules.Transition], set[str]]:
    """Apply the batch's rows (a frame, or a list of frames; in event order) to the entities;
    return (transitions, touched keys).  Rows ``admit`` refuses are counted in ``dropped`` by
    reason.  ``take(key)``: an entity kept outside ``entities`` (``PartitionTable.take``), or
    None.  A gone event's entities (``forget``) leave ``entities``; their remove rows go to
    ``removed`` with their keys."""
    out: list[rules.Transition] = []
    touched: set[str] = set()

    def find(k: str) -> Any:
        """The entity ``k``, taken into ``entities`` from the table if it is there; or None."""
        got = entities.get(k)
        if got is None and take is not None and (got := take(k)) is not None:
            entities[k] = got
        return got

    frames = [rows] if isinstance(rows, pd.DataFrame) else [f for f in rows if len(f)]
    if not frames:
        return out, touched
    names = [c for c in frames[0].columns if c not in _NOT_READ]
    cols = _columns(frames, names)
    for c in ("observed_at", "seq"):
        cols.setdefault(c, [None] * sum(len(f) for f in frames))
    if "event_id" in cols:  # admit remembers an event id by its key (table.event_keys)
        cols["event_id"] = [None if k == NULL else k for k in table_event_keys(cols["event_id"]).tolist()]
    obs, seq = cols["observed_at"], cols["seq"]
    try:
        order = sorted(range(len(obs)), key=lambda i: (obs[i], seq[i]))
    except TypeError:  # a null (only hand-made rows have one: the gate refuses them): nulls last
        order = sorted(range(len(obs)), key=lambda i: (obs[i] is None, obs[i] or 0, seq[i] is None, seq[i] or 0))
    if order != list(range(len(order))):
        pick = operator.itemgetter(*order)
        cols = {c: list(pick(v)) if len(order) > 1 else v for c, v in cols.items()}
    used = [c for c in names if c in cols]
    blank: dict[str, Any] = dict.fromkeys(names)  # each row: every column, None where it is null
    for values in zip(*(cols[c] for c in used)):
        r = blank.copy()
        r.update(zip(used, values))
        key, etype, t = r["entity"], r["type"], r["observed_at"]
        kind = key.split("|", 1)[0]
        s: Any = find(key)
        if etype in GONE:  # not admitted: a repeat finds nothing left to forget
            if t is not None:
                gone, rows, keys = forget(entities, key, etype, r, int(t))
                out += gone
                touched -= keys
                if removed is not None:
                    removed += rows
            continue
        if s is None:
            s = new_entity(kind, r)
        why = admit(s, etype, r["source"], t, r.get("event_id"))
        if why is not None:
            # a liveness event comes twice by design (monitor/emitter.py): its copy is no loss
            if dropped is not None and not (why == "duplicate" and etype in LIVENESS_TYPES):
                dropped[why] = dropped.get(why, 0) + 1
            continue
        if kind in DUE and t is not None:
            out += catch_up(s, key, int(t) - 1, cfg)  # what expired before this event
        on = EVENTS.get(etype)
        if on is None:
            continue
        out += on.rule(s, r, t, key) if on.family is None else on.rule(s, r, t, key, getattr(cfg, on.family))
        if on.writes is not None:
            out += on.writes(r, t, find, cfg.partition)
        if s.get("last_seen") is None or (t is not None and t > s["last_seen"]):
            s["last_seen"] = t
        entities[key] = s
        touched.add(key)
    return out, touched


def catch_up(s: dict, key: str, until: int, cfg: StateConfig) -> list[rules.Transition]:
    """The time-driven checks of a client or source entity at each moment one falls due, up to
    ``until``: a timer that expired opens its alert stamped with when it expired, whatever the
    micro-batch boundaries (before a new event of the entity at t, ``until`` is t - 1; at a
    batch's end, the batch's time).  A job that read the same events in other batches, after a
    restart or a replay, raises the same transitions."""
    timers = DUE[s["kind"]]
    settings = getattr(cfg, timers.family)
    out: list[rules.Transition] = []
    for _ in range(8):  # each tick settles what fell due; a few suffice (bounded all the same)
        due = timers.due_at(s, settings)
        if due is None or due > until:
            break
        got = timers.tick(s, due, key, settings)
        out += got
        if not got:
            break
    return out


def tick(entities: dict[str, Any], now: int, cfg: StateConfig,
         at_rest: Optional[dict[tuple[str, str], int]] = None) -> list[rules.Transition]:
    """The time-driven checks of every entity in the bucket (cheap when nothing is due).
    ``at_rest``: (cluster, group) -> its partitions at rest in columns (``idle_groups``): each
    has lag 0 and no lag start."""
    out: list[rules.Transition] = []
    lags: dict[tuple[str, str], list[Optional[int]]] = {g: [0] * n for g, n in (at_rest or {}).items()}
    lag_from: dict[tuple[str, str], list[Optional[int]]] = {g: [None] * n for g, n in (at_rest or {}).items()}
    for s in entities.values():
        if s["kind"] == "group_partition":
            lags.setdefault((s["cluster"], s["group"]), []).append(s.get("lag"))
            lag_from.setdefault((s["cluster"], s["group"]), []).append(s.get("lag_from"))
    for key, s in entities.items():
        kind = s["kind"]
        if kind == "partition":
            out += rules_partition.tick_partition(s, now, key, cfg.partition)
        elif kind == "topic":
            out += rules_topic.tick_topic(s, now, key, cfg.partition)
        elif kind == "group":
            due = rules_group.group_due_at(s, cfg.group)  # None: no timer runs, tick_group would do nothing
            if due is not None and due <= now:
                g = (s["cluster"], s["group"])
                out += rules_group.tick_group(s, now, key, cfg.group, lags.get(g, []), lag_from.get(g, []))
        elif kind in DUE:
            out += catch_up(s, key, now, cfg)
    return out


def evict_stale(entities: dict[str, Any], now: int, ttl_ms: int) -> tuple[list[rules.Transition], list[dict]]:
    """Drop the entities not seen for ``ttl_ms``: (their alerts' resolves, their remove rows)."""
    resolved: list[rules.Transition] = []
    out = []
    for key in list(entities):
        s = entities[key]
        gone = rules.evict(s, now, ttl_ms, key, labels(s))
        if gone is not None:
            resolved += gone
            out.append(_entity_row(s, action="remove") | {"evidence": REMOVED_REASONS["not observed"]})
            del entities[key]
    return resolved, out


