"""``kafka-monitor topics`` on the real cluster: the monitor's topics created as the README says
(replication factor 3, min.insync.replicas=1), left alone when they exist, a risky existing
setting named, and a cluster with too few brokers said clearly.  docker-compose.yml's kafka-init
runs this command (tests/compose/test_compose_stack.py starts it for real)."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from kafka_monitor import topics
from kafka_monitor.cli import main
from tests.conftest import unique

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def described(boot: str, name: str) -> dict:
    admin = AdminClient({"bootstrap.servers": boot})
    t = admin.list_topics(name, timeout=10).topics[name]
    res = ConfigResource(ConfigResource.Type.TOPIC, name)
    cfg = admin.describe_configs([res])[res].result(10)
    return {"partitions": len(t.partitions), "rf": {len(p.replicas) for p in t.partitions.values()},
            "min.insync.replicas": cfg["min.insync.replicas"].value, "retention.ms": cfg["retention.ms"].value}


def test_creates_both_topics_as_the_readme_says_then_leaves_them_alone(kafka_cluster, capsys):
    boot = kafka_cluster.bootstrap_servers
    events, alerts = unique("tc.events"), unique("tc.alerts")
    args = ["topics", "--bootstrap-servers", boot, "--events-topic", events, "--alerts-topic", alerts]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{events}: created" in out and f"{alerts}: created" in out, out
    assert described(boot, events) == {"partitions": topics.EVENTS_PARTITIONS, "rf": {3}, "min.insync.replicas": "1",
                                       "retention.ms": str(topics.EVENTS_RETENTION_MS)}
    assert described(boot, alerts) == {"partitions": topics.ALERTS_PARTITIONS, "rf": {3}, "min.insync.replicas": "1",
                                       "retention.ms": str(topics.ALERTS_RETENTION_MS)}
    assert main(args) == 0  # again: nothing to do
    captured = capsys.readouterr()
    assert f"{events}: exists (6 partitions, replication factor 3, min.insync.replicas 1); left as is" in captured.out
    assert "warning" not in captured.err


def test_an_existing_topic_with_min_insync_2_is_left_and_named(kafka_cluster, capsys):
    boot = kafka_cluster.bootstrap_servers
    events, alerts = unique("tc2.events"), unique("tc2.alerts")
    kafka_cluster.create_topic(events, partitions=2, config={"min.insync.replicas": 2})
    assert main(["topics", "--bootstrap-servers", boot, "--events-topic", events, "--alerts-topic", alerts]) == 0
    captured = capsys.readouterr()
    assert f"warning: {events}: min.insync.replicas=2 holds the monitor's writes up" in captured.err, captured.err
    assert described(boot, events)["min.insync.replicas"] == "2"  # not changed
    assert described(boot, alerts)["min.insync.replicas"] == "1"


def test_too_few_brokers_for_the_replication_factor_is_said_and_status_1(kafka_cluster, capsys):
    boot = kafka_cluster.bootstrap_servers
    rc = main(["topics", "--bootstrap-servers", boot, "--replication-factor", "4", "--wait", "2",
               "--events-topic", unique("tc3.events"), "--alerts-topic", unique("tc3.alerts")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "did not answer with 4 brokers within 2s (3 broker(s) registered)" in err and "--replication-factor" in err, err
