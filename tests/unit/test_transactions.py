"""Open transactions without a cluster: ListTransactions, DescribeTransactions and DescribeProducers
answers as kafka-python 3.0.12 gives them (its own types, the shapes recorded from Kafka 4.1.1)
become one transactions event per round: the oldest first, ages from the coordinator's start time,
bounded lists; failures told apart."""

from __future__ import annotations

import json
import logging

from kafka import errors as kerr
from kafka.admin._transactions import (PartitionProducerState, ProducerState, TransactionDescription,
                                       TransactionListing, TransactionState)
from kafka.structs import TopicPartition

from monitor import transactions as tx
from monitor.contract import Event, OpenTransactions
from monitor.transactions import TransactionWatcher, fit, held_partitions, open_transactions

NOW = 1_700_000_000_000
ONGOING = TransactionState.ONGOING


def desc(coordinator, pid, start, parts, state=ONGOING, epoch=3, timeout=60_000):
    return TransactionDescription(coordinator_id=coordinator, state=state, producer_id=pid, producer_epoch=epoch,
                                  transaction_timeout_ms=timeout, transaction_start_time_ms=start,
                                  topic_partitions={TopicPartition(t, p) for t, p in parts})


def producers(*rows):
    """PartitionProducerState of (producer id, first offset or -1) rows."""
    return PartitionProducerState(active_producers=[
        ProducerState(producer_id=pid, producer_epoch=3, last_sequence=9, last_timestamp=NOW - 1000,
                      coordinator_epoch=0, current_transaction_start_offset=first) for pid, first in rows])


class FakeAdmin:
    """kafka-python's KafkaAdminClient as the watcher calls it.  ``listed``: broker -> its
    TransactionListings (or an exception); ``described``: id -> TransactionDescription (or an
    exception, raised for any call that asks it, as kafka-python raises on a per-id error code);
    ``held``: (topic, partition) -> PartitionProducerState (or an exception)."""

    def __init__(self, listed, described=None, held=None, brokers=None):
        self.listed, self.described, self.held = listed, described or {}, held or {}
        self.brokers = brokers if brokers is not None else sorted(listed)
        self.calls: list = []

    def describe_cluster(self):
        if isinstance(self.brokers, Exception):
            raise self.brokers
        return {"brokers": [{"broker_id": b, "is_fenced": False} for b in self.brokers]}

    def list_transactions(self, broker_ids=None, producer_id_filters=None, state_filters=None, duration_filter_ms=None,
                          transactional_id_pattern=None):
        self.calls.append(("list", tuple(broker_ids), tuple(state_filters)))
        (b,) = broker_ids
        rows = self.listed[b]
        if isinstance(rows, Exception):
            raise rows
        return {b: [r for r in rows if r.state.value in state_filters]}

    def describe_transactions(self, ids):
        self.calls.append(("describe", len(ids)))
        for i in ids:
            if isinstance(self.described.get(i), Exception):
                raise self.described[i]
        return {i: self.described[i] for i in ids if i in self.described}

    def describe_producers(self, partitions):
        self.calls.append(("producers", len(partitions)))
        out = {}
        for tp in partitions:
            assert isinstance(tp, TopicPartition)
            v = self.held.get((tp.topic, tp.partition), producers())
            if isinstance(v, Exception):
                raise v
            out[tp] = v
        return out

    def close(self):
        pass


def listing(tid, pid, state=ONGOING):
    return TransactionListing(transactional_id=tid, producer_id=pid, state=state)


def watcher(fake, clock_ms=NOW, **kw):
    made = []
    w = TransactionWatcher({}, interval_s=30, timeout_s=5, cluster_name="k",
                           admin_factory=lambda: made.append(1) or fake, clock=lambda: clock_ms / 1000, **kw)
    return w, made


