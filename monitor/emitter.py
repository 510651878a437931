"""Produce contract events into the events topic.

Idempotent producer, records keyed by entity.  Buffering is bounded: when librdkafka's local
queue is full the event is dropped and counted (the probe must never block or grow without
bound because the events topic is slow or unreachable).  Delivery failures are counted too;
both counts travel in every heartbeat.

Events come one at a time (:meth:`EventEmitter.emit`, a payload object) or in bulk
(:meth:`EventEmitter.emit_rows`, rows of one payload type's field values): the probe sends one
``partition_offsets`` per partition and one ``group_offsets`` per group partition every cycle,
hundreds of thousands on a large cluster.  A bulk call makes no payload or :class:`Event`
objects: each payload type that has only scalar and list-of-scalar fields gets a serializer
generated from its dataclass, which writes exactly the bytes :meth:`Event.to_json` writes (a
test holds it to that), with event ids drawn in one ``os.urandom`` call.

The events that say the source is alive (``heartbeat``, ``metadata_refresh``: the job opens
SourceSilent and MetadataStale when they stop) share one key, hence one partition, and a paused
leader of that partition would hold them until it is fenced.  No client can tell a paused broker
before sending to it, so each one also goes, the same event, to a second partition: one that
delivered most recently.  The job applies whichever comes first and drops the other (not counted
as a dropped event); see docs/own-topics.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
import typing
from typing import Any, Callable, Optional, Sequence

from confluent_kafka import KafkaError, KafkaException, Producer

from monitor import contract as c
from monitor.contract import Event, Payload
from monitor.shards import CLUSTER_SHARD, shard_of

log = logging.getLogger(__name__)

#: partitions whose last delivery is this close to the freshest one's take turns for the copies
FRESH_S = 0.25
#: a v3 record (``contract.ROWS_KEY_OF_TYPE``) holds at most this many events ...
ROWS_PER_RECORD = 1000
#: ... and is split in two while longer than this (the job refuses records over its max_event_bytes, 64 KiB)
MAX_RECORD_BYTES = 32 << 10

#: fatal producer errors a new producer would meet again: credentials and permissions
_FATAL_FOR_GOOD = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                             KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                             KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})


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
        self._conf = conf
        self._producer_given = producer is not None  # a test's stand-in: never replaced
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
        #: producers replaced after a fatal error that a new producer cures (see _renew_after)
        self.renewals = 0
        #: liveness events also sent to a second partition (see LIVENESS_TYPES)
        self.copies = 0
        self._polled_at = time.monotonic()    # when the poll serving the current reports began
        self._delivered_at: dict[int, float] = {}  # partition -> its last delivery's poll time
        self._live_partition: Optional[int] = None  # the liveness key's partition, once delivered
        self._turns: dict[str, int] = {}
        #: an HA group's probe (set_shards): shard count, and shard -> epoch of those it holds
        self._shards: Optional[tuple[int, Callable[[], dict[int, int]]]] = None
        #: events not sent because their shard was no longer held (moved away mid-cycle): its new
        #: owner sends them; not a loss, so not in ``dropped``
        self.unheld = 0
        #: events beyond one per record of the v3 records not yet delivered (a renewal loses them too)
        self._extra_in_flight = 0

    def set_shards(self, shards: int, held: Callable[[], dict[int, int]]) -> None:
        """Stamp each event of a sharded type (``contract.SHARD_OF_TYPE``) with its shard and this
        probe's epoch on it (``held()``: shard -> epoch); one whose shard it does not hold is
        not sent."""
        self._shards = (shards, held)

    def _shard_of(self, etype: str, fields: Any) -> Optional[int]:
        """The shard of an event of ``etype`` whose payload field is read by ``fields(name)``;
        None for a type without one."""
        name = c.SHARD_OF_TYPE.get(etype)
        if name is None or self._shards is None:
            return None
        return shard_of(str(fields(name)), self._shards[0]) if name else CLUSTER_SHARD

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def emit(self, data: Payload, observed_at: Optional[int] = None, cluster: Optional[str] = None) -> Optional[Event]:
        etype = c.TYPE_OF_PAYLOAD[type(data)]
        shard = self._shard_of(etype, lambda name: getattr(data, name))
        epoch = None
        if shard is not None:
            epoch = self._shards[1]().get(shard)  # type: ignore[index]
            if epoch is None:
                self.unheld += 1
                return None
        with self._lock:
            seq = self._seq
            self._seq += 1
        ev = Event(type=etype, cluster=cluster or self.cluster, source=self.source, seq=seq,
                   observed_at=self.now_ms() if observed_at is None else observed_at, data=data,
                   shard=shard, epoch=epoch)
        key, value = ev.key(), ev.to_json()
        try:
            if ev.type in c.LIVENESS_TYPES:
                self._produce_live(key, ev.type, value)
            else:
                self._producer.produce(self.topic, key=key.encode(), value=value, on_delivery=self._on_delivery)
        except BufferError:
            self.dropped += 1
            self.poll(0)
            return None
        except Exception as e:  # KafkaException for e.g. an unknown topic in strict configs
            if isinstance(e, KafkaException) and self._renew_after(e):
                self.dropped += 1
                return None
            self.dropped += 1
            self.last_error = str(e)
            log.warning("could not enqueue %s event: %s", ev.type, e)
            return None
        self.poll(0)
        return ev

    def emit_rows(self, cls: type, rows: Sequence[tuple], observed_at: int,
                  cluster: Optional[str] = None) -> list[int]:
        """One event of payload type ``cls`` per row, all observed at ``observed_at``; a row holds
        every field of ``cls`` in declaration order, with the contract's types (the events are
        the same as ``emit(cls(*row), observed_at)`` would make, bytes for bytes).  Never blocks:
        a row that does not fit in the local queue is dropped and counted, like ``emit``.
        Returns the indexes of the rows that were not enqueued."""
        n = len(rows)
        if n == 0:
            return []
        if self._shards is not None and c.TYPE_OF_PAYLOAD[cls] in c.SHARD_OF_TYPE:
            return self._emit_sharded(cls, rows, observed_at, cluster)
        return self._emit_rows(cls, rows, observed_at, cluster)

    def _emit_sharded(self, cls: type, rows: Sequence[tuple], observed_at: int,
                      cluster: Optional[str]) -> list[int]:
        """``emit_rows`` for an HA group's probe: the rows of each held shard with its shard and
        epoch; those of a shard it no longer holds are returned unsent (and counted, ``unheld``)."""
        etype = c.TYPE_OF_PAYLOAD[cls]
        name = c.SHARD_OF_TYPE[etype]
        at = [f.name for f in dataclasses.fields(cls)].index(name) if name else None
        shards, held = self._shards  # type: ignore[misc]
        epochs = held()
        by_shard: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            by_shard.setdefault(CLUSTER_SHARD if at is None else shard_of(str(row[at]), shards), []).append(i)
        failed: list[int] = []
        for shard, idx in sorted(by_shard.items()):
            epoch = epochs.get(shard)
            if epoch is None:
                self.unheld += len(idx)
                failed += idx
                continue
            part = self._emit_rows(cls, [rows[i] for i in idx], observed_at, cluster, (shard, epoch))
            failed += [idx[j] for j in part]
        return sorted(failed)

    def _emit_rows(self, cls: type, rows: Sequence[tuple], observed_at: int, cluster: Optional[str],
                   sharded: Optional[tuple[int, int]] = None) -> list[int]:
        if c.TYPE_OF_PAYLOAD[cls] in c.ROWS_KEY_OF_TYPE:
            return self._emit_grouped(cls, rows, observed_at, cluster, sharded)
        return self._emit_each(cls, rows, observed_at, cluster, sharded)

    def _emit_grouped(self, cls: type, rows: Sequence[tuple], observed_at: int, cluster: Optional[str],
                      sharded: Optional[tuple[int, int]]) -> list[int]:
        """Contract v3: the rows that share the fields of ``ROWS_KEY_OF_TYPE`` (a topic) in one
        record each, at most ROWS_PER_RECORD rows and MAX_RECORD_BYTES; a key with one row
        goes as a plain event (under the same key: ``contract.KEY_OF_TYPE``)."""
        etype = c.TYPE_OF_PAYLOAD[cls]
        names = [f.name for f in dataclasses.fields(cls)]
        at = [names.index(f) for f in c.ROWS_KEY_OF_TYPE[etype]]
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(tuple(row[j] for j in at), []).append(i)
        single = [idx[0] for idx in groups.values() if len(idx) == 1]
        alone = [single[j] for j in self._emit_each(cls, [rows[i] for i in single], observed_at, cluster, sharded)]
        cluster = cluster or self.cluster
        failed: list[int] = []
        for idx in groups.values():
            if len(idx) < 2:
                continue
            head = c.record_key(etype, cluster, self.source, dict(zip(names, rows[idx[0]]))).encode()
            for k in range(0, len(idx), ROWS_PER_RECORD):
                failed += self._emit_record(etype, names, rows, idx[k:k + ROWS_PER_RECORD], head,
                                            observed_at, cluster, sharded)
        self.dropped += len(failed)  # (_emit_each counted its own)
        self.poll(0)
        return sorted(alone + failed)

    def _emit_record(self, etype: str, names: list[str], rows: Sequence[tuple], idx: list[int],
                     key: bytes, observed_at: int, cluster: str, sharded: Optional[tuple[int, int]]) -> list[int]:
        """One v3 record of rows ``idx`` (split in two while it is longer than MAX_RECORD_BYTES);
        returns the rows not enqueued."""
        cols = list(zip(*(rows[i] for i in idx)))
        listed = c.rows_of(etype, dict(zip(names, cols)))
        with self._lock:
            seq = self._seq
            self._seq += 1
        env: dict[str, Any] = {"schema": c.SCHEMA_V3, "type": etype, "event_id": _event_ids(1)[0], "cluster": cluster,
                               "source": self.source}
        if sharded is not None:
            env["shard"], env["epoch"] = sharded
        env.update(seq=seq, observed_at=observed_at, data={n: col[0] for n, col in zip(names, cols)}, rows=listed)
        value = json.dumps(env, separators=(",", ":"), ensure_ascii=False).encode()
        if len(value) > MAX_RECORD_BYTES and len(idx) > 1:
            half = len(idx) // 2
            return (self._emit_record(etype, names, rows, idx[:half], key, observed_at, cluster, sharded)
                    + self._emit_record(etype, names, rows, idx[half:], key, observed_at, cluster, sharded))
        n = len(idx)
        try:
            self._producer.produce(self.topic, key=key, value=value, on_delivery=lambda err, msg: self._on_rows(err, msg, n))
        except BufferError:
            self.poll(0)
            return list(idx)
        except Exception as e:
            if self.last_error != str(e):
                log.warning("could not enqueue %s event: %s", etype, e)
            self.last_error = str(e)
            return list(idx)
        self._extra_in_flight += n - 1
        return []

    def _on_rows(self, err: Optional[KafkaError], msg: Any, n: int) -> None:
        """A v3 record's delivery report: it counts as its ``n`` events."""
        self._extra_in_flight -= n - 1
        self._on_delivery(err, msg)
        if err is None:
            self.sent += n - 1
        else:
            self.dropped += n - 1

    def _emit_each(self, cls: type, rows: Sequence[tuple], observed_at: int, cluster: Optional[str],
                   sharded: Optional[tuple[int, int]] = None) -> list[int]:
        n = len(rows)
        if n == 0:
            return []
        with self._lock:
            seq = self._seq
            self._seq += n
        cluster = cluster or self.cluster
        enc = _encoder(cls)
        if enc is None:  # a payload with nested objects: one at a time
            failed = []
            for i, row in enumerate(rows):
                ev = Event(type=c.TYPE_OF_PAYLOAD[cls], cluster=cluster, source=self.source, seq=seq + i,
                           observed_at=observed_at, data=cls(*row), shard=None if sharded is None else sharded[0],
                           epoch=None if sharded is None else sharded[1])
                if not self._produce(ev.key().encode(), ev.to_json(), ev.type):
                    failed.append(i)
            return failed
        head = f',"cluster":{_json_str(cluster)},"source":{_json_str(self.source)}'
        if sharded is not None:
            head += f',"shard":{sharded[0]},"epoch":{sharded[1]}'
        head += ',"seq":'
        etype = c.TYPE_OF_PAYLOAD[cls]

        def refused(e: Exception) -> None:  # anything but a full queue (BufferError)
            if self.last_error != str(e):
                log.warning("could not enqueue %s event: %s", etype, e)
            self.last_error = str(e)
        failed = enc(rows, _event_ids(n), head, seq, observed_at, cluster, self.source, self._producer.produce,
                     self.poll, self.topic, self._on_delivery, refused)
        self.dropped += len(failed)
        self.poll(0)
        return failed

    def _produce_live(self, key: str, etype: str, value: bytes) -> None:
        """Produce a liveness event on its key, and the same event to one other partition: of
        those that delivered most recently (within ``FRESH_S`` of the freshest), each in turn
        (per type)."""
        self._producer.produce(self.topic, key=key.encode(), value=value, on_delivery=self._on_live)
        mine = self._live_partition
        at = {p: t for p, t in self._delivered_at.items() if p != mine}
        if not at:
            return
        freshest = max(at.values())
        fresh = sorted(p for p, t in at.items() if t >= freshest - FRESH_S)
        turn = self._turns[etype] = self._turns.get(etype, -1) + 1
        with contextlib.suppress(BufferError, KafkaException):
            # its delivery is not counted: the event is counted once, on its own partition
            self._producer.produce(self.topic, key=key.encode(), value=value,
                                   partition=fresh[turn % len(fresh)], on_delivery=self._on_copy)
            self.copies += 1

    def _on_live(self, err: Optional[KafkaError], msg: Any) -> None:
        if err is None:
            self._live_partition = msg.partition()
        self._on_delivery(err, msg)

    def _on_copy(self, err: Optional[KafkaError], msg: Any) -> None:
        if err is None:
            self._delivered_at[msg.partition()] = self._polled_at
        else:
            log.debug("copy of a liveness event not delivered: %s", err)

    def _produce(self, key: bytes, value: bytes, etype: str) -> bool:
        try:
            self._producer.produce(self.topic, key=key, value=value, on_delivery=self._on_delivery)
        except BufferError:
            self.dropped += 1
            self.poll(0)
            return False
        except Exception as e:
            self.dropped += 1
            self.last_error = str(e)
            log.warning("could not enqueue %s event: %s", etype, e)
            return False
        return True

    def _on_delivery(self, err: Optional[KafkaError], msg: Any) -> None:
        if err is None:
            self.sent += 1
            self._delivered_at[msg.partition()] = self._polled_at
        else:
            self.dropped += 1
            if self.last_error != str(err):
                log.warning("event delivery failed: %s", err)
            self.last_error = str(err)

    def poll(self, timeout: float = 0) -> None:
        self._polled_at = time.monotonic()
        try:
            self._producer.poll(timeout)
        except KafkaException as e:  # a fatal error is raised once, from poll()
            if not self._renew_after(e):
                raise

    def _renew_after(self, e: KafkaException) -> bool:
        """A fatal error of the idempotent producer that a new producer cures -- the events
        cluster lost the producer's state (UNKNOWN_PRODUCER_ID after a topic was recreated or a
        broker's data lost; sequence or epoch errors): replace the producer, counting what it
        still held as dropped, and go on.  False for anything else, and for fatal errors of
        credentials and permissions, which a new producer would meet again."""
        err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
        if err is None or not err.fatal() or err.code() in _FATAL_FOR_GOOD or self._producer_given:
            return False
        lost = len(self._producer) + self._extra_in_flight
        self._extra_in_flight = 0
        with contextlib.suppress(Exception):
            self._producer.purge()
        self._producer = Producer(self._conf)
        self.renewals += 1
        self.dropped += lost
        self.last_error = str(err)
        log.warning("events producer stopped by a fatal error (%s): replaced by a new one; %d buffered events "
                    "lost (renewal %d)", err, lost, self.renewals)
        return True

    def flush(self, timeout: float = 10.0) -> int:
        """Wait for outstanding deliveries; returns how many are still undelivered."""
        return self._producer.flush(timeout)

    def close(self, timeout: float = 10.0) -> int:
        """Final flush, then release the producer (its threads and connections go with it);
        returns how many events were still undelivered and so are lost."""
        left = self._producer.flush(timeout)
        self._producer = _Closed()
        return left


