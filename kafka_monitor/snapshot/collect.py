"""Every query of a snapshot, run against Prometheus, into a ``Snapshot``."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

from kafka_monitor.snapshot.common import ALERT_ENTITY, STATE_ORDER, SnapshotError, fmt_duration, label_text
from kafka_monitor.snapshot.model import Chart, Row, Segment, Snapshot, Table, Timeline
from kafka_monitor.snapshot.prometheus import Prometheus, QueryError, Series, filter_matchers, promql_string


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
        alert = f"max by (alert, severity, {', '.join(ALERT_ENTITY)}) ({sel('kafka_monitor_alert_active')})"
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
