"""What ``kafka-monitor replay`` writes: the report as a dict (the JSON file), the terminal table
and the HTML page (the snapshot's templating: ``templates/replay.html.j2``, inline CSS and SVG)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from kafka_monitor.replay.diff import AlertDiff, Episode, entity_text
from kafka_monitor.snapshot.common import fmt_duration

#: the JSON report's format
FORMAT = 1


def iso(ms: Optional[int]) -> Optional[str]:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _hms(ms: int, lo: int, hi: int) -> str:
    """A moment of the range, with its date when the range spans days."""
    d = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    same_day = dt.datetime.fromtimestamp(lo / 1000, dt.timezone.utc).date() == \
        dt.datetime.fromtimestamp(hi / 1000, dt.timezone.utc).date()
    return d.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M:%S")


def span_text(e: Episode, lo: int, hi: int) -> str:
    start = "(before the range)" if e.start is None or e.start < lo else _hms(e.start, lo, hi)
    end = "(still open)" if e.end is None else ("(after the range)" if e.end > hi else _hms(e.end, lo, hi))
    length = "" if e.start is None or e.end is None else f" ({fmt_duration((e.end - e.start) / 1000)})"
    return f"{start} → {end}{length}"


def build(*, start_ms: int, end_ms: int, warmup_ms: int, read_from: str, config: Optional[str],
          rules_changed: dict[str, Any], clusters: list[str], uncovered: list[dict], archived: dict[str, dict],
          replay: dict[str, Any], transitions: list[dict], compared: Optional[dict[str, Any]],
          diffs: Optional[dict[str, AlertDiff]], compare_error: Optional[str] = None,
          source: str = "archive") -> dict[str, Any]:
    """The report (JSON-ready).  ``read_from``: the archive's URI, or the events topic and its
    cluster (``source`` "events-topic": not exact)."""
    out: dict[str, Any] = {
        "format": FORMAT, "source": source, "exact": source == "archive",
        "range": {"from": iso(start_ms), "to": iso(end_ms), "from_ms": start_ms, "to_ms": end_ms,
                  "warmup_s": warmup_ms / 1000, "read_from": iso(start_ms - warmup_ms)},
        "archive" if source == "archive" else "events_topic": read_from, "config": config, "rules_changed": rules_changed, "clusters": clusters,
        "coverage": {"complete": not any(u["in_range"] for u in uncovered), "uncovered": uncovered,
                     "archived": archived},
        "replay": replay, "transitions": transitions, "compared": compared is not None,
    }
    if compare_error:
        out["compare_error"] = compare_error
    if compared is not None and diffs is not None:
        out["alerts_topic"] = compared
        out["summary"] = {a: d.counts() for a, d in diffs.items()}
        out["identical"] = not any(d.differs for d in diffs.values())
        out["differences"] = {a: {"added": [e.to_json() for e in d.added],
                                  "removed": [e.to_json() for e in d.removed],
                                  "shifted": [s.to_json() for s in d.shifted]}
                              for a, d in diffs.items() if d.differs}
    return out


def coverage_lines(uncovered: list[dict]) -> list[str]:
    """A warning per span of the range the archive does not cover; a note per span of the warm-up
    alone (the state there is unknown: what the replay raises soon after it may differ)."""
    return [f"warning: not covered by the archive: cluster {u['cluster']} {u['from']} → {u['to']}: {u['why']}"
            if u["in_range"] else
            f"note: the warm-up is not covered for cluster {u['cluster']} {u['from']} → {u['to']}: {u['why']}; "
            f"the replay's state starts after it"
            for u in uncovered]


def _shift_text(s: float) -> str:
    return "0s" if s == 0 else f"{'+' if s > 0 else '-'}{fmt_duration(abs(s))}"


def difference_lines(diffs: dict[str, AlertDiff], lo: int, hi: int) -> list[tuple[str, str, str, str]]:
    """(mark, alert, entity, what) per differing episode, alert by alert."""
    out = []
    for alert, d in diffs.items():
        for e in d.added:
            out.append(("+", alert, entity_text(e.entity), f"replay only: {span_text(e, lo, hi)}"))
        for e in d.removed:
            out.append(("-", alert, entity_text(e.entity), f"job only: {span_text(e, lo, hi)}"))
        for s in d.shifted:
            out.append(("~", alert, entity_text(s.job.entity),
                        f"job {span_text(s.job, lo, hi)}; replay {span_text(s.replay, lo, hi)} "
                        f"(start {_shift_text(s.start_s)}, end {_shift_text(s.end_s)})"))
    return out


def render_text(rep: dict[str, Any], diffs: Optional[dict[str, AlertDiff]], max_rows: int, files: str) -> str:
    lo, hi = rep["range"]["from_ms"], rep["range"]["to_ms"]
    r = rep["replay"]
    lines = [f"kafka-monitor replay  {rep['range']['from']} → {rep['range']['to']} "
             f"({fmt_duration((hi - lo) / 1000)}; warm-up from {rep['range']['read_from']})",
             f"{'archive ' + rep['archive'] if rep['exact'] else 'events topic ' + rep['events_topic']}: "
             f"{r['batches']:,} batches, {r['rows']:,} events, {r['ticks']:,} timeouts "
             f"({r['ticks_skipped']:,} not taken) in {r['seconds']:.1f}s",
             *([] if rep["exact"] else [
                 "APPROXIMATE: replayed from the events topic, not the archive: batches, buckets and timeouts of its "
                 "own, not the job's; time-driven alerts can move by up to a trigger or a tick"]),
             f"config: {rep['config'] or '(defaults)'}" + (
                 "; rules changed from the defaults: " + ", ".join(f"{k}={v}" for k, v in rep["rules_changed"].items())
                 if rep["rules_changed"] else "; every rule at its default")]
    lines += coverage_lines(rep["coverage"]["uncovered"])
    if r.get("incomplete"):
        lines.append(f"warning: {r['incomplete']} buckets' rows of a batch are incomplete (a file of the batch is "
                     f"gone); the replay may differ from the job around them")
    in_range = [t for t in rep["transitions"] if lo <= t["at"] <= hi]
    lines.append(f"the replay's transitions in the range: {len(in_range):,} "
                 f"({sum(t['action'] == 'open' for t in in_range):,} opens)")
    if diffs is None:
        if rep.get("compare_error"):
            lines.append(f"not compared: {rep['compare_error']}")
        lines.append(f"written: {files}")
        return "\n".join(lines) + "\n"
    if not diffs:
        lines.append("no alert episode in the range, in the job's or the replay's transitions")
    else:
        w = max(len(a) for a in diffs)
        lines.append("")
        lines.append(f"{'alert':<{w}}  {'same':>6}  {'added':>6}  {'removed':>7}  {'shifted':>7}")
        for a, d in diffs.items():
            c = d.counts()
            lines.append(f"{a:<{w}}  {c['same']:>6}  {c['added']:>6}  {c['removed']:>7}  {c['shifted']:>7}")
        diff_lines = difference_lines(diffs, lo, hi)
        if not diff_lines:
            lines.append("\nidentical: the replay raises exactly the episodes the job published in the range")
        else:
            lines.append("\ndifferences (+ replay only, - job only, ~ shifted):")
            for mark, alert, ent, what in diff_lines[:max_rows]:
                lines.append(f"  {mark} {alert}  {ent}  {what}")
            if len(diff_lines) > max_rows:
                lines.append(f"  ... {len(diff_lines) - max_rows} more (the JSON file has them all)")
    lines.append(f"written: {files}")
    return "\n".join(lines) + "\n"


# --- the page ----------------------------------------------------------------------------------

JOB_COLOR, REPLAY_COLOR = "#4e79a7", "#f28e2b"
#: lanes drawn at most (the JSON has every difference)
MAX_LANES = 200


def timeline_svg(lanes: list[tuple[str, list[tuple[Episode, bool]], list[tuple[Episode, bool]]]], lo: int,
                 hi: int) -> str:
    """One lane per (alert, entity): the job's episodes above, the replay's below; an episode both
    sides have alike is drawn light, one that differs solid."""
    from kafka_monitor.snapshot.html import _time_ticks, e

    W, label_w, mr, lane_h, top, bottom = 960, 330, 14, 26, 6, 26
    H = top + lane_h * len(lanes) + bottom
    pw = W - label_w - mr
    span = (hi - lo) or 1
    x = lambda t: label_w + (min(max(t, lo), hi) - lo) / span * pw  # noqa: E731
    out = [f'<svg viewBox="0 0 {W} {H}" role="img" preserveAspectRatio="xMidYMid meet">']
    ticks, fmt = _time_ticks(lo / 1000, hi / 1000)
    for t in ticks:
        label = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime(fmt)
        out.append(f'<line class="grid" x1="{x(t * 1000):.1f}" x2="{x(t * 1000):.1f}" y1="{top}" y2="{H - bottom}"/>'
                   f'<text x="{x(t * 1000):.1f}" y="{H - 8}" text-anchor="middle">{e(label)}</text>')
    for i, (name, job, rep) in enumerate(lanes):
        y0 = top + i * lane_h
        short = name if len(name) <= 52 else name[:51] + "…"
        if i % 2:
            out.append(f'<rect x="0" y="{y0}" width="{W}" height="{lane_h}" fill="#f6f8fa"/>')
        out.append(f'<text x="4" y="{y0 + lane_h / 2 + 4:.1f}"><title>{e(name)}</title>{e(short)}</text>')
        for eps, color, dy, who in ((job, JOB_COLOR, 3, "job"), (rep, REPLAY_COLOR, 14, "replay")):
            for ep, differs in eps:
                s, end = ep.clamped(lo, hi)
                tip = f"{name}: {who} {span_text(ep, lo, hi)}" + ("" if differs else " (the same on both sides)")
                out.append(f'<rect x="{x(s):.1f}" y="{y0 + dy}" width="{max(x(end) - x(s), 1.5):.1f}" height="9" '
                           f'rx="2" fill="{color}" fill-opacity="{0.9 if differs else 0.3}"><title>{e(tip)}</title>'
                           f'</rect>')
    out.append(f'<line class="axis" x1="{label_w}" x2="{W - mr}" y1="{H - bottom}" y2="{H - bottom}"/>')
    out.append("</svg>")
    return "".join(out)


Lane = tuple[str, list[tuple[Episode, bool]], list[tuple[Episode, bool]]]


def lanes(diffs: dict[str, AlertDiff]) -> list[Lane]:
    """The (alert, entity) pairs with a difference: both sides' episodes in the range, each with
    whether it differs."""
    by: dict[tuple[str, tuple], tuple[list[tuple[Episode, bool]], list[tuple[Episode, bool]]]] = {}
    for alert, d in diffs.items():
        for ep in d.removed:
            by.setdefault((alert, ep.entity), ([], []))[0].append((ep, True))
        for ep in d.added:
            by.setdefault((alert, ep.entity), ([], []))[1].append((ep, True))
        for s in d.shifted:
            got = by.setdefault((alert, s.job.entity), ([], []))
            got[0].append((s.job, True))
            got[1].append((s.replay, True))
        for j, r in d.same:  # context, in a lane that has a difference
            if (alert, j.entity) in by:
                by[alert, j.entity][0].append((j, False))
                by[alert, j.entity][1].append((r, False))
    return [(f"{a} · {entity_text(ent)}", js, rs) for (a, ent), (js, rs) in sorted(by.items())]


def render_html(rep: dict[str, Any], diffs: Optional[dict[str, AlertDiff]], generated: str) -> str:
    from markupsafe import Markup

    from kafka_monitor.snapshot.html import CSS, template

    lo, hi = rep["range"]["from_ms"], rep["range"]["to_ms"]
    all_lanes = lanes(diffs) if diffs else []
    shown = all_lanes[:MAX_LANES]
    rows = [[mark, alert, ent, what] for mark, alert, ent, what in difference_lines(diffs or {}, lo, hi)]
    ctx = {
        "css": Markup(CSS + ".mark { font-weight: 700; }\n"), "rep": rep, "generated": generated,
        "range_len": fmt_duration((hi - lo) / 1000),
        "rules_changed": ", ".join(f"{k} = {v}" for k, v in rep["rules_changed"].items()),
        "summary": [(a, d.counts()) for a, d in (diffs or {}).items()],
        "svg": Markup(timeline_svg(shown, lo, hi)) if shown else None, "lanes_left_out": len(all_lanes) - len(shown),
        "rows": rows, "job_color": JOB_COLOR, "replay_color": REPLAY_COLOR,
        "in_range": sum(1 for t in rep["transitions"] if lo <= t["at"] <= hi),
    }
    return str(template("replay.html.j2").render(ctx))
