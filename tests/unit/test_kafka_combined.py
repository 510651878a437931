"""The local cluster's node configurations, without Java: ``KafkaCluster(combined=True)`` (the
second, one-node cluster of the tests that watch two) and the default controller plus 3
brokers.  The processes are stand-ins; what Kafka makes of the files is tested where the
clusters really start (tests/support/kafka_cluster.py's fixtures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_monitor.local import kafka_cluster as kc


class FakeProc:
    """What the launcher asks of a process it started; never a real PID."""

    def __init__(self, main_class: str):
        self.main_class, self.returncode, self.terminated = main_class, None, 0
        self.pid = -1

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self.returncode = 0
        return self.returncode

    def terminate(self):
        self.terminated += 1
        self.returncode = -15

    def kill(self):
        self.returncode = -9


@pytest.fixture
def launched(monkeypatch, tmp_path):
    """Every Java process the launcher starts (format and node), as stand-ins."""
    procs: list[FakeProc] = []

    def java(self, logs_dir, heap, main_class, *args, out, capture=False, gc_log=None):
        p = FakeProc(main_class)
        if main_class == "kafka.Kafka":
            p.returncode = None  # a node runs until stopped
        procs.append(p)
        return p

    monkeypatch.setattr(kc, "ensure_kafka", lambda version=None: tmp_path)
    monkeypatch.setattr(kc.KafkaCluster, "_java", java)
    monkeypatch.setattr(kc.KafkaCluster, "wait_ready", lambda self, timeout=120.0, brokers=None: None)
    monkeypatch.setattr(kc.KafkaCluster, "_signal", lambda self, n, sig: None)
    return procs


def props(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def test_a_combined_cluster_is_one_node_that_is_broker_and_controller(launched):
    c = kc.KafkaCluster(broker_ids=(1,), combined=True).start()
    try:
        assert [p.main_class for p in launched] == ["kafka.tools.StorageTool", "kafka.Kafka"]
        node = c.brokers[1]
        assert c.controller is node and c.controller_id == 1 and node.controller_port not in (None, node.port)
        conf = props(c.node_dir(1) / "server.properties")
        assert conf["process.roles"] == "broker,controller" and conf["node.id"] == "1"
        assert conf["controller.quorum.voters"] == f"1@127.0.0.1:{node.controller_port}"
        assert conf["listeners"] == f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
        assert conf["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{node.port}"
        assert (conf["controller.listener.names"], conf["inter.broker.listener.name"]) == ("CONTROLLER", "PLAINTEXT")
        # one broker: the internal topics (consumer offsets, transactions) can be created
        assert {k: conf[k] for k in ("default.replication.factor", "offsets.topic.replication.factor",
                                     "transaction.state.log.replication.factor",
                                     "transaction.state.log.min.isr")} == dict.fromkeys(
            ("default.replication.factor", "offsets.topic.replication.factor",
             "transaction.state.log.replication.factor", "transaction.state.log.min.isr"), "1")
        assert c.bootstrap_servers == f"127.0.0.1:{node.port}"
        assert c.controller_bootstrap == f"127.0.0.1:{node.controller_port}"
        assert c.metadata_log_dir() == c.node_dir(1) / "data" / "__cluster_metadata-0"
    finally:
        c.stop()
    assert launched[1].terminated == 1 and not c.work_dir.exists()


def test_two_clusters_of_one_run_share_nothing(launched):
    a, b = kc.KafkaCluster(), kc.KafkaCluster(broker_ids=(1,), combined=True)
    try:
        assert a.cluster_id != b.cluster_id and a.work_dir != b.work_dir
        ports_a = {n.port for n in a._nodes()}
        ports_b = {n.port for n in b._nodes()} | {b.controller.controller_port}
        assert not ports_a & ports_b
    finally:
        for c in (a, b):
            c.stop()


def test_the_default_cluster_keeps_its_controller_and_three_brokers(launched):
    c = kc.KafkaCluster().start()
    try:
        assert sorted(p.main_class for p in launched) == ["kafka.Kafka"] * 4 + ["kafka.tools.StorageTool"] * 4
        ctrl = props(c.node_dir(kc.CONTROLLER_ID) / "server.properties")
        assert ctrl["process.roles"] == "controller" and "advertised.listeners" not in ctrl
        assert ctrl["listeners"] == f"CONTROLLER://127.0.0.1:{c.controller.port}"
        b1 = props(c.node_dir(1) / "server.properties")
        assert b1["process.roles"] == "broker" and b1["advertised.listeners"] == b1["listeners"]
        assert (b1["offsets.topic.replication.factor"], b1["transaction.state.log.min.isr"]) == ("3", "2")
        assert c.controller_bootstrap == f"127.0.0.1:{c.controller.port}"
    finally:
        c.stop()
    assert all(p.terminated == 1 for p in launched if p.main_class == "kafka.Kafka")


@pytest.mark.parametrize("kw", [{"broker_ids": (1, 2, 3)}, {"broker_ids": (1,), "security": "sasl_ssl"}])
def test_combined_is_one_plaintext_node(kw):
    with pytest.raises(ValueError, match="combined=True runs one node"):
        kc.KafkaCluster(combined=True, **kw)


def test_three_controllers_are_the_static_quorum_and_every_node_knows_them(launched):
    c = kc.KafkaCluster(controllers=3).start()
    try:
        assert c.controller_ids == [kc.CONTROLLER_ID, kc.CONTROLLER_ID + 1, kc.CONTROLLER_ID + 2]
        assert sorted(p.main_class for p in launched) == ["kafka.Kafka"] * 6 + ["kafka.tools.StorageTool"] * 6
        voters = ",".join(f"{i}@127.0.0.1:{c.controllers[i].port}" for i in c.controller_ids)
        for node in [*c.controller_ids, *c.broker_ids]:
            assert props(c.node_dir(node) / "server.properties")["controller.quorum.voters"] == voters
        assert c.controller_bootstrap == ",".join(f"127.0.0.1:{c.controllers[i].port}" for i in c.controller_ids)
        assert len({n.port for n in c._nodes()}) == 6
        c.kill_controller(kc.CONTROLLER_ID + 1)
        assert not c.is_running(kc.CONTROLLER_ID + 1) and c.is_running(kc.CONTROLLER_ID)
        with pytest.raises(KeyError, match="no controller 7"):
            c.kill_controller(7)
    finally:
        c.stop()
    assert all(p.returncode is not None for p in launched)


def test_log_dirs_are_the_brokers_own_and_the_controllers_keep_one(launched):
    c = kc.KafkaCluster(log_dirs=3).start()
    try:
        dirs = c.log_dirs_of(2)
        assert dirs == [c.node_dir(2) / "data", c.node_dir(2) / "data-2", c.node_dir(2) / "data-3"]
        assert props(c.node_dir(2) / "server.properties")["log.dirs"] == ",".join(map(str, dirs))
        assert props(c.node_dir(kc.CONTROLLER_ID) / "server.properties")["log.dirs"] == str(
            c.node_dir(kc.CONTROLLER_ID) / "data")
    finally:
        c.stop()


@pytest.mark.parametrize("version, conf, other", [("3.9.2", "log4j.properties", "log4j2.xml"),
                                                  ("4.4.0", "log4j2.xml", "log4j.properties")])
def test_each_version_logs_through_its_own_log4j(launched, version, conf, other):
    c = kc.KafkaCluster(version=version)
    try:
        assert c.version == version and (c.work_dir / conf).exists() and not (c.work_dir / other).exists()
        c.start()
        assert "kafka.logs.dir}/server.log" in (c.work_dir / conf).read_text()
    finally:
        c.stop()


def test_an_unknown_version_names_the_ones_the_launcher_runs(monkeypatch):
    from kafka_monitor.local.kafka_install import KafkaSetupError, default_version, kafka_home
    with pytest.raises(KafkaSetupError, match="3.9.2, 4.1.1, 4.4.0"):
        kc.KafkaCluster(version="3.8.0")
    monkeypatch.setenv("KAFKA_MONITOR_KAFKA_VERSION", "4.4.0")
    assert default_version() == "4.4.0" and kafka_home().name == "kafka-4.4.0"
    monkeypatch.setenv("KAFKA_MONITOR_KAFKA_VERSION", "5.0")
    with pytest.raises(KafkaSetupError, match="KAFKA_MONITOR_KAFKA_VERSION"):
        default_version()


@pytest.mark.parametrize("kw, message", [({"controllers": 0}, "must be >= 1"), ({"log_dirs": 0}, "must be >= 1"),
                                         ({"broker_ids": (1, 2, 101), "controllers": 2}, "overlap")])
def test_bad_shapes_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        kc.KafkaCluster(**kw)
