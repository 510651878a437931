"""The ``applyInPandasWithState`` function: per bucket of entities, admit each observation once
and in order, fold the quiet partitions' rows in columns (``table``) and the others through the
rules (``streaming.rules.dispatch`` says which), run the time-driven checks, store the bucket
(``codec``), emit the changed gauges and the alert transitions (``rows``).  Layout, restarts,
timers and the stored format: docs/state.md.
"""

from __future__ import annotations

import logging
import operator
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pandas as pd

from monitor.contract import LIVENESS_TYPES
from monitor.gcpause import gc_paused
from streaming.rules import base as rules
from streaming.rules import client as rules_client
from streaming.rules import group as rules_group
from streaming.rules import lag_config as rules_lag_config
from streaming.rules import partition as rules_partition
from streaming.rules import writes as W
from streaming.rules import partition_config as rules_partition_config
from streaming.rules import source as rules_source
from streaming.rules import topic as rules_topic
from streaming.rules.dispatch import DUE, EVENTS, labels, new_entity
from streaming.state.codec import _load, _store
from streaming.state.rows import (REMOVED_REASONS, _TEXT_COLUMNS, _column, _entity_row, _frame, _transition_columns,
                                  active_rows, changed_entity_rows, dropped_rows, pack_block, quarantine_rows,
                                  remember_shown, removed_rows)
from streaming.state.table import NULL, PartitionTable
from streaming.state.table import event_keys as table_event_keys
from streaming.state.table import CODED as TABLE_CODED, HOT as TABLE_HOT, PLAIN as TABLE_INTS, apply_writes
from streaming.state.table import compact as table_compact, cold_keys as table_cold_keys

log = logging.getLogger(__name__)

QUARANTINE_BUCKET = -1


@dataclass(frozen=True)
class StateConfig:
    entity_ttl_ms: int = 900_000
    #: how often a bucket without new events is woken to run the time-driven checks
    tick_ms: int = 30_000
    #: identifies this run of the job: an entity's gauges are sent to the exporter when they
    #: change, and once per run (a restarted job starts with an empty exporter)
    run_id: str = ""
    lag: rules_lag_config.LagConfig = field(default_factory=rules_lag_config.LagConfig)
    partition: rules_partition_config.PartitionRulesConfig = field(default_factory=rules_partition_config.PartitionRulesConfig)
    group: rules_group.GroupRulesConfig = field(default_factory=rules_group.GroupRulesConfig)
    client: rules_client.ClientRulesConfig = field(default_factory=rules_client.ClientRulesConfig)
    source: rules_source.SourceRulesConfig = field(default_factory=rules_source.SourceRulesConfig)


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


_QUIET_OBJECTS = ("entity", "type", "source", "replicas", "isr")
_QUIET_INTS = ("observed_at", "seq", "high_watermark", "log_start_offset", "last_stable_offset", "metadata_at",
               "leader", "leader_epoch", "min_insync_replicas")


def fold_quiet(table: PartitionTable, frames: list[pd.DataFrame]) -> tuple[list[pd.DataFrame], np.ndarray]:
    """Apply the quiet partitions' rows to ``table`` (``PartitionTable.fold_quiet``);
    return (the frames without them, for ``fold``; the table positions whose gauges changed)."""
    if not len(table) or not frames:
        return frames, np.empty(0, np.int64)
    cols = {c: np.concatenate([f[c].to_numpy(dtype=object) for f in frames]) for c in _QUIET_OBJECTS}
    cols.update({c: np.concatenate([_ints(f[c]) for f in frames]) for c in _QUIET_INTS})
    cols["event_key"] = table_event_keys(np.concatenate([f["event_id"].to_numpy(dtype=object) for f in frames]))
    done, gauges = table.fold_quiet(cols)
    if not done.any():
        return frames, gauges
    rest, at = [], 0
    for f in frames:
        keep = ~done[at:at + len(f)]
        at += len(f)
        if keep.any():
            rest.append(f[keep])
    return rest, gauges


_MD, _OFF = "partition_metadata", "partition_offsets"
#: the columns ``fold_new`` reads: ints, and objects
_NEW_INTS = ("observed_at", "seq", "partition", "leader", "leader_epoch", "min_insync_replicas", "high_watermark",
             "log_start_offset", "last_stable_offset", "metadata_at")
_NEW_OBJECTS = ("entity", "type", "source", "cluster", "topic", "replicas", "isr")
_new_warned = False


