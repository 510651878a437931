"""monitor.instrument without a broker: a fake emitter, canned statistics JSON, fake consumers.

What the application sees must not change (its callbacks run first with the identical arguments,
its exceptions propagate unchanged); what the monitor sees follows the contract (sentinels are
None, partition -1 is skipped, Metadata counters are diffed per broker); nothing inside the
instrumentation ever raises into the application."""

from __future__ import annotations

import ctypes
import glob
import json
import logging
import os
import struct
import time
from typing import Any, Optional

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_monitor.local.broker import free_port
from monitor.contract import ClientFetch, MetadataRefresh, Rebalance
from monitor.instrument import InstrumentedConsumer, instrument, instrumentation_of
from monitor.instrumentation import (CLUSTER_ID_WAIT_S, DEFAULT_STATISTICS_INTERVAL_MS, GROUP_FAILURE_CODES,
                                     Instrumentation)
from monitor.rdkafka_stats import (MetadataRequestTracker, client_fetches, client_produces, generation_of,
                                   stats_observed_at)
from tests.support.probe_fakes import InstrumentFakeEmitter

# ---------------------------------------------------------------------------------------------
# Fakes and canned statistics
# ---------------------------------------------------------------------------------------------


class Clocks:
    """Wall clock and monotonic clock under the test's control."""

    def __init__(self, wall: float = 1_700_000_000.0, mono: float = 5_000.0):
        self.wall = wall
        self.mono = mono

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def part(n: int, *, desired: bool = True, **fields: Any) -> dict[str, Any]:
    """One partition as librdkafka 2.16's statistics show it (a consumer that read and committed 5)."""
    p = {"partition": n, "broker": 1, "leader": 1, "desired": desired, "unknown": False,
         "fetch_state": "active", "query_offset": -2, "next_offset": 9, "app_offset": 5, "stored_offset": 5,
         "stored_leader_epoch": 0, "commited_offset": 5, "committed_offset": 5, "committed_leader_epoch": 0,
         "eof_offset": 5, "lo_offset": 0, "hi_offset": 12, "ls_offset": 11, "consumer_lag": 7,
         "consumer_lag_stored": 7, "leader_epoch": 3, "msgs": 5}
    p.update(fields)
    return p


UA = part(-1, desired=False, leader=-1, fetch_state="none", app_offset=-1001, committed_offset=-1001,
          hi_offset=-1001, ls_offset=-1001, lo_offset=-1001, consumer_lag=-1, leader_epoch=-1)


def broker(nodeid: int, metadata: int, *, name: Optional[str] = None, nodename: str = "127.0.0.1:9092",
           source: str = "learned", disconnects: int = 0) -> tuple[str, dict[str, Any]]:
    name = name or f"{nodename}/{nodeid}"
    return name, {"name": name, "nodeid": nodeid, "nodename": nodename, "source": source, "state": "UP",
                  "disconnects": disconnects, "req_timeouts": 0, "txerrs": 0, "rxerrs": 0,
                  "req": {"Metadata": metadata, "Fetch": 10, "Heartbeat": 3}}


def stats(*, kind: str = "consumer", topics: Optional[dict[str, list[dict]]] = None,
          brokers: Optional[list[tuple[str, dict]]] = None, ts: Optional[int] = None,
          metadata_age: int = 100) -> dict[str, Any]:
    topics = {"orders": [part(0), part(1), UA]} if topics is None else topics
    return {
        "name": f"rdkafka#{kind}-1", "client_id": "rdkafka", "type": kind, "ts": ts if ts is not None else 1,
        "time": 1_700_000_000, "metadata_cache_cnt": len(topics),
        "brokers": dict(brokers if brokers is not None else [broker(1, 1)]),
        "topics": {t: {"topic": t, "metadata_age": metadata_age,
                       "partitions": {str(p["partition"]): p for p in ps}} for t, ps in topics.items()},
    }


def raw(s: dict[str, Any]) -> str:
    return json.dumps(s)


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def make(emitter: Any, clocks: Clocks, **kw: Any) -> Instrumentation:
    kw.setdefault("group", "app")
    return Instrumentation(events=emitter, clock=clocks.time, monotonic=clocks.monotonic, **kw)


def at_now(clocks: Clocks) -> int:
    """A statistics ``ts`` meaning 'built just now' for the fake monotonic clock."""
    return int(clocks.mono * 1_000_000)


# ---------------------------------------------------------------------------------------------
# The config the application gets back
# ---------------------------------------------------------------------------------------------


