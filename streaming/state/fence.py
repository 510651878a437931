"""Fencing an HA group's shards (docs/ha.md): an event of a shard whose epoch is older than the
newest epoch the bucket has seen for that shard comes from a probe that lost the shard (paused
past its session timeout, then back) and is dropped before the rules see it (reason ``fenced``).

Each bucket keeps, per (cluster, shard), the newest epoch and the latest event time seen with it;
at most clusters x shards entries.  A fence lapses when its epoch has sent nothing for
``hold_ms`` (its owner gone and no newer one: the shard topic made again, its epochs starting
over), so a lower epoch is taken again rather than the shard being blind for good.  A bucket
decides on what it has seen: a stale owner's events that reach a bucket before the new owner's
first do are applied (they are older observations, in order)."""

from __future__ import annotations

import numpy as np
import pandas as pd

#: (cluster, shard) -> [newest epoch, latest event time with it]
Fences = dict[tuple[str, int], list[int]]


def fence(frames: list[pd.DataFrame], fences: Fences, now: int, hold_ms: int) -> tuple[list[pd.DataFrame], int]:
    """The frames without the rows of a fenced epoch, and how many were dropped; ``fences`` is
    brought up to date (and pruned of lapsed fences)."""
    for k in [k for k, (_, t) in fences.items() if now - t > hold_ms]:
        del fences[k]
    parts = []
    for i, f in enumerate(frames):
        if "epoch" not in f.columns:
            continue
        e = f["epoch"].to_numpy(dtype=np.float64, na_value=np.nan)
        m = ~np.isnan(e)
        if m.any():
            parts.append(pd.DataFrame({
                "frame": i, "row": np.flatnonzero(m), "cluster": f["cluster"].to_numpy(dtype=object)[m],
                "shard": f["shard"].to_numpy(dtype=np.float64, na_value=0)[m].astype(np.int64),
                "epoch": e[m].astype(np.int64),
                "t": f["observed_at"].to_numpy(dtype=np.float64, na_value=0)[m].astype(np.int64)}))
    if not parts:
        return frames, 0
    d = pd.concat(parts, ignore_index=True)
    keys = ["cluster", "shard"]
    d["top"] = d.groupby(keys, sort=False)["epoch"].transform("max")
    newest = d[d["epoch"] == d["top"]].groupby(keys, sort=False).agg(epoch=("epoch", "max"), t=("t", "max"))
    for (cl, sh), (e, t) in zip(newest.index, newest.itertuples(index=False)):
        held = fences.get((cl, sh))
        if held is None or e > held[0] or now - held[1] > hold_ms:
            fences[(cl, sh)] = [int(e), int(t)]
        elif e == held[0]:
            held[1] = max(held[1], int(t))
    floor = np.fromiter((fences[(cl, sh)][0] for cl, sh in zip(d["cluster"], d["shard"])), np.int64, len(d))
    stale = d[d["epoch"].to_numpy() < floor]
    if not len(stale):
        return frames, 0
    out = []
    drop = stale.groupby("frame")["row"].apply(list).to_dict()
    for i, f in enumerate(frames):
        rows = drop.get(i)
        if rows is None:
            out.append(f)
            continue
        keep = np.ones(len(f), bool)
        keep[rows] = False
        if keep.any():
            out.append(f[keep])
    return out, len(stale)