def fold_new(table: PartitionTable, entities: dict[str, Any], frames: list[pd.DataFrame],
             cfg: StateConfig) -> tuple[list[pd.DataFrame], np.ndarray]:
    """Put straight into ``table`` the partitions this bucket sees for the first time whose
    batch rows are their metadata then their offsets, from one source, and whose view is settled
    (``rules.partition.settled_view``), in columns: the rules' declared writes applied to them
    (``_stamp``), without a dict each (at 300,000 partitions the first batches cost ~5x a batch
    on held state).  The first of them goes through the dict rules and must come out as
    stamped, else none is put in (logged once).  Returns (the frames without their rows, their
    table positions: their gauges are sent)."""
    global _new_warned
    none = np.empty(0, np.int64)
    if not frames:
        return frames, none
    obj = {c: np.concatenate([f[c].to_numpy(dtype=object) for f in frames]) for c in _NEW_OBJECTS}
    typ = obj["type"]
    cand = np.flatnonzero((typ == _MD) | (typ == _OFF))
    if not len(cand):
        return frames, none
    ent = obj["entity"][cand]
    cand = cand[table.positions(ent) < 0]
    if entities and len(cand):
        cand = cand[np.fromiter((e not in entities for e in obj["entity"][cand]), bool, len(cand))]
    if len(cand) < 2:
        return frames, none
    ints = {c: np.concatenate([_ints(f[c]) for f in frames]) for c in _NEW_INTS}
    t, seq = ints["observed_at"], ints["seq"]
    # exactly two rows per partition: its metadata, then its offsets (event order), one source
    order = cand[np.lexsort((seq[cand], t[cand], obj["entity"][cand]))]
    ent = obj["entity"][order]
    starts = np.flatnonzero(np.r_[True, ent[1:] != ent[:-1]])
    sizes = np.diff(np.r_[starts, len(order)])
    two = starts[sizes == 2]
    im, io = order[two], order[two + 1]
    ok = (typ[im] == _MD) & (typ[io] == _OFF) & (obj["source"][im] == obj["source"][io])
    ok &= (t[im] != NULL) & (t[io] != NULL) & (seq[im] != NULL) & (seq[io] != NULL)
    ok &= (t[im] < t[io]) | ((t[im] == t[io]) & (seq[im] < seq[io]))
    ok &= ints["high_watermark"][io] != NULL
    keys = table_event_keys(np.concatenate([f["event_id"].to_numpy(dtype=object) for f in frames]))
    ok &= (keys[im] != NULL) & (keys[io] != NULL)
    writes = (typ == "canary") | (typ == "client_produce")
    if writes.any():  # their pending writes go to the partition: the dict rules' business
        w = np.flatnonzero(writes)
        part = np.concatenate([_ints(f["partition"]) for f in frames])[w]
        named = {f"partition|{c}/{tp}/{p}" for c, tp, p in zip(obj["cluster"][w], obj["topic"][w], part.tolist())}
        ok &= np.fromiter((e not in named for e in obj["entity"][im]), bool, len(im))
    im, io = im[ok], io[ok]
    lists = [rules_partition.settled_view(None if ld == NULL else ld, r, i, None if mi == NULL else mi)
             for ld, r, i, mi in zip(ints["leader"][im].tolist(), obj["replicas"][im], obj["isr"][im],
                                     ints["min_insync_replicas"][im].tolist())]
    ok = np.fromiter((x is not None for x in lists), bool, len(im))
    im, io = im[ok], io[ok]
    if not len(im):
        return frames, none
    # the first one through the dict rules: the layout and constants of the rest, and the check
    at = np.cumsum([0] + [len(f) for f in frames])
    sub = []
    for k, f in enumerate(frames):
        mine = [int(x) - at[k] for x in (im[0], io[0]) if at[k] <= x < at[k + 1]]
        if mine:
            sub.append(f.iloc[mine])
    ref: dict[str, Any] = {}
    got, touched = fold(ref, sub, cfg)
    changed_entity_rows(ref, touched, cfg.run_id)
    key0 = obj["entity"][im[0]]
    layouts = {k: i for i, k in enumerate(table.layouts)}
    want = None if got or list(ref) != [key0] else table_compact(ref[key0], cfg.run_id, cfg.partition, layouts)
    stamped = None
    if want is not None:
        cold_keys = table_cold_keys(ref[key0])[0]
        template = dict(zip(cold_keys, pickle.loads(want[2][-1])))
        stamped = _stamp(table, cfg, obj, ints, keys, im, io, cold_keys, template)
    if stamped is None or want is None or not _same(stamped, want):
        if not _new_warned:
            _new_warned = True
            log.warning("new partitions: the column path does not match the rules for %s; they go through "
                        "the rules (slower, correct)", key0)
        return frames, none
    cols, coded, cold = stamped
    born = table.add(obj["entity"][im].tolist(), cols, coded, cold)
    done = np.zeros(at[-1], bool)
    done[im] = done[io] = True
    rest = []
    for k, f in enumerate(frames):
        keep = ~done[at[k]:at[k + 1]]
        if keep.all():
            rest.append(f)
        elif keep.any():
            rest.append(f[keep])
    return rest, born


