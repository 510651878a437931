"""Log dirs without a cluster: a DescribeLogDirs answer as kafka-python 3.0.12 gives it (its shape
recorded from Kafka 4.1.1) becomes one log_dirs event per broker; an offline dir names what it held
when last online."""

from __future__ import annotations

import json
import logging

from monitor.contract import BrokerLogDirs, Event
from monitor.logdirs import MAX_NAMED, LogDirWatcher, broker_log_dirs


def dir_(path, parts=(), error_code=0, total=1000, usable=400, future=()):
    topics = {}
    for name, idx, size in parts:
        topics.setdefault(name, []).append({"partition_index": idx, "partition_size": size, "offset_lag": 0,
                                            "is_future_key": (name, idx) in future})
    d = {"error_code": error_code, "log_dir": path, "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}
    if error_code:
        d.update(total_bytes=-1, usable_bytes=-1, topics=[])
    else:
        d.update(total_bytes=total, usable_bytes=usable)
    return d


def test_online_dirs_count_their_replicas_and_an_offline_one_names_what_it_held():
    held: dict = {}
    first = broker_log_dirs(1, [dir_("/d1", [("fill", 0, 85), ("fill", 2, 77)]),
                                dir_("/d2", [("fill", 1, 300), ("fill", 3, 90)])], held, 30_000)
    assert [(d.log_dir, d.online, d.held_replicas, d.held_bytes, d.held_partitions) for d in first.dirs] == [
        ("/d1", True, 2, 162, ["fill-0", "fill-2"]), ("/d2", True, 2, 390, ["fill-1", "fill-3"])]
    assert (first.dirs[0].total_bytes, first.dirs[0].usable_bytes, first.interval_ms) == (1000, 400, 30_000)
    later = broker_log_dirs(1, [dir_("/d1", [("fill", 0, 90), ("fill", 2, 80)]), dir_("/d2", error_code=56)],
                            held, 30_000)
    off = later.dirs[1]
    assert (off.online, off.error, off.total_bytes, off.usable_bytes) == (False, "KAFKA_STORAGE_ERROR", None, None)
    assert (off.held_replicas, off.held_partitions) == (2, ["fill-1", "fill-3"])
    e = Event.of(later, cluster="k", source="p", seq=0, observed_at=1)
    assert e.schema == "kafka-monitor/v2" and e.type == "log_dirs" and e.key() == "k/1"
    assert Event.from_json(e.to_json()) == e


def test_names_are_bounded_and_moving_replicas_counted_apart():
    parts = [("t", i, i) for i in range(MAX_NAMED + 50)]
    (d,) = broker_log_dirs(2, [dir_("/d", parts, future={("t", 0)})], {}, 1000).dirs
    assert d.held_replicas == MAX_NAMED + 49 and len(d.held_partitions) == MAX_NAMED and d.moving_replicas == 1
    assert d.held_partitions[0] == f"t-{MAX_NAMED + 49}"  # the largest first


class FakeAdmin:
    """describe_cluster and describe_log_dirs(brokers=[b]) as kafka-python answers them; an answer
    that is an exception is raised."""

    def __init__(self, brokers, answers):
        self.brokers, self.answers = brokers, answers

    def describe_cluster(self):
        b = self.brokers.pop(0) if isinstance(self.brokers[0], (list, Exception)) else self.brokers
        if isinstance(b, Exception):
            raise b
        return {"brokers": [{"broker_id": n, "is_fenced": False} for n in b]}

    def describe_log_dirs(self, brokers):
        a = self.answers[brokers[0]].pop(0)
        if isinstance(a, Exception):
            raise a
        return [{"broker": brokers[0], "log_dirs": a}]

    def close(self):
        pass


def test_each_broker_is_asked_alone_and_one_that_fails_costs_only_its_answer():
    fake = FakeAdmin([1, 2], {1: [[dir_("/d2", [("fill", 1, 300)])], [dir_("/d2", error_code=56)]],
                              2: [ConnectionError("gone"), [dir_("/e", [])]]})
    made = []
    w = LogDirWatcher({}, interval_s=1, timeout_s=1, admin_factory=lambda: made.append(1) or fake)
    first = w.ask(10)
    assert [b.broker for b in first] == [1] and w.failures == 1 and "gone" in w.last_error
    assert w.take() == (10, first) and w.take() is None
    second = w.ask(20)
    assert [(b.broker, [d.online for d in b.dirs]) for b in second] == [(1, [False]), (2, [True])]
    assert second[0].dirs[0].held_partitions == ["fill-1"] and len(made) == 1 and isinstance(second[0], BrokerLogDirs)


def test_no_brokers_listed_makes_a_new_client_and_no_dirs_is_said_once_not_sent(caplog):
    fake = FakeAdmin([ConnectionError("down"), [1], [1]], {1: [[], []]})
    made = []
    w = LogDirWatcher({}, interval_s=1, timeout_s=1, cluster_name="k", admin_factory=lambda: made.append(1) or fake)
    assert w.ask(10) is None and w.failures == 1
    with caplog.at_level(logging.INFO, logger="monitor.logdirs"):
        assert w.ask(20) == [] and w.ask(30) == []
    assert len(made) == 2 and sum("may lack DESCRIBE on the cluster" in r.message for r in caplog.records) == 1



class UnknownBrokerIdError(Exception):
    """kafka-python's, by name: the client's metadata lacks a broker the cluster lists."""


def test_a_fenced_broker_is_not_asked_and_one_the_client_does_not_know_makes_a_new_client():
    """Seen on Kafka 4.1.1: a broker stopped (fenced, still listed) and started again stayed
    unknown to kafka-python's client (its metadata read while the broker was down, again only
    every 5 minutes): every request to it failed with UnknownBrokerIdError."""
    made, asked = [], []

    class Fake:
        def __init__(self, n):
            self.n = n

        def describe_cluster(self):
            return {"brokers": [{"broker_id": 1, "is_fenced": False}, {"broker_id": 2, "is_fenced": True}]}

        def describe_log_dirs(self, brokers):
            asked.append((self.n, brokers[0]))
            if self.n == 1:
                raise UnknownBrokerIdError(brokers[0])
            return [{"broker": brokers[0], "log_dirs": [dir_("/d", [("t", 0, 5)])]}]

        def close(self):
            pass
    w = LogDirWatcher({}, interval_s=1, timeout_s=1, admin_factory=lambda: made.append(1) or Fake(len(made)))
    assert w.ask(10) == [] and w.failures == 1 and "UnknownBrokerIdError" in w.last_error
    (b,) = w.ask(20)
    assert (b.broker, b.dirs[0].held_partitions) == (1, ["t-0"]) and len(made) == 2
    assert asked == [(1, 1), (2, 1)]  # the fenced broker 2 never

# -- the job: parser, rules, exporter ----------------------------------------------------------

NOW = 1_700_000_000_000
GiB = 1 << 30


def parsed(event: BrokerLogDirs, t: int = NOW) -> dict:
    import pyarrow as pa

    from streaming.ingest.parsing import parse_values

    e = Event.of(event, cluster="k", source="p", seq=0, observed_at=t)
    return parse_values(pa.array([e.to_json().decode()]), timestamps=pa.array([t], pa.int64())).to_pylist()[0]


def test_the_parser_keeps_a_brokers_dirs_as_one_row_of_that_broker():
    event = broker_log_dirs(2, [dir_("/d1", [("fill", 0, 85)]), dir_("/d2", error_code=56)], {}, 30_000)
    row = parsed(event)
    assert row["reason"] is None, row["reason"]
    assert (row["entity"], row["bucket_key"], row["type"], row["node_id"]) == (
        "log_dirs|k/broker/2", "k/broker/2", "log_dirs", 2)
    dirs = json.loads(row["report"])["dirs"]
    assert [(d["log_dir"], d["online"], d["error"], d["held_partitions"]) for d in dirs] == [
        ("/d1", True, None, ["fill-0"]), ("/d2", False, "KAFKA_STORAGE_ERROR", [])]


def rows(*dirs):
    """A flat row's report as the parser makes it (only what the rules read)."""
    return {"report": json.dumps({"interval_ms": 30_000, "dirs": list(dirs)})}


def online(path, total=10 * GiB, usable=8 * GiB):
    return {"log_dir": path, "online": True, "total_bytes": total, "usable_bytes": usable, "held_replicas": 1,
            "held_bytes": 10, "held_partitions": ["t-0"], "moving_replicas": 0}


def offline(path, held=("t-1", "t-3")):
    return {"log_dir": path, "online": False, "error": "KAFKA_STORAGE_ERROR", "held_replicas": len(held),
            "held_bytes": 99, "held_partitions": list(held)}


def run_rules(steps, cfg=None):
    from streaming.rules import logdirs as rl

    s = rl.new_log_dirs("k", 1)
    out = []
    for t, row in steps:
        out += [(x.at, x.alert.value, x.action, x.labels, x.evidence)
                for x in rl.on_log_dirs(s, row, t, "log_dirs|k/broker/1", cfg or rl.DEFAULT_CONFIG)]
    return out, s


def test_an_offline_dir_opens_log_dir_offline_naming_the_dir_and_what_it_held_and_resolves_when_back():
    out, s = run_rules([(0, rows(online("/a"), online("/b"))), (30_000, rows(online("/a"), offline("/b"))),
                        (60_000, rows(online("/a"), offline("/b"))), (90_000, rows(online("/a"), online("/b")))])
    assert [(t, a, act) for t, a, act, _, _ in out] == [(30_000, "LogDirOffline", "open"),
                                                         (90_000, "LogDirOffline", "resolve")]
    _, _, _, labels, evidence = out[0]
    assert labels == {"cluster": "k", "broker": 1}
    assert evidence == {"dirs": [{"log_dir": "/b", "error": "KAFKA_STORAGE_ERROR", "held_replicas": 2, "held_bytes": 99,
                                  "held_partitions": ["t-1", "t-3"]}], "online_dirs": 1}
    assert [d["online"] for d in json.loads(s["report"])["dirs"]] == [True, True]


def test_a_dir_filling_past_the_usage_share_or_full_soon_at_its_growth_warns():
    from streaming.rules.logdirs import LogDirRulesConfig

    out, _ = run_rules([(0, rows(online("/a", usable=2 * GiB))), (30_000, rows(online("/a", usable=1 * GiB)))])
    assert [(a, act) for _, a, act, _, _ in out] == [("LogDirFilling", "open")]  # 90 % used >= 85
    ev = out[0][4]["dirs"][0]
    assert (ev["log_dir"], ev["used_percent"], ev["seconds_to_full"]) == ("/a", 90.0, None)  # no growth known yet
    # 50 % used, growing 1 GiB in 10 min: 5 GiB left is 50 min to full, within 1 h
    cfg = LogDirRulesConfig(full_within_ms=3_600_000, growth_window_ms=1_800_000, min_growth_span_ms=600_000)
    steps = [(t, rows(online("/a", usable=6 * GiB - GiB * t // 600_000))) for t in (0, 300_000, 600_000)]
    out, s = run_rules(steps + [(900_000, rows(online("/a", usable=9 * GiB // 2)))], cfg)  # still growing
    assert [(t, a, act) for t, a, act, _, _ in out] == [(600_000, "LogDirFilling", "open")]
    assert out[0][4]["dirs"][0]["seconds_to_full"] == 3000.0
    # the growth stops: 1 GiB in 15 min leaves 75 min to full, within the resolve margin (1.25 h);
    # 1 GiB in 20 min leaves 100 min: resolved
    out2, s2 = run_rules(steps + [(t, rows(online("/a", usable=5 * GiB))) for t in range(900_000, 3_600_001, 300_000)],
                         cfg)
    assert out2[-1][:3] == (1_200_000, "LogDirFilling", "resolve")
    # and once the window holds no growth, there is no time to full at all
    assert json.loads(s2["report"])["dirs"][0]["seconds_to_full"] is None and len(s2["samples"]["/a"]) == 7


def test_a_dir_hovering_at_the_usage_setting_does_not_flap():
    pct = lambda p: rows(online("/a", total=100 * GiB, usable=int((100 - p) * GiB)))  # noqa: E731
    out, _ = run_rules([(0, pct(85)), (30_000, pct(84)), (60_000, pct(83.5)), (90_000, pct(85)), (120_000, pct(82))])
    assert [(t, a, act) for t, a, act, _, _ in out] == [(0, "LogDirFilling", "open"), (120_000, "LogDirFilling", "resolve")]


def test_an_older_answer_or_an_empty_one_changes_nothing():
    out, s = run_rules([(30_000, rows(offline("/b"))), (10_000, rows(online("/b"))), (40_000, rows())])
    assert [(a, act) for _, a, act, _, _ in out] == [("LogDirOffline", "open")] and s["open"]


def test_the_exporter_serves_each_dir_and_drops_a_dir_no_longer_listed():
    from streaming.sinks.exporter import Exporter

    from streaming.rules import logdirs as rl

    s = rl.new_log_dirs("k", 1)
    rl.on_log_dirs(s, rows(online("/a"), offline("/b")), 0, "log_dirs|k/broker/1")
    exp = Exporter()
    exp.apply([{"kind": "log_dirs", "action": "upsert", "cluster": "k", "broker": 1, "report": s["report"]}])
    text = exp.render().decode()
    assert 'kafka_monitor_log_dir_online{broker="1",cluster="k",log_dir="/a"} 1.0' in text
    assert 'kafka_monitor_log_dir_online{broker="1",cluster="k",log_dir="/b"} 0.0' in text
    assert 'kafka_monitor_log_dir_usable_bytes{broker="1",cluster="k",log_dir="/a"} 8.589934592e+09' in text
    assert 'log_dir_usable_bytes{broker="1",cluster="k",log_dir="/b"}' not in text
    rl.on_log_dirs(s, rows(online("/a")), 1000, "log_dirs|k/broker/1")
    exp.apply([{"kind": "log_dirs", "action": "upsert", "cluster": "k", "broker": 1, "report": s["report"]}])
    assert 'log_dir="/b"' not in exp.render().decode()


def test_failures_are_said_in_the_log_and_a_cluster_without_the_request_is_not_asked_again(caplog):
    from kafka import errors as kerr

    fake = FakeAdmin([1, 2], {1: [kerr.IncompatibleBrokerVersion("DescribeLogDirs")], 2: []})
    w = LogDirWatcher({}, interval_s=1, timeout_s=1, cluster_name="k", admin_factory=lambda: fake)
    with caplog.at_level(logging.WARNING, logger="monitor.logdirs"):
        assert w.ask(10) is None and w.available is False
        w._run()  # returns at once: not asked again
    assert [r.message.split(":")[0] for r in caplog.records] == ["log dirs not available on cluster k"]
    caplog.clear()
    fake = FakeAdmin([1], {1: [ConnectionError("refused")] * 10})
    w = LogDirWatcher({}, interval_s=1, timeout_s=1, cluster_name="k", admin_factory=lambda: fake)
    with caplog.at_level(logging.WARNING, logger="monitor.logdirs"):
        for t in range(10):
            assert w.ask(t) == []
    assert w.failures == 10 and len(caplog.records) == 2 and "no_answer, 1 so far" in caplog.records[0].message