def test_reading_the_contract_does_not_load_the_client_wrapper():
    """The job imports monitor.contract (and streaming.ingest.schema from it): that must not pull in
    monitor.instrument (or its modules), the wrapper the applications use."""
    import subprocess
    import sys

    code = ("import sys, monitor.contract, streaming.ingest.schema; "
            "print(sorted(m for m in sys.modules if m.startswith('monitor')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "monitor.instrument" not in out and "monitor.contract" in out, out


def test_instrument_returns_a_new_config_and_leaves_the_apps_untouched():
    def app_stats(s: str) -> None: ...
    def app_error(e: Any) -> None: ...

    conf = {"bootstrap.servers": "b:9092", "group.id": "app", "stats_cb": app_stats, "error_cb": app_error,
            "statistics.interval.ms": 1000}
    before = dict(conf)
    out = instrument(conf, events=InstrumentFakeEmitter())
    assert conf == before and out is not conf
    assert out["stats_cb"] is not app_stats and callable(out["stats_cb"])
    assert out["error_cb"] is not app_error and callable(out["error_cb"])
    assert {k: v for k, v in out.items() if not k.endswith("_cb")} == {k: v for k, v in conf.items()
                                                                       if not k.endswith("_cb")}
    inst = instrumentation_of(out)
    assert inst is not None and inst.group == "app" and instrumentation_of(conf) is None


@pytest.mark.parametrize("given, expected", [(None, DEFAULT_STATISTICS_INTERVAL_MS), (1000, 1000), ("250", "250"),
                                             (0, 0)])
def test_statistics_interval_is_set_only_when_the_app_set_none(given, expected):
    conf = {"group.id": "g"} if given is None else {"group.id": "g", "statistics.interval.ms": given}
    assert instrument(conf, events=InstrumentFakeEmitter())["statistics.interval.ms"] == expected


def test_instrumenting_twice_is_refused():
    once = instrument({"group.id": "g"}, events=InstrumentFakeEmitter())
    with pytest.raises(ValueError, match="already instrumented"):
        instrument(once, events=InstrumentFakeEmitter())


def test_source_cannot_override_an_emitters_own_source():
    with pytest.raises(ValueError, match="source"):
        instrument({}, events=InstrumentFakeEmitter(source="a"), source="b")
    with pytest.raises(TypeError):
        instrument({}, events=object())  # type: ignore[arg-type]


def test_a_non_callable_app_callback_is_left_for_the_client_to_reject():
    out = instrument({"group.id": "g", "stats_cb": 42}, events=InstrumentFakeEmitter())
    assert out["stats_cb"] == 42
    with pytest.raises(TypeError):
        Consumer(out)


# ---------------------------------------------------------------------------------------------
# stats_cb / error_cb chaining
# ---------------------------------------------------------------------------------------------


def test_app_stats_cb_runs_first_with_the_identical_string(clocks):
    calls: list[Any] = []
    em = InstrumentFakeEmitter()
    real_emit = em.emit
    em.emit = lambda *a, **kw: (calls.append("emit"), real_emit(*a, **kw))  # type: ignore[method-assign]
    inst = make(em, clocks)
    conf = inst.wrap({"group.id": "app", "statistics.interval.ms": 1000, "stats_cb": lambda s: calls.append(s)})
    payload = raw(stats(ts=at_now(clocks)))
    conf["stats_cb"](payload)
    assert calls[0] is payload and calls[1:] and set(calls[1:]) == {"emit"}


def test_app_stats_cb_is_not_called_when_the_app_had_not_enabled_statistics(clocks):
    """Without instrumentation librdkafka would never call it: calling it now would change the app."""
    seen: list[str] = []
    em = InstrumentFakeEmitter()
    conf = make(em, clocks).wrap({"group.id": "app", "stats_cb": seen.append})
    assert conf["statistics.interval.ms"] == DEFAULT_STATISTICS_INTERVAL_MS
    conf["stats_cb"](raw(stats(ts=at_now(clocks))))
    assert seen == [] and em.of(ClientFetch)


def test_app_callback_exceptions_propagate_unchanged_and_events_still_flow(clocks):
    boom = RuntimeError("app's own bug")

    def app_stats(s: str) -> None:
        raise boom

    def app_error(e: Any) -> None:
        raise boom

    em = InstrumentFakeEmitter()
    inst = make(em, clocks)
    conf = inst.wrap({"group.id": "app", "statistics.interval.ms": 1000, "stats_cb": app_stats,
                      "error_cb": app_error})
    with pytest.raises(RuntimeError) as info:
        conf["stats_cb"](raw(stats(ts=at_now(clocks))))
    assert info.value is boom
    with pytest.raises(RuntimeError) as info:
        conf["error_cb"](KafkaError(KafkaError.UNKNOWN_MEMBER_ID))
    assert info.value is boom
    assert len(em.of(ClientFetch)) == 2 and [r.phase for r in em.of(Rebalance)] == ["failed"]
    assert inst.instrumentation_errors == 0


def test_app_error_cb_gets_the_identical_error_and_group_errors_become_failed(clocks):
    got: list[Any] = []
    em = InstrumentFakeEmitter()
    conf = make(em, clocks, client_id="billing").wrap({"group.id": "app", "error_cb": got.append})
    transport = KafkaError(KafkaError._TRANSPORT)
    fenced = KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced by a newer instance")
    conf["error_cb"](transport)
    conf["error_cb"](fenced)
    assert got[0] is transport and got[1] is fenced
    (failed,) = em.of(Rebalance)  # the transport error is not a group failure
    assert failed.phase == "failed" and failed.group == "app" and failed.client_id == "billing"
    assert failed.reason.startswith("FENCED_INSTANCE_ID") and "newer instance" in failed.reason
    assert KafkaError.UNKNOWN_MEMBER_ID in GROUP_FAILURE_CODES
    assert KafkaError.REBALANCE_IN_PROGRESS not in GROUP_FAILURE_CODES  # routine, not a failure


# ---------------------------------------------------------------------------------------------
# Never breaking the application
# ---------------------------------------------------------------------------------------------


def test_an_emitter_failure_never_reaches_the_app_and_is_counted_and_logged_once(clocks, caplog):
    em = InstrumentFakeEmitter(fail=RuntimeError("events producer exploded"))
    inst = make(em, clocks)
    conf = inst.wrap({"group.id": "app"})
    with caplog.at_level(logging.WARNING, logger="monitor.instrument"):
        for _ in range(3):
            conf["stats_cb"](raw(stats(ts=at_now(clocks))))  # 2 client_fetch + 1 refresh, each fails
    assert inst.instrumentation_errors == 2 * 3 + 1
    assert inst.errors_by_kind == {"emit:RuntimeError": 7}
    assert len([r for r in caplog.records if "emit" in r.getMessage()]) == 1


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", "", "null"])
def test_bad_statistics_json_is_counted_not_raised(clocks, bad):
    seen: list[str] = []
    em = InstrumentFakeEmitter()
    inst = make(em, clocks)
    conf = inst.wrap({"group.id": "app", "statistics.interval.ms": 100, "stats_cb": seen.append})
    conf["stats_cb"](bad)
    assert seen == [bad] and em.events == [] and inst.instrumentation_errors == 1


def test_odd_fields_in_statistics_do_not_break_the_rest(clocks):
    s = stats(ts=at_now(clocks), topics={"orders": [part(0, hi_offset="12", leader=None, fetch_state=7), part(1)]})
    s["brokers"]["weird"] = "not an object"
    em = InstrumentFakeEmitter()
    inst = make(em, clocks)
    inst.wrap({"group.id": "app"})["stats_cb"](raw(s))
    p0, p1 = sorted(em.of(ClientFetch), key=lambda f: f.partition)
    assert (p0.high_watermark, p0.leader, p0.fetch_state) == (None, None, None)
    assert p1.high_watermark == 12 and inst.instrumentation_errors == 0


# ---------------------------------------------------------------------------------------------
# client_fetch from statistics
# ---------------------------------------------------------------------------------------------


def test_one_client_fetch_per_assigned_partition_with_sentinels_as_none():
    s = stats(topics={
        "orders": [part(0),
                   part(1, committed_offset=-1001, app_offset=-1001, consumer_lag=-1, ls_offset=-1,
                        leader=-1, fetch_state="offset-query"),
                   part(2, desired=False, fetch_state="none"),  # known, not assigned
                   UA],
        "audit": [part(0, leader_epoch=-1)],
    })
    fetches = {(f.topic, f.partition): f for f in client_fetches(s, "app")}
    assert set(fetches) == {("orders", 0), ("orders", 1), ("audit", 0)}
    assert fetches["orders", 0] == ClientFetch(
        group="app", topic="orders", partition=0, fetch_state="active", position=5, committed=5,
        high_watermark=12, last_stable_offset=11, log_start_offset=0, consumer_lag=7, leader=1, leader_epoch=3)
    o1 = fetches["orders", 1]
    assert (o1.position, o1.committed, o1.consumer_lag, o1.last_stable_offset, o1.leader) == (None,) * 5
    assert o1.fetch_state == "offset-query" and o1.high_watermark == 12
    assert fetches["audit", 0].leader_epoch is None


def test_position_is_the_app_offset_not_the_prefetch_position():
    (f,) = client_fetches(stats(topics={"t": [part(0, next_offset=500, app_offset=120)]}), "app")
    assert f.position == 120


def test_a_missing_leader_epoch_field_is_none():
    p = part(0)
    del p["leader_epoch"]
    (f,) = client_fetches(stats(topics={"t": [p]}), "app")
    assert f.leader_epoch is None and f.committed == 5


def test_producers_and_group_less_consumers_give_no_client_fetch():
    assert client_fetches(stats(kind="producer"), "app") == []
    assert client_fetches(stats(), None) == []


def test_observed_at_is_when_librdkafka_built_the_statistics():
    now_ms, mono_us = 1_700_000_000_000, 9_000_000_000
    assert stats_observed_at({"ts": mono_us - 2_500_000}, now_ms, mono_us) == now_ms - 2_500
    assert stats_observed_at({"ts": mono_us + 5}, now_ms, mono_us) == now_ms  # from the future
    assert stats_observed_at({"ts": 1}, now_ms, mono_us) == now_ms  # implausibly old
    assert stats_observed_at({}, now_ms, mono_us) == now_ms


def test_events_carry_the_statistics_time(clocks):
    em = InstrumentFakeEmitter()
    make(em, clocks).wrap({"group.id": "app"})["stats_cb"](raw(stats(ts=at_now(clocks) - 3_000_000)))
    assert {at for _, at, _ in em.events} == {int(clocks.wall * 1000) - 3_000}


# ---------------------------------------------------------------------------------------------
# metadata_refresh from the Metadata request counters
# ---------------------------------------------------------------------------------------------


def test_metadata_refresh_only_when_the_counter_grew():
    t = MetadataRequestTracker()
    first = t.observe(stats(brokers=[broker(1, 2)]))
    assert first is not None and first.reason == "bootstrap" and first.version == 2 and first.ok
    assert t.observe(stats(brokers=[broker(1, 2)])) is None
    again = t.observe(stats(brokers=[broker(1, 3)]))
    assert again.reason == "periodic" and again.version == 3  # version = cumulative request count
    assert again.cause.startswith("1 Metadata request(s)")
    assert again.node_id == 1 and [(b.node_id, b.host, b.port) for b in again.brokers] == [(1, "127.0.0.1", 9092)]
    assert (again.topic_count, again.partition_count, again.duration_ms) == (1, 2, None)


def test_no_requests_yet_means_no_event_and_the_first_growth_is_the_bootstrap():
    t = MetadataRequestTracker()
    down = [broker(-1, 0, name="b:9092/bootstrap", nodename="b:9092", source="configured")]
    assert t.observe(stats(brokers=down, topics={})) is None
    assert t.observe(stats(brokers=down, topics={})) is None
    up = t.observe(stats(brokers=[broker(-1, 1, name="b:9092/bootstrap", nodename="b:9092", source="configured")]))
    assert up.reason == "bootstrap" and up.version == 1


def test_brokers_leaving_the_statistics_do_not_make_phantom_refreshes():
    """librdkafka drops the bootstrap broker once it knows the real ones; the sum shrinks."""
    t = MetadataRequestTracker()
    boot = broker(-1, 1, name="h:1/bootstrap", nodename="h:1", source="configured")
    assert t.observe(stats(brokers=[boot])).version == 1
    learned = [broker(7, 1, nodename="h:1"), broker(-1, 0, name="GroupCoordinator", nodename="h:1", source="logical")]
    r = t.observe(stats(brokers=learned))  # bootstrap gone (sum 1 -> 1), the learned broker's one is new
    assert r.version == 2 and r.node_id == 7
    assert t.observe(stats(brokers=learned)) is None
    back = t.observe(stats(brokers=[boot, *learned]))  # reappears with the same count: nothing new
    assert back is None


def test_a_counter_that_went_down_is_a_new_broker_object():
    t = MetadataRequestTracker()
    t.observe(stats(brokers=[broker(1, 5)]))
    r = t.observe(stats(brokers=[broker(1, 2)]))
    assert r.version == 7


def test_logical_brokers_are_mapped_to_their_node_and_two_nodes_give_none():
    t = MetadataRequestTracker()
    t.observe(stats(brokers=[broker(1, 1), broker(-1, 0, name="GroupCoordinator", source="logical")]))
    r = t.observe(stats(brokers=[broker(1, 1), broker(-1, 1, name="GroupCoordinator", source="logical")]))
    assert r.node_id == 1 and [b.node_id for b in r.brokers] == [1]
    r = t.observe(stats(brokers=[broker(1, 2), broker(2, 1, nodename="h2:9092"),
                                 broker(-1, 1, name="GroupCoordinator", source="logical")]))
    assert r.node_id is None and r.version == 4


def test_a_new_topic_in_the_same_interval_is_the_reason_and_errors_are_evidence():
    t = MetadataRequestTracker()
    t.observe(stats(brokers=[broker(1, 1)]))
    r = t.observe(stats(brokers=[broker(1, 2, disconnects=1)],
                        topics={"orders": [part(0), part(1)], "payments": [part(0)]}))
    assert r.reason == "new_topic" and "payments" in r.cause and "1 disconnect" in r.cause


def test_partition_count_changes_and_leaderless_partitions():
    t = MetadataRequestTracker()
    t.observe(stats(brokers=[broker(1, 1)], ts=10_000_000, metadata_age=500))  # orders updated at 9_500 ms
    r = t.observe(stats(brokers=[broker(1, 2)], ts=40_000_000, metadata_age=200,
                        topics={"orders": [part(0), part(1), part(2, leader=-1), UA]}))
    (change,) = r.partition_count_changes
    assert (change.topic, change.old_count, change.new_count) == ("orders", 2, 3)
    assert change.unseen_for_at_most_ms == 39_800 - 9_500
    assert r.leaderless_partitions == 1 and r.partition_count == 3


def test_refreshes_through_vanished_bootstrap_brokers_are_seen_in_topic_update_times():
    """A producer's first refreshes go through the bootstrap broker, which librdkafka then drops
    from statistics: the learned broker's counter stays 0, the topic's metadata_age tells."""
    t = MetadataRequestTracker()
    quiet = [broker(111, 0)]
    assert t.observe(stats(brokers=quiet, topics={}, ts=2_140_568_000)) is None
    first = t.observe(stats(brokers=quiet, ts=2_141_169_000, metadata_age=900))  # updated at 2_140_269
    assert first.reason == "bootstrap" and first.version == 1 and "orders" in first.cause
    assert t.observe(stats(brokers=quiet, ts=2_141_469_000, metadata_age=1_200)) is None  # same update
    assert t.observe(stats(brokers=quiet, ts=2_141_769_000, metadata_age=1_480)) is None  # 20 ms jitter
    again = t.observe(stats(brokers=[broker(111, 1)], ts=2_142_370_000, metadata_age=101))
    assert again.reason == "periodic" and again.version == 2  # counter +1 and one update: one refresh


def test_a_topic_showing_up_with_an_update_already_reported_is_no_refresh():
    t = MetadataRequestTracker()
    t.observe(stats(ts=5_000_000, metadata_age=100, topics={"orders": [part(0)]}))  # updated at 4_900
    same = t.observe(stats(ts=6_000_000, metadata_age=1_100, topics={"orders": [part(0)], "audit": [part(0)]}))
    assert same is None
    fresh = t.observe(stats(ts=7_000_000, metadata_age=10, topics={"orders": [part(0)], "audit": [part(0)],
                                                                      "payments": [part(0)]}))
    assert fresh.reason == "new_topic" and "payments" in fresh.cause


def test_metadata_never_fetched_is_no_update():
    t = MetadataRequestTracker()
    # librdkafka reports the age of never-fetched metadata as the whole clock
    assert t.observe(stats(brokers=[broker(1, 0)], ts=9_000_000, metadata_age=9_000)) is None


def test_producer_statistics_give_metadata_refresh_but_no_client_fetch(clocks):
    em = InstrumentFakeEmitter()
    cb = make(em, clocks, group=None).wrap({"bootstrap.servers": "b:1"})["stats_cb"]
    cb(raw(stats(kind="producer", ts=at_now(clocks), brokers=[broker(1, 1)])))
    cb(raw(stats(kind="producer", ts=at_now(clocks), brokers=[broker(1, 1)])))
    assert [type(p) for p, _, _ in em.events] == [MetadataRefresh]


# ---------------------------------------------------------------------------------------------
# Rebalance callbacks
# ---------------------------------------------------------------------------------------------


def cgmd(generation: int, group: str = "app", member: str = "m-1") -> bytes:
    """The serialised group metadata as librdkafka writes it (checked against the real library below)."""
    return b"CGMDv2:" + struct.pack("=i", generation) + group.encode() + b"\0" + member.encode() + b"\0\x01"


class FakeGroupConsumer:
    def __init__(self, member: str = "m-1", generation: int = 4, cluster: Optional[str] = "kc-1"):
        self.member = member
        self.generation = generation
        self.cluster = cluster

    def memberid(self) -> str:
        return self.member

    def consumer_group_metadata(self) -> bytes:
        return cgmd(self.generation, member=self.member)

    def cluster_id(self, timeout: float = -1) -> str:
        if self.cluster is None:
            raise RuntimeError("cluster id not known yet")
        return self.cluster


def tps(*ns: int, topic: str = "orders") -> list[TopicPartition]:
    return [TopicPartition(topic, n) for n in ns]


def test_app_rebalance_callbacks_get_the_identical_arguments_and_phases_are_emitted(clocks):
    calls: list[tuple[str, Any, Any]] = []
    em = InstrumentFakeEmitter()
    inst = make(em, clocks, client_id="billing")
    cbs = inst.rebalance_callbacks(on_assign=lambda c, p: calls.append(("assign", c, p)),
                                   on_revoke=lambda c, p: calls.append(("revoke", c, p)))
    consumer = FakeGroupConsumer()
    inst.join_started()
    clocks.advance(1.25)
    first = tps(0, 1)
    cbs["on_assign"](consumer, first)
    clocks.advance(30)
    revoked = tps(1)
    cbs["on_revoke"](consumer, revoked)
    clocks.advance(0.5)
    consumer.generation = 5
    second = tps(0)
    cbs["on_assign"](consumer, second)

    assert [(k, c is consumer, p is expected) for (k, c, p), expected in zip(calls, (first, revoked, second))] == [
        ("assign", True, True), ("revoke", True, True), ("assign", True, True)]
    phases = [(r.phase, r.partitions, r.generation, r.duration_ms) for r in em.of(Rebalance)]
    assert phases == [("join_started", [], None, None), ("assigned", ["orders/0", "orders/1"], 4, 1250.0),
                      ("revoked", ["orders/1"], 4, 0.0), ("assigned", ["orders/0"], 5, 500.0)]
    assert {(r.group, r.client_id) for r in em.of(Rebalance)} == {("app", "billing")}
    assert {r.member_id for r in em.of(Rebalance)[1:]} == {"m-1"}
    assert {c for _, _, c in em.events} == {None}  # an app-supplied emitter keeps its own cluster


def test_revoked_duration_is_the_time_the_apps_callback_took(clocks):
    em = InstrumentFakeEmitter()
    inst = make(em, clocks)
    cbs = inst.rebalance_callbacks(on_revoke=lambda c, p: clocks.advance(0.8))
    cbs["on_revoke"](FakeGroupConsumer(), tps(0))
    assert em.of(Rebalance)[0].duration_ms == pytest.approx(800.0)


def test_lost_goes_to_on_revoke_without_on_lost_like_the_binding(clocks):
    calls: list[str] = []
    em = InstrumentFakeEmitter()
    inst = make(em, clocks)
    cbs = inst.rebalance_callbacks(on_revoke=lambda c, p: calls.append("revoke"))
    inst.observe_consumer_error(KafkaError(KafkaError._MAX_POLL_EXCEEDED, "max.poll.interval.ms exceeded"))
    cbs["on_lost"](FakeGroupConsumer(), tps(0))
    assert calls == ["revoke"]
    failed, lost = em.of(Rebalance)
    assert failed.phase == "failed" and failed.reason.startswith("_MAX_POLL_EXCEEDED")
    assert lost.phase == "lost" and lost.reason == "_MAX_POLL_EXCEEDED" and lost.partitions == ["orders/0"]

    calls.clear()
    cbs = inst.rebalance_callbacks(on_revoke=lambda c, p: calls.append("revoke"),
                                   on_lost=lambda c, p: calls.append("lost"))
    cbs["on_lost"](FakeGroupConsumer(), tps(0))
    assert calls == ["lost"]


def test_no_app_callbacks_still_gives_events(clocks):
    em = InstrumentFakeEmitter()
    cbs = make(em, clocks).rebalance_callbacks()
    cbs["on_assign"](FakeGroupConsumer(), tps(0))
    cbs["on_revoke"](FakeGroupConsumer(), tps(0))
    assert [r.phase for r in em.of(Rebalance)] == ["assigned", "revoked"]
    assert em.of(Rebalance)[0].duration_ms is None  # no start seen


def test_an_exception_in_an_app_rebalance_callback_propagates_unchanged(clocks):
    boom = KeyError("app state")

    def on_assign(c: Any, p: Any) -> None:
        raise boom

    em = InstrumentFakeEmitter()
    cbs = make(em, clocks).rebalance_callbacks(on_assign=on_assign)
    with pytest.raises(KeyError) as info:
        cbs["on_assign"](FakeGroupConsumer(), tps(0))
    assert info.value is boom and [r.phase for r in em.of(Rebalance)] == ["assigned"]


def test_a_broken_consumer_handle_costs_member_and_generation_only(clocks):
    class Broken(FakeGroupConsumer):
        def memberid(self) -> str:
            raise RuntimeError("closed")

        def consumer_group_metadata(self) -> bytes:
            raise RuntimeError("closed")

    em = InstrumentFakeEmitter()
    inst = make(em, clocks)
    inst.rebalance_callbacks()["on_assign"](Broken(), tps(0))
    (r,) = em.of(Rebalance)
    assert (r.member_id, r.generation, r.partitions) == (None, None, ["orders/0"])
    assert inst.instrumentation_errors == 0


@pytest.mark.parametrize("bad", [None, 3])
def test_a_non_callable_rebalance_callback_raises_what_the_binding_raises(bad):
    c = Consumer({"group.id": "g", "bootstrap.servers": f"127.0.0.1:{free_port()}"})
    try:
        with pytest.raises(TypeError) as plain:
            c.subscribe(["t"], on_assign=bad)
    finally:
        c.close()
    with pytest.raises(TypeError) as ours:
        Instrumentation(events=InstrumentFakeEmitter()).rebalance_callbacks(on_assign=bad)
    assert str(ours.value) == str(plain.value)


# ---------------------------------------------------------------------------------------------
# Generation from consumer_group_metadata()
# ---------------------------------------------------------------------------------------------


def _librdkafka() -> Optional[ctypes.CDLL]:
    import confluent_kafka

    base = os.path.dirname(confluent_kafka.__file__)
    for path in glob.glob(os.path.join(base, "..", "confluent_kafka.libs", "librdkafka*.so*")):
        return ctypes.CDLL(path)
    return None


def test_the_generation_layout_matches_the_librdkafka_in_the_wheel():
    lib = _librdkafka()
    if lib is None:
        pytest.skip("no bundled librdkafka to check the layout against")
    lib.rd_kafka_consumer_group_metadata_new_with_genid.restype = ctypes.c_void_p
    lib.rd_kafka_consumer_group_metadata_new_with_genid.argtypes = [ctypes.c_char_p, ctypes.c_int32,
                                                                     ctypes.c_char_p, ctypes.c_char_p]
    lib.rd_kafka_consumer_group_metadata_write.restype = ctypes.c_void_p
    lib.rd_kafka_consumer_group_metadata_write.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                                           ctypes.POINTER(ctypes.c_size_t)]
    lib.rd_kafka_consumer_group_metadata_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mem_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    for instance in (None, b"static-1"):
        md = lib.rd_kafka_consumer_group_metadata_new_with_genid(b"app", 70_000, b"member-9", instance)
        buf, size = ctypes.c_void_p(), ctypes.c_size_t()
        try:
            assert lib.rd_kafka_consumer_group_metadata_write(md, ctypes.byref(buf), ctypes.byref(size)) is None
            blob = ctypes.string_at(buf, size.value)
            lib.rd_kafka_mem_free(None, buf)
        finally:
            lib.rd_kafka_consumer_group_metadata_destroy(md)
        assert generation_of(blob, "app") == 70_000
        assert generation_of(blob, "other-group") is None
    assert generation_of(cgmd(12)) == 12  # the fake used above is the same layout