def _same(stamped: tuple[dict, dict, list], want: tuple) -> bool:
    """Whether the first of ``_stamp``'s rows is ``compact``'s (ints, sent_ok, objects)."""
    cols, coded, cold = stamped
    ints, sent_ok, objects = want
    return (bool(sent_ok) and [int(cols[name][0]) for name in TABLE_INTS] == list(ints)
            and (*(coded[name][0] for name in TABLE_CODED), cold[0]) == tuple(objects))


def _stamp(table: PartitionTable, cfg: StateConfig, obj: dict, ints: dict, keys: np.ndarray, im: np.ndarray,
           io: np.ndarray, cold_keys: tuple, template: dict) -> tuple[dict, dict, list]:
    """``fold_new``'s partitions as table columns (``_PLAIN`` ints, ``_CODED`` values, cold
    parts): each partition's metadata row (``im``) then its offsets row (``io``) through the
    rules' declared writes (``rules.partition``: ``QUIET_WRITES`` in columns, the value writes
    of ``VIEW_WRITES`` and ``LEADER_WRITES`` for the cold part), its other fields as the first
    partition's after the dict rules (``template``, a settled view leaves them alike)."""
    R = rules_partition
    n = len(im)
    one, every = np.arange(n), np.ones(n, bool)
    cols = {f: np.full(n, NULL, np.int64) for f in TABLE_HOT}
    apply_writes(cols, R.QUIET_WRITES[_MD], ints, im, one, every, one, one)
    apply_writes(cols, R.QUIET_WRITES[_OFF], ints, io, one, every, one, one)
    # the cold part, field by field: what the metadata row writes, else the template's
    start = R.new_partition("", "", 0)
    values: dict[str, list] = {}
    for w in R.VIEW_WRITES + R.LEADER_WRITES:
        if w.how in W.TIME_KINDS:
            continue
        if w.how == W.INTS:
            values[w.field] = [W.write_ints(v) for v in obj[w.input][im]]
        else:  # VALUE, GIVEN: an int or none (GIVEN: none leaves the start's value)
            got = ints[w.input][im].tolist()
            missing = None if w.how == W.VALUE else start.get(w.field)
            values[w.field] = [missing if v == NULL else v for v in got]
    columns = [values[k] if k in values else [template[k]] * n for k in cold_keys]
    cold = [pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL) for v in zip(*columns)]
    sigs = [repr(R.signature(ld, es, rep, isr)) for ld, es, rep, isr in zip(
        values["leader_seen"], values["epoch_seen"], values["replicas"], values["isr"])]
    min_isr = np.array([NULL if v is None else v for v in values["min_isr"]], np.int64)
    cols.update({"off_t": ints["observed_at"][io], "md_t": ints["observed_at"][im], "partition": ints["partition"][im],
                 "leader": ints["leader"][im], "n_replicas": np.fromiter(map(len, values["replicas"]), np.int64, n),
                 "n_isr": np.fromiter(map(len, values["isr"]), np.int64, n), "min_isr": min_isr,
                 "window": np.full(n, R.unobserved_window_ms(template, cfg.partition)),  # type: ignore[arg-type]
                 "layout": np.full(n, table.layout(cold_keys)), "sent_hw": cols["hw"], "sent_ls": cols["log_start"],
                 "sent_lso": cols["lso"], "off_id": keys[io], "md_id": keys[im]})
    src = obj["source"][im].tolist()
    coded = {"off_src": src, "md_src": src, "sig": sigs, "cluster": obj["cluster"][im].tolist(),
             "topic": obj["topic"][im].tolist()}
    return cols, coded, cold


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


