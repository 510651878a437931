"""The source's driver side when brokers of the events topic fail (issue 33), with a fake admin
client behind the two calls it makes (Metadata, ListOffsets): offsets that cannot be had are
unknown -- the partition keeps its offset and is reported unreadable -- never data loss; what
retrying cannot fix still fails, and a log that truly went back is still data loss.  The real
cluster's version of these faults: tests/e2e/test_own_cluster.py."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from streaming.read.source import KafkaStreamReader, ReadAllAvailable, SourceError

TOPIC = "ev"


class FakeAdmin:
    """``leaders[p]`` (-1: none), ``marks[p] = (earliest, latest)``; ``answers[p]`` overrides
    the latest answer: an int offset (e.g. -1001), an exception, or None (never answers)."""

    def __init__(self, leaders: dict[int, int], marks: dict[int, tuple[int, int]]):
        self.leaders, self.marks, self.answers = dict(leaders), dict(marks), {}
        self.metadata_error: object = None   # a KafkaException to raise, or a KafkaError on the topic
        self.requests: list[list[int]] = []  # partitions of each ListOffsets request

    def list_topics(self, topic, timeout):
        if isinstance(self.metadata_error, Exception):
            raise self.metadata_error
        parts = {p: SimpleNamespace(id=p, leader=b) for p, b in self.leaders.items()}
        brokers = {b: SimpleNamespace(id=b, host=f"b{b}", port=9092) for b in (1, 2, 3)}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=self.metadata_error, partitions=parts)},
                               brokers=brokers)

    def list_offsets(self, specs, request_timeout):
        self.requests.append(sorted(tp.partition for tp in specs))
        out = {}
        for tp, spec in specs.items():
            f: Future = Future()
            latest = type(spec).__name__ == "LatestSpec"
            answer = self.answers.get(tp.partition, "ok") if latest else "ok"
            if answer == "ok":
                f.set_result(SimpleNamespace(offset=self.marks[tp.partition][1 if latest else 0]))
            elif isinstance(answer, Exception):
                f.set_exception(answer)
            elif isinstance(answer, int):
                f.set_result(SimpleNamespace(offset=answer))
            out[tp] = f  # None: never completes
        return out


def reader(admin: FakeAdmin, timeout_ms: int = 200) -> KafkaStreamReader:
    r = KafkaStreamReader({"subscribe": TOPIC, "kafka.bootstrap.servers": "unused:9092",
                           "offsetsTimeoutMs": str(timeout_ms)})
    r._admin = admin
    r._new_client = lambda conf: admin  # a timed-out metadata request's second try: the same fake
    return r


START = {"topic": TOPIC, "offsets": {"0": 10, "1": 10, "2": 10}}


def fresh() -> FakeAdmin:
    return FakeAdmin({0: 1, 1: 2, 2: 3}, {0: (0, 20), 1: (0, 20), 2: (0, 20)})


@pytest.mark.parametrize("answer, reason", [
    (-1001, "leader 1 answered no offset (-1001)"),
    (KafkaException(KafkaError(KafkaError.FENCED_LEADER_EPOCH)), "leader 1:"),
    (KafkaException(KafkaError(KafkaError._TIMED_OUT)), "leader 1:"),
    (KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)), "leader 1:"),
    (None, "no answer from its leader 1 within 0.2s"),
], ids=["sentinel", "fenced-epoch", "timed-out", "not-leader", "no-answer"])
def test_an_unknown_end_keeps_the_partition_where_it_was_and_the_others_go_on(answer, reason):
    admin = fresh()
    admin.answers[0] = answer
    r = reader(admin)
    end = r.latestOffset(START, ReadAllAvailable())
    assert end["offsets"] == {"0": 10, "1": 20, "2": 20}
    report = r.reportLatestOffset()
    assert list(report["unreadable"]) == ["0"] and report["unreadable"]["0"]["reason"].startswith(reason)
    assert report["offsets"] == {"0": 10, "1": 20, "2": 20}
    # one request per leader and kind: broker 1's silence held up nobody else's answer
    assert sorted(admin.requests) == [[0], [0], [1], [1], [2], [2]]

    admin.answers.clear()  # the leader answers again (or the partition moved)
    assert r.latestOffset(end, ReadAllAvailable())["offsets"] == {"0": 20, "1": 20, "2": 20}
    assert "unreadable" not in r.reportLatestOffset()


def test_a_partition_without_a_leader_is_not_asked_and_waits():
    admin = fresh()
    admin.leaders[1] = -1
    r = reader(admin)
    assert r.latestOffset(START, ReadAllAvailable())["offsets"] == {"0": 20, "1": 10, "2": 20}
    assert r.reportLatestOffset()["unreadable"]["1"]["reason"] == "no leader"
    assert all(1 not in req for req in admin.requests)


def test_the_clock_of_an_unreadable_partition_runs_from_its_first_failure():
    admin = fresh()
    admin.answers[2] = -1001
    r = reader(admin)
    r.latestOffset(START, ReadAllAvailable())
    since = r.reportLatestOffset()["unreadable"]["2"]["since"]
    admin.answers[2] = KafkaException(KafkaError(KafkaError._TRANSPORT))
    r.latestOffset(START, ReadAllAvailable())
    again = r.reportLatestOffset()["unreadable"]["2"]
    assert again["since"] == since and "leader 3" in again["reason"]


@pytest.mark.parametrize("error", [KafkaException(KafkaError(KafkaError._TIMED_OUT)),
                                   KafkaError(KafkaError.LEADER_NOT_AVAILABLE)], ids=["raised", "topic-error"])
def test_metadata_that_fails_before_any_answer_leaves_every_partition_where_it_was(error):
    admin = fresh()
    admin.metadata_error = error
    r = reader(admin)
    assert r.latestOffset(START, ReadAllAvailable())["offsets"] == {"0": 10, "1": 10, "2": 10}
    assert sorted(r.reportLatestOffset()["unreadable"]) == ["0", "1", "2"]
    assert admin.requests == []


@pytest.mark.parametrize("error", [KafkaException(KafkaError(KafkaError._TIMED_OUT)),
                                   KafkaError(KafkaError.LEADER_NOT_AVAILABLE)], ids=["raised", "topic-error"])
def test_metadata_that_fails_later_asks_the_leaders_it_last_named(error):
    """The metadata request went to the broker that does not answer: the other leaders are
    still asked, and only the silent one's partitions wait."""
    admin = fresh()
    r = reader(admin)
    end = r.latestOffset(START, ReadAllAvailable())
    admin.metadata_error = error
    admin.marks = {0: (0, 30), 1: (0, 30), 2: (0, 30)}
    admin.answers[1] = None  # broker 2, silent
    assert r.latestOffset(end, ReadAllAvailable())["offsets"] == {"0": 30, "1": 20, "2": 30}
    assert list(r.reportLatestOffset()["unreadable"]) == ["1"]


