"""The events producer of an instrumented client (``monitor.instrumentation``): an
``EventEmitter`` built from the ``events`` dict of settings, or a stand-in that drops everything
when those settings are invalid, and the source name its events go out under."""

from __future__ import annotations

import itertools
import logging
import os
import socket
from typing import Any, Callable, Mapping, Optional, Protocol

from monitor.contract import Payload
from monitor.emitter import EventEmitter

log = logging.getLogger("monitor.instrument")  # one logger for the instrumentation's modules

DEFAULT_EVENTS_TOPIC = "kafka-monitor.events"
_INSTANCE_COUNTER = itertools.count(1)


class EmitterLike(Protocol):
    """The narrow part of :class:`EventEmitter` the instrumentation uses."""

    sent: int
    dropped: int

    def emit(self, data: Payload, observed_at: Optional[int] = None, cluster: Optional[str] = None) -> Any: ...


class _DisabledEmitter:
    """Stands in when the events producer could not be created: drops (and counts) everything."""

    def __init__(self, reason: str):
        self.sent = 0
        self.dropped = 0
        self.last_error: Optional[str] = reason

    def emit(self, data: Payload, observed_at: Optional[int] = None, cluster: Optional[str] = None) -> None:
        self.dropped += 1

    def flush(self, timeout: float = 0) -> int:
        return 0


def default_source(client_id: Optional[str]) -> str:
    """A source name unique per instrumented client in this process (no '/', keys use it)."""
    return (f"instrumented-{client_id or 'rdkafka'}-{socket.gethostname()}-{os.getpid()}-"
            f"{next(_INSTANCE_COUNTER)}").replace("/", "_")


def _emitter_from_settings(settings: Mapping[str, Any], cluster: Optional[str], source: str) -> EmitterLike:
    try:
        conf = dict(settings)
        topic = str(conf.pop("topic", DEFAULT_EVENTS_TOPIC))
        max_buffered = int(conf.pop("max_buffered", 100_000))
        conf.setdefault("logger", logging.getLogger("monitor.instrument.events"))
        conf.setdefault("error_cb", _events_error_cb())
        return EventEmitter(conf, topic, cluster=cluster or "unknown", source=source, max_buffered=max_buffered)
    except Exception as e:  # bad settings must not take the application down
        log.error("kafka-monitor events producer could not be created (%s); instrumentation emits nothing", e)
        return _DisabledEmitter(str(e))


def _events_error_cb() -> Callable[[Any], None]:
    """Logs each distinct error of the events producer once (an unreachable monitoring cluster
    would otherwise repeat itself for as long as the application runs)."""
    seen: set[Any] = set()

    def on_error(err: Any) -> None:
        try:
            code = err.code()
        except Exception:
            code = str(err)
        if code not in seen and len(seen) < 100:
            seen.add(code)
            log.warning("kafka-monitor events producer: %s (events are dropped, the application is not affected)", err)

    return on_error