def test_an_answer_becomes_one_event_the_oldest_first_with_ages_from_the_coordinators_start():
    fake = FakeAdmin(
        {1: [listing("young", 7), listing("old", 9)], 2: [listing("committing", 5, TransactionState.PREPARE_COMMIT)]},
        {"young": desc(1, 7, NOW - 2_000, [("orders", 0)]),
         "old": desc(1, 9, NOW - 900_000, [("orders", 1), ("orders", 0), ("pay", 3)], timeout=60_000),
         "committing": desc(2, 5, NOW - 30_000, [("pay", 3)], state=TransactionState.PREPARE_COMMIT)},
        {("orders", 1): producers((9, 120), (4, -1)), ("orders", 0): producers((9, 100), (7, 140)),
         ("pay", 3): producers((5, 7))})
    w, _ = watcher(fake)
    at, e = w.ask()
    assert at == NOW and e.ok and e.interval_ms == 30_000 and e.error_kind is None
    assert [(t.transactional_id, t.state, t.coordinator, t.started_ms_ago, t.timeout_ms, t.producer_epoch)
            for t in e.transactions] == [("old", "Ongoing", 1, 900_000, 60_000, 3),
                                         ("committing", "PrepareCommit", 2, 30_000, 60_000, 3),
                                         ("young", "Ongoing", 1, 2_000, 60_000, 3)]
    assert e.transactions[0].partitions == ["orders-0", "orders-1", "pay-3"] and e.transactions[0].partitions_count == 3
    # the oldest transaction's partitions asked first; a producer with no transaction open is not held
    assert [(h.topic, h.partition, h.producer_id, h.first_offset) for h in e.held_partitions] == [
        ("orders", 0, 9, 100), ("orders", 0, 7, 140), ("orders", 1, 9, 120), ("pay", 3, 5, 7)]
    assert (e.transactions_count, e.held_partitions_count, e.unasked_partitions, e.unlisted_brokers) == (3, 4, 0, [])
    assert ("list", (1,), tx.OPEN_STATES) in fake.calls and ("list", (2,), tx.OPEN_STATES) in fake.calls
    ev = Event.of(e, cluster="k", source="p", seq=0, observed_at=at)
    assert ev.schema == "kafka-monitor/v2" and ev.type == "transactions" and ev.key() == "k"
    assert Event.from_json(ev.to_json()) == ev


def test_a_transaction_that_ended_since_it_was_listed_is_left_out_and_one_not_described_is_kept_last():
    listed = {"done": (1, 1, "Ongoing"), "open": (1, 2, "Ongoing"), "lost": (2, 3, "PrepareAbort")}
    described = {"done": desc(1, 1, -1, [], state=TransactionState.COMPLETE_COMMIT),
                 "open": desc(1, 2, NOW - 5, [("t", 0)])}
    out = open_transactions(listed, described, NOW)
    assert [(t.transactional_id, t.described, t.state, t.coordinator, t.started_ms_ago, t.partitions_count)
            for t in out] == [("open", True, "Ongoing", 1, 5, 1), ("lost", False, "PrepareAbort", 2, None, 0)]


def test_lists_are_bounded_and_the_event_stays_under_its_byte_budget():
    n = tx.MAX_TRANSACTIONS + 200
    listed = {f"id-{i}": (1, i, "Ongoing") for i in range(n)}
    described = {f"id-{i}": desc(1, i, NOW - 1_000_000 + i, [("t", p) for p in range(i % 150)]) for i in range(n)}
    txns = open_transactions(listed, described, NOW)
    assert len(txns) == n and txns[0].transactional_id == "id-0"  # the oldest first
    assert max(len(t.partitions) for t in txns) == tx.MAX_NAMES and max(t.partitions_count for t in txns) == 149
    held = held_partitions([("t", p) for p in range(2000)], {TopicPartition("t", p): producers((1, p)) for p in range(2000)})
    e = fit(OpenTransactions(ok=True, interval_ms=1, transactions=txns, transactions_count=n,
                             held_partitions=held, held_partitions_count=len(held)))
    size = len(Event.of(e, cluster="k", source="p", seq=0, observed_at=NOW).to_json())
    assert size <= tx.MAX_DATA_BYTES + 300 < 65_536
    assert e.transactions and e.held_partitions and e.transactions[0].transactional_id == "id-0"
    assert e.held_partitions[0].partition == 0 and (e.transactions_count, e.held_partitions_count) == (n, 2000)
    small = OpenTransactions(ok=True, interval_ms=1, transactions=txns[:2])
    assert fit(small) is small


