"""``kafka-monitor snapshot`` without a real Prometheus: flags, PromQL escaping, the state
timelines, rendering of empty and hostile data, and what the command says when something is
wrong.  (tests/integration/test_snapshot.py runs it against a real Prometheus.)"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from kafka_monitor import cli, snapshot as snap
from kafka_monitor.local.broker import free_port

EVIL = '<script>alert("x")</script>&\\'


@pytest.mark.parametrize("text, secs", [("90s", 90), ("15m", 900), ("1h", 3600), ("1h30m", 5400), ("7d", 604800),
                                        ("500ms", 0.5), ("120", 120), (" 2h ", 7200)])
def test_durations(text, secs):
    assert snap.parse_duration(text, "--since") == secs


@pytest.mark.parametrize("text", ["", "1x", "h", "1h30", "-5m", "0s", "1.5.2h", "1h 30m"])
def test_bad_durations_name_the_flag(text):
    with pytest.raises(snap.SnapshotError, match=r"^--since: "):
        snap.parse_duration(text, "--since")


def test_times():
    assert snap.parse_time("1700000000") == 1700000000
    assert snap.parse_time("2024-05-01T14:00:00Z") == snap.parse_time("2024-05-01T14:00:00") == 1714572000
    assert snap.parse_time("2024-05-01T16:00:00+02:00") == 1714572000
    with pytest.raises(snap.SnapshotError, match=r"^--end: 'yesterday' is not a time"):
        snap.parse_time("yesterday")


@pytest.mark.parametrize("since, step", [(300, 1), (3600, 15), (6 * 3600, 120), (86400, 300), (30 * 86400, 10800)])
def test_auto_step_is_round_and_at_most_300_points(since, step):
    assert snap.auto_step(since) == step
    assert since / step <= snap.AUTO_POINTS


def test_promql_literals_escape_quotes_backslashes_newlines_and_regex():
    assert snap.promql_string('a"b\\c\nd\x1b') == '"a\\"b\\\\c\\nd\\x1b"'
    assert snap.re2_escape("a.b*(c)|d ^$ e") == "a\\.b\\*\\(c\\)\\|d \\^\\$ e"  # spaces stay: RE2 rejects '\ '
    m = snap.filter_matchers({"group": ["g.1", 'x"y'], "cluster": ["c"], "topic": []})
    assert m == 'cluster=~"(?:c)|",group=~"(?:g\\\\.1|x\\"y)|"'
    assert snap.filter_matchers({}) == ""


def test_a_row_of_state_segments():
    step, start, end = 15.0, 0.0, 300.0
    pending = snap.Series({"alertname": "A", "alertstate": "pending"}, [(t, 1) for t in (0, 15, 30)])
    firing = snap.Series({"alertname": "A", "alertstate": "firing"},
                         [(t, 1) for t in (30, 45, 60, 240, 255, 270, 285, 300)])
    rows = snap.build_rows([pending, firing], start, end, step, lambda lb, v: lb["alertstate"],
                           lambda lb: {k: v for k, v in lb.items() if k != "alertstate"})
    assert len(rows) == 1 and rows[0].labels == {"alertname": "A"}
    assert [(s.start, s.end, s.state, s.open) for s in rows[0].segments] == [
        (0, 30, "pending", False), (30, 75, "firing", False), (240, 300, "firing", True)]


def empty_snapshot(filters=None, **kw) -> snap.Snapshot:
    return snap.Snapshot("http://127.0.0.1:9090", None, 1700000000 - 3600, 1700000000, 15, 1700000005,
                         filters or {"cluster": [], "group": [], "topic": []}, 10, 20, **kw)


def test_empty_data_renders_no_data_everywhere():
    s = empty_snapshot()
    page = snap.render_html(s)
    assert page.count("no data in this range") >= 5
    assert "Time range" in page and "http://127.0.0.1:9090" in page
    assert "2023-11-14 21:13:20 → 2023-11-14 22:13:20 UTC" in page
    text = snap.render_text(s)
    assert "Consumer lag: no data at the end of the range" in text
    assert "no kafka_monitor_job_up" in text


def test_every_label_value_is_escaped_in_html_and_svg():
    lb = {"cluster": EVIL, "group": EVIL, "topic": EVIL, "partition": "0", "alert": EVIL, "severity": EVIL}
    pts = [(1700000000 - 3600 + 15 * i, float(i)) for i in range(241)]
    seg = [snap.Segment(1700000000 - 600, 1700000000, "active", True)]
    s = empty_snapshot(
        filters={"cluster": [EVIL], "group": [], "topic": []},
        lag_chart=snap.Chart([snap.Series(lb, pts)], 3),
        lag_partitions=snap.Table([{"cluster": EVIL, "group": EVIL, "topic": EVIL, "partition": EVIL, "value": 5}], 1),
        lag_groups=snap.Table([{"cluster": EVIL, "group": EVIL, "topic": EVIL, "value": 5, "worst_partition": EVIL,
                                "worst_lag": 5}], 1),
        replication=snap.Table([{"cluster": EVIL, "topic": EVIL, "partition": EVIL, "isr": 1, "replicas": 3,
                                 "alert": True, "offline": False}], 1),
        partitions_total=1, urp_total=1, offline_total=0,
        alert_timeline=snap.Timeline([snap.Row(lb, seg)], 1), alerts_open=1,
        prom_alert_timeline=snap.Timeline([snap.Row({"alertname": EVIL, "cluster": EVIL}, seg)], 1),
        quarantined=snap.Table([{"reason": EVIL, "value": 3.0}], 1),
        heartbeats=snap.Table([{"cluster": EVIL, "source": EVIL, "value": 4.0}], 1),
        queries=[("q", f'x{{group="{EVIL}"}}')])
    page = snap.render_html(s)
    assert "<script" not in page.lower()
    assert page.count("&lt;script&gt;") >= 10
    assert "2 more group/topic series not shown" in page
    text = snap.render_text(s)
    assert EVIL in text  # a terminal shows it as it is...


def test_the_terminal_summary_neutralises_control_characters():
    s = empty_snapshot(lag_partitions=snap.Table(
        [{"cluster": "c", "group": "g\x1b[31mred", "topic": "t", "partition": "0", "value": 5}], 1))
    assert "\x1b" not in snap.render_text(s) and "g\\x1b[31mred" in snap.render_text(s)


# -- the command line ------------------------------------------------------------------------------


def run(argv, capsys):
    code = cli.main(["snapshot", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_explains(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["snapshot", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--prometheus URL" in out and "--since DURATION" in out and "no data" not in out
    assert "Exit status" in out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "snapshot" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--since", "1x"], "error: --since: '1x' is not a duration"),
    (["--since", "0"], "error: --since: must be more than 0"),
    (["--step", "1s", "--since", "7d"], "error: --step: 1s over --since 7d is 604,800 points"),
    (["--end", "soon"], "error: --end: 'soon' is not a time"),
    (["--top", "0"], "error: --top: must be at least 1"),
    (["--group", ""], "error: --group: an empty name matches nothing"),
    (["--prometheus", "ftp://x"], "error: --prometheus: 'ftp://x' is not an http(s) URL"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, message, capsys, tmp_path):
    code, out, err = run([*argv, "--out", str(tmp_path / "s.html")], capsys)
    assert code == 2
    assert err.startswith(message), err
    assert not (tmp_path / "s.html").exists()


def test_out_a_directory_exits_2(capsys, tmp_path):
    code, _, err = run(["--out", str(tmp_path)], capsys)
    assert code == 2 and err.startswith(f"error: --out: {tmp_path} is a directory")


def test_unreachable_prometheus_exits_2_saying_what_to_do(capsys, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(["--prometheus", url, "--out", str(tmp_path / "s.html")], capsys)
    assert code == 2
    assert err.startswith(f"error: cannot reach Prometheus at {url}: ")
    assert err.rstrip().endswith("; start it or pass --prometheus")
    assert out == "" and not (tmp_path / "s.html").exists()


class FakePrometheus(BaseHTTPRequestHandler):
    """Answers ``time()``; refuses every other query (or is not Prometheus at all)."""
    mode = "refuse"

    def do_GET(self):  # noqa: N802
        url = urlsplit(self.path)
        query = parse_qs(url.query).get("query", [""])[0]
        if self.server.mode == "not-prometheus":
            self._send(404, b"<html>404 page not found</html>", "text/html")
        elif url.path == "/api/v1/query" and query == "time()":
            self._send(200, json.dumps({"status": "success", "data": {"resultType": "scalar",
                                                                       "result": [1700000000, "1700000000"]}}).encode())
        else:
            self._send(422, json.dumps({"status": "error", "errorType": "execution",
                                        "error": "query timed out in expression evaluation"}).encode())

    def _send(self, code, body, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def fake():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    server.mode = "refuse"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_not_prometheus_exits_2(fake, capsys, tmp_path):
    fake.mode = "not-prometheus"
    url = f"http://127.0.0.1:{fake.server_address[1]}"
    code, _, err = run(["--prometheus", url, "--out", str(tmp_path / "s.html")], capsys)
    assert code == 2
    assert "answered /api/v1/query with HTTP 404 and no Prometheus API JSON" in err and "pass --prometheus" in err


def test_failed_queries_fail_their_panels_not_the_snapshot(fake, capsys, tmp_path):
    url = f"127.0.0.1:{fake.server_address[1]}/"  # no scheme, a trailing slash: both fine
    out_file = tmp_path / "s.html"
    code, out, err = run(["--prometheus", url, "--out", str(out_file)], capsys)
    assert code == 1, err
    page = out_file.read_text(encoding="utf-8")
    assert page.count("query failed: ") >= 8
    assert "query timed out in expression evaluation" in page
    assert re.search(r"\d+ queries failed \(their panels say so\)", out)


def test_several_clusters_get_a_cluster_column_and_name():
    lag = [{"cluster": c, "group": "g", "topic": "t", "partition": "0", "value": v} for c, v in (("a", 5), ("b", 3))]
    seg = [snap.Segment(1700000000 - 600, 1700000000, "active", True)]
    s = empty_snapshot(lag_partitions=snap.Table(lag, 2), alert_timeline=snap.Timeline([snap.Row(
        {"alert": "UnderReplicated", "severity": "warning", "cluster": "b", "topic": "t", "partition": "0"}, seg)], 1))
    page = snap.render_html(s)
    assert '<th class="">cluster</th>' in page
    assert "UnderReplicated · topic t partition 0 (cluster b)" in page
    one = snap.render_html(empty_snapshot(lag_partitions=snap.Table(lag[:1], 1)))
    assert '<th class="">cluster</th>' not in one


class AlertsOnlyPrometheus:
    """Stands in for Prometheus for the job's alert timeline: evaluates a query's selector of
    kafka_monitor_alert_active (its =~ matchers) and its first ``max by (...)`` over fixed
    series, all active over the last minute; every other query has no data."""

    url = "http://127.0.0.1:9090"
    END = 1700000000.0

    def __init__(self, series: list[dict[str, str]]):
        self.series = series

    def _groups(self, expr: str) -> list[dict[str, str]]:
        sel = re.search(r"kafka_monitor_alert_active(\{[^}]*\})?", expr)
        if sel is None:
            return []
        matchers = re.findall(r'(\w+)=~"((?:[^"\\]|\\.)*)"', sel.group(1) or "")
        kept = [s for s in self.series if all(re.fullmatch(rx.replace("\\\\", "\\"), s.get(lb, ""))
                                              for lb, rx in matchers)]
        by = [x.strip() for x in re.search(r"max by \(([^)]*)\)", expr).group(1).split(",")]
        groups = {tuple(s.get(lb, "") for lb in by) for s in kept}
        return [{lb: v for lb, v in zip(by, g) if v} for g in sorted(groups)]

    def get(self, path, params=None):
        return {}

    def instant(self, expr, at):
        if expr == "time()":
            return [({}, at)]
        if expr.startswith("count(") and "kafka_monitor_alert_active" in expr:
            return [({}, float(len(self._groups(expr))))]
        return []

    def scalar(self, expr, at):
        rows = self.instant(expr, at)
        return rows[0][1] if rows else None

    def range(self, expr, start, end, step):
        return [snap.Series(lb, [(end - 60, 1.0), (end, 1.0)]) for lb in self._groups(expr)]


def test_the_alert_timeline_has_a_row_per_source_and_broker_and_follows_the_cluster_filter():
    """Two probes of one cluster silent, two of its brokers down: four rows, each naming its
    source or broker (they were two, 'SourceSilent (cluster east)' and 'BrokerDown (cluster
    east)'); --cluster west keeps west's only."""
    series = [{"alert": "SourceSilent", "severity": "critical", "cluster": c, "source": s}
              for c, s in (("east", "probe-a"), ("east", "probe-b"), ("west", "probe-a"))]
    series += [{"alert": "BrokerDown", "severity": "critical", "cluster": c, "broker": b}
               for c, b in (("east", "1"), ("east", "2"), ("west", "1"))]
    prom, end = AlertsOnlyPrometheus(series), AlertsOnlyPrometheus.END

    every = snap.collect(prom, end - 3600, end, 15, {"cluster": [], "group": [], "topic": []})
    rows = {(r.labels["alert"], r.labels["cluster"], r.labels.get("source") or r.labels.get("broker"))
            for r in every.alert_timeline.rows}
    assert rows == {("SourceSilent", "east", "probe-a"), ("SourceSilent", "east", "probe-b"),
                    ("SourceSilent", "west", "probe-a"), ("BrokerDown", "east", "1"), ("BrokerDown", "east", "2"),
                    ("BrokerDown", "west", "1")}
    assert every.alerts_open == 6
    page = snap.render_html(every)
    assert "SourceSilent · source probe-b (cluster east)" in page and "BrokerDown · broker 2 (cluster east)" in page

    west = snap.collect(prom, end - 3600, end, 15, {"cluster": ["west"], "group": [], "topic": []})
    assert {(r.labels["alert"], r.labels["cluster"]) for r in west.alert_timeline.rows} == {
        ("SourceSilent", "west"), ("BrokerDown", "west")}
    assert "BrokerDown · broker 1" in snap.render_html(west)
