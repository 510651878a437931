"""``kafka-monitor snapshot``: its flags, and writing the page."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

from kafka_monitor.snapshot.collect import collect
from kafka_monitor.snapshot.common import (DEFAULT_PROMETHEUS, FILTER_LABELS, PROMETHEUS_MAX_POINTS,
                                           SnapshotError, auto_step, fmt_duration, parse_duration, parse_time)
from kafka_monitor.snapshot.html import render_html
from kafka_monitor.snapshot.prometheus import Prometheus
from kafka_monitor.snapshot.text import render_text


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


def replace_file(path: Path, text: str) -> None:
    """Write ``path`` whole through a hidden temporary file and a rename (raises OSError); the
    snapshot's and the replay's outputs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_atomically(path: Path, text: str) -> None:
    try:
        replace_file(path, text)
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
