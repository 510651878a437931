"""Fakes of the probe's and the instrumentation's collaborators, shared by the unit tests (and
tests/integration/test_mock_cluster.py): an admin client (the narrow slice of
confluent_kafka.admin.AdminClient the probe calls), settled futures, the topic partitions and
group descriptions it answers with, and two emitters: ``FakeEmitter`` keeps the probe's payloads,
``InstrumentFakeEmitter`` (monitor.instrument's) checks each is a valid event and keeps it with its
observed_at and cluster, or raises the failure it was given."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, Optional

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ListOffsetsResultInfo

from monitor.contract import Event


def done(value=None, exc=None) -> Future:
    f: Future = Future()
    f.set_exception(exc) if exc else f.set_result(value)
    return f


def tp(topic, part, offset=-1001, error=None):
    return SimpleNamespace(topic=topic, partition=part, offset=offset, error=error)


class FakeAdmin:
    def __init__(self, topics: dict[str, int], committed: dict[str, list], hw: dict[tuple, int],
                 errors: dict[tuple, KafkaError] | None = None):
        self.topics, self.committed, self.hw, self.errors = topics, committed, hw, errors or {}
        self.metadata_calls = 0
        #: (topic, partition) -> its leader (default 1) and the leader epoch its ListOffsets answer carries
        self.leaders: dict[tuple, int] = {}
        self.epochs: dict[tuple, int] = {}

    def list_topics(self, topic=None, timeout=None):
        self.metadata_calls += 1
        broker = SimpleNamespace(id=1, host="b1", port=9092)
        parts = lambda t, n: {p: SimpleNamespace(id=p, leader=self.leaders.get((t, p), 1), replicas=[1], isrs=[1],
                                                 error=None) for p in range(n)}
        return SimpleNamespace(cluster_id="fake", controller_id=1, orig_broker_id=1, brokers={1: broker},
                               topics={t: SimpleNamespace(topic=t, partitions=parts(t, n), error=None)
                                       for t, n in self.topics.items()})

    def list_consumer_groups(self, request_timeout=None):
        return done(SimpleNamespace(valid=[SimpleNamespace(group_id=g) for g in self.committed]))

    def list_consumer_group_offsets(self, reqs, request_timeout=None):
        g = reqs[0].group_id
        return {g: done(SimpleNamespace(group_id=g, topic_partitions=self.committed[g]))}

    def describe_consumer_groups(self, groups, request_timeout=None):
        return {g: done(exc=KafkaException(KafkaError(KafkaError._UNSUPPORTED_FEATURE))) for g in groups}

    def describe_configs(self, resources, request_timeout=None, broker=None):
        raise KafkaException(KafkaError(KafkaError._UNSUPPORTED_FEATURE))

    def list_offsets(self, req, request_timeout=None, isolation_level=None):
        out = {}
        for k in req:
            key = (k.topic, k.partition)
            if key in self.errors:
                out[k] = done(exc=KafkaException(self.errors[key]))
            else:
                out[k] = done(ListOffsetsResultInfo(self.hw.get(key, 0), -1, self.epochs.get(key, -1)))
        return out

    def poll(self, timeout=0):
        return 0


class FakeEmitter:
    def __init__(self):
        self.events, self.cluster, self.sent, self.dropped = [], "fake", 0, 0

    def emit(self, data, observed_at=None, cluster=None):
        self.events.append(data)

    def poll(self, timeout=0):
        pass

    def close(self, timeout=0):
        return 0

    def of(self, cls):
        return [e for e in self.events if isinstance(e, cls)]


def described(gid: str, coordinator: int):
    return SimpleNamespace(group_id=gid, is_simple_consumer_group=False, state=SimpleNamespace(name="STABLE"),
                           type=SimpleNamespace(name="CLASSIC"), partition_assignor="range", members=[],
                           coordinator=SimpleNamespace(id=coordinator))


class InstrumentFakeEmitter:
    """The narrow emitter interface: emit(payload, observed_at=None[, cluster]) and counters."""

    def __init__(self, fail: Optional[Exception] = None, source: str = "fake"):
        self.events: list[tuple[Any, Optional[int], Optional[str]]] = []
        self.sent = 0
        self.dropped = 0
        self.fail = fail
        self.source = source

    def emit(self, payload: Any, observed_at: Optional[int] = None, cluster: Optional[str] = None) -> None:
        if self.fail is not None:
            raise self.fail
        Event.of(payload, cluster=cluster or "c", source=self.source, seq=0, observed_at=observed_at or 0)  # valid?
        self.events.append((payload, observed_at, cluster))

    def of(self, cls: type) -> list[Any]:
        return [p for p, _, _ in self.events if isinstance(p, cls)]
