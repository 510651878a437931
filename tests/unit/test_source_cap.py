"""maxOffsetsPerTrigger: the cap shared across partitions."""

import pytest

from streaming.read.source import cap


@pytest.mark.parametrize("begin, end, limit, expected", [
    ({0: 0, 1: 0}, {0: 10, 1: 10}, 100, {0: 10, 1: 10}),          # under the cap: everything
    ({0: 0, 1: 0}, {0: 100, 1: 300}, 40, {0: 10, 1: 30}),         # proportional to backlog
    ({0: 50, 1: 0}, {0: 50, 1: 10}, 5, {0: 50, 1: 5}),            # no backlog: does not move
    ({0: 0, 1: 0, 2: 0}, {0: 1000, 1: 1, 2: 1}, 3, {0: 2, 1: 1, 2: 1}),  # every backlog moves by >= 1
    ({}, {0: 100}, 10, {0: 10}),                                  # new partition starts at earliest (0)
])
def test_cap(begin, end, limit, expected):
    assert cap(begin, end, limit, earliest={p: 0 for p in end}) == expected


@pytest.mark.parametrize("ranges, max_tasks, per_task, expected", [
    ([(0, 0, 10), (1, 0, 10), (2, 5, 5)], 2, 50_000, [[(0, 0, 10), (1, 0, 10)]]),  # small batch: one task
    ([(0, 0, 60_000), (1, 0, 60_000)], 2, 50_000, [[(0, 0, 60_000)], [(1, 0, 60_000)]]),  # large: a task per core
    ([(0, 0, 60_000), (1, 0, 60_000), (2, 0, 60_000)], 8, 50_000,
     [[(0, 0, 60_000)], [(1, 0, 60_000)], [(2, 0, 60_000)]]),  # never more tasks than partitions
    ([(0, 0, 90), (1, 0, 50), (2, 0, 40)], 2, 60, [[(0, 0, 90)], [(1, 0, 50), (2, 0, 40)]]),  # balanced by records
    ([(0, 3, 3)], 2, 10, []),  # nothing to read: no task
])
def test_plan_tasks(ranges, max_tasks, per_task, expected):
    from streaming.read.source import plan_tasks
    assert plan_tasks(ranges, max_tasks, per_task) == expected


def test_a_cycle_of_v3_records_uses_every_core():
    """At 100k partitions a probe's cycle is ~2,100 v3 records (~128k events): two tasks, not one
    (with one, the parse ran on one core while the other idled: bench/README.md's stage table)."""
    from streaming.read.source import plan_tasks
    tasks = plan_tasks([(p, 0, 350) for p in range(6)], 2)
    assert len(tasks) == 2 and sorted(r for t in tasks for r in t) == [(p, 0, 350) for p in range(6)]
    assert len(plan_tasks([(0, 0, 40), (1, 0, 10)], 2)) == 1  # a quiet batch: heartbeats and changes


def test_record_values_become_text_and_bytes_that_are_not_utf8_are_replaced():
    """read_range hands keys and values to Arrow as bytes: a batch of UTF-8 gives the same text
    as decoding each value; one bad value sends the batch through Python's decoder, which
    replaces the bad bytes (U+FFFD) and keeps the good values and the missing ones as they are."""
    from streaming.read.source import _record_batch

    good = ['{"a": "é"}'.encode(), None, b"plain"]
    b = _record_batch({"key": [b"k", None, b"k3"], "value": good, "partition": [0, 1, 2], "offset": [5, 6, 7],
                       "timestamp": [1, 2, 3]}, "events")
    assert b.column("value").to_pylist() == ['{"a": "é"}', None, "plain"]
    assert b.column("key").to_pylist() == ["k", None, "k3"]
    assert b.column("topic").to_pylist() == ["events"] * 3 and b.column("offset").to_pylist() == [5, 6, 7]
    bad = _record_batch({"key": [None, None], "value": [b'{"x": "\xff"}', b"ok"], "partition": [0, 0],
                         "offset": [1, 2], "timestamp": [0, 0]}, "events")
    assert bad.column("value").to_pylist() == ['{"x": "\ufffd"}', "ok"]


class _Msg:
    def __init__(self, offset: int, eof: bool = False):
        self._offset, self._eof = offset, eof

    def error(self):
        from confluent_kafka import KafkaError
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class _Consumer:
    """Answers each consume() with the next scripted list; records what was asked."""
    script: list = []
    asked: list = []

    def __init__(self, conf):
        pass

    def assign(self, parts):
        pass

    def consume(self, num_messages, timeout):
        type(self).asked.append(num_messages)
        return type(self).script.pop(0) if type(self).script else []

    def close(self):
        pass


@pytest.mark.parametrize("script, asked, read", [
    # every record there: the read ends with the last one, no end-of-partition event asked for
    # (the broker would hold that fetch for fetch.wait.max.ms)
    ([[_Msg(0), _Msg(1), _Msg(2), _Msg(3)]], [4], [0, 1, 2, 3]),
    # offset 3 is a control record: the consume comes back short, then the partition's
    # end-of-partition event is asked for and closes it
    ([[_Msg(0), _Msg(1), _Msg(2)], [_Msg(4, eof=True)]], [4, 2], [0, 1, 2]),
])
def test_a_read_asks_for_the_records_left_and_for_the_end_only_after_a_short_answer(monkeypatch, script, asked,
                                                                                    read):
    import confluent_kafka

    from streaming.read.source import KafkaSourcePartition, messages_in_range
    monkeypatch.setattr(confluent_kafka, "Consumer", _Consumer)
    monkeypatch.setattr(_Consumer, "script", list(script))
    monkeypatch.setattr(_Consumer, "asked", [])
    part = KafkaSourcePartition("events", [(0, 0, 4)], {"bootstrap.servers": "127.0.0.1:1"}, fail_on_data_loss=True)
    assert [m.offset() for m in messages_in_range(part, idle_timeout_s=5)] == read
    assert _Consumer.asked == asked
