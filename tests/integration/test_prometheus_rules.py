"""The Prometheus alerting rules (deploy/prometheus/rules) against the real tools.

- ``promtool check rules`` on the rules file and ``promtool test rules`` on every unit-test
  file in deploy/prometheus/tests (series in -> expected alerts out);
- a real Prometheus server loads the rules and evaluates them without errors;
- what promtool cannot check: every metric a rule reads is one the exporter serves
  (``streaming.sinks.catalogue.CATALOGUE``), every alert carries for/severity/summary/description/
  runbook, and every alert has a promtool case where it fires and one where it must not.

promtool and prometheus come from the Debian package ``prometheus`` (2.42 on bookworm).
Without them these tests fail (they do not skip): the rules would otherwise go unchecked.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML  # a dev dependency (pyproject)

from kafka_monitor.local.broker import die_with_parent, free_port, stop_process
from streaming.sinks.catalogue import CATALOGUE
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "deploy" / "prometheus"
RULES = PROM_DIR / "rules" / "kafka-monitor.rules.yml"
TEST_FILES = sorted((PROM_DIR / "tests").glob("*.test.yml"))

#: group -> alerts; the names are part of the product (routes, silences, dashboards use them).
#: An alert the job decides has the job's name (streaming.rules.base.Alert); ConsumerLagStatus has
#: one rule per status.  Only the monitor's own health (KafkaMonitor*) is Prometheus's.
EXPECTED_GROUPS = {
    "kafka-monitor.kafka": ["ConsumerLagHigh", "IsrShrink", "UnderReplicated", "OfflinePartition",
                            "PartitionNoEligibleLeader"],
    "kafka-monitor.consumers": ["ConsumerLagStatus"] * 4 + ["RebalanceStorm", "RebalanceStuck", "GroupEmptyWithLag"],
    "kafka-monitor.partitions": ["UnderMinIsr", "AtMinIsr", "HighWatermarkStalled", "PartitionUnobserved",
                                 "LeaderChanged", "PreferredLeaderImbalance", "PartitionCountChanged"],
    "kafka-monitor.clients": ["MetadataStale", "MetadataRefreshStorm"],
    "kafka-monitor.brokers": ["BrokerDown", "BrokerUnderReplicating", "BrokerStallingWrites", "LogDirOffline",
                              "LogDirFilling"],
    "kafka-monitor.quorum": ["QuorumUnavailable", "QuorumVoterLagging", "QuorumLeaderFlapping",
                             "BrokerMetadataLagging"],
    "kafka-monitor.transactions": ["HangingTransaction"],
    "kafka-monitor.self": ["SourceSilent", "ShardUnobserved", "KafkaMonitorProbeFallingBehind",
                           "KafkaMonitorJobDown", "KafkaMonitorJobFallingBehind", "KafkaMonitorJobSourceUnreadable",
                           "KafkaMonitorEventsQuarantined", "KafkaMonitorQuorumUnobserved"],
}
SEVERITIES = {"info", "warning", "critical"}
#: labels a rule may group or match on: the metrics' vocabulary plus the scrape's own labels
LABELS = {"cluster", "topic", "partition", "group", "source", "broker", "alert", "severity", "reason", "job",
          "instance"}
METRIC = re.compile(r"kafka_monitor_[a-z0-9_]+")
SUFFIXES = ("_bucket", "_count", "_sum")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"'{name}' is not on PATH: install Debian package prometheus "
                    f"(apt-get install -y prometheus) to get prometheus and promtool", pytrace=False)
    return path


def promtool_ok(*args: str) -> None:
    """Run promtool; on a non-zero exit fail with its whole output (what failed, expected/got)."""
    p = subprocess.run([tool("promtool"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        pytest.fail(f"promtool {' '.join(args)} exited {p.returncode}:\n{p.stdout}{p.stderr}", pytrace=False)


def load_yaml(path: Path) -> Any:
    return YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))


def alerting_rules() -> list[dict]:
    return [r for g in load_yaml(RULES)["groups"] for r in g["rules"] if "alert" in r]


def rule(name: str) -> dict:
    return next(r for r in alerting_rules() if r["alert"] == name)


# -- promtool -----------------------------------------------------------------------------------


def test_promtool_check_rules():
    promtool_ok("check", "rules", str(RULES.relative_to(ROOT)))


def test_there_are_promtool_unit_tests():
    assert TEST_FILES, f"no *.test.yml in {(PROM_DIR / 'tests').relative_to(ROOT)}"


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests(test_file: Path):
    promtool_ok("test", "rules", str(test_file.relative_to(ROOT)))


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_unit_tests_load_the_shipped_rules_every_minute(test_file: Path):
    """A test file that loaded a copy of the rules, or evaluated at another pace, would prove
    nothing about the shipped file (and `for:` arithmetic in the cases assumes 1m)."""
    spec = load_yaml(test_file)
    assert [(test_file.parent / f).resolve() for f in spec["rule_files"]] == [RULES.resolve()]
    assert spec.get("evaluation_interval") == "1m"


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    cases: dict[str, set[bool]] = {}
    for f in TEST_FILES:
        for t in load_yaml(f)["tests"]:
            for c in t.get("alert_rule_test") or []:
                cases.setdefault(c["alertname"], set()).add(bool(c.get("exp_alerts")))
    missing = [f"{r['alert']}: no case where it {'fires' if want else 'must not fire'}"
               for r in alerting_rules() for want in (True, False) if want not in cases.get(r["alert"], set())]
    assert not missing, "promtool unit tests missing:\n" + "\n".join(missing)
    unknown = set(cases) - {r["alert"] for r in alerting_rules()}
    assert not unknown, f"unit tests for alerts the rules do not define: {sorted(unknown)}"


# -- what the rules say ---------------------------------------------------------------------------


def test_groups_and_alert_names_are_the_products():
    groups = {g["name"]: [r.get("alert") or r.get("record") for r in g["rules"]] for g in load_yaml(RULES)["groups"]}
    assert groups == EXPECTED_GROUPS


def test_every_alert_has_for_severity_summary_description_runbook():
    problems = []
    for r in alerting_rules():
        name, labels, ann = r["alert"], r.get("labels") or {}, r.get("annotations") or {}
        if not re.fullmatch(r"(\d+[smh])+", str(r.get("for", ""))):
            problems.append(f"{name}: for: missing or not a duration ({r.get('for')!r})")
        if labels.get("severity") not in SEVERITIES:
            problems.append(f"{name}: labels.severity must be one of {sorted(SEVERITIES)}, got {labels.get('severity')!r}")
        for key in ("summary", "description", "runbook"):
            if not str(ann.get(key, "")).strip():
                problems.append(f"{name}: annotations.{key} missing or empty")
        if "{{ $labels." not in str(ann.get("summary", "")):
            problems.append(f"{name}: annotations.summary templates no label value")
    assert not problems, "\n".join(problems)


def test_rules_group_and_match_only_on_the_label_vocabulary():
    problems = []
    for r in alerting_rules():
        for clause in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", r["expr"]):
            for label in filter(None, (s.strip() for s in clause.split(","))):
                if label not in LABELS:
                    problems.append(f"{r['alert']}: label {label!r} is not in the vocabulary {sorted(LABELS)}")
    assert not problems, "\n".join(problems)


def test_every_metric_the_rules_read_is_in_the_exporter_catalogue():
    def known(name: str) -> bool:
        return name in CATALOGUE or any(name.endswith(s) and name[: -len(s)] in CATALOGUE for s in SUFFIXES)

    seen, unknown = set(), []
    for r in alerting_rules():
        texts = {"expr": r["expr"], **{f"annotations.{k}": str(v) for k, v in (r.get("annotations") or {}).items()}}
        for where, text in texts.items():
            for name in METRIC.findall(text):
                seen.add(name)
                if not known(name):
                    unknown.append(f"{r['alert']} {where}: {name}")
    assert seen, "no kafka_monitor_* metric found in the rules (is the pattern right?)"
    assert not unknown, "metrics the exporter does not serve (streaming.sinks.catalogue.CATALOGUE):\n" + "\n".join(unknown)


def rules_named(name: str) -> list[dict]:
    return [r for r in alerting_rules() if r["alert"] == name]


def test_every_alert_the_job_decides_is_relayed_under_its_own_name():
    """One name everywhere: the job's alert X is the Prometheus alert X, read from
    kafka_monitor_alert_active{alert="X"} at the job's severity; an alert the job opens at once
    from its age against the job's notify hold, with no `for:` of its own; ConsumerLagStatus
    (whose severity depends on the status) from the job's status gauges, one rule per status."""
    from streaming.rules.base import SEVERITY, Alert
    from streaming.rules.lag import STATUS_SEVERITY
    from streaming.rules.notify import FIELDS

    NOTIFY_HELD = set(FIELDS.values())

    problems = []
    for a in Alert:
        rules = rules_named(a.value)
        if not rules:
            problems.append(f"{a.value}: no Prometheus rule of that name")
        elif a is Alert.CONSUMER_LAG_STATUS:
            statuses = {r["labels"].get("status"): r for r in rules}
            want = {st.name: sev for st, sev in STATUS_SEVERITY.items() if sev is not None}
            if set(statuses) != set(want):
                problems.append(f"ConsumerLagStatus: rules for statuses {sorted(statuses)}, the job's are {sorted(want)}")
            for st, r in statuses.items():
                if f'kafka_monitor_group_topic_lag_status_partitions{{status="{st}"}}' not in r["expr"]:
                    problems.append(f"ConsumerLagStatus status={st} does not read the job's {st} count")
                sev = want.get(st)
                if sev and r["labels"]["severity"] != sev.name.lower():
                    problems.append(f"ConsumerLagStatus status={st}: severity {r['labels']['severity']}, "
                                    f"the job's is {sev.name.lower()}")
        elif a in NOTIFY_HELD:
            (r,) = rules
            if (f'kafka_monitor_alert_opened_timestamp_seconds{{alert="{a.value}"}}' not in r["expr"]
                    or "kafka_monitor_alert_notify_after_seconds" not in r["expr"]):
                problems.append(f"{a.value} does not compare its age with the job's [job.rules.notify] hold")
            if r.get("for") != "0s":
                problems.append(f"{a.value}: for: {r.get('for')!r}, a hold beside the job's notify hold")
            if r["labels"]["severity"] != SEVERITY[a].name.lower():
                problems.append(f"{a.value}: severity {r['labels']['severity']}, the job's is {SEVERITY[a].name.lower()}")
        else:
            (r,) = rules
            if f'kafka_monitor_alert_active{{alert="{a.value}"}}' not in r["expr"]:
                problems.append(f"{a.value} does not read kafka_monitor_alert_active{{alert=\"{a.value}\"}}")
            if r["labels"]["severity"] != SEVERITY[a].name.lower():
                problems.append(f"{a.value}: severity {r['labels']['severity']}, the job's is {SEVERITY[a].name.lower()}")
    others = {r["alert"] for r in alerting_rules()} - {a.value for a in Alert}
    problems += [f"{n}: neither a job alert nor the monitor's own (KafkaMonitor*)"
                 for n in sorted(others) if not n.startswith("KafkaMonitor")]
    assert not problems, "\n".join(problems)


