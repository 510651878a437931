"""Quiet partitions of a bucket, in columns: the offsets rows of partitions the rules call quiet
(``rules.partition.is_quiet``) applied with numpy instead of the dict rules.  Why and on which
conditions: docs/state.md; checked against the dict rules by tests/unit/test_partition_table*.py.
"""

from __future__ import annotations

import pickle
from operator import itemgetter
from typing import Any, Optional, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from streaming.rules import partition as rules_partition
from streaming.rules import writes as W
from streaming.rules import partition_config as rules_partition_config

NULL = np.iinfo(np.int64).min  # a missing int in the columns (None in the dicts)
_OFFSETS, _METADATA = "partition_offsets", "partition_metadata"

#: fields of the partition dict held as columns (ints or None): the ones quiet rows write
HOT = rules_partition.QUIET_FIELDS
#: the last admitted offsets / metadata event's time (``admit``'s state; NULL: none held here)
_APPLIED = ("off_t", "md_t")
#: columns derived from the cold part when a partition goes in (read-only while it is here)
_FIXED = ("partition", "leader", "n_replicas", "n_isr", "min_isr", "window", "layout")
#: the gauges last sent for the partition (valid where ``sent_ok``)
_SENT = ("sent_hw", "sent_ls", "sent_lso")
#: values shared by many rows, held as codes into the table's ``uniq[name]`` list: the sources
#: ``admit`` last let through, the metadata a snapshot must repeat to be quiet (``sig``: the
#: ``repr`` of ``repeat_signature``; None: metadata rows go to the dict rules), the labels
_CODED = ("off_src", "md_src", "sig", "cluster", "topic")
#: the keys (``event_key``) of the last offsets / metadata events ``admit`` let through
_IDS = ("off_id", "md_id")
#: the int columns ``compact`` gives (the codes are the table's to give)
_PLAIN = HOT + _APPLIED + _FIXED + _SENT + _IDS
_INT_COLUMNS = _PLAIN + _CODED
#: the order of ``compact``'s ints, and of its objects but the cold part
PLAIN, CODED = _PLAIN, _CODED
#: per-row values in Arrow arrays (pickled as their buffers, no Python object per row): the
#: pickled cold part
_ARRAYS = {"cold": pa.binary()}
#: what ``compact`` returns per row, in this order, besides the ints
_OBJECTS = ("off_src", "md_src", "sig", "cluster", "topic", "cold")
#: columns stored as their difference from another (``encode``): where they move together the
#: differences are mostly 0 and compress to almost nothing.  Listed so that a column's reference
#: is restored before it is used (``lso`` before ``sent_lso``).
_DELTA_OF = (("lso", "hw"), ("hw_seen", "hw"), ("sent_hw", "hw"), ("sent_ls", "log_start"), ("sent_lso", "lso"),
             ("last_seen", "observed_at"), ("hw_changed_at", "observed_at"), ("hw_observed_at", "observed_at"),
             ("md_confirmed_at", "observed_at"), ("md_at", "observed_at"), ("off_t", "observed_at"),
             ("md_t", "observed_at"))
#: dict keys rebuilt from the columns (so not kept in the cold part)
_DERIVED = frozenset(HOT) | {"due", "due_pw", "sent", "cluster", "topic", "partition"}


def _i(v: Any) -> int:
    return NULL if v is None else int(v)


def _o(v: int) -> Optional[int]:
    return None if v == NULL else int(v)


def _count(v: Optional[list]) -> Optional[int]:
    return None if v is None else len(v)


def _one(applied: dict, etype: str) -> Any:
    """``admit``'s entry for ``etype`` of the source that reported it last, as (source, t,
    event id): the one the columns hold (the other sources' entries stay in the cold part, as
    they are: a row from another source goes to the dict rules).  A probe restarted under a new
    name (``probe-<hostname>``: a new pod) thus takes over after one batch.  None when there is
    no entry; False when it cannot be held in columns (several ids at its time)."""
    best = None
    for k, v in applied.items():
        if k[0] == etype and (best is None or (v[0], str(k[1])) > (applied[best][0], str(best[1]))):
            best = k
    if best is None:
        return None
    t, ids = applied[best]
    if len(ids) != 1:
        return False
    return best[1], t, ids[0]


