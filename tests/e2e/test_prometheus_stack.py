"""End to end, as the SRE sees it: a real run of the product scraped by a real Prometheus.

    producer + consumer group (this test) -> Tansu -> probe (fetch offsets, every 1 s)
      -> events topic -> Spark job (trigger 1 s) -> exporter /metrics
      -> Prometheus (scrape and rule evaluation every 1 s, job_name kafka-monitor)

The job runs with a small ConsumerLagHigh threshold ([job.rules.lag] lag_high_offsets 50,
held 2 s, no seconds half) and Prometheus loads a copy of the shipped rules file in which only
ConsumerLagHigh's ``for:`` is made small (2s), so the expression that gets tested is the real
relay of the job's decision.  Then:

(a) every panel query of every dashboard, with its template variables set to values Prometheus
    itself lists for them (the variables' own label_values queries must find this run's cluster,
    topic and group), parses and returns data through /api/v1/query — except the panels in
    MAY_BE_EMPTY, which must parse and whose reason is given there;
(b) the consumer group stops (its member closes) while the producer goes on: ConsumerLagHigh
    fires for that group and topic in /api/v1/alerts;
(c) the group comes back and catches up: the alert is gone from /api/v1/alerts.

Tansu is one node (replicas = ISR = its one node), so no ISR change or offline partition can
happen here; those panels are listed in MAY_BE_EMPTY, and the alert rules on them are covered
by the promtool unit tests.
"""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from ruamel.yaml import YAML

from kafka_monitor.local.broker import create_topics
from monitor.probe import Probe
from monitor.probe_config import ProbeConfig
from streaming.sinks.exporter import Exporter
from streaming.job import JobConfig, start, stop_query
from tests.conftest import unique, wait_for
from tests.support.prometheus import PrometheusServer, QueryError, prometheus_binary

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DASH_DIR = ROOT / "dashboards"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "kafka-monitor.rules.yml"
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"

LAG_ALERT = "ConsumerLagHigh"
LAG_THRESHOLD = 50          # offsets: the job's lag_high_offsets, instead of its default 10,000
LAG_KEEP_FIRING = "2s"      # instead of the shipped 2m (a restart's bridge): the test waits for the resolve
#: the job's lag rule settings for this run (docs/settings.md, "Alert rule settings")
LAG_RULES = {"lag_high_offsets": LAG_THRESHOLD, "lag_high_seconds": None, "lag_high_for_ms": 2000}
PRODUCE_PER_S = 40          # over two partitions: a stopped group passes 50 per partition in ~3 s
#: $__rate_interval: Grafana puts at least 4 scrape intervals; longer here, so that a rate window
#: holds several of the job's updates even when a loaded machine makes a micro-batch take 10 s
#: (a window inside one update would see a flat gauge and a rate of 0)
RATE_INTERVAL = "30s"

#: the quorum panels on Tansu
_NO_QUORUM = ("Tansu has no KRaft controller quorum (no DescribeQuorum): the probe says so once and sends "
              "no quorum_state, so the quorum series do not exist "
              "(the real cluster's are checked in tests/integration/test_quorum.py)")
#: the ELR panels on Tansu
_NO_ELR = ("Tansu has no DescribeTopicPartitions and one node (ISR = replicas, always a leader): the job "
           "serves no eligible leader replica gauges (the real clusters' ELR: tests/integration/test_elr.py)")
#: the log dir panels on Tansu
_NO_LOG_DIRS = ("Tansu has no DescribeLogDirs: the probe's request to its one broker fails and sends no "
                "log_dirs event, so the log dir series do not exist (the real cluster's: "
                "tests/integration/test_logdirs.py)")
#: the transaction panels on Tansu
_NO_TRANSACTIONS = ("Tansu has no ListTransactions: the probe says so once and sends no transactions event, so "
                    "the transaction series do not exist (the real cluster's: tests/integration/test_transactions.py)")
_NO_LSO = ("the probe reads the offsets with --offsets-via fetch here (Tansu's ListOffsets is wrong), which gives "
           "no last stable offset, and no transaction holds one back in this run")
#: the HA group panels
_NO_HA = ("no probe runs with --ha-group here: the job serves no kafka_monitor_ha_* series (an HA group's: "
          "tests/e2e/test_ha_group.py)")
