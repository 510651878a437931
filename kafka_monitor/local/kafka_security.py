"""The secured local cluster (``KafkaCluster(security="sasl_ssl")``, see
``kafka_monitor.local.kafka_cluster``): TLS certificates, SCRAM users, ACLs.

``make_tls_files`` writes a throw-away CA and a broker certificate; ``Acl`` is one ALLOW ACL of a
user; ``ClusterSecurityMixin`` holds ``KafkaCluster``'s methods for the secured cluster: its
listener properties, the clients' settings (``client_conf``), ACLs and the Java tools' properties.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from kafka_monitor.local.kafka_install import KafkaSetupError

#: ``KafkaCluster(security=...)``: None (PLAINTEXT everywhere) or "sasl_ssl"
SECURITY_MODES = (None, "sasl_ssl")
#: the super user of a secured cluster (inter-broker, controller, this module's admin client)
ADMIN_USER = "admin"
SCRAM_MECHANISM = "SCRAM-SHA-512"
_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


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

    def _type(self):
        """confluent-kafka's ResourceType: the cluster resource is its BROKER."""
        from confluent_kafka.admin import ResourceType
        return ResourceType["BROKER" if self.resource.lower() == "cluster" else self.resource.upper()]

    def binding(self, user: str):
        from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType
        return AclBinding(self._type(), self.name, ResourcePatternType[self.pattern.upper()],
                          f"User:{user}", "*", AclOperation[self.operation.upper()], AclPermissionType.ALLOW)

    def binding_filter(self, user: str):
        from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType
        return AclBindingFilter(self._type(), self.name, ResourcePatternType[self.pattern.upper()],
                                f"User:{user}", "*", AclOperation[self.operation.upper()], AclPermissionType.ALLOW)


def _check_secret(what: str, value: str) -> str:
    # the values go into JAAS strings and StorageTool's --add-scram syntax unquoted
    if not value or not re.fullmatch(r"[A-Za-z0-9_.@+-]+", value):
        raise ValueError(f"{what}: letters, digits and _.@+- only (got {len(value or '')} characters)")
    return value


def _props(d: dict) -> str:
    return "".join(f"{k}={v}\n" for k, v in d.items())


class ClusterSecurityMixin:
    """``KafkaCluster``'s part for ``security="sasl_ssl"`` (mixed into it; not used on its own)."""

    if TYPE_CHECKING:  # provided by KafkaCluster
        security: Optional[str]
        users: dict
        tls: Optional[TlsFiles]
        managed: bool
        work_dir: Path
        _controller_props: dict
        _broker_props: dict

        def admin(self): ...

        def _tools_dir(self) -> Path: ...

        @staticmethod
        def _wait(cond, timeout: float, what: str): ...

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
        return {Acl("cluster" if b.restype.name == "BROKER" else b.restype.name.lower(), b.name, b.operation.name.lower(), b.resource_pattern_type.name.lower())
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