#: a partition dict's key order -> (its cold keys, the position of "applied" among them): the
#: dicts of a bucket share a handful of key orders, so compact() works this out once per order
_COLD_KEYS: dict[tuple, tuple[tuple, int]] = {}
_HOT_OF = itemgetter(*HOT)


def cold_keys(s: rules_partition.PartitionState) -> tuple[tuple, int]:
    order = tuple(s)
    got = _COLD_KEYS.get(order)
    if got is None:
        if len(_COLD_KEYS) >= 256:  # bounded: key orders come from the rules' code, not from data
            _COLD_KEYS.clear()
        keys = tuple(k for k in order if k not in _DERIVED)
        got = _COLD_KEYS[order] = (keys, keys.index("applied"))
    return got


def compact(s: rules_partition.PartitionState, run_id: str, cfg: rules_partition_config.PartitionRulesConfig,
            layouts: dict[tuple, int]) -> Optional[tuple]:
    """The row for partition state ``s`` if it is quiet (see the module docstring), else None:
    (ints in ``_PLAIN`` order, sent_ok, objects in ``_OBJECTS`` order).  The cold part is
    stored as the tuple of its values, pickled; its keys are a *layout* shared by the table's
    rows (``layouts``: key tuple -> number, extended here), which keeps a row's cold part at
    ~140 bytes instead of ~380."""
    if not rules_partition.is_quiet(s, cfg) or "applied" not in s:
        return None
    applied = s["applied"] or {}
    off, md = _one(applied, _OFFSETS), _one(applied, _METADATA)
    if not off or md is False:
        return None
    window = rules_partition.unobserved_window_ms(s, cfg)
    hot = _HOT_OF(s)
    for v in hot:
        if v is not None and not isinstance(v, (int, float)):
            return None
    sig = repr(rules_partition.repeat_signature(s)) if md is not None else None
    shown = (s["leader"], _count(s["replicas"]), _count(s["isr"]))
    sent = s.get("sent")
    sent_ok = sent is not None and sent[0] == run_id and len(sent[1]) == 6 and tuple(sent[1][:3]) == shown
    keys, at_applied = cold_keys(s)
    values = list(itemgetter(*keys)(s))
    values[at_applied] = {k: v for k, v in applied.items()
                          if not (k == (_OFFSETS, off[0]) or (md and k == (_METADATA, md[0])))}
    if not sent_ok and sent is not None:
        keys += ("sent",)
        values.append(sent)
    if md is None:
        md = (None, None, None)
    layout = layouts.setdefault(keys, len(layouts))
    ints = [NULL if v is None else int(v) for v in hot]
    ints += [int(off[1]), _i(md[1]), _i(s["partition"]), _i(shown[0]), _i(shown[1]), _i(shown[2]),
             _i(s["min_isr"]), window, layout]
    ints += [_i(v) for v in sent[1][3:]] if sent_ok and sent is not None else [NULL, NULL, NULL]
    ints += [_i(off[2]), _i(md[2])]
    objects = (off[0], md[0], sig, s["cluster"], s["topic"], pickle.dumps(tuple(values), protocol=pickle.HIGHEST_PROTOCOL))
    return ints, sent_ok, objects


