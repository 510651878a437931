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
``--rows`` rows; the page says how many were left out.  The page comes from one Jinja2
template (``templates/snapshot.html.j2``), autoescaped; Jinja2 is imported only to render it.

Modules: ``common``, ``prometheus``, ``model``, ``collect``, ``text``, ``html``, ``command``.
"""

from __future__ import annotations

from kafka_monitor.snapshot.collect import build_rows, collect
from kafka_monitor.snapshot.command import DESCRIPTION, add_arguments, run, write_atomically
from kafka_monitor.snapshot.common import (AUTO_POINTS, SnapshotError, auto_step, fmt_duration,
                                           parse_duration, parse_time)
from kafka_monitor.snapshot.html import render_html
from kafka_monitor.snapshot.model import Chart, Panel, Row, Segment, Snapshot, Table, Timeline
from kafka_monitor.snapshot.prometheus import (Prometheus, QueryError, Series, filter_matchers,
                                               promql_string, re2_escape)
from kafka_monitor.snapshot.text import health_text, render_text

__all__ = ["AUTO_POINTS", "Chart", "DESCRIPTION", "Panel", "Prometheus", "QueryError", "Row", "Segment", "Series",
           "Snapshot", "SnapshotError", "Table", "Timeline", "add_arguments", "auto_step", "build_rows",
           "collect", "filter_matchers", "fmt_duration", "health_text", "parse_duration", "parse_time",
           "promql_string", "re2_escape", "render_html", "render_text", "run", "write_atomically"]
