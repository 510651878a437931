"""``kafka-monitor snapshot`` against a real Prometheus holding data of a known shape.

The data is OpenMetrics text generated here and backfilled with ``promtool tsdb
create-blocks-from openmetrics``; Prometheus (Debian package ``prometheus``, 2.42) then serves it
from those blocks on a free loopback port.  What backfilling imposes on the data (all found the
hard way, see the report in the module's history):

- every sample needs a timestamp, in seconds (milliseconds are taken as seconds, silently:
  the year 58,000);
- the file must end with ``# EOF``;
- within a series, samples must be in time order: an out-of-order one is dropped without an
  error (promtool exits 0);
- there are no staleness markers: a series that stops is still "present" for the lookback
  delta (5m by default) after its last sample, so a resolved alert would look 5 minutes longer.
  The server here runs with ``--query.lookback-delta=20s`` (samples every 15s).

The range queried is pinned (``--end`` = the last sample's time), so what the page must show
is exact whatever the time the test runs at.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser

import markupsafe
import pytest

from kafka_monitor import cli
from kafka_monitor.local.broker import die_with_parent, free_port, stop_process
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

STEP = 15  # seconds between samples
CLUSTER = "prod-eu-1"
EVIL = 'evil<script>alert("x&y")</script>\\z'  # a group name that must be escaped everywhere
IDLE = [f"idle-{i:02d}" for i in range(12)]  # 12 groups of lag i: the lag chart's cap leaves 4 out


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"'{name}' is not on PATH: install Debian package prometheus "
                    f"(apt-get install -y prometheus) to get prometheus and promtool", pytrace=False)
    return path


# -- the data ------------------------------------------------------------------------------------


def om_labels(**labels: str) -> str:
    esc = lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # noqa: E731
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


class OpenMetrics:
    """Families in one block each (as OpenMetrics requires), samples of a series in time order."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, list[str]]] = {}

    def add(self, family: str, typ: str, name: str, labels: dict[str, str], points) -> None:
        lines = self.families.setdefault(family, (typ, []))[1]
        lines += [f"{name}{om_labels(**labels)} {v!r} {t}" for t, v in points]  # not :g (6 digits)

    def text(self) -> str:
        out = []
        for family, (typ, lines) in self.families.items():
            if typ:
                out.append(f"# TYPE {family} {typ}")
            out += lines
        return "\n".join(out + ["# EOF"]) + "\n"