def apply_writes(c: dict[str, np.ndarray], writes: tuple[W.Write, ...], rows: dict[str, np.ndarray],
                 order: np.ndarray, p: np.ndarray, first: np.ndarray, starts: np.ndarray, last: np.ndarray) -> None:
    """``rules.writes.write`` in columns: apply ``writes`` of the rows ``order`` (grouped by
    partition, each group in event order: ``p`` their positions in ``c``'s columns, ``first``
    whether each starts its group, ``starts`` / ``last`` the groups' first and last rows) to the
    columns ``c``, as the rules would apply them one row at a time.  Value kinds take the last
    row's value: a quiet metadata row repeats them (``QUIET_WRITES``)."""
    ent, lr = p[starts], order[last]
    t = rows["observed_at"]
    for w in writes:
        f, how = w.field, w.how
        if how == W.VALUE:
            c[f][ent] = rows[w.input][lr]
        elif how == W.TIME:
            c[f][ent] = t[lr]
        elif how == W.LATEST:
            c[f][ent] = np.maximum(c[f][ent], t[lr])
        elif how == W.CHANGED_AT:  # the group's first row compares with the stored field
            v, tt = rows[w.input][order], t[order]
            prev = np.where(first, c[w.of][p], np.roll(v, 1))  # a NULL stored field differs
            changed = np.maximum.reduceat(np.where(v != prev, tt, NULL), starts)
            c[f][ent] = np.where(changed != NULL, changed, c[f][ent])
        elif how == W.CONFIRMED:
            v, tt = rows[w.input][order], t[order]
            c[f][ent] = np.maximum(c[f][ent], np.maximum.reduceat(np.where(v == NULL, NULL, np.minimum(v, tt)), starts))
        else:
            raise ValueError(f"write {how!r} of {f}: not held in columns")


def _tuple_texts(lists: np.ndarray) -> pa.Array:
    """``repr`` of each list as a tuple of ints, less its parentheses: ``1, 2``, ``1,``, ``""``."""
    a = pa.array(list(lists), pa.list_(pa.int64()))
    text = pc.binary_join(pc.cast(a, pa.list_(pa.string())), ", ")
    return pc.if_else(pc.equal(pc.list_value_length(a), 1), pc.binary_join_element_wise(text, ",", ""), text)


def signature_texts(leader: np.ndarray, epoch: np.ndarray, replicas: np.ndarray, isr: np.ndarray) -> np.ndarray:
    """``repr(rules.partition.signature(...))`` of many rows at once (ints, ``NULL`` epoch for
    none; lists of ints), as an object array of str."""
    epochs = pc.fill_null(pc.cast(pa.array(epoch, mask=epoch == NULL), pa.string()), "None")
    parts = ["(", pc.cast(pa.array(leader), pa.string()), ", ", epochs, ", (", _tuple_texts(replicas), "), (",
             _tuple_texts(isr), "))"]
    return pc.binary_join_element_wise(*parts, "").to_numpy(zero_copy_only=False)


def event_keys(values: Any) -> np.ndarray:
    """Event ids as the int64 keys ``admit`` remembers (a 64-bit hash, the same in every process
    and run; ``NULL`` for a missing id)."""
    values = np.asarray(values, dtype=object)
    missing = pd.isna(values)
    h = pd.util.hash_array(np.where(missing, "", values).astype(object), categorize=False).view(np.int64)
    h = np.where(h == NULL, h ^ 1, h)
    h[missing] = NULL
    return h


def event_key(value: Any) -> Optional[int]:
    """One event id's key (``event_keys``), None for none."""
    return None if value is None else int(event_keys([value])[0])


def keyed_applied(applied: dict) -> dict:
    """``admit``'s entries of a format 4 entity, its event ids replaced by their keys."""
    return {k: (t, [event_key(i) for i in ids]) for k, (t, ids) in applied.items()}


def codes_of(uniq: list, values: list) -> np.ndarray:
    """The code of each value in ``uniq`` (a coded column's list), new values appended to it."""
    at = {v: i for i, v in enumerate(uniq)}
    out = np.empty(len(values), np.int64)
    for j, v in enumerate(values):
        k = at.get(v)
        if k is None:
            k = at[v] = len(uniq)
            uniq.append(v)
        out[j] = k
    return out