def test_the_watcher_describes_in_chunks_and_asks_producers_of_at_most_a_bounded_number_of_partitions():
    n = 250
    fake = FakeAdmin({1: [listing(f"id-{i}", i) for i in range(n)]},
                     {f"id-{i}": desc(1, i, NOW - 10_000 + i, [(f"t{i}", p) for p in range(5)]) for i in range(n)})
    w, _ = watcher(fake)
    _, e = w.ask()
    assert [c for c in fake.calls if c[0] == "describe"] == [("describe", 100), ("describe", 100), ("describe", 50)]
    assert sum(c[1] for c in fake.calls if c[0] == "producers") == tx.MAX_PRODUCER_PARTITIONS
    assert e.unasked_partitions == n * 5 - tx.MAX_PRODUCER_PARTITIONS and e.held_partitions == []


def test_one_transaction_whose_describe_fails_is_still_listed_and_the_others_are_described():
    ids = [f"id-{i}" for i in range(8)]
    described: dict = {i: desc(1, n, NOW - 100 * (n + 1), [("t", n)]) for n, i in enumerate(ids)}
    described["id-5"] = kerr.TransactionalIdAuthorizationFailedError("id-5")
    described["id-2"] = kerr.TransactionalIdNotFoundError("id-2")  # expired since listed: not open
    fake = FakeAdmin({1: [listing(i, n) for n, i in enumerate(ids)]}, described)
    w, _ = watcher(fake)
    _, e = w.ask()
    by_id = {t.transactional_id: t for t in e.transactions}
    assert "id-2" not in by_id and not by_id["id-5"].described and by_id["id-5"].producer_id == 5
    assert all(t.described for i, t in by_id.items() if i != "id-5") and len(by_id) == 7
    assert e.transactions[-1].transactional_id == "id-5"  # not described: last
    assert e.ok and w.permission_said
    assert sum(1 for c in fake.calls if c[0] == "describe") <= 1 + tx.SPLIT_CALLS


def test_a_broker_that_fails_is_named_and_the_others_still_listed():
    fake = FakeAdmin({1: [listing("a", 1)], 2: kerr.RequestTimedOutError("slow")}, {"a": desc(1, 1, NOW - 1, [])})
    w, made = watcher(fake)
    _, e = w.ask()
    assert e.ok and e.unlisted_brokers == [2] and [t.transactional_id for t in e.transactions] == ["a"]
    assert w.failures == 1 and "RequestTimedOutError" in w.last_error
    w.ask()
    assert len(made) == 2  # a broker that did not answer: a new client next round


def test_failures_are_told_apart():
    for err, kind in ((kerr.ClusterAuthorizationFailedError("no"), "permission"),
                      (kerr.KafkaTimeoutError("late"), "no_answer"), (kerr.InvalidRequestError("bad"), "error")):
        fake = FakeAdmin({1: err, 2: err})
        w, _ = watcher(fake)
        at, e = w.ask()
        assert (e.ok, e.error_kind, e.transactions, at) == (False, kind, [], NOW), kind
        assert e.unlisted_brokers == [] and type(err).__name__ in e.error
        ev = Event.of(e, cluster="k", source="p", seq=1, observed_at=at)
        assert Event.from_json(ev.to_json()) == ev
    w, _ = watcher(FakeAdmin({}, brokers=ConnectionError("down")))
    assert w.ask()[1].error_kind == "no_answer"


