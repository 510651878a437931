"""An events producer that keeps what the probe emits in memory (the probe's cluster side stays
real): the tests that take brokers away need no events topic that could go down with them."""

from __future__ import annotations

import threading
from typing import Any, Optional

from monitor.contract import Event
from monitor.emitter import EventEmitter
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig


class _Delivered:
    """What a delivery report's message tells the emitter: its partition."""

    def partition(self) -> int:
        return 0


class CapturingProducer:
    """The slice of confluent_kafka.Producer that EventEmitter calls; every record is delivered
    (to partition 0) at the next poll."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._pending: list[Any] = []
        self._lock = threading.Lock()

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: Any = None, partition: int = -1) -> None:
        with self._lock:
            self.events += Event.from_json(value).expand()  # a v3 record: its events
            if on_delivery is not None:
                self._pending.append(on_delivery)

    def poll(self, timeout: float = 0) -> int:
        with self._lock:
            pending, self._pending = self._pending, []
        for cb in pending:
            cb(None, _Delivered())
        return len(pending)

    def flush(self, timeout: float = 0) -> int:
        self.poll(0)
        return 0


def capturing_probe(cfg: ProbeConfig) -> tuple[Probe, CapturingProducer]:
    producer = CapturingProducer()
    emitter = EventEmitter({}, cfg.events_topic, cluster=cfg.cluster or "unknown", source=cfg.source,
                           producer=producer)
    return Probe(cfg, emitter=emitter), producer


def of_type(events: list[Event], etype: str, **match: Any) -> list[Event]:
    return [e for e in events if e.type == etype and all(getattr(e.data, k) == v for k, v in match.items())]


def latest(events: list[Event], etype: str, **match: Any) -> Optional[Event]:
    hits = of_type(events, etype, **match)
    return max(hits, key=lambda e: e.seq) if hits else None