#: (dashboard, panel title) -> why its query may legitimately return no series in this run (it
#: must still parse)
MAY_BE_EMPTY = {
    ("overview.json", "Open alerts raised by the job"):
        "Tansu is one node (replicas = ISR = [it], always a leader): the job opens no IsrShrink, "
        "UnderReplicated or OfflinePartition, so kafka_monitor_alert_active has no series",
    ("monitor-health.json", "Alert transitions per second"):
        "for the same reason the job makes no alert transition, and the labelled counter "
        "kafka_monitor_alert_transitions_total has no series before the first one",
    ("rebalances.json", "Open group alerts"):
        "a table of the open RebalanceStorm / RebalanceStuck / GroupEmptyWithLag alerts (no 0 fallback: one row "
        "per alert); one member that joins once neither storms nor sticks, and GroupEmptyWithLag needs its "
        "10 minutes, so there is none in this run (the stat and timeseries panels show 0)",
    ("client-metadata.json", "Open leader and partition-count alerts"):
        "a table of the open LeaderChanged / PreferredLeaderImbalance / PartitionCountChanged alerts; Tansu is "
        "one node (its leader never changes) and the topic's partition count is fixed, so there is none",
    ("overview.json", "Quorum leader"): _NO_QUORUM,
    ("overview.json", "Quorum answered"): _NO_QUORUM,
    ("overview.json", "Quorum alerts open"): _NO_QUORUM,
    ("overview.json", "Quorum leader epoch"): _NO_QUORUM,
    ("overview.json", "Metadata log lag per node"): _NO_QUORUM,
    ("overview.json", "Time since caught up per node"): _NO_QUORUM,
    ("overview.json", "Log dirs online"): _NO_LOG_DIRS,
    ("overview.json", "Log dir use"): _NO_LOG_DIRS,
    ("overview.json", "Log dir time to full"): _NO_LOG_DIRS,
    ("overview.json", "HA group probes alive"): _NO_HA,
    ("overview.json", "HA group shards unobserved"): _NO_HA,
    ("overview.json", "Shards per probe"): _NO_HA,
    ("overview.json", "Last shard handover"): _NO_HA,
    ("overview.json", "Open and hanging transactions"): _NO_TRANSACTIONS,
    ("overview.json", "Oldest open transaction"): _NO_TRANSACTIONS,
    ("overview.json", "Partitions held by open transactions"): _NO_TRANSACTIONS,
    ("overview.json", "Records held back per partition"): _NO_LSO,
    ("partitions.json", "Eligible leader replicas per partition"): _NO_ELR,
    ("partitions.json", "Eligible leader replicas now"): _NO_ELR,
}
#: (dashboard, panel title) -> why it has data only while an alert rule is pending or firing:
#: these are checked for data in (b), while ConsumerLagHigh fires (and only parsed in (a))
WHILE_FIRING = {
    ("overview.json", "Alert rules pending or firing"):
        "Prometheus's ALERTS series exist only while a rule is pending or firing",
}
#: (dashboard, panel title) -> why every value it shows must be > 0 in (a) (the workload runs)
POSITIVE = {
    ("partitions.json", "High watermark rate per topic"): f"the producer writes {PRODUCE_PER_S} records/s",
    ("partitions.json", "High watermark rate per partition"): "the producer writes to both partitions",
    ("partitions.json", "Records retained per topic"): "nothing was deleted of what was written",
    ("consumer-groups.json", "Consumption vs production"): "the group commits what the producer writes",
    ("monitor-health.json", "Micro-batches per second"): "the job completes micro-batches",
    ("monitor-health.json", "State rows applied per second"): "every batch applies state rows",
    ("monitor-health.json", "State store keys"): "the job keeps state for partitions, a group and a source",
    ("monitor-health.json", "Micro-batch duration"): "a micro-batch takes time",
}
#: the HW rate of the topic must be about what the producer writes (x/4 .. 4x)
HW_RATE_PANEL = ("partitions.json", "High watermark rate per topic")
#: values some panels must show in (a), whatever else happens: 2 partitions, one group, nothing
#: under-replicated or offline on one node, the scrape and the query up
EXPECTED_VALUES = {
    ("overview.json", "Under-replicated partitions"): 0.0,
    ("overview.json", "Offline partitions"): 0.0,
    ("overview.json", "No eligible leader"): 0.0,
    ("overview.json", "Exporter scraped"): 1.0,
    ("overview.json", "Streaming query"): 1.0,
    ("partitions.json", "Partitions watched"): 2.0,
    ("partitions.json", "Under-replicated"): 0.0,
    ("partitions.json", "Offline (no leader)"): 0.0,
    ("partitions.json", "No eligible leader"): 0.0,
    ("partitions.json", "ISR shrinks open"): 0.0,
    ("consumer-groups.json", "Consumer groups"): 1.0,
    ("monitor-health.json", "Series refused"): 0.0,
    ("rebalances.json", "Groups watched"): 1.0,
    ("rebalances.json", "RebalanceStorm open"): 0.0,
    ("rebalances.json", "RebalanceStuck open"): 0.0,
    ("rebalances.json", "GroupEmptyWithLag open"): 0.0,
    ("client-metadata.json", "MetadataStale open"): 0.0,
    ("client-metadata.json", "MetadataRefreshStorm open"): 0.0,
    ("client-metadata.json", "Leader changes open"): 0.0,
    ("client-metadata.json", "Partition count changes open"): 0.0,
}


