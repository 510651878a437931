"""A broker that answers nothing (paused, overloaded) costs an observation its wait and no more:
the group listing, the coordinator requests and the ListOffsets are waited for until one
deadline; what is late is missing from that cycle, named in the heartbeat, and not asked again
while its request is out.  Driven through fake admin clients whose futures never settle, as a
paused broker's do not until librdkafka times them out."""

from __future__ import annotations

import time
from concurrent.futures import Future
from types import SimpleNamespace

from confluent_kafka import KafkaError, KafkaException

from monitor.contract import GroupOffsets, GroupState, Heartbeat
from monitor.coordinator import Asker
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from tests.support.probe_fakes import FakeAdmin, FakeEmitter, described, done, tp


class SilentCoordinators(FakeAdmin):
    """Groups in ``silent`` get futures that never settle (their coordinator is paused), until
    ``wake()``; every group's description names its coordinator."""

    def __init__(self, *a, coordinators: dict[str, int], **kw):
        super().__init__(*a, **kw)
        self.coordinators = coordinators
        self.silent: set[str] = set()
        self.held: list[Future] = []
        self.asked: list[str] = []
        self.listing: Future | None = None  # a listing to hand out instead of an answered one

    def _maybe_silent(self, gid: str, answer: Future) -> Future:
        if gid not in self.silent:
            return answer
        f: Future = Future()
        self.held.append(f)
        return f

    def wake(self) -> None:
        for f in self.held:
            if not f.done():
                f.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
        self.held.clear()
        self.silent.clear()

    def list_consumer_groups(self, request_timeout=None):
        return self.listing if self.listing is not None else super().list_consumer_groups(request_timeout)

    def list_consumer_group_offsets(self, reqs, request_timeout=None):
        g = reqs[0].group_id
        self.asked.append(g)
        return {g: self._maybe_silent(g, super().list_consumer_group_offsets(reqs, request_timeout)[g])}

    def describe_consumer_groups(self, groups, request_timeout=None):
        return {g: self._maybe_silent(g, done(described(g, self.coordinators[g]))) for g in groups}


def test_the_asker_answers_a_silent_group_by_the_deadline_and_does_not_pile_requests_on_it():
    admin = SilentCoordinators({"orders": 1}, {"quiet": [tp("orders", 0, 3)], "loud": [tp("orders", 0, 9)]}, {},
                               coordinators={"quiet": 2, "loud": 1})
    asker = Asker(admin)
    admin.silent = {"quiet"}
    t0 = time.monotonic()
    got = asker.ask({"committed": {"quiet": None, "loud": None}}, timeout_s=10, wait_s=0.3)["committed"]
    assert 0.3 <= time.monotonic() - t0 < 2
    assert got["loud"] == [("orders", 0, 9, None)]
    assert isinstance(got["quiet"], KafkaError) and got["quiet"].code() == KafkaError._TIMED_OUT
    assert "within 0.3s" in got["quiet"].str()
    # asked again while the first request is out: not sent, answered at once
    admin.asked.clear()
    t0 = time.monotonic()
    got = asker.ask({"committed": {"quiet": None}}, timeout_s=10, wait_s=0.3)["committed"]
    assert time.monotonic() - t0 < 0.2 and admin.asked == []
    assert "has not answered the request sent" in got["quiet"].str()
    # once that request ends (librdkafka's timeout), the group is asked again
    admin.wake()
    got = asker.ask({"committed": {"quiet": None}}, timeout_s=10, wait_s=0.3)["committed"]
    assert admin.asked == ["quiet"] and got["quiet"] == [("orders", 0, 3, None)]


def make(admin, interval_s: float = 4.0):
    em = FakeEmitter()
    probe = Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=interval_s, refresh_backoff_s=0), emitter=em, admin=admin)
    return probe, em


def test_a_silent_coordinator_costs_one_wait_and_is_named_in_the_heartbeat():
    admin = SilentCoordinators({"orders": 1}, {"quiet": [tp("orders", 0, 3)], "loud": [tp("orders", 0, 9)]},
                               {("orders", 0): 20}, coordinators={"quiet": 2, "loud": 1})
    probe, em = make(admin)
    probe.cycle()  # healthy: learns each group's coordinator
    assert em.of(Heartbeat)[-1].unanswered_brokers == []
    admin.silent = {"quiet"}
    t0 = time.monotonic()
    probe.observe()
    took = time.monotonic() - t0
    assert probe.observe_wait_s() == 2.0 and 2.0 <= took < 4.0, took  # half the interval, not the request timeout
    beat = em.of(Heartbeat)[-1]
    assert beat.unanswered_brokers == [2]
    latest = {e.group for e in em.events[em.events.index(em.of(Heartbeat)[-2]):] if isinstance(e, GroupState)}
    assert latest == {"loud"}  # the silent group's description is missing from this cycle, the other's is not
    admin.wake()
    probe.observe()
    assert em.of(Heartbeat)[-1].unanswered_brokers == []


def test_a_late_or_partial_group_listing_keeps_the_groups_listed_before():
    admin = SilentCoordinators({"orders": 1}, {"a": [tp("orders", 0, 1)], "b": [tp("orders", 0, 2)]},
                               {("orders", 0): 5}, coordinators={"a": 1, "b": 2})
    probe, em = make(admin)
    probe.cycle()
    # the listing does not come back (a broker paused): the groups listed before are observed
    admin.listing = Future()
    n = len(em.of(GroupOffsets))
    t0 = time.monotonic()
    probe.observe()
    assert time.monotonic() - t0 < 4.0
    assert {e.group for e in em.of(GroupOffsets)[n:]} == {"a", "b"}
    # ... and no second listing is sent while that one is out
    assert probe._listing is admin.listing
    # it ends with one broker's error and without group b (that broker coordinates it): b is kept
    admin.listing.set_result(SimpleNamespace(valid=[SimpleNamespace(group_id="a")],
                                             errors=[KafkaError(KafkaError._TIMED_OUT)]))
    n = len(em.of(GroupOffsets))
    probe.observe()
    assert {e.group for e in em.of(GroupOffsets)[n:]} == {"a", "b"}
    # a complete listing without b drops it (a group deleted)
    admin.listing = done(SimpleNamespace(valid=[SimpleNamespace(group_id="a")], errors=[]))
    n = len(em.of(GroupOffsets))
    probe.observe()
    assert {e.group for e in em.of(GroupOffsets)[n:]} == {"a"}
