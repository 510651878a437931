"""The alerting path of ``bench/detection_bench.py``: a real Prometheus and a real Alertmanager.

    job /metrics --scrape--> Prometheus (the shipped rules, unmodified) --> Alertmanager
      (the shipped route tree, timings and inhibit rules; every receiver a webhook)
      --> WebhookRecorder (this process, 127.0.0.1): each notification and when it arrived

Prometheus gets the shipped ``deploy/prometheus/prometheus.yml``'s ``global`` section (scrape and
evaluation intervals), its ``rule_files`` (resolved against that file's directory) and its
``kafka-monitor`` scrape job, aimed at the bench's job; Alertmanager gets a copy of
``deploy/alertmanager/alertmanager.yml`` in which only the receivers are replaced (a webhook to
the recorder, resolved notifications included).  Both bind free loopback ports, run as child
processes in their own process groups with a parent-death signal, and are stopped by PID.  An
``AlertmanagerPoller`` records Alertmanager's own view of each alert every 2 s (active,
suppressed by an inhibit rule), so an episode that did not notify because an inhibit rule held it
is told apart from one that never fired.

Needs the Debian packages ``prometheus`` and ``prometheus-alertmanager`` (binaries
``prometheus``, ``prometheus-alertmanager`` or ``alertmanager``) and ruamel.yaml (the project's
dev extra) to read the shipped configs.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
#: the scrape job of the shipped Prometheus config that scrapes the streaming job
JOB_NAME = "kafka-monitor"


class PrerequisiteError(RuntimeError):
    """A binary or a module the alerting path needs is missing."""


def binaries() -> dict[str, Optional[str]]:
    return {"prometheus": shutil.which("prometheus"),
            "alertmanager": shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")}


def check_prerequisites() -> dict[str, str]:
    """The Prometheus and Alertmanager binaries (raises ``PrerequisiteError`` naming the Debian
    packages when one is missing, and ruamel.yaml when it cannot be imported)."""
    found = binaries()
    missing = []
    if found["prometheus"] is None:
        missing.append("'prometheus' (Debian package prometheus)")
    if found["alertmanager"] is None:
        missing.append("'prometheus-alertmanager' or 'alertmanager' (Debian package prometheus-alertmanager)")
    if missing:
        raise PrerequisiteError("the detection bench measures notifications through a real Prometheus and "
                                "Alertmanager; not on PATH: " + ", ".join(missing)
                                + ". Install them (apt-get install -y prometheus prometheus-alertmanager).")
    try:
        import ruamel.yaml  # noqa: F401
    except ImportError:
        raise PrerequisiteError("the bench reads the shipped Prometheus and Alertmanager configs with "
                                "ruamel.yaml, which is not installed (the project's dev extra: "
                                "pip install -e '.[dev]')") from None
    return {k: v for k, v in found.items() if v is not None}


def _version(binary: str) -> Optional[str]:
    try:
        p = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
        out = (p.stdout or p.stderr or "").strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


# ----------------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------------

def load_yaml(path: pathlib.Path) -> Any:
    from ruamel.yaml import YAML
    return YAML(typ="safe", pure=True).load(pathlib.Path(path).read_text(encoding="utf-8"))


def dump_yaml(doc: Any) -> str:
    from ruamel.yaml import YAML
    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    buf = io.StringIO()
    y.dump(doc, buf)
    return buf.getvalue()


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "y": 365 * 86400.0}


def duration_s(value: Any) -> Optional[float]:
    """A Prometheus / Alertmanager duration ("15s", "1h30m", "0s") in seconds; None if unset."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def prometheus_config(metrics_port: int, am_port: int, shipped: pathlib.Path = PROM_CONFIG) -> tuple[dict, dict]:
    """The bench's Prometheus config from the shipped one: its ``global`` section as is, its
    ``rule_files`` as absolute paths (the shipped rules, unmodified), its ``kafka-monitor`` scrape
    job's settings aimed at 127.0.0.1:``metrics_port``, and the bench's Alertmanager.  Returns the
    config and its timings in seconds (defaults where the shipped file leaves one unset)."""
    src = load_yaml(shipped)
    base = shipped.resolve().parent
    glob = dict(src.get("global") or {})
    jobs = [dict(j) for j in src.get("scrape_configs") or [] if j.get("job_name") == JOB_NAME]
    if not jobs:
        raise ValueError(f"{shipped}: no scrape job named {JOB_NAME!r}")
    job = jobs[0]
    static = (job.get("static_configs") or [{}])[0]
    job["static_configs"] = [{**{k: v for k, v in static.items() if k != "targets"},
                              "targets": [f"127.0.0.1:{metrics_port}"]}]
    rule_files = [str(f if pathlib.Path(f).is_absolute() else base / f) for f in src.get("rule_files") or []]
    am_src = ((src.get("alerting") or {}).get("alertmanagers") or [{}])[0]
    am = {**{k: v for k, v in am_src.items() if k != "static_configs"},
          "static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}
    cfg = {"global": glob, "rule_files": rule_files, "alerting": {"alertmanagers": [am]}, "scrape_configs": [job]}
    scrape = duration_s(job.get("scrape_interval") or glob.get("scrape_interval") or "1m")
    settings = {"source": str(shipped.relative_to(ROOT)) if shipped.is_relative_to(ROOT) else str(shipped),
                "scrape_interval_s": scrape,
                "scrape_timeout_s": duration_s(job.get("scrape_timeout") or glob.get("scrape_timeout") or "10s"),
                "evaluation_interval_s": duration_s(glob.get("evaluation_interval") or "1m"),
                "rule_files": [str(pathlib.Path(f).relative_to(ROOT)) if pathlib.Path(f).is_relative_to(ROOT) else f
                               for f in rule_files]}
    return cfg, settings


def alertmanager_config(webhook_url: str, shipped: pathlib.Path = AM_CONFIG) -> tuple[dict, dict]:
    """The shipped Alertmanager config with every receiver replaced by a webhook to
    ``webhook_url``/<receiver name> (resolved notifications included); the route tree, its
    timings and the inhibit rules unchanged.  Returns the config and the top route's timings."""
    cfg = load_yaml(shipped)
    receivers = cfg.get("receivers") or []
    cfg["receivers"] = [{"name": r["name"],
                         "webhook_configs": [{"url": f"{webhook_url}/{r['name']}", "send_resolved": True}]}
                        for r in receivers]
    route = cfg.get("route") or {}

    def routes(r: dict, depth: int = 0) -> list[dict]:
        out = [{"depth": depth, "matchers": r.get("matchers"), "receiver": r.get("receiver"),
                "group_by": r.get("group_by"), "group_wait": r.get("group_wait"),
                "group_interval": r.get("group_interval"), "repeat_interval": r.get("repeat_interval")}]
        for sub in r.get("routes") or []:
            out += routes(sub, depth + 1)
        return out

    settings = {"source": str(shipped.relative_to(ROOT)) if shipped.is_relative_to(ROOT) else str(shipped),
                # Alertmanager's defaults where the top route leaves one unset
                "group_wait_s": duration_s(route.get("group_wait") or "30s"),
                "group_interval_s": duration_s(route.get("group_interval") or "5m"),
                "repeat_interval_s": duration_s(route.get("repeat_interval") or "4h"),
                "routes": routes(route), "inhibit_rules": cfg.get("inhibit_rules") or [],
                "receivers": [r["name"] for r in receivers]}
    return cfg, settings


_AGG = re.compile(r"\b(?:sum|min|max|avg|count|group|stddev|stdvar|topk|bottomk|quantile|count_values)"
                  r"\s+(by|without)\s*\(([^)]*)\)")


def rule_summary(rule_files: list[str]) -> dict[str, list[dict]]:
    """Per alert name, each of its rules: ``for:`` and ``keep_firing_for:`` in seconds, its
    static labels, and the labels its outermost aggregation keeps (``by (...)``; None when the
    expression does not start with one) -- the entity an alert of that rule is about."""
    import glob
    out: dict[str, list[dict]] = {}
    for pattern in rule_files:
        for path in sorted(glob.glob(pattern)):
            for g in (load_yaml(pathlib.Path(path)) or {}).get("groups") or []:
                for r in g.get("rules") or []:
                    if "alert" not in r:
                        continue
                    m = _AGG.search(r.get("expr") or "")
                    by = [x.strip() for x in m.group(2).split(",") if x.strip()] if m and m.group(1) == "by" else None
                    out.setdefault(r["alert"], []).append(
                        {"group": g.get("name"), "for_s": duration_s(r.get("for")) or 0.0,
                         "keep_firing_for_s": duration_s(r.get("keep_firing_for")) or 0.0,
                         "labels": {k: str(v) for k, v in (r.get("labels") or {}).items()}, "by": by})
    return out


# ----------------------------------------------------------------------------------------------
# the processes and the recorder
# ----------------------------------------------------------------------------------------------

class WebhookRecorder:
    """An HTTP server on 127.0.0.1 (a free port) that records every Alertmanager webhook
    notification: when it arrived (``time.time()``), the receiver, the group's status and key,
    and each alert's labels, status, startsAt and endsAt."""

    def __init__(self):
        self.notifications: list[dict] = []
        self.errors = 0
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802  (http.server's name)
                t = time.time()
                try:
                    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    msg = json.loads(body)
                    rec = {"t": t, "receiver": msg.get("receiver"), "path": self.path, "status": msg.get("status"),
                           "group_key": msg.get("groupKey"), "group_labels": msg.get("groupLabels"),
                           "truncated_alerts": msg.get("truncatedAlerts", 0),
                           "alerts": [{"labels": a.get("labels") or {}, "status": a.get("status"),
                                       "startsAt": a.get("startsAt"), "endsAt": a.get("endsAt"),
                                       "fingerprint": a.get("fingerprint")} for a in msg.get("alerts") or []]}
                    with recorder._lock:
                        recorder.notifications.append(rec)
                    self.send_response(200)
                except Exception:  # noqa: BLE001  (a malformed body: counted, answered 400)
                    with recorder._lock:
                        recorder.errors += 1
                    self.send_response(400)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="bench-webhook", daemon=True)

    def start(self) -> "WebhookRecorder":
        self._thread.start()
        return self

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.notifications)

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class AlertmanagerServer:
    """A real Alertmanager on 127.0.0.1 (free port), clustering off, its data and log under
    ``workdir``; stopped by its PID."""

    def __init__(self, binary: str, config_text: str, workdir: pathlib.Path):
        from kafka_monitor.local.broker import free_port
        self.binary = binary
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "alertmanager.yml"
        self.config_path.write_text(config_text, encoding="utf-8")
        self.log_path = self.workdir / "alertmanager.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 60.0) -> "AlertmanagerServer":
        from kafka_monitor.local.broker import popen_dying_with_parent
        with open(self.log_path, "ab") as log:
            self.proc = popen_dying_with_parent(
                [self.binary, f"--config.file={self.config_path}", f"--storage.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"alertmanager exited with code {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                        if resp.status == 200:
                            return self
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"alertmanager on {self.url} not ready after {timeout:.0f}s:\n{self.log_tail()}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 10.0) -> None:
        from kafka_monitor.local.broker import stop_process
        proc, self.proc = self.proc, None
        stop_process(proc, timeout)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


class AlertmanagerPoller(threading.Thread):
    """GET /api/v2/alerts every ``interval`` s: per alert (labels and startsAt), when it was
    first and last listed, first listed active, and first and last listed as suppressed by an
    inhibit rule (``status.inhibitedBy``)."""

    def __init__(self, url: str, stop: threading.Event, interval: float = 2.0):
        super().__init__(name="bench-alertmanager-poller", daemon=True)
        self.url, self._halt, self.interval = url, stop, interval
        self.alerts: dict[tuple, dict] = {}
        self.polls = 0
        self.failures = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._halt.is_set():
            t0 = time.time()
            try:
                with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=5) as resp:
                    listed = json.load(resp)
            except Exception:  # noqa: BLE001
                self.failures += 1
                self._halt.wait(self.interval)
                continue
            t = time.time()
            self.polls += 1
            with self._lock:
                for a in listed:
                    labels = a.get("labels") or {}
                    key = (tuple(sorted(labels.items())), a.get("startsAt"))
                    d = self.alerts.get(key)
                    if d is None:
                        d = self.alerts[key] = {"labels": labels, "startsAt": a.get("startsAt"), "first_seen": t,
                                                "last_seen": t, "active_first": None, "inhibited_first": None,
                                                "inhibited_last": None, "inhibited_by": []}
                    d["last_seen"] = t
                    st = a.get("status") or {}
                    if st.get("state") == "active" and d["active_first"] is None:
                        d["active_first"] = t
                    if st.get("inhibitedBy"):
                        if d["inhibited_first"] is None:
                            d["inhibited_first"] = t
                        d["inhibited_last"] = t
                        for fp in st["inhibitedBy"]:
                            if fp not in d["inhibited_by"]:
                                d["inhibited_by"].append(fp)
            self._halt.wait(max(0.0, self.interval - (time.time() - t0)))

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [dict(d) for d in self.alerts.values()]


class NotifyStack:
    """Webhook recorder, Alertmanager and Prometheus for one run: ``start`` registers their stop
    on the caller's ExitStack (so a failure anywhere stops them); ``finish`` snapshots what was
    recorded and stops them by PID."""

    def __init__(self, workdir: pathlib.Path, metrics_port: int, log: Any = None):
        self.workdir = pathlib.Path(workdir)
        self.metrics_port = metrics_port
        self.log = log
        self.webhook: Optional[WebhookRecorder] = None
        self.am: Optional[AlertmanagerServer] = None
        self.prom: Any = None
        self.poller: Optional[AlertmanagerPoller] = None
        self._poll_stop = threading.Event()
        self.setup: dict[str, Any] = {}

    def start(self, stack: ExitStack) -> "NotifyStack":
        from tests.support.prometheus import PrometheusServer
        found = check_prerequisites()
        stack.callback(self.stop)
        t = time.time()
        self.webhook = WebhookRecorder().start()
        am_cfg, am_settings = alertmanager_config(self.webhook.url)
        self.am = AlertmanagerServer(found["alertmanager"], dump_yaml(am_cfg), self.workdir / "alertmanager")
        self.am.start()
        prom_cfg, prom_settings = prometheus_config(self.metrics_port, self.am.port)
        self.prom = PrometheusServer(dump_yaml(prom_cfg), self.workdir / "prometheus", binary=found["prometheus"])
        self.prom.start(timeout=90)
        self.poller = AlertmanagerPoller(self.am.url, self._poll_stop)
        self.poller.start()
        self.setup = {
            "prometheus": {**prom_settings, "version": _version(found["prometheus"]), "url": self.prom.url,
                           "config": dump_yaml(prom_cfg)},
            "alertmanager": {**am_settings, "version": _version(found["alertmanager"]), "url": self.am.url,
                             "config": dump_yaml(am_cfg)},
            "webhook": self.webhook.url,
            "rules": rule_summary(prom_cfg["rule_files"]),
            "started_at": t, "ready_s": time.time() - t,
        }
        if self.log is not None:
            self.log.info("alerting: prometheus %s (scrape %ss, evaluation %ss), alertmanager %s, webhook %s",
                          self.prom.url, prom_settings["scrape_interval_s"], prom_settings["evaluation_interval_s"],
                          self.am.url, self.webhook.url)
        return self

    def check(self) -> Optional[str]:
        """None while Prometheus and Alertmanager run, else what exited."""
        for name, srv in (("prometheus", self.prom), ("alertmanager", self.am)):
            if srv is not None and srv.proc is not None and srv.proc.poll() is not None:
                return f"{name} exited with code {srv.proc.returncode}:\n{srv.log_tail()}"
        return None

    def finish(self) -> tuple[list[dict], dict]:
        """The notifications, and the setup with Alertmanager's view of each alert, Prometheus's
        rule and target health at the end; then everything stops."""
        until = time.time()
        health: dict[str, Any] = {}
        try:
            health["rules_not_ok"] = [{"group": g["name"], "rule": r.get("name"), "health": r.get("health"),
                                       "error": r.get("lastError")}
                                      for g in self.prom.rule_groups() for r in g.get("rules", [])
                                      if r.get("health") not in ("ok", "unknown")]
            health["targets"] = [{"job": t.get("labels", {}).get("job"), "health": t.get("health"),
                                  "error": t.get("lastError")} for t in self.prom.targets()]
        except Exception as e:  # noqa: BLE001
            health["error"] = repr(e)
        exited = self.check()
        notifications = self.webhook.snapshot() if self.webhook else []
        self._poll_stop.set()
        setup = {**self.setup, "recorded_until": until, "prometheus_health": health, "exited": exited,
                 "am_alerts": self.poller.snapshot() if self.poller else [],
                 "am_polls": self.poller.polls if self.poller else 0,
                 "am_poll_failures": self.poller.failures if self.poller else 0,
                 "webhook_errors": self.webhook.errors if self.webhook else 0}
        self.stop()
        return notifications, setup

    def stop(self) -> None:
        self._poll_stop.set()
        if self.prom is not None:
            self.prom.stop()
        if self.am is not None:
            self.am.stop()
        if self.webhook is not None:
            self.webhook.close()
            self.webhook = None