# ---------------------------------------------------------------------------------------------
# Bulk serialization
# ---------------------------------------------------------------------------------------------

#: json.dumps(str, ensure_ascii=False) without json.dumps' overhead (the same C function)
_json_str: Callable[[str], str] = getattr(json.encoder, "c_encode_basestring", None) or json.encoder.py_encode_basestring
_VARIANT = {h: "89ab"[int(h, 16) & 3] for h in "0123456789abcdef"}


def _event_ids(n: int) -> list[str]:
    """``n`` ids shaped as ``uuid.uuid4().hex`` (version 4, RFC 4122 variant), from one urandom call."""
    raw = os.urandom(16 * n).hex()
    var = _VARIANT
    return [f"{h[:12]}4{h[13:16]}{var[h[16]]}{h[17:]}" for h in (raw[i:i + 32] for i in range(0, 32 * n, 32))]


def _json_value(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _field_expr(name: str, typ: Any) -> Optional[str]:
    """A Python expression that writes field ``name`` as json.dumps would (for a value of the
    contract's type), or None when the type is not one the generated code handles."""
    inner, optional = c._unwrap_optional(typ)
    if inner is int:
        expr = name  # %s writes an int as json.dumps does
    elif inner is str:
        expr = f"_s({name})"
    elif inner is bool:
        expr = f"('true' if {name} else 'false')"
    elif inner is float:
        expr = f"_v({name})"  # NaN, Infinity, an int in a float field: as json.dumps writes them
    elif typing.get_origin(inner) is list and typing.get_args(inner)[0] is int:
        expr = f"('[' + ','.join(map(str, {name})) + ']')"
    elif typing.get_origin(inner) is list and typing.get_args(inner)[0] is str:
        expr = f"('[' + ','.join(map(_s, {name})) + ']')"
    else:
        return None
    return f"('null' if {name} is None else {expr})" if optional else expr


_ENCODERS: dict[type, Optional[Callable[..., list[int]]]] = {}


def _encoder(cls: type) -> Optional[Callable[..., list[int]]]:
    """For payload class ``cls``: ``emit_all(rows, ids, head, seq, observed_at, cluster, source,
    produce, poll, topic, on_delivery, refused) -> indexes of the rows not enqueued``, which
    serializes each row (``ids[i]`` its event id, ``seq + i`` its seq) and produces it, generated
    from the dataclass (cached); None when a field is of a type it does not handle (nested
    payloads)."""
    if cls in _ENCODERS:
        return _ENCODERS[cls]
    etype = c.TYPE_OF_PAYLOAD[cls]
    fields = [f.name for f in dataclasses.fields(cls)]
    hints = c.hints(cls)
    exprs = [_field_expr(f"v_{name}", hints[name]) for name in fields]
    if any(e is None for e in exprs):
        _ENCODERS[cls] = None
        return None
    # the value: a %-template of the envelope and data (keys and constants are JSON already)
    prefix = json.dumps({"schema": c.SCHEMA_OF_TYPE.get(etype, c.SCHEMA_V1), "type": etype}, separators=(",", ":"), ensure_ascii=False)[:-1]
    template = (prefix.replace("%", "%%") + ',"event_id":"%s"%s%s,"observed_at":%s,"data":{'
                + ",".join(_json_str(name).replace("%", "%%") + ":%s" for name in fields) + "}}")
    args = ["eid", "head", "seq", "at"] + [e for e in exprs if e is not None]  # all of them: checked above
    key_parts = ["source" if f == "@source" else f"v_{f}" for f in c.key_fields(etype)]
    key_template = "/".join(["%s"] * (1 + len(key_parts)))  # record_key(): cluster/field/...
    unpack = "".join(f"v_{f}, " for f in fields)
    # one loop per payload type, the serialization inline: no call, tuple or dict per event
    src = "\n".join([
        "def emit_all(rows, ids, head, seq, at, cluster, source, produce, poll, topic, on_delivery, refused):",
        "    failed = []",
        "    i = 0",
        f"    for ({unpack}) in rows:",
        "        eid = ids[i]",
        "        try:",
        f"            produce(topic, key=({key_template!r} % (cluster, {', '.join(key_parts)})).encode(),",
        f"                    value=({template!r} % ({', '.join(args)},)).encode(), on_delivery=on_delivery)",
        "        except BufferError:",
        "            failed.append(i)",
        "            poll(0)",
        "        except Exception as e:",
        "            failed.append(i)",
        "            refused(e)",
        "        i += 1",
        "        seq += 1",
        "        if not i & 1023:",
        "            poll(0)  # serve delivery reports as it goes",
        "    return failed",
        ""])
    namespace: dict[str, Any] = {"_s": _json_str, "_v": _json_value}
    exec(compile(src, f"<encoder {etype}>", "exec"), namespace)  # noqa: S102  (generated from the contract)
    enc = namespace["emit_all"]
    enc.source = src  # for reading
    _ENCODERS[cls] = enc
    return enc


class _Closed:
    """Stands in for the producer after close(): emitting then drops and counts."""

    def produce(self, *a: Any, **kw: Any) -> None:
        raise BufferError("emitter closed")

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0
