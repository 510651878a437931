"""The controller quorum on real clusters (issue 47): what the probe reports is what Kafka's own
``kafka-metadata-quorum describe --status`` says, on the suite's cluster (4.1.1, one controller)
and on Kafka 3.9.2 and 4.4.0 with three controllers and two log dirs per broker (the launcher's
shapes: voters, logging, replicas on both dirs); there the active controller is SIGKILLed, then
the next one SIGSTOPped past the election timeout: the probe sees each new leader, and its
answers, through the job's parser and quorum rules, open QuorumVoterLagging for the lost voter
and resolve it once the voter is back, with no QuorumUnavailable (two of three keep a majority).
Then the eligible leader replicas there: not available on 3.9.2, a paused follower's on 4.4.0
(tests/integration/test_elr.py)."""

from __future__ import annotations

import re
import threading
import time

import pyarrow as pa
import pytest

from kafka_monitor.local.kafka_cluster import CONTROLLER_ID, KafkaCluster
from monitor.contract import Event
from monitor.probe_config import ProbeConfig
from monitor.quorum import QuorumWatcher
from streaming.ingest.parsing import parse_values
from streaming.rules import quorum as rq
from tests.conftest import unique, wait_for
from tests.integration.test_elr import elr_below_min_isr
from tests.support.capture import capturing_probe, latest, of_type

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def tool_leader(cluster: KafkaCluster):
    try:
        return int(cluster.quorum_status()["LeaderId"])
    except Exception:  # noqa: BLE001 - no answer while it elects
        return None


def test_the_probe_reports_the_quorum_kafka_describes(kafka_cluster):
    kc = kafka_cluster
    cfg = ProbeConfig(bootstrap_servers=kc.bootstrap_servers, interval_s=1, quorum_interval_s=1,
                      topics_include="^$", cluster=unique("q"), source="probe-q")
    probe, cap = capturing_probe(cfg)
    stop = threading.Event()
    t = threading.Thread(target=probe.run, args=(stop,), daemon=True)
    t.start()
    try:
        def answered():
            ok = [e for e in of_type(cap.events, "quorum_state") if e.data.ok]
            refresh = latest(cap.events, "metadata_refresh")
            return ok and refresh is not None and refresh.data.controller_id is not None and (ok[-1], refresh)
        state, refresh = wait_for(answered, timeout=60, what="a quorum_state answered and a refresh naming the controller")
    finally:
        stop.set()
        t.join(20)
        probe.close(0)
    leader = tool_leader(kc)
    assert state.schema == "kafka-monitor/v2"
    assert state.data.leader_id == leader == refresh.data.controller_id
    if kc.managed:
        assert [v.replica_id for v in state.data.voters] == kc.controller_ids == [leader]
        assert {o.replica_id for o in state.data.observers} >= set(kc.broker_ids)
    assert all(r.lag is not None and r.lag >= 0 for r in state.data.voters + state.data.observers)
    brokers = of_type(cap.events, "broker_state")
    assert brokers and {b.data.is_controller for b in brokers[-len(kc.broker_ids):]} <= {False, None}


def rows_of(states: list) -> list[dict]:
    """The probe's quorum_state answers through the job's parser, as the state function gets them."""
    values = [Event.of(s, cluster="c", source="p", seq=i, observed_at=at).to_json().decode()
              for i, (at, s) in enumerate(states)]
    table = parse_values(pa.array(values), timestamps=pa.array([at for at, _ in states], pa.int64()))
    rows = table.to_pylist()
    assert all(r["reason"] is None for r in rows), [r["reason"] for r in rows]
    return rows


def rule_transitions(states: list) -> list[tuple[str, str]]:
    s = rq.new_quorum("c")
    out = []
    for r in rows_of(states):
        out += [(x.alert.value, x.action) for x in rq.on_quorum_state(s, r, r["observed_at"], "quorum|c")]
    return out


def voters_of(status: dict) -> list[int]:
    """The voter ids of ``describe --status`` (4.x prints objects with "id", 3.9 a list of ids)."""
    text = status["CurrentVoters"]
    return sorted(map(int, re.findall(r'"id":\s*(\d+)', text) or re.findall(r"\d+", text)))


