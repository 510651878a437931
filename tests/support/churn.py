"""A cluster whose topics and groups come and go (issue 31): the churn of a day, compressed.

    churn = Churn(cluster.bootstrap_servers, prefix="soak", seed=7, speed=12.0)
    churn.start()          # a thread: one step per wall second
    ...
    churn.stop()           # producers and consumers closed; what it created is left in place
    churn.counts           # what it did: topics created/deleted, partitions added, groups ...

``speed`` is simulated seconds per wall second (12: a day in two hours).  Rates are per
simulated hour and drawn from ``seed``; each topic lives 1-8 simulated hours and each group
1-6, so the cluster's population settles at about rate x mean life.  A topic takes writes while
a producer is on for it (on and off at random); a group commits its topic's offsets through the
AdminClient (no member: an Empty group that lags and moves), a few have a real consumer
(a member, a rebalance, then empty when it closes); a group is deleted when it ends, a topic's
groups end before the topic is deleted.  Everything is named ``<prefix>.t<n>`` / ``<prefix>-g<n>``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

log = logging.getLogger(__name__)

HOUR = 3600.0


@dataclass
class Rates:
    """Per simulated hour."""
    topics: float = 12.0
    groups: float = 16.0
    partition_adds: float = 3.0
    producer_toggles: float = 20.0
    #: at most this many groups have a real consumer at once (each is a client with its threads)
    member_groups: int = 3
    topic_life_h: tuple[float, float] = (1.0, 8.0)
    group_life_h: tuple[float, float] = (1.0, 6.0)
    max_partitions: int = 6
    #: writes per second to each topic whose producer is on
    write_rate: float = 5.0


@dataclass
class _Topic:
    name: str
    partitions: int
    ends_at: float
    producing: bool = False
    written: int = 0


@dataclass
class _Group:
    name: str
    topic: str
    ends_at: float
    consumer: Optional[Consumer] = None
    #: ended: no commits any more; kept until its deletion succeeds
    ended: bool = False
    #: failed deletions so far (the next waits twice as long)
    delete_tries: int = 0


@dataclass
class Counts:
    topics_created: int = 0
    topics_deleted: int = 0
    partitions_added: int = 0
    groups_created: int = 0
    groups_deleted: int = 0
    #: groups Kafka removed itself before the churn deleted them (their topic deleted first)
    groups_gone: int = 0
    member_groups: int = 0
    errors: dict = field(default_factory=dict)


class Churn:
    def __init__(self, bootstrap: str, prefix: str, seed: int = 0, speed: float = 12.0,
                 rates: Optional[Rates] = None, initial_topics: int = 8, initial_groups: int = 8):
        self.bootstrap, self.prefix, self.speed = bootstrap, prefix, speed
        self.rates = rates or Rates()
        self._rnd = random.Random(seed)
        self._admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        # allow.auto.create.topics off: a librdkafka producer refreshes the metadata of every
        # topic it ever wrote to (every 5 min) and, on a broker with auto.create.topics.enable
        # (Kafka's default), that refresh re-creates a deleted one with 1 partition
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "log_level": 0,
                                   "message.timeout.ms": 30000, "allow.auto.create.topics": False})
        self.topics: dict[str, _Topic] = {}
        self.groups: dict[str, _Group] = {}
        self.counts = Counts()
        self._n = 0
        self._steps = 0
        self._sim = 0.0  # simulated seconds since start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)
        self._initial = (initial_topics, initial_groups)

    # -- the simulated clock ----------------------------------------------------------------------

    @property
    def sim_hours(self) -> float:
        return self._sim / HOUR

    def start(self) -> "Churn":
        for _ in range(self._initial[0]):
            self._create_topic()
        for _ in range(self._initial[1]):
            self._create_group()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for g in list(self.groups.values()):
            self._close_member(g)
        self._producer.flush(10)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(max(0.0, 1.0 - (time.monotonic() - last))):
            now = time.monotonic()
            try:
                self.step(now - last)
            except Exception as e:  # never the end of the churn: counted and logged
                self._count("step")
                log.warning("churn: step failed: %r", e)
            last = now

    def _chance(self, per_hour: float, dt_sim: float) -> int:
        """How many of an event with ``per_hour`` rate happen in ``dt_sim`` simulated seconds."""
        lam = per_hour * dt_sim / HOUR
        n = 0
        while self._rnd.random() < lam:  # Poisson-ish for small lam, bounded
            n += 1
            lam -= 1.0
            if lam <= 0:
                break
        return n

    def step(self, dt_wall: float) -> None:
        """One step: ``dt_wall`` wall seconds = ``dt_wall * speed`` simulated ones."""
        dt = dt_wall * self.speed
        self._sim += dt
        for g in [g for g in list(self.groups.values()) if g.ends_at <= self._sim]:
            self._end_group(g)
        for t in [t for t in self.topics.values() if t.ends_at <= self._sim]:
            self._delete_topic(t)
        for _ in range(self._chance(self.rates.topics, dt)):
            self._create_topic()
        for _ in range(self._chance(self.rates.groups, dt)):
            self._create_group()
        for _ in range(self._chance(self.rates.partition_adds, dt)):
            self._add_partitions()
        for _ in range(self._chance(self.rates.producer_toggles, dt)):
            if self.topics:
                t = self._rnd.choice(sorted(self.topics.values(), key=lambda x: x.name))
                t.producing = not t.producing
        self._write(dt_wall)
        self._commit()

    # -- topics -----------------------------------------------------------------------------------

    def _try(self, what: str, fn) -> bool:
        try:
            fn()
            return True
        except Exception as e:  # a broker restarting: counted, the churn goes on
            self._count(what)
            log.debug("churn: %s failed: %s", what, e)
            return False

    def _create_topic(self) -> None:
        self._n += 1
        name = f"{self.prefix}.t{self._n}"
        parts = self._rnd.randint(1, 3)
        life = self._rnd.uniform(*self.rates.topic_life_h) * HOUR
        if self._try("create_topic", lambda: self._admin.create_topics(
                [NewTopic(name, num_partitions=parts, replication_factor=3)], request_timeout=15)[name].result(20)):
            self.topics[name] = _Topic(name, parts, self._sim + life, producing=self._rnd.random() < 0.7)
            self.counts.topics_created += 1

    def _delete_topic(self, t: _Topic) -> None:
        for g in [g for g in list(self.groups.values()) if g.topic == t.name and not g.ended]:
            self._end_group(g)
        if self._try("delete_topic", lambda: self._admin.delete_topics([t.name], request_timeout=15)[t.name].result(20)):
            del self.topics[t.name]
            self.counts.topics_deleted += 1
        else:
            t.ends_at = self._sim + 60 * self.speed  # again in a wall minute

    def _add_partitions(self) -> None:
        grow = [t for t in sorted(self.topics.values(), key=lambda x: x.name) if t.partitions < self.rates.max_partitions]
        if not grow:
            return
        t = self._rnd.choice(grow)
        total = t.partitions + 1
        if self._try("add_partitions", lambda: self._admin.create_partitions(
                [NewPartitions(t.name, total)], request_timeout=15)[t.name].result(20)):
            t.partitions = total
            self.counts.partitions_added += 1

    def _write(self, dt_wall: float) -> None:
        for t in self.topics.values():
            if not t.producing:
                continue
            n = int(self.rates.write_rate * dt_wall + self._rnd.random())
            for i in range(n):
                try:
                    self._producer.produce(t.name, value=b"x" * 100, partition=(t.written + i) % t.partitions)
                except BufferError:
                    break
                except KafkaException:  # a partition the producer's metadata does not know yet
                    self._count("produce")
                    break
            t.written += n
        self._producer.poll(0)

    # -- groups -----------------------------------------------------------------------------------

    def _create_group(self) -> None:
        if not self.topics:
            return
        t = self._rnd.choice(sorted(self.topics.values(), key=lambda x: x.name))
        self._n += 1
        life = self._rnd.uniform(*self.rates.group_life_h) * HOUR
        g = _Group(f"{self.prefix}-g{self._n}", t.name, min(self._sim + life, t.ends_at))
        members = sum(1 for x in self.groups.values() if x.consumer is not None)
        if members < self.rates.member_groups and self._rnd.random() < 0.3:
            def join() -> None:
                c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": g.name, "log_level": 0,
                              "enable.auto.commit": True, "auto.commit.interval.ms": 5000,
                              "auto.offset.reset": "earliest", "session.timeout.ms": 10000})
                c.subscribe([t.name])
                g.consumer = c
            if self._try("member", join):
                self.counts.member_groups += 1
        self.groups[g.name] = g
        self.counts.groups_created += 1

    def _commit(self) -> None:
        """Groups without a member: half the way to the end of each partition, every step
        (lag that grows while the topic takes writes, and moves); every 5th step."""
        self._steps += 1
        if self._steps % 5:
            return
        for g in self.groups.values():
            if g.ended:
                continue
            if g.consumer is not None:
                g.consumer.poll(0)  # a member consumes a little each step
                continue
            t = self.topics.get(g.topic)
            if t is None or not t.written:
                continue
            per = t.written // t.partitions
            offsets = [TopicPartition(t.name, p, max(0, per // 2)) for p in range(t.partitions)]
            # not waited for: fifty groups' commits while a coordinator restarts would hold the step
            # for minutes; a failed one is counted and the next round commits again
            try:
                fut = self._admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(g.name, offsets)],
                                                               request_timeout=10)[g.name]
                fut.add_done_callback(self._count_failure)
            except Exception:
                self._count("commit")

    def _count(self, what: str) -> None:
        self.counts.errors[what] = self.counts.errors.get(what, 0) + 1

    def _count_failure(self, fut) -> None:
        # a coordinator moving comes back per partition (NOT_COORDINATOR) in a result that
        # succeeds, and librdkafka does not retry it: nothing was committed
        if fut.exception() is not None or any(tp.error is not None for tp in fut.result().topic_partitions):
            self._count("commit")

    def _close_member(self, g: _Group) -> None:
        if g.consumer is not None:
            c, g.consumer = g.consumer, None
            self._try("close_member", c.close)

    def _end_group(self, g: _Group) -> None:
        self._close_member(g)
        g.ended = True
        try:
            self._admin.delete_consumer_groups([g.name], request_timeout=15)[g.name].result(20)
        except Exception as e:
            code = e.args[0].code() if isinstance(e, KafkaException) and e.args else None
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                # the coordinator dropped it already: an empty group whose offsets went with its
                # deleted topic is removed by Kafka itself (it was retried forever before)
                self.counts.groups_gone += 1
                self.groups.pop(g.name, None)
                return
            # not empty yet (a member leaving), a coordinator moving: again, backing off from 5
            # wall seconds to 5 minutes
            self._count("delete_group")
            g.delete_tries += 1
            g.ends_at = self._sim + min(5 * 2 ** (g.delete_tries - 1), 300) * self.speed
            log.debug("churn: delete_group %s failed: %s", g.name, e)
            return
        self.counts.groups_deleted += 1
        self.groups.pop(g.name, None)

    def live(self) -> tuple[list[str], list[str]]:
        """The topics and groups alive now (from any thread: no lock, a step may be waiting on
        the cluster)."""
        return sorted(list(self.topics)), sorted(n for n, g in list(self.groups.items()) if not g.ended)
