#!/usr/bin/env python3
"""Generate the Grafana dashboards in this folder from one description.

    python dashboards/generate.py           # (re)write dashboards/*.json
    python dashboards/generate.py --check   # exit 1 if a committed file differs from the output
    python dashboards/generate.py --config kafka-monitor.toml --out DIR
                                            # with your [job.rules.*] thresholds, into DIR

The JSON files are committed (Grafana's file provisioning reads them as they are); this
script is their source.  Thresholds drawn on panels are the job's rule settings
([job.rules.*], docs/settings.md "Alert rule settings"): the committed files use their defaults,
``--config`` the values of your config file (and KAFKA_MONITOR_JOB_RULES_* variables).  tests/integration/test_dashboards.py fails when a committed file
differs from what this script writes, and tests/e2e/test_prometheus_stack.py runs every panel
query against a real Prometheus scraping a real run of the product.

Conventions every panel follows:
- datasource: the Prometheus datasource with uid ``prometheus`` (provisioned by
  deploy/grafana/provisioning/datasources/prometheus.yml), on the panel and on each target;
- only metrics the exporter serves (streaming.sinks.catalogue.CATALOGUE) plus Prometheus's own
  ``up`` and ``ALERTS``; no metric is invented for what the exporter does not serve yet
  (rebalance phases and their durations, per-client partition-count catch-up);
- entity series are aggregated with ``max by (<entity labels>)`` before anything else, so two
  exporter replicas scraped side by side show one value per entity (as the alert rules do);
- offsets are gauges, so their per-second rates use ``deriv()`` (``rate()`` would read an
  offset that moves back — a reset or a recreated topic — as a counter reset and spike);
- stat panels that count problems fall back to 0 only while there is something being
  watched (``or 0 * count(<what is watched>)``): "0" means "looked and found nothing",
  "No data" means "the monitor sees nothing" — never the same picture.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from streaming.rules.base import Alert  # noqa: E402
from streaming.rules.client import ClientRulesConfig  # noqa: E402
from streaming.rules.group import GroupRulesConfig  # noqa: E402
from streaming.rules.lag_config import LagConfig  # noqa: E402
from streaming.rules.logdirs import LogDirRulesConfig  # noqa: E402
from streaming.rules.partition_config import PartitionRulesConfig  # noqa: E402
from streaming.rules.quorum import QuorumRulesConfig  # noqa: E402
from streaming.rules.source import SourceRulesConfig  # noqa: E402
from streaming.rules.transactions import TransactionRulesConfig  # noqa: E402

#: the Grafana dashboard JSON schema version written (Grafana 10.3 - 11.x write 39; newer
#: versions migrate it on load)
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
HERE = Path(__file__).resolve().parent
TAG = "kafka-monitor"

# -- selectors -------------------------------------------------------------------------------

CLUSTER = 'cluster=~"$cluster"'
GROUP = 'cluster=~"$cluster", group=~"$group"'
PART = 'cluster=~"$cluster", topic=~"$topic"'
GPART = 'cluster=~"$cluster", topic=~"$topic", group=~"$group"'

PK = "cluster, topic, partition"          # a partition
GK = "cluster, group, topic, partition"   # a group's partition

HW = "kafka_monitor_partition_high_watermark"
LOG_START = "kafka_monitor_partition_log_start_offset"
LEADER = "kafka_monitor_partition_leader"
REPLICAS = "kafka_monitor_partition_replicas"
ISR = "kafka_monitor_partition_in_sync_replicas"
#: eligible leader replicas (KIP-966) and the last-known ELR: sizes, served only while a partition has
#: no leader or a short ISR and the probe knows them (Kafka 4.1+; docs/elr.md)
ELR = "kafka_monitor_partition_eligible_leader_replicas"
LAST_KNOWN_ELR = "kafka_monitor_partition_last_known_elr"
#: the job's alert for an offline partition with no replica left to elect without data loss
NO_ELIGIBLE_LEADER = "PartitionNoEligibleLeader"
COMMITTED = "kafka_monitor_group_partition_committed_offset"
LAG = "kafka_monitor_group_partition_lag"
LAG_SECONDS = "kafka_monitor_group_partition_lag_seconds"
LAG_STATUS = "kafka_monitor_group_partition_lag_status"
GROUP_STATE = "kafka_monitor_group_state"
GROUP_MEMBERS = "kafka_monitor_group_members"
METADATA_REFRESH = "kafka_monitor_client_last_metadata_refresh_timestamp_seconds"
HEARTBEAT = "kafka_monitor_source_last_heartbeat_timestamp_seconds"
ALERT_ACTIVE = "kafka_monitor_alert_active"
QUORUM_UP = "kafka_monitor_quorum_up"
QUORUM_LEADER = "kafka_monitor_quorum_leader"
QUORUM_EPOCH = "kafka_monitor_quorum_leader_epoch"
QUORUM_LAG = "kafka_monitor_quorum_replica_lag"
QUORUM_CAUGHT_UP_AGE = "kafka_monitor_quorum_replica_caught_up_age_seconds"
#: the job's alerts on the KRaft controller quorum (streaming/rules/quorum.py): a cluster's each
QUORUM_ALERTS = ("QuorumUnavailable", "QuorumVoterLagging", "QuorumLeaderFlapping", "BrokerMetadataLagging")
#: a broker's log dirs (DescribeLogDirs, docs/logdirs.md): per (cluster, broker, log_dir)
LOG_DIR_ONLINE = "kafka_monitor_log_dir_online"
LOG_DIR_TOTAL = "kafka_monitor_log_dir_total_bytes"
LOG_DIR_USABLE = "kafka_monitor_log_dir_usable_bytes"
LOG_DIR_TO_FULL = "kafka_monitor_log_dir_seconds_to_full"
#: a cluster's open transactions (ListTransactions, DescribeTransactions, DescribeProducers;
#: docs/transactions.md): per cluster
TXN_OPEN = "kafka_monitor_transactions_open"
TXN_HANGING = "kafka_monitor_transactions_hanging"
TXN_OLDEST_AGE = "kafka_monitor_transaction_oldest_age_seconds"
TXN_HELD = "kafka_monitor_transaction_held_partitions"
LSO = "kafka_monitor_partition_last_stable_offset"
#: an HA group of probes (--ha-group; docs/ha.md): per (cluster, source = ha:<group>), and per probe
HA_PROBES = "kafka_monitor_ha_probes"
HA_SHARDS = "kafka_monitor_ha_shards"
HA_UNOBSERVED = "kafka_monitor_ha_shards_unobserved"
HA_PROBE_SHARDS = "kafka_monitor_ha_probe_shards"
HA_LAST_HANDOVER = "kafka_monitor_ha_last_handover_timestamp_seconds"

def default_rules() -> dict[str, Any]:
    return {"lag": LagConfig(), "partition": PartitionRulesConfig(), "group": GroupRulesConfig(),
            "client": ClientRulesConfig(), "source": SourceRulesConfig(), "quorum": QuorumRulesConfig(),
            "log_dirs": LogDirRulesConfig(), "transactions": TransactionRulesConfig()}


#: the job's rule settings the panels draw and name (build() sets them; defaults here)
RULES: dict[str, Any] = default_rules()


def lag_threshold_offsets() -> dict:
    """Colours of a lag in offsets: orange above the job's ConsumerLagHigh threshold."""
    n = RULES["lag"].lag_high_offsets
    return thresholds((None, "green")) if n is None else thresholds((None, "green"), (n, "orange"))


def lag_threshold_seconds() -> dict:
    n = RULES["lag"].lag_high_seconds
    return thresholds((None, "green")) if n is None else thresholds((None, "green"), (n, "orange"))


def lag_high_words() -> str:
    lag = RULES["lag"]
    parts = ([f"{lag.lag_high_offsets} offsets"] if lag.lag_high_offsets is not None else []) + \
            ([f"{lag.lag_high_seconds:g} s"] if lag.lag_high_seconds is not None else [])
    if not parts:
        return "The job's ConsumerLagHigh is disabled (lag_high_offsets and lag_high_seconds none)."
    return (f"The job opens ConsumerLagHigh above {' or '.join(parts)} held for {lag.lag_high_for_ms / 1000:g} s "
            "([job.rules.lag]); Prometheus pages after it has been open 5 minutes.")


def minutes(ms: float) -> str:
    return f"{ms / 60000:g} minutes" if ms >= 60000 else f"{ms / 1000:g} s"


#: every alert rule in deploy/prometheus/rules: the job's alert names and the monitor's own
ALERT_RULES = "|".join(a.value for a in Alert) + "|KafkaMonitor.*"

#: Grafana's custom unit syntax (``suffix:<text>``)
RECORDS_PER_S = "suffix: records/s"


