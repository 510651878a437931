"""The probe's coordinator requests asked from a child process (monitor.coordinator), against
librdkafka's mock cluster: why the child exists (librdkafka 2.16 kills the process whose admin
client gets a coordinator error for ListConsumerGroupOffsets), and that the answer survives it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from monitor.coordinator import CoordinatorClient
from tests.support.mock_cluster import ApiKey, Err, MockCluster

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def mock():
    with MockCluster(brokers=3) as mc:
        mc.create_topic("orders", 3, 3)
        for gid, off in (("g1", 5), ("g2", 7)):
            c = Consumer({"bootstrap.servers": mc.bootstrap, "group.id": gid, "enable.auto.commit": False})
            try:
                c.commit(offsets=[TopicPartition("orders", 0, off)], asynchronous=False)
            finally:
                c.close()
        yield mc


@pytest.fixture
def offsets(mock):
    co = CoordinatorClient({"bootstrap.servers": mock.bootstrap, "log_level": 0}, 10)
    try:
        yield co
    finally:
        mock.clear_request_errors(ApiKey.OFFSET_FETCH)
        co.close()


ASKED = {"g1": [("orders", 0)], "g2": [("orders", 0)]}  # the mock answers "all partitions" with none


@pytest.mark.parametrize("error", [Err.NOT_COORDINATOR, Err.COORDINATOR_NOT_AVAILABLE])
def test_an_in_process_admin_client_dies_of_a_coordinator_error_on_list_consumer_group_offsets(mock, error):
    """The reason for the child process: if this starts failing, librdkafka no longer crashes
    (its issue #5315; the NULL is the admin client's consumer-group handle) and the child can go."""
    script = textwrap.dedent(f"""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import AdminClient
        a = AdminClient({{"bootstrap.servers": {mock.bootstrap!r}, "log_level": 0}})
        req = ConsumerGroupTopicPartitions("g1", [TopicPartition("orders", 0)])
        print(a.list_consumer_group_offsets([req], request_timeout=10)["g1"].result().topic_partitions[0].offset,
              flush=True)
        try:
            a.list_consumer_group_offsets([req], request_timeout=10)["g1"].result()
        except Exception as e:
            print("answered:", e, flush=True)
    """)
    # the first request is answered; the error goes to the second one
    mock.push_request_errors(ApiKey.OFFSET_FETCH, [Err.NO_ERROR, error])
    try:
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    finally:
        mock.clear_request_errors(ApiKey.OFFSET_FETCH)
    assert r.stdout.splitlines() == ["5"], r.stdout + r.stderr
    assert r.returncode == -11, (r.returncode, r.stdout, r.stderr)


def test_committed_offsets_come_from_the_child(offsets):
    assert offsets.committed(ASKED) == {"g1": [("orders", 0, 5, None)], "g2": [("orders", 0, 7, None)]}
    first = offsets._proc
    assert first is not None and first.poll() is None
    assert offsets.committed({"g2": [("orders", 0)]}) == {"g2": [("orders", 0, 7, None)]}
    assert offsets._proc is first and offsets.deaths == 0  # one child serves every cycle


def test_a_child_killed_by_a_coordinator_error_is_replaced_and_the_groups_asked_again(mock, offsets, caplog):
    assert offsets.committed(ASKED)["g1"] == [("orders", 0, 5, None)]
    first = offsets._proc
    mock.push_request_errors(ApiKey.OFFSET_FETCH, [Err.NOT_COORDINATOR])
    assert offsets.committed(ASKED) == {"g1": [("orders", 0, 5, None)], "g2": [("orders", 0, 7, None)]}
    assert offsets.deaths == 1 and offsets._proc is not first and first.returncode == -11
    assert "died (signal 11; 1 so far)" in caplog.text and "asking again" in caplog.text


def test_a_second_death_answers_every_group_with_an_error_and_the_next_cycle_recovers(mock, offsets):
    mock.push_request_errors(ApiKey.OFFSET_FETCH, [Err.NOT_COORDINATOR, Err.COORDINATOR_NOT_AVAILABLE])
    got = offsets.committed({"g1": [("orders", 0)]})  # one request per child: each takes one error
    assert list(got) == ["g1"] and offsets.deaths == 2
    for answer in got.values():
        assert isinstance(answer, KafkaException) and "died twice" in str(answer)
    assert offsets.committed(ASKED)["g2"] == [("orders", 0, 7, None)]


def test_a_group_level_error_the_child_survives_is_that_groups_answer(mock, offsets):
    mock.push_request_errors(ApiKey.OFFSET_FETCH, [Err.COORDINATOR_LOAD_IN_PROGRESS])
    got = offsets.committed({"g1": [("orders", 0)]})
    assert isinstance(got["g1"], KafkaException) and got["g1"].args[0].code() == Err.COORDINATOR_LOAD_IN_PROGRESS
    assert offsets.deaths == 0


def test_close_ends_the_child(offsets):
    offsets.committed({"g1": [("orders", 0)]})
    proc = offsets._proc
    offsets.close()
    assert proc.returncode == 0 and offsets._proc is None


def test_a_group_description_and_its_error_cross_from_the_child(offsets):
    """The mock has no DescribeGroups; its refusal comes back as that group's answer (the real
    cluster's descriptions: tests/integration/test_probe_kafka.py)."""
    got = offsets.described(["g1"])
    assert list(got) == ["g1"] and isinstance(got["g1"], KafkaException)
    assert got["g1"].args[0].code() == KafkaError._UNSUPPORTED_FEATURE and offsets.deaths == 0


def test_a_child_whose_requests_keep_timing_out_is_replaced():
    """Seen on the real cluster: after a coordinator's broker was paused and resumed, the child's
    client went on timing out that group's requests while the broker answered everyone else.
    Here no broker answers at all (nothing listens on the port): every answer is a timeout by the
    wait, and after STUCK_AFTER_TIMEOUTS request timeouts in a row the child is replaced."""
    import socket
    import time

    from monitor.coordinator import STUCK_AFTER_TIMEOUTS

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    co = CoordinatorClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0}, 0.5)
    try:
        first = None
        deadline = time.monotonic() + 30
        while co.replaced == 0 and time.monotonic() < deadline:
            got = co.ask({"committed": {"g1": None}}, wait_s=0.3)["committed"]["g1"]
            assert isinstance(got, KafkaException) and got.args[0].code() == KafkaError._TIMED_OUT, got
            first = first or co._proc
        assert co.replaced == 1 and co._proc is None  # the next ask starts a new child
        assert time.monotonic() - (deadline - 30) >= STUCK_AFTER_TIMEOUTS * 0.5
        co.ask({"committed": {"g1": None}}, wait_s=0.3)
        assert co._proc is not None and co._proc is not first
    finally:
        co.close()