def tick(entities: dict[str, Any], now: int, cfg: StateConfig) -> list[rules.Transition]:
    """The time-driven checks of every entity in the bucket (cheap when nothing is due)."""
    out: list[rules.Transition] = []
    lags: dict[tuple[str, str], list[Optional[int]]] = {}
    for s in entities.values():
        if s["kind"] == "group_partition":
            lags.setdefault((s["cluster"], s["group"]), []).append(s.get("lag"))
    for key, s in entities.items():
        kind = s["kind"]
        if kind == "partition":
            out += rules_partition.tick_partition(s, now, key, cfg.partition)
        elif kind == "topic":
            out += rules_topic.tick_topic(s, now, key, cfg.partition)
        elif kind == "group":
            due = rules_group.group_due_at(s, cfg.group)  # None: no timer runs, tick_group would do nothing
            if due is not None and due <= now:
                out += rules_group.tick_group(s, now, key, cfg.group, lags.get((s["cluster"], s["group"]), []))
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


def on_timeout(state: Any, bucket: int, cfg: StateConfig, compact: bool = True) -> pd.DataFrame:
    """A bucket woken without events (Spark's processing-time timeout): the time-driven checks
    and the evictions at the batch's processing time, then the bucket stored."""
    entities, table, run = _load(state, cfg.run_id)
    now = int(state.getCurrentProcessingTimeMs())
    entities.update(table.take_due(now, cfg.entity_ttl_ms))
    transitions = tick(entities, now, cfg)
    remember_shown(entities, transitions)
    gone, out = evict_stale(entities, now, cfg.entity_ttl_ms)
    transitions += gone
    out += removed_rows(out, now)
    if run != cfg.run_id:  # a new run: its exporter has not seen the alerts still open
        out += active_rows(entities)
    out.append(_store(state, entities, table, cfg, compact, bucket))
    return _frame(_transition_columns(transitions), out)


def on_batch(pdfs: Iterator[pd.DataFrame], state: Any, bucket: int, cfg: StateConfig,
             compact: bool = True) -> pd.DataFrame:
    """A bucket's rows of one micro-batch: the quiet and new partitions' in columns, the others
    through the rules in event order, then the time-driven checks and the evictions at the
    batch's latest event time, then the bucket stored."""
    frames = [f for f in pdfs if len(f)]
    entities, table, run = _load(state, cfg.run_id)
    now = int(max(f["observed_at"].max() for f in frames))
    dropped: dict[str, int] = {}
    # quiet rows first (the table is empty unless compact): fold_new then looks at the few rows
    # left, not at every row of the bucket; it takes no row fold_quiet would
    frames, quiet = fold_quiet(table, frames)
    born = np.empty(0, np.int64)
    if compact:
        frames, born = fold_new(table, entities, frames, cfg)
    quiet = np.concatenate([born, quiet])
    forgotten: list[tuple[str, dict]] = []
    transitions, touched = fold(entities, frames, cfg, dropped, take=table.take, removed=forgotten)
    entities.update(table.take_due(now, cfg.entity_ttl_ms))
    transitions += tick(entities, now, cfg)
    remember_shown(entities, transitions)
    out = changed_entity_rows(entities, touched, cfg.run_id)
    if len(quiet):
        out.append(pack_block(table.gauge_columns(quiet)))
    gone, evicted = evict_stale(entities, now, cfg.entity_ttl_ms)
    transitions += gone
    # an entity forgotten and then seen again in this batch (re-created) keeps its series
    removed = [r for k, r in forgotten if k not in entities and k not in table] + evicted
    after = dropped_rows(dropped, now) + removed + removed_rows([r for _, r in forgotten] + evicted, now)
    if run != cfg.run_id:  # a new run: its exporter has not seen the alerts still open
        after += active_rows(entities)
    after.append(_store(state, entities, table, cfg, compact, bucket))
    return _frame(_transition_columns(transitions), out, after)


def make_state_function(cfg: StateConfig, compact_partitions: bool = True) -> Callable[..., Iterator[pd.DataFrame]]:
    """The function handed to ``applyInPandasWithState`` (a closure over its settings).
    ``compact_partitions=False`` keeps every partition a dict and folds every row through the
    dict rules: the reference ``tests/unit/test_partition_table.py`` checks the partition
    table against."""

    def update_bucket(key: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        bucket = int(key[0])
        with gc_paused():
            if state.hasTimedOut:
                yield on_timeout(state, bucket, cfg, compact_partitions)
            elif bucket == QUARANTINE_BUCKET:
                yield _frame(quarantine_rows(pdfs))
            else:
                yield on_batch(pdfs, state, bucket, cfg, compact_partitions)

    return update_bucket