def per_partition(metric: str, sel: str = PART) -> str:
    return f"max by ({PK}) ({metric}{{{sel}}})"


def per_group_partition(metric: str, sel: str = GPART) -> str:
    return f"max by ({GK}) ({metric}{{{sel}}})"


def under_replicated(by: str = "") -> str:
    """Partitions with |ISR| < |replicas|, counted (optionally by some labels), 0 when none."""
    grouping = f" by ({by})" if by else ""
    return (f"count{grouping} (\n  {per_partition(ISR)}\n    < {per_partition(REPLICAS)}\n)\n"
            f"or\n0 * count{grouping} ({per_partition(REPLICAS)})")


def offline(by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return (f"count{grouping} ({per_partition(LEADER)} == -1)\n"
            f"or\n0 * count{grouping} ({per_partition(LEADER)})")


def no_eligible_leader(sel: str = PART) -> str:
    """Partitions with the job's PartitionNoEligibleLeader open, 0 while partitions are watched."""
    return open_count(NO_ELIGIBLE_LEADER, PK, sel, per_partition(REPLICAS, sel))


def no_eligible_leader_words() -> str:
    return ("Partitions with the job's PartitionNoEligibleLeader open (critical): no leader, an empty ISR and no "
            "eligible leader replica (KIP-966), so no replica is left that Kafka can elect without losing "
            "committed records; only a last-known ELR replica coming back, or an unclean leader election, gives it "
            "a leader again. Each is also an offline partition. 0 also where the ELR is not known (the feature off, "
            "as by default before Kafka 4.1, or --elr-interval 0): see docs/elr.md.")


def consumption_rate(by: str) -> str:
    """Records/s the group commits: the slope of its committed offsets, summed over ``by``."""
    return (f"sum by ({by}) (\n  max by ({GK}) (deriv({COMMITTED}{{{GPART}}}[$__rate_interval]))\n)")


def eta(by: str) -> str:
    """Seconds to consume the current lag at the current consumption rate: lag / rate.
    Guarded: no value while the group commits nothing (rate <= 0, no division by zero), and
    0 when there is no lag at all (also for an idle group)."""
    total_lag = f"sum by ({by}) ({per_group_partition(LAG)})"
    return (f"(\n  {total_lag}\n  /\n  ({consumption_rate(by)} > 0)\n)\n"
            f"or\n({total_lag} == 0)")


# -- panels ------------------------------------------------------------------------------------


def target(expr: str, legend: str = "", ref: str = "A", table: bool = False) -> dict:
    t: dict[str, Any] = {"datasource": DATASOURCE, "editorMode": "code", "expr": expr.strip(), "refId": ref}
    if table:
        t.update(format="table", instant=True, range=False)
    else:
        t.update(legendFormat=legend or "__auto", range=True, instant=False)
    return t


def thresholds(*steps: tuple[Optional[float], str]) -> dict:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


GREEN_RED_AT_1 = thresholds((None, "green"), (1, "red"))
UP_DOWN = [{"type": "value", "options": {
    "0": {"color": "red", "index": 0, "text": "DOWN"},
    "1": {"color": "green", "index": 1, "text": "UP"}}}]


#: kafka_monitor_group_partition_lag_status values (Burrow's statuses, in severity order)
LAG_STATUS_MAPPINGS = [{"type": "value", "options": {
    "0": {"color": "green", "index": 0, "text": "OK"},
    "1": {"color": "yellow", "index": 1, "text": "WARN"},
    "2": {"color": "orange", "index": 2, "text": "STALL"},
    "3": {"color": "red", "index": 3, "text": "STOP"},
    "4": {"color": "purple", "index": 4, "text": "REWIND"}}}]


def panel(kind: str, title: str, description: str, targets: list[dict], *, unit: str = "short",
          decimals: Optional[int] = None, th: Optional[dict] = None, mappings: Optional[list] = None,
          options: Optional[dict] = None, custom: Optional[dict] = None, overrides: Optional[list] = None,
          transformations: Optional[list] = None, min_: Optional[float] = None) -> dict:
    defaults: dict[str, Any] = {"unit": unit, "mappings": mappings or [],
                                "thresholds": th or thresholds((None, "green"))}
    if decimals is not None:
        defaults["decimals"] = decimals
    if min_ is not None:
        defaults["min"] = min_
    if custom is not None:
        defaults["custom"] = custom
    p: dict[str, Any] = {"type": kind, "title": title, "description": description, "datasource": DATASOURCE,
                         "targets": targets, "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
                         "options": options or {}}
    if transformations:
        p["transformations"] = transformations
    return p


def stat(title: str, description: str, targets: list[dict], **kw: Any) -> dict:
    options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
               "colorMode": "background", "graphMode": "none", "justifyMode": "auto",
               "orientation": "auto", "textMode": "auto", "showPercentChange": False}
    return panel("stat", title, description, targets, options=options, **kw)


def timeseries(title: str, description: str, targets: list[dict], **kw: Any) -> dict:
    options = {"legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                          "calcs": ["lastNotNull", "max"]},
               "tooltip": {"mode": "multi", "sort": "desc"}}
    custom = {"drawStyle": "line", "lineInterpolation": "stepAfter", "lineWidth": 1, "fillOpacity": 0,
              "showPoints": "never", "spanNulls": False}
    return panel("timeseries", title, description, targets, options=options, custom=custom, **kw)


def state_timeline(title: str, description: str, targets: list[dict], **kw: Any) -> dict:
    options = {"mergeValues": True, "showValue": "auto", "alignValue": "left", "rowHeight": 0.9,
               "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
               "tooltip": {"mode": "single", "sort": "none"}}
    custom = {"fillOpacity": 80, "lineWidth": 0}
    return panel("state-timeline", title, description, targets, options=options, custom=custom, **kw)


def table(title: str, description: str, targets: list[dict], *, rename: dict[str, str],
          hide: tuple[str, ...] = ("Time",), sort_by: Optional[str] = None, **kw: Any) -> dict:
    transformations: list[dict] = []
    if len(targets) > 1:
        transformations.append({"id": "merge", "options": {}})
    transformations.append({"id": "organize", "options": {
        "excludeByName": {name: True for name in hide}, "indexByName": {}, "renameByName": rename}})
    options: dict[str, Any] = {"showHeader": True, "cellHeight": "sm",
                               "footer": {"show": False, "reducer": ["sum"], "fields": ""}}
    if sort_by:
        options["sortBy"] = [{"displayName": sort_by, "desc": True}]
    return panel("table", title, description, targets, options=options, transformations=transformations, **kw)


# -- dashboards --------------------------------------------------------------------------------


