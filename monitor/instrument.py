"""Instrument an application's own confluent-kafka clients so they emit kafka-monitor events.

Two ways in, both leave what the application sees unchanged:

``instrument(conf, events=...)``
    returns a NEW config dict for ``confluent_kafka.Consumer`` or ``Producer``: ``stats_cb`` and
    ``error_cb`` are wrapped (the application's own callbacks still run first, with the identical
    argument), and ``statistics.interval.ms`` is set to 5000 when the application set none.
    ``instrumentation_of(conf)`` gives back the :class:`Instrumentation` (counters, ``close()``).

``InstrumentedProducer(conf, events=...)``
    a ``confluent_kafka.Producer`` subclass with the same config wrapping, whose delivery reports
    (the config's ``on_delivery`` and each ``produce()``'s own callback, which still run) are
    counted: ``client_produce`` then carries the writes delivered, failed by error code, and the
    delivery latency.  With ``instrument(conf)`` only the config's ``on_delivery`` is seen.

``InstrumentedConsumer(conf, events=...)``
    a ``confluent_kafka.Consumer`` subclass with the same config wrapping, whose ``subscribe()``
    also chains the rebalance callbacks, whose ``poll()``/``consume()`` watch for group errors and
    whose ``close()`` flushes the events (bounded).  A plain ``Consumer`` built from
    ``instrument(conf)`` gets the same rebalance events with
    ``consumer.subscribe(topics, **instrumentation_of(conf).rebalance_callbacks(on_assign=...))``.

What is emitted, and how the instrumentation never blocks or breaks the application:
``monitor.instrumentation``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

from confluent_kafka import Consumer, Producer

from monitor.instrument_events import EmitterLike
from monitor.instrumentation import _UNSET, Instrumentation, _DeliveryCallback, _StatsCallback, _str_or_none


def instrument(conf: Mapping[str, Any], *, events: Union[EmitterLike, Mapping[str, Any]], group: Optional[str] = None,
               cluster: Optional[str] = None, source: Optional[str] = None) -> dict[str, Any]:
    """A new config for ``confluent_kafka.Consumer``/``Producer`` that emits kafka-monitor events.

    ``group`` defaults to ``group.id``.  See ``monitor.instrumentation`` for what is emitted;
    rebalance events need ``instrumentation_of(result).rebalance_callbacks(...)`` in ``subscribe`` (or use
    :class:`InstrumentedConsumer`), and ``instrumentation_of(result).bind(client)`` lets the
    events carry the cluster id when ``cluster`` is not given."""
    inst = Instrumentation(events=events, group=group or _str_or_none(conf.get("group.id")), cluster=cluster,
                           source=source, client_id=_str_or_none(conf.get("client.id")))
    return inst.wrap(conf)


def instrumentation_of(conf: Mapping[str, Any]) -> Optional[Instrumentation]:
    """The :class:`Instrumentation` behind a config returned by :func:`instrument`, or None."""
    cb = conf.get("stats_cb")
    return cb.instrumentation if isinstance(cb, _StatsCallback) else None


class InstrumentedConsumer(Consumer):
    """A ``confluent_kafka.Consumer`` that emits kafka-monitor events; otherwise the same consumer.

    ``subscribe`` chains the rebalance callbacks (and emits ``join_started``); ``poll``/``consume``
    return exactly what the base class returns and only look at error messages for group failures;
    ``close`` closes the consumer, then flushes the events for at most ``close_flush_timeout``
    seconds (only an emitter created here; an app-supplied emitter is the app's to flush)."""

    def __init__(self, conf: Optional[Mapping[str, Any]] = None, *, events: Union[EmitterLike, Mapping[str, Any]],
                 group: Optional[str] = None, cluster: Optional[str] = None, source: Optional[str] = None,
                 close_flush_timeout: float = 1.0, **kwargs: Any):
        merged = {**(conf or {}), **kwargs}
        inst = Instrumentation(events=events, group=group or _str_or_none(merged.get("group.id")),
                               cluster=cluster, source=source, client_id=_str_or_none(merged.get("client.id")))
        wrapped = inst.wrap(merged)
        try:
            super().__init__(wrapped)
        except BaseException:
            inst.close(0)
            raise
        self.instrumentation = inst
        self.close_flush_timeout = close_flush_timeout
        inst.bind(self)

    @property
    def instrumentation_errors(self) -> int:
        return self.instrumentation.instrumentation_errors

    def subscribe(self, topics: list[str], on_assign: Any = _UNSET, on_revoke: Any = _UNSET,
                  on_lost: Any = _UNSET) -> None:
        callbacks = self.instrumentation.rebalance_callbacks(on_assign, on_revoke, on_lost)
        started = self.instrumentation._monotonic()
        super().subscribe(topics, **callbacks)
        self.instrumentation.join_started(started)

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        msg = super().poll(*args, **kwargs)
        err = msg.error() if msg is not None else None
        if err is not None:
            self.instrumentation.observe_consumer_error(err)
        self.instrumentation.tick()
        return msg

    def consume(self, *args: Any, **kwargs: Any) -> Any:
        msgs = super().consume(*args, **kwargs)
        for msg in msgs:
            err = msg.error()
            if err is not None:
                self.instrumentation.observe_consumer_error(err)
        self.instrumentation.tick()
        return msgs

    def close(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().close(*args, **kwargs)
        finally:
            self.instrumentation.close(self.close_flush_timeout)


class InstrumentedProducer(Producer):
    """A ``confluent_kafka.Producer`` that emits kafka-monitor events; otherwise the same producer.

    Every delivery report goes through the instrumentation (the config's ``on_delivery`` and the
    ``on_delivery``/``callback`` given to ``produce()``, which still run), so its ``client_produce``
    events carry the writes delivered, the failures by error code and the delivery latency.
    ``poll``/``flush`` return what the base class returns; ``close_instrumentation()`` flushes the
    events for at most ``timeout`` seconds (only an emitter created here)."""

    def __init__(self, conf: Optional[Mapping[str, Any]] = None, *, events: Union[EmitterLike, Mapping[str, Any]],
                 cluster: Optional[str] = None, source: Optional[str] = None, **kwargs: Any):
        merged = {**(conf or {}), **kwargs}
        inst = Instrumentation(events=events, cluster=cluster, source=source,
                               client_id=_str_or_none(merged.get("client.id")))
        wrapped = inst.wrap(merged)
        wrapped.setdefault("on_delivery", _DeliveryCallback(inst, None))
        try:
            super().__init__(wrapped)
        except BaseException:
            inst.close(0)
            raise
        self.instrumentation = inst
        inst.bind(self)

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        own = kwargs.pop("on_delivery", None)
        own = kwargs.pop("callback", None) if own is None else own
        if own is not None:
            kwargs["on_delivery"] = _DeliveryCallback(self.instrumentation, own)
        return super().produce(*args, **kwargs)

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        n = super().poll(*args, **kwargs)
        self.instrumentation.tick()
        return n

    def close_instrumentation(self, timeout: float = 1.0) -> int:
        """Flush this producer's events for at most ``timeout`` seconds: call it when done with the
        producer (after its own ``flush()``).  Returns the events left undelivered."""
        return self.instrumentation.close(timeout)
