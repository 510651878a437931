"""A real Apache Kafka cluster (KRaft) on loopback, for tests, benchmarks and the demo.

One dedicated controller (``process.roles=controller``) and three brokers, each its own JVM,
so that faults taking two brokers away still leave a metadata quorum.  The jars come from
Maven Central through the ordinary Maven client (``mvn``) on first use and are cached
(``~/.cache/kafka-monitor/kafka-<version>``, or ``$KAFKA_MONITOR_KAFKA_HOME``).  Settings make
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
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from kafka_monitor.broker import _LIBC, die_with_parent, free_port, stop_process

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.24.3"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_INSTALL_HINT = "install the Debian packages openjdk-17-jre-headless and maven (apt-get install openjdk-17-jre-headless maven)"

CONTROLLER_ID = 100
BROKER_IDS = (1, 2, 3)
# lean JVMs for a small shared machine; C1 only roughly halves the start time on 2 cores
DEFAULT_JVM_OPTS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
                    "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")


#: ``KafkaCluster(security=...)``: None (PLAINTEXT everywhere) or "sasl_ssl"
SECURITY_MODES = (None, "sasl_ssl")
#: the super user of a secured cluster (inter-broker, controller, this module's admin client)
ADMIN_USER = "admin"
SCRAM_MECHANISM = "SCRAM-SHA-512"
_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


class KafkaSetupError(RuntimeError):
    """Java or Maven missing, or the Kafka jars could not be fetched."""


class UnmanagedClusterError(RuntimeError):
    """A process-level operation was asked of a cluster this module did not start."""


# ---------------------------------------------------------------- artifacts

def kafka_home() -> Path:
    """Cache directory for this Kafka version's jars."""
    env = os.environ.get("KAFKA_MONITOR_KAFKA_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kafka-monitor" / f"kafka-{KAFKA_VERSION}"


@functools.lru_cache(maxsize=None)
def java_bin() -> str:
    java = shutil.which("java")
    if java is None:
        raise KafkaSetupError(f"'java' not found (Apache Kafka {KAFKA_VERSION} needs Java 17+): {_INSTALL_HINT}")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):
        major = int(m.group(2))
    if major < 17:
        raise KafkaSetupError(f"Apache Kafka {KAFKA_VERSION} needs Java 17+, found: {out.splitlines()[:1]}; {_INSTALL_HINT}")
    return java


_POM = """<project>
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.kafka-monitor</groupId><artifactId>kafka-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_{scala}</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="error">
  <Appenders>
    <File name="file" fileName="${sys:kafka.logs.dir}/server.log">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="WARN"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


def ensure_kafka(home: Optional[Path] = None) -> Path:
    """Fetch the Kafka jars with ``mvn`` into ``<home>/libs`` unless already there; return ``libs``.

    A second call (or another process, after the first finished) is a no-op."""
    home = Path(home) if home else kafka_home()
    libs = home / "libs"
    done = home / ".complete"
    if done.exists() and (libs / f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar").exists():
        return libs
    java_bin()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaSetupError(f"'mvn' (Maven) not found; it fetches Apache Kafka {KAFKA_VERSION} from Maven Central: {_INSTALL_HINT}")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time; the others wait and reuse it
        if done.exists() and (libs / f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar").exists():
            return libs
        print(f"[kafka] fetching Apache Kafka {KAFKA_VERSION} from Maven Central (first run only)...", file=sys.stderr, flush=True)
        (home / "pom.xml").write_text(_POM.format(scala=SCALA_VERSION, kafka=KAFKA_VERSION, log4j=LOG4J_VERSION))
        tmp = home / "libs.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        proc = subprocess.run(
            [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(home / "pom.xml"), f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
             f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0 or not any(tmp.glob(f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar")):
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise KafkaSetupError(
                f"mvn could not fetch Apache Kafka {KAFKA_VERSION} from Maven Central (exit {proc.returncode}); "
                f"is Maven Central reachable from here (proxies go in ~/.m2/settings.xml)?\n{tail}")
        shutil.rmtree(libs, ignore_errors=True)
        tmp.rename(libs)
        done.write_text(KAFKA_VERSION + "\n")
    return libs


# ---------------------------------------------------------------- security

@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a generated CA and one server certificate signed by it."""
    ca: Path        # the CA certificate: clients' ssl.ca.location, Kafka's PEM truststore
    cert: Path      # the server certificate followed by the CA certificate
    key: Path       # the server's private key (PKCS#8, not encrypted)
    keystore: Path  # key + chain in one file: Kafka's ssl.keystore.type=PEM