def generate(t0: int) -> str:
    """65 minutes of data ending at t0 (a multiple of STEP):

    - lag: orders-app/orders p0..p2 ramps up to 1000/2000/3000 at t0; EVIL/payments p0, p1 flat
      50 and 70; idle-NN/audit p0 flat NN;
    - replicas 3 everywhere; ISR 2 on orders/2 for the last 10 minutes (still under-replicated)
      and on orders/1 from t0-40m to t0-20m (resolved); the job's UnderReplicated alert over the
      same spans, and OfflinePartition (critical, leader -1) on payments/0 t0-50m..t0-48m;
    - Prometheus's ALERTS for UnderReplicated: pending 5 minutes, then firing;
    - the job: up except t0-31m..t0-29m (down), batches stalled t0-32m..t0-29m; quarantined
      malformed_json +1 every 5 minutes; probe-a's heartbeat 5s old.
    """
    first = t0 - 65 * 60
    ts = list(range(first, t0 + 1, STEP))
    om = OpenMetrics()

    def gauge(name, labels, f, family=None, typ="gauge"):
        pts = [(t, f(t)) for t in ts]
        om.add(family or name, typ, name, labels, [(t, v) for t, v in pts if v is not None])

    lag = "kafka_monitor_group_partition_lag"
    for p in range(3):
        gauge(lag, dict(cluster=CLUSTER, group="orders-app", topic="orders", partition=str(p)),
              lambda t, p=p: round((p + 1) * 1000 * (t - first) / (t0 - first)))
    for p, v in ((0, 50), (1, 70)):
        gauge(lag, dict(cluster=CLUSTER, group=EVIL, topic="payments", partition=str(p)), lambda t, v=v: v)
    for i, g in enumerate(IDLE):
        gauge(lag, dict(cluster=CLUSTER, group=g, topic="audit", partition="0"), lambda t, i=i: i)

    def between(t, a_min, b_min):  # t0-a .. t0-b, minutes; end exclusive
        return t0 - a_min * 60 <= t < t0 - b_min * 60 if b_min else t0 - a_min * 60 <= t

    parts = [("orders", 0), ("orders", 1), ("orders", 2), ("payments", 0), ("payments", 1), ("audit", 0)]
    for topic, p in parts:
        labels = dict(cluster=CLUSTER, topic=topic, partition=str(p))
        gauge("kafka_monitor_partition_replicas", labels, lambda t: 3)
        short = {("orders", 2): (10, 0), ("orders", 1): (40, 20)}.get((topic, p))
        gauge("kafka_monitor_partition_in_sync_replicas", labels,
              lambda t, s=short: 2 if s and between(t, *s) else 3)
        gauge("kafka_monitor_partition_leader", labels,
              lambda t, tp=(topic, p): -1 if tp == ("payments", 0) and between(t, 50, 48) else 1)

    alert = "kafka_monitor_alert_active"
    for (topic, p), (a, b) in {("orders", 2): (10, 0), ("orders", 1): (40, 20)}.items():
        gauge(alert, dict(alert="UnderReplicated", severity="warning", cluster=CLUSTER, topic=topic,
                          partition=str(p), group=""), lambda t, a=a, b=b: 1 if between(t, a, b) else None)
        for state, span in (("pending", (a, a - 5)), ("firing", (a - 5, b))):
            gauge("ALERTS", dict(alertname="UnderReplicated", alertstate=state, severity="warning",
                                 cluster=CLUSTER, topic=topic, partition=str(p)),
                  lambda t, s=span: 1 if between(t, *s) else None, typ="")
    gauge(alert, dict(alert="OfflinePartition", severity="critical", cluster=CLUSTER, topic="payments",
                      partition="0", group=""), lambda t: 1 if between(t, 50, 48) else None)

    job = dict(job="kafka-monitor", instance="127.0.0.1:9465")
    gauge("kafka_monitor_job_up", job, lambda t: 0 if between(t, 31, 29) else 1)
    gauge("kafka_monitor_job_last_batch_timestamp_seconds", job,
          lambda t: t0 - 32 * 60 if between(t, 32, 29) else t - 2)
    gauge("kafka_monitor_job_batches_total", job,
          lambda t: (min(t, t0 - 32 * 60) + max(0, t - (t0 - 29 * 60)) - first) // 5,
          family="kafka_monitor_job_batches", typ="counter")
    gauge("kafka_monitor_events_quarantined_total", dict(reason="malformed_json"), lambda t: (t - first) // 300,
          family="kafka_monitor_events_quarantined", typ="counter")
    gauge("kafka_monitor_events_quarantined_total", dict(reason="unknown_schema"), lambda t: 4,
          family="kafka_monitor_events_quarantined", typ="counter")
    gauge("kafka_monitor_source_last_heartbeat_timestamp_seconds", dict(cluster=CLUSTER, source="probe-a"),
          lambda t: t - 5)
    return om.text()


# -- a real Prometheus over the backfilled blocks ---------------------------------------------------


