"""The canary's bookkeeping (monitor.canary.CanaryStats) with a fake clock, and its topic plan."""

from __future__ import annotations

from monitor.canary import MAX_UNREAD, SEEN_WINDOW, CanaryStats, answering_brokers, plan_layout, writes_held_by
from monitor.contract import CANARY_LATENCY_BOUNDS_MS, Event


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def stats(lost_after_s: float = 30.0):
    mono, wall = Clock(), Clock()
    return CanaryStats(b"run-0001", lost_after_s, clock=mono, wall=wall), mono, wall


def test_plan_layout_gives_every_broker_one_partition_it_leads():
    assert plan_layout([1, 2, 3], {}, 3) == [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
    assert plan_layout([3, 1, 2], {}, 2) == [[1, 2], [2, 3], [3, 1]]
    # a new broker leads none: one partition for it; the others keep theirs
    assert plan_layout([1, 2, 3, 4], {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}, 3) == [[4, 1, 2]]
    # fewer brokers than the replication factor: as many replicas as brokers
    assert plan_layout([1, 2], {0: [1, 2]}, 3) == [[2, 1]]
    assert plan_layout([1, 2, 3], {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}, 3) == []


def test_writes_acked_and_read_back_once_in_order():
    s, mono, wall = stats()
    for _ in range(3):
        seq, value = s.next_record(0)
        mono.t += 0.004
        s.on_delivery(0, seq, None)
        wall.t += 0.006
        assert s.on_record(0, value)
    (r,) = s.reports("canary", 1)
    assert (r.sent, r.acked, r.received, r.lost, r.duplicated, r.out_of_order, r.pending) == (3, 3, 3, 0, 0, 0, 0)
    assert r.produce_latency_counts[CANARY_LATENCY_BOUNDS_MS.index(5)] == 3  # 4 ms <= 5 ms
    assert r.e2e_latency_counts[CANARY_LATENCY_BOUNDS_MS.index(10)] == 3  # read 6 ms after its send
    assert round(r.produce_latency_sum_ms) == 12 and r.oldest_pending_ms is None
    assert Event.of(r, cluster="c", source="s", seq=0, observed_at=1).key() == "c/canary/0"


def test_librdkafka_latency_is_used_when_given():
    s, mono, _ = stats()
    seq, _ = s.next_record(0)
    mono.t += 0.5  # the report served late, in a poll
    s.on_delivery(0, seq, None, latency_s=0.003)
    (r,) = s.reports("canary", 1)
    assert r.produce_latency_counts[CANARY_LATENCY_BOUNDS_MS.index(5)] == 1


def test_duplicates_reordering_and_other_runs():
    s, _, _ = stats()
    values = [s.next_record(0)[1] for _ in range(4)]
    for i in range(4):
        s.on_delivery(0, i, None)
    for v in (values[0], values[2], values[1], values[2], values[3]):
        assert s.on_record(0, v)
    other = CanaryStats(b"run-0002", 30.0)
    assert not s.on_record(0, other.next_record(0)[1])  # another canary's record: not ours
    assert not s.on_record(0, b"garbage")
    (r,) = s.reports("canary", 1)
    assert (r.received, r.duplicated, r.out_of_order, r.lost) == (4, 1, 1, 0)


def test_read_before_its_ack_is_not_lost():
    s, mono, _ = stats(lost_after_s=5)
    seq, value = s.next_record(0)
    assert s.on_record(0, value)
    s.on_delivery(0, seq, None)
    mono.t += 60
    s.expire()
    (r,) = s.reports("canary", 1)
    assert (r.acked, r.received, r.lost) == (1, 1, 0)


def test_acked_and_never_read_back_is_lost_after_the_window():
    s, mono, _ = stats(lost_after_s=5)
    seq, _ = s.next_record(0)
    s.on_delivery(0, seq, None)
    mono.t += 4.9
    s.expire()
    assert s.reports("canary", 1)[0].lost == 0
    mono.t += 0.2
    s.expire()
    assert s.reports("canary", 1)[0].lost == 1


def test_pending_writes_errors_and_unsent():
    s, mono, _ = stats()
    a, _ = s.next_record(1)
    mono.t += 2
    b, _ = s.next_record(1)
    mono.t += 1
    (r,) = s.reports("canary", 1)
    assert (r.pending, r.oldest_pending_ms) == (2, 3000)
    s.on_delivery(1, a, "NOT_ENOUGH_REPLICAS")
    s.unsent(1, b)  # the local queue was full: never sent
    (r,) = s.reports("canary", 1)
    assert (r.sent, r.acked, r.pending) == (1, 0, 0)
    assert [(e.code, e.count) for e in r.errors] == [("NOT_ENOUGH_REPLICAS", 1)]


def test_memory_is_bounded():
    s, _, _ = stats()
    for _ in range(MAX_UNREAD + 10):
        seq, _ = s.next_record(0)
        s.on_delivery(0, seq, None)
    st = s.parts[0]
    assert len(st.unread) == MAX_UNREAD and st.lost == 10  # never read back: the oldest count as lost
    t = CanaryStats(b"run-0003", 30.0)
    values = [t.next_record(0)[1] for _ in range(3 * SEEN_WINDOW)]
    for v in values:
        t.on_record(0, v)
    assert len(t.parts[0].seen) <= 2 * SEEN_WINDOW + 1
    assert t.on_record(0, values[0]) and t.parts[0].duplicated == 1  # too old to remember: read once already


def test_waiting_since_is_the_send_time_of_each_partitions_oldest_unacked_write():
    s, mono, wall = stats()
    a, _ = s.next_record(0)
    s.next_record(1)
    mono.t += 3
    wall.t += 3
    s.next_record(0)
    assert s.waiting_since() == {0: 1_000_000, 1: 1_000_000}
    s.on_delivery(0, a, None)
    s.on_delivery(1, 0, None)
    assert s.waiting_since() == {0: 1_003_000}


# three brokers, RF 3, one canary partition led by each (plan_layout)
PARTS = {0: (1, [1, 2, 3]), 1: (2, [2, 3, 1]), 2: (3, [3, 1, 2])}


def test_a_paused_follower_is_the_one_broker_every_held_partition_waits_for():
    # broker 3 paused: it answers nothing; partitions 0 and 1 wait for it as a follower, 2 for it as leader
    waiting = {0: 10_000, 1: 11_000, 2: 9_000}
    assert writes_held_by(PARTS, {1, 2}, waiting, now_ms=14_000) == (3, 10_000, 2)
    # too early: nothing has waited 2 s
    assert writes_held_by(PARTS, {1, 2}, waiting, now_ms=11_500) is None


def test_no_broker_is_named_when_the_waits_do_not_single_one_out():
    # one partition held on RF 3: either follower may be the one
    assert writes_held_by(PARTS, {1, 2, 3}, {0: 0}, now_ms=5_000) is None
    # every leader answers and every partition waits: no follower is common to all
    assert writes_held_by(PARTS, {1, 2, 3}, {0: 0, 1: 0, 2: 0}, now_ms=5_000) is None
    # a silent leader's partition says nothing of its followers; a leaderless one neither
    assert writes_held_by(PARTS, {1}, {1: 0, 2: 0}, now_ms=5_000) is None
    assert writes_held_by({0: (-1, [2, 3])}, {1, 2, 3}, {0: 0}, now_ms=5_000) is None
    # RF 2: a single held partition has a single follower
    assert writes_held_by({0: (1, [1, 2])}, {1}, {0: 0}, now_ms=5_000) == (2, 0, 1)
    # broker 3 named, then partition 1's leader drops it from the ISR first: partition 0 alone
    # has two candidates, and the one named before stays named
    assert writes_held_by({0: (1, [1, 2, 3]), 1: (2, [2, 1])}, {1, 2}, {0: 0}, now_ms=5_000) is None
    assert writes_held_by({0: (1, [1, 2, 3]), 1: (2, [2, 1])}, {1, 2}, {0: 0}, now_ms=5_000, previous=3) == (3, 0, 1)
    assert writes_held_by({0: (1, [1, 2])}, {1, 2}, {0: 0}, now_ms=5_000, previous=3) == (2, 0, 1)
    # a partition the metadata does not show (yet) is left out
    assert writes_held_by({}, {1}, {0: 0}, now_ms=5_000) is None


def test_a_broker_answers_while_the_consumer_heard_from_it_within_two_seconds():
    rxidle = {1: (100.0, 40_000), 2: (100.0, 2_500_000), 3: (99.5, 900_000), 4: (100.0, -1)}
    # at 100.5 s: 1 heard 0.54 s ago, 2 2.5 s+ ago, 3 1.9 s ago, 4 never
    assert answering_brokers(rxidle, 100.5) == {1, 3}
    assert answering_brokers(rxidle, 101.5) == {1}