# -- the workload -------------------------------------------------------------------------------


class ProducerLoop:
    """Writes PRODUCE_PER_S records a second, alternating between the topic's two partitions."""

    def __init__(self, bootstrap: str, topic: str):
        self._p: Optional[Producer] = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 3})
        self._topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-producer", daemon=True)
        self.sent = 0
        self.errors: list[str] = []

    def start(self) -> "ProducerLoop":
        self._thread.start()
        return self

    def _run(self) -> None:
        per_tick = max(1, PRODUCE_PER_S // 10)
        p = self._p
        while not self._stop.is_set():
            for _ in range(per_tick):
                try:
                    p.produce(self._topic, value=b"order-%d" % self.sent, partition=self.sent % 2,
                              on_delivery=self._delivered)
                    self.sent += 1
                except BufferError:
                    break
            p.poll(0)
            self._stop.wait(0.1)

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(str(err))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        if self._p is not None:
            self._p.flush(5)
            self._p = None  # destroyed now, not when the broker is already gone


class GroupMember:
    """One consumer of the group: consumes and commits synchronously after every batch.
    stop() closes it, so it leaves the group and its committed offsets stop moving."""

    def __init__(self, bootstrap: str, topic: str, group: str):
        # Tansu holds JoinGroup for session.timeout.ms / 2: keep it small
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, "session.timeout.ms": 6000,
                            "heartbeat.interval.ms": 500, "log_level": 3})
        self._c.subscribe([topic])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"e2e-member-{group}", daemon=True)
        self.consumed = 0

    def start(self) -> "GroupMember":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                msgs = [m for m in self._c.consume(num_messages=500, timeout=0.2) if m.error() is None]
                if msgs:
                    self.consumed += len(msgs)
                    try:
                        self._c.commit(asynchronous=False)
                    except KafkaException:  # a rebalance in progress: the next batch commits
                        pass
        finally:
            self._c.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


# -- Prometheus with a copy of the rules ---------------------------------------------------------


