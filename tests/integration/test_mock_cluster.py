"""tests/support/mock_cluster.py against real confluent-kafka clients.

librdkafka's mock cluster runs inside this process (its own threads) and listens on 127.0.0.1.
Known limits of the mock: ISR always equals replicas; no CreateTopics (topics are created through
the mock API); broker_down refuses connections but does not move leaders.

Observed with confluent-kafka 2.16.1 / librdkafka 2.16.0 (pinned below so an upgrade that changes
them fails loudly):
- a NOT_LEADER_OR_FOLLOWER answer to Produce or Fetch does *not* trigger a MetadataRequest: the
  error response carries the current leader (KIP-951) and librdkafka updates its metadata cache
  from it; LEADER_NOT_AVAILABLE / UNKNOWN_TOPIC_OR_PARTITION do trigger MetadataRequests;
- the leader epoch is visible only in the statistics JSON (topics.<t>.partitions.<p>.leader_epoch),
  not in list_topics() / describe_topics() results.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.mock_cluster import ApiKey, Err, MockCluster
from tests.support.rdkafka_log import LogCapture

pytestmark = pytest.mark.integration

TOPIC = "orders"


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

class Stats:
    """Keeps the latest statistics JSON of one client (the callback runs inside poll/flush)."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] | None = None
        self.count = 0

    def __call__(self, raw: str) -> None:
        self.latest = json.loads(raw)
        self.count += 1

    def requests(self, api: str) -> int:
        """Requests of type ``api`` ("Metadata", "Produce", ...) sent, summed over known brokers."""
        assert self.latest is not None, "no statistics received yet"
        return sum(b["req"].get(api, 0) for b in self.latest["brokers"].values())

    def partition(self, topic: str, partition: int) -> dict[str, Any] | None:
        if self.latest is None:
            return None
        return self.latest.get("topics", {}).get(topic, {}).get("partitions", {}).get(str(partition))