@pytest.mark.parametrize("blob", [b"", b"CGMDv1:\0\0\0\0g\0", b"CGMDv2:\1\0", cgmd(-1), "CGMDv2:text", None])
def test_anything_but_a_valid_group_metadata_gives_no_generation(blob):
    assert generation_of(blob, "app") is None


# ---------------------------------------------------------------------------------------------
# Cluster id for the envelope
# ---------------------------------------------------------------------------------------------


def test_events_wait_for_the_cluster_id_then_carry_it(clocks, monkeypatch):
    em = InstrumentFakeEmitter()
    inst = make(em, clocks, resolve_cluster=True)  # the default for an emitter created from settings
    consumer = FakeGroupConsumer(cluster=None)
    inst.bind(consumer)
    inst.join_started()
    assert em.events == []  # waiting for the cluster id
    consumer.cluster = "kc-9"
    inst.tick()
    assert [(type(p).__name__, c) for p, _, c in em.events] == [("Rebalance", "kc-9")]


def test_events_stop_waiting_for_the_cluster_id_after_a_while(clocks):
    em = InstrumentFakeEmitter()
    inst = make(em, clocks, resolve_cluster=True)
    inst.bind(FakeGroupConsumer(cluster=None))
    inst.join_started()
    clocks.advance(CLUSTER_ID_WAIT_S + 1)
    inst.tick()
    assert [c for _, _, c in em.events] == [None]  # the emitter's own default cluster
    inst.join_started()  # and it does not start waiting again
    assert [c for _, _, c in em.events] == [None, None]
    inst._client.cluster = "kc-late"
    inst.join_started()
    assert [c for _, _, c in em.events] == [None, None, "kc-late"]


