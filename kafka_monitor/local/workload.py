"""A small demo workload so the embedded default has something to show: a producer writing
to ``demo.orders`` and a consumer group ``demo-app`` that commits, falls behind now and then
(it pauses for a few seconds every half minute) and catches up again."""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from confluent_kafka import Consumer, Producer

log = logging.getLogger(__name__)

TOPIC = "demo.orders"
GROUP = "demo-app"
#: the consumer stops consuming for PAUSE_S seconds every PAUSE_EVERY_S seconds
PAUSE_EVERY_S = 30.0
PAUSE_S = 8.0


def produce_loop(bootstrap: str, stop: threading.Event, rate_per_s: float = 200.0, topic: str = TOPIC,
                 conf: Optional[dict] = None) -> None:
    """``conf``: librdkafka properties over the defaults (the real-cluster demo quiets the logs)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "log_level": 3, **(conf or {})})
    n = 0
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            for _ in range(int(rate_per_s / 10)):
                try:
                    p.produce(topic, key=str(n % 97).encode(), value=b'{"order":%d}' % n)
                    n += 1
                except BufferError:
                    p.poll(0.1)
            p.poll(0)
            stop.wait(max(0.0, 0.1 - (time.monotonic() - t0)))
    finally:
        p.flush(5)


def consume_loop(bootstrap: str, stop: threading.Event, pause_every_s: float = PAUSE_EVERY_S,
                 pause_s: float = PAUSE_S, topic: str = TOPIC, group: str = GROUP,
                 conf: Optional[dict] = None) -> None:
    """``pause_s`` 0: never falls behind on purpose.  ``conf``: as for ``produce_loop``."""
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
        "log_level": 3, **(conf or {}),
    })
    c.subscribe([topic])
    last_commit = time.monotonic()
    started = time.monotonic()
    try:
        while not stop.is_set():
            phase = (time.monotonic() - started) % pause_every_s
            if phase > pause_every_s - pause_s:
                c.poll(0)  # keep the group membership; fall behind on purpose
                stop.wait(0.2)
                continue
            c.consume(num_messages=500, timeout=0.2)
            if time.monotonic() - last_commit >= 1.0:
                try:
                    c.commit(asynchronous=False)
                except Exception as e:  # nothing consumed yet, or a rebalance in progress
                    log.debug("commit: %s", e)
                last_commit = time.monotonic()
    finally:
        c.close()