def test_a_refusal_is_said_once_with_the_acls_it_needs(caplog):
    fake = FakeAdmin({1: kerr.TransactionalIdAuthorizationFailedError("no")})
    w, _ = watcher(fake)
    with caplog.at_level(logging.WARNING, logger="monitor.transactions"):
        for _ in range(3):
            assert w.ask()[1].error_kind == "permission"
    (r,) = caplog.records
    assert "DESCRIBE on the transactional ids" in r.message and "on their topics" in r.message


def test_unsupported_is_said_once_and_not_asked_again(caplog):
    fake = FakeAdmin({1: kerr.IncompatibleBrokerVersion("ListTransactions"), 2: []})
    w, _ = watcher(fake)
    with caplog.at_level(logging.WARNING, logger="monitor.transactions"):
        assert w.ask() is None and w.available is False
        w._run()  # returns at once: not asked again
    assert w.take() is None and len([c for c in fake.calls if c[0] == "list"]) == 1
    assert [r.message.split(":")[0] for r in caplog.records] == ["transactions not watched on cluster k"]


def test_other_failures_are_logged_at_the_1st_10th_and_100th(caplog):
    fake = FakeAdmin({1: ConnectionError("refused")})
    w, _ = watcher(fake)
    with caplog.at_level(logging.WARNING, logger="monitor.transactions"):
        for _ in range(100):
            w.ask()
    assert w.failures == 100 and len(caplog.records) == 3 and "no_answer, 1 so far" in caplog.records[0].message


def test_a_producers_failure_costs_only_its_partition():
    fake = FakeAdmin({1: [listing("a", 1)]}, {"a": desc(1, 1, NOW - 1, [("gone", 0), ("t", 0), ("t", 1)])},
                     {("gone", 0): kerr.UnknownTopicOrPartitionError("gone-0"), ("t", 1): producers((1, 42))})
    w, made = watcher(fake)
    _, e = w.ask()
    assert [(h.topic, h.partition, h.first_offset) for h in e.held_partitions] == [("t", 1, 42)]
    assert e.unasked_partitions == 1 and w.failures == 1
    w.ask()
    assert len(made) == 2  # leaders the client may have wrong: a new one


def test_the_watcher_hands_each_answer_over_once_and_remembers_the_oldest_for_the_next_round():
    fake = FakeAdmin({1: [listing("b", 1), listing("a", 2)]},
                     {"a": desc(1, 2, NOW - 50, []), "b": desc(1, 1, NOW - 10, [])})
    w, _ = watcher(fake)
    first = w.ask()
    assert w.take() == first and w.take() is None
    assert w._started == {"a": NOW - 50, "b": NOW - 10}
    fake.calls.clear()
    w.ask()
    assert w.take() is not None and w.take() is None


def test_the_event_is_documented_in_the_contract_and_its_schema():
    from monitor.contract_docs import json_schema

    s = json_schema()
    assert "transactions" in s["properties"]["type"]["enum"]
    assert {"OpenTransactions", "OpenTransaction", "HeldPartition"} <= set(s["$defs"])
    assert json.loads(json.dumps(s))["$defs"]["OpenTransactions"]["required"] == ["ok", "interval_ms"]


def test_partitions_held_back_that_no_listed_transaction_writes_to_are_asked_too_and_holders_are_kept():
    fake = FakeAdmin({1: [listing("seen", 7)]}, {"seen": desc(1, 7, NOW - 2_000, [("orders", 0)])},
                     {("orders", 0): producers((7, 100)), ("lost", 4): producers((66, 40)), ("quiet", 1): producers()})
    w, _ = watcher(fake, held_back=lambda: [("quiet", 1), ("orders", 0), ("lost", 4)])
    _, e = w.ask()
    assert [(h.topic, h.partition, h.producer_id, h.first_offset) for h in e.held_partitions] == [
        ("orders", 0, 7, 100), ("lost", 4, 66, 40)]  # the listed transaction's first, then the rest by name
    assert ("producers", 3) in fake.calls and e.unasked_partitions == 0
    assert (w.holder("orders", 0, 100), w.holder("lost", 4, 40), w.holder("orders", 0, 99)) == (
        ("seen", 7), (None, 66), None)