@pytest.mark.parametrize("error, text", [
    (KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), "TOPIC_AUTHORIZATION_FAILED"),
    (KafkaException(KafkaError(KafkaError._AUTHENTICATION)), "authentication failed"),
], ids=["authorization", "authentication"])
def test_what_retrying_cannot_fix_still_fails(error, text):
    admin = fresh()
    admin.answers[1] = error
    with pytest.raises(SourceError, match=text):
        reader(admin).latestOffset(START, ReadAllAvailable())


def test_a_topic_that_is_gone_or_refused_fails_with_its_name():
    admin = fresh()
    admin.metadata_error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    with pytest.raises(SourceError, match="events topic 'ev' is not available"):
        reader(admin).latestOffset(START, ReadAllAvailable())


def test_a_log_that_truly_went_back_is_still_data_loss():
    admin = fresh()
    admin.marks[1] = (0, 4)  # a real answer below the checkpoint: the topic was recreated
    with pytest.raises(SourceError, match=r"ev/1: the end offset went back from 10 to 4"):
        reader(admin).latestOffset(START, ReadAllAvailable())


def test_a_first_start_leaves_out_a_partition_it_cannot_read_then_reads_it_from_its_earliest():
    admin = fresh()
    admin.marks[2] = (5, 20)
    admin.answers[2] = -1001
    r = reader(admin, timeout_ms=50)  # initialOffset gives the fault 6 timeouts (0.3 s) to pass
    start = r.initialOffset()
    assert start["offsets"] == {"0": 0, "1": 0}
    admin.answers.clear()
    end = r.latestOffset(start, ReadAllAvailable())
    assert end["offsets"] == {"0": 20, "1": 20, "2": 20}
    assert [(p, s, e) for t in r.partitions(start, end) for p, s, e in t.ranges] == [(0, 0, 20), (1, 0, 20), (2, 0, 20)]


