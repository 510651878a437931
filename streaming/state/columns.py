"""The column path: a bucket's rows of quiet partitions applied to its partition table in
columns (``fold_quiet``), and partitions seen for the first time with a settled view put
straight into it (``fold_new``), both by the rules' declared writes (streaming/rules/partition.py
"What an observation writes").  What is left goes through ``fold``.  docs/state.md.
"""

from __future__ import annotations

import logging
import pickle
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from streaming.rules import partition as rules_partition
from streaming.rules import writes as W
from streaming.state.fold import _ints, fold
from streaming.state.rows import changed_entity_rows
from streaming.state.table import NULL, PartitionTable
from streaming.state.table import event_keys as table_event_keys
from streaming.state.table import CODED as TABLE_CODED, HOT as TABLE_HOT, PLAIN as TABLE_INTS, apply_writes
from streaming.state.table import compact as table_compact, cold_keys as table_cold_keys

if TYPE_CHECKING:
    from streaming.state.config import StateConfig

log = logging.getLogger(__name__)

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




def fold_columns(table: PartitionTable, entities: dict[str, Any], frames: list[pd.DataFrame], cfg: StateConfig,
                 compact: bool = True) -> tuple[list[pd.DataFrame], np.ndarray]:
    """The column path of a bucket's rows: the quiet partitions' first (the table is empty
    unless ``compact``), then the new settled ones among the rows left (``fold_new`` looks at
    a few rows, not every row of the bucket; it takes no row ``fold_quiet`` would).  Returns
    (the frames left for ``fold``, the table positions whose gauges are sent)."""
    frames, quiet = fold_quiet(table, frames)
    if not compact:
        return frames, quiet
    frames, born = fold_new(table, entities, frames, cfg)
    return frames, np.concatenate([born, quiet])
