"""The controller quorum without a cluster: the probe's DescribeQuorum answer as a ``quorum_state``
(monitor/quorum.py, a fake admin behind its one call), the -X translation, and the job's rules
over such events (streaming/rules/quorum.py).  The real quorum: tests/integration/test_quorum.py."""

from __future__ import annotations

import json
import threading
import time

import pytest
from kafka import errors as kerr

from monitor.contract import NO_LEADER, Event, QuorumState
from monitor.quorum import QuorumConfigError, QuorumWatcher, error_kind, kafka_python_conf, quorum_state
from streaming.ingest.parsing import parse_values
from streaming.rules import quorum as rq
from streaming.rules.base import Alert

import pyarrow as pa

NOW = 1_800_000_000_000


def answer(leader=100, epoch=3, voters=((100, 50, 0), (101, 50, 0), (102, 50, 0)), observers=((1, 50, 0),), error=None):
    """A DescribeQuorum answer as kafka-python returns it: (id, log end offset, caught up ms ago)."""
    def rs(rows):
        return [{"replica_id": i, "replica_directory_id": None, "log_end_offset": leo,
                 "last_fetch_timestamp": NOW - (ago or 0), "last_caught_up_timestamp": -1 if ago is None else NOW - ago}
                for i, leo, ago in rows]
    return {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{
        "partition_index": 0, "leader_id": leader, "leader_epoch": epoch, "high_watermark": 50,
        "current_voters": rs(voters), "observers": rs(observers), "error": error}]}], "nodes": []}


def test_an_answer_becomes_the_leader_the_epoch_and_each_nodes_lag():
    s = quorum_state(answer(voters=((100, 50, 0), (101, 40, 7000), (102, 50, 0)), observers=((2, 48, 100),)), NOW, 10_000)
    assert (s.ok, s.leader_id, s.leader_epoch, s.high_watermark, s.interval_ms) == (True, 100, 3, 50, 10_000)
    assert [(r.replica_id, r.lag, r.last_caught_up_ms_ago) for r in s.voters] == [(100, 0, 0), (101, 10, 7000), (102, 0, 0)]
    assert [(r.replica_id, r.lag, r.last_fetch_ms_ago) for r in s.observers] == [(2, 2, 100)]
    election = quorum_state({**answer(leader=-1, epoch=-1)}, NOW, 10_000)
    assert (election.leader_id, election.leader_epoch) == (NO_LEADER, None)
    hw_unknown = answer()
    hw_unknown["topics"][0]["partitions"][0]["high_watermark"] = -1  # Kafka's "unknown", mid-election
    assert quorum_state(hw_unknown, NOW, 1).high_watermark is None
    assert quorum_state(answer(voters=((100, 50, None),)), NOW, 1).voters[0].last_caught_up_ms_ago is None
    bad = quorum_state(answer(error="NotLeaderOrFollowerError: ..."), NOW, 1)
    assert (bad.ok, bad.error_kind, bad.leader_id) == (False, "error", None)


def test_the_event_is_v2_and_reads_back():
    e = Event.of(quorum_state(answer(), NOW, 10_000), cluster="k", source="p", seq=0, observed_at=NOW)
    assert e.schema == "kafka-monitor/v2" and e.key() == "k"
    back = Event.from_json(e.to_json())
    assert back == e and isinstance(back.data, QuorumState)


@pytest.mark.parametrize("exc, kind", [(kerr.ClusterAuthorizationFailedError(), "permission"),
                                       (kerr.UnsupportedVersionError(), "unsupported"),
                                       (kerr.KafkaConnectionError(), "no_answer"), (kerr.KafkaTimeoutError(), "no_answer"),
                                       (kerr.UnknownError(), "error")])
def test_failures_are_told_apart(exc, kind):
    assert error_kind(exc) == kind


