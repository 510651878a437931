"""The Prometheus rules and the Alertmanager configuration keep clusters apart (issue 34): one
job watching two clusters serves ``orders`` partition 0 twice, once per ``cluster``.  An
aggregation that drops ``cluster``, or a vector match that ignores it, would merge the two into
one alert (or fail on duplicate series).  Every aggregation over a series that carries
``cluster`` must keep it, every ``on (...)`` match against such a series must name it, every
query in an annotation must filter on it, and Alertmanager must group and inhibit within a
cluster.  (promtool, amtool and a real Prometheus check the files in tests/integration; this is
the part that needs none of them.)"""

from __future__ import annotations

import re
from pathlib import Path

from ruamel.yaml import YAML

from streaming.sinks.catalogue import CATALOGUE

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules" / "kafka-monitor.rules.yml"
AGGREGATION = re.compile(r"\b(sum|min|max|avg|count|stddev|stdvar|topk|bottomk|quantile|count_values|group)\s*"
                         r"(?:(by|without)\s*\(([^)]*)\)\s*)?\(")
MATCH = re.compile(r"\b(on|ignoring)\s*\(([^)]*)\)\s*(?:(?:group_left|group_right)\s*(?:\([^)]*\))?)?\s*")
METRIC = re.compile(r"\bkafka_monitor_[a-z0-9_]+")


def clustered(metric: str) -> bool:
    for suffix in ("", "_bucket", "_sum", "_count"):
        name = metric[: len(metric) - len(suffix)] if suffix and metric.endswith(suffix) else metric
        if name in CATALOGUE:
            return "cluster" in CATALOGUE[name][2]
    raise AssertionError(f"{metric}: not in the exporter's catalogue")


def _argument(expr: str, open_at: int) -> tuple[str, int]:
    """The text inside the parenthesis opening at ``open_at``, and the position after it."""
    depth = 0
    for i in range(open_at, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return expr[open_at + 1:i], i + 1
    raise AssertionError(f"unbalanced parentheses in {expr!r}")


def _labels(text: str) -> set[str]:
    return {s.strip() for s in text.split(",") if s.strip()}


def _keeps(mode: str | None, labels: set[str]) -> bool:
    return (mode == "by" and "cluster" in labels) or (mode == "without" and "cluster" not in labels)


def _grouping(expr: str, m: re.Match) -> tuple[str | None, set[str], str]:
    """An aggregation's mode (by/without/None), labels and argument; the clause may also follow
    the argument (``sum (x) by (l)``)."""
    arg, end = _argument(expr, m.end() - 1)
    mode, labels = m.group(2), m.group(3)
    after = re.match(r"\s*(by|without)\s*\(([^)]*)\)", expr[end:])
    if after:
        mode, labels = after.group(1), after.group(2)
    return mode, _labels(labels or ""), arg


def _carries_cluster(operand: str) -> bool:
    """Whether the right-hand operand of a vector match has a cluster label: an aggregation by
    what it keeps; anything else (a selector, a function of one) by its first metric."""
    m = AGGREGATION.match(operand)
    if m:
        mode, labels, arg = _grouping(operand, m)
        return _keeps(mode, labels) and any(clustered(n) for n in METRIC.findall(arg))
    first = METRIC.search(operand)
    return first is not None and clustered(first.group(0))


def merging(expr: str) -> list[str]:
    """The places where ``expr`` merges or mismatches clusters."""
    out = []
    for m in AGGREGATION.finditer(expr):
        mode, labels, arg = _grouping(expr, m)
        if any(clustered(n) for n in METRIC.findall(arg)) and not _keeps(mode, labels):
            out.append(f"{m.group(1)} {mode or ''} ({', '.join(sorted(labels))}) over a clustered series")
    for m in MATCH.finditer(expr):
        labels = _labels(m.group(2))
        if _carries_cluster(expr[m.end():]) and (("cluster" not in labels) if m.group(1) == "on" else
                                                 ("cluster" in labels)):
            out.append(f"{m.group(1)} ({m.group(2)}) against a clustered series")
    return out


def alerting_rules() -> list[dict]:
    spec = YAML(typ="safe", pure=True).load(RULES.read_text(encoding="utf-8"))
    return [r for g in spec["groups"] for r in g["rules"] if "alert" in r]


def test_no_rule_merges_clusters():
    problems = [f"{r['alert']}: {p}" for r in alerting_rules() for p in merging(r["expr"])]
    assert not problems, "\n".join(problems)


def test_every_alert_about_a_cluster_says_which():
    """An alert whose expression reads clustered series carries ``cluster`` (its summary names it)."""
    problems = [r["alert"] for r in alerting_rules() if any(clustered(n) for n in METRIC.findall(r["expr"]))
                and "$labels.cluster" not in r["annotations"]["summary"]]
    assert not problems, problems


def test_every_annotation_query_filters_on_the_alerts_cluster():
    problems = []
    for r in alerting_rules():
        for key, text in (r.get("annotations") or {}).items():
            for q in re.findall(r'printf\s+"((?:[^"\\]|\\.)*)"', str(text)):
                for sel in re.finditer(r"(kafka_monitor_[a-z0-9_]+)(\{[^}]*\})?", q):
                    if clustered(sel.group(1)) and "cluster=%q" not in (sel.group(2) or ""):
                        problems.append(f"{r['alert']} {key}: {sel.group(0)}")
    assert not problems, "\n".join(problems)


def test_the_check_sees_what_merges_clusters():
    assert merging('sum by (topic) (kafka_monitor_alert_active{alert="X"}) > 0')
    assert merging("max(kafka_monitor_partition_leader)")
    assert merging("max without (cluster) (kafka_monitor_partition_leader)")
    assert merging("count by (cluster) (max by (topic, partition) (kafka_monitor_partition_leader))")
    assert merging("kafka_monitor_source_cycle_duration_seconds > on (source) group_left "
                   "kafka_monitor_source_heartbeat_interval_seconds")
    assert merging("kafka_monitor_partition_leader > ignoring (cluster) kafka_monitor_partition_replicas")
    assert not merging("max by (cluster, topic) (kafka_monitor_partition_leader)")
    assert not merging("sum (kafka_monitor_partition_leader) by (cluster)")
    assert not merging("max by (job, instance) (kafka_monitor_job_up)")  # the job's own: no cluster
    assert not merging('time() - kafka_monitor_alert_opened_timestamp_seconds{alert="X"} >= on (alert) '
                       "group_left () max by (alert) (kafka_monitor_alert_notify_after_seconds)")


def test_alertmanager_groups_and_inhibits_per_cluster():
    """A notification groups one cluster's alerts; an alert inhibits only its own cluster's
    (the monitor's own, KafkaMonitor*, carry no cluster)."""
    spec = YAML(typ="safe", pure=True).load((RULES.parents[2] / "alertmanager" / "alertmanager.yml").read_text())

    def routes(r: dict):
        yield r
        for child in r.get("routes") or []:
            yield from routes(child)
    problems = [f"route {r.get('matchers')}: group_by {r['group_by']}" for r in routes(spec["route"])
                if "group_by" in r and "cluster" not in r["group_by"]]
    for rule in spec["inhibit_rules"]:
        names = re.findall(r'alertname=~?"([^"]*)"', " ".join(rule["source_matchers"] + rule["target_matchers"]))
        if not all(n.startswith("KafkaMonitor") for n in names) and "cluster" not in rule["equal"]:
            problems.append(f"inhibit {names}: equal {rule['equal']}")
    assert not problems, "\n".join(problems)
