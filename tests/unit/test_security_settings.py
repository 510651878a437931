"""Security without a cluster: what an authorization or authentication error is turned into
(monitor.access), the probe stopping on an error retrying cannot fix, the command line's exit
status for it, and the /metrics TLS settings.  On a real SASL_SSL cluster:
tests/integration/test_security.py."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_monitor import cli
from kafka_monitor.config import ConfigError, build
from monitor.access import FatalClientError, fatal_reason, missing_acl
from monitor.emitter import EventEmitter
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.job import JobConfig
from tests.support.capture import CapturingProducer


@pytest.mark.parametrize("code, needed, expected", [
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, {"topic": ("DESCRIBE_CONFIGS", "orders")},
     " -- permission missing: DESCRIBE_CONFIGS on Topic:orders"),
    (KafkaError.GROUP_AUTHORIZATION_FAILED, {"topic": ("DESCRIBE", "t"), "group": ("DESCRIBE", "billing")},
     " -- permission missing: DESCRIBE on Group:billing"),
    (KafkaError.CLUSTER_AUTHORIZATION_FAILED, {"cluster": ("DESCRIBE", "kafka-cluster")},
     " -- permission missing: DESCRIBE on Cluster:kafka-cluster"),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, {"group": ("DESCRIBE", "billing")}, ""),  # not what was asked for
    (KafkaError.NOT_LEADER_FOR_PARTITION, {"topic": ("DESCRIBE", "t")}, ""),
])
def test_missing_acl_names_the_permission_the_caller_needed(code, needed, expected):
    assert missing_acl(KafkaError(code), **needed) == expected
    assert missing_acl(KafkaException(KafkaError(code)), **needed) == expected
    assert missing_acl(ValueError("x"), **needed) == ""


def test_fatal_reasons():
    auth = fatal_reason(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"))
    assert auth.startswith("authentication failed: SASL authentication error") and "sasl.password" in auth
    pid = fatal_reason(KafkaException(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "no PID", fatal=True)),
                       "kafka-monitor.events")
    assert "permission missing: WRITE on Topic:kafka-monitor.events" in pid
    assert fatal_reason(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED)) is None  # not fatal: not stopping
    assert fatal_reason(KafkaError(KafkaError._TRANSPORT)) is None
    assert fatal_reason(RuntimeError("x")) is None


class RefusingAdmin:
    """The slice of AdminClient the probe calls, for brokers that refuse the credentials: every
    request times out, and polling serves librdkafka's _AUTHENTICATION error."""

    def __init__(self):
        self.probe = None

    def list_topics(self, topic=None, timeout=None):
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))

    def poll(self, timeout=0):
        self.probe._on_client_error(KafkaError(
            KafkaError._AUTHENTICATION, "sasl_ssl://b:9093/bootstrap: SASL authentication error: Authentication "
                                        "failed during authentication due to invalid credentials"))


def _run_until_it_stops(probe: Probe) -> BaseException:
    stop, raised = threading.Event(), []

    def run():
        try:
            probe.run(stop)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            raised.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    stop.set()
    t.join(5)
    assert raised, "the probe kept retrying"
    return raised[0]


def test_the_probe_stops_when_the_brokers_refuse_its_credentials():
    admin = RefusingAdmin()
    cfg = ProbeConfig(bootstrap_servers="b:9093", interval_s=5)
    probe = Probe(cfg, admin=admin, emitter=EventEmitter({}, cfg.events_topic, cluster="c", source="s",
                                                         producer=CapturingProducer()))
    admin.probe = probe
    e = _run_until_it_stops(probe)
    assert isinstance(e, FatalClientError) and str(e).startswith("authentication failed: sasl_ssl://b:9093")
    assert probe.fatal_error == str(e)


class FatalProducer(CapturingProducer):
    """An idempotent producer refused its producer id: confluent-kafka raises that once, from poll()."""

    raised = False

    def poll(self, timeout=0):
        if not self.raised:
            self.raised = True
            raise KafkaException(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "Failed to acquire idempotence PID",
                                            fatal=True))
        return super().poll(timeout)


def test_the_probe_stops_when_its_events_producer_is_refused_a_producer_id():
    admin = SimpleNamespace(list_topics=RefusingAdmin().list_topics, poll=lambda timeout=0: None)
    cfg = ProbeConfig(bootstrap_servers="b:9093", interval_s=5)
    probe = Probe(cfg, admin=admin, emitter=EventEmitter({}, cfg.events_topic, cluster="c", source="s",
                                                         producer=FatalProducer()))
    e = _run_until_it_stops(probe)
    assert isinstance(e, FatalClientError)
    assert "permission missing: WRITE on Topic:kafka-monitor.events" in str(e)


def test_the_command_line_exits_2_when_the_probe_cannot_go_on(monkeypatch, capsys):
    import signal

    import monitor.probe

    def refuse(self, stop):
        raise FatalClientError("authentication failed: SASL authentication error")

    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setenv("KAFKA_MONITOR_SUPERVISED", "1")  # the probe itself, not its supervisor
    monkeypatch.setattr(monitor.probe.Probe, "__init__", lambda self, cfg: setattr(self, "fatal_error", "x"))
    monkeypatch.setattr(monitor.probe.Probe, "run", refuse)
    monkeypatch.setattr(monitor.probe.Probe, "close", lambda self, flush_timeout=10.0: None)
    assert cli.main(["probe", "--bootstrap-servers", "b:9093"]) == 2
    assert "error: probe stopped: authentication failed: SASL authentication error" in capsys.readouterr().err


def test_metrics_tls_settings(monkeypatch, tmp_path):
    import signal

    import streaming.job

    seen = {}
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(streaming.job, "run", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    assert cli.main(["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c", "--metrics-tls-cert", "c.pem",
                     "--metrics-tls-key", "k.pem", "--metrics-tls-client-ca", "ca.pem"]) == 0
    cfg = seen["cfg"]
    assert (cfg.metrics_host, cfg.metrics_tls_cert, cfg.metrics_tls_key, cfg.metrics_tls_client_ca) == (
        "127.0.0.1", "c.pem", "k.pem", "ca.pem")
    env = {"KAFKA_MONITOR_JOB_METRICS_TLS_CERT": "c.pem", "KAFKA_MONITOR_JOB_METRICS_TLS_KEY": "k.pem"}
    assert build(JobConfig, "job", env=env, flags={"bootstrap_servers": "b:1", "checkpoint_dir": "/c"}).metrics_tls_key == "k.pem"
    for flags in ({"metrics_tls_cert": "c.pem"}, {"metrics_tls_key": "k.pem"}, {"metrics_tls_client_ca": "ca.pem"}):
        with pytest.raises(ConfigError, match="job.metrics_tls_cert and job.metrics_tls_key"):
            build(JobConfig, "job", env={}, flags={"bootstrap_servers": "b:1", "checkpoint_dir": "/c", **flags})
