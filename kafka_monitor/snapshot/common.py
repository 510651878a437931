"""Constants, errors and the parsing and formatting of times, durations and numbers."""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from typing import Optional



DEFAULT_PROMETHEUS = "http://127.0.0.1:9090"


#: auto step: the roundest step giving at most this many points per series
AUTO_POINTS = 300


#: Prometheus refuses range queries of more points than this per series
PROMETHEUS_MAX_POINTS = 11_000


NICE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


FILTER_LABELS = ("cluster", "group", "topic")


STATE_ORDER = {"pending": 1, "firing": 2}


#: alert_active and ALERTS label an alert's entity with these (empty when they do not apply)
ENTITY_LABELS = ("cluster", "group", "topic", "partition", "source", "broker", "reason")
#: the entity labels of the job's kafka_monitor_alert_active: one timeline row per entity
ALERT_ENTITY = ENTITY_LABELS[:6]


LAG_AGE_WARN_S = 120  # the threshold of KafkaMonitorJobFallingBehind


class SnapshotError(Exception):
    """Something the user can fix (the message says what); nothing is written; exit 2."""


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