def test_without_a_client_nothing_waits_for_the_cluster_id(clocks):
    em = InstrumentFakeEmitter()
    inst = make(em, clocks, resolve_cluster=True)
    inst.join_started()
    assert [c for _, _, c in em.events] == [None]


def test_an_explicit_cluster_is_used_as_is(clocks):
    em = InstrumentFakeEmitter()
    inst = make(em, clocks, cluster="prod-eu")
    inst.bind(FakeGroupConsumer(cluster="other"))
    inst.join_started()
    assert [c for _, _, c in em.events] == ["prod-eu"]


# ---------------------------------------------------------------------------------------------
# Events settings (a real, unconnected events producer)
# ---------------------------------------------------------------------------------------------


def test_an_unreachable_events_cluster_costs_the_app_nothing(clocks):
    closed = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    conf = instrument({"group.id": "app"}, events={"bootstrap.servers": closed, "topic": "ev"}, cluster="c")
    cb = conf["stats_cb"]
    ts = int(time.monotonic() * 1_000_000)  # one moment: a moving ts with a fixed metadata_age would read as refreshes
    for _ in range(200):
        cb(raw(stats(ts=ts)))
    inst = instrumentation_of(conf)
    # 2 client_fetch per statistics, 1 metadata_refresh (the counter never grows after the first)
    assert inst.events_emitted == 200 * 2 + 1 and inst.instrumentation_errors == 0
    assert inst.close(timeout=0.2) == 401  # nothing could be delivered; close is bounded
    assert time.monotonic() - started < 5


