"""Quiet partitions of a bucket, in columns.

Most partitions of a healthy cluster are *quiet*: nothing is open on them, no leader episode
or imbalance is running, and each cycle brings one ``partition_offsets`` observation that only
moves the offsets and the observation times.  Folding such an observation through the dict
rules costs ~25 µs of Python per row (the row as a dict, ``admit``, the rules, the gauge row,
pickling the whole state dict back); at 100,000 partitions per batch that was most of the
state stage.

A bucket therefore keeps its quiet partitions here, as numpy columns of the fields such an
observation changes (``hw``, ``log_start``, ``lso``, the observation times, the last admitted
offsets event) plus the few it shows (leader, replica and ISR counts), and the rest of each
partition's dict pickled once (``cold``).  ``fold_quiet`` applies a batch's offsets rows to those
columns with numpy and says which partitions' gauges changed.  It takes a row only when the
dict rules would do nothing but what it does:

- the partition is in the table (it is quiet: ``compact`` checked it when it went in);
- every row of that partition in the batch is a ``partition_offsets`` from the source whose
  offsets it last admitted, with a high watermark, and their event times are strictly
  increasing and newer than everything the partition has seen.

Then, in order, ``admit`` lets each one through, ``rules.on_partition_offsets`` records its
offsets, ``on_partition_observed`` moves ``observed_at`` (PartitionUnobserved is not open),
``on_partition_offsets_extra`` moves ``hw_observed_at`` / ``hw_changed_at`` /
``md_confirmed_at`` (HighWatermarkStalled cannot open: no writes are pending) and
``_schedule`` sets ``due`` to ``observed_at`` + the unobserved window (no episode, no
imbalance).  Any other row of the partition, a time-driven check that is due, or an eviction
takes the partition out (``take``: its dict, exactly as the rules left it) and the dict rules
handle it; at the end of the batch ``compact`` puts back every dict partition that is quiet
again.  ``tests/unit/test_partition_table.py`` runs random batches through both paths and
checks they give the same rows and the same states.
"""

from __future__ import annotations

import pickle
from typing import Any, Optional

import numpy as np

from streaming import rules_partition

NULL = np.iinfo(np.int64).min  # a missing int in the columns (None in the dicts)
_OFFSETS = "partition_offsets"

#: fields of the partition dict held as columns (ints or None); quiet offsets rows change them
HOT = ("hw", "log_start", "lso", "last_seen", "observed_at", "hw_seen", "hw_changed_at", "hw_observed_at",
       "md_confirmed_at")
#: columns derived from the cold part when a partition goes in (read-only while it is here)
_FIXED = ("partition", "leader", "n_replicas", "n_isr", "window", "layout")
#: the gauges last sent for the partition (valid where ``sent_ok``)
_SENT = ("sent_hw", "sent_ls", "sent_lso")
_INT_COLUMNS = HOT + ("off_t",) + _FIXED + _SENT
#: dict keys rebuilt from the columns (so not kept in the cold part)
_DERIVED = frozenset(HOT) | {"due", "due_pw", "sent"}


def _i(v: Any) -> int:
    return NULL if v is None else int(v)


def _o(v: int) -> Optional[int]:
    return None if v == NULL else int(v)


def _count(v: Optional[list]) -> Optional[int]:
    return None if v is None else len(v)


def compact(s: dict, run_id: str, cfg: rules_partition.PartitionRulesConfig,
            layouts: dict[tuple, int]) -> Optional[tuple]:
    """The row for partition state ``s`` if it is quiet (see the module docstring), else None.
    The cold part is stored as the tuple of its values, pickled; its keys are a *layout*
    shared by the table's rows (``layouts``: key tuple -> number, extended here), which keeps
    a row's cold part at ~140 bytes instead of ~380."""
    if (s.get("kind") != "partition" or s["open"] or rules_partition._LAST_KEY not in s or "due" not in s
            or s["pending_writes_at"] is not None or s["pending_since"] is not None
            or s["leader_episode"] is not None or s["imbalanced_since"] is not None
            or s["observed_at"] is None or s["last_seen"] is None or s["hw"] is None):
        return None
    applied = s.get("applied") or {}
    offsets = [k for k in applied if k[0] == _OFFSETS]
    if len(offsets) != 1:
        return None
    t, ids = applied[offsets[0]]
    if len(ids) != 1:
        return None
    window = rules_partition.unobserved_window_ms(s, cfg)
    if s["due"] != s["observed_at"] + window or s.get("due_pw") is not None:
        return None
    if any(v is not None and not isinstance(v, (int, float)) for v in (s[k] for k in HOT)):
        return None
    shown = (s["leader"], _count(s["replicas"]), _count(s["isr"]))
    sent = s.get("sent")
    sent_ok = sent is not None and sent[0] == run_id and tuple(sent[1][:3]) == shown
    cold = {k: v for k, v in s.items() if k not in _DERIVED}
    cold["applied"] = {k: v for k, v in applied.items() if k != offsets[0]}
    if not sent_ok and sent is not None:
        cold["sent"] = sent
    layout = layouts.setdefault(tuple(cold), len(layouts))
    ints = [_i(s[k]) for k in HOT] + [int(t), _i(s["partition"]), _i(shown[0]), _i(shown[1]), _i(shown[2]), window,
                                      layout]
    ints += [_i(v) for v in sent[1][3:]] if sent_ok else [NULL, NULL, NULL]
    return (ints, sent_ok, offsets[0][1], ids[0], s["cluster"], s["topic"],
            pickle.dumps(tuple(cold.values()), protocol=pickle.HIGHEST_PROTOCOL))


