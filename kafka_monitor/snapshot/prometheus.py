"""Prometheus's HTTP API: the client, PromQL literals and label filters, and ``Series``."""

from __future__ import annotations

import http.client
import json
import math
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

from kafka_monitor.snapshot.common import DEFAULT_PROMETHEUS, FILTER_LABELS, SnapshotError


class QueryError(Exception):
    """Prometheus answered an error to one query; that panel shows it, the others render."""


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