def variable(name: str, label: str, query: str, description: str) -> dict:
    return {"name": name, "label": label, "description": description, "type": "query",
            "datasource": DATASOURCE, "query": query, "definition": query, "refresh": 2, "regex": "",
            "sort": 1, "multi": True, "includeAll": True, "allValue": ".*", "hide": 0,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": []}


VARIABLES = {
    "cluster": variable("cluster", "Cluster", f"label_values({REPLICAS}, cluster)",
                        "Clusters the probes report (the probe's --cluster, or the cluster id)."),
    "topic": variable("topic", "Topic", f'label_values({REPLICAS}{{cluster=~"$cluster"}}, topic)',
                      "Topics the probes watch on the selected clusters."),
    "group": variable("group", "Consumer group",
                      f'label_values({COMMITTED}{{cluster=~"$cluster", topic=~"$topic"}}, group)',
                      "Consumer groups with committed offsets on the selected topics."),
}


class Grid:
    """Lays panels out left to right in rows of 24 columns, giving each a unique id."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self.y = 0

    def row(self, height: int, *items: tuple[dict, int]) -> None:
        x = 0
        for p, width in items:
            if x + width > 24:
                raise ValueError(f"row wider than 24 columns at {p['title']!r}")
            p["id"] = len(self.panels) + 1
            p["gridPos"] = {"h": height, "w": width, "x": x, "y": self.y}
            self.panels.append(p)
            x += width
        self.y += height


def dashboard(uid: str, title: str, description: str, variables: list[Any], grid: Grid) -> dict:
    return {
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"type": "dashboards", "tags": [TAG], "title": "kafka-monitor", "asDropdown": False,
                   "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False,
                   "tooltip": "", "url": ""}],
        "panels": grid.panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": [TAG],
        "templating": {"list": [VARIABLES[v] if isinstance(v, str) else v for v in variables]},
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


def job_scraped() -> dict:
    return stat("Exporter scraped", "Prometheus's own `up` for the scrape job `kafka-monitor`: DOWN = the job's "
                "/metrics cannot be scraped (alert KafkaMonitorJobDown, reason scrape_failed).",
                [target('min(up{job="kafka-monitor"})')], mappings=UP_DOWN,
                th=thresholds((None, "red"), (1, "green")))


def job_query_up() -> dict:
    return stat("Streaming query", "kafka_monitor_job_up: UP while the job runs (its Spark streaming query starting or "
                "running), DOWN after the query failed (alert KafkaMonitorJobDown, reason query_failed).",
                [target("min(kafka_monitor_job_up)")], mappings=UP_DOWN, th=thresholds((None, "red"), (1, "green")))


def last_batch_age() -> dict:
    return stat("Last micro-batch age", "Seconds since the job last completed a micro-batch; every gauge the job "
                "serves is at least this old. KafkaMonitorJobFallingBehind fires above 120 s.",
                [target("time() - max(kafka_monitor_job_last_batch_timestamp_seconds > 0)")], unit="s", decimals=0,
                th=thresholds((None, "green"), (30, "orange"), (120, "red")))


def silent_sources() -> dict:
    return stat("Silent sources", "Probes and instrumented clients the job calls silent (SourceSilent: no "
                f"heartbeat for {RULES['source'].silent_factor:g} of the intervals each announced and the silence "
                f"grace of {RULES['source'].silence_grace_ms / 1000:g} s, judged without "
                "the pipeline's delay): the monitor is blind to their clusters meanwhile.",
                [target(open_count("SourceSilent", "cluster, source", CLUSTER, f"{HEARTBEAT}{{{CLUSTER}}}"))],
                decimals=0, th=GREEN_RED_AT_1)


def pipeline_delay() -> dict:
    q = "sum by (le, instance) (rate(kafka_monitor_source_heartbeat_delay_seconds_bucket[$__rate_interval]))"
    return timeseries("Pipeline delay", "From a heartbeat's event time at its source to the moment the job serves "
                      "it (source -> events topic -> micro-batch -> sink): how late every gauge here is. A scrape "
                      "adds up to its interval.",
                      [target(f"histogram_quantile(0.5, {q})", legend="p50 {{instance}}"),
                       target(f"histogram_quantile(0.95, {q})", legend="p95 {{instance}}", ref="B")],
                      unit="s", min_=0)


def groups_now(description: str) -> dict:
    """Table: each group's current state and member count."""
    return table("Groups now: state and members", description,
                 [target(f"max by (cluster, group, state) ({GROUP_STATE}{{{GROUP}}} == 1)", table=True),
                  target(f"max by (cluster, group) ({GROUP_MEMBERS}{{{GROUP}}})", ref="B", table=True)],
                 rename={"cluster": "Cluster", "group": "Group", "state": "State", "Value #B": "Members"},
                 hide=("Time", "Value #A"))


def per_node(metric: str) -> str:
    """A quorum node's series (a voter or an observer of the KRaft quorum), one per exporter replica merged."""
    return f"max by (cluster, node, role) ({metric}{{{CLUSTER}}})"


def quorum_panels() -> tuple[list[tuple[dict, int]], list[tuple[dict, int]]]:
    """The KRaft controller quorum of the selected clusters (DescribeQuorum, docs/quorum.md): a
    row of three stats and one of three graphs."""
    q = RULES["quorum"]
    per_cluster = f"max by (cluster) ({QUORUM_UP}{{{CLUSTER}}})"
    return [
        (stat("Quorum leader", "The active controller of each cluster: the KRaft quorum's leader in the probe's last "
              f"DescribeQuorum answer ({QUORUM_LEADER}). election (-1) = no leader: the cluster's metadata cannot "
              f"change (QuorumUnavailable, critical, once it lasts {minutes(q.unavailable_after_ms)}). No value = "
              "the probe does not ask (--quorum-interval 0) or has had no answer yet.",
              [target(f"max by (cluster) ({QUORUM_LEADER}{{{CLUSTER}}})", legend="{{cluster}}")], decimals=0,
              mappings=[{"type": "value", "options": {"-1": {"color": "red", "index": 0, "text": "election"}}}],
              th=thresholds((None, "red"), (0, "green"))), 8),
        (stat("Quorum answered", f"{QUORUM_UP}: ANSWERED while the probe's last DescribeQuorum was answered; "
              "NOT ANSWERED after no answer, a permission or version refusal (the probe's user lacks DESCRIBE on "
              "the cluster; a ZooKeeper cluster) or an error from the brokers. The quorum panels then show the "
              "last answer (KafkaMonitorQuorumUnobserved after 5 minutes; errors are QuorumUnavailable).",
              [target(per_cluster, legend="{{cluster}}")],
              mappings=[{"type": "value", "options": {
                  "0": {"color": "red", "index": 0, "text": "NOT ANSWERED"},
                  "1": {"color": "green", "index": 1, "text": "ANSWERED"}}}],
              th=thresholds((None, "red"), (1, "green"))), 8),
        (stat("Quorum alerts open", "The job's quorum alerts open now, over the selected clusters: "
              f"QuorumUnavailable (critical: no leader, or no caught-up majority of the voters, for "
              f"{minutes(q.unavailable_after_ms)}), QuorumVoterLagging (a controller not caught up for "
              f"{minutes(q.voter_lag_ms)}), QuorumLeaderFlapping ({q.flap_changes} leader changes within "
              f"{minutes(q.flap_window_ms)}), BrokerMetadataLagging (a broker not caught up with the metadata log "
              f"for {minutes(q.observer_lag_ms)}). 0 = the probe describes the quorum and nothing is open.",
              [target(f'count(max by (alert, cluster) ({ALERT_ACTIVE}{{alert=~"{"|".join(QUORUM_ALERTS)}", '
                      f"{CLUSTER}}}))\nor\n0 * count({per_cluster})")], decimals=0, th=GREEN_RED_AT_1), 8),
    ], [
        (timeseries("Quorum leader epoch", "The quorum leader's epoch per cluster: one step up for every new "
                    f"leader ({QUORUM_EPOCH}); QuorumLeaderFlapping opens at {q.flap_changes} steps within "
                    f"{minutes(q.flap_window_ms)}.",
                    [target(f"max by (cluster) ({QUORUM_EPOCH}{{{CLUSTER}}})", legend="{{cluster}}")],
                    decimals=0), 8),
        (timeseries("Metadata log lag per node", "Records of the metadata log (__cluster_metadata) each voter "
                    "(role voter: a controller) and each observer (role observer: a broker) is behind the "
                    f"quorum leader's log end offset, at the probe's last answer ({QUORUM_LAG}). A node the "
                    "leader stops listing (a stopped broker) loses its line.",
                    [target(per_node(QUORUM_LAG), legend="{{role}} {{node}} ({{cluster}})")],
                    min_=0, decimals=0), 8),
        (timeseries("Time since caught up per node", "Seconds since each voter and observer was last caught "
                    f"up with the quorum leader, at the probe's answer ({QUORUM_CAUGHT_UP_AGE}; the leader's "
                    "clock read against the probe's). QuorumVoterLagging opens past "
                    f"{minutes(q.voter_lag_ms)} for a voter, BrokerMetadataLagging past "
                    f"{minutes(q.observer_lag_ms)} for an observer.",
                    [target(per_node(QUORUM_CAUGHT_UP_AGE), legend="{{role}} {{node}} ({{cluster}})")],
                    unit="s", min_=0,
                    th=thresholds((None, "green"), (q.voter_lag_ms / 1000, "orange"))), 8),
    ]


def per_log_dir(metric: str) -> str:
    """A log dir's series (one per broker and dir), one per exporter replica merged."""
    return f"max by (cluster, broker, log_dir) ({metric}{{{CLUSTER}}})"


def log_dir_panels() -> list[tuple[dict, int]]:
    """The brokers' log dirs of the selected clusters (DescribeLogDirs, docs/logdirs.md): whether
    each is online, how full, and when full at its growth."""
    ld = RULES["log_dirs"]
    legend = "broker {{broker}} {{log_dir}} ({{cluster}})"
    return [
        (state_timeline("Log dirs online", "Each broker's log dirs as the probe's last DescribeLogDirs answer "
                        f"reports them ({LOG_DIR_ONLINE}): OFFLINE = a failed disk or a filesystem that filled "
                        "(KAFKA_STORAGE_ERROR) on a broker that still answers; every replica on it is out of its "
                        "ISR until the broker restarts (LogDirOffline, critical). A stopped broker sends nothing: "
                        "its dirs keep their last state (BrokerDown says it). No rows = the probe does not ask "
                        "(--log-dirs-interval 0), its user lacks DESCRIBE on the cluster, or the brokers do not "
                        "support DescribeLogDirs.",
                        [target(per_log_dir(LOG_DIR_ONLINE), legend=legend)],
                        mappings=[{"type": "value", "options": {
                            "0": {"color": "red", "index": 0, "text": "OFFLINE"},
                            "1": {"color": "green", "index": 1, "text": "ONLINE"}}}],
                        th=thresholds((None, "red"), (1, "green")), decimals=0), 8),
        (timeseries("Log dir use", "Share of each online log dir's filesystem in use: 1 - usable / total bytes "
                    f"({LOG_DIR_USABLE}, {LOG_DIR_TOTAL}; the whole filesystem, not only Kafka's files; Kafka "
                    f"3.3+ reports them). LogDirFilling (warning) opens at {ld.usage_percent}%. An offline dir "
                    "has no line.",
                    [target(f"100 * (1 - {per_log_dir(LOG_DIR_USABLE)} / {per_log_dir(LOG_DIR_TOTAL)})",
                            legend=legend)],
                    unit="percent", min_=0, th=thresholds((None, "green"), (ld.usage_percent, "orange"))), 8),
        (timeseries("Log dir time to full", "When each log dir's filesystem is full at its growth over the last "
                    f"{minutes(ld.growth_window_ms)} ({LOG_DIR_TO_FULL}, the job's estimate once its answers span "
                    f"{minutes(ld.min_growth_span_ms)}): a line only while the dir grows. LogDirFilling (warning) "
                    f"opens below {ld.full_within_ms / 3_600_000:g} h. A full dir goes offline.",
                    [target(per_log_dir(LOG_DIR_TO_FULL), legend=legend)],
                    unit="s", min_=0, th=thresholds((None, "orange"), (ld.full_within_ms / 1000, "green"))), 8),
    ]


def per_cluster_metric(metric: str) -> str:
    """A cluster's series, one per exporter replica merged."""
    return f"max by (cluster) ({metric}{{{CLUSTER}}})"


def transaction_panels() -> list[tuple[dict, int]]:
    """The open transactions of the selected clusters (docs/transactions.md): how many, how many
    hanging, the oldest's age, the partitions they hold, and the records held back per partition."""
    tx = RULES["transactions"]
    after, grace = minutes(tx.hanging_after_ms), minutes(tx.timeout_grace_ms)
    return [
        (timeseries("Open and hanging transactions", "Open transactions (Ongoing, PrepareCommit, PrepareAbort) "
                    f"the brokers listed at the probe's last answer ({TXN_OPEN}), and the hanging ones "
                    f"({TXN_HANGING}): open {after} or longer (hanging_after_ms), older than their own "
                    f"transaction.timeout.ms by {grace} (timeout_grace_ms), or a producer holding a partition's last "
                    f"stable offset that no coordinator lists for {minutes(tx.unknown_after_ms)} (unknown_after_ms). "
                    "HangingTransaction (critical) while any "
                    "is. A steady open count is usually many short transactions; the oldest's age tells. No lines "
                    "= the probe does not ask (--transactions-interval 0), the brokers have no ListTransactions "
                    "(Kafka before 3.0) or its answers fail (said in the probe's log). 0 open while producers use "
                    "transactions: the probe's user may lack DESCRIBE on their transactional ids (ListTransactions "
                    "lists only those, without an error).",
                    [target(per_cluster_metric(TXN_OPEN), legend="open ({{cluster}})"),
                     target(per_cluster_metric(TXN_HANGING), legend="hanging ({{cluster}})", ref="B")],
                    min_=0, decimals=0,
                    overrides=[{"matcher": {"id": "byRegexp", "options": "^hanging"}, "properties": [
                        {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]}]), 6),
        (timeseries("Oldest open transaction", "Age of each cluster's oldest open transaction at the probe's last "
                    f"answer ({TXN_OLDEST_AGE}: its coordinator's start time against the probe's clock); 0 when "
                    f"none is open. HangingTransaction (critical) opens at {after} (hanging_after_ms), or "
                    f"earlier for one older than its own transaction.timeout.ms by {grace}: its coordinator should "
                    "have aborted it (Kafka caps the timeout at transaction.max.timeout.ms, 15 minutes by default). "
                    "A saw-tooth is transactions ending; a line that keeps rising is one that does not.",
                    [target(per_cluster_metric(TXN_OLDEST_AGE), legend="{{cluster}}")],
                    unit="s", min_=0, th=thresholds((None, "green"), (tx.hanging_after_ms / 1000, "red"))), 6),
        (timeseries("Partitions held by open transactions", "Partitions on which an open transaction holds the "
                    f"last stable offset ({TXN_HELD}; DescribeProducers of the open transactions' partitions, at "
                    "most 1,000 a round): read_committed consumers stop there until it ends. Some are normal "
                    "while producers write transactions; the same ones held for minutes are not (Records held "
                    "back per partition).",
                    [target(per_cluster_metric(TXN_HELD), legend="{{cluster}}")], min_=0, decimals=0), 6),
        (timeseries("Records held back per partition", "High watermark - last stable offset of each partition of "
                    f"the selected topics, where above 0 ({HW} - {LSO}): records written but not yet readable "
                    "by read_committed consumers, behind an open transaction's first record. A line that comes "
                    "and goes is transactions ending; one that grows is a transaction that does not "
                    "(HangingTransaction names it; the lag alerts of read_committed groups stuck at the LSO say "
                    "cause open_transaction). The two offsets are separate reads: on a busy topic a one-point "
                    "blip can be a write between them. No line where the LSO is unknown (--offsets-via fetch).",
                    [target(f"(\n  {per_partition(HW)}\n  - {per_partition(LSO)}\n) > 0",
                            legend="{{topic}}/{{partition}} ({{cluster}})")], min_=0, decimals=0), 6),
    ]


def per_ha_group(metric: str) -> str:
    """An HA group's series (source ha:<group>), one per exporter replica merged."""
    return f"max by (cluster, source) ({metric}{{{CLUSTER}}})"


def ha_panels() -> list[tuple[dict, int]]:
    """The HA groups of probes on the selected clusters (docs/ha.md): how many probes are alive,
    the shards unobserved, the shards each probe holds, and the last handover."""
    src = RULES["source"]
    after = f"{src.shard_unobserved_after_ms / 1000:g} s"
    legend = "{{source}} ({{cluster}})"
    return [
        (timeseries("HA group probes alive", "Probes of each HA group (source ha:<group>: the probes started with "
                    "the same --ha-group, which share the cluster's shards through the consumer group "
                    "kafka-monitor-ha-<group> on the events cluster) that reported within their silence limit "
                    f"({src.silent_factor:g} of their interval and the silence grace of "
                    f"{src.silence_grace_ms / 1000:g} s) at the group's last report ({HA_PROBES}). A step down is a "
                    "probe that left or died: its shards move to the others (Shards per probe). Not lowered when "
                    "the last one stops: the job then raises SourceSilent (critical) for the group, not for each "
                    "probe. No lines = no probe runs with --ha-group.",
                    [target(per_ha_group(HA_PROBES), legend=legend)], min_=0, decimals=0), 6),
        (timeseries("HA group shards unobserved", "Shards of each HA group's cluster without an observation within "
                    f"their owner's interval plus {after} (shard_unobserved_after_ms) at the group's last report "
                    f"({HA_UNOBSERVED}), beside the group's shard count ({HA_SHARDS}). ShardUnobserved (warning) "
                    "while above 0: the topics and consumer groups of those shards get no fresh offsets, lag or "
                    "alerts meanwhile. A member that dies hands its shards over within the group's session timeout "
                    "and the new owner observes them at its next cycle, so a handover raises nothing; a line that "
                    "stays above 0 is a shard with no live owner, or an owner that does not observe it.",
                    [target(per_ha_group(HA_UNOBSERVED), legend="unobserved " + legend),
                     target(per_ha_group(HA_SHARDS), legend="shards " + legend, ref="B")],
                    min_=0, decimals=0,
                    overrides=[{"matcher": {"id": "byRegexp", "options": "^unobserved"}, "properties": [
                        {"id": "color", "value": {"mode": "fixed", "fixedColor": "orange"}}]}]), 6),
        (timeseries("Shards per probe", "Shards each live probe of an HA group holds, by its newest claims the job "
                    f"saw ({HA_PROBE_SHARDS}): the cooperative-sticky assignor splits them evenly and moves only "
                    "what must move. A probe that leaves loses its line and its shards go to the others' (a "
                    "handover); a newcomer takes some. The lines add up to the group's shard count while every "
                    "shard has a live owner.",
                    [target(f"max by (cluster, source, probe) ({HA_PROBE_SHARDS}{{{CLUSTER}}})",
                            legend="{{probe}} " + legend)], min_=0, decimals=0), 6),
        (stat("Last shard handover", "Time since a shard of each HA group last moved to another probe "
              f"({HA_LAST_HANDOVER}: a report with a larger epoch from another probe): a probe that left, died or "
              "joined. Handovers that keep coming are probes that restart or keep losing their group membership "
              "(session timeouts, the events cluster's group coordinator). No value = no handover seen, or no HA "
              "group.",
              [target(f"time() - {per_ha_group(HA_LAST_HANDOVER)}", legend=legend)], unit="s", decimals=0), 6),
    ]


def overview() -> dict:
    g = Grid()
    severity_targets = [
        target(f'count(max by (alert, severity, cluster, topic, partition, group) '
               f'({ALERT_ACTIVE}{{severity="{sev}", {CLUSTER}}}))\nor\n0 * max(kafka_monitor_job_up == 1)',
               legend=sev, ref=ref)
        for sev, ref in (("critical", "A"), ("warning", "B"), ("info", "C"))]
    colour = {"critical": "red", "warning": "orange", "info": "blue"}
    severity_overrides = [{"matcher": {"id": "byName", "options": sev}, "properties": [
        {"id": "thresholds", "value": thresholds((None, "green"), (1, c))}]} for sev, c in colour.items()]
    g.row(5,
          (stat("Open alerts by severity",
                "Alerts the job has open now (kafka_monitor_alert_active), by severity: critical pages, warning "
                "is for working hours, info is for the record. 0 = the job runs and has nothing open; no value "
                "= the job is down or not scraped.", severity_targets, overrides=severity_overrides), 7),
          (stat("Worst consumer lag", "The largest lag of any watched group on any partition of the selected "
                "topics, in offsets and in time (how long ago the high watermark was at the committed offset). "
                + lag_high_words(),
                [target(f"max({LAG}{{{GPART}}})", legend="offsets"),
                 target(f"max({LAG_SECONDS}{{{GPART}}})", legend="seconds", ref="B")],
                th=lag_threshold_offsets(),
                overrides=[{"matcher": {"id": "byName", "options": "seconds"}, "properties": [
                    {"id": "unit", "value": "s"},
                    {"id": "thresholds", "value": lag_threshold_seconds()}]}]), 5),
          (stat("Under-replicated partitions", "Partitions whose in-sync replica set is smaller than their "
                "replica set (UnderReplicated).", [target(under_replicated())], th=GREEN_RED_AT_1), 4),
          (stat("Offline partitions", "Partitions without a leader: nobody can produce to or consume from them "
                "(OfflinePartition, critical).", [target(offline())], th=GREEN_RED_AT_1), 4),
          (stat("No eligible leader", no_eligible_leader_words(), [target(no_eligible_leader())], decimals=0,
                th=GREEN_RED_AT_1), 4))
    g.row(4, (job_scraped(), 6), (job_query_up(), 6), (last_batch_age(), 6), (silent_sources(), 6))
    g.row(8,
          (table("Open alerts raised by the job", "One row per alert the job has open now "
                 "(kafka_monitor_alert_active); labels that do not apply to the entity are empty.",
                 [target(f"max by (alert, severity, cluster, topic, partition, group) ({ALERT_ACTIVE}{{{CLUSTER}}})",
                         table=True)],
                 rename={"alert": "Alert", "severity": "Severity", "cluster": "Cluster", "topic": "Topic",
                         "partition": "Partition", "group": "Group"}, hide=("Time", "Value")), 12),
          (table("Alert rules pending or firing", "Prometheus's kafka-monitor alert rules that are pending or "
                 "firing now (the ALERTS series; what Alertmanager is told about): those of the selected "
                 "clusters, and the monitor's own, which have no cluster.",
                 [target(f'ALERTS{{alertname=~"{ALERT_RULES}", {CLUSTER}}}\nor\n'
                         f'ALERTS{{alertname=~"{ALERT_RULES}", cluster=""}}', table=True)],
                 rename={"alertname": "Alert rule", "alertstate": "State", "severity": "Severity",
                         "cluster": "Cluster"},
                 hide=("Time", "Value", "__name__")), 12))
    g.row(8,
          (timeseries("Worst lag per group and topic", "Lag of the most-lagging partition, per group and topic "
                      "(what ConsumerLagHigh compares with its threshold).",
                      [target(f"max by (cluster, group, topic) ({LAG}{{{GPART}}})",
                              legend="{{group}} / {{topic}} ({{cluster}})")],
                      th=lag_threshold_offsets(), min_=0), 12),
          (table("Most lagging groups now", "The ten (group, topic) pairs with the largest partition lag.",
                 [target(f"topk(10, max by (cluster, group, topic) ({LAG}{{{GPART}}}))", table=True)],
                 rename={"cluster": "Cluster", "group": "Group", "topic": "Topic", "Value": "Worst partition lag"},
                 sort_by="Worst partition lag"), 12))
    stats, graphs = quorum_panels()
    g.row(4, *stats)
    g.row(8, *graphs)
    g.row(8, *log_dir_panels())
    g.row(8, *transaction_panels())
    g.row(8, *ha_panels())
    return dashboard("kafka-monitor-overview", "kafka-monitor / Overview",
                     "What is wrong now: open alerts, the worst lag, replication, the KRaft controller quorum, the "
                     "brokers' log dirs, open transactions and the monitor's own health, HA groups of probes "
                     "included.",
                     ["cluster", "topic", "group"], g)


def partitions() -> dict:
    g = Grid()
    g.row(4,
          (stat("Partitions watched", "Partitions of the selected topics the probes report.",
                [target(f"count({per_partition(REPLICAS)})")]), 4),
          (stat("Under-replicated", "Partitions with |ISR| < |replicas|.", [target(under_replicated())],
                th=GREEN_RED_AT_1), 5),
          (stat("Offline (no leader)", "Partitions whose leader is -1.", [target(offline())], th=GREEN_RED_AT_1), 5),
          (stat("No eligible leader", no_eligible_leader_words(), [target(no_eligible_leader())], decimals=0,
                th=GREEN_RED_AT_1), 5),
          (stat("ISR shrinks open", "Partitions with the job's IsrShrink alert open (a replica left the ISR, "
                "replica set unchanged).",
                [target(f'count(max by ({PK}) ({ALERT_ACTIVE}{{alert="IsrShrink", {PART}}}))\n'
                        f"or\n0 * count({per_partition(REPLICAS)})")], th=GREEN_RED_AT_1), 5))
    g.row(8,
          (timeseries("ISR size vs replicas per topic", "Sum over each topic's partitions of the ISR size and of "
                      "the replica count: the lines part when replicas drop out of the ISR.",
                      [target(f"sum by (cluster, topic) ({per_partition(ISR)})", legend="ISR {{topic}} ({{cluster}})"),
                       target(f"sum by (cluster, topic) ({per_partition(REPLICAS)})",
                              legend="replicas {{topic}} ({{cluster}})", ref="B")], min_=0), 8),
          (timeseries("Under-replicated partitions per topic", "Partitions with |ISR| < |replicas|, per topic "
                      "(0 while none).", [target(under_replicated("cluster, topic"), legend="{{topic}} ({{cluster}})")],
                      min_=0, decimals=0), 8),
          (timeseries("Eligible leader replicas per partition", "Beside the ISR, for each partition without a "
                      f"leader or with a short ISR: its eligible leader replicas ({ELR}; KIP-966: out of the ISR, "
                      "still electable without data loss) and its last-known ELR "
                      f"({LAST_KNOWN_ELR}: shut down uncleanly, the last resort before an unclean election). A "
                      "partition has lines only while its ISR is short and the probe knows its ELR (Kafka 4.1+); "
                      "ELR 0 with no ISR and no leader is PartitionNoEligibleLeader.",
                      [target(per_partition(ELR), legend="ELR {{topic}}/{{partition}} ({{cluster}})"),
                       target(per_partition(LAST_KNOWN_ELR), legend="last-known ELR {{topic}}/{{partition}} "
                              "({{cluster}})", ref="B")], min_=0, decimals=0), 8))
    g.row(10,
          (table("Partitions now: ISR, replicas, leader",
                 "One row per partition; sorted by replicas missing from the ISR. Leader -1 = offline.",
                 [target(per_partition(ISR), table=True),
                  target(per_partition(REPLICAS), ref="B", table=True),
                  target(per_partition(LEADER), ref="C", table=True),
                  target(f"{per_partition(REPLICAS)}\n- {per_partition(ISR)}", ref="D", table=True)],
                 rename={"cluster": "Cluster", "topic": "Topic", "partition": "Partition", "Value #A": "ISR",
                         "Value #B": "Replicas", "Value #C": "Leader", "Value #D": "Missing from ISR"},
                 sort_by="Missing from ISR"), 14),
          (table("Eligible leader replicas now",
                 "One row per partition whose eligible leader replicas are known while it has no leader or a "
                 "short ISR (Kafka 4.1+): its leader and ISR size beside the sizes of its ELR and last-known ELR. "
                 "Leader -1, ISR 0 and ELR 0 = PartitionNoEligibleLeader: bring a last-known ELR replica's broker "
                 "back, or elect uncleanly as the last resort (docs/elr.md). Empty = no such partition.",
                 [target(f"{per_partition(LEADER)}\nand on ({PK})\n{per_partition(ELR)}", table=True),
                  target(f"{per_partition(ISR)}\nand on ({PK})\n{per_partition(ELR)}", ref="B", table=True),
                  target(per_partition(ELR), ref="C", table=True),
                  target(per_partition(LAST_KNOWN_ELR), ref="D", table=True)],
                 rename={"cluster": "Cluster", "topic": "Topic", "partition": "Partition", "Value #A": "Leader",
                         "Value #B": "ISR", "Value #C": "ELR", "Value #D": "Last-known ELR"}), 10))
    g.row(8,
          (timeseries("Partitions led per broker", "How many of the selected partitions each broker leads "
                      "(leadership balance); broker -1 = partitions without a leader.",
                      [target(f'count_values by (cluster) ("leader", {per_partition(LEADER)})',
                              legend="broker {{leader}} ({{cluster}})")], min_=0, decimals=0), 12),
          (timeseries("Leader per partition", "Broker id of each partition's leader: a step is a leader change, "
                      "-1 is offline.", [target(per_partition(LEADER), legend="{{topic}}/{{partition}} ({{cluster}})")],
                      decimals=0), 12))
    g.row(8,
          (timeseries("High watermark rate per topic", "Records written per second to each topic: the slope of the "
                      "high watermarks, summed over the topic's partitions.",
                      [target(f"sum by (cluster, topic) (\n  max by ({PK}) (deriv({HW}{{{PART}}}[$__rate_interval]))\n)",
                              legend="{{topic}} ({{cluster}})")], unit=RECORDS_PER_S), 8),
          (timeseries("High watermark rate per partition", "Records written per second to each partition; one "
                      "partition far above the others is a hot key.",
                      [target(f"max by ({PK}) (deriv({HW}{{{PART}}}[$__rate_interval]))",
                              legend="{{topic}}/{{partition}} ({{cluster}})")], unit=RECORDS_PER_S), 8),
          (timeseries("Records retained per topic", "High watermark - log start offset, summed over each topic's "
                      "partitions: how many records retention currently keeps.",
                      [target(f"sum by (cluster, topic) (\n  max by ({PK}) ({HW}{{{PART}}} - {LOG_START}{{{PART}}})\n)",
                              legend="{{topic}} ({{cluster}})")], min_=0), 8))
    return dashboard("kafka-monitor-partitions", "kafka-monitor / Partitions",
                     "Replication and leadership per partition: ISR vs replicas, under-replicated and offline "
                     "partitions, eligible leader replicas, leaders, high-watermark rates.", ["cluster", "topic"], g)


def consumer_groups() -> dict:
    g = Grid()
    g.row(4,
          (stat("Consumer groups", "Groups with committed offsets on the selected topics.",
                [target(f"count(count by (cluster, group) ({COMMITTED}{{{GPART}}}))")]), 4),
          (stat("Worst partition lag", "The largest lag in offsets of the selected groups on any partition.",
                [target(f"max({LAG}{{{GPART}}})")], th=lag_threshold_offsets()), 5),
          (stat("Worst lag in time", "The largest lag in seconds of the selected groups on any partition: how long "
                "ago the partition's high watermark was where the group's committed offset is now.",
                [target(f"max({LAG_SECONDS}{{{GPART}}})")], unit="s", decimals=0,
                th=lag_threshold_seconds()), 5),
          (stat("Total lag", "Offsets the selected groups have still to consume, over all their partitions.",
                [target(f"sum({per_group_partition(LAG)})")]), 5),
          (stat("Longest ETA to catch up", "The longest time any selected group needs to consume its lag at its "
                "current consumption rate (groups that commit nothing are not counted: see the ETA graph).",
                [target(f"max(\n{eta('cluster, group, topic')}\n)")], unit="s", decimals=0,
                th=thresholds((None, "green"), (300, "orange"), (1800, "red"))), 5))
    g.row(9,
          (timeseries("Lag per partition", "HW - committed offset of each group on each partition, from one "
                      "observation of the probe (never negative).",
                      [target(per_group_partition(LAG), legend="{{group}} {{topic}}/{{partition}} ({{cluster}})")],
                      min_=0), 12),
          (timeseries("Total lag per group and topic", "Lag summed over the topic's partitions.",
                      [target(f"sum by (cluster, group, topic) ({per_group_partition(LAG)})",
                              legend="{{group}} / {{topic}} ({{cluster}})")], min_=0), 12))
    g.row(9,
          (timeseries("Lag in seconds per group and topic", "Lag in time of the most-lagging partition: how long "
                      "ago its high watermark was at the committed offset (interpolated on the HW history the job "
                      "keeps; 0 when caught up, idle topics included).",
                      [target(f"max by (cluster, group, topic) ({LAG_SECONDS}{{{GPART}}})",
                              legend="{{group}} / {{topic}} ({{cluster}})")], unit="s", min_=0), 12),
          (state_timeline("Lag status per partition", "Burrow-style evaluation at each observation: OK; WARN = "
                          "lag trending up; STALL = commits not moving while there is lag; STOP = no commit for "
                          "the stop window while the lag grows; REWIND = the committed offset went back.",
                          [target(per_group_partition(LAG_STATUS),
                                  legend="{{group}} {{topic}}/{{partition}} ({{cluster}})")],
                          mappings=LAG_STATUS_MAPPINGS, decimals=0), 12))
    g.row(9,
          (timeseries("Consumption vs production", "Records per second each group commits (slope of its committed "
                      "offsets) against records per second written to the topic (slope of the high watermarks). "
                      "Consumption below production = the lag grows.",
                      [target(consumption_rate("cluster, group, topic"),
                              legend="consumed by {{group}} from {{topic}} ({{cluster}})"),
                       target(f"sum by (cluster, topic) (\n  max by ({PK}) (deriv({HW}{{{PART}}}[$__rate_interval]))\n)",
                              legend="produced to {{topic}} ({{cluster}})", ref="B")], unit=RECORDS_PER_S), 12),
          (timeseries("ETA to catch up", "Lag / consumption rate, per group and topic: how long the group needs to "
                      "consume its current lag at the rate it commits now. 0 = no lag. No value while it has lag "
                      "= it commits nothing (the rate is 0): it is not catching up at all. The estimate assumes "
                      "production stops; while the producers keep writing at rate p the real time is "
                      "lag / (consumption - p).",
                      [target(eta("cluster, group, topic"), legend="{{group}} / {{topic}} ({{cluster}})")],
                      unit="s", min_=0), 12))
    status_override = [{"matcher": {"id": "byName", "options": "Status"}, "properties": [
        {"id": "mappings", "value": LAG_STATUS_MAPPINGS},
        {"id": "custom.cellOptions", "value": {"type": "color-background"}}]}]
    g.row(10,
          (table("Group partitions now", "One row per group and partition: lag in offsets and in time, Burrow "
                 "status, committed offset and the time to consume the lag at the current rate (empty = not "
                 "committing).",
                 [target(per_group_partition(LAG), table=True),
                  target(per_group_partition(LAG_SECONDS), ref="B", table=True),
                  target(per_group_partition(LAG_STATUS), ref="C", table=True),
                  target(per_group_partition(COMMITTED), ref="D", table=True),
                  target(eta(GK), ref="E", table=True)],
                 rename={"cluster": "Cluster", "group": "Group", "topic": "Topic", "partition": "Partition",
                         "Value #A": "Lag", "Value #B": "Lag (s)", "Value #C": "Status",
                         "Value #D": "Committed offset", "Value #E": "ETA (s)"},
                 sort_by="Lag", overrides=status_override), 16),
          (groups_now("Each group's state as its coordinator reports it (Stable, PreparingRebalance, "
                      "CompletingRebalance, Empty, Dead) and its member count."), 8))
    return dashboard("kafka-monitor-consumer-groups", "kafka-monitor / Consumer groups",
                     "Lag per group, topic and partition in offsets and in time, Burrow-style status, "
                     "committed-offset rates, the time to catch up, group state and members.",
                     ["cluster", "topic", "group"], g)


def monitor_health() -> dict:
    g = Grid()
    g.row(4,
          (job_scraped(), 4), (job_query_up(), 4), (last_batch_age(), 4),
          (stat("Events behind", "Records in the events topic the job had not processed yet at its last "
                "micro-batch; growing = the job cannot keep up with what the probes send.",
                [target("max(kafka_monitor_job_events_behind)")], decimals=0,
                th=thresholds((None, "green"), (10000, "orange"))), 4),
          (silent_sources(), 4),
          (stat("Series refused", "Entity series the exporter did not create because its series cap was reached "
                "(since the job started); above 0 = some partitions or groups are not shown at all.",
                [target("sum(kafka_monitor_exporter_series_refused_total)")], th=GREEN_RED_AT_1), 4))
    g.row(8,
          (timeseries("Micro-batches per second", "Micro-batches the job completes per second (one per trigger "
                      "when it keeps up, even without new events).",
                      [target("sum by (instance) (rate(kafka_monitor_job_batches_total[$__rate_interval]))",
                              legend="{{instance}}")], unit="suffix: batches/s", min_=0), 8),
          (timeseries("Micro-batch duration", "Wall time of the last micro-batch, from reading the events to the "
                      "sink (trigger), and of its sink alone; close to or above the trigger interval (5 s by "
                      "default) = the job falls behind.",
                      [target("max by (instance) (kafka_monitor_job_last_trigger_duration_seconds)",
                              legend="trigger {{instance}}"),
                       target("max by (instance) (kafka_monitor_job_last_sink_duration_seconds)",
                              legend="sink {{instance}}", ref="B")], unit="s", min_=0), 8),
          (timeseries("Last micro-batch age", "Seconds since the last completed micro-batch (the alert limit is "
                      "120 s).", [target("time() - max by (instance) (kafka_monitor_job_last_batch_timestamp_seconds > 0)",
                                         legend="{{instance}}")], unit="s", min_=0), 8))
    g.row(8,
          (timeseries("Events behind", "Records in the events topic not processed yet, at each micro-batch.",
                      [target("max by (instance) (kafka_monitor_job_events_behind)", legend="{{instance}}")],
                      min_=0, decimals=0), 8),
          (timeseries("State rows applied per second", "State-output rows the job's sink applies to the exporter "
                      "per second.",
                      [target("sum by (instance) (rate(kafka_monitor_job_sink_rows_total[$__rate_interval]))",
                              legend="{{instance}}")], unit="suffix: rows/s", min_=0), 8),
          (timeseries("State store keys", "Grouping keys with state in the job's state store: its buckets "
                      "(job.buckets), whatever the number of partitions and groups watched.",
                      [target("max by (instance) (kafka_monitor_job_state_keys)", legend="{{instance}}")],
                      min_=0, decimals=0), 8))
    g.row(8,
          (timeseries("Quarantined events per second", "Events the quality gate refused, by reason; they never "
                      "reach state or alerts (KafkaMonitorEventsQuarantined).",
                      [target("sum by (reason) (rate(kafka_monitor_events_quarantined_total[$__rate_interval]))",
                              legend="{{reason}}")], unit="suffix: events/s", min_=0), 8),
          (table("Quarantined events since the job started", "Events refused per reason since the job started.",
                 [target("sum by (reason) (kafka_monitor_events_quarantined_total)", table=True)],
                 rename={"reason": "Reason", "Value": "Events"}, sort_by="Events"), 8),
          (timeseries("Series refused per second", "Entity series refused by the exporter's series cap.",
                      [target("sum by (instance) (rate(kafka_monitor_exporter_series_refused_total[$__rate_interval]))",
                              legend="{{instance}}")], unit="suffix: series/s", min_=0), 8))
    g.row(8,
          (timeseries("Source heartbeat age", "Seconds since each probe or instrumented client last sent a "
                      "heartbeat.", [target(f"time() - max by (cluster, source) ({HEARTBEAT}{{{CLUSTER}}})",
                                            legend="{{source}} ({{cluster}})")], unit="s", min_=0), 6),
          (pipeline_delay(), 6),
          (timeseries("Metadata age per client", "Seconds since each probe or instrumented client last refreshed "
                      "its cluster metadata successfully (the job's MetadataStale opens after 2 x the client's "
                      "metadata.max.age.ms).",
                      [target(f"time() - max by (cluster, source) ({METADATA_REFRESH}{{{CLUSTER}}})",
                              legend="{{source}} ({{cluster}})")], unit="s", min_=0), 6),
          (timeseries("Alert transitions per second", "Alerts the job opens and resolves; a steady stream of both "
                      "for one alert is flapping.",
                      [target("sum by (alert, action) (rate(kafka_monitor_alert_transitions_total[$__rate_interval]))",
                              legend="{{alert}} {{action}}")], unit="suffix: transitions/s", min_=0), 6))
    return dashboard("kafka-monitor-monitor-health", "kafka-monitor / Monitor health",
                     "Is the monitor itself working: scrape, streaming query, micro-batches and backlog, quarantined "
                     "events, the series cap, the sources' heartbeats and metadata freshness.", ["cluster"], g)


def open_count(alert: str, by: str, sel: str, watched: str) -> str:
    """Entities (``by``) with the job's ``alert`` open; 0 while ``watched`` has series."""
    return (f'count(max by ({by}) ({ALERT_ACTIVE}{{alert="{alert}", {sel}}}))\n'
            f"or\n0 * count({watched})")


def open_counts_per(alert: str, by: str, entity: str, sel: str, watched: str) -> str:
    """Like open_count, counted per ``by`` (a subset of ``entity``), 0 per watched ``by``."""
    return (f'count by ({by}) (max by ({entity}) ({ALERT_ACTIVE}{{alert="{alert}", {sel}}}))\n'
            f"or\n0 * count by ({by}) ({watched})")


#: the group variable of the rebalances dashboard: groups with a state (no topic variable there)
GROUP_WITH_STATE = variable("group", "Consumer group", f'label_values({GROUP_STATE}{{cluster=~"$cluster"}}, group)',
                            "Consumer groups whose state the probes report on the selected clusters.")
GROUPS_WATCHED = f"max by (cluster, group) ({GROUP_STATE}{{{GROUP}}})"
def group_alerts() -> tuple[tuple[str, str], ...]:
    g = RULES["group"]
    return (("RebalanceStorm", f"RebalanceStorm: at least {g.storm_min_rebalances} rebalances within "
             f"{minutes(g.storm_window_ms)}."),
            ("RebalanceStuck", "RebalanceStuck (critical): in PreparingRebalance or CompletingRebalance "
             f"longer than {minutes(g.stuck_after_ms)}."),
            ("GroupEmptyWithLag", "GroupEmptyWithLag: no members while there is lag, for longer than "
             f"{minutes(g.empty_with_lag_after_ms)}."))


def rebalances() -> dict:
    g = Grid()
    stats = [(stat(f"{alert} open", f"Groups with the job's {alert} alert open now. {why} 0 = none of the "
                   "watched groups; no value = no group state is reported.",
                   [target(open_count(alert, "cluster, group", GROUP, GROUPS_WATCHED))], th=GREEN_RED_AT_1), 4)
             for alert, why in group_alerts()]
    g.row(4,
          (stat("Groups watched", "Consumer groups whose state the probes report.",
                [target(f"count({GROUPS_WATCHED})")]), 4),
          (stat("Groups not Stable", "Groups whose state is not Stable now (PreparingRebalance, "
                "CompletingRebalance, Empty, Dead, Unknown); a group rebalancing for a moment is normal, one that "
                "stays is not.",
                [target(f'count(max by (cluster, group, state) ({GROUP_STATE}{{{GROUP}, state!="Stable"}} == 1))\n'
                        f"or\n0 * count({GROUPS_WATCHED})")],
                th=thresholds((None, "green"), (1, "orange"))), 4),
          (stat("Members", "Members of the selected groups, summed, as their coordinators report them.",
                [target(f"sum(max by (cluster, group) ({GROUP_MEMBERS}{{{GROUP}}}))")], decimals=0), 4),
          *stats)
    g.row(9,
          (state_timeline("Group state over time", "One row per group and state: coloured while the group is in "
                          "that state (kafka_monitor_group_state). A group that keeps moving between Stable and "
                          "PreparingRebalance is rebalancing over and over.",
                          [target(f"max by (cluster, group, state) ({GROUP_STATE}{{{GROUP}}} == 1)",
                                  legend="{{group}} {{state}} ({{cluster}})")],
                          mappings=[{"type": "value", "options": {"1": {"color": "blue", "index": 0, "text": "in state"}}}],
                          decimals=0), 12),
          (timeseries("Groups per state", "How many of the selected groups are in each state.",
                      [target(f"count by (state) (max by (cluster, group, state) ({GROUP_STATE}{{{GROUP}}} == 1))",
                              legend="{{state}}")], min_=0, decimals=0), 12))
    g.row(8,
          (timeseries("Members per group", "Members of each group as its coordinator reports them: drops and "
                      "returns are members leaving and joining (each one a rebalance).",
                      [target(f"max by (cluster, group) ({GROUP_MEMBERS}{{{GROUP}}})",
                              legend="{{group}} ({{cluster}})")], min_=0, decimals=0), 12),
          (timeseries("Group alerts open", "Groups with the job's RebalanceStorm, RebalanceStuck and "
                      "GroupEmptyWithLag alerts open (0 while none of the watched groups has one).",
                      [target(open_count(alert, "cluster, group", GROUP, GROUPS_WATCHED), legend=alert, ref=ref)
                       for (alert, _), ref in zip(group_alerts(), "ABC")], min_=0, decimals=0), 12))
    g.row(8,
          (table("Open group alerts", "One row per group alert the job has open now.",
                 [target(f'max by (alert, severity, cluster, group) ({ALERT_ACTIVE}{{alert=~"RebalanceStorm|'
                         f'RebalanceStuck|GroupEmptyWithLag", {GROUP}}})', table=True)],
                 rename={"alert": "Alert", "severity": "Severity", "cluster": "Cluster", "group": "Group"},
                 hide=("Time", "Value")), 12),
          (groups_now("Each group's state as its coordinator reports it and its member count."), 12))
    return dashboard("kafka-monitor-rebalances", "kafka-monitor / Rebalances",
                     "Consumer group state over time, members, groups not Stable, and the job's RebalanceStorm, "
                     "RebalanceStuck and GroupEmptyWithLag alerts.", ["cluster", GROUP_WITH_STATE], g)


def client_metadata() -> dict:
    g = Grid()
    cli, src = RULES["client"], RULES["source"]
    clients = f"max by (cluster, source) ({METADATA_REFRESH}{{{CLUSTER}}})"
    partitions_watched = per_partition(REPLICAS, CLUSTER)
    topics_watched = f"max by (cluster, topic) ({REPLICAS}{{{CLUSTER}}})"
    no_source = ("kafka_monitor_alert_active does not carry the client (`source`) yet, so this counts clusters "
                 "with at least one client in that state.")
    g.row(4,
          (stat("Clients reporting", "Probes and instrumented clients that report metadata refreshes.",
                [target(f"count({clients})")]), 4),
          (stat("Oldest metadata", "Seconds since the client with the oldest metadata last refreshed it "
                f"successfully (MetadataStale opens after {cli.metadata_stale_factor:g} x its metadata.max.age.ms "
                f"and the silence grace of {cli.silence_grace_ms / 1000:g} s, "
                f"{minutes(cli.metadata_stale_factor * cli.metadata_max_age_default_ms + cli.silence_grace_ms)} "
                "when it announces none; "
                "orange from one max age).",
                [target(f"time() - min({clients})")], unit="s", decimals=0,
                th=thresholds((None, "green"), (cli.metadata_max_age_default_ms / 1000, "orange"),
                              ((cli.metadata_stale_factor * cli.metadata_max_age_default_ms + cli.silence_grace_ms)
                               / 1000, "red"))), 4),
          (stat("MetadataStale open", f"The job's MetadataStale alert. {no_source}",
                [target(open_count("MetadataStale", "cluster", CLUSTER, clients))], th=GREEN_RED_AT_1), 4),
          (stat("MetadataRefreshStorm open", "The job's MetadataRefreshStorm alert: more than "
                f"{cli.refresh_storm_max} invalidation-driven refreshes within "
                f"{minutes(cli.refresh_storm_window_ms)}. {no_source}",
                [target(open_count("MetadataRefreshStorm", "cluster", CLUSTER, clients))], th=GREEN_RED_AT_1), 4),
          (stat("Leader changes open", "Partitions with the job's LeaderChanged episode open (a leader or "
                "leader-epoch change within the last "
                f"{minutes(RULES['partition'].leader_quiet_ms)}; Prometheus relays them per topic).",
                [target(open_count("LeaderChanged", PK, CLUSTER, partitions_watched))],
                th=thresholds((None, "green"), (1, "blue"))), 4),
          (stat("Partition count changes open", "Topics with the job's PartitionCountChanged alert open "
                "(open for "
                f"{minutes(RULES['partition'].count_change_window_ms)} after the change).",
                [target(open_count("PartitionCountChanged", "cluster, topic", CLUSTER, topics_watched))],
                th=thresholds((None, "green"), (1, "blue"))), 4))
    g.row(8,
          (timeseries("Metadata age per client", "Seconds since each probe or instrumented client last refreshed "
                      "its cluster metadata successfully: a saw-tooth up to metadata.max.age.ms is healthy, a line "
                      "that keeps rising is a client that cannot refresh.",
                      [target(f"time() - {clients}", legend="{{source}} ({{cluster}})")], unit="s", min_=0), 12),
          (timeseries("Heartbeat age per source", "Seconds since each probe or instrumented client last sent a "
                      f"heartbeat (SourceSilent fires after {src.silent_factor:g} of its intervals and the silence "
                      f"grace of {src.silence_grace_ms / 1000:g} s).",
                      [target(f"time() - max by (cluster, source) ({HEARTBEAT}{{{CLUSTER}}})",
                              legend="{{source}} ({{cluster}})")], unit="s", min_=0), 12))
    g.row(8,
          (timeseries("Client metadata alerts open", f"Clusters with the job's MetadataStale and "
                      f"MetadataRefreshStorm open. {no_source}",
                      [target(open_count("MetadataStale", "cluster", CLUSTER, clients), legend="MetadataStale"),
                       target(open_count("MetadataRefreshStorm", "cluster", CLUSTER, clients),
                              legend="MetadataRefreshStorm", ref="B")], min_=0, decimals=0), 8),
          (timeseries("Leader changes open per topic", "Partitions of each topic with a LeaderChanged episode "
                      "open (0 while none).",
                      [target(open_counts_per("LeaderChanged", "cluster, topic", PK, CLUSTER, partitions_watched),
                              legend="{{topic}} ({{cluster}})")], min_=0, decimals=0), 8),
          (table("Open leader and partition-count alerts", "The job's LeaderChanged, PreferredLeaderImbalance "
                 "and PartitionCountChanged alerts open now (partition empty for a topic-wide alert).",
                 [target(f'max by (alert, cluster, topic, partition) ({ALERT_ACTIVE}{{alert=~"LeaderChanged|'
                         f'PreferredLeaderImbalance|PartitionCountChanged", {CLUSTER}}})', table=True)],
                 rename={"alert": "Alert", "cluster": "Cluster", "topic": "Topic", "partition": "Partition"},
                 hide=("Time", "Value")), 8))
    return dashboard("kafka-monitor-client-metadata", "kafka-monitor / Client metadata",
                     "How fresh each client's view of the cluster is: metadata age, the job's MetadataStale and "
                     "MetadataRefreshStorm alerts, heartbeats, leader and partition-count changes.", ["cluster"], g)


DASHBOARDS = {
    "overview.json": overview,
    "partitions.json": partitions,
    "consumer-groups.json": consumer_groups,
    "monitor-health.json": monitor_health,
    "rebalances.json": rebalances,
    "client-metadata.json": client_metadata,
}


def render(d: dict) -> str:
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"


def rules_from_config(path: Optional[str]) -> dict[str, Any]:
    """The job's rule settings from a config file's [job.rules.*] tables and the
    KAFKA_MONITOR_JOB_RULES_* environment, as the job reads them (same errors)."""
    from kafka_monitor import config
    from streaming.job import JobConfig

    job = config.build(JobConfig, "job", file_data=config.read_file(path),
                       flags={"bootstrap_servers": "unused", "checkpoint_dir": "unused"})
    return job.rule_configs()


def build(rules: Optional[dict[str, Any]] = None) -> dict[str, str]:
    """File name -> the exact text this script writes, for these rule settings (default: the
    job's defaults, which the committed files use)."""
    global RULES
    saved, RULES = RULES, (rules or default_rules())
    try:
        return {name: render(make()) for name, make in DASHBOARDS.items()}
    finally:
        RULES = saved


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a file differs")
    ap.add_argument("--config", metavar="FILE",
                    help="draw the thresholds of this kafka-monitor config file's [job.rules.*] tables (and "
                         "the KAFKA_MONITOR_JOB_RULES_* environment) instead of the defaults; needs --out")
    ap.add_argument("--out", metavar="DIR", help="write the dashboards into DIR (default: this folder)")
    args = ap.parse_args(argv)
    if args.config and not args.out:
        ap.error("--config needs --out DIR: the committed dashboards keep the default thresholds")
    rules = None
    if args.config or any(k.startswith("KAFKA_MONITOR_JOB_RULES_") for k in os.environ):
        if not args.out:
            ap.error("KAFKA_MONITOR_JOB_RULES_* is set: give --out DIR (the committed dashboards keep the defaults)")
        try:
            rules = rules_from_config(args.config)
        except ValueError as e:  # ConfigError / JobConfigError name the setting
            print(f"error: {e}", file=sys.stderr)
            return 2
    out = Path(args.out) if args.out else HERE
    out.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, text in build(rules).items():
        path = out / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run python dashboards/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
