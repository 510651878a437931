"""``kafka-monitor snapshot``: the cluster's state as one self-contained HTML file, from Prometheus.

For a person at a terminal or an incident ticket, without Grafana: it queries a Prometheus
server's HTTP API over a time range and writes one HTML file (inline CSS and SVG; no script,
font, image or stylesheet is fetched from anywhere) with

- consumer lag per (cluster, group, topic) over time, the max over partitions, and the
  groups and partitions with the worst lag at the end of the range;
- replication: under-replicated partitions over time, and the ISR vs replicas of every
  partition that is under-replicated, offline or has its UnderReplicated alert open;
- an alerts timeline: the job's ``kafka_monitor_alert_active`` series, and the ``ALERTS``
  series Prometheus keeps for its own alerting rules when there are any;
- the monitor's own health: ``kafka_monitor_job_up``, seconds since the last micro-batch,
  events quarantined, sources' heartbeat ages.

It also prints the gist (worst lags, open alerts, monitor health) to stdout.

Bounded by construction: every chart draws at most ``--top`` series, ranked on the server
(``topk`` over a subquery pinned with ``@`` to the end of the range), and every table at most
``--rows`` rows; the page says how many were left out.  Only the standard library is used.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import http.client
import json
import math
import os
import re
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

DEFAULT_PROMETHEUS = "http://127.0.0.1:9090"
#: auto step: the roundest step giving at most this many points per series
AUTO_POINTS = 300
#: Prometheus refuses range queries of more points than this per series
PROMETHEUS_MAX_POINTS = 11_000
NICE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
FILTER_LABELS = ("cluster", "group", "topic")
STATE_ORDER = {"pending": 1, "firing": 2}
#: alert_active and ALERTS label a partition's alert with these (empty when they do not apply)
ENTITY_LABELS = ("cluster", "group", "topic", "partition", "source", "reason")
LAG_AGE_WARN_S = 120  # the threshold of KafkaMonitorJobFallingBehind

DESCRIPTION = """\
Query a Prometheus server that scrapes the kafka-monitor job and write ONE self-contained HTML
file (inline CSS and SVG; nothing is fetched when it is opened) with:

  - consumer lag per group and topic over the range (max over partitions), and the groups and
    partitions with the worst lag at the end of the range;
  - replication: under-replicated partitions over time; ISR vs replicas of the partitions that
    are under-replicated, offline or have the UnderReplicated alert open;
  - an alerts timeline: kafka_monitor_alert_active per alert and entity, and the ALERTS series
    of Prometheus's own alerting rules when it has any (pending and firing);
  - the monitor's health: kafka_monitor_job_up, seconds since the last micro-batch, events
    quarantined by reason, the sources' heartbeat ages.

The gist (worst lags, open alerts, monitor health) is printed to stdout as well.

Filters (--cluster, --group, --topic; exact values, repeatable) are added to every query: a
series that carries the label must have one of the values; a series without it (the job's own
health, an alert about another kind of entity) is kept.  So --group narrows lag and group
alerts, and the partition panels show every partition of the --topic/--cluster.

Charts draw the --top series with the highest values (timelines: the most recently active) and
say how many were left out; tables show --rows rows.

Exit status: 0 written; 1 written, but some panel's query failed (the panel says why);
2 nothing written: Prometheus unreachable or not Prometheus, a bad flag, --out not writable.

examples:
  kafka-monitor snapshot
  kafka-monitor snapshot --prometheus http://prometheus:9090 --since 6h --cluster prod-eu-1
  kafka-monitor snapshot --since 2h --end 2024-05-01T14:00:00Z --out incident-4711.html
