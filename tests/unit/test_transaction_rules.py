"""Hanging transactions through the job without a cluster: a transactions event through the parser
and HangingTransaction; the lag rule blaming an open transaction for a read_committed group's
lag; the probe's join of its transactions answer into its group offsets; the exporter's gauges."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from monitor.contract import Event, GroupOffsets, HeldPartition, OpenTransaction, OpenTransactions
from monitor.transactions import with_offsets
from streaming.ingest.parsing import parse_values
from streaming.rules import lag
from streaming.rules import transactions as rt
from streaming.rules.lag_config import LagConfig

MIN = 60_000


def txn(tid="tx-a", pid=7, age=0, timeout=600_000, parts=("orders-0",)):
    return OpenTransaction(transactional_id=tid, producer_id=pid, state="Ongoing", coordinator=2, producer_epoch=0,
                           started_ms_ago=age, timeout_ms=timeout, partitions=list(parts),
                           partitions_count=len(parts))


def held(pid=7, partition=0, first=100, lso=100, hw=160):
    return HeldPartition(topic="orders", partition=partition, producer_id=pid, producer_epoch=0, first_offset=first,
                         last_stable_offset=lso, high_watermark=hw)


def answer(txns=(), helds=(), ok=True, unlisted=()):
    return OpenTransactions(ok=ok, interval_ms=30_000, transactions=list(txns), transactions_count=len(txns),
                            held_partitions=list(helds), held_partitions_count=len(helds),
                            unlisted_brokers=list(unlisted), error=None if ok else "timed out",
                            error_kind=None if ok else "no_answer")


T0 = 1_700_000_000_000  # the parser's gate refuses times far from the record's


def parsed(payload, t=0):
    e = Event.of(payload, cluster="k", source="p", seq=0, observed_at=T0 + t)
    return parse_values(pa.array([e.to_json().decode()]), timestamps=pa.array([T0 + t], pa.int64())).to_pylist()[0]


CFG = rt.TransactionRulesConfig(hanging_after_ms=5 * MIN, timeout_grace_ms=30_000, unknown_after_ms=6 * MIN)


def run(steps, cfg=CFG):
    s = rt.new_transactions("k")
    out = []
    for t, a in steps:
        row = parsed(a, t)
        assert row["reason"] is None and row["entity"] == "transactions|k" and row["bucket_key"] == "k", row
        out += [(x.at, x.alert.value, x.action, x.labels, x.evidence) for x in rt.on_transactions(s, row, t, row["entity"], cfg)]
    return out, s


def test_a_transaction_open_past_the_setting_hangs_naming_producer_partitions_and_what_it_holds_back():
    out, s = run([(0, answer([txn(age=4 * MIN)], [held()])), (MIN, answer([txn(age=5 * MIN)], [held()])),
                  (2 * MIN, answer([txn(age=6 * MIN)], [held()])), (3 * MIN, answer())])
    assert [(t, a, act) for t, a, act, _, _ in out] == [(MIN, "HangingTransaction", "open"),
                                                        (3 * MIN, "HangingTransaction", "resolve")]
    labels, ev = out[0][3], out[0][4]
    assert labels == {"cluster": "k"}
    (h,) = ev["transactions"]
    assert (h["transactional_id"], h["producer_id"], h["tripped"], h["age_ms"], h["partitions"]) == (
        "tx-a", 7, "age", 5 * MIN, ["orders-0"])
    assert h["held"] == [{"partition": "orders-0", "first_offset": 100, "last_stable_offset": 100,
                          "high_watermark": 160, "held_back": 60}]
    assert json.loads(s["report"]) == {"open": 0, "hanging": 0, "oldest_age_ms": 0, "held_partitions": 0,
                                       "unlisted_brokers": []}


def test_one_past_its_own_timeout_hangs_before_the_setting_and_a_young_one_does_not():
    out, _ = run([(0, answer([txn(age=50_000, timeout=60_000)])), (10_000, answer([txn(age=60_000, timeout=60_000)])),
                  (40_000, answer([txn(age=90_000, timeout=60_000), txn("tx-b", 8, age=1000)]))])
    assert [(t, a, act) for t, a, act, _, _ in out] == [(40_000, "HangingTransaction", "open")]
    assert [(h["transactional_id"], h["tripped"]) for h in out[0][4]["transactions"]] == [("tx-a", "timeout")]


def test_a_producer_holding_a_partition_no_coordinator_lists_hangs_after_its_setting_if_the_answer_is_whole():
    orphan = held(pid=99, first=40, lso=40, hw=500)
    steps = [(0, answer([txn(age=0)], [held(), orphan])), (4 * MIN, answer([txn(age=MIN)], [held(), orphan])),
             (5 * MIN, answer([txn(age=MIN)], [held(), orphan], unlisted=[3])),  # not whole: not judged
             (5 * MIN + 59_999, answer([txn(age=MIN)], [held(), orphan])),  # before unknown_after_ms
             (6 * MIN, answer([txn(age=MIN)], [held(), orphan]))]
    out, s = run(steps)
    assert [(t, a, act) for t, a, act, _, _ in out] == [(6 * MIN, "HangingTransaction", "open")]
    (h,) = out[0][4]["transactions"]
    assert (h["transactional_id"], h["producer_id"], h["tripped"], h["partitions"]) == (
        None, 99, "unknown_to_coordinator", ["orders-0"])
    assert h["held"][0]["held_back"] == 460 and h["age_ms"] == 6 * MIN  # first seen at 0, kept over the gap


def test_a_new_hanging_transaction_reopens_the_alert_and_one_that_ends_leaves_it_open():
    a, b = txn(age=6 * MIN), txn("tx-b", 8, age=6 * MIN)
    out, _ = run([(0, answer([a])), (MIN, answer([txn(age=7 * MIN), b])), (2 * MIN, answer([b])),
                  (3 * MIN, answer([b]))])
    assert [(t, a_, act) for t, a_, act, _, _ in out] == [
        (0, "HangingTransaction", "open"), (MIN, "HangingTransaction", "resolve"), (MIN, "HangingTransaction", "open")]
    assert [h["transactional_id"] for h in out[2][4]["transactions"]] == ["tx-a", "tx-b"]


def test_a_failed_or_older_answer_changes_nothing():
    out, s = run([(MIN, answer([txn(age=6 * MIN)])), (2 * MIN, answer(ok=False)), (30_000, answer())])
    assert [(a, act) for _, a, act, _, _ in out] == [("HangingTransaction", "open")] and s["open"]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="hanging_after_ms: must be > 0"):
        rt.TransactionRulesConfig(hanging_after_ms=0)
    with pytest.raises(ValueError, match="unknown_after_ms: must be > 0"):
        rt.TransactionRulesConfig(unknown_after_ms=0)
    with pytest.raises(ValueError, match="timeout_grace_ms: must be >= 0"):
        rt.TransactionRulesConfig(timeout_grace_ms=-1)


def test_the_exporter_serves_the_clusters_transactions():
    from streaming.sinks.exporter import Exporter

    _, s = run([(0, answer([txn(age=6 * MIN), txn("tx-b", 8, age=MIN, parts=("orders-1",))],
                           [held(), held(8, partition=1)]))])
    exp = Exporter()
    exp.apply([{"kind": "transactions", "action": "upsert", "cluster": "k", "report": s["report"]}])
    text = exp.render().decode()
    for line in ('kafka_monitor_transactions_open{cluster="k"} 2.0', 'kafka_monitor_transactions_hanging{cluster="k"} 1.0',
                 'kafka_monitor_transaction_oldest_age_seconds{cluster="k"} 360.0',
                 'kafka_monitor_transaction_held_partitions{cluster="k"} 2.0'):
        assert line in text, text
    exp.apply([{"kind": "transactions", "action": "remove", "cluster": "k", "report": None}])
    assert "kafka_monitor_transactions_open{" not in exp.render().decode()


# -- the lag rule: a read_committed group held at the LSO ---------------------------------------


def group_obs(committed, hw, lso, tid=None, pid=None):
    return {"committed_offset": committed, "high_watermark": hw, "last_stable_offset": lso,
            "held_by_transaction": tid, "held_by_producer": pid}


def lag_run(points):
    cfg = LagConfig(lag_high_offsets=50, lag_high_seconds=None, lag_high_for_ms=0)
    s = lag.new_group_partition("k", "g", "orders", 0)
    out = []
    for t, obs in points:
        out += lag.on_group_offsets(s, obs, t, "group_partition|k/g/orders/0", cfg)
    return out


def test_a_commit_held_at_the_lso_blames_the_transaction_and_a_read_uncommitted_one_does_not():
    held_points = [(i * 1000, group_obs(100, 100 + 40 * i, 100, "tx-a", 7)) for i in range(1, 5)]
    (opened,) = [x for x in lag_run(held_points) if x.alert.value == "ConsumerLagHigh"]
    assert opened.evidence["cause"] == "open_transaction" and opened.evidence["read_committed"] == "inferred"
    assert opened.evidence["transaction"] == {"transactional_id": "tx-a", "producer_id": 7}
    assert opened.evidence["last_stable_offset"] == 100
    # the same lag with the commit short of the LSO (or the LSO unknown): the consumer's own
    behind = [(i * 1000, group_obs(100, 100 + 40 * i, 100 + 40 * i)) for i in range(1, 5)]
    (own,) = [x for x in lag_run(behind) if x.alert.value == "ConsumerLagHigh"]
    assert "cause" not in own.evidence
    # one observation at the LSO is not enough to infer read_committed
    once = [(1000, group_obs(100, 120, 120)), (2000, group_obs(100, 200, 100, "tx-a", 7))]
    assert [x for x in lag_run(once) if "cause" in x.evidence] == []


def test_the_probe_names_the_transaction_holding_a_group_at_the_lso_and_sends_the_held_partitions_offsets():
    from types import SimpleNamespace

    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import ListOffsetsResultInfo

    from monitor.probe import Probe
    from monitor.probe_config import ProbeConfig
    from tests.support.probe_fakes import FakeAdmin, FakeEmitter, done, tp

    class LsoAdmin(FakeAdmin):
        """ListOffsets with read_committed isolation answers the LSO: 100 on orders-0, else the HW."""

        def list_offsets(self, req, request_timeout=None, isolation_level=None):
            out = {}
            for k, spec in req.items():
                key = (k.topic, k.partition)
                offset = (0 if type(spec).__name__ == "EarliestSpec" else
                          100 if isolation_level == IsolationLevel.READ_COMMITTED and key == ("orders", 0) else
                          self.hw[key])
                out[k] = done(ListOffsetsResultInfo(offset, -1, -1))
            return out

    admin = LsoAdmin({"orders": 2}, {"rc": [tp("orders", 0, 100), tp("orders", 1, 160)], "ru": [tp("orders", 0, 150)]},
                     {("orders", 0): 160, ("orders", 1): 160})
    emitter = FakeEmitter()
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1, groups_include="^r[cu]$"),
                  emitter=emitter, admin=admin)
    holders = {("orders", 0, 100): ("tx-a", 7)}
    answer_ = answer([txn()], [held(lso=None, hw=None)])
    probe.transactions = SimpleNamespace(holder=lambda t, p, o: holders.get((t, p, o)),
                                         take=lambda: (5, answer_))
    probe.cycle()
    got = {(g.group, g.partition): (g.committed_offset, g.last_stable_offset, g.held_by_transaction,
                                    g.held_by_producer) for g in emitter.of(GroupOffsets)}
    assert got == {("rc", 0): (100, 100, "tx-a", 7),        # at the LSO, records past it: held
                   ("rc", 1): (160, 160, None, None),       # caught up: nothing held
                   ("ru", 0): (150, 100, None, None)}       # past the LSO: read_uncommitted
    (sent,) = emitter.of(OpenTransactions)
    assert [(h.partition, h.last_stable_offset, h.high_watermark) for h in sent.held_partitions] == [(0, 100, 160)]


def test_the_held_partitions_get_the_probes_offsets_and_the_event_stays_bounded():
    ev = answer([txn()], [held(lso=None, hw=None), held(partition=9, lso=None, hw=None)])
    out = with_offsets(ev, {("orders", 0): (0, 160, 100)})
    assert [(h.partition, h.last_stable_offset, h.high_watermark) for h in out.held_partitions] == [
        (0, 100, 160), (9, None, None)]
    many = answer([], [held(partition=i, lso=None, hw=None) for i in range(1000)])
    big = with_offsets(many, {("orders", i): (0, 10 ** 12, 10 ** 12) for i in range(1000)})
    assert len(Event.of(big, cluster="k", source="p", seq=0, observed_at=0).to_json()) < 60_000 + 300
    assert big.held_partitions_count == 1000 and len(big.held_partitions) < 1000


def test_group_offsets_carry_the_holder_through_the_parser():
    row = parsed(GroupOffsets(group="g", topic="orders", partition=0, committed_offset=100, high_watermark=160,
                              last_stable_offset=100, held_by_transaction="tx-a", held_by_producer=7))
    assert row["reason"] is None and (row["held_by_transaction"], row["held_by_producer"]) == ("tx-a", 7)