def test_invalid_events_settings_disable_emitting_instead_of_failing_the_app(caplog):
    with caplog.at_level(logging.ERROR, logger="monitor.instrument"):
        conf = instrument({"group.id": "app"}, events={"bootstrap.servers": "x:1", "no.such.property": 1})
        bad_number = instrument({"group.id": "app"}, events={"bootstrap.servers": "x:1", "max_buffered": "lots"})
    inst = instrumentation_of(conf)
    conf["stats_cb"](raw(stats()))
    assert inst.events_dropped == 3 and inst.instrumentation_errors == 0
    assert instrumentation_of(bad_number).events_dropped == 0
    assert len([r for r in caplog.records if "could not be created" in r.getMessage()]) == 2


def test_instrumented_consumer_is_a_consumer_and_closes_its_emitter():
    closed = f"127.0.0.1:{free_port()}"
    em = InstrumentFakeEmitter()
    c = InstrumentedConsumer({"bootstrap.servers": closed, "group.id": "app"}, events=em, cluster="c")
    try:
        assert isinstance(c, Consumer) and c.instrumentation.group == "app"
        with pytest.raises(TypeError, match="on_assign expects a callable"):
            c.subscribe(["t"], on_assign=None)
        c.subscribe(["t"])
        assert c.poll(0.05) is None and c.consume(5, timeout=0.05) == []
        assert [r.phase for r in em.of(Rebalance)] == ["join_started"]
    finally:
        c.close()
    assert c.instrumentation_errors == 0


