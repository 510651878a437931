"""The launcher runs the shapes users run (issue 47): Kafka 3.9.2 (reload4j) and 4.4.0 (the suite's
own cluster is 4.1.1), each with a quorum of three dedicated controllers and two log dirs per
broker, started for real.  What each test asserts is what Kafka itself reports: the quorum's
voters and leader (``kafka-metadata-quorum describe --status``), the brokers registered
(DescribeCluster), replicas spread over both log dirs on disk, and a new quorum leader after the
active controller is SIGKILLed, the cluster still creating topics."""

from __future__ import annotations

import re

import pytest

from kafka_monitor.local.kafka_cluster import CONTROLLER_ID, KafkaCluster
from tests.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def voters(status: dict) -> list[int]:
    """The voter ids of ``describe --status`` (4.x prints objects with "id", 3.9 a list of ids)."""
    text = status["CurrentVoters"]
    return sorted(map(int, re.findall(r'"id":\s*(\d+)', text) or re.findall(r"\d+", text)))


def leader_or_none(cluster: KafkaCluster):
    try:
        return int(cluster.quorum_status()["LeaderId"])
    except Exception:  # noqa: BLE001 - no quorum answer while it elects
        return None


@pytest.mark.parametrize("version", ["3.9.2", "4.4.0"])
def test_a_version_runs_with_three_controllers_and_two_log_dirs(version, tmp_path):
    cluster = KafkaCluster(version=version, controllers=3, log_dirs=2)
    try:
        cluster.start()
        ids = [CONTROLLER_ID, CONTROLLER_ID + 1, CONTROLLER_ID + 2]
        status = cluster.quorum_status()
        assert voters(status) == ids, status
        leader = int(status["LeaderId"])
        assert leader in ids and cluster.live_brokers() == {1, 2, 3}

        # its logging works: a server.log per node, no "no appenders" warning from log4j 1.x
        for n in cluster._nodes():
            assert (n.dir / "server.log").exists(), n.name
            assert "log4j:WARN No appenders" not in (n.dir / "stdout.log").read_text(errors="replace"), n.name

        cluster.create_topic("shapes", partitions=6, rf=3)
        for b in cluster.broker_ids:  # a follower makes its replica's directory a moment after the leader

            def held(b=b):
                return {d.name: sorted(p.name for p in d.glob("shapes-*")) for d in cluster.log_dirs_of(b)}
            wait_for(lambda: sum(map(len, held().values())) == 6, timeout=30, what=f"broker {b}'s 6 replicas")
            assert all(held().values()), (b, held())  # each dir holds some

        cluster.kill_controller(leader)
        new = wait_for(lambda: (lambda x: x if x not in (None, leader) else None)(leader_or_none(cluster)),
                       timeout=60, what="a new quorum leader after the active controller was killed")
        assert new in ids
        cluster.create_topic("after-failover", partitions=1, rf=3)
        cluster.start_controller(leader)
        assert cluster.is_running(leader)
    finally:
        cluster.stop()
