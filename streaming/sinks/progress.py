"""The job's own health from Spark's progress reports: events behind, unreadable partitions of
the events topic, state keys, batch duration."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from pyspark.sql.streaming import StreamingQueryListener

from streaming.sinks.exporter import Exporter


def source_offsets(o: Any) -> dict[tuple[str, str], int]:
    """A source offset from a progress report -> {(topic, partition): offset}.  Ours is
    ``{"topic": T, "offsets": {"0": n}}``; Spark's kafka source's is ``{"<topic>": {"0": n}}``."""
    if not o:
        return {}
    if isinstance(o.get("topic"), str) and isinstance(o.get("offsets"), dict):
        return {(o["topic"], str(p)): int(n) for p, n in o["offsets"].items()}
    return {(str(t), str(p)): int(n) for t, parts in o.items() for p, n in parts.items()}


def report_progress(p: Any, exporter: Exporter) -> None:
    """The job's own health from Spark's progress of a batch (a StreamingQueryProgress or its
    dict): how far behind the events topic it is, state rows, batch duration."""
    if not p:
        return
    get = (lambda o, k, d=None: o.get(k, d)) if isinstance(p, dict) else (lambda o, k, d=None: getattr(o, k, d))
    behind, unreadable, oldest = 0, 0, None
    for src in get(p, "sources", []) or []:
        latest, end = get(src, "latestOffset"), get(src, "endOffset")
        try:
            latest = json.loads(latest) if isinstance(latest, str) else latest
            lo = source_offsets(latest)
            eo = source_offsets(json.loads(end) if isinstance(end, str) else end)
            for part, off in lo.items():
                behind += max(0, off - eo.get(part, 0))
            # our source: partitions whose offsets it could not read (streaming.read.source)
            for v in ((latest or {}).get("unreadable") or {}).values():
                unreadable += 1
                oldest = v["since"] if oldest is None else min(oldest, v["since"])
        except (ValueError, TypeError, AttributeError, KeyError):
            continue
    state_keys = sum(get(op, "numRowsTotal", 0) or 0 for op in get(p, "stateOperators", []) or [])
    duration_ms = get(p, "durationMs", {}) or {}
    exporter.progress(events_behind=behind, state_keys=state_keys,
                      duration_s=(duration_ms.get("triggerExecution", 0) or 0) / 1000.0, unreadable=unreadable,
                      unreadable_s=max(0.0, time.time() - oldest / 1000.0) if oldest is not None else 0.0)


class ProgressListener(StreamingQueryListener):
    """Feeds the exporter from Spark's progress events of one query."""

    def __init__(self, exporter: Exporter):
        self.exporter = exporter
        self.query_id: Optional[str] = None

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        if self.query_id is None or str(p.id) == self.query_id:
            report_progress(p, self.exporter)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if str(event.id) == self.query_id and event.exception:
            self.exporter.set_up(False)