def from_lists(state: Optional[dict]) -> Optional[dict]:
    """A table state of format 4 (keys and objects as Python lists, event ids as text) in
    today's layout."""
    if not state:
        return state
    objs = dict(state["objs"])
    ints = dict(state["ints"])
    layouts = state["layouts"]
    cold = []
    for layout, part in zip(ints["layout"].tolist(), objs["cold"]):
        values = list(pickle.loads(part))
        j = layouts[layout].index("applied")
        values[j] = keyed_applied(values[j])
        cold.append(pickle.dumps(tuple(values), protocol=pickle.HIGHEST_PROTOCOL))
    objs["cold"] = cold
    for name in _IDS:
        ints[name] = event_keys(objs[name])
    uniq: dict[str, list] = {}
    for name in _CODED:
        uniq[name] = []
        ints[name] = codes_of(uniq[name], objs[name])
    rest = {k: v for k, v in state.items() if k != "objs"}
    return {**rest, "keys": pa.array(state["keys"], pa.string()), "ints": ints, "uniq": uniq,
            "arrays": {name: pa.array(objs[name], t) for name, t in _ARRAYS.items()}}


def encode(state: Optional[dict]) -> Optional[dict]:
    """A table state (``PartitionTable.state``) as it is stored: the ``_DELTA_OF`` columns as
    differences (int64 arithmetic wraps, so NULLs and any values come back exactly), each int
    column in the narrowest type that holds it, the cold parts dictionary-encoded (from format 6
    they hold no partition's name, so most are alike)."""
    if not state:
        return state
    ints = state["ints"]
    with np.errstate(over="ignore"):
        coded = {**ints, **{c: ints[c] - ints[ref] for c, ref in _DELTA_OF}}
    out = {**state, "ints": {c: _narrow(v) for c, v in coded.items()}}
    if "arrays" in state:
        out["arrays"] = {**state["arrays"], "cold": pc.dictionary_encode(state["arrays"]["cold"])}
    return out


_NARROW = (np.int8, np.int16, np.int32)


def _narrow(v: np.ndarray) -> np.ndarray:
    """``v`` in the narrowest int type that holds it: the differences and codes are mostly
    small, and a bucket's columns are most of what a batch pickles and compresses."""
    if not len(v):
        return v
    lo, hi = int(v.min()), int(v.max())
    for t in _NARROW:
        i = np.iinfo(t)
        if i.min <= lo and hi <= i.max:
            return v.astype(t)
    return v


def decode(state: Optional[dict]) -> Optional[dict]:
    """``encode`` undone."""
    if not state:
        return state
    ints = {c: v.astype(np.int64, copy=False) for c, v in state["ints"].items()}
    cold = state.get("arrays", {}).get("cold")
    if isinstance(cold, pa.DictionaryArray):
        state = {**state, "arrays": {**state["arrays"], "cold": cold.dictionary_decode()}}
    with np.errstate(over="ignore"):
        for c, ref in _DELTA_OF:
            ints[c] = ints[c] + ints[ref]
    return {**state, "ints": ints}


