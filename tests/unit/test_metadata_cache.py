"""The metadata cache's refresh state machine (Java ``Metadata`` semantics, KAFKA-INTERNALS §1).

The core proof is a table: each scenario is a list of steps (advance the clock, request an update,
a successful or failed update, use a topic) and after every step the expected
``time_to_next_update``, ``version``, ``need_update`` and ``next_reason`` — plus, where a step is
about it, the topics in use, the change an update reported and the partition counts kept."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional

import pytest

from monitor.cluster_view import BrokerView, ClusterView, LeaderChange, PartitionCount, PartitionView, TopicView
from monitor.metadata import Cause, MetadataCache, MetadataTimeout, Reason, cause_for_error

T0 = 1_000_000  # the clock starts well after 0, so "last_refresh_ms = 0" is visibly different from "now"
MAX_AGE, BACKOFF, EXPIRY = 10_000, 100, 30_000

BOOT = (Reason.BOOTSTRAP, None)
PERIODIC = (Reason.PERIODIC, None)
NEW_TOPIC = (Reason.NEW_TOPIC, None)


def inval(cause: str) -> tuple[str, str]:
    return Reason.INVALIDATED, cause


# -- views ------------------------------------------------------------------------------------


def topic(name: str, n: int = 1, leaders: Optional[dict[int, int]] = None,
          epochs: Optional[dict[int, int]] = None, error: Optional[str] = None) -> TopicView:
    """``n`` partitions on brokers 1..3, leader 1 and epoch 0 unless ``leaders`` / ``epochs`` say otherwise."""
    leaders, epochs = leaders or {}, epochs or {}
    return TopicView(name, tuple(PartitionView(name, i, leaders.get(i, 1), epochs.get(i, 0), (1, 2, 3), (1, 2, 3))
                                 for i in range(n)), error=error)


def view(*topics: TopicView, brokers: int = 3) -> ClusterView:
    return ClusterView("kc", 1, tuple(BrokerView(i, f"b{i}", 9092) for i in range(1, brokers + 1)), topics)


V_ORDERS = view(topic("orders"))
V_ORDERS_PAYMENTS = view(topic("orders"), topic("payments"))
V_PAYMENTS = view(topic("payments"))
V_EMPTY = view(topic("orders"), brokers=0)


# -- steps ------------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: int = T0):
        self.now = now

    def __call__(self) -> int:
        return self.now


Step = Callable[[MetadataCache, Clock], Any]


def advance(ms: int) -> Step:
    def step(cache: MetadataCache, clock: Clock) -> None:
        clock.now += ms
    step.__name__ = f"advance({ms})"
    return step


def request(cause: str) -> Step:
    def step(cache: MetadataCache, clock: Clock) -> int:
        return cache.request_update(cause)
    step.__name__ = f"request_update({cause})"
    return step


def update(v: ClusterView) -> Step:
    def step(cache: MetadataCache, clock: Clock):
        return cache.update(v, clock.now)
    step.__name__ = "update"
    return step


def fail(error: str = "_TRANSPORT") -> Step:
    def step(cache: MetadataCache, clock: Clock) -> None:
        cache.failed_update(clock.now, error)
    step.__name__ = f"failed_update({error})"
    return step


def use(name: str) -> Step:
    def step(cache: MetadataCache, clock: Clock) -> bool:
        return cache.add_topic(name)  # now from the injected clock
    step.__name__ = f"add_topic({name})"
    return step


UNCHECKED: Any = object()


@dataclass(frozen=True)
class Exp:
    ttnu: int
    version: int
    need_update: bool
    reason: tuple[str, Optional[str]]
    topics: Optional[set[str]] = None       # topics in use
    change: Optional[dict[str, Any]] = None  # fields of the MetadataChange this step returned
    counts: Optional[dict[str, PartitionCount]] = None
    cluster: Any = UNCHECKED       # the view the cache must hold (identity), None = no view yet
    returned: Any = UNCHECKED      # the step's own return value


def S(*pairs):  # noqa: N802 - reads like a table header
    return list(pairs)


START = (lambda cache, clock: None, Exp(0, 0, True, BOOT))


def invalidation(cause: str):
    """A successful update, then ``cause`` within the backoff: requested at once, sent when the
    backoff allows, cleared by the next update."""
    return (f"invalidated by {cause}", S(
        START,
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC)),
        (advance(40), Exp(MAX_AGE - 40, 1, False, PERIODIC)),
        (request(cause), Exp(BACKOFF - 40, 1, True, inval(cause), returned=1)),
        (advance(60), Exp(0, 1, True, inval(cause))),
        (update(V_ORDERS), Exp(MAX_AGE, 2, False, PERIODIC)),
        (advance(BACKOFF), Exp(MAX_AGE - BACKOFF, 2, False, PERIODIC)),
    ))


ALL_CAUSES = [Cause.CONNECT_FAILED, Cause.DISCONNECTED, Cause.REQUEST_TIMEOUT, Cause.UNKNOWN_LEADER,
              *(Cause.error_response(e) for e in ("NOT_LEADER_OR_FOLLOWER", "UNKNOWN_TOPIC_OR_PARTITION",
                                                  "LEADER_NOT_AVAILABLE", "FENCED_LEADER_EPOCH",
                                                  "UNKNOWN_LEADER_EPOCH"))]

SCENARIOS = [
    ("bootstrap: refresh at once, then only after max age", S(
        START,
        (advance(5), Exp(0, 0, True, BOOT)),
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC, cluster=V_ORDERS,
                               change={"ok": True, "new_topics": ("orders",), "removed_topics": (),
                                       "leader_changes": (), "no_leader": (), "update_requested": None})),
        (advance(4_000), Exp(MAX_AGE - 4_000, 1, False, PERIODIC)),
    )),
    ("periodic: due exactly max age after the last success, stays due until refreshed", S(
        START,
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC)),
        (advance(MAX_AGE - 1), Exp(1, 1, False, PERIODIC)),
        (advance(1), Exp(0, 1, False, PERIODIC)),
        (advance(5_000), Exp(0, 1, False, PERIODIC)),
        (update(V_ORDERS), Exp(MAX_AGE, 2, False, PERIODIC, change={"changed": False})),
        (advance(BACKOFF), Exp(MAX_AGE - BACKOFF, 2, False, PERIODIC)),
    )),
    ("failed bootstrap: backoff applies, still bootstrap, version 0, no view", S(
        START,
        (fail(), Exp(BACKOFF, 0, True, BOOT, cluster=None)),
        (advance(60), Exp(BACKOFF - 60, 0, True, BOOT)),
        (advance(40), Exp(0, 0, True, BOOT)),
        (fail(), Exp(BACKOFF, 0, True, BOOT)),
        (advance(BACKOFF), Exp(0, 0, True, BOOT)),
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC, cluster=V_ORDERS)),
    )),
    ("failed periodic refresh: data stays stale, version unchanged, retried after the backoff", S(
        START,
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC)),
        (advance(MAX_AGE), Exp(0, 1, False, PERIODIC)),
        (fail(), Exp(BACKOFF, 1, False, PERIODIC, cluster=V_ORDERS)),
        (advance(BACKOFF), Exp(0, 1, False, PERIODIC)),
        (update(V_PAYMENTS), Exp(MAX_AGE, 2, False, PERIODIC, cluster=V_PAYMENTS)),
    )),
    ("failed invalidated refresh keeps the request and its cause", S(
        START,
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC)),
        (advance(1_000), Exp(MAX_AGE - 1_000, 1, False, PERIODIC)),
        (request(Cause.DISCONNECTED), Exp(0, 1, True, inval(Cause.DISCONNECTED), returned=1)),
        (fail(), Exp(BACKOFF, 1, True, inval(Cause.DISCONNECTED))),
        (advance(BACKOFF), Exp(0, 1, True, inval(Cause.DISCONNECTED))),
    )),
    *[invalidation(c) for c in ALL_CAUSES],
    ("several invalidations coalesce: one refresh, the first cause is reported", S(
        START,
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC)),
        (advance(500), Exp(MAX_AGE - 500, 1, False, PERIODIC)),
        (request(Cause.DISCONNECTED), Exp(0, 1, True, inval(Cause.DISCONNECTED))),
        (request(Cause.REQUEST_TIMEOUT), Exp(0, 1, True, inval(Cause.DISCONNECTED))),
        (update(V_ORDERS), Exp(MAX_AGE, 2, False, PERIODIC)),
    )),
    ("new topic forces an update the backoff does not hold back (Java: lastRefreshMs = 0)", S(
        START,
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC)),
        (advance(10), Exp(MAX_AGE - 10, 1, False, PERIODIC)),
        (use("orders"), Exp(0, 1, True, NEW_TOPIC, topics={"orders"}, returned=True)),
        (update(V_ORDERS), Exp(MAX_AGE, 2, False, PERIODIC)),
        (advance(10), Exp(MAX_AGE - 10, 2, False, PERIODIC)),
        # by contrast an invalidation at the same moment waits for the backoff
        (request(Cause.DISCONNECTED), Exp(BACKOFF - 10, 2, True, inval(Cause.DISCONNECTED))),
        # ... until a new topic shows up; new_topic is then the reason reported
        (use("payments"), Exp(0, 2, True, NEW_TOPIC, topics={"orders", "payments"}, returned=True)),
    )),
    ("a topic already in use does not request an update", S(
        START,
        (use("orders"), Exp(0, 0, True, BOOT, topics={"orders"}, returned=True)),
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC)),
        (advance(10), Exp(MAX_AGE - 10, 1, False, PERIODIC)),
        (use("orders"), Exp(MAX_AGE - 10, 1, False, PERIODIC, topics={"orders"}, returned=False)),
    )),
    ("topic expiry: dropped at the first update after topic_expiry_ms unused; use pushes it back", S(
        START,
        (use("orders"), Exp(0, 0, True, BOOT, topics={"orders"})),
        (use("payments"), Exp(0, 0, True, BOOT, topics={"orders", "payments"})),
        (update(V_ORDERS_PAYMENTS), Exp(MAX_AGE, 1, False, PERIODIC, change={"expired_topics": ()})),
        (advance(20_000), Exp(0, 1, False, PERIODIC)),
        (use("payments"), Exp(0, 1, False, PERIODIC, topics={"orders", "payments"}, returned=False)),
        (advance(EXPIRY - 20_000), Exp(0, 1, False, PERIODIC)),
        # orders unused for exactly topic_expiry_ms: not longer, kept
        (update(V_ORDERS_PAYMENTS), Exp(MAX_AGE, 2, False, PERIODIC, topics={"orders", "payments"},
                                        change={"expired_topics": ()})),
        (advance(1), Exp(MAX_AGE - 1, 2, False, PERIODIC)),
        (update(V_ORDERS_PAYMENTS), Exp(MAX_AGE, 3, False, PERIODIC, topics={"payments"},
                                        change={"expired_topics": ("orders",)})),
        # the view itself is not filtered by the topics in use
        (advance(0), Exp(MAX_AGE, 3, False, PERIODIC, cluster=V_ORDERS_PAYMENTS)),
    )),
    ("update with no brokers counts as failed", S(
        START,
        (update(V_EMPTY), Exp(BACKOFF, 0, True, BOOT, cluster=None,
                              change={"ok": False, "version": 0, "at_ms": T0, "new_topics": ()})),
        (advance(BACKOFF), Exp(0, 0, True, BOOT)),
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC, cluster=V_ORDERS)),
        (advance(MAX_AGE), Exp(0, 1, False, PERIODIC)),
        (update(V_EMPTY), Exp(BACKOFF, 1, False, PERIODIC, cluster=V_ORDERS, change={"ok": False, "version": 1})),
    )),
    ("the whole view is replaced: topics gone from the response are gone (no merge)", S(
        START,
        (update(V_ORDERS), Exp(MAX_AGE, 1, False, PERIODIC, change={"new_topics": ("orders",)})),
        (update(V_ORDERS_PAYMENTS), Exp(MAX_AGE, 2, False, PERIODIC, cluster=V_ORDERS_PAYMENTS,
                                        change={"new_topics": ("payments",), "removed_topics": ()})),
        (update(V_PAYMENTS), Exp(MAX_AGE, 3, False, PERIODIC, cluster=V_PAYMENTS,
                                 change={"new_topics": (), "removed_topics": ("orders",), "changed": True},
                                 counts={"payments": PartitionCount(1)})),
    )),
    ("partition count change: reported once, with the time of the update that first saw it", S(
        START,
        (update(view(topic("orders", 3))), Exp(MAX_AGE, 1, False, PERIODIC,
                                               counts={"orders": PartitionCount(3, None, None)})),
        (advance(MAX_AGE), Exp(0, 1, False, PERIODIC)),
        (update(view(topic("orders", 3))), Exp(MAX_AGE, 2, False, PERIODIC, change={"partition_count_changes": {}},
                                               counts={"orders": PartitionCount(3, None, None)})),
        (advance(MAX_AGE), Exp(0, 2, False, PERIODIC)),
        (update(view(topic("orders", 5))), Exp(MAX_AGE, 3, False, PERIODIC,
                                               change={"partition_count_changes": {"orders": (3, 5)}},
                                               counts={"orders": PartitionCount(5, T0 + 2 * MAX_AGE, 3)})),
        (advance(MAX_AGE), Exp(0, 3, False, PERIODIC)),
        (update(view(topic("orders", 5))), Exp(MAX_AGE, 4, False, PERIODIC, change={"partition_count_changes": {}},
                                               counts={"orders": PartitionCount(5, T0 + 2 * MAX_AGE, 3)})),
        # a transient topic error keeps the count; a change across it is still seen
        (update(view(topic("orders", 0, error="LEADER_NOT_AVAILABLE"))),
         Exp(MAX_AGE, 5, False, PERIODIC, change={"partition_count_changes": {}},
             counts={"orders": PartitionCount(5, T0 + 2 * MAX_AGE, 3)})),
        (update(view(topic("orders", 6))), Exp(MAX_AGE, 6, False, PERIODIC,
                                               change={"partition_count_changes": {"orders": (5, 6)}},
                                               counts={"orders": PartitionCount(6, T0 + 3 * MAX_AGE, 5)})),
        # a topic gone from the view is forgotten (bounded state)
        (update(V_PAYMENTS), Exp(MAX_AGE, 7, False, PERIODIC, counts={"payments": PartitionCount(1)})),
    )),
    ("a smaller partition count is a lagging broker's view until 3 updates in a row say so", S(
        START,
        (update(view(topic("orders", 3))), Exp(MAX_AGE, 1, False, PERIODIC, counts={"orders": PartitionCount(3)})),
        (update(view(topic("orders", 1))), Exp(MAX_AGE, 2, False, PERIODIC, change={"partition_count_changes": {}},
                                               counts={"orders": PartitionCount(3, lower_seen=1)})),
        (update(view(topic("orders", 3))), Exp(MAX_AGE, 3, False, PERIODIC, change={"partition_count_changes": {}},
                                               counts={"orders": PartitionCount(3)})),
        (update(view(topic("orders", 1))), Exp(MAX_AGE, 4, False, PERIODIC, change={"partition_count_changes": {}})),
        (update(view(topic("orders", 1))), Exp(MAX_AGE, 5, False, PERIODIC, change={"partition_count_changes": {}},
                                               counts={"orders": PartitionCount(3, lower_seen=2)})),
        # a deleted and re-created topic: the third smaller answer in a row is believed
        (update(view(topic("orders", 1))), Exp(MAX_AGE, 6, False, PERIODIC,
                                               change={"partition_count_changes": {"orders": (3, 1)}},
                                               counts={"orders": PartitionCount(1, T0, 3)})),
    )),
    ("leader and leader-epoch changes are detected", S(
        START,
        (update(view(topic("orders", 2, epochs={0: 3}))), Exp(MAX_AGE, 1, False, PERIODIC,
                                                              change={"leader_changes": ()})),
        (update(view(topic("orders", 2, leaders={0: 2}, epochs={0: 4}))),
         Exp(MAX_AGE, 2, False, PERIODIC, change={"leader_changes": (LeaderChange("orders", 0, 1, 2, 3, 4),)})),
        (update(view(topic("orders", 2, leaders={0: 2}, epochs={0: 5}))),
         Exp(MAX_AGE, 3, False, PERIODIC, change={"leader_changes": (LeaderChange("orders", 0, 2, 2, 4, 5),)})),
        (update(view(topic("orders", 2, leaders={0: 2}, epochs={0: 5}))),
         Exp(MAX_AGE, 4, False, PERIODIC, change={"leader_changes": (), "changed": False})),
    )),
    ("an offline partition: the backoff doubles per update until the periodic refresh takes over; a leader "
     "resets it", S(
        START,
        (update(view(topic("orders", 2, leaders={1: -1}))), Exp(BACKOFF, 1, True, inval(Cause.UNKNOWN_LEADER))),
        (advance(BACKOFF), Exp(0, 1, True, inval(Cause.UNKNOWN_LEADER))),
        (update(view(topic("orders", 2, leaders={1: -1}))), Exp(2 * BACKOFF, 2, True, inval(Cause.UNKNOWN_LEADER))),
        (advance(2 * BACKOFF), Exp(0, 2, True, inval(Cause.UNKNOWN_LEADER))),
        (update(view(topic("orders", 2, leaders={1: -1}))), Exp(4 * BACKOFF, 3, True, inval(Cause.UNKNOWN_LEADER))),
        # another cause (a failed connection) is not held back by the grown backoff
        (request(Cause.CONNECT_FAILED), Exp(BACKOFF, 3, True, inval(Cause.UNKNOWN_LEADER))),
        (advance(BACKOFF), Exp(0, 3, True, inval(Cause.UNKNOWN_LEADER))),
        *[pair for k in range(4, 8) for pair in (  # 800, 1600, 3200, 6400 ms
            (update(view(topic("orders", 2, leaders={1: -1}))),
             Exp(BACKOFF * 2 ** (k - 1), k, True, inval(Cause.UNKNOWN_LEADER))),
            (advance(BACKOFF * 2 ** (k - 1)), Exp(0, k, True, inval(Cause.UNKNOWN_LEADER))))],
        # 12800 ms would be later than the periodic refresh: no request, the periodic one comes
        *[pair for k in range(8, 13) for pair in (
            (update(view(topic("orders", 2, leaders={1: -1}))),
             Exp(MAX_AGE, k, False, PERIODIC, change={"update_requested": None})),
            (advance(MAX_AGE), Exp(0, k, False, PERIODIC)))],
        (update(view(topic("orders", 2))), Exp(MAX_AGE, 13, False, PERIODIC)),
        (update(view(topic("orders", 2, leaders={1: -1}))), Exp(BACKOFF, 14, True, inval(Cause.UNKNOWN_LEADER))),
    )),
    ("a partition without a leader makes the cache request an update (unknown_leader)", S(
        START,
        (update(view(topic("orders", 2))), Exp(MAX_AGE, 1, False, PERIODIC)),
        (advance(MAX_AGE), Exp(0, 1, False, PERIODIC)),
        (update(view(topic("orders", 2, leaders={1: -1}))),
         Exp(BACKOFF, 2, True, inval(Cause.UNKNOWN_LEADER),
             change={"no_leader": (("orders", 1),), "update_requested": Cause.UNKNOWN_LEADER,
                     "leader_changes": (LeaderChange("orders", 1, 1, -1, 0, 0),)})),
        (advance(BACKOFF), Exp(0, 2, True, inval(Cause.UNKNOWN_LEADER))),
        # a leader id that is not among the brokers is not a known leader either; a second update
        # in a row with a leaderless partition doubles the backoff (the probe has nothing queued)
        (update(view(topic("orders", 2, leaders={1: 7}))),
         Exp(2 * BACKOFF, 3, True, inval(Cause.UNKNOWN_LEADER), change={"no_leader": (("orders", 1),)})),
        (update(view(topic("orders", 2))),
         Exp(MAX_AGE, 4, False, PERIODIC, change={"no_leader": (), "update_requested": None})),
    )),
]


@pytest.mark.parametrize("steps", [s for _, s in SCENARIOS], ids=[name for name, _ in SCENARIOS])
def test_state_machine(steps):
    clock = Clock()
    cache = MetadataCache(metadata_max_age_ms=MAX_AGE, refresh_backoff_ms=BACKOFF, topic_expiry_ms=EXPIRY,
                          clock=clock)
    for i, (step, exp) in enumerate(steps):
        where = f"step {i} ({getattr(step, '__name__', 'start')}) at t0+{clock.now - T0}"
        out = step(cache, clock)
        got = (cache.time_to_next_update(clock.now), cache.version, cache.need_update, cache.next_reason())
        assert got == (exp.ttnu, exp.version, exp.need_update, exp.reason), where
        assert cache.should_refresh(clock.now) == (exp.ttnu == 0), where
        assert cache.time_to_next_update() == exp.ttnu, where  # the injected clock is the default "now"
        if exp.returned is not UNCHECKED:
            assert out == exp.returned, where
        if exp.topics is not None:
            assert set(cache.topics) == exp.topics, where
        if exp.change is not None:
            for name, want in exp.change.items():
                assert getattr(out, name) == want, f"{where}: change.{name}"
        if exp.counts is not None:
            assert dict(cache.partition_counts) == exp.counts, where
        if exp.cluster is not UNCHECKED:
            assert cache.cluster is exp.cluster, where


# -- beyond the table -------------------------------------------------------------------------


def test_fresh_cache_fields():
    cache = MetadataCache(clock=Clock())
    assert (cache.version, cache.need_update, cache.last_refresh_ms, cache.last_successful_refresh_ms,
            cache.cluster, dict(cache.topics)) == (0, True, 0, 0, None, {})
    assert (cache.metadata_max_age_ms, cache.refresh_backoff_ms, cache.topic_expiry_ms) == (300_000, 100, 300_000)


def test_refresh_times_and_expiry_times():
    clock = Clock()
    cache = MetadataCache(metadata_max_age_ms=MAX_AGE, refresh_backoff_ms=BACKOFF, topic_expiry_ms=EXPIRY, clock=clock)
    cache.add_topic("orders")
    assert cache.topics == {"orders": T0 + EXPIRY}
    cache.update(V_ORDERS)
    assert (cache.last_refresh_ms, cache.last_successful_refresh_ms) == (T0, T0)
    clock.now += 5
    cache.failed_update(error="_TRANSPORT")
    assert (cache.last_refresh_ms, cache.last_successful_refresh_ms, cache.last_error) == (T0 + 5, T0, "_TRANSPORT")
    assert cache.partition_count("orders") == 1 and cache.partition_count_changed_at("orders") is None
    assert cache.partition_count("nope") is None and cache.partition_count_changed_at("nope") is None


def test_the_next_periodic_refresh_is_due_a_max_age_after_the_request():
    """A slow answer (sent at T0, answered 4 s later) does not push the next refresh back."""
    clock = Clock()
    cache = MetadataCache(metadata_max_age_ms=MAX_AGE, refresh_backoff_ms=BACKOFF, clock=clock)
    clock.now += 4_000
    cache.update(V_ORDERS, sent_at=T0)
    assert (cache.last_refresh_ms, cache.last_successful_refresh_ms) == (T0 + 4_000, T0)
    assert cache.time_to_next_update() == MAX_AGE - 4_000
    cache.update(V_ORDERS, sent_at=clock.now + 50)  # a sent time after the answer is not believed
    assert cache.last_successful_refresh_ms == clock.now


def test_request_update_rejects_unknown_causes():
    cache = MetadataCache(clock=Clock())
    for bad in ("gremlins", "error_response", "error_response:", "disconnected:node 1"):
        with pytest.raises(ValueError):
            cache.request_update(bad)
    assert cache.request_update(Cause.NEW_TOPIC) == 0 and cache.next_reason() == BOOT


def test_config_is_validated():
    for kw, msg in [({"metadata_max_age_ms": -1}, "metadata_max_age_ms"),
                    ({"refresh_backoff_ms": -1}, "refresh_backoff_ms"),
                    ({"topic_expiry_ms": 0}, "topic_expiry_ms")]:
        with pytest.raises(ValueError, match=msg):
            MetadataCache(clock=Clock(), **kw)


@pytest.mark.parametrize("error,cause", [
    ("NOT_LEADER_OR_FOLLOWER", "error_response:NOT_LEADER_OR_FOLLOWER"),
    ("NOT_LEADER_FOR_PARTITION", "error_response:NOT_LEADER_OR_FOLLOWER"),  # librdkafka's name
    (6, "error_response:NOT_LEADER_OR_FOLLOWER"),
    ("UNKNOWN_TOPIC_OR_PART", "error_response:UNKNOWN_TOPIC_OR_PARTITION"),
    ("UNKNOWN_TOPIC_OR_PARTITION", "error_response:UNKNOWN_TOPIC_OR_PARTITION"),
    (3, "error_response:UNKNOWN_TOPIC_OR_PARTITION"),
    ("LEADER_NOT_AVAILABLE", "error_response:LEADER_NOT_AVAILABLE"),
    ("FENCED_LEADER_EPOCH", "error_response:FENCED_LEADER_EPOCH"),
    (75, "error_response:UNKNOWN_LEADER_EPOCH"),
    ("KAFKA_STORAGE_ERROR", "error_response:KAFKA_STORAGE_ERROR"),
    ("_TRANSPORT", Cause.DISCONNECTED),
    (-195, Cause.DISCONNECTED),
    ("NETWORK_EXCEPTION", Cause.DISCONNECTED),
    ("_ALL_BROKERS_DOWN", Cause.DISCONNECTED),
    ("_RESOLVE", Cause.CONNECT_FAILED),
    ("_TIMED_OUT", Cause.REQUEST_TIMEOUT),
    ("REQUEST_TIMED_OUT", Cause.REQUEST_TIMEOUT),
    (7, Cause.REQUEST_TIMEOUT),
    ("_timed_out", Cause.REQUEST_TIMEOUT),
    ("TOPIC_AUTHORIZATION_FAILED", None),
    ("BROKER_NOT_AVAILABLE", None),
    ("_MSG_TIMED_OUT", None),
    (0, None),
    (None, None),
])
def test_cause_for_error(error, cause):
    assert cause_for_error(error) == cause
    if cause is not None:
        assert MetadataCache(clock=Clock()).request_update(cause) == 0  # every result is a valid cause


def test_cause_for_error_takes_confluent_errors():
    from confluent_kafka import KafkaError, KafkaException

    assert cause_for_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)) == "error_response:NOT_LEADER_OR_FOLLOWER"
    assert cause_for_error(KafkaException(KafkaError(KafkaError._TRANSPORT))) == Cause.DISCONNECTED
    assert cause_for_error(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)) is None


def test_await_update_woken_by_an_update_from_another_thread():
    cache = MetadataCache(clock=Clock())
    v = cache.request_update(Cause.DISCONNECTED)
    timer = threading.Timer(0.05, lambda: cache.update(V_ORDERS))
    timer.start()
    try:
        t = time.monotonic()
        assert cache.await_update(v, 5_000) == 1
        assert time.monotonic() - t < 4
    finally:
        timer.join()
    assert cache.await_update(0, 0) == 1  # already newer: returns at once, even with no time left


def test_await_update_times_out_with_javas_message():
    cache = MetadataCache(clock=Clock())
    cache.update(V_ORDERS)
    threading.Timer(0.01, lambda: cache.failed_update(error="_TRANSPORT")).start()  # a failure does not wake it
    t = time.monotonic()
    with pytest.raises(MetadataTimeout, match=r"^Failed to update metadata after 80 ms$") as e:
        cache.await_update(1, 80)
    assert 0.07 <= time.monotonic() - t < 2
    assert isinstance(e.value, TimeoutError) and e.value.timeout_ms == 80


def test_concurrent_use_keeps_the_counts_straight():
    cache = MetadataCache(clock=Clock())
    n = 200

    def worker(k: int) -> None:
        for i in range(n):
            cache.add_topic(f"t{k}-{i % 7}")
            cache.request_update(Cause.DISCONNECTED)
            cache.update(V_ORDERS)
            assert cache.cluster is V_ORDERS

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert cache.version == 4 * n and len(cache.topics) == 4 * 7 and not cache.need_update


def test_the_view_is_immutable():
    v = view(topic("orders", 2))
    t = v.topics["orders"]
    p = t.partitions[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.cluster_id = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.partitions = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.leader = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        v.topics["payments"] = topic("payments")  # type: ignore[index]
    with pytest.raises(TypeError):
        del v.topics["orders"]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        p.isr[0] = 7  # type: ignore[index]
    with pytest.raises(AttributeError):
        v.brokers[0].host = "evil"  # type: ignore[misc]
    assert isinstance(v.brokers, tuple) and isinstance(p.replicas, tuple)


def test_the_view_does_not_alias_its_inputs():
    replicas = [1, 2]
    topics = {"orders": TopicView("orders", (PartitionView("orders", 0, 1, None, replicas, replicas),))}
    v = ClusterView("kc", 1, [BrokerView(1, "b1", 9092)], topics)
    replicas.append(3)
    topics["payments"] = topic("payments")
    assert v.topics["orders"].partitions[0].replicas == (1, 2) and list(v.topics) == ["orders"]


def test_the_view_is_validated():
    with pytest.raises(ValueError, match="belongs to topic"):
        TopicView("orders", (PartitionView("payments", 0, 1),))
    with pytest.raises(ValueError, match="listed twice"):
        TopicView("orders", (PartitionView("orders", 0, 1), PartitionView("orders", 0, 2)))
    with pytest.raises(ValueError, match="holds topic"):
        ClusterView("kc", 1, (), {"orders": topic("payments")})


def kafka_error(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=lambda: name, code=lambda: -1, str=lambda: name)


def test_from_confluent_on_a_confluent_shaped_object():
    def pmd(i, leader, replicas, isrs, error=None):
        return SimpleNamespace(id=i, leader=leader, replicas=list(replicas), isrs=list(isrs), error=error)

    md = SimpleNamespace(
        cluster_id="abc", controller_id=2, orig_broker_id=1, orig_broker_name="b1:9092/1",
        brokers={2: SimpleNamespace(id=2, host="b2", port=9093), 1: SimpleNamespace(id=1, host="b1", port=9092)},
        topics={
            "orders": SimpleNamespace(topic="orders", error=None, partitions={
                1: pmd(1, -1, [2, 1], [], kafka_error("LEADER_NOT_AVAILABLE")),
                0: pmd(0, 1, [1, 2], [1, 2]),
            }),
            "__consumer_offsets": SimpleNamespace(topic="__consumer_offsets", error=None,
                                                  partitions={0: pmd(0, 2, [2], [2])}),
            "ghost": SimpleNamespace(topic="ghost", error=kafka_error("UNKNOWN_TOPIC_OR_PART"), partitions={}),
        })
    v = ClusterView.from_confluent(md)
    assert v == ClusterView(
        cluster_id="abc", controller_id=None,  # KRaft answers a random broker: none rather than a wrong one
        brokers=(BrokerView(1, "b1", 9092, None), BrokerView(2, "b2", 9093, None)),
        topics={
            "__consumer_offsets": TopicView("__consumer_offsets", (PartitionView("__consumer_offsets", 0, 2, None,
                                                                                 (2,), (2,), (), None),),
                                            None, True),
            "ghost": TopicView("ghost", (), "UNKNOWN_TOPIC_OR_PART", False),
            "orders": TopicView("orders", (PartitionView("orders", 0, 1, None, (1, 2), (1, 2), (), None),
                                           PartitionView("orders", 1, -1, None, (2, 1), (), (),
                                                         "LEADER_NOT_AVAILABLE")),
                                None, False),
        })
    assert list(v.topics) == ["__consumer_offsets", "ghost", "orders"]
    assert v.leaderless() == (("orders", 1),)

    md.controller_id, md.cluster_id = -1, None
    assert ClusterView.from_confluent(md).controller_id is None

    # a replica on a broker the response does not list (down, or fenced) is offline
    md.brokers.pop(2)
    gone = ClusterView.from_confluent(md).topics["orders"].partitions
    assert [p.offline_replicas for p in gone] == [(2,), (2,)]

    change = MetadataCache(clock=Clock()).update(v)
    assert change.ok and change.no_leader == (("orders", 1),) and change.update_requested == Cause.UNKNOWN_LEADER


def test_from_confluent_on_the_real_classes():
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import BrokerMetadata, ClusterMetadata, PartitionMetadata, TopicMetadata

    md, b, t, p = ClusterMetadata(), BrokerMetadata(), TopicMetadata(), PartitionMetadata()
    md.cluster_id, md.controller_id = "abc", 1
    b.id, b.host, b.port = 1, "localhost", 9092
    p.id, p.leader, p.replicas, p.isrs, p.error = 0, 1, [1], [1], KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
    t.topic, t.partitions = "orders", {0: p}
    md.brokers, md.topics = {1: b}, {"orders": t}
    v = ClusterView.from_confluent(md)
    assert v.brokers == (BrokerView(1, "localhost", 9092),)
    assert v.topics["orders"].partitions[0].error == "NOT_LEADER_FOR_PARTITION"
    assert cause_for_error(v.topics["orders"].partitions[0].error) == "error_response:NOT_LEADER_OR_FOLLOWER"