def test_librdkafka_security_settings_are_translated_or_refused_by_name():
    conf = kafka_python_conf({"bootstrap.servers": "a:1", "security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512",
                              "sasl.username": "u", "sasl.password": "p", "ssl.ca.location": "/ca.pem",
                              "ssl.endpoint.identification.algorithm": "none", "socket.timeout.ms": "5000"})
    assert conf == {"bootstrap_servers": "a:1", "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                    "sasl_plain_username": "u", "sasl_plain_password": "p", "ssl_cafile": "/ca.pem",
                    "ssl_check_hostname": False}
    with pytest.raises(QuorumConfigError, match="ssl.keystore.location"):
        kafka_python_conf({"ssl.keystore.location": "/k.p12"})
    with pytest.raises(QuorumConfigError, match="GSSAPI"):
        kafka_python_conf({"sasl.mechanisms": "GSSAPI"})


class FakeAdmin:
    def __init__(self, answers):
        self.answers, self.calls, self.closed = list(answers), 0, 0
        self.block = threading.Event()

    def describe_metadata_quorum(self):
        self.calls += 1
        a = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if a == "hang":
            self.block.wait(30)
        if isinstance(a, BaseException):
            raise a
        return a

    def close(self):
        self.closed += 1


def test_the_watcher_hands_each_answer_over_once_and_a_new_client_after_a_failure():
    admins: list[FakeAdmin] = []

    def factory():
        admins.append(FakeAdmin([kerr.KafkaConnectionError()] if not admins else [answer()]))
        return admins[-1]
    w = QuorumWatcher({"bootstrap.servers": "x:1"}, interval_s=1, timeout_s=1, admin_factory=factory)
    at, first = w.ask()
    assert (first.ok, first.error_kind) == (False, "no_answer") and admins[0].closed == 1
    at, second = w.ask()
    assert second.ok and second.leader_id == 100 and len(admins) == 2
    w.start()
    try:
        got = None
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            got = w.take()
            time.sleep(0.05)
        assert got is not None and got[1].ok
        assert w.take() is None  # handed over once
        assert w.controller_id(int(time.time() * 1000)) == 100
    finally:
        w.stop()


def test_a_hanging_request_is_reported_as_no_answer_once_per_interval():
    fake = FakeAdmin(["hang"])
    w = QuorumWatcher({}, interval_s=1, timeout_s=1, admin_factory=lambda: fake).start()
    try:
        time.sleep(2.3)
        got = w.take()
        assert got is not None and got[1].error_kind == "no_answer" and "unanswered" in got[1].error
        assert w.take() is None  # once per interval
    finally:
        fake.block.set()
        w.stop()


# ---------------------------------------------------------------------------------------------
# The job's rules
# ---------------------------------------------------------------------------------------------

CFG = rq.QuorumRulesConfig()


def ev(t, leader=100, epoch=3, voters=((100, 0, 0), (101, 0, 0), (102, 0, 0)), observers=((1, 0, 0),), ok=True,
       error_kind=None):
    """A flat row as the job's parser makes it: (id, lag, caught up ms ago)."""
    def rs(rows):
        return [{"replica_id": i, "lag": lag, "last_caught_up_ms_ago": ago, "last_fetch_ms_ago": 0} for i, lag, ago in rows]
    rep = {"ok": ok, "interval_ms": 10_000, "leader_id": leader if ok else None, "leader_epoch": epoch if ok else None,
           "high_watermark": 9, "voters": rs(voters) if ok else [], "observers": rs(observers) if ok else [],
           "error": None if ok else "boom", "error_kind": error_kind}
    return t, {"report": json.dumps(rep)}


def run(steps, cfg=CFG):
    s = rq.new_quorum("k")
    out = []
    for t, row in steps:
        out += [(x.at, x.alert.value, x.action) for x in rq.on_quorum_state(s, row, t, "quorum|k", cfg)]
    return out, s


def test_a_killed_voter_lags_then_recovers():
    dead = ((100, 0, 0), (101, 0, 0), (102, 30, 16_000))
    out, _ = run([ev(0), ev(10_000, voters=dead), ev(20_000, voters=dead), ev(30_000)])
    assert out == [(10_000, "QuorumVoterLagging", "open"), (30_000, "QuorumVoterLagging", "resolve")]


