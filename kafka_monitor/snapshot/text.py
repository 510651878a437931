"""The snapshot's gist for a terminal."""

from __future__ import annotations

import math
from typing import Optional

from kafka_monitor.snapshot.common import ENTITY_LABELS, entity_text, fmt_duration, fmt_num, fmt_time
from kafka_monitor.snapshot.model import Snapshot


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
