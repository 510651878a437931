"""Shards of a watched cluster held through Kafka's own group protocol (issue 49).

Probes started with the same HA group split a cluster's work into a fixed number of shards: the
partitions of a small topic of the monitor's own (``kafka-monitor.shards.<group>``) on the
cluster of the events topic.  Each probe is a member of the consumer group
``kafka-monitor-ha-<group>`` subscribed to that topic with the cooperative-sticky assignor: the
group hands every shard to one live member and moves only the shards that must move when a
member comes or goes (within the session timeout when it dies).  The group is polled on a thread
of its own; nothing is consumed (the partitions are paused once assigned).

Fencing: a probe that gains a shard first writes a *claim* record to that shard's partition
(acks=all) and takes the record's offset as the shard's *epoch*.  Offsets of one partition are
ordered by its leader, so a later owner's epoch is always larger, whatever the hosts' clocks say;
a paused owner that comes back still carries its old epoch, and the job drops what it sends once
it has seen a newer one.  A shard is reported owned only after its claim is acknowledged.

A shard's claim is not waited for in the rebalance callback: each shard is owned from its own
claim's acknowledgement, and a failed claim is tried again each second.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import zlib
from typing import Any, Callable, Optional

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

log = logging.getLogger(__name__)

#: shards per watched cluster unless set: fixed, independent of how many probes run
DEFAULT_SHARDS = 64
#: the shard that holds the cluster-wide work (metadata views, brokers, controller, canary,
#: quorum, ELR, log dirs, transactions)
CLUSTER_SHARD = 0
#: how often a probe that does not hold the cluster shard lists the groups and asks every group's
#: committed offsets (which groups commit on its shards' topics), s; in between it asks only the
#: groups that do (docs/ha.md)
HA_DISCOVERY_S = 60.0


def shard_of(name: str, shards: int) -> int:
    """The shard (0..shards-1) of a topic or group: crc32 of its UTF-8 name modulo the count, the
    same in every process and release."""
    return zlib.crc32(name.encode("utf-8")) % shards


def shard_topic(group: str) -> str:
    return f"kafka-monitor.shards.{group}"


def group_id(group: str) -> str:
    return f"kafka-monitor-ha-{group}"


class ShardConfigError(ValueError):
    """The shard topic exists with another partition count than the setting."""


def ensure_shard_topic(conf: dict[str, Any], group: str, shards: int, timeout_s: float = 30.0) -> None:
    """Create the shard topic with ``shards`` partitions if it does not exist; refuse one with
    another count (probes of one group must agree on it: a shard is a partition)."""
    topic = shard_topic(group)
    admin = AdminClient(conf)
    # the whole listing: a Metadata request naming the topic makes a broker with
    # auto.create.topics.enable create it, with one partition
    md = admin.list_topics(timeout=timeout_s)
    t = md.topics.get(topic)
    if t is not None and t.error is None:
        if len(t.partitions) != shards:
            raise ShardConfigError(
                f"probe.shards: the shard topic {topic} has {len(t.partitions)} partitions, the setting says "
                f"{shards}: every probe of HA group {group!r} must use the topic's count (or delete the topic "
                f"while no probe runs)")
        return
    rf = min(3, len(md.brokers)) or 1
    futures = admin.create_topics([NewTopic(topic, num_partitions=shards, replication_factor=rf,
                                            config={"retention.ms": str(7 * 86_400_000)})],
                                  request_timeout=timeout_s)
    try:
        futures[topic].result(timeout_s)
    except KafkaException as e:
        if e.args and isinstance(e.args[0], KafkaError) and e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return ensure_shard_topic(conf, group, shards, timeout_s)  # another probe made it first
        raise


class ShardMembership:
    """This probe's membership of its HA group: the shards it holds and their epochs.

    ``conf``: librdkafka settings of the events cluster; ``source``: this probe's name (in its
    claims); ``on_change(owned)`` is called on the membership thread after each change."""

    def __init__(self, conf: dict[str, Any], group: str, shards: int, source: str,
                 session_timeout_ms: int = 10_000, on_change: Optional[Callable[[dict[int, int]], None]] = None):
        if shards < 1:
            raise ValueError(f"probe.shards: must be >= 1, got {shards}")
        self.group, self.shards, self.source = group, shards, source
        self.topic = shard_topic(group)
        self._conf = dict(conf)
        self._session_timeout_ms = session_timeout_ms
        self._on_change = on_change
        self._lock = threading.Lock()
        self._owned: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._consumer: Optional[Consumer] = None
        self._producer: Optional[Producer] = None
        #: assignments handed over so far (each add or removal), and the last one's time (epoch ms)
        self.changes = 0
        self.last_change_ms: Optional[int] = None
        self.claim_failures = 0
        self._unclaimed: set[int] = set()
        #: shard -> the token of its current assignment's claim (a report for an older one is ignored)
        self._tokens: dict[int, int] = {}
        self._token = 0
        self._just_claimed: list[int] = []

    # -- what the probe reads -------------------------------------------------------------------

    def owned(self) -> dict[int, int]:
        """shard -> its epoch, for the shards this probe holds and has claimed."""
        with self._lock:
            return dict(self._owned)

    def owns(self, name: str) -> Optional[int]:
        """The epoch of the shard ``name`` belongs to when this probe holds it, else None."""
        return self._owned.get(shard_of(name, self.shards))

    # -- the group --------------------------------------------------------------------------------

    def _claim(self, shards: list[int]) -> None:
        """One claim record per shard (acks=all), not waited for: each shard is owned from its
        claim's acknowledgement (``_claimed``, served by ``_run``), so a shard whose partition's
        leader is gone does not hold up the others."""
        assert self._producer is not None
        now = int(time.time() * 1000)
        for s in shards:
            self._token += 1
            token = self._tokens[s] = self._token
            try:
                self._producer.produce(self.topic, key=self.source.encode(), partition=s,
                                       value=json.dumps({"source": self.source, "claimed_at": now}).encode(),
                                       on_delivery=functools.partial(self._claimed, s, token))
            except (BufferError, KafkaException) as e:
                self._claimed(s, token, e, None)

    def _claimed(self, shard: int, token: int, err: Any, msg: Any) -> None:
        """A claim's delivery report: the shard is owned with the record's offset as its epoch,
        unless it was revoked (or assigned again) since; a failed claim is retried."""
        with self._lock:
            if self._tokens.get(shard) != token:
                return
            if err is None:
                self._owned[shard] = msg.offset()
                self._just_claimed.append(shard)
            else:
                self.claim_failures += 1
                self._unclaimed.add(shard)
        if err is not None and (self.claim_failures == 1 or self.claim_failures % 100 == 0):
            log.warning("HA group %s: the claim of shard %d failed (%s): held but not probed until a claim "
                        "succeeds (tried again each second; %d claim(s) failed so far)", self.group, shard, err,
                        self.claim_failures)

    def _assigned(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        if not parts:
            return
        # assigned here, then paused: nothing is fetched (assigned after the callback, by the client,
        # the partitions would be fetched from; the membership is what matters)
        consumer.incremental_assign(parts)
        consumer.pause(parts)
        shards = sorted(p.partition for p in parts)
        log.info("HA group %s: assigned %s, claiming them", self.group, shards)
        self._claim(shards)

    def _revoked(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        with self._lock:
            for p in parts:
                self._owned.pop(p.partition, None)
                self._tokens.pop(p.partition, None)
                self._unclaimed.discard(p.partition)
        if parts:
            self._changed(f"-{sorted(p.partition for p in parts)}")

    def _changed(self, what: str) -> None:
        self.changes += 1
        self.last_change_ms = int(time.time() * 1000)
        owned = self.owned()
        log.info("HA group %s: %s, holding %d of %d shards", self.group, what, len(owned), self.shards)
        if self._on_change is not None:
            self._on_change(owned)

    def _run(self) -> None:
        retried = time.monotonic()
        while not self._stop.is_set():
            try:
                self._consumer.poll(0.2)  # type: ignore[union-attr]
            except KafkaException as e:  # noqa: PERF203 - said, polled again
                log.warning("HA group %s: %s", self.group, e)
            self._producer.poll(0)  # type: ignore[union-attr]  # the claims' delivery reports
            if self._just_claimed:
                claimed, self._just_claimed = sorted(self._just_claimed), []
                self._changed(f"+{claimed} claimed")
            if time.monotonic() - retried >= 1.0:
                retried = time.monotonic()
                with self._lock:
                    retry = sorted(self._unclaimed)
                    self._unclaimed = set()
                if retry:
                    self._claim(retry)

    def start(self) -> "ShardMembership":
        base = {k: v for k, v in self._conf.items()}
        # a claim to a leader that stopped answering fails within seconds and is tried again (on the
        # new leader once the controller moved it), not after librdkafka's 30 s request timeout
        self._producer = Producer({**base, "acks": "all", "enable.idempotence": True, "linger.ms": 0,
                                   "socket.timeout.ms": 5000, "message.timeout.ms": 10_000,
                                   "client.id": f"kafka-monitor-ha-claims-{self.source}"})
        self._consumer = Consumer({**base, "group.id": group_id(self.group),
                                   "partition.assignment.strategy": "cooperative-sticky",
                                   "enable.auto.commit": False, "auto.offset.reset": "latest",
                                   "session.timeout.ms": self._session_timeout_ms,
                                   # a member that died is noticed within the session timeout; the
                                   # others hear of the rebalance at their next heartbeat
                                   "heartbeat.interval.ms": max(500, self._session_timeout_ms // 10),
                                   # a request to a broker that stopped answering (a paused coordinator
                                   # found again after the session ran out) is given up after a session's
                                   # time, not librdkafka's 60 s: the member rejoins through another
                                   "socket.timeout.ms": self._session_timeout_ms,
                                   "client.id": f"kafka-monitor-ha-{self.source}"})
        self._consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked,
                                 on_lost=self._revoked)
        self._thread = threading.Thread(target=self._run, name="ha-group", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Leave the group (its shards move at once) and close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._consumer is not None:
            self._consumer.close()
        if self._producer is not None:
            self._producer.flush(5)