def http_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Backfill the data, start Prometheus on a free loopback port over it, wait until a query
    returns the backfilled data; stop it by PID at the end, even on failure."""
    binary, promtool = tool("prometheus"), tool("promtool")
    tmp = tmp_path_factory.mktemp("snapshot-prom")
    t0 = int(time.time()) // STEP * STEP - STEP  # the last sample: in the recent past
    source = tmp / "data.om"
    source.write_text(generate(t0), encoding="utf-8")
    data = tmp / "data"
    began = time.monotonic()
    p = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(data)],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        pytest.fail(f"promtool create-blocks-from openmetrics exited {p.returncode}:\n{p.stdout}{p.stderr}",
                    pytrace=False)
    backfill_s = time.monotonic() - began
    config = tmp / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n", encoding="utf-8")
    port = free_port()
    log_path = tmp / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
             f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=3650d",
             "--query.lookback-delta=20s"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    server = {"url": f"http://127.0.0.1:{port}", "proc": proc, "log": log_path, "t0": t0, "tmp": tmp,
              "backfill_s": backfill_s}
    try:
        def loaded():
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited with code {proc.returncode}:\n"
                            f"{log_path.read_text(errors='replace')[-3000:]}", pytrace=False)
            try:
                q = urllib.parse.urlencode({"query": "count(kafka_monitor_group_partition_lag)", "time": t0})
                result = http_json(f"{server['url']}/api/v1/query?{q}")["data"]["result"]
            except (urllib.error.URLError, ConnectionError, KeyError):
                return None
            return result and result[0]["value"][1] == str(3 + 2 + len(IDLE))

        wait_for(loaded, timeout=60, what="Prometheus to serve the backfilled blocks")
        server["ready_s"] = time.monotonic() - began
        yield server
    finally:
        stop_process(proc)


# -- reading the page back ---------------------------------------------------------------------------


class Tables(HTMLParser):
    """Every <table id=...> of the page as rows of cell texts."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self._table, self._row, self._cell = None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._table = self.tables.setdefault(dict(attrs).get("id", ""), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def snapshot(server, tmp_path, capsys, *extra: str, end: object = "t0") -> tuple[int, str, str, str]:
    out = tmp_path / "snapshot.html"
    argv = ["snapshot", "--prometheus", server["url"], "--since", "1h", "--out", str(out), *extra]
    if end is not None:
        argv += ["--end", str(server["t0"] if end == "t0" else end)]
    code = cli.main(argv)
    cap = capsys.readouterr()
    return code, out.read_text(encoding="utf-8") if out.exists() else "", cap.out, cap.err


@pytest.fixture(scope="module")
def page(prometheus, tmp_path_factory):
    """The snapshot of the whole range, rendered once for the tests that read it."""
    out = tmp_path_factory.mktemp("page") / "snapshot.html"
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    began = time.monotonic()
    with redirect_stdout(buf):
        code = cli.main(["snapshot", "--prometheus", prometheus["url"], "--since", "1h",
                         "--end", str(prometheus["t0"]), "--out", str(out)])
    took = time.monotonic() - began
    text = out.read_text(encoding="utf-8")
    return {"code": code, "html": text, "stdout": buf.getvalue(), "tables": Tables(text).tables, "path": out,
            "took": took}


def test_exit_0_and_the_gist_on_stdout(page):
    assert page["code"] == 0, page["stdout"]
    out = page["stdout"]
    assert "Worst consumer lag now (16 of 17 partitions lagging" in out
    first = [line.split() for line in out.splitlines() if line.strip().startswith("3,000")]
    assert first and first[0][:4] == ["3,000", "orders-app", "orders", "2"], out
    assert "Open alerts (kafka_monitor_alert_active): 1" in out
    assert "warning UnderReplicated topic orders partition 2 (cluster prod-eu-1)" in out
    assert "Prometheus ALERTS firing now: 1" in out
    assert "Partitions: 6, under-replicated 1, offline 0" in out
    assert "orders/2 (cluster prod-eu-1): ISR 2 of 3 replicas, UnderReplicated alert open" in out
    assert "Monitor: job up, last batch 2s ago" in out
    assert "malformed_json" in out
    assert "wrote " in out


