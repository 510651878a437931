"""Group partitions at rest, in columns: a group partition whose consumer is caught up (its
committed offset at the high watermark) in each of its last ``window`` observations, with no
alert open and nothing else pending, is kept as a few ints and its history's times instead of a
dict.  An observation that repeats it (the same offsets, from the same source, later) changes
only times: it is applied with numpy, as the lag rules would (its time joins the history and
moves the HW marks' last point, the trend and the drift).  Any other row for it takes the dict
back out (``take``) for the rules.  Why and on which conditions: docs/state.md; checked against
the dict rules by tests/unit/test_idle_groups.py.
"""

from __future__ import annotations

import pickle
from typing import Any, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from streaming.state.fold import _ints
from streaming.state.table import NULL, _narrow, codes_of, event_keys

GROUP_OFFSETS = "group_offsets"
PREFIX = "group_partition|"

#: the dict keys a group partition at rest has, rebuilt from the columns (its other keys are
#: its cold part, with the HW marks but their last point)
_REBUILT = ("kind", "cluster", "group", "committed", "hw", "lag", "last_seen", "history", "trend", "drift",
            "drift_clear", "applied", "sent", "rc_lag", "status", "lag_seconds", "lag_seconds_basis", "open",
            "stuck", "anchor", "high_since", "rewound", "lag_from", "at_lso")
#: ... of which these are None at rest
_NONE = ("stuck", "anchor", "high_since", "rewound", "lag_from", "at_lso")
_SKIP = frozenset(_REBUILT)
#: int columns: the committed offset (= the HW), the lag to the LSO (NULL: None), the last
#: observation's time, its event id's key (NULL: none), codes of its source, of (cluster,
#: group) and of the cold part's key layout
_INTS = ("c", "rc", "last", "eid", "src", "grp", "layout")


def _rc(c: np.ndarray, lso: np.ndarray) -> np.ndarray:
    """``lag.offset_lag(committed, lso)`` in columns (``lag._offset``: a negative LSO is none)."""
    return np.where((lso == NULL) | (lso < 0), NULL, np.maximum(0, lso - c))


def at_rest(s: dict, run_id: str, window: int) -> bool:
    """Whether dict ``s`` (a group partition after the rules) is at rest: caught up at each of
    its last ``window`` observations, which all saw the same offset, status OK, nothing open or
    running (stuck run, rewind, lag timer, transaction), its gauges sent in this run, one
    source's one event admitted at its last time: the state an observation repeating it leaves
    changed only in its times."""
    c, t = s.get("committed"), s.get("last_seen")
    if (type(c) is not int or s.get("hw") != c or s.get("lag") != 0 or s.get("status") != "OK" or s.get("open")
            or type(t) is not int or not _SKIP.issubset(s) or any(s[k] is not None for k in _NONE)):
        return False
    h = s["history"]
    if len(h) != window or h[-1][0] != t or any(len(p) != 3 or p[1] != c or p[2] != c for p in h):
        return False
    if any(type(p[0]) is not int or p[0] >= q[0] for p, q in zip(h, h[1:])):
        return False
    marks = s.get("marks")
    if not isinstance(marks, list) or len(marks) < 2 or marks[-1] != [t, c] or marks[-2][1] != c:
        return False
    if s["trend"] != [[t, 0]] or s["drift"] != [[t, 0]] or s["drift_clear"] != t:
        return False
    applied = s["applied"]
    if len(applied) != 1:
        return False
    (etype, src), (at, ids) = next(iter(applied.items()))
    if etype != GROUP_OFFSETS or type(src) is not str or at != t or len(ids) != 1 or not (ids[0] is None or type(ids[0]) is int):
        return False
    rc = s["rc_lag"]
    return (s["lag_seconds"] == 0.0 and type(s["lag_seconds"]) is float and s["lag_seconds_basis"] == "caught-up"
            and (rc is None or type(rc) is int) and s["sent"] == (run_id, (c, c, 0, 0.0, "OK", rc)))


