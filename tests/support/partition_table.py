"""Comparing the state function with the partition table (the default) and without it (every row
through the dict rules): its output rows and stored entities made comparable, and a count of the
paths the table took (tests/unit/test_partition_table.py, test_partition_table_stateful.py)."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pandas as pd

from streaming.state import table as pt
from streaming.state import codec
from tests.support.state_fakes import FakeState


def _canon(v):
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, (np.integer, np.floating)):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _rows(out: pd.DataFrame) -> list[tuple]:
    """The output rows, comparable: a ``state`` row's stored bytes differ by design (the table
    stores columns, the dicts pickles), its entities by kind do not."""
    out = out.copy()
    out.loc[out.kind == "state", "count"] = None
    return sorted((tuple(_canon(v) for v in r) for r in out.itertuples(index=False, name=None)), key=repr)


def _norm(x):
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_norm(v) for v in x)
    return _canon(x)


def _state(s: FakeState, run: str) -> dict:
    """The stored entities; a ``sent`` mark of another run is dropped (it means "not sent in
    this run" exactly as no mark does: the table forgets it, the dicts keep it)."""
    if s.value is None:
        return {}
    out = _norm(codec.stored_entities(s.value[0], run))
    for e in out.values():
        if e.get("sent") is not None and e["sent"][0] != run:
            del e["sent"]
    return out


@contextlib.contextmanager
def counting_table_paths():
    """Count, while inside, the rows the table applies in columns (``quiet_rows``, of which
    ``quiet_metadata``), the partitions it hands back to the dict rules (``taken``) and those
    put in from their first batch (``born``, ``state.fold_new``)."""
    seen = {"quiet_rows": 0, "quiet_metadata": 0, "taken": 0, "born": 0}
    real_fold, real_take, real_add = pt.PartitionTable.fold_quiet, pt.PartitionTable.take, pt.PartitionTable.add

    def fold_quiet(self, cols):
        done, gauges = real_fold(self, cols)
        seen["quiet_rows"] += int(done.sum())
        seen["quiet_metadata"] += int((done & (cols["type"] == "partition_metadata")).sum())
        return done, gauges

    def take(self, key):
        got = real_take(self, key)
        seen["taken"] += got is not None
        return got

    def add(self, keys, *a):
        seen["born"] += len(keys)
        return real_add(self, keys, *a)

    pt.PartitionTable.fold_quiet, pt.PartitionTable.take, pt.PartitionTable.add = fold_quiet, take, add
    try:
        yield seen
    finally:
        pt.PartitionTable.fold_quiet, pt.PartitionTable.take, pt.PartitionTable.add = real_fold, real_take, real_add
