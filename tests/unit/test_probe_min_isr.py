"""How the probe keeps each topic's min.insync.replicas current
(``monitor.topic_configs.TopicConfigs.min_isr``), driven through a fake admin whose
DescribeConfigs answers when the test says so.  The real
cluster's side (a runtime change on a topic and of the brokers' default, seen within two
refreshes) is tests/integration/test_probe_kafka.py."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigSource, ResourceType

import monitor.topic_configs as topic_configs_mod
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from tests.support.probe_fakes import FakeAdmin, FakeEmitter

OWN, DEFAULT = ConfigSource.DYNAMIC_TOPIC_CONFIG, ConfigSource.STATIC_BROKER_CONFIG


class ConfigAdmin(FakeAdmin):
    """Topic values: ``own`` (a topic's own value) else ``default``; answers held until
    ``answer()`` unless ``instant``."""

    def __init__(self, own: dict[str, int], default: int = 1, instant: bool = False):
        super().__init__(topics={}, committed={}, hw={})
        self.own, self.default, self.instant = own, default, instant
        self.requests: list[tuple[int, list[str]]] = []
        self.sent_to: list = []  # the broker each request named
        self.held: list[tuple[Future, object]] = []
        self.deny_broker = False

    def _value(self, res):
        if res.restype == ResourceType.BROKER:
            if self.deny_broker:
                raise KafkaException(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED))
            return {"min.insync.replicas": SimpleNamespace(value=str(self.default), source=DEFAULT)}
        if res.name in self.own:
            return {"min.insync.replicas": SimpleNamespace(value=str(self.own[res.name]), source=OWN)}
        return {"min.insync.replicas": SimpleNamespace(value=str(self.default), source=DEFAULT)}

    def describe_configs(self, resources, request_timeout=None, broker=None):
        self.requests.append((resources[0].restype, [r.name for r in resources]))
        self.sent_to.append(broker)
        out = {}
        for r in resources:
            f: Future = Future()
            out[r] = f
            self.held.append((f, r))
        if self.instant:
            self.answer()
        return out

    def answer(self):
        """Answer every request held, with the values as they are now."""
        held, self.held = self.held, []
        for f, r in held:
            try:
                f.set_result(self._value(r))
            except KafkaException as e:
                f.set_exception(e)


def make(admin: ConfigAdmin, **kw) -> Probe:
    kw.setdefault("config_refresh_s", 0.0)  # re-read at every call
    return Probe(ProbeConfig(bootstrap_servers="fake:9092", interval_s=1, **kw), emitter=FakeEmitter(), admin=admin)


def test_a_new_topic_is_read_at_once_and_later_reads_do_not_wait():
    admin = ConfigAdmin(own={"a": 2}, instant=True)
    p = make(admin)
    assert p.topic_configs.min_isr(["a", "b"], [1]) == {"a": 2, "b": 1}
    admin.instant = False
    admin.own["a"] = 3
    assert p.topic_configs.min_isr(["a", "b"], [1]) == {"a": 2, "b": 1}  # re-read sent, not answered
    admin.answer()
    assert p.topic_configs.min_isr(["a", "b"], [1]) == {"a": 3, "b": 1}
    assert p.topic_configs.min_isr_changes == 1


def test_a_change_of_the_brokers_default_reaches_every_topic_without_its_own_value_at_once(monkeypatch):
    monkeypatch.setattr(topic_configs_mod, "CONFIG_REREAD_MAX", 1)  # re-reads would take 3 refreshes
    admin = ConfigAdmin(own={"own": 3}, instant=True)
    p = make(admin)
    topics = ["own", "x", "y"]
    p.topic_configs.min_isr(topics, [1])
    admin.instant = False
    assert p.topic_configs.min_isr(topics, [1]) == {"own": 3, "x": 1, "y": 1}
    admin.answer()               # the broker read and one topic's re-read, before the change
    admin.default = 2
    p.topic_configs.min_isr(topics, [1])  # takes those answers, sends the next broker read
    admin.answer()
    assert p.topic_configs.min_isr(topics, [1]) == {"own": 3, "x": 2, "y": 2}
    assert p.topic_configs.min_isr_changes == 2


def test_an_answer_sent_before_a_default_change_does_not_undo_it(monkeypatch):
    admin = ConfigAdmin(own={}, instant=True)
    p = make(admin)
    p.topic_configs.min_isr(["x"], [1])
    admin.instant = False
    p.topic_configs.min_isr(["x"], [1])           # re-read of x and a broker read, both held
    stale = [(f, r) for f, r in admin.held if r.restype == ResourceType.TOPIC]
    broker = [(f, r) for f, r in admin.held if r.restype == ResourceType.BROKER]
    for f, r in stale:                   # x's re-read answers 1 ...
        f.set_result(admin._value(r))
    admin.default = 2
    for f, r in broker:                  # ... the broker read, answered later, says 2
        f.set_result(admin._value(r))
    admin.held = []
    assert p.topic_configs.min_isr(["x"], [1]) == {"x": 2}  # the default first; the older re-read is ignored
    admin.answer()
    assert p.topic_configs.min_isr(["x"], [1]) == {"x": 2}


def test_re_reads_are_bounded_per_refresh_and_go_to_the_longest_unread_first(monkeypatch):
    monkeypatch.setattr(topic_configs_mod, "CONFIG_REREAD_MAX", 2)
    admin = ConfigAdmin(own={}, instant=True)
    p = make(admin)
    topics = ["a", "b", "c", "d", "e"]
    p.topic_configs.min_isr(topics, [1])
    rereads = []
    for _ in range(3):
        n = len(admin.requests)
        p.topic_configs.min_isr(topics, [1])
        rereads += [names for kind, names in admin.requests[n:] if kind == ResourceType.TOPIC]
    # two a refresh, the longest unread first: every topic within 3 refreshes, then round again
    assert rereads == [["a", "b"], ["c", "d"], ["e", "a"]]


def test_config_refresh_s_spaces_the_re_reads():
    admin = ConfigAdmin(own={}, instant=True)
    p = make(admin, config_refresh_s=3600)
    p.topic_configs.min_isr(["a"], [1])
    n = len(admin.requests)
    p.topic_configs.min_isr(["a"], [1])
    assert [k for k, _ in admin.requests[n:]] == [ResourceType.BROKER]  # the default only


def test_no_permission_on_the_brokers_configuration_is_not_asked_again(caplog):
    admin = ConfigAdmin(own={}, instant=True)
    admin.deny_broker = True
    p = make(admin)
    for _ in range(3):
        p.topic_configs.min_isr(["a"], [1])
    assert sum(1 for k, _ in admin.requests if k == ResourceType.BROKER) == 1
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # optional: said at INFO
    assert p.topic_configs.min_isr(["a"], [1]) == {"a": 1}


def test_every_read_names_a_listed_broker_and_one_that_timed_out_is_avoided(monkeypatch):
    """A read that waits for a broker that is down makes librdkafka reconnect to it without
    backoff (docs/limits.md): every request names a broker of the refresh's metadata, and one a
    read timed out on is left alone for SUSPECT_S, or until it leaves the metadata."""
    clock = [1000.0]
    monkeypatch.setattr(topic_configs_mod.time, "monotonic", lambda: clock[0])
    admin = ConfigAdmin(own={}, instant=True)
    p = make(admin)
    tc = p.topic_configs
    tc.min_isr(["a"], [3, 1, 2])
    assert set(admin.sent_to) == {1}  # the lowest id listed, the topic read and the default read alike
    admin.instant = False
    tc.min_isr(["a"], [1, 2, 3])     # a re-read and a default read to 1, held ...
    timed_out = KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out waiting for broker"))
    for f, _ in admin.held:          # ... and timed out
        f.set_exception(timed_out)
    admin.held, admin.instant = [], True
    n = len(admin.sent_to)
    tc.min_isr(["a"], [1, 2, 3])
    assert set(admin.sent_to[n:]) == {2}
    clock[0] += topic_configs_mod.SUSPECT_S + 1
    n = len(admin.sent_to)
    tc.min_isr(["a"], [1, 2, 3])
    assert set(admin.sent_to[n:]) == {1}  # forgiven after SUSPECT_S
    # suspected again; gone from the metadata and back: forgiven at once
    admin.instant = False
    tc.min_isr(["a"], [1, 2, 3])
    for f, _ in admin.held:
        f.set_exception(timed_out)
    admin.held, admin.instant = [], True
    tc.min_isr(["a"], [2, 3])
    n = len(admin.sent_to)
    tc.min_isr(["a"], [1, 2, 3])
    assert set(admin.sent_to[n:]) == {1}
    # every broker listed suspected: the one whose suspicion ends first; none listed: librdkafka's choice
    tc._suspect = {1: clock[0] + 30, 2: clock[0] + 10}
    n = len(admin.sent_to)
    tc.min_isr(["a"], [1, 2])
    assert set(admin.sent_to[n:]) == {2}
    n = len(admin.sent_to)
    assert tc.min_isr(["a"], []) == {"a": 1}
    assert admin.sent_to[n:] == [None]  # the topic's re-read; no default read without a broker


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_config_refresh_s_is_checked(bad):
    with pytest.raises(Exception, match="config_refresh_s"):
        ProbeConfig(bootstrap_servers="x:1", config_refresh_s=bad).validate()
