"""The ``applyInPandasWithState`` function: per bucket of entities, one path for a batch's rows
and for a timeout (a batch without rows at the processing time): load the bucket (``codec``),
the quiet and new partitions' rows in columns (``columns``), the others through the rules
(``fold``), the time-driven checks and the TTL, store the bucket, emit the changed gauges and
the alert transitions (``rows``).  Layout, restarts, timers and the stored format:
docs/state.md.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pandas as pd

from monitor.gcpause import gc_paused
from streaming.ingest.packing import QUARANTINE_BUCKET
from streaming.state.codec import _load, _store
from streaming.state.config import StateConfig
from streaming.state.fence import fence
from streaming.state.columns import fold_columns
from streaming.state.fold import evict_stale, fold, tick
from streaming.state.idle_groups import PREFIX as GROUP_PARTITION
from streaming.state.rows import (_frame, _transition_columns, active_rows, changed_entity_rows, dropped_rows,
                                  pack_archive, pack_block, pack_ticks, quarantine_rows, remember_shown, removed_rows)


def on_rows(frames: list[pd.DataFrame], now: int, state: Any, bucket: int, cfg: StateConfig,
            compact: bool = True) -> pd.DataFrame:
    """A bucket's rows of one micro-batch (none when woken by its timeout) at ``now`` (the
    batch's latest event time; the processing time on a timeout): the quiet and new partitions'
    rows in columns, the others through the rules in event order, then the time-driven checks
    and the evictions at ``now``, then the bucket stored."""
    entities, table, run, fences = _load(state, cfg)
    dropped: dict[str, int] = {}
    frames, fenced = fence(frames, fences, now, cfg.source.fence_hold_ms)
    if fenced:
        dropped["fenced"] = fenced
    frames, quiet = fold_columns(table, entities, frames, cfg, compact)
    groups = table.groups
    frames = groups.fold(frames, entities)
    forgotten: list[tuple[str, dict]] = []

    def take(key: str) -> Any:
        return groups.take(key) if key.startswith(GROUP_PARTITION) else table.take(key)

    transitions, touched = fold(entities, frames, cfg, dropped, take=take, removed=forgotten)
    entities.update(table.take_due(now))
    entities.update(groups.take_expired(now, cfg.entity_ttl_ms))
    transitions += tick(entities, now, cfg, groups.at_rest_per_group())
    remember_shown(entities, transitions)
    out = changed_entity_rows(entities, touched, cfg.run_id)
    if len(quiet):
        out.append(pack_block(table.gauge_columns(quiet)))
    gone, evicted = evict_stale(entities, now, cfg.entity_ttl_ms)
    transitions += gone
    # an entity forgotten and then seen again in this batch (re-created) keeps its series
    removed = [r for k, r in forgotten if k not in entities and k not in table and k not in groups] + evicted
    after = dropped_rows(dropped, now) + removed + removed_rows([r for _, r in forgotten] + evicted, now)
    if run != cfg.run_id:  # a new run: its exporter has not seen the alerts still open
        after += active_rows(entities)
    row, kept = _store(state, entities, table, compact, bucket, fences)
    if kept:
        state.setTimeoutDuration(cfg.tick_ms)
    after.append(row)
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
                now = int(state.getCurrentProcessingTimeMs())
                if cfg.archive:  # the moment, for a replay: it is in no event
                    yield _frame([pack_ticks(bucket, now)])
                yield on_rows([], now, state, bucket, cfg, compact_partitions)
            elif bucket == QUARANTINE_BUCKET:
                yield _frame(quarantine_rows(pdfs))
            else:
                frames = [f for f in pdfs if len(f)]
                if cfg.archive:  # as received: before the rules see them
                    packed = pack_archive(frames, bucket)
                    if packed is not None:
                        yield _frame([packed])
                now = int(max(f["observed_at"].max() for f in frames))
                yield on_rows(frames, now, state, bucket, cfg, compact_partitions)

    return update_bucket