#: a comparison with a number, e.g. `> 1000`, `>= 3`, `< 0.5` (not `> 0`, "is there one")
NUMERIC_THRESHOLD = re.compile(r"(?<![<>=!])(?:>=|<=|>|<|==|!=)\s*(?!0(?![0-9.]))([0-9][0-9.e+]*)")


def test_no_rule_repeats_a_threshold_the_job_owns():
    """The drift test: Kafka's health is decided once, by the job's [job.rules.*] settings.
    A relay that compared a gauge with a number of its own (the old KafkaConsumerLagHigh at
    1000 offsets against the job's 10000) would page on a different condition than the job's
    alert with the same name."""
    problems = [f"{r['alert']}: {m.group(0)!r} in {' '.join(r['expr'].split())!r}"
                for r in alerting_rules() if not r["alert"].startswith("KafkaMonitor")
                for m in NUMERIC_THRESHOLD.finditer(r["expr"])]
    assert not problems, ("rules for job alerts compare with numbers of their own; set the job's "
                          "[job.rules.*] setting instead:\n" + "\n".join(problems))


def test_the_drift_check_sees_a_threshold():
    assert NUMERIC_THRESHOLD.search("max by (cluster) (kafka_monitor_group_topic_lag_max) > 1000")
    assert NUMERIC_THRESHOLD.search("count by (topic) (x) >= 3")
    assert not NUMERIC_THRESHOLD.search("max by (cluster) (kafka_monitor_alert_active{alert=\"X\"}) > 0")