class PartitionTable:
    """A bucket's quiet partitions (see the module docstring).  One place per partition: a
    partition is either here (``alive``) or a dict in the bucket's entities.  Nothing here is a
    Python object per row: keys, event ids and cold parts are Arrow arrays, shared values codes
    (so storing and reading the table moves buffers, docs/state.md "Stored format")."""

    def __init__(self, state: Optional[dict] = None, run_id: str = "",
                 cfg: rules_partition_config.PartitionRulesConfig = rules_partition_config.DEFAULT_CONFIG,
                 ttl_ms: int = 900_000):
        """``cfg``: the partition rules' settings (what is quiet); ``ttl_ms``: the entity TTL."""
        self.cfg, self.ttl_ms = cfg, ttl_ms
        st = state or {}
        self.keys: pa.Array = st.get("keys", pa.array([], pa.string()))
        n = len(self.keys)
        self.ints: dict[str, np.ndarray] = {c: st["ints"][c] if st else np.empty(0, np.int64) for c in _INT_COLUMNS}
        self.arrays: dict[str, pa.Array] = {c: st["arrays"][c] if st else pa.array([], t) for c, t in _ARRAYS.items()}
        self.uniq: dict[str, list] = {c: list(st["uniq"][c]) if st else [] for c in _CODED}
        self.sent_ok: np.ndarray = st.get("sent_ok", np.zeros(0, bool))
        if st.get("run_id") != run_id:  # a new run: its exporter has not seen any gauge yet
            self.sent_ok = np.zeros(n, bool)
        self.run_id = run_id
        self.layouts: list[tuple] = st.get("layouts", [])
        self.alive = np.ones(n, bool)
        self._index: Optional[dict[str, int]] = None  # key -> position, built when first asked
        self._where: dict[str, int] = {}  # the batch's entity keys -> position (-1: not here)
        #: the bucket's group partitions at rest (``idle_groups.IdleGroups``, set by ``codec``)
        self.groups: Any = None

    def __len__(self) -> int:
        return int(self.alive.sum())

    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.keys.to_pylist())}
        return self._index

    def _position(self, key: str) -> Optional[int]:
        i = self._where.get(key)
        if i is None:
            i = self.index.get(key)
        return None if i is None or i < 0 or not self.alive[i] else i

    def __contains__(self, key: str) -> bool:
        return self._position(key) is not None

    def live_keys(self) -> list[str]:
        return self.keys.filter(pa.array(self.alive)).to_pylist()

    def positions(self, entities: np.ndarray) -> np.ndarray:
        """The table position of each entity key (-1: not in the table), vectorized."""
        if not len(self.keys):
            return np.full(len(entities), -1, np.int64)
        pos = pc.index_in(pa.array(entities, pa.string()), value_set=self.keys)
        return pc.fill_null(pos, -1).to_numpy().astype(np.int64)

    def layout(self, keys: tuple) -> int:
        """The number of a cold part's key layout (added when new)."""
        if keys not in self.layouts:
            self.layouts.append(keys)
        return self.layouts.index(keys)

    def add(self, keys: list[str], ints: dict[str, np.ndarray], coded: dict[str, list], cold: list[bytes]) -> np.ndarray:
        """Append quiet partitions given as columns (``_PLAIN`` ints, ``_CODED`` values, pickled
        cold parts; their gauges sent in this run), none of them in the table yet; return their
        positions."""
        n0, n = len(self.keys), len(keys)
        self.keys = pa.concat_arrays([self.keys, pa.array(keys, pa.string())])
        for name in _PLAIN:
            self.ints[name] = np.concatenate([self.ints[name], np.asarray(ints[name], np.int64)])
        for name in _CODED:
            self.ints[name] = np.concatenate([self.ints[name], codes_of(self.uniq[name], coded[name])])
        self.arrays["cold"] = pa.concat_arrays([self.arrays["cold"], pa.array(cold, pa.binary())])
        self.sent_ok = np.concatenate([self.sent_ok, np.ones(n, bool)])
        self.alive = np.concatenate([self.alive, np.ones(n, bool)])
        if self._index is not None:
            self._index.update(zip(keys, range(n0, n0 + n)))
        return np.arange(n0, n0 + n, dtype=np.int64)

    def take(self, key: str) -> Optional[rules_partition.PartitionState]:
        """The partition's dict (as the dict rules would have left it), removed from the table;
        None when it is not here."""
        i = self._position(key)
        if i is None:
            return None
        self.alive[i] = False
        return self._dict(i)

    def peek(self, key: str) -> rules_partition.PartitionState:
        """The partition's dict without taking it out (tests and debugging)."""
        return self._dict(self.index[key])

    def value(self, name: str, i: int) -> Any:
        """Row ``i``'s value of a coded column (``_CODED``)."""
        return self.uniq[name][self.ints[name][i]]

    def _dict(self, i: int) -> rules_partition.PartitionState:
        c, a = self.ints, self.arrays
        d: dict[str, Any] = dict(zip(self.layouts[c["layout"][i]], pickle.loads(a["cold"][i].as_py())))
        for k in HOT:
            d[k] = _o(c[k][i])
        d["cluster"], d["topic"], d["partition"] = self.value("cluster", i), self.value("topic", i), int(c["partition"][i])
        s = cast(rules_partition.PartitionState, d)
        s["applied"][(_OFFSETS, self.value("off_src", i))] = (int(c["off_t"][i]), [_o(c["off_id"][i])])
        if c["md_t"][i] != NULL:
            s["applied"][(_METADATA, self.value("md_src", i))] = (int(c["md_t"][i]), [_o(c["md_id"][i])])
        s["due"] = int(c["observed_at"][i]) + int(c["window"][i])  # never NULL here (is_quiet)
        s["due_pw"] = None
        if self.sent_ok[i]:
            s["sent"] = (self.run_id, (_o(c["leader"][i]), _o(c["n_replicas"][i]), _o(c["n_isr"][i]),
                                       _o(c["sent_hw"][i]), _o(c["sent_ls"][i]), _o(c["sent_lso"][i])))
        return s

    def take_due(self, now: int) -> dict[str, rules_partition.PartitionState]:
        """Take out the partitions the time-driven checks or the eviction have work for: the
        unobserved window is reached (``due``), or the entity is past its TTL."""
        c = self.ints
        due = np.flatnonzero(self.alive & ((c["observed_at"] + c["window"] <= now) | (now - c["last_seen"] > self.ttl_ms)))
        out = {}
        for i, key in zip(due.tolist(), self.keys.take(pa.array(due, pa.int64())).to_pylist()):
            self.alive[i] = False
            out[key] = self._dict(i)
        return out

    def _lookup(self, name: str, values: np.ndarray) -> np.ndarray:
        """The code of each value in coded column ``name`` (-1: not in its list)."""
        return pd.Index(self.uniq[name], dtype=object).get_indexer(values)

    def state(self, entities: dict[str, Any]) -> dict:
        """The table to store: the live rows plus every dict partition of ``entities`` that is
        quiet again (those are removed from ``entities``)."""
        rows = []
        layouts = {k: i for i, k in enumerate(self.layouts)}
        for key in [k for k, s in entities.items() if s.get("kind") == "partition"]:
            r = compact(entities[key], self.run_id, self.cfg, layouts)
            if r is not None:
                rows.append((key, r))
                del entities[key]
        live = np.flatnonzero(self.alive)
        everyone = len(live) == len(self.alive)
        keep = pa.array(live, pa.int64())
        new = np.array([r[0] for _, r in rows], np.int64).reshape(len(rows), len(_PLAIN))
        ints = {name: np.concatenate([self.ints[name][live], new[:, j]]) for j, name in enumerate(_PLAIN)}
        objects = {name: [r[2][j] for _, r in rows] for j, name in enumerate(_OBJECTS)}
        ints.update({name: np.concatenate([self.ints[name][live], codes_of(self.uniq[name], objects[name])]) for name in _CODED})
        arrays = {name: pa.concat_arrays([a if everyone else a.take(keep), pa.array(objects[name], _ARRAYS[name])])
                  for name, a in self.arrays.items()}
        keys = pa.concat_arrays([self.keys if everyone else self.keys.take(keep), pa.array([k for k, _ in rows], pa.string())])
        return {
            "run_id": self.run_id, "layouts": sorted(layouts, key=layouts.__getitem__),
            "keys": keys, "ints": ints, "arrays": arrays, "uniq": self._compact_uniq(ints),
            "sent_ok": np.concatenate([self.sent_ok[live], np.array([r[1] for _, r in rows], bool)]),
        }

    def _compact_uniq(self, ints: dict[str, np.ndarray]) -> dict[str, list]:
        """The code lists, each rebuilt from the codes in use once it holds more values than
        the table has rows (signatures change with every leader election: bounded)."""
        out = {}
        for name in _CODED:
            uniq = self.uniq[name]
            if len(uniq) > max(64, len(ints[name])):
                used, codes = np.unique(ints[name], return_inverse=True)
                ints[name] = codes.astype(np.int64)
                uniq = [uniq[i] for i in used.tolist()]
            out[name] = uniq
        return out

    # -----------------------------------------------------------------------------------------

    def fold_quiet(self, rows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Apply the batch's quiet rows (see the module docstring).  ``rows``: the batch's
        columns ``entity``, ``type``, ``source``, ``replicas``, ``isr`` (object
        arrays), ``observed_at``, ``seq``, ``high_watermark``, ``log_start_offset``,
        ``last_stable_offset``, ``metadata_at``, ``leader``, ``leader_epoch``,
        ``min_insync_replicas``, ``event_key`` (int64, ``NULL`` for missing).  Returns (a mask of the rows it
        applied, the table positions of the partitions whose gauges must be sent)."""
        ent = rows["entity"]
        n = len(ent)
        none = (np.zeros(n, bool), np.empty(0, np.int64))
        if n == 0 or not self.alive.any():
            return none
        c = self.ints
        pos = self.positions(ent)
        t, typ, src = rows["observed_at"], rows["type"], rows["source"]
        is_off, is_md = typ == _OFFSETS, typ == _METADATA
        ok = (pos >= 0) & (is_off | is_md) & (t != NULL)
        cand = np.flatnonzero(ok)
        ok[cand] = self.alive[pos[cand]]
        # offsets: from the source whose offsets were admitted last, with a high watermark
        j = np.flatnonzero(ok & is_off)
        ok[j] = (rows["high_watermark"][j] != NULL) & (
            self._lookup("off_src", src[j]) == c["off_src"][pos[j]])
        # metadata: from the source whose metadata was admitted last, repeating what it said
        j = np.flatnonzero(ok & is_md)
        if len(j):
            ok[j] = self._repeats_many(rows, j, pos[j])
        # every row of a partition must qualify: one row that does not sends them all to the dicts
        ok &= ~np.isin(pos, np.unique(pos[(pos >= 0) & ~ok]))
        # per type, event times strictly increasing and newer than what the partition has seen
        late = [self._late(rows, pos, ok & is_off, ("off_t", "hw_observed_at")),
                self._late(rows, pos, ok & is_md, ("md_t", "md_at"))]
        ok &= ~np.isin(pos, np.concatenate(late))
        # where the rows left to the dict rules are (``take``): no key index to build
        rest = np.flatnonzero(~ok)
        self._where = dict(zip(ent[rest].tolist(), pos[rest].tolist()))
        if not ok.any():
            return ok, np.empty(0, np.int64)
        for typ_mask, etype, (t_col, id_col) in ((is_off, _OFFSETS, ("off_t", "off_id")),
                                                 (is_md, _METADATA, ("md_t", "md_id"))):
            mask = ok & typ_mask
            if mask.any():
                order, p, first, starts, last = self._groups(rows, pos, mask)
                apply_writes(c, rules_partition.QUIET_WRITES[etype], rows, order, p, first, starts, last)
                c[t_col][p[starts]], c[id_col][p[starts]] = t[order[last]], rows["event_key"][order[last]]
        ent_pos = np.unique(pos[ok])
        send = ~self.sent_ok[ent_pos] | (c["sent_hw"][ent_pos] != c["hw"][ent_pos]) \
            | (c["sent_ls"][ent_pos] != c["log_start"][ent_pos]) | (c["sent_lso"][ent_pos] != c["lso"][ent_pos])
        gone = ent_pos[send]
        self.sent_ok[gone] = True
        c["sent_hw"][gone], c["sent_ls"][gone], c["sent_lso"][gone] = c["hw"][gone], c["log_start"][gone], c["lso"][gone]
        return ok, gone

    def _repeats_many(self, rows: dict[str, np.ndarray], j: np.ndarray, p: np.ndarray) -> np.ndarray:
        """``_repeats`` of rows ``j`` on partitions ``p``, their signatures compared as text
        built in Arrow (``signature_texts``)."""
        c = self.ints
        ok = self._lookup("md_src", rows["source"][j]) == c["md_src"][p]
        mi = rows["min_insync_replicas"][j]
        ok &= ((mi == NULL) | (mi == c["min_isr"][p])) & (rows["leader"][j] != NULL)
        replicas, isr = rows["replicas"][j], rows["isr"][j]
        ok &= np.fromiter((r is not None and i is not None for r, i in zip(replicas, isr)), bool, len(j))
        q = np.flatnonzero(ok)
        if not len(q):
            return ok
        try:
            texts = signature_texts(rows["leader"][j[q]], rows["leader_epoch"][j[q]], replicas[q], isr[q])
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):  # odd lists: one by one
            return np.array([self._repeats(rows, a, b) for a, b in zip(j.tolist(), p.tolist())], bool)
        ok[q] = self._lookup("sig", texts) == c["sig"][p[q]]
        return ok

    def _repeats(self, rows: dict[str, np.ndarray], q: int, p: int) -> bool:
        """Row ``q`` is a partition_metadata that changes nothing on partition ``p``."""
        c = self.ints
        sig = self.value("sig", p)
        if sig is None or rows["source"][q] != self.value("md_src", p):
            return False
        mi = rows["min_insync_replicas"][q]
        if mi != NULL and mi != c["min_isr"][p]:
            return False
        leader, replicas, isr = rows["leader"][q], rows["replicas"][q], rows["isr"][q]
        if leader == NULL or replicas is None or isr is None:
            return False
        epoch = rows["leader_epoch"][q]
        return repr(rules_partition.signature(leader, None if epoch == NULL else epoch, replicas, isr)) == sig

    def _late(self, rows: dict[str, np.ndarray], pos: np.ndarray, mask: np.ndarray,
              stored: tuple[str, str]) -> np.ndarray:
        """Table positions among ``mask``'s rows whose event times are not strictly increasing,
        or not newer than the stored times ``stored``."""
        if not mask.any():
            return np.empty(0, np.int64)
        order, p, first, _, _ = self._groups(rows, pos, mask)
        tt = rows["observed_at"][order]
        c = self.ints
        prev = np.where(first, np.maximum(c[stored[0]][p], c[stored[1]][p]), np.roll(tt, 1))
        return np.unique(p[tt <= prev])

    def _groups(self, rows: dict[str, np.ndarray], pos: np.ndarray, mask: np.ndarray):
        """``mask``'s rows in (partition, event time) order: (row numbers, their partitions,
        whether each starts its partition's group, group starts, group ends)."""
        sel = np.flatnonzero(mask)
        order = sel[np.lexsort((rows["seq"][sel], rows["observed_at"][sel], pos[sel]))]
        p = pos[order]
        first = np.r_[True, p[1:] != p[:-1]]
        starts = np.flatnonzero(first)
        return order, p, first, starts, np.append(starts[1:] - 1, len(order) - 1)

    def gauge_columns(self, where: np.ndarray) -> dict[str, Any]:
        """The ``partition`` upsert rows of the partitions at ``where``, as output columns
        (what ``state._entity_row`` makes of their dicts)."""
        c = self.ints
        w = where
        n = len(w)
        return {"kind": np.full(n, "partition", object), "action": np.full(n, "upsert", object),
                "cluster": np.array(self.uniq["cluster"], object)[c["cluster"][w]],
                "topic": np.array(self.uniq["topic"], object)[c["topic"][w]],
                "partition": c["partition"][w], "leader": c["leader"][w], "replicas": c["n_replicas"][w],
                "isr": c["n_isr"][w], "high_watermark": c["hw"][w], "log_start_offset": c["log_start"][w],
                "last_stable_offset": c["lso"][w], "at": c["last_seen"][w]}