"""


class SnapshotError(Exception):
    """Something the user can fix (the message says what); nothing is written; exit 2."""


class QueryError(Exception):
    """Prometheus answered an error to one query; that panel shows it, the others render."""


# -- flags ------------------------------------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def parse_duration(text: str, flag: str) -> float:
    """``90s``, ``15m``, ``1h30m``, ``7d``, or plain seconds -> seconds (> 0)."""
    t = (text or "").strip()
    secs = 0.0
    if re.fullmatch(r"\d+(?:\.\d+)?", t):
        secs = float(t)
    else:
        pos = 0
        for m in _DURATION_PART.finditer(t):
            if m.start() != pos:
                break
            secs += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos == 0 or pos != len(t):
            raise SnapshotError(f"{flag}: {text!r} is not a duration (examples: 90s, 15m, 1h, 2h30m, 7d)")
    if not math.isfinite(secs) or secs <= 0:
        raise SnapshotError(f"{flag}: must be more than 0, got {text!r}")
    return secs


def parse_time(text: str, flag: str = "--end") -> float:
    """``now``, Unix seconds, or ISO 8601 (no zone = UTC) -> Unix seconds."""
    t = (text or "now").strip()
    if t == "now":
        return time.time()
    try:
        return float(t)
    except ValueError:
        pass
    try:
        d = dt.datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith(("Z", "z")) else t)
    except ValueError:
        raise SnapshotError(f"{flag}: {text!r} is not a time (now, Unix seconds, or ISO 8601 such as "
                            f"2024-05-01T14:00:00Z)") from None
    return (d if d.tzinfo else d.replace(tzinfo=dt.timezone.utc)).timestamp()


def auto_step(range_s: float) -> float:
    want = range_s / AUTO_POINTS
    return float(next((s for s in NICE_STEPS if s >= want), math.ceil(want / 86400) * 86400))


def fmt_duration(secs: float) -> str:
    """3725 -> '1h2m5s'; 0.5 -> '500ms'."""
    if secs < 1:
        return f"{secs * 1000:.0f}ms"
    out, rest = [], int(round(secs))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(out) or "0s"


# -- PromQL text ------------------------------------------------------------------------------------

_RE2_META = set("\\.+*?()|[]{}^$")


def re2_escape(value: str) -> str:
    """A literal for an RE2 regex (what Go's regexp.QuoteMeta escapes; Python's re.escape also
    escapes spaces and more, which RE2 rejects)."""
    return "".join("\\" + c if c in _RE2_META else c for c in value)


def promql_string(value: str) -> str:
    """A double-quoted PromQL string literal holding ``value`` exactly."""
    out = []
    for c in value:
        if c in '\\"':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def filter_matchers(filters: dict[str, list[str]]) -> str:
    """``label=~"(?:v1|v2)|"`` per filtered label: one of the values, or the label absent."""
    parts = []
    for label in FILTER_LABELS:
        values = filters.get(label) or []
        if values:
            alternatives = "|".join(re2_escape(v) for v in values)
            parts.append(f"{label}=~{promql_string(f'(?:{alternatives})|')}")
    return ",".join(parts)


# -- Prometheus HTTP API ----------------------------------------------------------------------------


@dataclass
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]

    @property
    def max(self) -> float:
        vals = [v for _, v in self.points if not math.isnan(v)]
        return max(vals) if vals else float("nan")

    @property
    def last(self) -> float:
        return self.points[-1][1] if self.points else float("nan")


def normalize_url(url: str) -> str:
    u = url.strip().rstrip("/")
    if "://" not in u:
        u = "http://" + u
    parsed = urllib.parse.urlsplit(u)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise SnapshotError(f"--prometheus: {url!r} is not an http(s) URL (example: http://127.0.0.1:9090)")
    return u


class Prometheus:
    def __init__(self, url: str, timeout: float = 30.0):
        self.url = normalize_url(url)
        self.timeout = timeout

    def _unreachable(self, reason: object) -> SnapshotError:
        return SnapshotError(f"cannot reach Prometheus at {self.url}: {reason}; start it or pass --prometheus")

    def get(self, path: str, params: Optional[dict[str, str]] = None) -> Any:
        full = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        req = urllib.request.Request(full, headers={"Accept": "application/json",
                                                    "User-Agent": "kafka-monitor-snapshot"})
        status = 200
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:  # Prometheus answers 400/422/503 with a JSON error
            status, body = e.code, e.read()
        except urllib.error.URLError as e:
            raise self._unreachable(e.reason) from None
        except (socket.timeout, TimeoutError):
            raise self._unreachable(f"no answer within {self.timeout:g}s (--timeout)") from None
        except (OSError, http.client.HTTPException) as e:
            raise self._unreachable(e) from None
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or "status" not in doc:
            raise SnapshotError(f"{self.url} answered {path} with HTTP {status} and no Prometheus API JSON: "
                                f"is it a Prometheus server's base URL? pass --prometheus "
                                f"(example: {DEFAULT_PROMETHEUS})")
        if doc["status"] != "success":
            raise QueryError(f"{doc.get('errorType', 'error')}: {doc.get('error', '(no message)')}")
        return doc.get("data")

    def instant(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
        data = self.get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        if data["resultType"] != "vector":
            raise QueryError(f"expected a vector from {expr!r}, got a {data['resultType']}")
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def scalar(self, expr: str, at: float) -> Optional[float]:
        """The one value of ``expr`` (an aggregation without by); None when it is empty."""
        rows = self.instant(expr, at)
        return rows[0][1] if rows else None

    def range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self.get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                "step": f"{step:g}"})
        return [Series(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]]


# -- what the page holds ----------------------------------------------------------------------------


@dataclass
class Chart:
    """Series over time, at most ``cap`` of ``total`` (ranked on the server)."""
    series: list[Series] = field(default_factory=list)
    total: int = 0
    error: Optional[str] = None

    @property
    def left_out(self) -> int:
        return max(0, self.total - len(self.series))


@dataclass
class Segment:
    start: float
    end: float
    state: str  # alert: active | pending | firing; job: up | down
    open: bool  # still in this state at the end of the range


@dataclass
class Row:
    labels: dict[str, str]
    segments: list[Segment]

    @property
    def open_segment(self) -> Optional[Segment]:
        return self.segments[-1] if self.segments and self.segments[-1].open else None


@dataclass
class Timeline:
    rows: list[Row] = field(default_factory=list)
    total: int = 0
    error: Optional[str] = None

    @property
    def left_out(self) -> int:
        return max(0, self.total - len(self.rows))


@dataclass
class Table:
    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    error: Optional[str] = None

    @property
    def left_out(self) -> int:
        return max(0, self.total - len(self.rows))


@dataclass
class Snapshot:
    url: str
    version: Optional[str]
    start: float
    end: float
    step: float
    generated: float
    filters: dict[str, list[str]]
    top: int
    rows: int
    queries: list[tuple[str, str]] = field(default_factory=list)  # (what, PromQL)
    lag_chart: Chart = field(default_factory=Chart)
    lag_groups: Table = field(default_factory=Table)
    lag_partitions: Table = field(default_factory=Table)
    lagging_partitions: Optional[int] = None
    urp_chart: Chart = field(default_factory=Chart)
    replication: Table = field(default_factory=Table)
    partitions_total: Optional[int] = None
    urp_total: Optional[int] = None
    offline_total: Optional[int] = None
    alert_timeline: Timeline = field(default_factory=Timeline)
    alerts_open: Optional[int] = None
    prom_alert_timeline: Timeline = field(default_factory=Timeline)
    prom_alerts_firing: Optional[int] = None
    job_timeline: Timeline = field(default_factory=Timeline)
    batch_age_chart: Chart = field(default_factory=Chart)
    batch_age_now: Optional[float] = None
    job_up_now: Optional[list[float]] = None
    batches_in_range: Optional[float] = None
    quarantine_chart: Chart = field(default_factory=Chart)
    quarantined: Table = field(default_factory=Table)
    heartbeats: Table = field(default_factory=Table)
    refused_in_range: Optional[float] = None
    health_error: Optional[str] = None

    @property
    def errors(self) -> list[str]:
        parts: list[Any] = [self.lag_chart, self.lag_groups, self.lag_partitions, self.urp_chart, self.replication,
                 self.alert_timeline, self.prom_alert_timeline, self.job_timeline, self.batch_age_chart,
                 self.quarantine_chart, self.quarantined, self.heartbeats]
        return [p.error for p in parts if p.error] + ([self.health_error] if self.health_error else [])


class Collector:
    """Runs the queries of one snapshot; a failed query fails its panel, not the snapshot."""

    def __init__(self, prom: Prometheus, snap: Snapshot):
        self.prom, self.s = prom, snap
        self.f = filter_matchers(snap.filters)
        self.range_s = snap.end - snap.start
        self.sub = f"[{int(round(self.range_s * 1000))}ms:{int(round(snap.step * 1000))}ms]"

    def sel(self, metric: str, *matchers: str) -> str:
        inner = ",".join([*matchers, self.f] if self.f else matchers)
        return f"{metric}{{{inner}}}"

    def note(self, what: str, expr: str) -> str:
        self.s.queries.append((what, expr))
        return expr

    def count(self, expr: str) -> int:
        v = self.prom.scalar(f"count({expr})", self.s.end)
        return int(v) if v is not None else 0

    def capped(self, what: str, expr: str, rank: str = "value", per_row: str = "") -> tuple[list[Series], int]:
        """``expr`` over the range, at most --top series (rows), chosen by Prometheus (``topk``
        over a subquery pinned to the end of the range), so a cluster with 10,000 groups does
        not ship 10,000 series here.  rank: "value" = the highest value in the range first;
        "recent" = the most recently present first (timelines).  per_row: a label that splits
        one row into several series (ALERTS' alertstate): rows are counted and ranked without it."""
        s = self.s
        key = f"max without ({per_row}) ({expr})" if per_row else expr
        total = self.count(f"max_over_time(({key}){self.sub})")
        query = expr
        if total > s.top:
            ranked = key if rank == "value" else f"timestamp({key})"
            ignoring = f" ignoring ({per_row})" if per_row else ""
            query = f"({expr}) and{ignoring} topk({s.top}, max_over_time(({ranked}){self.sub} @ {s.end:.3f}))"
        self.note(what, query)
        return self.prom.range(query, s.start, s.end, s.step), total

    def chart(self, what: str, expr: str) -> Chart:
        try:
            series, total = self.capped(what, expr)
        except QueryError as e:
            return Chart(error=f"{what}: {e}")
        series.sort(key=lambda x: (-_nan_low(x.max), label_text(x.labels)))
        return Chart(series[: self.s.top], total)

    def timeline(self, what: str, expr: str, state: Callable[[dict[str, str], float], Optional[str]],
                 row_labels: Callable[[dict[str, str]], dict[str, str]], per_row: str = "") -> Timeline:
        try:
            series, total = self.capped(what, expr, "recent", per_row)
        except QueryError as e:
            return Timeline(error=f"{what}: {e}")
        rows = build_rows(series, self.s.start, self.s.end, self.s.step, state, row_labels)
        rows.sort(key=lambda r: (-(r.segments[-1].end if r.segments else 0), label_text(r.labels)))
        return Timeline(rows[: self.s.top], max(total, len(rows)))

    def run(self) -> None:
        s, sel = self.s, self.sel
        rows = s.rows

        # consumer lag
        lag = f"max by (cluster, group, topic) ({sel('kafka_monitor_group_partition_lag')})"
        s.lag_chart = self.chart("consumer lag (max over partitions)", lag)
        part_lag = f"max by (cluster, group, topic, partition) ({sel('kafka_monitor_group_partition_lag')})"
        try:
            by_part = self.prom.instant(self.note("worst partitions", f"topk({rows}, {part_lag})"), s.end)
            s.lag_partitions = Table(_ranked(by_part, ("cluster", "group", "topic", "partition")),
                                     self.count(part_lag))
            s.lagging_partitions = self.count(f"{part_lag} > 0")
        except QueryError as e:
            s.lag_partitions = Table(error=f"worst partitions: {e}")
        group_sum = f"sum by (cluster, group, topic) ({part_lag})"
        try:
            by_group = self.prom.instant(self.note("worst groups", f"topk({rows}, {group_sum})"), s.end)
            worst = {}  # (cluster, group, topic) -> (partition, lag) of its worst partition
            for labels, v in self.prom.instant(
                    self.note("worst partition of each group", f"topk by (cluster, group, topic) (1, {part_lag}) "
                              f"and on (cluster, group, topic) topk({rows}, {group_sum})"), s.end):
                worst[(labels.get("cluster", ""), labels.get("group", ""), labels.get("topic", ""))] = (
                    labels.get("partition", ""), v)
            table = _ranked(by_group, ("cluster", "group", "topic"))
            for r in table:
                r["worst_partition"], r["worst_lag"] = worst.get((r["cluster"], r["group"], r["topic"]), ("", None))
            s.lag_groups = Table(table, self.count(group_sum))
        except QueryError as e:
            s.lag_groups = Table(error=f"worst groups: {e}")

        # replication
        key = "cluster, topic, partition"
        isr = f"max by ({key}) ({sel('kafka_monitor_partition_in_sync_replicas')})"
        reps = f"max by ({key}) ({sel('kafka_monitor_partition_replicas')})"
        leader = f"max by ({key}) ({sel('kafka_monitor_partition_leader')})"
        ur_alert = f"max by ({key}) ({sel('kafka_monitor_alert_active', 'alert=' + promql_string('UnderReplicated'))})"
        s.urp_chart = self.chart("under-replicated partitions (ISR < replicas)",
                                 f"sum by (cluster) ({isr} < bool {reps})")
        try:
            s.partitions_total = self.count(reps)
            s.urp_total = self.count(f"{isr} < {reps}")
            s.offline_total = self.count(f"{leader} == -1")
            missing = self.prom.instant(self.note("under-replicated", f"topk({rows}, {reps} - {isr} > 0)"), s.end)
            replicas = self.prom.instant(self.note("their replicas", f"{reps} and topk({rows}, {reps} - {isr} > 0)"),
                                         s.end)
            isr_of = self.prom.instant(self.note("ISR of alerted/offline", f"{isr} and (topk({rows}, {ur_alert}) or "
                                                 f"bottomk({rows}, {leader} == -1))"), s.end)
            reps_of = self.prom.instant(f"{reps} and (topk({rows}, {ur_alert}) or bottomk({rows}, {leader} == -1))",
                                        s.end)
            alerted = self.prom.instant(self.note("UnderReplicated open", f"topk({rows}, {ur_alert})"), s.end)
            offline = self.prom.instant(self.note("offline", f"bottomk({rows}, {leader} == -1)"), s.end)
            k = lambda lb: (lb.get("cluster", ""), lb.get("topic", ""), lb.get("partition", ""))  # noqa: E731
            parts: dict[tuple, dict[str, Any]] = {}

            def row(lb: dict[str, str]) -> dict[str, Any]:
                return parts.setdefault(k(lb), {"cluster": k(lb)[0], "topic": k(lb)[1], "partition": k(lb)[2],
                                                "isr": None, "replicas": None, "alert": False, "offline": False})
            rep_val = {k(lb): v for lb, v in replicas + reps_of}
            for lb, miss in missing:
                r = row(lb)
                r["replicas"] = rep_val.get(k(lb))
                r["isr"] = r["replicas"] - miss if r["replicas"] is not None else None
            for lb, v in isr_of:
                row(lb)["isr"] = v
            for lb, v in reps_of:
                row(lb)["replicas"] = v
            for lb, _ in alerted:
                row(lb)["alert"] = True
            for lb, _ in offline:
                row(lb)["offline"] = True
            table = sorted(parts.values(), key=lambda r: (
                not r["offline"], -((r["replicas"] or 0) - (r["isr"] or 0)), r["cluster"], r["topic"],
                _natural(r["partition"])))
            total = self.count(f"({isr} < {reps}) or ({ur_alert}) or ({leader} == -1)")
            s.replication = Table(table[:rows], max(total, len(table[:rows])))
        except QueryError as e:
            s.replication = Table(error=f"replication: {e}")

        # alerts
        alert = f"max by (alert, severity, {', '.join(ENTITY_LABELS[:4])}) ({sel('kafka_monitor_alert_active')})"
        s.alert_timeline = self.timeline("kafka_monitor_alert_active", alert,
                                         lambda lb, v: "active" if v > 0 else None, lambda lb: lb)
        try:
            s.alerts_open = self.count(alert)
        except QueryError as e:
            s.alert_timeline.error = s.alert_timeline.error or f"open alerts: {e}"
        prom_alerts = sel("ALERTS")
        s.prom_alert_timeline = self.timeline(
            "ALERTS (Prometheus's alerting rules)", prom_alerts,
            lambda lb, v: lb.get("alertstate", "firing") if v > 0 else None,
            lambda lb: {k2: v2 for k2, v2 in lb.items() if k2 not in ("__name__", "alertstate")}, per_row="alertstate")
        try:
            s.prom_alerts_firing = self.count(sel("ALERTS", 'alertstate="firing"'))
        except QueryError as e:
            s.prom_alert_timeline.error = s.prom_alert_timeline.error or f"firing alerts: {e}"

        # the monitor's own health
        inst = "job, instance"
        s.job_timeline = self.timeline("kafka_monitor_job_up", f"max by ({inst}) ({sel('kafka_monitor_job_up')})",
                                       lambda lb, v: "up" if v >= 1 else "down", lambda lb: lb)
        batch_ts = f"max by ({inst}) ({sel('kafka_monitor_job_last_batch_timestamp_seconds')})"
        s.batch_age_chart = self.chart("seconds since the last micro-batch", f"time() - ({batch_ts} > 0)")
        window = fmt_duration(max(4 * s.step, 300))
        s.quarantine_chart = self.chart(
            "events quarantined per minute",
            f"sum by (reason) (rate({sel('kafka_monitor_events_quarantined_total')}[{window}])) * 60")
        rng = f"{int(round(self.range_s * 1000))}ms"
        try:
            q = self.prom.instant(self.note("quarantined in range", f"sum by (reason) (increase("
                                            f"{sel('kafka_monitor_events_quarantined_total')}[{rng}]))"), s.end)
            s.quarantined = Table(_ranked(q, ("reason",)), len(q))
        except QueryError as e:
            s.quarantined = Table(error=f"quarantined: {e}")
        hb = f"time() - max by (cluster, source) ({sel('kafka_monitor_source_last_heartbeat_timestamp_seconds')})"
        try:
            beats = self.prom.instant(self.note("heartbeat ages", f"topk({rows}, {hb})"), s.end)
            s.heartbeats = Table(_ranked(beats, ("cluster", "source")), self.count(hb))
        except QueryError as e:
            s.heartbeats = Table(error=f"heartbeats: {e}")
        try:
            s.job_up_now = [v for _, v in self.prom.instant(f"max by ({inst}) ({sel('kafka_monitor_job_up')})", s.end)]
            s.batch_age_now = self.prom.scalar(f"min(time() - ({batch_ts} > 0))", s.end)
            s.batches_in_range = self.prom.scalar(
                f"sum(increase({sel('kafka_monitor_job_batches_total')}[{rng}]))", s.end)
            s.refused_in_range = self.prom.scalar(
                f"sum(increase({sel('kafka_monitor_exporter_series_refused_total')}[{rng}]))", s.end)
        except QueryError as e:
            s.health_error = f"monitor health: {e}"


def _nan_low(v: float) -> float:
    return -math.inf if math.isnan(v) else v


def _natural(s: str) -> tuple:
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


def _ranked(result: list[tuple[dict[str, str], float]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = [{**{k: lb.get(k, "") for k in keys}, "value": v} for lb, v in result]
    return sorted(rows, key=lambda r: (-_nan_low(r["value"]), *(_natural(r[k]) for k in keys)))


def build_rows(series: list[Series], start: float, end: float, step: float,
               state: Callable[[dict[str, str], float], Optional[str]],
               row_labels: Callable[[dict[str, str]], dict[str, str]]) -> list[Row]:
    """Series (several per row: ALERTS has one per alertstate) -> rows of state segments.  A
    sample at t stands for [t, t + step); a gap of more than one step ends a segment."""
    points: dict[tuple, list[tuple[float, str]]] = {}
    labels_of: dict[tuple, dict[str, str]] = {}
    for se in series:
        lb = row_labels(se.labels)
        key = tuple(sorted(lb.items()))
        labels_of[key] = lb
        for t, v in se.points:
            st = state(se.labels, v)
            if st is not None and not math.isnan(v):
                points.setdefault(key, []).append((t, st))
    rows = []
    for key, pts in points.items():
        # one state per step; at a step where two series of a row overlap (ALERTS' pending series
        # still inside the lookback while the firing one starts) the later state in STATE_ORDER wins
        at: dict[float, str] = {}
        for t, st in pts:
            if t not in at or STATE_ORDER.get(st, 0) > STATE_ORDER.get(at[t], 0):
                at[t] = st
        segs: list[Segment] = []
        last_t = 0.0
        for t in sorted(at):
            st = at[t]
            if segs and segs[-1].state == st and t - last_t <= step * 1.5:
                segs[-1].end = t + step
            else:
                segs.append(Segment(t, t + step, st, False))
            last_t = t
            segs[-1].open = t >= end - step * 0.01
        for sg in segs:
            sg.end = min(sg.end, end)
        rows.append(Row(labels_of[key], segs))
    return rows


def collect(prom: Prometheus, start: float, end: float, step: float, filters: dict[str, list[str]],
            top: int = 10, rows: int = 20) -> Snapshot:
    version = None
    prom.instant("time()", end)  # reachable and a Prometheus API: fails with a SnapshotError otherwise
    try:
        version = (prom.get("/api/v1/status/buildinfo") or {}).get("version")
    except (QueryError, SnapshotError):
        pass
    snap = Snapshot(prom.url, version, start, end, step, time.time(), filters, top, rows)
    Collector(prom, snap).run()
    return snap


# -- formatting -------------------------------------------------------------------------------------


def label_text(labels: dict[str, str], skip: tuple[str, ...] = ("__name__",)) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in skip and v != "")


def fmt_num(v: Optional[float]) -> str:
    """1234 -> '1,234'; 1.5e6 -> '1,500,000'; 0.25 -> '0.25'."""
    if v is None or math.isnan(v):
        return "–"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if abs(v - round(v)) < 1e-9 or abs(v) >= 100:
        return f"{round(v):,}"
    return f"{v:,.2f}".rstrip("0").rstrip(".")


def fmt_si(v: float) -> str:
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= size:
            return f"{v / size:.3g}{suffix}"
    return f"{v:.3g}"


def fmt_time(t: float, with_date: bool = True) -> str:
    d = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    return d.strftime("%Y-%m-%d %H:%M:%S") if with_date else d.strftime("%H:%M:%S")


def entity_text(labels: dict[str, str], names: tuple[str, ...], cluster: bool = True) -> str:
    """The entity an alert is about: 'topic orders partition 2 (cluster c)'."""
    parts = [f"{n} {labels[n]}" for n in names if labels.get(n) and n != "cluster"]
    extra = [f"{k}={v}" for k, v in sorted(labels.items())
             if v and k not in names and k not in ("alert", "alertname", "severity", "__name__", "alertstate")]
    text = " ".join(parts + extra)
    return text + (f" (cluster {labels['cluster']})" if cluster and labels.get("cluster") else "")


# -- the plain-text summary ---------------------------------------------------------------------------


def _term(s: object) -> str:
    """Label values shown on a terminal: control characters (ANSI escapes...) made visible."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(s))


def _text_table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    cells = [[_term(c) for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return [indent + "  ".join(c.rjust(w) if i == 0 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in cells]


def render_text(s: Snapshot, out: Optional[str] = None) -> str:
    L = [f"kafka-monitor snapshot of {s.url}: {fmt_time(s.start)} to {fmt_time(s.end, False)} UTC "
         f"({fmt_duration(s.end - s.start)}, step {fmt_duration(s.step)})"]
    if any(s.filters.values()):
        L.append("filters: " + "; ".join(f"{k} = {' or '.join(map(_term, v))}" for k, v in s.filters.items() if v))
    L.append("")
    lp = s.lag_partitions
    if lp.error:
        L.append(f"Consumer lag: query failed: {lp.error}")
    elif not lp.rows:
        L.append("Consumer lag: no data at the end of the range")
    else:
        shown = lp.rows[:5]
        L.append(f"Worst consumer lag now ({s.lagging_partitions or 0} of {lp.total} partitions lagging; "
                 f"top {len(shown)}):")
        L += _text_table(["LAG", "GROUP", "TOPIC", "PARTITION", "CLUSTER"],
                         [[fmt_num(r["value"]), r["group"], r["topic"], r["partition"], r["cluster"]] for r in shown])
    L.append("")
    tl = s.alert_timeline
    if tl.error:
        L.append(f"Alerts: query failed: {tl.error}")
    else:
        open_rows = [r for r in tl.rows if r.open_segment]
        n_open = s.alerts_open if s.alerts_open is not None else len(open_rows)
        L.append(f"Open alerts (kafka_monitor_alert_active): {n_open}")
        for r in open_rows[:10]:
            sg = r.open_segment
            if sg is None:  # open_rows have one
                continue
            since = (f"since before {fmt_time(s.start, False)}" if sg.start <= s.start + 1e-6
                     else f"open since {fmt_time(sg.start, False)}")
            L.append(f"  {_term(r.labels.get('severity', '?'))} {_term(r.labels.get('alert', '?'))} "
                     f"{_term(entity_text(r.labels, ENTITY_LABELS))} ({since})")
        resolved = sum(1 for r in tl.rows if not r.open_segment)
        if resolved:
            L.append(f"  ({resolved} more opened and resolved within the range; see the timeline)")
    pt = s.prom_alert_timeline
    if not pt.error and pt.rows:
        firing = [r for r in pt.rows if r.open_segment and r.open_segment.state == "firing"]
        n_firing = s.prom_alerts_firing if s.prom_alerts_firing is not None else len(firing)
        L.append(f"Prometheus ALERTS firing now: {n_firing}")
        for r in firing[:10]:
            L.append(f"  {_term(r.labels.get('alertname', '?'))} {_term(entity_text(r.labels, ENTITY_LABELS))}")
    L.append("")
    if s.replication.error:
        L.append(f"Replication: query failed: {s.replication.error}")
    elif not s.partitions_total:
        L.append("Replication: no data at the end of the range")
    else:
        L.append(f"Partitions: {s.partitions_total}, under-replicated {s.urp_total}, offline {s.offline_total}")
        for rep in s.replication.rows[:10]:
            L.append(f"  {_term(rep['topic'])}/{_term(rep['partition'])} (cluster {_term(rep['cluster'])}): ISR "
                     f"{fmt_num(rep['isr'])} of {fmt_num(rep['replicas'])} replicas"
                     + (", UnderReplicated alert open" if rep["alert"] else "")
                     + (", OFFLINE" if rep["offline"] else ""))
    L.append("")
    L.append("Monitor: " + health_text(s))
    if s.errors:
        L.append("")
        L.append(f"{len(s.errors)} queries failed (their panels say so):")
        L += [f"  {_term(e)}" for e in s.errors]
    if out:
        L.append("")
        L.append(f"wrote {out}")
    return "\n".join(L) + "\n"


def health_text(s: Snapshot) -> str:
    if s.health_error:
        return f"query failed: {s.health_error}"
    parts = []
    ups = s.job_up_now or []
    if not ups:
        parts.append("no kafka_monitor_job_up at the end of the range (job not scraped?)")
    else:
        down = sum(1 for v in ups if v < 1)
        parts.append("job up" if not down else f"job DOWN on {down} of {len(ups)} instances")
    if s.batch_age_now is not None:
        parts.append(f"last batch {fmt_duration(max(0.0, s.batch_age_now))} ago")
    elif ups:
        parts.append("no micro-batch completed")
    if s.batches_in_range is not None:
        parts.append(f"{fmt_num(round(s.batches_in_range))} batches in range")
    total_q = sum(r["value"] for r in s.quarantined.rows if not math.isnan(r["value"]))
    reasons = ", ".join(f"{r['reason']} {fmt_num(round(r['value']))}" for r in s.quarantined.rows if r["value"] >= 0.5)
    parts.append(f"quarantined ≈{fmt_num(round(total_q))} events" + (f" ({reasons})" if reasons else ""))
    if s.refused_in_range:
        parts.append(f"{fmt_num(round(s.refused_in_range))} series refused by the exporter's cap")
    return ", ".join(parts)


# -- HTML -----------------------------------------------------------------------------------------

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#79706e")
STATE_COLORS = {"critical": "#c62828", "warning": "#ef8a17", "info": "#4e79a7", "up": "#59a14f", "down": "#c62828"}

CSS = """
:root { --fg: #1d232a; --muted: #5d6875; --line: #d8dde3; --bg: #ffffff; --panel: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); background: var(--bg); margin: 0 auto; padding: 20px 28px 40px; max-width: 1100px; }
h1 { font-size: 22px; margin: 0 0 6px; }
h2 { font-size: 18px; margin: 30px 0 8px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 14px; margin: 18px 0 6px; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace; font-size: 12.5px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0 14px; color: var(--muted); }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; color: var(--fg); }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 10px; margin: 10px 0; }
.card { border: 1px solid var(--line); border-left: 5px solid #9aa5b1; border-radius: 6px; padding: 8px 12px; background: var(--panel); }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
.card .v { font-size: 20px; font-weight: 650; overflow-wrap: anywhere; }
.card .d { color: var(--muted); font-size: 12px; overflow-wrap: anywhere; }
.card.ok { border-left-color: #59a14f; } .card.warn { border-left-color: #ef8a17; } .card.bad { border-left-color: #c62828; }
.chart { border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px 6px; margin: 8px 0; }
.chart svg { display: block; width: 100%; height: auto; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; font-size: 11px; fill: #47515c; }
svg .grid { stroke: #e6e9ed; stroke-width: 1; } svg .axis { stroke: #9aa5b1; stroke-width: 1; }
ul.legend { list-style: none; margin: 6px 0 0; padding: 0; display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 2px 16px; font-size: 12.5px; }
ul.legend li { display: flex; gap: 6px; align-items: baseline; min-width: 0; }
ul.legend .sw { flex: none; width: 12px; height: 12px; border-radius: 2px; display: inline-block; position: relative; top: 1px; }
ul.legend .name { overflow-wrap: anywhere; } ul.legend .val { color: var(--muted); white-space: nowrap; margin-left: auto; }
.note { color: var(--muted); font-size: 12.5px; margin: 4px 0; }
.empty { color: var(--muted); font-style: italic; padding: 14px 4px; }
.error { color: #b71c1c; background: #fdecea; border-radius: 4px; padding: 8px 10px; overflow-wrap: anywhere; }
table { border-collapse: collapse; width: 100%; margin: 6px 0; font-size: 13px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; overflow-wrap: break-word; }
th { background: var(--panel); font-weight: 600; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.two { display: grid; grid-template-columns: 1fr 1fr; gap: 18px; } @media (max-width: 800px) { .two { grid-template-columns: 1fr; } }
.tag { display: inline-block; border-radius: 3px; padding: 0 5px; font-size: 11.5px; color: #fff; }
details { margin-top: 30px; color: var(--muted); } details pre { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 12px; }
footer { margin-top: 24px; color: var(--muted); font-size: 12px; }
@media print { body { padding: 0; } .chart, table { break-inside: avoid; } }
"""


def e(s: object) -> str:
    """Escaped for HTML text and attribute values (SVG inline in HTML included)."""
    return html.escape(str(s), quote=True)


_SECOND_TICKS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def y_scale(vmax: float, unit: str = "", integer: bool = False) -> tuple[float, float]:
    """(top of the axis, tick spacing) for values in [0, vmax], about 4 ticks: round numbers
    (1, 2, 2.5, 5 x 10^k; whole numbers for counts) or round durations for seconds."""
    if not vmax > 0 or not math.isfinite(vmax):
        vmax = 1.0
    raw = vmax / 4
    if unit == "s":
        tick = float(next((t for t in _SECOND_TICKS if t >= raw), math.ceil(raw / 86400) * 86400))
    else:
        exp = math.floor(math.log10(raw))
        tick = next(m * 10.0 ** exp for m in (1, 2, 2.5, 5, 10) if m * 10.0 ** exp >= raw * (1 - 1e-12))
        if integer and tick < 1:
            tick = 1.0
        elif integer and tick != int(tick):
            tick = math.ceil(tick)
    return math.ceil(vmax / tick - 1e-9) * tick, tick


_TIME_TICKS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)


def _time_ticks(start: float, end: float, max_ticks: int = 8) -> tuple[list[float], str]:
    span = max(end - start, 1)
    every = next((t for t in _TIME_TICKS if span / t <= max_ticks), span / max_ticks)
    first = math.ceil(start / every) * every
    ticks = [first + i * every for i in range(int((end - first) // every) + 1)]
    fmt = "%H:%M" if span <= 86400 * 1.5 and every < 86400 else ("%m-%d %H:%M" if every < 86400 else "%m-%d")
    return ticks, fmt


def _fmt_value(v: float, unit: str) -> str:
    if unit == "s":
        return fmt_duration(v) if v >= 1 else ("0" if v == 0 else f"{v:.2g}s")
    return fmt_si(v) if abs(v) >= 1000 else (f"{v:g}" if v == int(v) else f"{v:.2g}")


def line_chart_svg(series: list[Series], start: float, end: float, step: float, unit: str = "",
                   integer: bool = False) -> str:
    W, H, ml, mr, mt, mb = 960, 250, 58, 14, 10, 26
    pw, ph = W - ml - mr, H - mt - mb
    vals = [v for se in series for _, v in se.points if math.isfinite(v)]
    hi, tick = y_scale(max(vals) if vals else 0.0, unit, integer)
    lo = -y_scale(-min(vals), unit, integer)[0] if vals and min(vals) < 0 else 0.0
    span = end - start or 1
    x = lambda t: ml + (t - start) / span * pw  # noqa: E731
    y = lambda v: mt + ph - (v - lo) / ((hi - lo) or 1) * ph  # noqa: E731
    out = [f'<svg viewBox="0 0 {W} {H}" role="img" preserveAspectRatio="xMidYMid meet">']
    for i in range(int(round((hi - lo) / tick)) + 1):
        v = lo + i * tick
        out.append(f'<line class="grid" x1="{ml}" x2="{W - mr}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>'
                   f'<text x="{ml - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{e(_fmt_value(v, unit))}</text>')
    ticks, fmt = _time_ticks(start, end)
    for t in ticks:
        label = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime(fmt)
        out.append(f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{mt}" y2="{mt + ph}"/>'
                   f'<text x="{x(t):.1f}" y="{H - 8}" text-anchor="middle">{e(label)}</text>')
    out.append(f'<line class="axis" x1="{ml}" x2="{W - mr}" y1="{mt + ph}" y2="{mt + ph}"/>')
    for i, se in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="6 3"' if i >= len(PALETTE) else ""
        runs: list[list[tuple[float, float]]] = []
        prev = None
        for t, v in se.points:
            if not math.isfinite(v):
                prev = None
                continue
            if prev is None or t - prev > step * 1.5:
                runs.append([])
            runs[-1].append((t, v))
            prev = t
        d = " ".join("M" + " L".join(f"{x(t):.1f},{y(v):.1f}" for t, v in run) for run in runs if len(run) > 1)
        title = f"<title>{e(label_text(se.labels))}: max {e(fmt_num(se.max))}, last {e(fmt_num(se.last))}</title>"
        if d:
            out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.8" stroke-linejoin="round"{dash}>'
                       f'{title}</path>')
        for run in runs:
            if len(run) == 1:
                out.append(f'<circle cx="{x(run[0][0]):.1f}" cy="{y(run[0][1]):.1f}" r="2.5" fill="{color}">'
                           f'{title}</circle>')
    out.append("</svg>")
    return "".join(out)


def timeline_svg(rows: list[Row], start: float, end: float, names: Callable[[Row], str],
                 color: Callable[[Row, Segment], tuple[str, float]]) -> str:
    W, label_w, mr, row_h, top, bottom = 960, 330, 14, 22, 6, 26
    H = top + row_h * len(rows) + bottom
    pw = W - label_w - mr
    span = end - start or 1
    x = lambda t: label_w + (min(max(t, start), end) - start) / span * pw  # noqa: E731
    out = [f'<svg viewBox="0 0 {W} {H}" role="img" preserveAspectRatio="xMidYMid meet">']
    ticks, fmt = _time_ticks(start, end)
    for t in ticks:
        label = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime(fmt)
        out.append(f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{H - bottom}"/>'
                   f'<text x="{x(t):.1f}" y="{H - 8}" text-anchor="middle">{e(label)}</text>')
    for i, r in enumerate(rows):
        y0 = top + i * row_h
        name = names(r)
        short = name if len(name) <= 52 else name[:51] + "…"
        if i % 2:
            out.append(f'<rect x="0" y="{y0}" width="{W}" height="{row_h}" fill="#f6f8fa"/>')
        out.append(f'<text x="4" y="{y0 + row_h / 2 + 4:.1f}"><title>{e(name)}</title>{e(short)}</text>')
        for sg in r.segments:
            fill, opacity = color(r, sg)
            x0, x1 = x(sg.start), x(sg.end)
            tip = (f"{name}: {sg.state} {fmt_time(sg.start, False)}–{fmt_time(sg.end, False)} UTC"
                   + (" (still open at the end of the range)" if sg.open else ""))
            out.append(f'<rect x="{x0:.1f}" y="{y0 + 4}" width="{max(x1 - x0, 1.5):.1f}" height="{row_h - 8}" rx="2" '
                       f'fill="{fill}" fill-opacity="{opacity}" stroke="{fill}"><title>{e(tip)}</title></rect>')
    out.append(f'<line class="axis" x1="{label_w}" x2="{W - mr}" y1="{H - bottom}" y2="{H - bottom}"/>')
    out.append("</svg>")
    return "".join(out)


def _empty(what: str = "no data in this range") -> str:
    return f'<p class="empty">{e(what)}</p>'


def _error(msg: str) -> str:
    return f'<p class="error">query failed: {e(msg)}</p>'


def chart_html(title: str, chart: Chart, s: Snapshot, name: Callable[[dict[str, str]], str], unit: str = "",
               what: str = "series", integer: bool = False) -> str:
    out = [f"<h3>{e(title)}</h3>"]
    if chart.error:
        return "".join(out) + _error(chart.error)
    if not chart.series:
        return "".join(out) + _empty()
    out.append('<div class="chart">')
    out.append(line_chart_svg(chart.series, s.start, s.end, s.step, unit, integer))
    out.append('<ul class="legend">')
    for i, se in enumerate(chart.series):
        out.append(f'<li><span class="sw" style="background:{PALETTE[i % len(PALETTE)]}"></span>'
                   f'<span class="name">{e(name(se.labels))}</span>'
                   f'<span class="val">max {e(_fmt_value(se.max, unit) if unit == "s" else fmt_num(se.max))} · '
                   f'last {e(_fmt_value(se.last, unit) if unit == "s" else fmt_num(se.last))}</span></li>')
    out.append("</ul>")
    if chart.left_out:
        out.append(f'<p class="note">{chart.left_out} more {e(what)} not shown (the {len(chart.series)} with the '
                   f'highest values in the range are drawn; --top changes how many).</p>')
    out.append("</div>")
    return "".join(out)


def table_html(tid: str, headers: list[tuple[str, str]], rows: list[list[str]], note: str = "") -> str:
    """headers: (text, css class); rows: cells already escaped."""
    out = [f'<table id="{e(tid)}"><thead><tr>']
    out += [f'<th class="{c}">{e(h)}</th>' for h, c in headers]
    out.append("</tr></thead><tbody>")
    for r in rows:
        out.append("<tr>" + "".join(f'<td class="{c}">{cell}</td>' for (_, c), cell in zip(headers, r)) + "</tr>")
    out.append("</tbody></table>")
    if note:
        out.append(f'<p class="note">{e(note)}</p>')
    return "".join(out)


def _left_out_note(t: Table, what: str) -> str:
    return f"{t.left_out} more {what} not shown (--rows changes how many)." if t.left_out else ""


def _card(key: str, value: str, detail: str = "", level: str = "") -> str:
    return (f'<div class="card {level}"><div class="k">{e(key)}</div><div class="v">{e(value)}</div>'
            f'<div class="d">{e(detail)}</div></div>')


def _cards(s: Snapshot) -> str:
    out = ['<section class="cards">']
    lp = s.lag_partitions
    if lp.rows:
        w = lp.rows[0]
        out.append(_card("worst lag now", fmt_num(w["value"]), f"{w['group']} · {w['topic']}/{w['partition']}",
                         "warn" if w["value"] > 0 else "ok"))
    else:
        out.append(_card("worst lag now", "–", "no lag data" if not lp.error else "query failed"))
    n_open = s.alerts_open
    out.append(_card("alerts open", "–" if n_open is None else str(n_open), "kafka_monitor_alert_active",
                     "" if n_open is None else ("warn" if n_open else "ok")))
    if s.prom_alerts_firing is not None and (s.prom_alert_timeline.rows or s.prom_alerts_firing):
        out.append(_card("Prometheus alerts firing", str(s.prom_alerts_firing), "ALERTS{alertstate=\"firing\"}",
                         "bad" if s.prom_alerts_firing else "ok"))
    if s.partitions_total:
        out.append(_card("under-replicated", f"{s.urp_total} of {s.partitions_total}", "partitions, ISR < replicas",
                         "warn" if s.urp_total else "ok"))
        out.append(_card("offline partitions", str(s.offline_total), "no leader", "bad" if s.offline_total else "ok"))
    else:
        out.append(_card("partitions", "–", "no replication data"))
    ups = s.job_up_now or []
    down = sum(1 for v in ups if v < 1)
    out.append(_card("job", "no data" if not ups else ("up" if not down else "DOWN"),
                     f"{len(ups)} instance(s)" if ups else "kafka_monitor_job_up absent",
                     "bad" if (not ups or down) else "ok"))
    age = s.batch_age_now
    out.append(_card("last micro-batch", "–" if age is None else f"{fmt_duration(max(age, 0))} ago",
                     "" if s.batches_in_range is None else f"{fmt_num(round(s.batches_in_range))} batches in range",
                     "" if age is None else ("warn" if age > LAG_AGE_WARN_S else "ok")))
    total_q = sum(r["value"] for r in s.quarantined.rows if math.isfinite(r["value"]))
    out.append(_card("quarantined in range", f"≈{fmt_num(round(total_q))}", "events refused by the quality gate",
                     "warn" if total_q >= 0.5 else "ok"))
    out.append("</section>")
    return "".join(out)


def _alert_color(r: Row, sg: Segment) -> tuple[str, float]:
    c = STATE_COLORS.get(r.labels.get("severity", ""), "#7f7f7f")
    return c, (0.3 if sg.state == "pending" else 0.9)


def _timeline_html(tid: str, title: str, tl: Timeline, s: Snapshot, names: Callable[[Row], str], empty: str,
                   color: Callable[[Row, Segment], tuple[str, float]], legend: str) -> str:
    out = [f"<h3>{e(title)}</h3>"]
    if tl.error:
        return "".join(out) + _error(tl.error)
    if not tl.rows:
        return "".join(out) + _empty(empty)
    out.append('<div class="chart">')
    out.append(timeline_svg(tl.rows, s.start, s.end, names, color))
    out.append(f'<p class="note">{legend}</p>')
    if tl.left_out:
        out.append(f'<p class="note">{tl.left_out} more rows not shown (the {len(tl.rows)} most recently active are '
                   f'drawn; --top changes how many).</p>')
    out.append("</div>")
    # the same as a table: when each opened and closed, selectable text for a ticket
    rows = []
    for r in tl.rows:
        for sg in r.segments:
            rows.append([e(names(r)), e(sg.state), e(fmt_time(sg.start)),
                         "<b>open</b>" if sg.open else e(fmt_time(sg.end)), e(fmt_duration(sg.end - sg.start))])
    out.append(table_html(tid, [("entity", ""), ("state", ""), ("from (UTC)", "mono"), ("to (UTC)", "mono"),
                           ("for", "num")], rows))
    return "".join(out)


def _sev_tag(sev: str) -> str:
    return f'<span class="tag" style="background:{STATE_COLORS.get(sev, "#7f7f7f")}">{e(sev or "?")}</span>'


def lag_name(lb: dict[str, str], multi_cluster: bool) -> str:
    return f"{lb.get('group', '')} · {lb.get('topic', '')}" + (f" ({lb.get('cluster', '')})" if multi_cluster else "")


def render_html(s: Snapshot) -> str:
    clusters = {se.labels.get("cluster", "") for se in s.lag_chart.series + s.urp_chart.series} | {
        r["cluster"] for r in s.lag_partitions.rows + s.replication.rows} | {
        r.labels.get("cluster", "") for r in s.alert_timeline.rows + s.prom_alert_timeline.rows}
    clusters.discard("")
    multi = len(clusters) > 1
    cl_head = [("cluster", "")] if multi else []
    cl = lambda r: [e(r["cluster"])] if multi else []  # noqa: E731
    rng = f"{fmt_time(s.start)} → {fmt_time(s.end)} UTC"
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>kafka-monitor snapshot {e(rng)}</title><style>{CSS}</style></head><body>",
           "<header><h1>kafka-monitor snapshot</h1><dl class=\"meta\">",
           f"<dt>Time range</dt><dd>{e(rng)} ({e(fmt_duration(s.end - s.start))}, step {e(fmt_duration(s.step))})</dd>",
           f"<dt>Prometheus</dt><dd><code>{e(s.url)}</code>{e(f' (version {s.version})' if s.version else '')}</dd>",
           f"<dt>Generated</dt><dd>{e(fmt_time(s.generated))} UTC by kafka-monitor snapshot</dd>"]
    filt = "; ".join(f"{k} = {' or '.join(v)}" for k, v in s.filters.items() if v)
    out.append(f"<dt>Filters</dt><dd>{e(filt) if filt else 'none (everything Prometheus has)'}</dd></dl></header>")
    if s.errors:
        out.append(f'<p class="error">{len(s.errors)} queries failed; their panels say which and why.</p>')
    out.append(_cards(s))

    # lag
    out.append('<section id="lag"><h2>Consumer lag</h2>')
    out.append(chart_html("Lag per group and topic over time (max over partitions, offsets)", s.lag_chart, s,
                          lambda lb: lag_name(lb, multi), what="group/topic series", integer=True))
    out.append('<div class="two"><div>')
    out.append(f"<h3>Worst groups now <span class=\"note\">at {e(fmt_time(s.end, False))}</span></h3>")
    lg = s.lag_groups
    if lg.error:
        out.append(_error(lg.error))
    elif not lg.rows:
        out.append(_empty("no lag data at the end of the range"))
    else:
        out.append(table_html(
            "worst-groups", [("group", ""), ("topic", ""), ("total lag", "num"), ("worst partition", "num"), *cl_head],
            [[e(r["group"]), e(r["topic"]), e(fmt_num(r["value"])),
              e(f"{r['worst_partition']} ({fmt_num(r['worst_lag'])})" if r["worst_partition"] else "–")]
             + cl(r) for r in lg.rows], _left_out_note(lg, "group/topic pairs")))
    out.append("</div><div>")
    out.append(f"<h3>Worst partitions now <span class=\"note\">at {e(fmt_time(s.end, False))}</span></h3>")
    lp = s.lag_partitions
    if lp.error:
        out.append(_error(lp.error))
    elif not lp.rows:
        out.append(_empty("no lag data at the end of the range"))
    else:
        out.append(table_html(
            "worst-partitions", [("group", ""), ("topic", ""), ("partition", "num"), ("lag", "num"), *cl_head],
            [[e(r["group"]), e(r["topic"]), e(r["partition"]), e(fmt_num(r["value"]))] + cl(r) for r in lp.rows],
            _left_out_note(lp, "partitions")))
    out.append("</div></div></section>")

    # replication
    out.append('<section id="replication"><h2>Replication</h2>')
    out.append(chart_html("Under-replicated partitions over time (ISR < replicas)", s.urp_chart, s,
                          lambda lb: f"cluster {lb.get('cluster', '')}", what="clusters", integer=True))
    rp = s.replication
    summary = ("" if s.partitions_total is None else
               f"{s.partitions_total} partitions; {s.urp_total} under-replicated; {s.offline_total} offline.")
    out.append(f"<h3>Partitions needing attention now <span class=\"note\">{e(summary)}</span></h3>")
    if rp.error:
        out.append(_error(rp.error))
    elif not s.partitions_total and not rp.rows:
        out.append(_empty("no replication data at the end of the range"))
    elif not rp.rows:
        out.append('<p class="empty">every partition has its full ISR, a leader and no UnderReplicated alert</p>')
    else:
        out.append(table_html(
            "replication", [("topic", ""), ("partition", "num"), ("ISR", "num"), ("replicas", "num"),
                            ("UnderReplicated alert", ""), ("leader", ""), *cl_head],
            [[e(r["topic"]), e(r["partition"]), e(fmt_num(r["isr"])), e(fmt_num(r["replicas"])),
              "<b>open</b>" if r["alert"] else "–", "<b>none (offline)</b>" if r["offline"] else "ok"]
             + cl(r) for r in rp.rows], _left_out_note(rp, "partitions")))
    out.append("</section>")

    # alerts
    out.append('<section id="alerts"><h2>Alerts</h2>')
    out.append(_timeline_html(
        "alerts-job", "Alerts the job raised (kafka_monitor_alert_active)", s.alert_timeline, s,
        lambda r: f"{r.labels.get('alert', '?')} · {entity_text(r.labels, ENTITY_LABELS, multi)}",
        "no alert was open in this range", _alert_color,
        "Bars: while the alert was open; colour = severity (" + ", ".join(
            f'{_sev_tag(k)}' for k in ("critical", "warning", "info")) + ")."))
    out.append(_timeline_html(
        "alerts-prometheus", "Prometheus alerting rules (ALERTS)", s.prom_alert_timeline, s,
        lambda r: f"{r.labels.get('alertname', '?')} · {entity_text(r.labels, ENTITY_LABELS, multi)}",
        "no data in this range: Prometheus kept no ALERTS series (no alerting rules loaded, or none pending or firing)",
        _alert_color, "Light bars: pending (waiting for the rule's for:); solid: firing; colour = severity."))
    out.append("</section>")

    # the monitor
    out.append('<section id="health"><h2>The monitor itself</h2>')
    if s.health_error:
        out.append(_error(s.health_error))
    else:
        out.append(f'<p>{e(health_text(s))}.</p>')
    out.append(_timeline_html(
        "job-up", "Streaming job up (kafka_monitor_job_up)", s.job_timeline, s,
        lambda r: label_text(r.labels) or "kafka-monitor job", "no data in this range: the job was not scraped",
        lambda r, sg: (STATE_COLORS[sg.state], 0.85),
        f'{_sev_tag("up")} query running; <span class="tag" '
        f'style="background:{STATE_COLORS["down"]}">down</span> query failed; no bar: no series (not scraped).'))
    out.append(chart_html("Seconds since the last micro-batch", s.batch_age_chart, s,
                          lambda lb: label_text(lb) or "kafka-monitor job", unit="s", what="instances"))
    out.append(f'<p class="note">KafkaMonitorJobFallingBehind fires above {LAG_AGE_WARN_S}s.</p>')
    out.append(chart_html("Events quarantined per minute, by reason", s.quarantine_chart, s,
                          lambda lb: lb.get("reason", "") or "(no reason)", what="reasons"))
    out.append('<div class="two"><div><h3>Quarantined in the range</h3>')
    q = s.quarantined
    if q.error:
        out.append(_error(q.error))
    elif not q.rows:
        out.append(_empty())
    else:
        out.append(table_html("quarantined", [("reason", ""), ("events (≈)", "num")],
                              [[e(r["reason"]), e(fmt_num(round(r["value"])))] for r in q.rows]))
    out.append("</div><div><h3>Sources' last heartbeat</h3>")
    hb = s.heartbeats
    if hb.error:
        out.append(_error(hb.error))
    elif not hb.rows:
        out.append(_empty("no heartbeat series at the end of the range"))
    else:
        out.append(table_html("heartbeats", [("source", ""), ("cluster", ""), ("age", "num")],
                              [[e(r["source"]), e(r["cluster"]), e(fmt_duration(max(r["value"], 0)))] for r in hb.rows],
                              _left_out_note(hb, "sources")))
    out.append("</div></div></section>")

    out.append("<details><summary>The PromQL behind this page</summary><pre>")
    out.append(e("\n\n".join(f"# {what}\n{q}" for what, q in s.queries)))
    out.append("</pre></details>")
    out.append(f"<footer>Times are UTC. A chart or table draws at most {s.top} series / {s.rows} rows and says how "
               f"many it left out. Everything on this page is inline: it fetches nothing.</footer>")
    out.append("</body></html>\n")
    return "".join(out)


# -- command line ------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", default=DEFAULT_PROMETHEUS, metavar="URL",
                   help="base URL of the Prometheus server that scrapes the job (default %(default)s)")
    p.add_argument("--since", default="1h", metavar="DURATION",
                   help="length of the range, ending at --end: 15m, 6h, 2d, 1h30m (default 1h)")
    p.add_argument("--end", default="now", metavar="TIME",
                   help="end of the range: now (default), Unix seconds, or ISO 8601 such as 2024-05-01T14:00:00Z "
                        "(no zone = UTC); for an incident that is over")
    p.add_argument("--step", default="auto", metavar="DURATION",
                   help="resolution of the charts; auto (default): a round step giving at most 300 points")
    p.add_argument("--out", default="snapshot.html", metavar="FILE", help="HTML file to write (default %(default)s)")
    for label in FILTER_LABELS:
        p.add_argument(f"--{label}", action="append", metavar="NAME",
                       help=f"only series whose {label} label is NAME (exact; repeatable: any of them)")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="series drawn per chart (default 10; ranked by the highest value in the range)")
    p.add_argument("--rows", type=int, default=20, metavar="N", help="rows per table (default 20)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for each answer of Prometheus (default 30)")


def write_atomically(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as err:
        raise SnapshotError(f"--out: cannot write {path}: {err.strerror or err}") from None


def run(args: argparse.Namespace, stdout=None) -> int:
    stdout = stdout or sys.stdout
    try:
        since = parse_duration(args.since, "--since")
        end = parse_time(args.end, "--end")
        step = auto_step(since) if str(args.step).strip() == "auto" else parse_duration(args.step, "--step")
        if since / step > PROMETHEUS_MAX_POINTS:
            raise SnapshotError(f"--step: {fmt_duration(step)} over --since {fmt_duration(since)} is "
                                f"{since / step:,.0f} points; Prometheus allows {PROMETHEUS_MAX_POINTS:,}: "
                                f"raise --step or pass --step auto")
        for flag in ("top", "rows"):
            if getattr(args, flag) < 1:
                raise SnapshotError(f"--{flag}: must be at least 1, got {getattr(args, flag)}")
        if not args.timeout > 0:
            raise SnapshotError(f"--timeout: must be more than 0, got {args.timeout}")
        filters = {}
        for label in FILTER_LABELS:
            values = getattr(args, label) or []
            if any(v == "" for v in values):
                raise SnapshotError(f"--{label}: an empty name matches nothing; leave the flag out for all")
            filters[label] = values
        out = Path(args.out)
        if out.is_dir():
            raise SnapshotError(f"--out: {out} is a directory; name a file such as {out / 'snapshot.html'}")
        # the range ends on a step, so the last point is the end itself
        n = max(1, math.ceil(since / step - 1e-9))
        prom = Prometheus(args.prometheus, args.timeout)
        snap = collect(prom, end - n * step, end, step, filters, args.top, args.rows)
        write_atomically(out, render_html(snap))
    except SnapshotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stdout.write(render_text(snap, f"{out} ({out.stat().st_size / 1024:,.0f} KiB)"))
    stdout.flush()
    return 1 if snap.errors else 0
