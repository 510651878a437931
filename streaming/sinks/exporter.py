"""The Prometheus exporter: the job's state changes become gauges, alert series and counters.

Every metric is documented in ``docs/metrics.md`` (a test keeps the two in step).  Naming: one
prefix (``kafka_monitor_``), base units, ``_total`` only on counters, a fixed label vocabulary
(``cluster``, ``topic``, ``partition``, ``group``, ``source``, ``alert``, ``severity``,
``action``, ``reason``, ``state``, ``status``).  Series of entities that go away are removed.  The number of entity
series is capped (``max_series``); what the cap refuses is counted, never silently dropped.
The metric catalogue is ``streaming.sinks.catalogue``; ``/metrics`` is served by ``streaming.sinks.http``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Iterable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from monitor.contract import CANARY_LATENCY_BOUNDS_MS
from streaming.rules.notify import NotifyConfig
from streaming.sinks import http
from streaming.sinks.catalogue import (_AGGREGATES, _GROUP_PARTITION_GAUGES, _PARTITION_GAUGES, ALERT, CATALOGUE,
                                       DELAY_BUCKETS, DROP_REASONS, GPART, GRANULARITIES, LAG_STATUS_VALUE, P,
                                       PART, QUARANTINE_REASONS, REMOVED_SEEDS)
from streaming.sinks.http import aggregates

log = logging.getLogger(__name__)

#: canary partitions, and instrumented producers' partitions, served at most (a hostile events
#: topic could name any number)
MAX_CANARY_PARTITIONS = 10_000
#: probes served per HA group (ha_probe_shards): the rule keeps at most 64 members
MAX_HA_PROBES = 64


class PartitionGauges:
    """The partition and group-partition gauges, kept as plain lists (``Exporter._parts``,
    ``Exporter._gparts``): at 100,000 partitions a prometheus-client series object per gauge
    meant 600,000 ``labels()`` calls (~8 s on the driver in the job's first batch) and two method
    calls per update; here an update is an assignment.  ``/metrics`` renders them as text
    directly (``Exporter.render``); this collector serves the registry's other readers."""

    def __init__(self, exporter: "Exporter"):
        self.exporter = exporter

    def describe(self) -> list:
        return [GaugeMetricFamily(P + name, CATALOGUE[P + name][1], labels=CATALOGUE[P + name][2])
                for name in _PARTITION_GAUGES + _GROUP_PARTITION_GAUGES + _AGGREGATES]

    def collect(self) -> list:
        return self.exporter.partition_samples()


class AlertSeries:
    """``alert_active`` and ``alert_opened_timestamp_seconds``: two series per open alert
    (``Exporter._alerts``, labels -> opened at), kept in a dict: a prometheus-client series per
    alert cost a ``labels()`` and a ``remove()`` per transition (~9,000 transitions a batch in
    the job benchmark at 300,000 partitions)."""

    def __init__(self, exporter: "Exporter"):
        self.exporter = exporter

    def describe(self) -> list:
        return []

    def collect(self) -> list:
        name, since = P + "alert_active", P + "alert_opened_timestamp_seconds"
        fam = GaugeMetricFamily(name, CATALOGUE[name][1], labels=list(ALERT))
        opened = GaugeMetricFamily(since, CATALOGUE[since][1], labels=list(ALERT))
        with self.exporter._lock:
            open_ = list(self.exporter._alerts.items())
        for lab, at in open_:
            fam.add_metric(lab, 1)
            if at is not None:
                opened.add_metric(lab, at)
        return [fam, opened]


class ReportMetrics:
    """The canary's series, from each canary partition's latest report (``Exporter._canary``),
    and the instrumented producers' (``Exporter._produce``): their counters and histograms are
    cumulative since the client started, so they are served as they come (a restart is a
    counter reset)."""

    def __init__(self, exporter: "Exporter"):
        self.exporter = exporter

    def describe(self) -> list:
        return []

    def collect(self) -> list:
        with self.exporter._lock:
            reports = sorted(self.exporter._canary.items())
        fams: dict[str, Any] = {}

        def fam(name: str, kind: Any) -> Any:
            if name not in fams:
                full = P + name
                labels = list(CATALOGUE[full][2])
                fams[name] = kind(full[:-len("_total")] if kind is CounterMetricFamily else full,
                                  CATALOGUE[full][1], labels=labels)
            return fams[name]
        with self.exporter._lock:
            produced = sorted(self.exporter._produce.items())
        for (cluster, source, topic, partition), (leader, rep) in produced:
            lab = [cluster, source, topic, str(partition), "" if leader is None else str(leader)]
            for name, key, kind, scale in (
                    ("client_produce_queued_messages", "queued_messages", GaugeMetricFamily, 1),
                    ("client_produce_in_flight_messages", "in_flight_messages", GaugeMetricFamily, 1),
                    ("client_produce_sent_messages_total", "sent_messages", CounterMetricFamily, 1),
                    ("client_produce_leader_rtt_p99_seconds", "leader_rtt_p99_ms", GaugeMetricFamily, 1000),
                    ("client_produce_leader_queue_latency_p99_seconds", "leader_queue_latency_p99_ms",
                     GaugeMetricFamily, 1000),
                    ("client_produce_leader_request_errors_total", "leader_request_errors", CounterMetricFamily, 1),
                    ("client_produce_leader_request_retries_total", "leader_request_retries", CounterMetricFamily, 1)):
                v = rep.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    fam(name, kind).add_metric(lab, v / scale)
            if isinstance(rep.get("delivered_messages"), int):
                fam("client_produce_delivered_messages_total", CounterMetricFamily).add_metric(
                    lab, rep["delivered_messages"])
            for code, n in sorted((rep.get("delivery_errors") or {}).items()):
                fam("client_produce_delivery_errors_total", CounterMetricFamily).add_metric(lab + [code], n)
            _histogram(fam, "client_produce_delivery_latency_seconds", lab, rep.get("delivery_latency_counts"),
                       rep.get("delivery_latency_sum_ms"))
        for (cluster, topic, partition), (leader, rep) in reports:
            lab = [cluster, topic, str(partition), "" if leader is None else str(leader)]
            for name, key in (("canary_messages_sent_total", "sent"), ("canary_messages_acked_total", "acked"),
                              ("canary_messages_received_total", "received"), ("canary_messages_lost_total", "lost"),
                              ("canary_messages_duplicated_total", "duplicated"),
                              ("canary_messages_out_of_order_total", "out_of_order")):
                if isinstance(rep.get(key), int):
                    fam(name, CounterMetricFamily).add_metric(lab, rep[key])
            for code, n in sorted((rep.get("errors") or {}).items()):
                fam("canary_produce_errors_total", CounterMetricFamily).add_metric(lab + [code], n)
            if isinstance(rep.get("pending"), int):
                fam("canary_pending_messages", GaugeMetricFamily).add_metric(lab, rep["pending"])
                fam("canary_oldest_pending_seconds", GaugeMetricFamily).add_metric(
                    lab, (rep.get("oldest_pending_ms") or 0) / 1000.0)
            for name, key in (("canary_produce_latency_seconds", "produce_latency"),
                              ("canary_end_to_end_latency_seconds", "e2e_latency")):
                _histogram(fam, name, lab, rep.get(key + "_counts"), rep.get(key + "_sum_ms"))
        return list(fams.values())


_BOUNDS = [floatToGoString(b / 1000.0) for b in CANARY_LATENCY_BOUNDS_MS] + ["+Inf"]


def _histogram(fam: Callable[[str, Any], Any], name: str, lab: list, counts: Any, total: Any) -> None:
    """A histogram series from a report's bucket counts (CANARY_LATENCY_BOUNDS_MS) and sum (ms)."""
    if not isinstance(counts, list) or len(counts) != len(_BOUNDS) or not isinstance(total, (int, float)):
        return  # another schema's buckets: not served rather than served wrong
    acc, buckets = 0, []
    for b, n in zip(_BOUNDS, counts):
        acc += int(n or 0)
        buckets.append((b, acc))
    fam(name, HistogramMetricFamily).add_metric(lab, buckets, total / 1000.0)


class _Registry:
    """A registry as a collector of another one (the exporter's public registry holds the
    prometheus-client metrics through this, and the partition stores)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def describe(self) -> list:
        return []

    def collect(self) -> Iterable:
        return self.registry.collect()


def _seconds(ms: Any) -> Optional[float]:
    return None if ms is None or ms != ms else ms / 1000.0  # NaN: a missing value from pandas


class Exporter:
    def __init__(self, registry: Optional[CollectorRegistry] = None, max_series: int = 200_000,
                 granularity: str = "partition"):
        if granularity not in GRANULARITIES:
            raise ValueError(f"metrics granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}")
        self.registry = registry or CollectorRegistry()
        #: the prometheus-client metrics (all but the partition stores)
        self._base = CollectorRegistry()
        self.max_series = max_series
        #: partition-level series served (and counted by the cap); at ``topic`` only aggregates
        self.per_partition = granularity == "partition"
        self._m: dict[str, Any] = {}
        for name, (typ, help_, labels) in CATALOGUE.items():
            short = name[len(P):]
            if short in _PARTITION_GAUGES or short in _GROUP_PARTITION_GAUGES or short in _AGGREGATES:
                continue  # served from self._parts / self._gparts (PartitionGauges)
            if short.startswith(("canary_", "client_produce_")):
                continue  # served from self._canary / self._produce (ReportMetrics)
            if short in ("alert_active", "alert_opened_timestamp_seconds"):
                continue  # served from self._alerts (AlertSeries)
            # prometheus_client appends _total to counters itself
            if typ == "counter":
                self._m[name] = Counter(name[: -len("_total")], help_, labels, registry=self._base)
            elif typ == "histogram":
                self._m[name] = Histogram(name, help_, labels, buckets=DELAY_BUCKETS, registry=self._base)
            else:
                self._m[name] = Gauge(name, help_, labels, registry=self._base)
        self._base.register(ReportMetrics(self))
        self._base.register(AlertSeries(self))
        self.registry.register(_Registry(self._base))
        self.m("job_start_timestamp_seconds").set(time.time())
        for reason in QUARANTINE_REASONS:  # at 0 from the start, so increase() sees the first one
            self.m("events_quarantined_total").labels(reason)
        for reason in DROP_REASONS:
            self.m("events_dropped_total").labels(reason)
        for kind, reason in REMOVED_SEEDS:  # at 0 from the start, so increase() sees the first one
            self.m("entities_removed_total").labels(kind, reason)
        #: bucket -> (its entities by kind, its stored bytes), from the buckets' ``state`` rows
        self._state: dict[int, tuple[dict[str, int], int]] = {}
        self._state_kinds: set[str] = set()
        self._series: dict[tuple[str, tuple], Any] = {}  # (metric, labels) -> its series
        #: the open alerts' labels (ALERT order) -> when they opened (s; None: not known)
        self._alerts: dict[tuple, Optional[float]] = {}
        self._group_state: dict[tuple, str] = {}
        self._fetch_state: dict[tuple, str] = {}
        #: (cluster, topic, partition) -> (leader, its latest canary report)
        self._canary: dict[tuple, tuple[Optional[int], dict]] = {}
        #: cluster -> the (cluster, node, role) label tuples its quorum series have now
        self._quorum_nodes: dict[str, set] = {}
        #: (cluster, ha:<group>) -> the probes its ha_probe_shards series name now
        self._ha_probes: dict[tuple, set] = {}
        #: (cluster, broker) -> the (cluster, broker, log_dir) label tuples its log dir series have now
        self._log_dirs: dict[tuple, set] = {}
        #: (cluster, source, topic, partition) -> (leader, its latest client_produce report)
        self._produce: dict[tuple, tuple[Optional[int], dict]] = {}
        #: partition labels -> its gauge values in _PARTITION_GAUGES order (None: no series)
        self._parts: dict[tuple, list] = {}
        #: the partitions with ELR series (partition_eligible_leader_replicas): few, those with an ELR known
        self._elr_parts: set[tuple] = set()
        #: group partition labels -> its gauge values in _GROUP_PARTITION_GAUGES order
        self._gparts: dict[tuple, list] = {}
        self._part_series = 0
        self._refused = 0
        #: labels -> their text in the exposition, kept while the entity has series
        self._label_text: dict[tuple, str] = {}
        self._lock = threading.Lock()
        self.registry.register(PartitionGauges(self))
        #: bumped by every change; /metrics renders once per change (_render)
        self._generation = 0
        self._rendered: dict[bool, tuple[int, bytes, Optional[bytes]]] = {}
        self._render_lock = threading.Lock()
        self._last_batch_id: Optional[int] = None
        self._server: Any = None
        # the defaults until the job's settings replace them: a rule never waits on a missing hold
        self.set_notify_holds(NotifyConfig().holds_s())

    def m(self, name: str) -> Any:
        return self._m[P + name]

    # -- series bookkeeping ------------------------------------------------------------------

    def _full(self) -> bool:
        """The series cap is reached (prometheus-client series and the partitions' values)."""
        return (len(self._series) + 2 * len(self._alerts) + (self._part_series if self.per_partition else 0)
                >= self.max_series)

    def _series_for(self, name: str, labels: tuple) -> Any:
        """The series' own object (created on first use; updating it needs no label lookup), or
        None when the series cap refuses it (counted)."""
        child = self._series.get((name, labels))
        if child is None:
            if self._full():
                self.m("exporter_series_refused_total").inc()
                return None
            child = self._series[(name, labels)] = self.m(name).labels(*labels)
        return child

    def _set(self, name: str, labels: tuple, value: Optional[float]) -> None:
        if value is None:
            return
        child = self._series_for(name, labels)
        if child is not None:
            child.set(value)

    def _remove(self, name: str, labels: tuple) -> None:
        if (name, labels) in self._series:
            del self._series[(name, labels)]
            self.m(name).remove(*labels)

    def _apply_group_partition(self, labels: tuple, values: tuple, action: str) -> None:
        """A group partition's gauges from one row: a None value removes its series (unlike a
        partition's); a series the cap refuses is tried again on the next row with a value."""
        if action == "remove":
            old = self._gparts.pop(labels, None)
            if old is not None:
                self._part_series -= sum(v is not None for v in old)
                self._label_text.pop(labels, None)
            return
        cur = self._gparts.get(labels)
        if cur is None:
            cur = self._gparts[labels] = [None] * len(_GROUP_PARTITION_GAUGES)
        for i, v in enumerate(values):
            old = cur[i]
            if v is None:
                if old is not None:
                    self._part_series -= 1
                    cur[i] = None
                continue
            if old is None:
                if self.per_partition and self._full():
                    self._refused += 1
                    continue
                self._part_series += 1
            cur[i] = v

    def _apply_partition(self, labels: tuple, values: tuple, action: str) -> None:
        """A partition's gauges from one row: a None value leaves its series as it is; a series
        the cap refuses is tried again on the partition's next row with a value for it."""
        if action == "remove":
            old = self._parts.pop(labels, None)
            if old is not None:
                self._part_series -= sum(v is not None for v in old)
                self._label_text.pop(labels, None)
            return
        cur = self._parts.get(labels)
        if cur is None:
            cur = self._parts[labels] = [None] * len(_PARTITION_GAUGES)
        for i, v in enumerate(values):
            if v is None or cur[i] == v:
                continue
            if cur[i] is None:
                if self.per_partition and self._full():
                    self._refused += 1
                    continue
                self._part_series += 1
            cur[i] = v

    def _apply_elr(self, lab: tuple, report: Optional[str]) -> None:
        """A partition's eligible leader replicas (its row's report): served while known, else removed."""
        elr = json.loads(report) if report else None
        if elr is None:
            self._elr_parts.discard(lab)
        else:
            self._elr_parts.add(lab)
        for name, key in (("partition_eligible_leader_replicas", "eligible_leader_replicas"),
                          ("partition_last_known_elr", "last_known_elr")):
            if elr is None:
                self._remove(name, lab)
            else:
                self._set(name, lab, len(elr.get(key) or ()))

    def _apply_client_fetch(self, r: dict, action: str) -> None:
        """An instrumented consumer's view of a partition: its gauges, and its fetch state as a
        state set (the previous state's series removed)."""
        lab = (r["cluster"], r["consumer_group"], r["topic"], str(r["partition"]))
        for name, v in (("client_fetch_position", r.get("position")),
                        ("client_fetch_committed_offset", r.get("committed_offset")),
                        ("client_fetch_high_watermark", r.get("high_watermark")),
                        ("client_fetch_lag", r.get("lag"))):
            if action == "remove" or v is None:
                self._remove(name, lab)
            else:
                self._set(name, lab, v)
        self._set_state("client_fetch_state", self._fetch_state, lab,
                        None if action == "remove" else r.get("fetch_state"))

    _QUORUM = ("quorum_up", "quorum_leader", "quorum_leader_epoch", "quorum_high_watermark")
    _QNODE = ("quorum_replica_lag", "quorum_replica_caught_up_age_seconds")

    def _apply_quorum(self, r: dict, action: str) -> None:
        """A cluster's quorum: its last answer with a leader (rules.quorum keeps it) and whether
        the last request was answered; the nodes the answer no longer lists lose their series."""
        cl = r["cluster"]
        old = self._quorum_nodes.pop(cl, set())
        try:
            rep = json.loads(r.get("report") or "{}") if action != "remove" else {}
        except ValueError:
            rep = {}
        now: set = set()
        if action != "remove":
            self._set("quorum_up", (cl,), 1 if rep.get("up") else 0)
            for name, key in (("quorum_leader", "leader_id"), ("quorum_leader_epoch", "leader_epoch"),
                              ("quorum_high_watermark", "high_watermark")):
                v = rep.get(key)
                self._set(name, (cl,), v) if isinstance(v, int) else self._remove(name, (cl,))
            for role, key in (("voter", "voters"), ("observer", "observers")):
                for n in rep.get(key) or []:
                    lab = (cl, str(n.get("replica_id")), role)
                    now.add(lab)
                    lag, ago = n.get("lag"), n.get("last_caught_up_ms_ago")
                    self._set("quorum_replica_lag", lab, lag) if isinstance(lag, int) else self._remove("quorum_replica_lag", lab)
                    self._set("quorum_replica_caught_up_age_seconds", lab, ago / 1000.0) if isinstance(ago, int) \
                        else self._remove("quorum_replica_caught_up_age_seconds", lab)
        else:
            for name in self._QUORUM:
                self._remove(name, (cl,))
        for lab in old - now:
            for name in self._QNODE:
                self._remove(name, lab)
        if now:
            self._quorum_nodes[cl] = now

    _LOG_DIR = ("log_dir_online", "log_dir_total_bytes", "log_dir_usable_bytes", "log_dir_replicas",
                "log_dir_seconds_to_full")

    def _apply_log_dirs(self, r: dict, action: str) -> None:
        """A broker's log dirs as its last answer shows them (rules.logdirs adds the time to full);
        the dirs it no longer lists lose their series."""
        key = (r["cluster"], str(r["broker"]))
        old = self._log_dirs.pop(key, set())
        try:
            dirs = json.loads(r.get("report") or "{}").get("dirs") or [] if action != "remove" else []
        except (ValueError, AttributeError):
            dirs = []
        now: set = set()
        for d in dirs:
            lab = key + (str(d.get("log_dir")),)
            now.add(lab)
            for name, v in (("log_dir_online", 1 if d.get("online") else 0),
                            ("log_dir_total_bytes", d.get("total_bytes")),
                            ("log_dir_usable_bytes", d.get("usable_bytes")),
                            ("log_dir_replicas", d.get("held_replicas")),
                            ("log_dir_seconds_to_full", d.get("seconds_to_full"))):
                self._set(name, lab, v) if isinstance(v, (int, float)) and not isinstance(v, bool) \
                    else self._remove(name, lab)
        for lab in old - now:
            for name in self._LOG_DIR:
                self._remove(name, lab)
        if now:
            self._log_dirs[key] = now

    def _apply_ha(self, r: dict, action: str) -> None:
        """An HA group's coverage as the job last judged it (rules.ha); the probes it no longer
        counts alive lose their series."""
        lab = (r["cluster"], r["source"])
        old = self._ha_probes.pop(lab, set())
        try:
            rep = json.loads(r.get("report") or "{}") if action != "remove" else {}
        except ValueError:
            rep = {}
        rep = rep if isinstance(rep, dict) else {}
        handover = rep.get("last_handover_at")
        for name, v in (("ha_probes", rep.get("probes")), ("ha_shards", rep.get("shards")),
                        ("ha_shards_unobserved", rep.get("unobserved")),
                        ("ha_last_handover_timestamp_seconds", handover / 1000.0 if isinstance(handover, int) else None)):
            self._set(name, lab, v) if isinstance(v, (int, float)) and not isinstance(v, bool) else self._remove(name, lab)
        now: set[str] = set()
        held = rep.get("held")
        for probe, n in (held.items() if isinstance(held, dict) else ()):
            if isinstance(n, int) and len(now) < MAX_HA_PROBES:
                now.add(str(probe))
                self._set("ha_probe_shards", lab + (str(probe),), n)
        for probe in old - now:
            self._remove("ha_probe_shards", lab + (probe,))
        if now:
            self._ha_probes[lab] = now

    def _apply_transactions(self, r: dict, action: str) -> None:
        """A cluster's open transactions as its last answer shows them (rules.transactions)."""
        lab = (r["cluster"],)
        try:
            rep = json.loads(r.get("report") or "{}") if action != "remove" else {}
        except ValueError:
            rep = {}
        rep = rep if isinstance(rep, dict) else {}
        age = rep.get("oldest_age_ms")
        for name, v in (("transactions_open", rep.get("open")), ("transactions_hanging", rep.get("hanging")),
                        ("transaction_oldest_age_seconds", age / 1000.0 if isinstance(age, int) else None),
                        ("transaction_held_partitions", rep.get("held_partitions"))):
            self._set(name, lab, v) if isinstance(v, (int, float)) and not isinstance(v, bool) \
                else self._remove(name, lab)

    def _apply_report(self, r: dict, action: str) -> None:
        """A canary's or an instrumented producer's latest report of a partition (served by
        ReportMetrics); at most MAX_CANARY_PARTITIONS entities of each kind."""
        lab: tuple
        if r["kind"] == "canary":
            store, lab = self._canary, (r["cluster"], r["topic"], int(r["partition"]))
        else:
            store, lab = self._produce, (r["cluster"], r["source"] or "", r["topic"], int(r["partition"]))
        if action == "remove":
            store.pop(lab, None)
            return
        try:
            rep = json.loads(r.get("report") or "")
        except ValueError:
            return
        if not isinstance(rep, dict):
            return
        if lab not in store and len(store) >= MAX_CANARY_PARTITIONS:
            self._refused += 1
            return
        store[lab] = (r.get("leader"), rep)

    def _set_state(self, name: str, current: dict[tuple, str], lab: tuple, state: Optional[str]) -> None:
        """A state set: 1 on ``state``'s series (labels ``lab`` + the state), the previous
        state's series (``current``) removed; no state (None, empty): no series."""
        old = current.pop(lab, None)
        if old is not None and old != state:
            self._remove(name, lab + (old,))
        if state:
            self._set(name, lab + (state,), 1)
            current[lab] = state

    def _apply_partition_block(self, cols: dict[str, list]) -> None:
        """Partition upserts given as columns (``streaming.sinks.batch.sink_rows``): the same as a ``partition``
        row each, with the common case — only the HW moved since the partition's last row —
        written in place (~100,000 rows a batch at 100,000 partitions)."""
        parts = self._parts
        no_series = [None] * len(_PARTITION_GAUGES)
        with_elr = self._elr_parts
        reports = cols.get("report") or [None] * len(cols["cluster"])
        for c, tp, p, hw, ls, lso, leader, rep, isr, report in zip(
                cols["cluster"], cols["topic"], cols["partition"], cols["high_watermark"], cols["log_start_offset"],
                cols["last_stable_offset"], cols["leader"], cols["replicas"], cols["isr"], reports):
            lab = (c, tp, str(p))
            if report is not None or lab in with_elr:  # few: the partitions with an ELR known
                self._apply_elr(lab, report)
            cur = parts.get(lab)
            if (cur is None or cur == no_series) and self.per_partition and self._full():  # all refused
                if cur is None:
                    parts[lab] = [None] * len(_PARTITION_GAUGES)  # known to the aggregates, with no series
                self._refused += sum(v is not None for v in (hw, ls, lso, leader, rep, isr))
                continue
            if (cur is not None and hw is not None and cur[0] is not None and cur[1] == ls and cur[2] == lso
                    and cur[3] == leader and cur[4] == rep and cur[5] == isr):
                cur[0] = hw
                continue
            self._apply_partition(lab, (hw, ls, lso, leader, rep, isr), "upsert")

    def partition_samples(self) -> list[GaugeMetricFamily]:
        """The partition and group-partition gauges (at partition granularity) and their
        per-topic aggregates as metric families (for the registry's readers other than
        /metrics)."""
        out = []
        stores = self._stores()
        for store, names, labels in stores if self.per_partition else ():
            families = [GaugeMetricFamily(P + name, CATALOGUE[P + name][1], labels=labels) for name in names]
            for lab, vals in store:
                for fam, v in zip(families, vals):
                    if v is not None:
                        fam.add_metric(lab, v)
            out += families
        for name, series in aggregates(stores):
            fam = GaugeMetricFamily(P + name, CATALOGUE[P + name][1], labels=CATALOGUE[P + name][2])
            for lab, v in series:
                fam.add_metric(lab, v)
            out.append(fam)
        return out

    def _stores(self) -> list[tuple[list, tuple, tuple]]:
        """A copy of both stores' values, taken under the lock (the sink waits only for that)."""
        with self._lock:
            return [([(lab, tuple(v)) for lab, v in self._parts.items()], _PARTITION_GAUGES, PART),
                    ([(lab, tuple(v)) for lab, v in self._gparts.items()], _GROUP_PARTITION_GAUGES, GPART)]

    def sample(self, name: str, labels: Optional[dict[str, str]] = None) -> Optional[float]:
        """One sample of the exporter's own metrics, not of the partition and group-partition
        stores (None: no such series).  ``registry.get_sample_value`` collects every series to
        find one: ~4 CPU-s at 300,000 partitions."""
        return self._base.get_sample_value(name, labels)

    # -- /metrics ---------------------------------------------------------------------------------

    def render(self, openmetrics: bool = False, gzipped: bool = False) -> bytes:
        """The exposition, rendered once per change of the exporter's state (``streaming.sinks.http.render``)."""
        return http.render(self, openmetrics, gzipped)

    def _app(self, environ: dict, start_response: Any) -> list[bytes]:
        return http.app(self, environ, start_response)

    # -- applying the job's output -------------------------------------------------------------

    def apply(self, rows: Iterable[dict], batch_id: Optional[int] = None) -> int:
        """Apply the state-output rows of one micro-batch.  A batch id seen just before is
        skipped (Spark re-runs the last batch after a restart; counters must not count twice)."""
        with self._lock:
            if batch_id is not None and batch_id == self._last_batch_id:
                return 0
            self._generation += 1
            self._refused = 0  # series the cap refused in this batch: counted once at its end
            n = 0
            moved: dict[tuple[str, str], int] = {}  # alert transitions by (alert, action)
            states = False
            lab: tuple[Any, ...]
            vals: tuple[Any, ...]
            for r in rows:
                n += 1
                kind, action = r["kind"], r["action"]
                if kind == "partition_block":
                    n += r["rows"] - 1
                    self._apply_partition_block(r["columns"])
                elif kind == "partition":
                    lab = (r["cluster"], r["topic"], str(r["partition"]))
                    vals = (r["high_watermark"], r["log_start_offset"], r["last_stable_offset"], r["leader"],
                            r["replicas"], r["isr"])
                    self._apply_partition(lab, vals, action)
                    self._apply_elr(lab, r.get("report") if action != "remove" else None)
                elif kind == "group_partition":
                    lab = (r["cluster"], r["consumer_group"], r["topic"], str(r["partition"]))
                    status = r.get("lag_status")
                    vals = (r["committed_offset"], r["lag"], r.get("lag_seconds"),
                            LAG_STATUS_VALUE.get(status) if status else None, r.get("read_committed_lag"))
                    self._apply_group_partition(lab, vals, action)
                elif kind == "source":
                    lab = (r["cluster"], r["source"])
                    if action != "remove" and r["at"] is not None:
                        self.m("source_heartbeat_delay_seconds").observe(max(0.0, time.time() - r["at"] / 1000.0))
                    for name, v in (("source_last_heartbeat_timestamp_seconds", r["at"] / 1000.0),
                                    ("source_heartbeat_interval_seconds", _seconds(r.get("interval_ms"))),
                                    ("source_cycle_duration_seconds", _seconds(r.get("cycle_duration_ms"))),
                                    ("source_observation_lag_seconds", _seconds(r.get("observation_lag_ms"))),
                                    ("source_events_dropped", r.get("count"))):
                        self._remove(name, lab) if action == "remove" else self._set(name, lab, v)
                elif kind == "group":
                    lab = (r["cluster"], r["consumer_group"])
                    if action == "remove" or r.get("members") is None:
                        self._remove("group_members", lab)
                    else:
                        self._set("group_members", lab, r["members"])
                    self._set_state("group_state", self._group_state, lab,
                                    None if action == "remove" else r.get("group_state"))
                elif kind == "client_fetch":
                    self._apply_client_fetch(r, action)
                elif kind == "canary" or kind == "client_produce":
                    self._apply_report(r, action)
                elif kind == "broker":
                    lab = (r["cluster"], str(r["broker"]))
                    registered = r.get("registered")
                    for name, v in (("broker_registered", None if registered is None else int(bool(registered))),
                                    ("broker_leader_partitions", r.get("leader_partitions")),
                                    ("broker_replicas", r.get("replicas")),
                                    ("broker_out_of_sync_replicas", r.get("out_of_sync_replicas"))):
                        self._remove(name, lab) if action == "remove" or v is None else self._set(name, lab, v)
                elif kind == "quorum":
                    self._apply_quorum(r, action)
                elif kind == "log_dirs":
                    self._apply_log_dirs(r, action)
                elif kind == "transactions":
                    self._apply_transactions(r, action)
                elif kind == "ha":
                    self._apply_ha(r, action)
                elif kind == "client":
                    lab = (r["cluster"], r["source"])
                    v = None if r.get("last_ok_at") is None else r["last_ok_at"] / 1000.0
                    if action == "remove" or v is None:
                        self._remove("client_last_metadata_refresh_timestamp_seconds", lab)
                    else:
                        self._set("client_last_metadata_refresh_timestamp_seconds", lab, v)
                elif kind == "alert" or kind == "open_alert":
                    lab = (r["alert"], r["severity"], r["cluster"] or "", r["topic"] or "",
                           "" if r["partition"] is None else str(r["partition"]), r["consumer_group"] or "",
                           r.get("source") or "", "" if r.get("broker") is None else str(r["broker"]))
                    if kind == "open_alert" or action == "open":  # open_alert: restated for a new run
                        if lab not in self._alerts:
                            if self._full():
                                self._refused += 1
                            else:
                                # every transition and restated row carries its time; a hand-made row may not
                                self._alerts[lab] = None if r.get("at") is None else r["at"] / 1000.0
                        if kind == "open_alert":  # not a transition
                            continue
                    else:
                        self._alerts.pop(lab, None)
                    moved[(r["alert"], action)] = moved.get((r["alert"], action), 0) + 1
                elif kind == "quarantine":
                    self.m("events_quarantined_total").labels(r["alert"]).inc(r["count"] or 0)
                elif kind == "dropped":
                    self.m("events_dropped_total").labels(r["alert"]).inc(r["count"] or 0)
                elif kind == "removed":
                    self.m("entities_removed_total").labels(r["alert"], r["evidence"]).inc(r["count"] or 0)
                elif kind == "state":
                    rep = json.loads(r["report"])
                    self._state[int(rep["bucket"])] = (rep["entities"], int(r["count"] or 0))
                    states = True
            if states:
                self._state_gauges()
            for (alert, action), k in moved.items():  # one labels() per alert and action, not per row
                self.m("alert_transitions_total").labels(alert, action).inc(k)
            if self._refused:
                self.m("exporter_series_refused_total").inc(self._refused)
            self._last_batch_id = batch_id
            return n

    def _state_gauges(self) -> None:
        """``job_state_entities`` and ``job_state_bytes``: the sums of the buckets' last reports
        (a kind no bucket holds any more shows 0)."""
        total: dict[str, int] = {}
        for kinds, _ in self._state.values():
            for k, n in kinds.items():
                total[k] = total.get(k, 0) + n
        self._state_kinds |= set(total)
        for k in self._state_kinds:
            self.m("job_state_entities").labels(k).set(total.get(k, 0))
        self.m("job_state_bytes").set(sum(b for _, b in self._state.values()))

    def batch_done(self, rows: int, duration_s: float, finished_at: float) -> None:
        self._generation += 1
        self.m("job_batches_total").inc()
        self.m("job_sink_rows_total").inc(rows)
        self.m("job_last_sink_duration_seconds").set(duration_s)
        self.m("job_last_batch_timestamp_seconds").set(finished_at)

    def progress(self, events_behind: int, state_keys: int, duration_s: float, unreadable: int = 0,
                 unreadable_s: float = 0.0) -> None:
        """From Spark's progress report of the last micro-batch."""
        self._generation += 1
        self.m("job_events_behind").set(events_behind)
        self.m("job_source_unreadable_partitions").set(unreadable)
        self.m("job_source_unreadable_seconds").set(unreadable_s)
        self.m("job_state_keys").set(state_keys)
        self.m("job_last_trigger_duration_seconds").set(duration_s)

    def set_quarantine(self, bytes_kept: int, files_removed: int = 0) -> None:
        """The quarantine directory (``streaming.sinks.quarantine.QuarantineFiles``): bytes of its files kept
        now, and files its bound deleted since the last call."""
        self._generation += 1
        self.m("quarantine_bytes").set(bytes_kept)
        if files_removed > 0:
            self.m("quarantine_files_removed_total").inc(files_removed)

    def set_archive(self, rows: int, files: int, bytes_written: int, duration_s: float, partitions_removed: int = 0) -> None:
        """A batch's write to the event archive (``streaming.sinks.archive.ArchiveFiles``), and the
        hour directories its retention deleted since the last call."""
        self._generation += 1
        self.m("archive_rows_written_total").inc(rows)
        self.m("archive_files_written_total").inc(files)
        self.m("archive_bytes_written_total").inc(bytes_written)
        self.m("archive_last_write_duration_seconds").set(duration_s)
        if partitions_removed > 0:
            self.m("archive_partitions_removed_total").inc(partitions_removed)

    def set_up(self, up: bool) -> None:
        self._generation += 1
        self.m("job_up").set(1 if up else 0)

    def set_notify_holds(self, holds_s: dict[str, float]) -> None:
        """``alert_notify_after_seconds``: alert name -> seconds it is open before it notifies
        (``streaming.rules.notify.NotifyConfig.holds_s``)."""
        self._generation += 1
        for alert, seconds in holds_s.items():
            self.m("alert_notify_after_seconds").labels(alert).set(seconds)

    def serve(self, port: int, host: str = "127.0.0.1", certfile: Optional[str] = None, keyfile: Optional[str] = None,
              client_cafile: Optional[str] = None) -> int:
        """Serve /metrics (on loopback unless ``host`` says otherwise, over HTTPS with ``certfile``
        and ``keyfile``); returns the bound port (pass 0 for a free one).  ``streaming.sinks.http.serve``."""
        return http.serve(self, port, host, certfile, keyfile, client_cafile)

    def shutdown(self) -> None:
        http.shutdown(self)
