"""Produce contract events into the events topic.

Idempotent producer, records keyed by entity.  Buffering is bounded: when librdkafka's local
queue is full the event is dropped and counted (the probe must never block or grow without
bound because the events topic is slow or unreachable).  Delivery failures are counted too;
both counts travel in every heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from confluent_kafka import KafkaError, Producer

from monitor.contract import Event, Payload

log = logging.getLogger(__name__)


class EventEmitter:
    def __init__(self, producer_conf: dict[str, Any], topic: str, *, cluster: str, source: str,
                 max_buffered: int = 100_000, clock: Callable[[], float] = time.time,
                 producer: Optional[Any] = None):
        conf = {
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": max_buffered,
            "message.timeout.ms": 120_000,
        }
        conf.update(producer_conf)
        self._producer = producer if producer is not None else Producer(conf)
        self.topic = topic
        self.cluster = cluster
        self.source = source
        self._clock = clock
        self._seq = 0
        self._lock = threading.Lock()
        self.sent = 0          # delivered and acknowledged
        self.dropped = 0       # refused locally (queue full) or failed delivery
        self.last_error: Optional[str] = None

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def emit(self, data: Payload, observed_at: Optional[int] = None, cluster: Optional[str] = None) -> Optional[Event]:
        with self._lock:
            seq = self._seq
            self._seq += 1
        ev = Event.of(data, cluster=cluster or self.cluster, source=self.source, seq=seq,
                      observed_at=self.now_ms() if observed_at is None else observed_at)
        try:
            self._producer.produce(self.topic, key=ev.key().encode(), value=ev.to_json(),
                                   on_delivery=self._on_delivery)
        except BufferError:
            self.dropped += 1
            self._producer.poll(0)
            return None
        except Exception as e:  # KafkaException for e.g. an unknown topic in strict configs
            self.dropped += 1
            self.last_error = str(e)
            log.warning("could not enqueue %s event: %s", ev.type, e)
            return None
        self._producer.poll(0)
        return ev

    def _on_delivery(self, err: Optional[KafkaError], msg: Any) -> None:
        if err is None:
            self.sent += 1
        else:
            self.dropped += 1
            if self.last_error != str(err):
                log.warning("event delivery failed: %s", err)
            self.last_error = str(err)

    def poll(self, timeout: float = 0) -> None:
        self._producer.poll(timeout)

    def flush(self, timeout: float = 10.0) -> int:
        """Wait for outstanding deliveries; returns how many are still undelivered."""
        return self._producer.flush(timeout)

    def close(self, timeout: float = 10.0) -> int:
        """Final flush, then release the producer (its threads and connections go with it);
        returns how many events were still undelivered and so are lost."""
        left = self._producer.flush(timeout)
        self._producer = _Closed()
        return left


class _Closed:
    """Stands in for the producer after close(): emitting then drops and counts."""

    def produce(self, *a: Any, **kw: Any) -> None:
        raise BufferError("emitter closed")

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0