class PartitionTable:
    """A bucket's quiet partitions (see the module docstring).  One place per partition: a
    partition is either here (``alive``) or a dict in the bucket's entities."""

    def __init__(self, state: Optional[dict] = None, run_id: str = ""):
        st = state or {}
        self.keys: list[str] = st.get("keys", [])
        n = len(self.keys)
        self.ints: dict[str, np.ndarray] = {c: st["ints"][c] if st else np.empty(0, np.int64) for c in _INT_COLUMNS}
        self.sent_ok: np.ndarray = st.get("sent_ok", np.zeros(0, bool))
        if st.get("run_id") != run_id:  # a new run: its exporter has not seen any gauge yet
            self.sent_ok = np.zeros(n, bool)
        self.run_id = run_id
        self.off_src: list = st.get("off_src", [])
        self.off_id: list = st.get("off_id", [])
        self.cluster: list = st.get("cluster", [])
        self.topic: list = st.get("topic", [])
        self.cold: list[bytes] = st.get("cold", [])
        self.layouts: list[tuple] = st.get("layouts", [])
        self.alive = np.ones(n, bool)
        self.index = {k: i for i, k in enumerate(self.keys)}

    def __len__(self) -> int:
        return int(self.alive.sum())

    def __contains__(self, key: str) -> bool:
        i = self.index.get(key)
        return i is not None and bool(self.alive[i])

    def live_keys(self) -> list[str]:
        return [k for k, a in zip(self.keys, self.alive) if a]

    def take(self, key: str) -> Optional[dict]:
        """The partition's dict (as the dict rules would have left it), removed from the table;
        None when it is not here."""
        i = self.index.get(key)
        if i is None or not self.alive[i]:
            return None
        self.alive[i] = False
        return self._dict(i)

    def peek(self, key: str) -> dict:
        """The partition's dict without taking it out (tests and debugging)."""
        return self._dict(self.index[key])

    def _dict(self, i: int) -> dict:
        c = self.ints
        s = dict(zip(self.layouts[c["layout"][i]], pickle.loads(self.cold[i])))
        for k in HOT:
            s[k] = _o(c[k][i])
        s["applied"][(_OFFSETS, self.off_src[i])] = (int(c["off_t"][i]), [self.off_id[i]])
        s["due"] = s["observed_at"] + int(c["window"][i])
        s["due_pw"] = None
        if self.sent_ok[i]:
            s["sent"] = (self.run_id, (_o(c["leader"][i]), _o(c["n_replicas"][i]), _o(c["n_isr"][i]),
                                       _o(c["sent_hw"][i]), _o(c["sent_ls"][i]), _o(c["sent_lso"][i])))
        return s

    def take_due(self, now: int, ttl_ms: int) -> dict[str, dict]:
        """Take out the partitions the time-driven checks or the eviction have work for: the
        unobserved window is reached (``due``), or the entity is past its TTL."""
        c = self.ints
        due = self.alive & ((c["observed_at"] + c["window"] <= now) | (now - c["last_seen"] > ttl_ms))
        return {self.keys[i]: self.take(self.keys[i]) for i in np.flatnonzero(due)}

    def state(self, entities: dict[str, dict], cfg: rules_partition.PartitionRulesConfig) -> dict:
        """The table to store: the live rows plus every dict partition of ``entities`` that is
        quiet again (those are removed from ``entities``)."""
        rows = []
        layouts = {k: i for i, k in enumerate(self.layouts)}
        for key in [k for k, s in entities.items() if s.get("kind") == "partition"]:
            r = compact(entities[key], self.run_id, cfg, layouts)
            if r is not None:
                rows.append((key, r))
                del entities[key]
        live = np.flatnonzero(self.alive)
        keep = live.tolist()
        out: dict[str, Any] = {"run_id": self.run_id, "keys": [self.keys[i] for i in keep] + [k for k, _ in rows],
                               "layouts": sorted(layouts, key=layouts.__getitem__)}
        ints = {}
        new = np.array([r[0] for _, r in rows], np.int64).reshape(len(rows), len(_INT_COLUMNS))
        for j, name in enumerate(_INT_COLUMNS):
            ints[name] = np.concatenate([self.ints[name][live], new[:, j]])
        out["ints"] = ints
        out["sent_ok"] = np.concatenate([self.sent_ok[live], np.array([r[1] for _, r in rows], bool)])
        for j, name in enumerate(("off_src", "off_id", "cluster", "topic", "cold"), start=2):
            mine = getattr(self, name)
            out[name] = [mine[i] for i in keep] + [r[j] for _, r in rows]
        return out

    # -----------------------------------------------------------------------------------------

    def fold_quiet(self, rows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Apply the batch's quiet offsets rows (see the module docstring).  ``rows``: the
        batch's columns ``entity``, ``type``, ``source``, ``event_id`` (object arrays),
        ``observed_at``, ``seq``, ``high_watermark``, ``log_start_offset``, ``last_stable_offset``,
        ``metadata_at`` (int64, ``NULL`` for missing).  Returns (a mask of the rows it applied,
        the table positions of the partitions whose gauges must be sent)."""
        ent = rows["entity"]
        n = len(ent)
        none = (np.zeros(n, bool), np.empty(0, np.int64))
        if n == 0 or not self.alive.any():
            return none
        index = self.index
        pos = np.fromiter((index.get(k, -1) for k in ent), np.int64, n)
        t, hw = rows["observed_at"], rows["high_watermark"]
        ok = (pos >= 0) & (rows["type"] == _OFFSETS) & (hw != NULL) & (t != NULL)
        cand = np.flatnonzero(ok)
        if len(cand):
            ok[cand] = self.alive[pos[cand]]
            cand = np.flatnonzero(ok)
            src = self.off_src
            same = np.fromiter((s == src[p] for s, p in zip(rows["source"][cand], pos[cand])), bool, len(cand))
            ok[cand] = same
        # every row of a partition must qualify: one row that does not sends them all to the dicts
        bad = np.unique(pos[(pos >= 0) & ~ok])
        ok &= ~np.isin(pos, bad)
        sel = np.flatnonzero(ok)
        if not len(sel):
            return none
        order = sel[np.lexsort((rows["seq"][sel], t[sel], pos[sel]))]
        p, tt = pos[order], t[order]
        first = np.ones(len(order), bool)
        first[1:] = p[1:] != p[:-1]
        c = self.ints
        newest = np.maximum(np.maximum(c["off_t"][p], c["observed_at"][p]), c["hw_observed_at"][p])
        prev_t = np.where(first, newest, np.roll(tt, 1))
        late = np.unique(p[tt <= prev_t])  # not strictly newer than what came before
        if len(late):
            keep = ~np.isin(p, late)
            ok[order[~keep]] = False
            order, p, tt, first = order[keep], p[keep], tt[keep], first[keep]
            if not len(order):
                return ok, np.empty(0, np.int64)
        starts = np.flatnonzero(first)
        last = np.append(starts[1:] - 1, len(order) - 1)
        ent_pos = p[starts]
        h = hw[order]
        prev_h = np.where(first, c["hw_seen"][p], np.roll(h, 1))
        changed_t = np.where(h != prev_h, tt, NULL)  # a NULL hw_seen differs from any hw
        hw_changed = np.maximum.reduceat(changed_t, starts)
        conf = rows["metadata_at"][order]
        conf_t = np.where(conf == NULL, NULL, np.minimum(conf, tt))
        confirmed = np.maximum.reduceat(conf_t, starts)
        lr = order[last]
        t_last = t[lr]
        c["hw"][ent_pos] = hw[lr]
        c["hw_seen"][ent_pos] = hw[lr]
        c["log_start"][ent_pos] = rows["log_start_offset"][lr]
        c["lso"][ent_pos] = rows["last_stable_offset"][lr]
        for k in ("last_seen", "observed_at", "hw_observed_at", "off_t"):
            c[k][ent_pos] = t_last
        c["hw_changed_at"][ent_pos] = np.where(hw_changed != NULL, hw_changed, c["hw_changed_at"][ent_pos])
        c["md_confirmed_at"][ent_pos] = np.maximum(c["md_confirmed_at"][ent_pos], confirmed)
        ids = rows["event_id"][lr]
        for q, e in zip(ent_pos.tolist(), ids.tolist()):
            self.off_id[q] = e
        send = ~self.sent_ok[ent_pos] | (c["sent_hw"][ent_pos] != c["hw"][ent_pos]) \
            | (c["sent_ls"][ent_pos] != c["log_start"][ent_pos]) | (c["sent_lso"][ent_pos] != c["lso"][ent_pos])
        gone = ent_pos[send]
        self.sent_ok[gone] = True
        c["sent_hw"][gone], c["sent_ls"][gone], c["sent_lso"][gone] = c["hw"][gone], c["log_start"][gone], c["lso"][gone]
        return ok, gone

    def gauge_columns(self, where: np.ndarray) -> dict[str, Any]:
        """The ``partition`` upsert rows of the partitions at ``where``, as output columns
        (what ``state._entity_row`` makes of their dicts)."""
        c = self.ints
        w = where
        n = len(w)
        return {"kind": np.full(n, "partition", object), "action": np.full(n, "upsert", object),
                "cluster": np.array([self.cluster[i] for i in w.tolist()], object),
                "topic": np.array([self.topic[i] for i in w.tolist()], object),
                "partition": c["partition"][w], "leader": c["leader"][w], "replicas": c["n_replicas"][w],
                "isr": c["n_isr"][w], "high_watermark": c["hw"][w], "log_start_offset": c["log_start"][w],
                "last_stable_offset": c["lso"][w], "at": c["last_seen"][w]}
