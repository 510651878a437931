"""The snapshot as one self-contained HTML page: inline CSS and SVG, every value escaped."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Callable

from kafka_monitor.snapshot.common import (ENTITY_LABELS, LAG_AGE_WARN_S, entity_text, fmt_duration, fmt_num,
                                           fmt_si, fmt_time, label_text)
from kafka_monitor.snapshot.model import Chart, Row, Segment, Snapshot, Table, Timeline
from kafka_monitor.snapshot.prometheus import Series
from kafka_monitor.snapshot.text import health_text


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
    """Escaped for HTML text and attribute values (the inline SVG): as the template escapes."""
    from markupsafe import escape

    return str(escape(str(s)))


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


def _legend_value(v: float, unit: str) -> str:
    return _fmt_value(v, unit) if unit == "s" else fmt_num(v)


def _chart(title: str, chart: Chart, s: Snapshot, name: Callable[[dict[str, str]], str], unit: str = "",
           what: str = "series", integer: bool = False) -> dict[str, Any]:
    """A chart panel for the template: its title, error, SVG and legend."""
    from markupsafe import Markup

    out: dict[str, Any] = {"title": title, "error": chart.error, "svg": None, "legend": [],
                           "left_out": chart.left_out, "shown": len(chart.rows), "what": what}
    if chart.error or not chart.rows:
        return out
    out["svg"] = Markup(line_chart_svg(chart.rows, s.start, s.end, s.step, unit, integer))
    out["legend"] = [(PALETTE[i % len(PALETTE)], name(se.labels), _legend_value(se.max, unit),
                      _legend_value(se.last, unit)) for i, se in enumerate(chart.rows)]
    return out


def _left_out_note(t: Table, what: str) -> str:
    return f"{t.left_out} more {what} not shown (--rows changes how many)." if t.left_out else ""


def _table(tid: str, t: Table, headers: list[tuple[str, str]], rows: list[list[Any]], note: str = "") -> dict[str, Any]:
    return {"tid": tid, "error": t.error, "headers": headers, "rows": rows, "note": note}


def _cards(s: Snapshot) -> list[dict[str, str]]:
    cards = []

    def card(key: str, value: str, detail: str = "", level: str = "") -> None:
        cards.append({"key": key, "value": value, "detail": detail, "level": level})

    lp = s.lag_partitions
    if lp.rows:
        w = lp.rows[0]
        card("worst lag now", fmt_num(w["value"]), f"{w['group']} · {w['topic']}/{w['partition']}",
             "warn" if w["value"] > 0 else "ok")
    else:
        card("worst lag now", "–", "no lag data" if not lp.error else "query failed")
    n_open = s.alerts_open
    card("alerts open", "–" if n_open is None else str(n_open), "kafka_monitor_alert_active",
         "" if n_open is None else ("warn" if n_open else "ok"))
    if s.prom_alerts_firing is not None and (s.prom_alert_timeline.rows or s.prom_alerts_firing):
        card("Prometheus alerts firing", str(s.prom_alerts_firing), "ALERTS{alertstate=\"firing\"}",
             "bad" if s.prom_alerts_firing else "ok")
    if s.partitions_total:
        card("under-replicated", f"{s.urp_total} of {s.partitions_total}", "partitions, ISR < replicas",
             "warn" if s.urp_total else "ok")
        card("offline partitions", str(s.offline_total), "no leader", "bad" if s.offline_total else "ok")
    else:
        card("partitions", "–", "no replication data")
    ups = s.job_up_now or []
    down = sum(1 for v in ups if v < 1)
    card("job", "no data" if not ups else ("up" if not down else "DOWN"),
         f"{len(ups)} instance(s)" if ups else "kafka_monitor_job_up absent", "bad" if (not ups or down) else "ok")
    age = s.batch_age_now
    card("last micro-batch", "–" if age is None else f"{fmt_duration(max(age, 0))} ago",
         "" if s.batches_in_range is None else f"{fmt_num(round(s.batches_in_range))} batches in range",
         "" if age is None else ("warn" if age > LAG_AGE_WARN_S else "ok"))
    total_q = sum(r["value"] for r in s.quarantined.rows if math.isfinite(r["value"]))
    card("quarantined in range", f"≈{fmt_num(round(total_q))}", "events refused by the quality gate",
         "warn" if total_q >= 0.5 else "ok")
    return cards


def _alert_color(r: Row, sg: Segment) -> tuple[str, float]:
    c = STATE_COLORS.get(r.labels.get("severity", ""), "#7f7f7f")
    return c, (0.3 if sg.state == "pending" else 0.9)


def _timeline(tid: str, title: str, tl: Timeline, s: Snapshot, names: Callable[[Row], str], empty: str,
              color: Callable[[Row, Segment], tuple[str, float]], legend: Any) -> dict[str, Any]:
    """A timeline panel for the template: the bars as SVG and the same as a table (when each
    opened and closed, as text to paste into a ticket)."""
    from markupsafe import Markup

    out: dict[str, Any] = {"tid": tid, "title": title, "error": tl.error, "svg": None, "empty": empty,
                           "legend": legend, "left_out": tl.left_out, "shown": len(tl.rows), "rows": []}
    if tl.error or not tl.rows:
        return out
    out["svg"] = Markup(timeline_svg(tl.rows, s.start, s.end, names, color))
    out["rows"] = [[names(r), sg.state, fmt_time(sg.start), Markup("<b>open</b>") if sg.open else fmt_time(sg.end),
                    fmt_duration(sg.end - sg.start)] for r in tl.rows for sg in r.segments]
    return out


def _sev_tag(sev: str) -> str:
    return f'<span class="tag" style="background:{STATE_COLORS.get(sev, "#7f7f7f")}">{e(sev or "?")}</span>'


def lag_name(lb: dict[str, str], multi_cluster: bool) -> str:
    return f"{lb.get('group', '')} · {lb.get('topic', '')}" + (f" ({lb.get('cluster', '')})" if multi_cluster else "")


def template(name: str = "snapshot.html.j2") -> Any:
    """A page's template (``templates/``; autoescaped, undefined names fail): the snapshot's, and
    others built the same way (``kafka-monitor replay``'s)."""
    global _ENV
    if _ENV is None:
        import jinja2

        _ENV = jinja2.Environment(loader=jinja2.PackageLoader("kafka_monitor.snapshot", "templates"),
                                  autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
        _ENV.globals["zip"] = zip
    return _ENV.get_template(name)


def _template() -> Any:
    return template("snapshot.html.j2")


_ENV: Any = None


def render_html(s: Snapshot) -> str:
    """The page (templates/snapshot.html.j2, autoescaped): every label value is text."""
    from markupsafe import Markup

    clusters = {se.labels.get("cluster", "") for se in s.lag_chart.rows + s.urp_chart.rows} | {
        r["cluster"] for r in s.lag_partitions.rows + s.replication.rows} | {
        r.labels.get("cluster", "") for r in s.alert_timeline.rows + s.prom_alert_timeline.rows}
    clusters.discard("")
    multi = len(clusters) > 1
    cl_head = [("cluster", "")] if multi else []

    def cl(r: dict[str, Any]) -> list[str]:
        return [r["cluster"]] if multi else []

    lg, lp, rp, q, hb = s.lag_groups, s.lag_partitions, s.replication, s.quarantined, s.heartbeats
    ctx = {
        "css": Markup(CSS), "range": f"{fmt_time(s.start)} → {fmt_time(s.end)} UTC",
        "range_len": fmt_duration(s.end - s.start), "step": fmt_duration(s.step), "url": s.url, "version": s.version,
        "generated": fmt_time(s.generated), "end_time": fmt_time(s.end, False),
        "filters": "; ".join(f"{k} = {' or '.join(v)}" for k, v in s.filters.items() if v),
        "errors": len(s.errors), "cards": _cards(s), "top": s.top, "rows": s.rows, "lag_age_warn_s": LAG_AGE_WARN_S,
        "lag_chart": _chart("Lag per group and topic over time (max over partitions, offsets)", s.lag_chart, s,
                            lambda lb: lag_name(lb, multi), what="group/topic series", integer=True),
        "lag_groups": _table(
            "worst-groups", lg, [("group", ""), ("topic", ""), ("total lag", "num"), ("worst partition", "num"),
                                 *cl_head],
            [[r["group"], r["topic"], fmt_num(r["value"]),
              f"{r['worst_partition']} ({fmt_num(r['worst_lag'])})" if r["worst_partition"] else "–"] + cl(r)
             for r in lg.rows], _left_out_note(lg, "group/topic pairs")),
        "lag_partitions": _table(
            "worst-partitions", lp, [("group", ""), ("topic", ""), ("partition", "num"), ("lag", "num"), *cl_head],
            [[r["group"], r["topic"], r["partition"], fmt_num(r["value"])] + cl(r) for r in lp.rows],
            _left_out_note(lp, "partitions")),
        "urp_chart": _chart("Under-replicated partitions over time (ISR < replicas)", s.urp_chart, s,
                            lambda lb: f"cluster {lb.get('cluster', '')}", what="clusters", integer=True),
        "replication_summary": ("" if s.partitions_total is None else f"{s.partitions_total} partitions; "
                                f"{s.urp_total} under-replicated; {s.offline_total} offline."),
        "replication": {**_table(
            "replication", rp, [("topic", ""), ("partition", "num"), ("ISR", "num"), ("replicas", "num"),
                                ("UnderReplicated alert", ""), ("leader", ""), *cl_head],
            [[r["topic"], r["partition"], fmt_num(r["isr"]), fmt_num(r["replicas"]),
              Markup("<b>open</b>") if r["alert"] else "–", Markup("<b>none (offline)</b>") if r["offline"] else "ok"]
             + cl(r) for r in rp.rows], _left_out_note(rp, "partitions")),
            "no_data": not s.partitions_total and not rp.rows},
        "alerts_job": _timeline(
            "alerts-job", "Alerts the job raised (kafka_monitor_alert_active)", s.alert_timeline, s,
            lambda r: f"{r.labels.get('alert', '?')} · {entity_text(r.labels, ENTITY_LABELS, multi)}",
            "no alert was open in this range", _alert_color,
            Markup("Bars: while the alert was open; colour = severity (" + ", ".join(
                _sev_tag(k) for k in ("critical", "warning", "info")) + ").")),
        "alerts_prometheus": _timeline(
            "alerts-prometheus", "Prometheus alerting rules (ALERTS)", s.prom_alert_timeline, s,
            lambda r: f"{r.labels.get('alertname', '?')} · {entity_text(r.labels, ENTITY_LABELS, multi)}",
            "no data in this range: Prometheus kept no ALERTS series (no alerting rules loaded, or none pending or "
            "firing)", _alert_color, "Light bars: pending (waiting for the rule's for:); solid: firing; colour = severity."),
        "health_error": s.health_error, "health": "" if s.health_error else health_text(s),
        "job_up": _timeline(
            "job-up", "Streaming job up (kafka_monitor_job_up)", s.job_timeline, s,
            lambda r: label_text(r.labels) or "kafka-monitor job", "no data in this range: the job was not scraped",
            lambda r, sg: (STATE_COLORS[sg.state], 0.85),
            Markup(f'{_sev_tag("up")} query running; <span class="tag" style="background:{STATE_COLORS["down"]}">'
                   "down</span> query failed; no bar: no series (not scraped).")),
        "batch_age": _chart("Seconds since the last micro-batch", s.batch_age_chart, s,
                            lambda lb: label_text(lb) or "kafka-monitor job", unit="s", what="instances"),
        "quarantine_chart": _chart("Events quarantined per minute, by reason", s.quarantine_chart, s,
                                   lambda lb: lb.get("reason", "") or "(no reason)", what="reasons"),
        "quarantined": _table("quarantined", q, [("reason", ""), ("events (≈)", "num")],
                              [[r["reason"], fmt_num(round(r["value"]))] for r in q.rows]),
        "heartbeats": _table("heartbeats", hb, [("source", ""), ("cluster", ""), ("age", "num")],
                             [[r["source"], r["cluster"], fmt_duration(max(r["value"], 0))] for r in hb.rows],
                             _left_out_note(hb, "sources")),
        "promql": "\n\n".join(f"# {what}\n{query}" for what, query in s.queries),
    }
    return _template().render(ctx)
