"""A real Apache Kafka cluster (KRaft) on loopback, for tests, benchmarks and the demo.

One dedicated controller (``process.roles=controller``; ``controllers=3`` for a quorum of three)
and three brokers, each its own JVM, so that faults taking two brokers away still leave a metadata
quorum.  ``version`` picks one of ``kafka_install.KAFKA_RELEASES`` (3.9.2 logs through reload4j,
4.x through Log4j 2); ``log_dirs`` gives each broker that many log directories (JBOD).  ``combined=True`` runs
one node that is both (``process.roles=broker,controller``, one JVM): a second, cheap cluster
for tests that watch two; stopping its broker stops its controller too.  The jars come from
Maven Central through the ordinary Maven client (``mvn``) on first use and are cached
(``~/.cache/kafka-monitor/kafka-<version>``, or under ``$KAFKA_MONITOR_KAFKA_HOME``).  Settings make
replication react in seconds (see ``KafkaCluster.__init__``).  Every process is started by us,
in its own process group, asked to die with its parent, and stopped by PID.

``KafkaCluster(security="sasl_ssl")`` runs the same cluster secured: TLS with a CA and broker
certificate generated for 127.0.0.1/localhost, SCRAM-SHA-512 users created at format time, the
StandardAuthorizer with ``allow.everyone.if.no.acl.found=false`` on every node.  Clients connect
to the ``CLIENT`` listener (``bootstrap_servers``, ``client_conf(user)``); the brokers talk to each
other, and this module's own admin client to them, on an ``INTERNAL`` SASL_SSL listener as the
super user ``admin``; the brokers reach the controller over SASL_SSL with PLAIN (SCRAM credentials
live in the metadata log the controller serves, so the controller listener uses PLAIN, as Kafka's
KRaft examples do).

Its parts: ``kafka_install`` (the jars, Java, Maven); ``kafka_security`` (TLS, SCRAM, ACLs) and
``kafka_faults`` (broker faults, elections, reassignments, throttles), mixins of ``KafkaCluster``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from kafka_monitor.local.broker import _LIBC, die_with_parent, free_port, stop_process
from kafka_monitor.local.kafka_faults import CLEAN_EXITS, ClusterFaultsMixin
from kafka_monitor.local.kafka_install import KafkaRelease, ensure_kafka, java_bin, release
from kafka_monitor.local.kafka_security import (ADMIN_USER, SCRAM_MECHANISM, SECURITY_MODES, ClusterSecurityMixin,
                                                TlsFiles, _check_secret, _props)

CONTROLLER_ID = 100
BROKER_IDS = (1, 2, 3)
# lean JVMs for a small shared machine; C1 only roughly halves the start time on 2 cores
DEFAULT_JVM_OPTS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
                    "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")


class UnmanagedClusterError(RuntimeError):
    """A process-level operation was asked of a cluster this module did not start."""


# WARN, and at INFO what fences and unfences brokers: the controller's "Fencing broker N because
# its session has timed out" and a broker's lifecycle (``fencings``)
_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="error">
  <Appenders>
    <File name="file" fileName="${sys:kafka.logs.dir}/server.log">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="WARN"><AppenderRef ref="file"/></Root>
    <Logger name="org.apache.kafka.controller.ReplicationControlManager" level="INFO"/>
    <Logger name="org.apache.kafka.controller.ClusterControlManager" level="INFO"/>
    <Logger name="kafka.server.BrokerLifecycleManager" level="INFO"/>
  </Loggers>
</Configuration>
"""

# Kafka's request logger: a line per completed request at DEBUG (request_log=True), its own file;
# at WARN (the default) it writes nothing until set_request_log(True) turns it on at run time
_REQUESTS2_FILE = """    <File name="requests" fileName="${sys:kafka.logs.dir}/kafka-request.log">
      <PatternLayout pattern="%m%n"/>
    </File>
"""
_REQUESTS2 = """    <Logger name="kafka.request.logger" level="LEVEL" additivity="false"><AppenderRef ref="requests"/></Logger>
"""
_REQUESTS1 = """log4j.logger.kafka.request.logger=LEVEL, requests
log4j.additivity.kafka.request.logger=false
log4j.appender.requests=org.apache.log4j.FileAppender
log4j.appender.requests.File=${kafka.logs.dir}/kafka-request.log
log4j.appender.requests.layout=org.apache.log4j.PatternLayout
log4j.appender.requests.layout.ConversionPattern=%m%n
"""