def test_a_metadata_request_that_times_out_is_sent_again_through_a_new_client():
    """librdkafka sends a client's metadata request to the broker it last used; a paused one held
    every trigger's metadata, and the source read from stale leaders for the whole pause.  A
    timed-out request is sent again through a new client, bootstrapped from the brokers the last
    answer listed too, which the source keeps (its ListOffsets go where that one's metadata says);
    the old client is kept while requests of its own are out."""
    old = fresh()
    r = reader(old)
    assert r.latestOffset(START, ReadAllAvailable())["offsets"] == {"0": 20, "1": 20, "2": 20}
    old.answers[1] = None  # broker 2 silent: a request of the old client stays out
    r.latestOffset(START, ReadAllAvailable())
    old.metadata_error = KafkaException(KafkaError(KafkaError._TIMED_OUT))
    new = FakeAdmin({0: 2, 1: 3, 2: 3}, {0: (0, 30), 1: (0, 30), 2: (0, 30)})  # leadership moved
    made: list[dict] = []
    r._new_client = lambda conf: made.append(conf) or new
    end = r.latestOffset(START, ReadAllAvailable())
    assert r.metadata_retries == 1 and r._admin is new
    assert made[0]["bootstrap.servers"] == "unused:9092,b1:9092,b2:9092,b3:9092"
    assert end["offsets"] == {"0": 30, "1": 30, "2": 30} and "unreadable" not in r.reportLatestOffset()
    assert [c for c, _ in r._retired] == [old]  # its request for partition 1 is still out
    r.stop()
    assert r._retired == [] and r._admin is None


def test_replaced_clients_are_kept_while_their_requests_are_out_and_the_oldest_is_waited_for(monkeypatch):
    """Each metadata timeout replaces the client; one whose ListOffsets request is still out
    is kept with it, one whose requests all ended goes.  Past RETIRED_MAX the oldest one's
    requests are waited for (bounded by the timeout) before it goes, never dropped while out."""
    from streaming.read import source

    waited: list[list] = []

    def wait(fs, timeout):  # the reader's waits, without waiting: what is not done is late
        waited.append(list(fs))
        return {f for f in fs if f.done()}, {f for f in fs if not f.done()}

    monkeypatch.setattr(source, "wait_futures", wait)
    clients = [fresh() for _ in range(source.RETIRED_MAX + 3)]
    for c in clients:
        c.answers[1] = None  # each client's request for partition 1 stays out
    r = reader(clients[0])
    made = iter(clients[1:])
    r._new_client = lambda conf: next(made)
    r.latestOffset(START, ReadAllAvailable())
    for i in range(1, source.RETIRED_MAX + 2):
        clients[i - 1].metadata_error = KafkaException(KafkaError(KafkaError._TIMED_OUT))
        waited.clear()
        r.latestOffset(START, ReadAllAvailable())
        assert r._admin is clients[i]
        kept = [c for c, _ in r._retired]
        assert kept == clients[max(0, i - source.RETIRED_MAX):i]
        if i > source.RETIRED_MAX:  # the oldest went, after a wait for its own request
            assert waited[0] and all(not f.done() for f in waited[0])
    # a client whose requests all ended goes at the next replacement, without a wait
    for _, fs in r._retired:
        for f in fs:
            if not f.done():
                f.set_result(SimpleNamespace(offset=20))
    clients[source.RETIRED_MAX + 1].metadata_error = KafkaException(KafkaError(KafkaError._TIMED_OUT))
    waited.clear()
    r.latestOffset(START, ReadAllAvailable())
    assert [c for c, _ in r._retired] == [clients[source.RETIRED_MAX + 1]]
    assert len(waited) == 1  # only this call's own ListOffsets wait