def poll_until(clients: list[Any], cond: Callable[[], Any], timeout: float = 5.0, what: str = "condition"):
    """Serve the clients' callbacks (poll) until ``cond()`` is truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        for c in clients:
            c.poll(0.02)
        last = cond()
        if last:
            return last
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")


def fresh_stats(clients: list[Any], stats: Stats, n: int = 2) -> None:
    """Wait until ``n`` more statistics emissions have arrived (so they reflect the present)."""
    target = stats.count + n
    poll_until(clients, lambda: stats.count >= target, what=f"{n} statistics emissions")


@pytest.fixture
def cluster() -> Iterator[MockCluster]:
    with MockCluster(brokers=3) as mc:
        yield mc


@pytest.fixture
def clients(cluster: MockCluster) -> Iterator[Callable[..., Any]]:
    """Factory for clients bound to the mock; all are closed before the cluster is destroyed."""
    made: list[Any] = []

    def make(kind: type, **conf: Any) -> Any:
        client = kind({"bootstrap.servers": cluster.bootstrap, **conf})
        made.append(client)
        return client

    yield make
    for client in reversed(made):
        if isinstance(client, Consumer):
            client.close()
        elif isinstance(client, Producer):
            client.purge()        # a message stuck on a down broker must not block close()
            client.close()
    made.clear()                  # AdminClient has no close(): dropping the reference destroys it


def leader_of(admin: AdminClient, topic: str, partition: int) -> int:
    return admin.list_topics(topic, timeout=5).topics[topic].partitions[partition].leader


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------

def test_three_brokers_and_a_topic_with_three_replicas(cluster: MockCluster, clients):
    """(1) Metadata lists brokers 1..3 on 127.0.0.1 and the created topic with RF 3 (ISR =
    replicas, a mock limit). The default controller (1) makes controller-bound admin calls work;
    without it they fail with "Failed while waiting for controller: Local: Timed out"."""
    cluster.create_topic(TOPIC, partitions=3, replication_factor=3)
    admin = clients(AdminClient)

    md = admin.list_topics(timeout=5)
    assert sorted(md.brokers) == [1, 2, 3]
    assert {b.host for b in md.brokers.values()} == {"127.0.0.1"}
    assert md.controller_id == 1
    parts = md.topics[TOPIC].partitions
    assert sorted(parts) == [0, 1, 2]
    for p in parts.values():
        assert sorted(p.replicas) == [1, 2, 3]
        assert sorted(p.isrs) == [1, 2, 3]
        assert p.leader in (1, 2, 3)
        assert p.error is None

    described = admin.describe_topics(TopicCollection([TOPIC]), request_timeout=5)[TOPIC].result()
    assert [len(p.replicas) for p in described.partitions] == [3, 3, 3]
    assert admin.describe_cluster(request_timeout=5).result().controller.id == 1


def test_set_leader_moves_the_leader(cluster: MockCluster, clients):
    """(2) set_leader is visible in the next Metadata response (AdminClient.list_topics sends
    one per call) and in describe_topics; replicas do not change."""
    cluster.create_topic(TOPIC, partitions=2, replication_factor=3)
    admin = clients(AdminClient)
    before = leader_of(admin, TOPIC, 0)
    target = 3 if before != 3 else 2

    cluster.set_leader(TOPIC, 0, target)

    poll_until([admin], lambda: leader_of(admin, TOPIC, 0) == target, what=f"leader {target}")
    p0 = admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0]
    assert sorted(p0.replicas) == [1, 2, 3]
    described = admin.describe_topics(TopicCollection([TOPIC]), request_timeout=5)[TOPIC].result()
    assert described.partitions[0].leader.id == target


def test_broker_down_drops_it_from_metadata_but_not_from_partitions(cluster: MockCluster, clients):
    """(3) broker_down(2), observed:
    - the next Metadata response lists brokers [1, 3] only (describe_cluster nodes too);
    - partitions are unchanged: the one led by 2 still reports leader 2, replicas and ISR still
      [1, 2, 3], no partition error (the mock moves no leader and never shrinks the ISR);
    - clients connected to 2 are disconnected ("Disconnected: connection closed by peer", log
      level 6, no error_cb) and librdkafka drops broker 2 from its own broker list;
    - a record for the partition led by 2 is never delivered (_MSG_TIMED_OUT after
      message.timeout.ms); records for the other partitions are delivered.
    broker_up(2) puts it back in the broker list."""
    cluster.create_topic(TOPIC, partitions=3, replication_factor=3)
    for partition, broker in ((0, 1), (1, 2), (2, 3)):
        cluster.set_leader(TOPIC, partition, broker)
    admin = clients(AdminClient)
    producer = clients(Producer, **{"message.timeout.ms": 1000, "linger.ms": 0})
    for partition in range(3):
        producer.produce(TOPIC, b"warm-up", partition=partition)
    assert producer.flush(5) == 0

    cluster.broker_down(2)

    md = poll_until([admin], lambda: (m := admin.list_topics(timeout=5)) and sorted(m.brokers) == [1, 3] and m,
                    what="broker 2 gone from metadata")
    p1 = md.topics[TOPIC].partitions[1]
    assert (p1.leader, sorted(p1.replicas), sorted(p1.isrs), p1.error) == (2, [1, 2, 3], [1, 2, 3], None)
    assert sorted(n.id for n in admin.describe_cluster(request_timeout=5).result().nodes) == [1, 3]

    outcome: dict[int, KafkaError | None] = {}
    for partition in range(3):
        producer.produce(TOPIC, b"during-outage", partition=partition,
                         on_delivery=lambda err, msg: outcome.__setitem__(msg.partition(), err))
    poll_until([producer], lambda: len(outcome) == 3, what="3 delivery reports")
    assert outcome[0] is None and outcome[2] is None
    assert outcome[1] is not None and outcome[1].code() == KafkaError._MSG_TIMED_OUT

    cluster.broker_up(2)
    poll_until([admin], lambda: sorted(admin.list_topics(timeout=5).brokers) == [1, 2, 3], what="broker 2 back")


def test_not_leader_on_produce_makes_the_producer_refresh_the_leader(cluster: MockCluster, clients):
    """(4a) NOT_LEADER_OR_FOLLOWER x3 on Produce: the producer retries and delivers (4 Produce
    requests in the statistics' per-broker req counters) and, after the errors, (i) asks for a
    metadata refresh ("Starting fast leader query", logged when the query timer starts, so 1..3
    times) and (ii) updates the partition's leader in its cache from the leader carried in the
    error response (KIP-951: "Partition orders(..)[0]: updated with leader N and epoch E"). Because (ii) usually lands first, the fast leader query
    often sends no MetadataRequest at all: req["Metadata"] grows by 0..3, racily, so it is not
    asserted. Control: the same produce without injection gives 1 Produce request, no query and
    no leader update, so the assertions fail if the injection did nothing."""
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    stats, logs = Stats(), LogCapture()
    try:
        producer = clients(Producer, **{"statistics.interval.ms": 100, "stats_cb": stats, "debug": "metadata",
                                        "logger": logs.logger, "linger.ms": 0, "retry.backoff.ms": 20})
        producer.produce(TOPIC, b"warm-up", partition=0)
        assert producer.flush(5) == 0
        poll_until([producer], lambda: stats.latest and stats.requests("Produce") >= 1, what="Produce in stats")

        def produce_one() -> tuple[int, int, int]:
            """-> (Produce requests, fast leader queries, leader updates) for one record."""
            fresh_stats([producer], stats)
            produce0 = stats.requests("Produce")
            logs.lines.clear()
            delivered: list[KafkaError | None] = []
            producer.produce(TOPIC, b"x", partition=0, on_delivery=lambda err, msg: delivered.append(err))
            assert producer.flush(5) == 0 and delivered == [None]
            fresh_stats([producer], stats)
            return (stats.requests("Produce") - produce0, len(logs.matching("Starting fast leader query")),
                    len(logs.matching(f"Partition {TOPIC}(", ")[0]: updated with leader")))

        assert produce_one() == (1, 0, 0)
        cluster.push_request_errors(ApiKey.PRODUCE, [Err.NOT_LEADER_OR_FOLLOWER] * 3)
        produce_reqs, queries, leader_updates = produce_one()
        assert produce_reqs == 4, "3 rejected Produce requests + the successful retry"
        assert queries >= 1, logs.lines         # not 1 per error: a query already running is not restarted
        assert leader_updates >= 1, logs.lines
    finally:
        logs.close()


def test_an_instrumented_producer_counts_its_deliveries_and_their_errors_by_code(cluster: MockCluster):
    """InstrumentedProducer: every delivery report goes through the instrumentation (the config's
    on_delivery and produce()'s own callback, both still called) and the client_produce events
    carry the writes delivered, the failures by code and the delivery latency.  NOT_ENOUGH_REPLICAS
    injected on Produce with retries 0 is what the application's callback sees too."""
    from monitor.contract import ClientProduce
    from monitor.instrument import InstrumentedProducer
    from tests.support.probe_fakes import InstrumentFakeEmitter

    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    em = InstrumentFakeEmitter()
    app_global: list = []
    app_own: list = []
    producer = InstrumentedProducer({"bootstrap.servers": cluster.bootstrap, "statistics.interval.ms": 100,
                                     "retries": 0, "enable.idempotence": False, "linger.ms": 0,
                                     "on_delivery": lambda err, msg: app_global.append(err)},
                                    events=em, cluster="mock")
    try:
        for i in range(3):
            producer.produce(TOPIC, b"%d" % i, partition=0)
        assert producer.flush(5) == 0
        cluster.push_request_errors(ApiKey.PRODUCE, [Err.NOT_ENOUGH_REPLICAS])
        producer.produce(TOPIC, b"refused", partition=0, callback=lambda err, msg: app_own.append(err))
        assert producer.flush(5) == 0
        assert app_global == [None] * 3 and [e.name() for e in app_own] == ["NOT_ENOUGH_REPLICAS"]

        def last() -> ClientProduce | None:
            got = [p for p in em.of(ClientProduce) if p.delivered_messages == 3 and p.delivery_errors]
            return got[-1] if got else None
        rep = poll_until([producer], last, what="a client_produce with the 4 delivery reports")
    finally:
        producer.purge()
        producer.close()
        producer.close_instrumentation(0)
    assert [(e.code, e.count) for e in rep.delivery_errors] == [("NOT_ENOUGH_REPLICAS", 1)]
    assert sum(rep.delivery_latency_counts) == 3 and 0 < rep.delivery_latency_sum_ms < 5000
    assert rep.sent_messages == 4 and producer.instrumentation.instrumentation_errors == 0


def test_leader_not_available_on_produce_sends_metadata_requests(cluster: MockCluster, clients):
    """(4b) LEADER_NOT_AVAILABLE x2 on Produce (no leader in the response to use): each error
    makes the producer send a MetadataRequest, seen in the statistics' per-broker req["Metadata"]
    counters (0 in the control round, >= 2 after the injection)."""
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    stats = Stats()
    producer = clients(Producer, **{"statistics.interval.ms": 100, "stats_cb": stats, "linger.ms": 0,
                                    "retry.backoff.ms": 20})
    producer.produce(TOPIC, b"warm-up", partition=0)
    assert producer.flush(5) == 0

    def metadata_requests_for_one_produce() -> int:
        fresh_stats([producer], stats)
        before = stats.requests("Metadata")
        producer.produce(TOPIC, b"x", partition=0)
        assert producer.flush(5) == 0
        fresh_stats([producer], stats)
        return stats.requests("Metadata") - before

    assert metadata_requests_for_one_produce() == 0
    cluster.push_request_errors(ApiKey.PRODUCE, [Err.LEADER_NOT_AVAILABLE] * 2)
    assert metadata_requests_for_one_produce() >= 2


def test_not_leader_on_fetch_updates_the_leader_and_the_consumer_recovers(cluster: MockCluster, clients):
    """(4c) NOT_LEADER_OR_FOLLOWER x2 on Fetch: debug=fetch,metadata shows "Fetch failed at offset
    .. NOT_LEADER_FOR_PARTITION" (logged once: librdkafka does not repeat an unchanged fetch
    error), a fast leader query and "updated with leader" (KIP-951 again); after the fetch
    backoff the consumer gets the next record. Control: nothing of that before the injection."""
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    logs = LogCapture()
    try:
        producer = clients(Producer, **{"linger.ms": 0})
        producer.produce(TOPIC, b"first", partition=0)
        assert producer.flush(5) == 0
        consumer = clients(Consumer, **{"group.id": "g", "enable.auto.commit": False, "fetch.wait.max.ms": 50,
                                        "fetch.error.backoff.ms": 50, "debug": "fetch,metadata",
                                        "logger": logs.logger})
        consumer.assign([TopicPartition(TOPIC, 0, 0)])

        def next_value():
            msg = consumer.poll(0.05)
            return msg.value() if msg is not None and msg.error() is None else None

        assert poll_until([], next_value, what="first record") == b"first"
        producer.produce(TOPIC, b"control", partition=0)
        assert producer.flush(5) == 0
        logs.lines.clear()
        assert poll_until([], next_value, what="control record") == b"control"
        assert not logs.matching("NOT_LEADER") and not logs.matching("Starting fast leader query"), logs.lines
        logs.lines.clear()
        cluster.push_request_errors(ApiKey.FETCH, [Err.NOT_LEADER_OR_FOLLOWER] * 2)
        producer.produce(TOPIC, b"second", partition=0)
        assert producer.flush(5) == 0

        assert poll_until([], next_value, what="second record") == b"second"
        assert logs.matching("Fetch failed", "NOT_LEADER_FOR_PARTITION"), logs.lines
        assert logs.matching("Starting fast leader query"), logs.lines
        assert logs.matching(f"Partition {TOPIC}(", ")[0]: updated with leader"), logs.lines
    finally:
        logs.close()


def test_leader_epoch_is_only_in_statistics_and_only_after_a_refresh(cluster: MockCluster, clients):
    """(5) Where confluent-kafka 2.16.1 exposes a partition's leader epoch: PartitionMetadata
    (list_topics) and TopicPartitionInfo (describe_topics) have no leader_epoch; the statistics
    JSON has topics.<t>.partitions.<p>.leader_epoch for every partition of every topic the client
    holds a handle for (produced to, assigned, or named in list_topics(topic)). Each set_leader
    bumps the mock's epoch by one; the client's value stays stale until its next Metadata
    response for the topic (error-driven, topic.metadata.refresh.interval.ms, or an explicit
    list_topics), and shows at the next statistics emission after that."""
    cluster.create_topic(TOPIC, partitions=2, replication_factor=3)
    stats = Stats()
    producer = clients(Producer, **{"statistics.interval.ms": 100, "stats_cb": stats})
    md = producer.list_topics(TOPIC, timeout=5)   # registers the topic: it now appears in stats
    assert not hasattr(md.topics[TOPIC].partitions[0], "leader_epoch")
    admin = clients(AdminClient)
    described = admin.describe_topics(TopicCollection([TOPIC]), request_timeout=5)[TOPIC].result()
    assert not hasattr(described.partitions[0], "leader_epoch")

    start = poll_until([producer], lambda: stats.partition(TOPIC, 0), what="partition 0 in stats")
    epoch0, leader0 = start["leader_epoch"], start["leader"]
    other_epoch = stats.partition(TOPIC, 1)["leader_epoch"]
    assert epoch0 >= 0
    target = 3 if leader0 != 3 else 2

    cluster.set_leader(TOPIC, 0, 1 if target != 1 else 2)
    cluster.set_leader(TOPIC, 0, target)
    fresh_stats([producer], stats, n=3)
    stale = stats.partition(TOPIC, 0)
    assert (stale["leader"], stale["leader_epoch"]) == (leader0, epoch0), "no refresh yet: still the old view"

    producer.list_topics(timeout=5)                 # any Metadata response covering the topic
    poll_until([producer], lambda: (p := stats.partition(TOPIC, 0)) and p["leader_epoch"] == epoch0 + 2,
               what=f"leader_epoch {epoch0 + 2}")
    assert stats.partition(TOPIC, 0)["leader"] == target
    assert stats.partition(TOPIC, 1)["leader_epoch"] == other_epoch, "untouched partition keeps its epoch"