def test_a_producer_reports_each_partition_it_wrote_to_with_its_leaders_request_figures():
    name, b1 = broker(1, 1)
    b1.update(txerrs=2, txretries=5, req_timeouts=1,
              rtt={"min": 900, "max": 4000, "avg": 1500, "p50": 1200, "p99": 3900, "cnt": 12},
              int_latency={"min": 10, "max": 300, "avg": 40, "p50": 30, "p99": 250, "cnt": 12})
    name2, b2 = broker(2, 1, nodename="127.0.0.1:9093")
    b2.update(rtt={"min": 0, "max": 0, "avg": 0, "p50": 0, "p99": 0, "cnt": 0})
    sent = dict(msgq_cnt=3, xmit_msgq_cnt=1, msgs_inflight=2, txmsgs=40, txbytes=4000)
    idle = dict(msgq_cnt=0, xmit_msgq_cnt=0, msgs_inflight=0, txmsgs=0, txbytes=0)
    s = stats(kind="producer", brokers=[(name, b1), (name2, b2)],
              topics={"out": [part(0, desired=False, **sent), part(1, desired=False, leader=2, **{**sent, "msgs_inflight": 0}),
                              part(2, desired=False, **idle), UA]})
    got = {p.partition: p for p in client_produces(s)}
    assert sorted(got) == [0, 1]  # partition 2: nothing sent, nothing held
    p0 = got[0]
    assert (p0.topic, p0.leader, p0.queued_messages, p0.in_flight_messages, p0.sent_messages, p0.sent_bytes) == (
        "out", 1, 4, 2, 40, 4000)
    assert (p0.leader_rtt_avg_ms, p0.leader_rtt_p99_ms, p0.leader_queue_latency_p99_ms) == (1.5, 3.9, 0.25)
    assert (p0.leader_request_errors, p0.leader_request_retries, p0.leader_request_timeouts) == (2, 5, 1)
    assert got[1].leader == 2 and got[1].leader_rtt_p99_ms is None  # its leader's window saw no request
    assert client_produces(stats()) == []  # a consumer