def rules_with_a_short_lag_keep() -> dict:
    """The shipped rules with only ConsumerLagHigh's `keep_firing_for:` rewritten (its `for:` is
    the shipped 0s: the job's lag_high_for_ms holds it)."""
    spec = YAML(typ="safe", pure=True).load(RULES.read_text(encoding="utf-8"))
    found = 0
    for group in spec["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == LAG_ALERT:
                assert rule.get("for") == "0s", rule.get("for")
                rule["keep_firing_for"] = LAG_KEEP_FIRING
                found += 1
    assert found == 1, f"{RULES.name} defines {LAG_ALERT} {found} times"
    return spec


def prometheus_config(rules_path: Path, exporter_port: int) -> str:
    """The shipped config's `kafka-monitor` scrape job (its name is what the rules read),
    pointed at this run's exporter; everything every second.  JSON is YAML."""
    shipped = YAML(typ="safe", pure=True).load(PROM_CONFIG.read_text(encoding="utf-8"))
    job = next(j for j in shipped["scrape_configs"] if j["job_name"] == "kafka-monitor")
    job = {**job, "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}
    return json.dumps({"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                       "rule_files": [str(rules_path)], "scrape_configs": [job]}, indent=2)


# -- the stack ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tansu, spark, tmp_path_factory):
    if prometheus_binary() is None:
        pytest.fail("'prometheus' is not on PATH: install the Debian package prometheus", pytrace=False)
    tmp = tmp_path_factory.mktemp("prometheus-stack")
    names = {"cluster": unique("e2e.prom"), "topic": unique("e2e.orders"), "group": unique("e2e.billing")}
    events, alerts = unique("e2e-stack-events"), unique("e2e-stack-alerts")
    create_topics(tansu.bootstrap, {names["topic"]: 2, events: 3, alerts: 1})

    # one malformed event: the quarantine panels then have a series (counted, never fatal)
    bad = Producer({"bootstrap.servers": tansu.bootstrap, "log_level": 3})
    bad.produce(events, key=b"junk", value=b"{this is not json", partition=0)
    assert bad.flush(10) == 0
    del bad  # destroyed now, not when the broker is already gone

    with ExitStack() as cleanup:  # undone in reverse, also when a step here fails
        producer = ProducerLoop(tansu.bootstrap, names["topic"]).start()
        cleanup.callback(producer.stop)
        members: list[GroupMember] = [GroupMember(tansu.bootstrap, names["topic"], names["group"]).start()]

        def stop_members():
            for m in members:
                m.stop()
        cleanup.callback(stop_members)

        stop_probe = threading.Event()
        probe = Probe(ProbeConfig(bootstrap_servers=tansu.bootstrap, events_topic=events, interval_s=1,
                                  offsets_via="fetch", topics_include=f"^{re.escape(names['topic'])}$",
                                  groups_include=f"^{re.escape(names['group'])}$", cluster=names["cluster"],
                                  source="probe-e2e-stack"))
        probe_thread = threading.Thread(target=probe.run, args=(stop_probe,), name="e2e-probe", daemon=True)
        probe_thread.start()

        def stop_the_probe():
            if not stop_probe.is_set():
                stop_probe.set()
                probe_thread.join(15)
                probe.close(flush_timeout=2)
        cleanup.callback(stop_the_probe)

        exporter = Exporter()
        port = exporter.serve(0)
        cleanup.callback(exporter.shutdown)
        cfg = JobConfig(bootstrap_servers=tansu.bootstrap, checkpoint_dir=str(tmp / "ckpt"), events_topic=events,
                        trigger_s=1, buckets=4, metrics_port=port, alerts_topic=alerts,
                        rules={"lag": dict(LAG_RULES)})
        # start() registers the query's progress listener: Spark's progress -> the job's gauges
        # (events behind, state rows, trigger duration), as in streaming.job.run()
        query = start(spark, cfg, exporter, query_name=unique("e2e-stack"))

        def stop_the_query():
            # Workload and probe first: stop_query waits for a gap between micro-batches, and
            # while events keep coming each batch starts as the previous one ends (it waited
            # its whole 60 s timeout that way).
            producer.stop()
            stop_members()
            stop_the_probe()
            stop_query(query)
        cleanup.callback(stop_the_query)

        rules_copy = tmp / "kafka-monitor.rules.short-lag-for.yml"
        rules_copy.write_text(json.dumps(rules_with_a_short_lag_keep(), indent=2), encoding="utf-8")
        prom = PrometheusServer(prometheus_config(rules_copy, port), tmp / "prometheus").start()
        cleanup.callback(prom.stop)

        def restart_group() -> GroupMember:
            members.append(GroupMember(tansu.bootstrap, names["topic"], names["group"]).start())
            return members[-1]

        yield {"prom": prom, "names": names, "query": query, "producer": producer, "members": members,
               "restart_group": restart_group}


def healthy(stack) -> None:
    q = stack["query"]
    assert q.exception() is None, f"the streaming query failed: {q.exception()}"
    assert not stack["producer"].errors, f"the producer failed: {stack['producer'].errors[:3]}"


def lag_alerts(stack) -> list[dict]:
    n = stack["names"]
    return [a for a in stack["prom"].alerts() if a["labels"].get("alertname") == LAG_ALERT
            and a["labels"].get("group") == n["group"] and a["labels"].get("topic") == n["topic"]]


# -- dashboards against the real thing ----------------------------------------------------------


def regex_literal(value: str) -> str:
    """A value as Grafana writes it into label=~"...": regex metacharacters escaped, inside a
    PromQL double-quoted string (so the backslash is doubled)."""
    return re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\\\1", value)


def substitute(expr: str, values: dict[str, str]) -> str:
    out = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in values.items():
        out = re.sub(rf"\$\{{?{name}\}}?\b", lambda _m, v=value: regex_literal(v), out)
    assert "$" not in out, f"a template variable is left in {out!r}"
    return out


def resolve_variables(prom: PrometheusServer, dashboard: dict, wanted: dict[str, str]) -> dict[str, str]:
    """Run each template variable's label_values query (with the variables before it set) the way
    Grafana does (/api/v1/label/<label>/values?match[]=<selector>); it must list this run's value."""
    values: dict[str, str] = {}
    for v in dashboard["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"].strip())
        assert m, f"{dashboard['uid']} variable {v['name']}: not a label_values query: {v['query']!r}"
        listed = prom.label_values(m.group(2), match=substitute(m.group(1), values))
        assert wanted[v["name"]] in listed, (f"{dashboard['uid']} variable {v['name']} ({v['query']}) lists "
                                             f"{listed}, not this run's {wanted[v['name']]!r}")
        values[v["name"]] = wanted[v["name"]]
    return values


def panel_queries(stack) -> dict[tuple[str, str, str], str]:
    """(dashboard, panel title, refId) -> the query with this run's variable values."""
    out = {}
    for path in sorted(DASH_DIR.glob("*.json")):
        d = json.loads(path.read_text(encoding="utf-8"))
        values = resolve_variables(stack["prom"], d, stack["names"])
        for p in d["panels"]:
            for t in p["targets"]:
                out[(path.name, p["title"], t["refId"])] = substitute(t["expr"], values)
    return out


def run(prom: PrometheusServer, key: tuple[str, str, str], expr: str, at: Optional[float] = None) -> list[dict]:
    try:
        return prom.query(expr, at)
    except QueryError as e:
        pytest.fail(f"{key[0]} panel {key[1]!r} target {key[2]}: Prometheus refused the query: {e}", pytrace=False)


def wait_for_first_data(stack) -> None:
    """Scraped HW, ISR and lag series for this run's topic and group, and the group's state (the
    rebalances dashboard lists groups from it).  The group's state is its own event, which can
    land in a later micro-batch than its partitions' offsets: each must be waited for."""
    prom, n = stack["prom"], stack["names"]

    def present():
        healthy(stack)
        part = f'cluster="{n["cluster"]}", topic="{n["topic"]}"'
        return (prom.query(f"kafka_monitor_partition_high_watermark{{{part}}}")
                and prom.query(f"kafka_monitor_partition_in_sync_replicas{{{part}}}")
                and prom.query(f'kafka_monitor_group_partition_lag{{{part}, group="{n["group"]}"}}')
                and prom.query(f'kafka_monitor_group_state{{cluster="{n["cluster"]}", group="{n["group"]}"}}'))

    wait_for(present, timeout=150, interval=1, what="the first HW, ISR, lag and group state of this run in "
             f"Prometheus (query status {stack['query'].status})")


def test_every_dashboard_panel_returns_data_from_a_real_run(stack):
    prom = stack["prom"]
    wait_for_first_data(stack)
    queries = panel_queries(stack)
    titles = {k[:2] for k in queries}
    for listed in (MAY_BE_EMPTY, WHILE_FIRING, POSITIVE, EXPECTED_VALUES):
        stale = set(listed) - titles
        assert not stale, f"listed panels that no dashboard has (rename?): {sorted(stale)}"

    pending = dict(queries)
    results: dict[tuple[str, str, str], list[dict]] = {}

    def acceptable(key: tuple[str, str, str], result: list[dict]) -> bool:
        if key[:2] in MAY_BE_EMPTY or key[:2] in WHILE_FIRING:
            return True  # it parsed
        values = [float(s["value"][1]) for s in result]
        if key[:2] in POSITIVE and not all(v > 0 for v in values):
            return False
        if key[:2] == HW_RATE_PANEL and not all(PRODUCE_PER_S / 4 <= v <= PRODUCE_PER_S * 4 for v in values):
            return False
        return bool(values)

    deadline = time.monotonic() + 90
    while True:  # poll every query until it shows what it must; a refused query fails at once
        healthy(stack)
        for key, expr in list(pending.items()):
            result = run(prom, key, expr)
            results[key] = result
            if acceptable(key, result):
                del pending[key]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not pending, ("panels without data for 90 s, or (POSITIVE) with a value <= 0; list one in "
                         "MAY_BE_EMPTY only with the reason it has none in this run:\n"
                         + "\n".join(f"{k[0]} {k[1]!r} {k[2]}: {[s['value'][1] for s in results[k]]}\n  {v}"
                                      for k, v in pending.items()))

    wrong = []
    for (dash, title), want in EXPECTED_VALUES.items():
        for key, result in results.items():
            if key[:2] == (dash, title):
                got = [float(s["value"][1]) for s in result]
                if got != [want]:
                    wrong.append(f"{dash} {title!r} {key[2]}: {got}, expected [{want}]")
    assert not wrong, "panels showing wrong values:\n" + "\n".join(wrong)

    # The alert counts per severity are what kafka_monitor_alert_active holds for this cluster,
    # both read at one instant (whatever alerts the job's rules open on this run).
    at = time.time()
    for key, expr in queries.items():
        if key[:2] == ("overview.json", "Open alerts by severity"):
            severity = re.search(r'severity="(\w+)"', expr).group(1)
            raw = prom.query(f'kafka_monitor_alert_active{{cluster="{stack["names"]["cluster"]}", '
                             f'severity="{severity}"}}', at)
            entities = {tuple(sorted((k, v) for k, v in s["metric"].items() if k not in ("instance", "job")))
                        for s in raw}
            got = [float(s["value"][1]) for s in run(prom, key, expr, at)]
            assert got == [float(len(entities))], f"{severity} alerts: the panel shows {got}, the series {raw}"


def test_consumer_lag_alert_fires_when_the_group_stops_and_resolves_when_it_catches_up(stack):
    prom, n = stack["prom"], stack["names"]
    wait_for_first_data(stack)

    # the copy of the rules is what Prometheus evaluates
    rules = [r for g in prom.rule_groups() for r in g["rules"]]
    loaded = {r["name"]: r for r in rules}
    assert 'kafka_monitor_alert_active{alert="ConsumerLagHigh"}' in loaded[LAG_ALERT]["query"], loaded[LAG_ALERT]["query"]
    assert loaded[LAG_ALERT]["duration"] == 0  # held by the job (lag_high_for_ms), not by Prometheus
    assert len(rules) == sum(len(g["rules"]) for g in YAML(typ="safe", pure=True).load(RULES.read_text())["groups"])

    # precondition: a group that keeps up does not fire it (or a firing alert would prove nothing)
    def not_firing():
        healthy(stack)
        return not any(a["state"] == "firing" for a in lag_alerts(stack))

    wait_for(not_firing, timeout=60, interval=1, what=f"{LAG_ALERT} not firing while the group keeps up")

    # (b) the group stops; the producer goes on
    stack["members"][-1].stop()

    def firing():
        healthy(stack)
        return [a for a in lag_alerts(stack) if a["state"] == "firing"]

    alerts = wait_for(firing, timeout=90, interval=1,
                      what=f"{LAG_ALERT} to fire for group {n['group']} on {n['topic']}")
    assert len(alerts) == 1, alerts
    labels = alerts[0]["labels"]
    assert labels == {"alertname": LAG_ALERT, "severity": "warning", "cluster": n["cluster"], "group": n["group"],
                      "topic": n["topic"]}, "one alert per (cluster, group, topic), no partition/job/instance"
    assert float(alerts[0]["value"]) >= 1, "the value counts the topic's partitions the job has above the threshold"

    # the panels that need a pending or firing alert have data now
    queries = panel_queries(stack)
    for key, expr in queries.items():
        if key[:2] in WHILE_FIRING:
            result = run(prom, key, expr)
            assert any(s["metric"].get("alertname") == LAG_ALERT for s in result), \
                f"{key[0]} panel {key[1]!r} does not show the firing {LAG_ALERT}: {result}"

    # (c) the group comes back and catches up: the alert resolves (gone from /api/v1/alerts)
    member = stack["restart_group"]()

    def resolved():
        healthy(stack)
        return not lag_alerts(stack)

    wait_for(resolved, timeout=90, interval=1, what=f"{LAG_ALERT} to resolve once the group is back")
    assert member.consumed > 0, "the group came back but consumed nothing: what resolved the alert?"