# -- a real Prometheus server ---------------------------------------------------------------------


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A Prometheus server on a free loopback port that loads the shipped rules and evaluates
    them every second (it scrapes nothing); stopped by its PID at the end, even on failure."""
    binary = tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    config = tmp / "prometheus.yml"
    config.write_text("global:\n  evaluation_interval: 1s\n"
                      f"rule_files:\n  - {json.dumps(str(RULES))}\n", encoding="utf-8")
    port = free_port()
    log_path = tmp / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
             f"--storage.tsdb.path={tmp / 'data'}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    server = {"url": f"http://127.0.0.1:{port}", "proc": proc, "log": log_path}
    try:
        yield server
    finally:
        stop_process(proc)


def api(server: dict, path: str) -> Any:
    """GET an API path; None while the server is not answering yet.  Fails with the server's log
    if the process has exited (a config or rules error, or a port taken)."""
    if server["proc"].poll() is not None:
        tail = server["log"].read_text(errors="replace")[-3000:]
        pytest.fail(f"prometheus exited with code {server['proc'].returncode}:\n{tail}", pytrace=False)
    try:
        return http_json(server["url"] + path)["data"]
    except (urllib.error.URLError, ConnectionError):
        return None


def test_prometheus_loads_and_evaluates_the_rules(prometheus):
    def evaluated():
        data = api(prometheus, "/api/v1/rules")
        if not data or not data["groups"]:
            return None
        rules = [r for g in data["groups"] for r in g["rules"]]
        return data if all(r.get("health") != "unknown" for r in rules) else None

    data = wait_for(evaluated, timeout=30, what="Prometheus to load and evaluate the rule groups")
    loaded = {g["name"]: [r["name"] for r in g["rules"]] for g in data["groups"]}
    assert loaded == EXPECTED_GROUPS
    errors = [f"{r['name']}: {r['health']} {r.get('lastError', '')}" for g in data["groups"] for r in g["rules"]
              if r["health"] != "ok"]
    assert not errors, "rules that failed to evaluate:\n" + "\n".join(errors)


def test_prometheus_with_nothing_to_scrape_holds_job_down_pending(prometheus):
    """With no kafka-monitor target, KafkaMonitorJobDown's absent() branch is pending (firing
    would take its 2m `for:`), and it is the only alert."""
    def alerts():
        data = api(prometheus, "/api/v1/alerts")
        return data["alerts"] if data and data["alerts"] else None

    active = wait_for(alerts, timeout=30, what="KafkaMonitorJobDown to go pending")
    assert [(a["labels"]["alertname"], a["labels"].get("reason"), a["state"]) for a in active] == [
        ("KafkaMonitorJobDown", "no_series", "pending")]