def test_page_states_range_prometheus_url_and_generation_time(page, prometheus):
    text = page["html"]
    t0 = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(prometheus["t0"]))
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(prometheus["t0"] - 3600))
    assert f"{start} → {t0} UTC (1h, step 15s)" in text
    assert f"<code>{prometheus['url']}</code>" in text
    assert "version 2." in text
    assert re.search(r"<dt>Generated</dt><dd>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text)


def test_worst_lag_tables_order_and_values(page):
    parts = page["tables"]["worst-partitions"]
    assert parts[0] == ["group", "topic", "partition", "lag"]
    assert parts[1:6] == [["orders-app", "orders", "2", "3,000"], ["orders-app", "orders", "1", "2,000"],
                          ["orders-app", "orders", "0", "1,000"], [EVIL, "payments", "1", "70"],
                          [EVIL, "payments", "0", "50"]]
    assert [r[0] for r in parts[6:]] == list(reversed(IDLE))  # 11, 10, ... 0
    groups = page["tables"]["worst-groups"]
    assert groups[1:3] == [["orders-app", "orders", "6,000", "2 (3,000)"], [EVIL, "payments", "120", "1 (70)"]]


def test_lag_chart_draws_the_top_10_and_says_4_left_out(page):
    text = page["html"]
    legend = text[text.index('<ul class="legend">'):text.index("</ul>")]
    assert "orders-app · orders" in legend and str(markupsafe.escape(EVIL)) + " · payments" in legend
    assert "idle-11 · audit" in legend and "idle-04 · audit" in legend
    assert "idle-03" not in legend
    assert "4 more group/topic series not shown" in text


def test_under_replicated_partition_is_listed(page):
    rows = page["tables"]["replication"]
    assert rows[0][:5] == ["topic", "partition", "ISR", "replicas", "UnderReplicated alert"]
    assert rows[1:] == [["orders", "2", "2", "3", "open", "ok"]]  # orders/1 has recovered
    assert "6 partitions; 1 under-replicated; 0 offline." in page["html"]


def test_alerts_timeline_shows_opened_and_resolved_alerts(page, prometheus):
    t0 = prometheus["t0"]
    hhmm = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))  # noqa: E731
    rows = page["tables"]["alerts-job"][1:]
    by_entity = {}
    for entity, state, frm, to, _ in rows:
        by_entity.setdefault(entity, []).append((state, frm, to))
    assert by_entity["UnderReplicated · topic orders partition 2"] == [
        ("active", hhmm(t0 - 600), "open")]
    [(state, frm, to)] = by_entity["UnderReplicated · topic orders partition 1"]
    assert (state, frm) == ("active", hhmm(t0 - 2400))
    # resolved at t0-20m: the last sample is at t0-20m-15s; the bar covers its step (+ the 20s lookback)
    assert hhmm(t0 - 1200) <= to <= hhmm(t0 - 1200 + 2 * STEP)
    [(state, frm, to)] = by_entity["OfflinePartition · topic payments partition 0"]
    assert frm == hhmm(t0 - 3000) and to != "open"
    # colours: critical red, warning orange; the open one is drawn to the right edge
    assert 'fill="#c62828"' in page["html"] and 'fill="#ef8a17"' in page["html"]

    prom = page["tables"]["alerts-prometheus"][1:]
    states = [(e_, s_, to) for e_, s_, _, to, _ in prom if "partition 2" in e_]
    assert [(s_, to) for _, s_, to in states] == [("pending", hhmm(t0 - 300)), ("firing", "open")]
    assert all(e_.startswith("UnderReplicated · ") for e_, *_ in prom)
    assert "more rows not shown" not in page["html"]  # 2 entities of 2 series each (pending, firing)


def test_monitor_health(page):
    text = page["html"]
    job = page["tables"]["job-up"][1:]
    assert [r[1] for r in job] == ["up", "down", "up"]
    assert job[-1][3] == "open"
    assert dict((r[0], r[1]) for r in page["tables"]["quarantined"][1:])["malformed_json"] in ("12", "13")
    assert page["tables"]["heartbeats"][1] == ["probe-a", CLUSTER, "5s"]
    assert "Seconds since the last micro-batch" in text


def test_label_values_are_escaped(page):
    text = page["html"]
    assert "<script" not in text.lower()
    assert str(markupsafe.escape(EVIL)) in text
    # and inside the SVG too (tooltips of the lag chart)
    svg = text[text.index("<svg"):text.index("</svg>")]
    assert str(markupsafe.escape(EVIL)) in svg