def make_tls_files(directory: Path, hosts: Sequence[str] = ("localhost", "127.0.0.1"), days: int = 7,
                   name: str = "server") -> TlsFiles:
    """A throw-away CA and a certificate for ``hosts`` (DNS names and IP addresses as subject
    alternative names), written as PEM into ``directory`` (created, mode 0700)."""
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as e:  # a dev extra (pyproject.toml)
        raise KafkaSetupError(f"generating test certificates needs the 'cryptography' package: {e}") from None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)

    def key():
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kafka-monitor test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    sans: list = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    srv_key = key()
    srv = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else name)]))
           .issuer_name(ca_name).public_key(srv_key.public_key()).serial_number(x509.random_serial_number())
           .not_valid_before(start).not_valid_after(end)
           .add_extension(x509.SubjectAlternativeName(sans), critical=False)
           .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                          critical=False)
           .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
           .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    ca_pem, srv_pem = ca.public_bytes(pem), srv.public_bytes(pem)
    key_pem = srv_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    files = TlsFiles(ca=directory / "ca.pem", cert=directory / f"{name}.pem", key=directory / f"{name}.key",
                     keystore=directory / f"{name}.keystore.pem")
    for path, data in ((files.ca, ca_pem), (files.cert, srv_pem + ca_pem), (files.key, key_pem),
                       (files.keystore, key_pem + srv_pem + ca_pem)):
        path.write_bytes(data)
        path.chmod(0o600 if path in (files.key, files.keystore) else 0o644)
    return files


@dataclass(frozen=True)
class Acl:
    """One ALLOW ACL of a user: ``operation`` on ``resource`` ``name`` (``pattern`` literal or
    prefixed).  ``resource``: topic, group, cluster (name ``kafka-cluster``), transactional_id;
    ``operation``: read, write, describe, describe_configs, idempotent_write, ... (Kafka's
    AclOperation names, any case)."""
    resource: str
    name: str
    operation: str
    pattern: str = "literal"

    def __str__(self) -> str:
        what = {"topic": "Topic", "group": "Group", "cluster": "Cluster",
                "transactional_id": "TransactionalId"}.get(self.resource.lower(), self.resource)
        star = "*" if self.pattern.lower() == "prefixed" else ""
        return f"{self.operation.upper()} on {what}:{self.name}{star}"

    def binding(self, user: str):
        from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
        return AclBinding(ResourceType[self.resource.upper()], self.name, ResourcePatternType[self.pattern.upper()],
                          f"User:{user}", "*", AclOperation[self.operation.upper()], AclPermissionType.ALLOW)

    def binding_filter(self, user: str):
        from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
        return AclBindingFilter(ResourceType[self.resource.upper()], self.name, ResourcePatternType[self.pattern.upper()],
                                f"User:{user}", "*", AclOperation[self.operation.upper()], AclPermissionType.ALLOW)


def _check_secret(what: str, value: str) -> str:
    # the values go into JAAS strings and StorageTool's --add-scram syntax unquoted
    if not value or not re.fullmatch(r"[A-Za-z0-9_.@+-]+", value):
        raise ValueError(f"{what}: letters, digits and _.@+- only (got {len(value or '')} characters)")
    return value


# ---------------------------------------------------------------- cluster

@dataclass
class _Node:
    node_id: int
    role: str  # "controller" | "broker"
    port: int
    dir: Path
    proc: Optional[subprocess.Popen] = None
    paused: bool = False
    internal_port: Optional[int] = None  # secured cluster: the INTERNAL listener of a broker

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


def _props(d: dict) -> str:
    return "".join(f"{k}={v}\n" for k, v in d.items())


