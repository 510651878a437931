"""The job's own parser and state function run over captured events without Spark: one bucket,
one micro-batch per call, the processing time the batch's newest event time.  For tests that
need to know what the job would raise from what a real probe emitted; Spark's part (the source,
the shuffle, the checkpoint) is tested through the real job elsewhere."""

from __future__ import annotations

from typing import Iterable, Optional

import pandas as pd
import pyarrow as pa

from monitor.contract import Event
from streaming.ingest import parsing
from streaming.state import function as st
from streaming.ingest.schema import FLAT_COLUMNS

COLS = [n for n, _ in FLAT_COLUMNS]


class _State:
    """The part of pyspark's GroupState the state function uses."""

    def __init__(self) -> None:
        self.value = None
        self.hasTimedOut = False

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self):
        return self.value

    def update(self, v) -> None:
        self.value = v

    def remove(self) -> None:
        self.value = None

    def setTimeoutDuration(self, ms) -> None:
        pass

    def getCurrentProcessingTimeMs(self) -> int:
        return 0


class LocalJob:
    def __init__(self, cfg: Optional[st.StateConfig] = None):
        self._fn = st.make_state_function(cfg or st.StateConfig(run_id="local"))
        self._state = _State()
        #: every alert transition, in order: (alert, action, entity labels, event time)
        self.transitions: list[dict] = []
        self.quarantined: list[str] = []

    def batch(self, events: Iterable[Event]) -> list[dict]:
        """Fold one micro-batch of events; returns its alert transitions."""
        values = [e.to_json() for e in events]
        if not values:
            return []
        table = parsing.parse_values(pa.array(values, pa.binary()), gate=False)
        rows = table.to_pylist()
        self.quarantined += [r["reason"] for r in rows if r["reason"] is not None]
        good = [r for r in rows if r["reason"] is None]
        if not good:
            return []
        df = pd.DataFrame([{c: r.get(c) for c in COLS} for r in good], columns=COLS)
        df["bucket"] = 0
        frames = list(self._fn((0,), iter([df]), self._state))
        if not frames:
            return []
        out = pd.concat(frames, ignore_index=True)
        alerts = out[out.kind == "alert"]
        got = [{"alert": a.alert, "action": a.action, "topic": a.topic, "partition": a.partition,
                "group": a.consumer_group, "source": a.source, "at": a.at, "evidence": a.evidence}
               for a in alerts.itertuples()]
        self.transitions += got
        return got

    def open_alerts(self) -> set[tuple]:
        """(alert, topic, partition, group, source) of every alert open after the last batch."""
        opened: set[tuple] = set()
        for t in self.transitions:
            key = (t["alert"], t["topic"], None if pd.isna(t["partition"]) else int(t["partition"]), t["group"],
                   t["source"])
            if t["action"] == "open":
                opened.add(key)
            else:
                opened.discard(key)
        return opened