def test_page_references_nothing_external(page, prometheus):
    text = page["html"]
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", text, re.I)
    assert not re.search(r"\b(src|href|xlink:href)\s*=", text, re.I)
    assert "@import" not in text and "url(" not in text
    assert set(re.findall(r"https?://[^\s\"'<>]+", text)) == {prometheus["url"]}


def test_filters_narrow_every_panel_and_escape_values(prometheus, tmp_path, capsys):
    code, text, out, _ = snapshot(prometheus, tmp_path, capsys, "--group", EVIL)
    assert code == 0, out
    tables = Tables(text).tables
    assert [r[:4] for r in tables["worst-partitions"][1:]] == [[EVIL, "payments", "1", "70"],
                                                              [EVIL, "payments", "0", "50"]]
    assert "orders-app" not in text.split("<details>")[0]
    assert tables["replication"][1][:2] == ["orders", "2"]  # partitions carry no group: all kept
    assert "job up" in out
    assert "group = " + EVIL in out

    code, text, out, _ = snapshot(prometheus, tmp_path, capsys, "--topic", "orders", "--topic", "audit")
    assert code == 0
    assert {r[1] for r in Tables(text).tables["worst-partitions"][1:]} == {"orders", "audit"}

    code, text, out, _ = snapshot(prometheus, tmp_path, capsys, "--cluster", "no-such-cluster")
    assert code == 0
    assert "no data in this range" in text and "worst-partitions" not in text
    assert "Consumer lag: no data at the end of the range" in out


def test_a_range_without_data_renders_no_data(prometheus, tmp_path, capsys):
    code, text, out, err = snapshot(prometheus, tmp_path, capsys, end=prometheus["t0"] - 5 * 3600)
    assert code == 0, err
    assert text.count("no data in this range") >= 5
    assert "Replication: no data at the end of the range" in out
    assert "no kafka_monitor_job_up" in out


def test_default_end_is_now_and_step_is_auto(prometheus, tmp_path, capsys):
    code, text, out, err = snapshot(prometheus, tmp_path, capsys, "--since", "6h", end=None)
    assert code == 0, err
    assert "(6h, step 2m)" in text
    assert "orders-app" in text


def test_unreachable_prometheus_exits_2(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code = cli.main(["snapshot", "--prometheus", url, "--out", str(tmp_path / "x.html")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot reach Prometheus at {url}: " in err and "start it or pass --prometheus" in err
    assert not (tmp_path / "x.html").exists()


def test_render_to_png_with_chromium_when_there_is_one(page, tmp_path):
    """Optional: a picture of the page (for a human to look at); skipped without Chromium."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium) - the page is not rendered to PNG")
    png = page["path"].with_suffix(".png")
    p = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--user-data-dir=" + str(tmp_path / "profile"), "--window-size=1200,4200",
                        f"--screenshot={png}", page["path"].as_uri()],
                       capture_output=True, text=True, timeout=120, check=False)
    if not png.exists():  # a browser that cannot start here says nothing about the page
        pytest.skip(f"{browser} made no screenshot (exit {p.returncode}): {p.stderr[-500:]}")
    assert png.stat().st_size > 10_000
    print(f"\nsnapshot rendered to {png}")


def test_top_caps_every_chart_and_timeline_on_the_server(prometheus, tmp_path, capsys):
    code, text, out, err = snapshot(prometheus, tmp_path, capsys, "--top", "1", "--rows", "2")
    assert code == 0, err
    tables = Tables(text).tables
    assert [r[0] for r in tables["worst-partitions"][1:]] == ["orders-app", "orders-app"]
    assert "15 more partitions not shown" in text
    assert "13 more group/topic series not shown" in text
    # timelines keep the most recently active: the open UnderReplicated, of 3 alerted entities
    assert {r[0] for r in tables["alerts-job"][1:]} == {"UnderReplicated · topic orders partition 2"}
    assert "2 more rows not shown" in text
    assert [r[1] for r in tables["alerts-prometheus"][1:]] == ["pending", "firing"]
    assert "1 more rows not shown" in text