class KafkaCluster:
    """Apache Kafka in KRaft mode on 127.0.0.1: one controller plus brokers, one JVM each."""

    _bootstrap: str  # an attached (unmanaged) cluster's bootstrap servers
    controller_id: Optional[int]  # None when attached

    def __init__(self, broker_ids: Sequence[int] = BROKER_IDS, controller_id: int = CONTROLLER_ID, *,
                 replica_lag_time_max_ms: int = 3000, replica_fetch_wait_max_ms: int = 200,
                 broker_session_timeout_ms: int = 8000, broker_heartbeat_interval_ms: int = 1000,
                 auto_leader_rebalance: bool = False,
                 broker_props: Optional[dict] = None, controller_props: Optional[dict] = None,
                 broker_heap: str = "384M", controller_heap: str = "256M",
                 jvm_opts: Sequence[str] = DEFAULT_JVM_OPTS,
                 work_dir: Optional[str] = None, keep_work_dir: bool = False,
                 security: Optional[str] = None, users: Optional[dict] = None):
        """``security``: None (PLAINTEXT) or ``"sasl_ssl"`` (see the module docstring); ``users``:
        ``{name: password}`` of the SCRAM-SHA-512 users to create besides ``admin`` (sasl_ssl only;
        they get no ACLs: ``add_acls``)."""
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
        self.controller_id = controller_id
        self.broker_ids = list(broker_ids)
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="km-kafka-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "log4j2.xml").write_text(_LOG4J2)
        self.keep_work_dir = keep_work_dir
        self.broker_heap, self.controller_heap, self.jvm_opts = broker_heap, controller_heap, list(jvm_opts)
        self.cluster_id = _new_cluster_id()
        self.start_seconds: Optional[float] = None
        self._libs: Optional[Path] = None
        self._admin = self._observer_admin = None
        ports: list = []
        nb = len(self.broker_ids)
        while len(ports) < 1 + nb * (2 if security else 1):
            port = free_port()
            if port not in ports:
                ports.append(port)
        self.controller = _Node(controller_id, "controller", ports[0], self.work_dir / f"controller-{controller_id}")
        self.brokers = {b: _Node(b, "broker", p, self.work_dir / f"broker-{b}",
                                 internal_port=ports[1 + nb + i] if security else None)
                        for i, (b, p) in enumerate(zip(self.broker_ids, ports[1:]))}
        common = {
            "controller.quorum.voters": f"{controller_id}@127.0.0.1:{self.controller.port}",
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
            "default.replication.factor": 3,
            "num.partitions": 1,
            "offsets.topic.replication.factor": 3,
            "offsets.topic.num.partitions": 10,
            "transaction.state.log.replication.factor": 3,
            "transaction.state.log.min.isr": 2,
            "transaction.state.log.num.partitions": 10,
            "group.initial.rebalance.delay.ms": 0,
            # no broker-level min.insync.replicas: rejected while ELR is on; set it per topic
        }
        if security:
            self._secure_props()
        self._controller_props.update(controller_props or {})
        self._broker_props.update(broker_props or {})

    def _secure_props(self) -> None:
        """SASL_SSL everywhere: CLIENT (SCRAM-SHA-512) for clients, INTERNAL (SCRAM-SHA-512, as
        ``admin``) between brokers and for this module, CONTROLLER (PLAIN, as ``admin``)."""
        self.tls = make_tls_files(self.work_dir / "tls", name="broker")
        admin_pw = self.users[ADMIN_USER]
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required"
        tls = {"ssl.keystore.type": "PEM", "ssl.keystore.location": self._tls().keystore,
               "ssl.truststore.type": "PEM", "ssl.truststore.location": self._tls().ca}
        common = {
            "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SASL_SSL,CONTROLLER:SASL_SSL",
            "sasl.mechanism.controller.protocol": "PLAIN",
            # the server side of CONTROLLER on the controller, the client side on the brokers
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config":
                f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{ADMIN_USER}" '
                f'password="{admin_pw}" user_{ADMIN_USER}="{admin_pw}";',
            "authorizer.class.name": _AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN_USER}",
            **tls,
        }
        self._controller_props.update(common)
        self._broker_props.update(common)
        self._broker_props.update({
            "inter.broker.listener.name": "INTERNAL",
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            "listener.name.internal.sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.internal.{SCRAM_MECHANISM.lower()}.sasl.jaas.config":
                f'{scram} username="{ADMIN_USER}" password="{admin_pw}";',
            "listener.name.client.sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.client.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": f"{scram};",
        })

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

    # -- security (security="sasl_ssl")

    def client_conf(self, user: str, password: Optional[str] = None) -> dict:
        """The librdkafka properties a client of the CLIENT listener needs as ``user`` (the
        ``-X`` settings; ``bootstrap.servers`` is not among them).  ``password``: default the
        user's own; another one makes a client that fails to authenticate."""
        self._require_secure("client_conf")
        if user not in self.users:
            raise KeyError(f"no SCRAM user {user!r} (users: {sorted(self.users)})")
        return {"security.protocol": "SASL_SSL", "sasl.mechanisms": SCRAM_MECHANISM, "sasl.username": user,
                "sasl.password": self.users[user] if password is None else password,
                "ssl.ca.location": str(self._tls().ca)}

    def add_acls(self, user: str, acls: Iterable[Acl], timeout: float = 30.0) -> None:
        """CreateAcls (ALLOW) for ``user``; returns once DescribeAcls shows all of them.  Each
        broker applies ACLs from the metadata log on its own, a moment later: poll for effects."""
        acls = list(acls)
        if not acls:
            return
        for fut in self.admin().create_acls([a.binding(user) for a in acls], request_timeout=timeout).values():
            fut.result(timeout)
        self._wait(lambda: set(acls) <= self.acls(user), timeout, f"ACLs of {user} to show")

    def remove_acls(self, user: str, acls: Iterable[Acl], timeout: float = 30.0) -> None:
        """DeleteAcls: the given ALLOW ACLs of ``user``; returns once DescribeAcls no longer shows them."""
        acls = list(acls)
        if not acls:
            return
        for fut in self.admin().delete_acls([a.binding_filter(user) for a in acls], request_timeout=timeout).values():
            fut.result(timeout)
        self._wait(lambda: not (set(acls) & self.acls(user)), timeout, f"removed ACLs of {user} to go")

    def acls(self, user: str) -> set:
        """The ALLOW ACLs of ``user`` (DescribeAcls) as ``Acl`` objects."""
        from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType,
                                           ResourceType)
        self._require_secure("acls")
        anything: Any = None  # a filter's None matches any name / host
        flt = AclBindingFilter(ResourceType.ANY, anything, ResourcePatternType.ANY, f"User:{user}", anything,
                               AclOperation.ANY, AclPermissionType.ALLOW)
        got = self.admin().describe_acls(flt, request_timeout=10).result(15)
        return {Acl(b.restype.name.lower(), b.name, b.operation.name.lower(), b.resource_pattern_type.name.lower())
                for b in got}

    def java_client_properties(self, controller: bool = False) -> Path:
        """A properties file for Kafka's Java tools (``--command-config``) as ``admin``: to the
        brokers' INTERNAL listener (SCRAM) or, with ``controller``, to the controller (PLAIN)."""
        self._require_secure("java_client_properties")
        pw = self.users[ADMIN_USER]
        mech, module = (("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule") if controller else
                        (SCRAM_MECHANISM, "org.apache.kafka.common.security.scram.ScramLoginModule"))
        path = self._tools_dir() / f"admin-{'controller' if controller else 'broker'}.properties"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(_props({"security.protocol": "SASL_SSL", "sasl.mechanism": mech,
                                "sasl.jaas.config": f'{module} required username="{ADMIN_USER}" password="{pw}";',
                                "ssl.truststore.type": "PEM", "ssl.truststore.location": self._tls().ca}))
        return path

    def _require_secure(self, what: str) -> None:
        if not self.security or not self.managed:
            raise RuntimeError(f"{what}() needs a cluster started with security='sasl_ssl'")

    def _tls(self) -> TlsFiles:
        if self.tls is None:
            raise RuntimeError("the cluster's TLS files are made when a security='sasl_ssl' cluster is set up")
        return self.tls

    @property
    def controller_bootstrap(self) -> str:
        self._require_managed("controller_bootstrap")
        return f"127.0.0.1:{self.controller.port}"

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
            self._libs = ensure_kafka()
        return self._libs

    def start(self, timeout: float = 180.0) -> "KafkaCluster":
        """Format storage, launch every node in parallel, wait until all brokers are registered."""
        self._require_managed("start")
        _ = self.libs  # fetch (first run only) before the clock starts
        t0 = time.monotonic()
        nodes = [self.controller, *self.brokers.values()]
        scram = [a for u, pw in self.users.items() for a in ("--add-scram", f"{SCRAM_MECHANISM}=[name={u},password={pw}]")]
        for n in nodes:
            n.dir.mkdir(parents=True, exist_ok=True)
            props = self._controller_props if n.role == "controller" else self._broker_props
            if n.role == "controller":
                listener = f"CONTROLLER://127.0.0.1:{n.port}"
            elif self.security:
                listener = f"CLIENT://127.0.0.1:{n.port},INTERNAL://127.0.0.1:{n.internal_port}"
            else:
                listener = f"PLAINTEXT://127.0.0.1:{n.port}"
            conf = {"process.roles": n.role, "node.id": n.node_id, "listeners": listener,
                    "log.dirs": n.dir / "data", **props}
            if n.role == "broker":
                conf["advertised.listeners"] = listener
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
                raise TimeoutError(f"brokers {sorted(want - seen)} not registered after {timeout:.0f}s "
                                   f"(registered: {sorted(seen)}); logs in {self.work_dir}")
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
        if self.controller.running():
            self.controller.process.terminate()
            _wait_or_kill(self.controller.process, timeout)
        if self._own_dir and not self.keep_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- per-broker faults (by PID)

    def stop_broker(self, broker_id: int, timeout: float = 60.0) -> None:
        """Controlled shutdown: SIGTERM and wait for exit (SIGKILL after ``timeout``)."""
        self._require_managed("stop_broker")
        n = self._broker(broker_id)
        if n.paused:
            self.resume_broker(broker_id)
        stop_process(n.proc, timeout)

    def kill_broker(self, broker_id: int) -> None:
        """SIGKILL (unclean shutdown)."""
        self._require_managed("kill_broker")
        n = self._broker(broker_id)
        if n.running():
            n.process.kill()
            n.process.wait()
        n.paused = False

    def pause_broker(self, broker_id: int) -> None:
        """SIGSTOP: the JVM freezes (no fetches, no heartbeats)."""
        self._require_managed("pause_broker")
        n = self._broker(broker_id)
        self._signal(n, signal.SIGSTOP)
        n.paused = True

    def resume_broker(self, broker_id: int) -> None:
        """SIGCONT."""
        self._require_managed("resume_broker")
        n = self._broker(broker_id)
        self._signal(n, signal.SIGCONT)
        n.paused = False

    def start_broker(self, broker_id: int, timeout: float = 120.0) -> None:
        """Start a stopped broker again (same ports and log dir) and wait until it is registered."""
        self._require_managed("start_broker")
        n = self._broker(broker_id)
        if not n.running():
            self._launch(n)
            # fresh admin clients: a client that knew the broker before it went away could still
            # be waiting on its old connection 30 s later (CI, after every broker was restarted)
            self._admin = self._observer_admin = None
        self.wait_ready(timeout, brokers=[broker_id])

    def restart_broker(self, broker_id: int, timeout: float = 120.0) -> None:
        """Stop the broker if it runs (controlled), start it again, wait until it is registered."""
        self._require_managed("restart_broker")
        if self._broker(broker_id).running():
            self.stop_broker(broker_id)
        self.start_broker(broker_id, timeout)

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
        """Ids of registered, unfenced brokers (DescribeCluster); raises when no broker answers."""
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

    def elect_leaders(self, kind: str = "preferred", partitions: Optional[Iterable[tuple]] = None,
                      timeout: float = 30.0) -> dict:
        """ElectLeaders (``'preferred'`` or ``'unclean'``) for ``[(topic, partition), ...]`` (None = all).

        Returns ``{(topic, partition): KafkaError or None}``; ELECTION_NOT_NEEDED counts as success.
        Leaders move asynchronously: poll metadata for the outcome."""
        from confluent_kafka import ElectionType, KafkaError, TopicPartition
        et = {"preferred": ElectionType.PREFERRED, "unclean": ElectionType.UNCLEAN}[kind]
        tps = None if partitions is None else [TopicPartition(t, p) for t, p in partitions]
        # no kwargs: confluent-kafka 2.16.1 raises SystemError for request/operation_timeout here
        res = self.admin().elect_leaders(et, tps).result(timeout)
        out = {}
        for tp, exc in res.items():
            err = exc.args[0] if isinstance(exc, Exception) and exc.args else exc  # KafkaError or KafkaException
            if err is not None and getattr(err, "code", lambda: None)() == KafkaError.ELECTION_NOT_NEEDED:
                err = None
            out[(tp.topic, tp.partition)] = err
        return out

    def reassign(self, topic: str, partition: int, replicas: Sequence[int], wait: bool = True,
                 timeout: float = 60.0) -> None:
        """AlterPartitionReassignments (Kafka's ReassignPartitionsCommand; confluent-kafka lacks it).

        With ``wait``, poll metadata until the replica list equals ``replicas``."""
        plan = {"version": 1, "partitions": [{"topic": topic, "partition": partition, "replicas": list(replicas)}]}
        f = Path(tempfile.mkstemp(prefix="reassign-", suffix=".json", dir=self._tools_dir())[1])
        f.write_text(json.dumps(plan))
        self.run_tool("org.apache.kafka.tools.reassign.ReassignPartitionsCommand", "--bootstrap-server",
                      self._harness_bootstrap, "--reassignment-json-file", str(f), "--execute", *self._command_config())
        if wait:
            want = list(replicas)

            def done():
                try:
                    _, reps, isr = self.partitions(topic, timeout=3)[partition]
                    return reps == want and set(want) <= set(isr)
                except Exception:
                    return False
            self._wait(done, timeout, f"reassignment of {topic}-{partition} to {want}")

    def throttle(self, rate_bytes: int, brokers: Optional[Iterable[int]] = None, topic: Optional[str] = None,
                 replicas: str = "*", timeout: float = 30.0) -> None:
        """Replication throttling: ``leader/follower.replication.throttled.rate`` on the brokers and,
        with ``topic``, ``leader/follower.replication.throttled.replicas`` (``"*"`` or ``"p:b,..."``).
        Only replicas outside the ISR are throttled (Kafka's rule)."""
        self._throttle_configs(brokers, topic, str(int(rate_bytes)), replicas, timeout)

    def clear_throttle(self, brokers: Optional[Iterable[int]] = None, topic: Optional[str] = None,
                       timeout: float = 30.0) -> None:
        self._throttle_configs(brokers, topic, None, None, timeout)

    def _throttle_configs(self, brokers, topic, rate, replicas, timeout) -> None:
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        def entries(names, value):
            op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
            return [ConfigEntry(n, value, incremental_operation=op) for n in names]
        res = [ConfigResource(ResourceType.BROKER, str(b), incremental_configs=entries(
            ["leader.replication.throttled.rate", "follower.replication.throttled.rate"], rate))
            for b in (self.broker_ids if brokers is None else brokers)]
        if topic:
            res.append(ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries(
                ["leader.replication.throttled.replicas", "follower.replication.throttled.replicas"], replicas)))
        for r in res:  # one BROKER resource per request (librdkafka rule)
            for fut in self.admin().incremental_alter_configs([r], request_timeout=timeout).values():
                fut.result(timeout)

    def quorum_status(self) -> dict:
        """``kafka-metadata-quorum describe --status`` as ``{key: value}`` (LeaderId, LeaderEpoch, ...)."""
        target = (["--bootstrap-controller", self.controller_bootstrap, *self._command_config(controller=True)]
                  if self.managed else ["--bootstrap-server", self.bootstrap_servers])
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
            raise UnmanagedClusterError(f"{what}() needs a cluster started by kafka_monitor.cluster, "
                                        f"not the external cluster at {self.bootstrap_servers}")

    def _node(self, node_id: int) -> _Node:
        if node_id == self.controller_id:
            return self.controller
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
              capture: bool = False) -> subprocess.Popen:
        # Popen from the calling thread: the parent-death signal fires when *that thread* exits
        cmd = [java_bin(), f"-Xmx{heap}", *self.jvm_opts,
               f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.xml'}", f"-Dkafka.logs.dir={logs_dir}",
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
        n.proc = self._java(n.dir, heap, "kafka.Kafka", str(n.dir / "server.properties"), out=n.dir / "stdout.log")
        n.paused = False

    def _signal(self, n: _Node, sig: int) -> None:
        if not n.running():
            raise RuntimeError(f"{n.name} is not running")
        os.kill(n.process.pid, sig)

    def _check_alive(self) -> None:
        for n in [self.controller, *self.brokers.values()]:
            if n.proc is not None and n.proc.poll() is not None and n.proc.returncode not in (0, -9, -15, 143):
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
        self.managed = False
        self.security, self.users, self.tls = None, {}, None
        self._bootstrap = bootstrap_servers
        self._admin = self._observer_admin = None
        self._libs = None
        self.controller_id = None
        self.start_seconds = None
        self.jvm_opts = list(DEFAULT_JVM_OPTS)
        self.work_dir = Path(tempfile.mkdtemp(prefix="km-kafka-ext-"))
        (self.work_dir / "log4j2.xml").write_text(_LOG4J2)
        self.controller = None  # type: ignore[assignment]  # attached: no process handles
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