class IdleGroups:
    """A bucket's group partitions at rest (see the module docstring).  One place per group
    partition: here (``alive``) or a dict in the bucket's entities."""

    def __init__(self, state: Optional[dict] = None, run_id: str = "", window: int = 10):
        st = state or {}
        self.run_id, self.window = run_id, window
        #: the run whose exporter was sent their gauges (``sent``): this one, unless ``stale``
        self.sent_run = st.get("run_id", run_id)
        self.keys: pa.Array = st.get("keys", pa.array([], pa.string()))
        n = len(self.keys)
        self.ints = {c: st["ints"][c].astype(np.int64) if st else np.empty(0, np.int64) for c in _INTS}
        if st:
            self.ints["last"] = self.ints["last"] + st["last0"]
            # the history's times, stored as each one's distance to the last
            self.hist = self.ints["last"][:, None] - st["hist"].astype(np.int64)
        else:
            self.hist = np.empty((0, window), np.int64)
        self.cold: pa.Array = st.get("cold", pa.array([], pa.binary()))
        if isinstance(self.cold, pa.DictionaryArray):
            self.cold = self.cold.dictionary_decode()
        self.uniq: dict[str, list] = {c: list(st["uniq"][c]) if st else [] for c in ("src", "grp")}
        self.layouts: list[tuple] = list(st.get("layouts", []))
        self.alive = np.ones(n, bool)
        #: written by another run (its exporter has not seen the gauges) or with another window:
        #: the partitions go back to the dicts (``take_all``) before anything else
        self.stale = bool(st) and (st.get("run_id") != run_id or self.hist.shape[1] != window)
        self._index: Optional[dict[str, int]] = None

    def _position(self, key: str) -> Optional[int]:
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.keys.to_pylist())}
        i = self._index.get(key)
        return None if i is None or not self.alive[i] else i

    def __contains__(self, key: str) -> bool:
        return key.startswith(PREFIX) and self._position(key) is not None

    def live_keys(self) -> list[str]:
        return self.keys.filter(pa.array(self.alive)).to_pylist()

    def _dict(self, i: int) -> dict:
        c, t = int(self.ints["c"][i]), int(self.ints["last"][i])
        rc = None if self.ints["rc"][i] == NULL else int(self.ints["rc"][i])
        eid = None if self.ints["eid"][i] == NULL else int(self.ints["eid"][i])
        cluster, group = self.uniq["grp"][self.ints["grp"][i]]
        d: dict[str, Any] = dict(zip(self.layouts[self.ints["layout"][i]], pickle.loads(self.cold[i].as_py())))
        d["marks"] = d["marks"] + [[t, c]]
        d.update(kind="group_partition", cluster=cluster, group=group, committed=c, hw=c, lag=0, last_seen=t,
                 history=[[x, c, c] for x in self.hist[i].tolist()], trend=[[t, 0]], drift=[[t, 0]], drift_clear=t,
                 applied={(GROUP_OFFSETS, self.uniq["src"][self.ints["src"][i]]): (t, [eid])},
                 sent=(self.sent_run, (c, c, 0, 0.0, "OK", rc)), rc_lag=rc, status="OK", lag_seconds=0.0,
                 lag_seconds_basis="caught-up", open={})
        d.update(dict.fromkeys(_NONE))
        return d

    def take(self, key: str) -> Optional[dict]:
        """The group partition's dict (as the rules left it), out of the columns; None when it
        is not here."""
        i = self._position(key) if key.startswith(PREFIX) else None
        if i is None:
            return None
        self.alive[i] = False
        return self._dict(i)

    def peek(self, key: str) -> dict:
        """The dict without taking it out (tests and debugging)."""
        i = self._position(key)
        assert i is not None, key
        return self._dict(i)

    def _take(self, where: np.ndarray) -> dict[str, dict]:
        at = np.flatnonzero(self.alive & where)
        self.alive[at] = False
        return {k: self._dict(i) for i, k in zip(at.tolist(), self.keys.take(pa.array(at, pa.int64())).to_pylist())}

    def take_all(self) -> dict[str, dict]:
        return self._take(np.ones(len(self.alive), bool))

    def take_expired(self, now: int, ttl_ms: int) -> dict[str, dict]:
        """The ones past the entity TTL (``rules.base.evict`` then removes them)."""
        return self._take(now - self.ints["last"] > ttl_ms)

    def at_rest_per_group(self) -> dict[tuple[str, str], int]:
        """(cluster, group) -> how many of its partitions are here (each with lag 0, no lag start)."""
        n = np.bincount(self.ints["grp"][self.alive], minlength=len(self.uniq["grp"]))
        return {g: int(k) for g, k in zip(self.uniq["grp"], n.tolist()) if k}

    def fold(self, frames: list[pd.DataFrame], entities: dict[str, Any]) -> list[pd.DataFrame]:
        """Apply the rows that repeat a group partition at rest; return the frames without them.
        A group_gone row takes its group's partitions into ``entities`` (the rule looks for them
        there); other rows for those here are taken when the rules ask (``take``)."""
        if not frames or not self.alive.any():
            return frames
        typ = np.concatenate([f["type"].to_numpy(dtype=object) for f in frames])
        gone = np.flatnonzero(typ == "group_gone")
        if len(gone):
            cl = np.concatenate([f["cluster"].to_numpy(dtype=object) for f in frames])[gone]
            gr = np.concatenate([f["group"].to_numpy(dtype=object) for f in frames])[gone]
            code = {g: i for i, g in enumerate(self.uniq["grp"])}
            codes = [code[g] for g in zip(cl.tolist(), gr.tolist()) if g in code]
            if codes:
                entities.update(self._take(np.isin(self.ints["grp"], codes)))
        is_go = typ == GROUP_OFFSETS
        if not is_go.any():
            return frames
        ent = np.concatenate([f["entity"].to_numpy(dtype=object) for f in frames])
        pos = pc.fill_null(pc.index_in(pa.array(ent, pa.string()), value_set=self.keys), -1).to_numpy().astype(np.int64)
        here = pos >= 0
        here[here] = self.alive[pos[here]]
        j = np.flatnonzero(here & is_go)
        if not len(j):
            return frames
        cols = {c: np.concatenate([_ints(f[c]) if c in f else np.full(len(f), NULL, np.int64) for f in frames])[j]
                for c in ("observed_at", "committed_offset", "high_watermark", "last_stable_offset")}
        src = np.concatenate([f["source"].to_numpy(dtype=object) for f in frames])[j]
        p = pos[j]
        c = self.ints["c"][p]
        t = cols["observed_at"]
        ok = ((t != NULL) & (t > self.ints["last"][p]) & (cols["committed_offset"] == c) & (cols["high_watermark"] == c)
              & (_rc(c, cols["last_stable_offset"]) == self.ints["rc"][p])
              & (pd.Index(self.uniq["src"], dtype=object).get_indexer(src) == self.ints["src"][p]))
        # every row of a partition in the batch must repeat it, at distinct times (a job catching
        # up reads several cycles in one batch): else all its rows go to the rules
        n = len(self.alive)
        ok &= np.bincount(p[ok], minlength=n)[p] == np.bincount(pos[here], minlength=n)[p]
        sel = np.flatnonzero(ok)
        order = sel[np.lexsort((t[sel], p[sel]))]
        same = np.r_[False, p[order][1:] == p[order][:-1]]
        tied = same & (t[order] == np.r_[NULL, t[order][:-1]])
        if tied.any():
            order = order[~np.isin(p[order], p[order][tied])]
            same = np.r_[False, p[order][1:] == p[order][:-1]]
        if not len(order):
            return frames
        ps, ts = p[order], t[order]
        starts = np.flatnonzero(~same)
        rank = np.arange(len(ps)) - starts[np.cumsum(~same) - 1]
        eids = event_keys(np.concatenate([f["event_id"].to_numpy(dtype=object) for f in frames])[j[order]])
        for r in range(int(rank.max()) + 1):  # the partitions' first rows, then their second ones, ...
            m = rank == r
            q = ps[m]
            self.hist[q, :-1] = self.hist[q, 1:]
            self.hist[q, -1] = ts[m]
            self.ints["last"][q] = ts[m]
            self.ints["eid"][q] = eids[m]
        done = np.zeros(len(typ), bool)
        done[j[order]] = True
        rest, at = [], 0
        for f in frames:
            keep = ~done[at:at + len(f)]
            at += len(f)
            if keep.all():
                rest.append(f)
            elif keep.any():
                rest.append(f[keep])
        return rest

    def state(self, entities: dict[str, Any]) -> Optional[dict]:
        """What to store: the live rows plus every dict group partition of ``entities`` at rest
        (those leave ``entities``); None when there are none."""
        new = [k for k, s in entities.items() if s.get("kind") == "group_partition"
               and at_rest(s, self.run_id, self.window)]
        live = np.flatnonzero(self.alive)
        if not len(live) and not new:
            return None
        layouts = {k: i for i, k in enumerate(self.layouts)}
        rows: list[tuple] = []
        hist: list[list[int]] = []
        cold: list[bytes] = []
        for k in new:
            s = entities.pop(k)
            rest = {n: v for n, v in s.items() if n not in _SKIP}
            rest["marks"] = s["marks"][:-1]
            names = tuple(rest)
            lay = layouts.setdefault(names, len(layouts))
            (_, src), (_, ids) = next(iter(s["applied"].items()))
            rows.append((s["committed"], NULL if s["rc_lag"] is None else s["rc_lag"], s["last_seen"],
                         NULL if ids[0] is None else ids[0], src, (s["cluster"], s["group"]), lay))
            hist.append([p[0] for p in s["history"]])
            cold.append(pickle.dumps(tuple(rest.values()), protocol=pickle.HIGHEST_PROTOCOL))
        ints = {}
        for j, name in enumerate(_INTS):
            if name in ("src", "grp"):
                added = codes_of(self.uniq[name], [r[j] for r in rows])
            else:
                added = np.array([r[j] for r in rows], np.int64)
            ints[name] = np.concatenate([self.ints[name][live], added])
        for name in ("src", "grp"):  # values no partition here uses any more (a deleted group) leave the list
            used = np.unique(ints[name])
            if len(self.uniq[name]) > len(used) + 64:
                remap = np.full(len(self.uniq[name]), -1, np.int64)
                remap[used] = np.arange(len(used))
                ints[name] = remap[ints[name]]
                self.uniq[name] = [self.uniq[name][i] for i in used.tolist()]
        times = np.concatenate([self.hist[live], np.array(hist, np.int64).reshape(len(hist), self.window)])
        keep = pa.array(live, pa.int64())
        last0 = int(ints["last"].min())
        return {"run_id": self.run_id, "layouts": sorted(layouts, key=layouts.__getitem__),
                "keys": pa.concat_arrays([self.keys.take(keep), pa.array(new, pa.string())]),
                "ints": {n: _narrow(v - last0 if n == "last" else v) for n, v in ints.items()}, "last0": last0,
                "hist": _narrow(ints["last"][:, None] - times),
                "cold": pc.dictionary_encode(pa.concat_arrays([self.cold.take(keep), pa.array(cold, pa.binary())])),
                "uniq": self.uniq}
