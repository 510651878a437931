"""The real-cluster demo (``kafka-monitor demo --real-cluster``): its fault cycle against the real
cluster (the session fixture ``kafka_cluster``), with short durations, and its command line.

One cycle through ``FaultCycle.run`` on a topic laid out as the demo's (replication factor 3,
min.insync.replicas 2, broker 3 leading nothing) with the demo's producer writing to it; each
fault is checked in the cluster's own metadata as the cycle recorded it while the fault held:
a paused follower leaves the ISR and comes back; a stopped broker loses its leaderships, comes
back, and the preferred leader election gives them back; two stopped brokers leave the ISR at
one replica (under min ISR) and come back.  The whole demo (Spark job included) is left to a
manual run: it takes minutes.
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from kafka_monitor import cli
from kafka_monitor.demo_cluster import REAL_ASSIGNMENT, REAL_MIN_ISR
from kafka_monitor.demo_faults import FaultCycle
from kafka_monitor.local import workload
from tests.conftest import unique, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def whole(parts: dict) -> bool:
    return all(set(isr) == set(reps) for _, reps, isr in parts.values())


def preferred(parts: dict) -> bool:
    return all(leader == reps[0] for leader, reps, _ in parts.values())


@pytest.fixture
def demo_topic(kafka_cluster):
    """The demo's topic layout with the demo's producer writing to it (a lagging follower
    leaves the ISR only while writes flow); every broker running and in the ISR afterwards."""
    c = kafka_cluster
    if sorted(c.broker_ids) != [1, 2, 3]:
        pytest.skip(f"needs brokers 1, 2, 3 (the demo's layout); the cluster has {c.broker_ids}")
    topic = unique("demo.real")
    c.create_topic(topic, replica_assignment=REAL_ASSIGNMENT, config={"min.insync.replicas": REAL_MIN_ISR})
    stop = threading.Event()
    writer = threading.Thread(target=workload.produce_loop, args=(c.bootstrap_servers, stop),
                              kwargs={"topic": topic}, daemon=True)
    writer.start()
    try:
        yield c, topic
    finally:
        stop.set()
        for b in c.broker_ids:  # undo whatever a failed test left behind, from this (the owning) thread
            if c.managed and c.brokers[b].paused:
                c.resume_broker(b)
            if c.managed and not c.is_running(b):
                c.start_broker(b)
        writer.join(15)
        wait_for(lambda: whole(c.partitions(topic, timeout=3)), timeout=120, what=f"the ISR of {topic} whole")
        with contextlib.suppress(Exception):  # leave every partition (__consumer_offsets too) on its preferred leader
            c.elect_leaders("preferred")


def test_one_fault_cycle_shows_each_fault_in_the_cluster_metadata_and_recovers(demo_topic):
    c, topic = demo_topic
    lines: list[str] = []
    faults = FaultCycle(c, topic, threading.Event(), pause_s=1, one_down_s=1, two_down_s=1, effect_timeout_s=30,
                        recover_timeout_s=90, say=lines.append)
    try:
        # in this thread: brokers started again die with the thread that started them
        faults.run(every_s=0, first_after_s=0, min_gap_s=0, max_faults=3)
    finally:
        faults.restore()
    print("\n" + "\n".join(lines))
    by_fault: dict = {}
    for fault, _, parts in faults.history:
        by_fault.setdefault(fault, []).append(parts)
    assert set(by_fault) == {"pause", "stop-1", "stop-2"}, lines
    assert not [line for line in lines if "failed" in line or "did not show" in line], lines

    # 1. broker 3 (a follower of every partition, leader of none) paused: out of every ISR, leaders unchanged
    assert any(all(3 not in isr for _, _, isr in parts.values()) and preferred(parts) for parts in by_fault["pause"])
    assert whole(by_fault["pause"][-1]) and preferred(by_fault["pause"][-1])

    # 2. broker 1 (leader of partitions 0 and 2) stopped: its leaderships moved to broker 2, then came back
    assert any(parts[0][0] == 2 and parts[2][0] == 2 and all(1 not in isr for _, _, isr in parts.values())
               for parts in by_fault["stop-1"])
    assert whole(by_fault["stop-1"][-1]) and preferred(by_fault["stop-1"][-1]), by_fault["stop-1"][-1]

    # 3. brokers 2 and 3 stopped: every ISR down to [1], below min.insync.replicas; partition 1's leader moved
    assert any(all(isr == [1] for _, _, isr in parts.values()) and parts[1][0] == 1 for parts in by_fault["stop-2"])
    assert whole(by_fault["stop-2"][-1]) and preferred(by_fault["stop-2"][-1]), by_fault["stop-2"][-1]

    now = c.partitions(topic)
    assert whole(now) and preferred(now) and c.live_brokers() == {1, 2, 3}
    assert any("fault 1/3: pausing broker 3" in line and "IsrShrink" in line for line in lines), lines
    assert any("fault 3/3: stopping brokers 2 and 3" in line and "UnderMinIsr" in line for line in lines), lines
    assert sum(line.startswith("recovered (") for line in lines) == 3, lines


def test_a_stop_during_a_pause_resumes_the_broker_at_once(demo_topic):
    c, topic = demo_topic
    stop = threading.Event()
    faults = FaultCycle(c, topic, stop, pause_s=600, say=lambda _: None)
    t = threading.Thread(target=faults.pause_follower, daemon=True)
    t.start()
    try:
        wait_for(lambda: c.brokers[3].paused, timeout=30, what="broker 3 paused")
        stop.set()
        t.join(15)
        assert not t.is_alive()
        assert not c.brokers[3].paused and faults.paused == set()
        with open(f"/proc/{c.pid(3)}/stat") as f:
            assert f.read().split(")")[1].split()[0] != "T", "broker 3 is still stopped (SIGSTOP)"
    finally:
        if c.brokers[3].paused:
            c.resume_broker(3)


@pytest.fixture
def fake_run_demo(monkeypatch):
    calls = []
    monkeypatch.setattr("kafka_monitor.demo.run_demo", lambda **kw: calls.append(kw) or 0)
    return calls


@pytest.mark.parametrize("argv, want", [
    (["demo"], {"metrics_port": 9465, "duration_s": 0}),
    (["demo", "--real-cluster"], {"metrics_port": 9465, "duration_s": 0, "real_cluster": True, "fault_every_s": 120.0}),
    (["demo", "--real-cluster", "--fault-every", "45", "--duration", "300", "--metrics-port", "9999"],
     {"metrics_port": 9999, "duration_s": 300.0, "real_cluster": True, "fault_every_s": 45.0}),
    (["demo", "--real-cluster", "--fault-every", "0"],
     {"metrics_port": 9465, "duration_s": 0, "real_cluster": True, "fault_every_s": 0.0}),
])
def test_the_demo_flags_reach_run_demo(argv, want, fake_run_demo):
    assert cli.main(argv) == 0
    assert fake_run_demo == [want]


@pytest.mark.parametrize("argv, message", [
    (["demo", "--fault-every", "60"], "--fault-every needs --real-cluster"),
    (["demo", "--real-cluster", "--fault-every", "-1"], "--fault-every must be >= 0"),
])
def test_bad_demo_flags_exit_2(argv, message, fake_run_demo, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
    assert fake_run_demo == []


def test_missing_java_or_maven_is_an_error_message_and_a_non_zero_exit(monkeypatch, capsys, tmp_path):
    from kafka_monitor.local import kafka_install
    monkeypatch.setenv("PATH", str(tmp_path))  # neither java nor mvn on it
    monkeypatch.setenv("KAFKA_MONITOR_KAFKA_HOME", str(tmp_path / "kafka"))
    kafka_install.java_bin.cache_clear()
    try:
        assert cli.main(["demo", "--real-cluster"]) == 2
    finally:
        kafka_install.java_bin.cache_clear()
    err = capsys.readouterr().err
    assert "error: 'java' not found" in err and "openjdk-17-jre-headless" in err, err


def test_the_help_explains_the_real_cluster_demo(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    out = capsys.readouterr().out
    for word in ("--real-cluster", "--fault-every", "UnderMinIsr", "AtMinIsr", "LeaderChanged", "4 more JVMs"):
        assert word in out