def test_no_leader_or_no_caught_up_majority_is_unavailable_after_its_hold():
    two_dead = ((100, 0, 0), (101, 30, 20_000), (102, 30, 20_000))
    out, _ = run([ev(0, leader=-1), ev(5_000, leader=-1), ev(10_000, leader=-1), ev(15_000)])
    assert out == [(10_000, "QuorumUnavailable", "open"), (15_000, "QuorumUnavailable", "resolve")]
    out, _ = run([ev(0, voters=two_dead), ev(10_000, voters=two_dead), ev(20_000)])
    assert ("QuorumUnavailable", "open") in [(a, b) for _, a, b in out] and out[-2:] == [
        (20_000, "QuorumUnavailable", "resolve"), (20_000, "QuorumVoterLagging", "resolve")]


def test_an_election_shorter_than_the_hold_opens_nothing_but_counts_a_change():
    out, s = run([ev(0), ev(3_000, leader=-1), ev(6_000, leader=101, epoch=4)])
    assert out == [] and s["changes"] == [[6_000, 101, 4]]


def test_the_monitors_blindness_is_not_the_quorums():
    out, s = run([ev(0, leader=-1)] + [ev(t, ok=False, error_kind="no_answer") for t in range(5_000, 60_000, 5_000)])
    assert out == [] and s["up"] is False
    out, _ = run([ev(t, ok=False, error_kind="error") for t in (0, 5_000, 10_000)])
    assert out == [(10_000, "QuorumUnavailable", "open")]


def test_leadership_flapping_opens_and_ages_out():
    steps = [ev(0)] + [ev(60_000 * i, leader=100 + i % 3, epoch=3 + i) for i in (1, 2, 3)] + [ev(700_000, epoch=6)]
    out, _ = run(steps)
    assert out == [(180_000, "QuorumLeaderFlapping", "open"), (700_000, "QuorumLeaderFlapping", "resolve")]


def test_a_broker_behind_the_metadata_log_is_named():
    out, s = run([ev(0, observers=((1, 0, 0), (2, 500, 31_000))), ev(10_000)])
    assert out == [(0, "BrokerMetadataLagging", "open"), (10_000, "BrokerMetadataLagging", "resolve")]
    t = rq.on_quorum_state(rq.new_quorum("k"), ev(0, observers=((2, 500, 31_000),))[1], 0, "quorum|k")
    assert t[0].alert is Alert.BROKER_METADATA_LAGGING and t[0].evidence["brokers"][0]["node"] == 2


def test_the_parser_keeps_a_quorum_state_as_one_row_of_the_clusters_quorum():
    e = Event.of(quorum_state(answer(), NOW, 10_000), cluster="k", source="p", seq=0, observed_at=NOW)
    row = parse_values(pa.array([e.to_json().decode()]), timestamps=pa.array([NOW], pa.int64())).to_pylist()[0]
    assert row["reason"] is None, row["reason"]
    assert (row["entity"], row["bucket_key"], row["type"]) == ("quorum|k", "k", "quorum_state")
    rep = json.loads(row["report"])
    assert rep["leader_id"] == 100 and [v["replica_id"] for v in rep["voters"]] == [100, 101, 102]


def test_a_cluster_without_describe_quorum_is_said_once_and_sends_nothing(caplog):
    fake = FakeAdmin([kerr.UnsupportedVersionError("DescribeQuorum")])
    w = QuorumWatcher({}, interval_s=1, timeout_s=1, admin_factory=lambda: fake)
    for _ in range(3):
        w._latest = w.ask()
        assert w.take() is None
    assert sum("does not answer DescribeQuorum" in r.message for r in caplog.records) == 1


def test_a_client_that_cannot_bootstrap_leaves_no_thread_behind():
    """kafka-python 3.0 leaves a KafkaAdminClient that failed to bootstrap running (its IO thread,
    still connecting); the watchers and the named metadata make a new client after each failure,
    so kafka_python_admin stops it: no thread per failed attempt."""
    import socket

    from monitor.quorum import kafka_python_admin

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = {t.ident for t in threading.enumerate()}
    for _ in range(3):
        with pytest.raises(Exception, match="bootstrap"):
            kafka_python_admin({"bootstrap_servers": f"127.0.0.1:{port}"}, 0.5, "leak-test")
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert left == []