# the same for the reload4j (Log4j 1.x) of Kafka 3.x
_LOG4J1 = """log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=${kafka.logs.dir}/server.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka.controller.ReplicationControlManager=INFO
log4j.logger.org.apache.kafka.controller.ClusterControlManager=INFO
log4j.logger.kafka.server.BrokerLifecycleManager=INFO
"""


@dataclass
class _Node:
    node_id: int
    role: str  # "controller" | "broker" | "broker,controller" (combined)
    port: int
    dir: Path
    proc: Optional[subprocess.Popen] = None
    paused: bool = False
    internal_port: Optional[int] = None  # secured cluster: the INTERNAL listener of a broker
    controller_port: Optional[int] = None  # combined node: its CONTROLLER listener (port is PLAINTEXT)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.node_id}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def process(self) -> subprocess.Popen:
        """The node's process (it has been launched)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc


def _die_hard_with_parent() -> None:  # runs in the child between fork and exec
    # SIGKILL, not SIGTERM: an orphaned broker in controlled shutdown waits for a dead controller
    die_with_parent()
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _wait_or_kill(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(max(0.0, timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _new_cluster_id() -> str:
    # kafka-storage reads an id starting with "-" as an option (1 in 64); Kafka's own Uuid skips those too
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class KafkaCluster(ClusterSecurityMixin, ClusterFaultsMixin):
    """Apache Kafka in KRaft mode on 127.0.0.1: one controller plus brokers, one JVM each."""

    _bootstrap: str  # an attached (unmanaged) cluster's bootstrap servers
    controller_id: Optional[int]  # None when attached
    controllers: dict[int, _Node]  # the quorum's voters by id (empty when attached)
    controller: _Node  # the first controller
    brokers: dict[int, _Node]

    def __init__(self, broker_ids: Sequence[int] = BROKER_IDS, controller_id: int = CONTROLLER_ID, *,
                 version: Optional[str] = None, controllers: int = 1, log_dirs: int = 1,
                 replica_lag_time_max_ms: int = 3000, replica_fetch_wait_max_ms: int = 200,
                 broker_session_timeout_ms: int = 8000, broker_heartbeat_interval_ms: int = 1000,
                 auto_leader_rebalance: bool = False,
                 broker_props: Optional[dict] = None, controller_props: Optional[dict] = None,
                 broker_heap: str = "384M", controller_heap: str = "256M",
                 jvm_opts: Sequence[str] = DEFAULT_JVM_OPTS,
                 work_dir: Optional[str] = None, keep_work_dir: bool = False,
                 security: Optional[str] = None, users: Optional[dict] = None, combined: bool = False,
                 request_log: bool = False):
        """``security``: None (PLAINTEXT) or ``"sasl_ssl"`` (see the module docstring); ``users``:
        ``{name: password}`` of the SCRAM-SHA-512 users to create besides ``admin`` (sasl_ssl only;
        they get no ACLs: ``add_acls``).  ``combined``: one node, broker and controller in one JVM
        (``broker_ids`` of one id, which is also the controller's; PLAINTEXT only).  Fewer than 3
        brokers lower the internal topics' replication factors to their number.  ``version``: a
        key of ``KAFKA_RELEASES`` (default ``kafka_install.default_version()``); ``controllers``:
        dedicated controllers, ids ``controller_id``, ``controller_id + 1``, ... (the static quorum
        ``controller.quorum.voters``); ``log_dirs``: log directories per broker (``log_dirs_of``).
        ``request_log``: each node logs every request it completes to ``kafka-request.log`` in its
        directory (``request_log_files``; Kafka's request logger: for benchmarks that count requests
        on the brokers, not for long runs)."""
        if combined and (len(broker_ids) != 1 or security or controllers != 1):
            raise ValueError("combined=True runs one node: one broker id, one controller and no security")
        if controllers < 1 or log_dirs < 1:
            raise ValueError(f"controllers and log_dirs must be >= 1, got {controllers} and {log_dirs}")
        if not combined and set(broker_ids) & set(range(controller_id, controller_id + controllers)):
            raise ValueError(f"broker ids {list(broker_ids)} overlap the controller ids "
                             f"{list(range(controller_id, controller_id + controllers))}")
        self.request_log = request_log
        self.release: KafkaRelease = release(version)
        self.version = self.release.version
        self.log_dirs = log_dirs
        if replica_fetch_wait_max_ms > replica_lag_time_max_ms:
            raise ValueError("replica.fetch.wait.max.ms must not exceed replica.lag.time.max.ms")
        if security not in SECURITY_MODES:
            raise ValueError(f"security must be one of {SECURITY_MODES}, got {security!r}")
        if users and security is None:
            raise ValueError("users need security='sasl_ssl'")
        self.security = security
        self.users: dict = {}
        if security:
            self.users[ADMIN_USER] = secrets.token_hex(16)
            for u, pw in (users or {}).items():
                if u == ADMIN_USER:
                    raise ValueError(f"{ADMIN_USER!r} is the cluster's own super user; choose another name")
                self.users[_check_secret("user name", u)] = _check_secret(f"password of {u}", pw)
        self.tls: Optional[TlsFiles] = None
        self.managed = True
        self.combined = combined
        self.broker_ids = list(broker_ids)
        if combined:
            controller_id = self.broker_ids[0]
        self.controller_id = controller_id
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="km-kafka-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._write_log_config()
        self.keep_work_dir = keep_work_dir
        self.broker_heap, self.controller_heap, self.jvm_opts = broker_heap, controller_heap, list(jvm_opts)
        self.cluster_id = _new_cluster_id()
        self.start_seconds: Optional[float] = None
        self._libs: Optional[Path] = None
        self._admin = self._observer_admin = None
        ports: list = []
        nb = len(self.broker_ids)
        nc = controllers
        while len(ports) < nc + nb * (2 if security else 1):
            port = free_port()
            if port not in ports:
                ports.append(port)
        if combined:
            node = _Node(controller_id, "broker,controller", ports[1], self.work_dir / f"node-{controller_id}",
                         controller_port=ports[0])
            self.controllers, self.brokers = {controller_id: node}, {controller_id: node}
        else:
            self.controllers = {controller_id + i: _Node(controller_id + i, "controller", ports[i],
                                                         self.work_dir / f"controller-{controller_id + i}")
                                for i in range(nc)}
            self.brokers = {b: _Node(b, "broker", p, self.work_dir / f"broker-{b}",
                                     internal_port=ports[nc + nb + i] if security else None)
                            for i, (b, p) in enumerate(zip(self.broker_ids, ports[nc:]))}
        #: the first controller (the only one unless ``controllers`` > 1)
        self.controller = self.controllers[controller_id]
        rf = min(3, nb)
        common = {
            "controller.quorum.voters": ",".join(f"{c}@127.0.0.1:{ports[i]}" for i, c in enumerate(self.controllers)),
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "broker.session.timeout.ms": broker_session_timeout_ms,  # read by the controller
            "broker.heartbeat.interval.ms": broker_heartbeat_interval_ms,
            "auto.leader.rebalance.enable": str(auto_leader_rebalance).lower(),  # read by the controller
            "num.network.threads": 2,
            "num.io.threads": 4,
        }
        self._controller_props = dict(common)
        self._broker_props = {
            **common,
            "inter.broker.listener.name": "PLAINTEXT",
            "replica.lag.time.max.ms": replica_lag_time_max_ms,
            "replica.fetch.wait.max.ms": replica_fetch_wait_max_ms,
            "default.replication.factor": rf,
            "num.partitions": 1,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 10,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min(2, rf),
            "transaction.state.log.num.partitions": 10,
            "group.initial.rebalance.delay.ms": 0,
            # no broker-level min.insync.replicas: rejected while ELR is on; set it per topic
        }
        if security:
            self._secure_props()
        self._controller_props.update(controller_props or {})
        self._broker_props.update(broker_props or {})


    # -- addresses

    @property
    def bootstrap_servers(self) -> str:
        if not self.managed:
            return self._bootstrap
        return ",".join(f"127.0.0.1:{n.port}" for n in self.brokers.values())

    bootstrap = bootstrap_servers

    @property
    def _harness_bootstrap(self) -> str:
        """Where this module's own admin client and tools connect: the INTERNAL listener of a
        secured cluster (as ``admin``), else the clients' listener."""
        if self.managed and self.security:
            return ",".join(f"127.0.0.1:{n.internal_port}" for n in self.brokers.values())
        return self.bootstrap_servers

    @property
    def controller_bootstrap(self) -> str:
        self._require_managed("controller_bootstrap")
        return self._controller_addresses(self.controllers.values())

    @staticmethod
    def _controller_addresses(nodes: Iterable[_Node]) -> str:
        return ",".join(f"127.0.0.1:{n.controller_port or n.port}" for n in nodes)

    @property
    def controller_ids(self) -> list[int]:
        """The quorum's voters (managed clusters)."""
        self._require_managed("controller_ids")
        return list(self.controllers)

    def log_dirs_of(self, broker_id: int) -> list[Path]:
        """A broker's log directories, in ``log.dirs`` order (the first also holds the metadata log)."""
        n = self._broker(broker_id)
        return [n.dir / "data"] + [n.dir / f"data-{i}" for i in range(2, self.log_dirs + 1)]

    def broker_address(self, broker_id: int) -> str:
        return f"127.0.0.1:{self._broker(broker_id).port}"

    def node_dir(self, node_id: int) -> Path:
        return self._node(node_id).dir

    def metadata_log_dir(self, node_id: Optional[int] = None) -> Path:
        """``__cluster_metadata-0`` of a node (default: the controller)."""
        node = self.controller if node_id is None else self._node(node_id)
        if node is None:
            raise UnmanagedClusterError("metadata_log_dir: an attached cluster has no node directories")
        return node.dir / "data" / "__cluster_metadata-0"

    def pid(self, node_id: int) -> Optional[int]:
        n = self._node(node_id)
        return n.process.pid if n.running() else None

    def is_running(self, node_id: int) -> bool:
        return self._node(node_id).running()

    # -- lifecycle

    @property
    def libs(self) -> Path:
        if self._libs is None:
            self._libs = ensure_kafka(self.version)
        return self._libs

    def _write_log_config(self) -> None:
        level = "DEBUG" if self.request_log else "WARN"
        if self.release.reload4j:
            (self.work_dir / "log4j.properties").write_text(_LOG4J1 + _REQUESTS1.replace("LEVEL", level))
        else:
            (self.work_dir / "log4j2.xml").write_text(
                _LOG4J2.replace("  </Loggers>", _REQUESTS2.replace("LEVEL", level) + "  </Loggers>").replace(
                    "  </Appenders>", _REQUESTS2_FILE + "  </Appenders>"))

    def request_log_files(self) -> list[Path]:
        """The brokers' request logs (``request_log=True``, or while ``set_request_log(True)``)."""
        return [n.dir / "kafka-request.log" for n in self.brokers.values()]

    def set_request_log(self, on: bool, timeout: float = 30.0) -> None:
        """Turn every broker's request logger on (DEBUG: a line per completed request, with its
        client id, the request and the answer, in ``request_log_files()``) or off (WARN), at run
        time: Kafka's dynamic broker loggers (IncrementalAlterConfigs of BROKER_LOGGER, as
        ``kafka-configs --entity-type broker-loggers`` does).  For a test's window of requests on
        the shared cluster; PLAINTEXT clusters only."""
        self._require_managed("set_request_log")
        if self.security:
            raise ValueError("set_request_log: PLAINTEXT clusters only")
        from kafka.admin import ConfigResource, ConfigResourceType

        from monitor.quorum import close_quietly, kafka_python_admin

        admin = kafka_python_admin({"bootstrap_servers": self.bootstrap_servers}, timeout, "kafka-monitor-harness")
        try:
            level = "DEBUG" if on else "WARN"
            out = admin.alter_configs([ConfigResource(ConfigResourceType.BROKER_LOGGER, str(b),
                                                      configs={"kafka.request.logger": level})
                                       for b in self.brokers], raise_on_unknown=False)
            failed = {k: v for kind in out.values() for k, v in (kind.items() if isinstance(kind, dict) else ())
                      if getattr(v, "errno", 0) or (isinstance(v, Exception))}
            if failed:
                raise RuntimeError(f"set_request_log({on}): {failed}")
        finally:
            close_quietly(admin)

    def start(self, timeout: float = 180.0) -> "KafkaCluster":
        """Format storage, launch every node in parallel, wait until all brokers are registered."""
        self._require_managed("start")
        _ = self.libs  # fetch (first run only) before the clock starts
        t0 = time.monotonic()
        nodes = self._nodes()
        scram = [a for u, pw in self.users.items() for a in ("--add-scram", f"{SCRAM_MECHANISM}=[name={u},password={pw}]")]
        for n in nodes:
            n.dir.mkdir(parents=True, exist_ok=True)
            props = {"controller": self._controller_props, "broker": self._broker_props,
                     "broker,controller": {**self._controller_props, **self._broker_props}}[n.role]
            if n.role == "controller":
                listener = f"CONTROLLER://127.0.0.1:{n.port}"
            elif n.controller_port:
                listener = f"PLAINTEXT://127.0.0.1:{n.port},CONTROLLER://127.0.0.1:{n.controller_port}"
            elif self.security:
                listener = f"CLIENT://127.0.0.1:{n.port},INTERNAL://127.0.0.1:{n.internal_port}"
            else:
                listener = f"PLAINTEXT://127.0.0.1:{n.port}"
            dirs = self.log_dirs_of(n.node_id) if "broker" in n.role else [n.dir / "data"]
            conf = {"process.roles": n.role, "node.id": n.node_id, "listeners": listener,
                    "log.dirs": ",".join(map(str, dirs)), **props}
            if n.role != "controller":  # a combined node advertises its broker listener only
                conf["advertised.listeners"] = listener.split(",CONTROLLER://")[0]
            path = n.dir / "server.properties"
            path.touch(mode=0o600)  # a secured node's file holds the admin password
            path.write_text(_props(conf))
        # SCRAM users go into the bootstrap metadata, which only the controller's format writes
        fmt = [self._java(n.dir, "128M", "kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                          "-c", str(n.dir / "server.properties"), *(scram if n.role == "controller" else ()),
                          out=n.dir / "format.log") for n in nodes]
        try:
            for n, p in zip(nodes, fmt):
                if p.wait(timeout) != 0:
                    raise RuntimeError(f"StorageTool format failed for {n.name}: {self._tail(n.dir / 'format.log')}")
            for n in nodes:
                self._launch(n)
            self.wait_ready(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except BaseException:
            for p in fmt:
                stop_process(p, 5)
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def wait_ready(self, timeout: float = 120.0, brokers: Optional[Iterable[int]] = None) -> None:
        """Poll DescribeCluster until the given brokers (default: all running ones) are registered."""
        want = set(brokers) if brokers is not None else {b for b, n in self.brokers.items() if n.running()}
        deadline = time.monotonic() + timeout
        seen: set = set()
        while True:
            self._check_alive()
            with contextlib.suppress(Exception):
                seen = self.live_brokers(request_timeout=2.0)
            if want <= seen:
                return
            if time.monotonic() > deadline:
                logs = "".join(f"\n--- {n.name}: the last lines of server.log ---\n{self._tail(n.dir / 'server.log', 8)}"
                               for n in self._nodes() if n.proc is not None)
                raise TimeoutError(f"brokers {sorted(want - seen)} not registered after {timeout:.0f}s "
                                   f"(registered: {sorted(seen)}); logs in {self.work_dir}{logs}")
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every node (brokers first, then the controller): SIGTERM, SIGKILL after ``timeout``."""
        self._admin = self._observer_admin = None
        if not self.managed:
            shutil.rmtree(self.work_dir, ignore_errors=True)  # tool logs only
            return
        brokers = [n for n in self.brokers.values() if n.running()]
        for n in brokers:  # in parallel: each controlled shutdown is mostly waiting
            self._signal(n, signal.SIGCONT)
            n.paused = False
            n.process.terminate()
        deadline = time.monotonic() + timeout
        for n in brokers:
            _wait_or_kill(n.process, deadline - time.monotonic())
        controllers = [n for n in self.controllers.values() if n.running()]
        for n in controllers:
            if n.paused:
                self._signal(n, signal.SIGCONT)
                n.paused = False
            n.process.terminate()
        for n in controllers:
            _wait_or_kill(n.process, timeout)
        if self._own_dir and not self.keep_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- cluster operations

    def admin(self):
        """A shared AdminClient on the brokers, for operations."""
        if self._admin is None:
            self._admin = self._new_admin(10000)
        return self._admin

    def _observer(self):
        # metadata polls: a request stuck on a paused broker times out (and disconnects) fast
        if self._observer_admin is None:
            self._observer_admin = self._new_admin(2000)
        return self._observer_admin

    def _new_admin(self, socket_timeout_ms: int):
        from confluent_kafka.admin import AdminClient
        secure = {}
        if self.managed and self.security:
            secure = {**self.client_conf(ADMIN_USER)}
        conf: dict[str, Any] = {"bootstrap.servers": self._harness_bootstrap, "socket.timeout.ms": socket_timeout_ms,
                                "socket.connection.setup.timeout.ms": 3000, "log_level": 0, "logger": _NullLogger(),
                                # after brokers were down, reconnect within a second (the default backs
                                # off to 10 s: longer than the harness's 10 s result waits)
                                "reconnect.backoff.max.ms": 1000,
                                **secure}
        return AdminClient(conf)

    def metadata(self, topic: Optional[str] = None, timeout: float = 2.0):
        """One Metadata response (``ClusterMetadata``: live brokers and topics with leader/replicas/isrs)."""
        return self._observer().list_topics(topic=topic, timeout=timeout)

    def live_brokers(self, request_timeout: float = 2.0) -> set:
        """Ids of registered, unfenced brokers (DescribeCluster); raises when no broker answers.

        librdkafka sends DescribeCluster to the controller of its cached metadata (on KRaft, a
        broker the last answer named at random).  After brokers were paused or restarted, that one
        may not come up within the timeout ("Timed out waiting for controller", seen in CI right
        after every broker had registered): then it is asked once more through a new client,
        whose first metadata names a live one."""
        from monitor.access import timed_out
        try:
            desc = self._observer().describe_cluster(request_timeout=request_timeout).result(request_timeout + 1)
        except Exception as e:
            if not timed_out(e):
                raise
            self._observer_admin = None
            desc = self._observer().describe_cluster(request_timeout=request_timeout).result(request_timeout + 1)
        return {n.id for n in desc.nodes}

    def partitions(self, topic: str, timeout: float = 2.0) -> dict:
        """``{partition: (leader, replicas, isr)}`` from one Metadata response (leader -1 when none)."""
        t = self.metadata(topic, timeout).topics.get(topic)
        if t is None or t.error is not None:
            raise RuntimeError(f"topic {topic!r}: {None if t is None else t.error}")
        return {p.id: (p.leader, list(p.replicas), list(p.isrs)) for p in t.partitions.values()}

    def create_topic(self, name: str, partitions: int = 1, rf: int = 3, config: Optional[dict] = None,
                     replica_assignment: Optional[list] = None, timeout: float = 30.0) -> None:
        """Create a topic and wait until every partition has a leader."""
        from confluent_kafka.admin import NewTopic
        if replica_assignment:
            nt = NewTopic(name, num_partitions=len(replica_assignment), replication_factor=-1,
                          replica_assignment=[list(r) for r in replica_assignment],
                          config={k: str(v) for k, v in (config or {}).items()})
            partitions = len(replica_assignment)
        else:
            nt = NewTopic(name, num_partitions=partitions, replication_factor=rf,
                          config={k: str(v) for k, v in (config or {}).items()})
        self.admin().create_topics([nt], request_timeout=timeout)[name].result(timeout)
        self._wait(lambda: self._all_led(name, partitions), timeout, f"leaders for {name}")

    def add_partitions(self, topic: str, total: int, replica_assignment: Optional[list] = None,
                       timeout: float = 30.0) -> None:
        """Grow a topic to ``total`` partitions and wait until they all have leaders."""
        from confluent_kafka.admin import NewPartitions
        args = [[list(r) for r in replica_assignment]] if replica_assignment else []
        self.admin().create_partitions([NewPartitions(topic, total, *args)], request_timeout=timeout)[topic].result(timeout)
        self._wait(lambda: self._all_led(topic, total), timeout, f"{total} led partitions of {topic}")

    def quorum_status(self) -> dict:
        """``kafka-metadata-quorum describe --status`` as ``{key: value}`` (LeaderId, LeaderEpoch, ...),
        asked of the controllers that run and are not paused: a paused one accepts the tool's
        connection and never answers, and the tool waits out its request timeout on it."""
        if self.managed:
            up = [n for n in self.controllers.values() if n.running() and not n.paused] or list(self.controllers.values())
            target = ["--bootstrap-controller", self._controller_addresses(up),
                      *self._command_config(controller=True)]
        else:
            target = ["--bootstrap-server", self.bootstrap_servers]
        try:
            out = self.run_tool("org.apache.kafka.tools.MetadataQuorumCommand", *target, "describe", "--status")
        except subprocess.TimeoutExpired:  # seen over SASL_SSL at load ~20 (CI): the tool hung its 60 s; once more
            out = self.run_tool("org.apache.kafka.tools.MetadataQuorumCommand", *target, "describe", "--status")
        return {m.group(1): m.group(2) for m in re.finditer(r"^(\w+):\s*(.*?)\s*$", out, re.M)}

    def active_controller(self) -> int:
        """The KRaft active controller (DescribeQuorum LeaderId), not DescribeCluster's random broker."""
        return int(self.quorum_status()["LeaderId"])

    def dump_metadata_log(self, node_id: Optional[int] = None) -> list:
        """The ``__cluster_metadata`` records of a node (default: the controller), via DumpLogSegments.

        Each record: ``{"offset", "create_time" (ms, controller clock), "epoch" (raft leader epoch),
        "type" (e.g. PARTITION_CHANGE_RECORD), "version", "data"}``; control records carry their
        raw text in ``"data"``."""
        segs = sorted(self.metadata_log_dir(node_id).glob("*.log"))
        if not segs:
            return []
        out = self.run_tool("kafka.tools.DumpLogSegments", "--cluster-metadata-decoder",
                            "--files", ",".join(map(str, segs)), heap="256M", timeout=120)
        return parse_metadata_dump(out)

    def run_tool(self, main_class: str, *args: str, heap: str = "128M", timeout: float = 60.0) -> str:
        """Run one of Kafka's Java tools on the cached classpath; return stdout, raise on failure."""
        log = Path(tempfile.mkstemp(prefix="tool-", suffix=".log", dir=self._tools_dir())[1])
        p = self._java(self._tools_dir(), heap, main_class, *args, out=None, capture=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_process(p, 5)
            raise
        log.write_text(out + err)
        if p.returncode != 0:
            raise RuntimeError(f"{main_class.rsplit('.', 1)[-1]} {' '.join(args)} failed ({p.returncode}): "
                               f"{(err or out).strip()[-2000:]}")
        return out

    # -- internals

    def _command_config(self, controller: bool = False) -> list:
        if not (self.managed and self.security):
            return []
        return ["--command-config", str(self.java_client_properties(controller))]

    def _require_managed(self, what: str) -> None:
        if not self.managed:
            raise UnmanagedClusterError(f"{what}() needs a cluster started by kafka_monitor.local.kafka_cluster, "
                                        f"not the external cluster at {self.bootstrap_servers}")

    def _nodes(self) -> list[_Node]:
        """Every node once (a combined node is the controller and the broker)."""
        return list({id(n): n for n in [*self.controllers.values(), *self.brokers.values()]}.values())

    def _node(self, node_id: int) -> _Node:
        if node_id in self.controllers:
            return self.controllers[node_id]
        return self._broker(node_id)

    def _broker(self, broker_id: int) -> _Node:
        try:
            return self.brokers[broker_id]
        except KeyError:
            raise KeyError(f"no broker {broker_id} (brokers: {self.broker_ids})") from None

    def _tools_dir(self) -> Path:
        d = self.work_dir / "tools"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _java(self, logs_dir: Path, heap: str, main_class: str, *args: str, out: Optional[Path],
              capture: bool = False, gc_log: Optional[Path] = None) -> subprocess.Popen:
        # Popen from the calling thread: the parent-death signal fires when *that thread* exits
        log_conf = (f"-Dlog4j.configuration=file:{self.work_dir / 'log4j.properties'}" if self.release.reload4j
                    else f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.xml'}")
        gc = [f"-Xlog:gc:file={gc_log}:time,uptime:filecount=2,filesize=2m"] if gc_log else []
        cmd = [java_bin(), f"-Xmx{heap}", *self.jvm_opts, *gc, log_conf, f"-Dkafka.logs.dir={logs_dir}",
               "-cp", str(self.libs / "*"), main_class, *args]
        if capture:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, cwd=logs_dir, preexec_fn=_die_hard_with_parent)
        if out is None:
            raise ValueError("_java: out= (the log file) is needed unless capture=True")
        with open(out, "ab") as f:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                    cwd=logs_dir, preexec_fn=_die_hard_with_parent)

    def _launch(self, n: _Node) -> None:
        heap = self.controller_heap if n.role == "controller" else self.broker_heap
        n.proc = self._java(n.dir, heap, "kafka.Kafka", str(n.dir / "server.properties"), out=n.dir / "stdout.log",
                            gc_log=n.dir / "gc.log")
        n.paused = False

    def _signal(self, n: _Node, sig: int) -> None:
        if not n.running():
            raise RuntimeError(f"{n.name} is not running")
        os.kill(n.process.pid, sig)

    def fencings(self, last: int = 5, pause_ms: float = 1000.0) -> list[str]:
        """For a failure's message: the controller's last fencings and unfencings of brokers, and
        every node's last garbage-collection pauses over ``pause_ms`` (a node frozen that long
        misses its heartbeats: a loaded machine can fence a broker no test stopped)."""
        out = []
        for n in self.controllers.values():
            out += [ln for ln in self._tail(n.dir / "server.log", 2000).splitlines()
                    if "Fencing broker" in ln or "nfenc" in ln][-last:]
        for n in self._nodes():
            slow = [ln for ln in self._tail(n.dir / "gc.log", 2000).splitlines()
                    if (m := re.search(r"([0-9.]+)ms$", ln)) and float(m.group(1)) > pause_ms][-last:]
            out += [f"{n.name} gc: {ln}" for ln in slow]
        return out

    def _check_alive(self) -> None:
        for n in self._nodes():
            if n.proc is not None and n.proc.poll() is not None and n.proc.returncode not in CLEAN_EXITS:
                raise RuntimeError(f"{n.name} exited with {n.proc.returncode}: {self._tail(n.dir / 'stdout.log')}"
                                   f"\n{self._tail(n.dir / 'server.log')}")

    @staticmethod
    def _tail(path: Path, lines: int = 20) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _all_led(self, topic: str, count: int, reads: int = 3) -> bool:
        """``count`` led partitions in ``reads`` Metadata responses in a row.  Each broker applies the
        metadata log on its own: right after a change one broker can still answer the old partition
        count (seen under load: 3 partitions, then 1 from the next response)."""
        for _ in range(reads):
            try:
                parts = self.partitions(topic, timeout=3)
            except Exception:
                return False
            if len(parts) != count or not all(leader >= 0 for leader, _, _ in parts.values()):
                return False
        return True

    @staticmethod
    def _wait(cond, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.1)

    # -- an existing cluster

    @classmethod
    def attach(cls, bootstrap_servers: str) -> "KafkaCluster":
        """A handle on a cluster started elsewhere: admin operations work, process faults raise
        ``UnmanagedClusterError``."""
        self = cls.__new__(cls)
        self.managed, self.combined = False, False
        self.security, self.users, self.tls = None, {}, None
        self._bootstrap = bootstrap_servers
        self._admin = self._observer_admin = None
        self._libs = None
        self.controller_id = None
        self.start_seconds = None
        self.jvm_opts = list(DEFAULT_JVM_OPTS)
        self.release = release()  # its tools run on the default version's jars
        self.version = self.release.version
        self.log_dirs = 0  # unknown
        self.work_dir = Path(tempfile.mkdtemp(prefix="km-kafka-ext-"))
        self._write_log_config()
        self.controller = None  # type: ignore[assignment]  # attached: no process handles
        self.controllers = {}
        self.brokers = {}
        self.broker_ids = sorted(self.live_brokers(request_timeout=10.0))  # raises if unreachable
        return self


class _NullLogger:
    """Swallows librdkafka logs (connection refused while nodes start or are stopped)."""

    def log(self, *a, **k):
        pass

    def __getattr__(self, name):
        return self.log


_BATCH = re.compile(r"^baseOffset: (\d+) .*?partitionLeaderEpoch: (-?\d+) .*?CreateTime: (-?\d+)")
_RECORD = re.compile(r"^\| offset: (\d+) CreateTime: (-?\d+) .*? payload: (.*)$")
_CONTROL = re.compile(r"^\| offset: (\d+) CreateTime: (-?\d+) .*?(\w+): (\{.*\})\s*$")


def parse_metadata_dump(text: str) -> list:
    """Records from ``DumpLogSegments --cluster-metadata-decoder`` output (see ``dump_metadata_log``)."""
    records: list[dict[str, Any]] = []
    epoch: Optional[int] = None
    for line in text.splitlines():
        m = _BATCH.match(line)
        if m:
            epoch = int(m.group(2))
            continue
        m = _RECORD.match(line)
        if m:
            rec: dict[str, Any] = {"offset": int(m.group(1)), "create_time": int(m.group(2)), "epoch": epoch}
            try:
                payload = json.loads(m.group(3))
                rec.update(type=payload.get("type"), version=payload.get("version"), data=payload.get("data"))
            except ValueError:
                rec.update(type="CONTROL", version=None, data=m.group(3))
            records.append(rec)
            continue
        m = _CONTROL.match(line)
        if m:
            records.append({"offset": int(m.group(1)), "create_time": int(m.group(2)), "epoch": epoch,
                            "type": "CONTROL", "version": None, "data": f"{m.group(3)}: {m.group(4)}"})
    return records