@pytest.mark.parametrize("version", ["3.9.2", "4.4.0"])
def test_a_version_with_three_controllers_and_two_log_dirs_loses_its_active_controller_twice(version):
    """The launcher's shapes (one cluster per version, the suite's own is 4.1.1), then the quorum:
    the active controller SIGKILLed and started again, then the next one SIGSTOPped past the
    election timeout and resumed; each time the probe sees the new leader and the lost voter lag,
    and its answers through the job's parser and rules open QuorumVoterLagging and resolve it,
    nothing else (two voters of three keep a majority; two changes are not flapping)."""
    cluster = KafkaCluster(version=version, controllers=3, log_dirs=2)
    watcher = None
    try:
        cluster.start()
        ids = [CONTROLLER_ID, CONTROLLER_ID + 1, CONTROLLER_ID + 2]
        status = cluster.quorum_status()
        assert voters_of(status) == ids, status
        assert cluster.live_brokers() == {1, 2, 3}
        for n in cluster._nodes():  # its logging works (3.9: reload4j and a log4j.properties)
            assert (n.dir / "server.log").exists(), n.name
            assert "log4j:WARN No appenders" not in (n.dir / "stdout.log").read_text(errors="replace"), n.name
        cluster.create_topic("shapes", partitions=6, rf=3)
        for b in cluster.broker_ids:  # a follower makes its replica's directory a moment after the leader

            def held(b=b):
                return {d.name: sorted(p.name for p in d.glob("shapes-*")) for d in cluster.log_dirs_of(b)}
            wait_for(lambda: sum(map(len, held().values())) == 6, timeout=30, what=f"broker {b}'s 6 replicas")
            assert all(held().values()), (b, held())  # each dir holds some

        watcher = QuorumWatcher({"bootstrap.servers": cluster.bootstrap_servers}, interval_s=1, timeout_s=3)
        states: list = []

        def ask():
            states.append(watcher.ask())
            return states[-1][1]
        first = ask()
        assert first.ok and first.leader_id == int(status["LeaderId"]), first
        assert [v.replica_id for v in first.voters] == ids
        assert {o.replica_id for o in first.observers} >= {1, 2, 3}
        seen = {}
        leader = first.leader_id
        for fault in ("kill", "pause"):
            t0 = time.monotonic()
            if fault == "kill":
                cluster.kill_controller(leader)
            else:
                cluster.pause_controller(leader)  # past the election timeout (1 s): the others elect
            new = wait_for(lambda lost=leader: (lambda s: s.ok and s.leader_id not in (lost, -1) and s.leader_id)(ask()),
                           timeout=60, interval=0.5, what=f"the probe to see a new quorum leader ({fault})")
            seen[fault] = round(time.monotonic() - t0, 1)
            assert wait_for(lambda: tool_leader(cluster), timeout=120, interval=1, what="the tool's leader") == new
            faults = len(seen)
            wait_for(lambda n=faults: ask() and rule_transitions(states).count(("QuorumVoterLagging", "open")) == n,
                     timeout=60, interval=1, what="QuorumVoterLagging for the lost voter")
            if fault == "kill":
                cluster.start_controller(leader)
            else:
                cluster.resume_controller(leader)
            wait_for(lambda n=faults: ask() and rule_transitions(states).count(("QuorumVoterLagging", "resolve")) == n,
                     timeout=90, interval=1, what="every voter caught up again (QuorumVoterLagging resolved)")
            leader = new
        got = rule_transitions(states)
        print(f"\n{version}: the probe saw the new leader {seen['kill']} s after the kill, {seen['pause']} s after "
              f"the pause; {len(states)} answers -> {got}")
        assert got == [("QuorumVoterLagging", "open"), ("QuorumVoterLagging", "resolve")] * 2, got
        # eligible leader replicas on the same cluster: none on 3.9 (no such feature), on by default on 4.4
        figures = elr_below_min_isr(cluster, expect_elr=not version.startswith("3."))
        print(f"{version} ELR: {figures}")
    finally:
        if watcher is not None:
            watcher.stop()
        cluster.stop()
