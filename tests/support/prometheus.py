"""Run a real Prometheus server (Debian package ``prometheus``) for a test and talk to its HTTP API.

    with PrometheusServer(config_text, workdir) as prom:     # started, ready, stopped at exit
        prom.query('up{job="kafka-monitor"}')                # -> list of samples
        prom.alerts()                                       # -> /api/v1/alerts

The server binds 127.0.0.1 on a free port, keeps its TSDB and log under ``workdir``, runs in
its own process group and is asked by the kernel to die with the test process
(PR_SET_PDEATHSIG); :meth:`stop` ends it by its PID (SIGTERM, then SIGKILL).  A server that
exits, or is not ready in time, raises :class:`PrometheusError` with the tail of its log
(a config or rules error, a port taken).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Optional

from kafka_monitor.local.broker import free_port, popen_dying_with_parent, stop_process

__all__ = ["PrometheusError", "PrometheusServer", "QueryError", "prometheus_binary"]


class PrometheusError(RuntimeError):
    """The server could not be started, exited, or answered with an error."""


class QueryError(PrometheusError):
    """Prometheus refused a query (``errorType`` bad_data: it does not parse, or cannot run)."""

    def __init__(self, expr: str, error_type: str, error: str):
        super().__init__(f"{error_type}: {error}\nquery: {expr}")
        self.expr, self.error_type, self.error = expr, error_type, error


def prometheus_binary() -> Optional[str]:
    """The ``prometheus`` server on PATH, or None (install the Debian package ``prometheus``)."""
    return shutil.which("prometheus")


class PrometheusServer:
    def __init__(self, config: str, workdir: Path, binary: Optional[str] = None, port: Optional[int] = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "prometheus.yml"
        self.config_path.write_text(config, encoding="utf-8")
        self.log_path = self.workdir / "prometheus.log"
        self.binary = binary or prometheus_binary()
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> "PrometheusServer":
        if self.binary is None:
            raise PrometheusError("'prometheus' is not on PATH: install the Debian package prometheus "
                                  "(apt-get install -y prometheus)")
        with open(self.log_path, "ab") as log:
            self.proc = popen_dying_with_parent(
                [self.binary, f"--config.file={self.config_path}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 f"--storage.tsdb.path={self.workdir / 'data'}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_running()
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise PrometheusError(f"prometheus on {self.url} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout)

    def __enter__(self) -> "PrometheusServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def _check_running(self) -> None:
        if self.proc is None:
            raise PrometheusError("prometheus is not running (start() was not called or stop() was)")
        if self.proc.poll() is not None:
            raise PrometheusError(f"prometheus exited with code {self.proc.returncode}:\n{self.log_tail()}")

    # -- HTTP API -----------------------------------------------------------------------------

    def get(self, path: str, params: Optional[list[tuple[str, str]]] = None, timeout: float = 10.0) -> Any:
        """GET an API path and return its ``data``; raises QueryError for a refused query and
        PrometheusError when the server has exited."""
        self._check_running()
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as e:  # 400/422/503 carry a JSON error body
            try:
                body = json.loads(e.read().decode("utf-8", "replace"))
            except ValueError:
                raise PrometheusError(f"GET {path}: HTTP {e.code}") from None
        if body.get("status") != "success":
            expr = dict(params or {}).get("query", path)
            raise QueryError(expr, body.get("errorType", "?"), body.get("error", "?"))
        return body["data"]

    def query(self, expr: str, at: Optional[float] = None) -> list[dict]:
        """An instant query, at the server's now or at Unix time ``at`` (to compare several
        queries at one instant): the result's samples (vector) or a one-item list for a scalar."""
        params = [("query", expr)] + ([("time", f"{at:.3f}")] if at is not None else [])
        data = self.get("/api/v1/query", params)
        if data["resultType"] == "vector":
            return data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise PrometheusError(f"unexpected result type {data['resultType']} for {expr!r}")

    def label_values(self, label: str, match: Optional[str] = None) -> list[str]:
        params = [("match[]", match)] if match else None
        return self.get(f"/api/v1/label/{urllib.parse.quote(label)}/values", params)

    def alerts(self) -> list[dict]:
        return self.get("/api/v1/alerts")["alerts"]

    def rule_groups(self) -> list[dict]:
        return self.get("/api/v1/rules")["groups"]

    def targets(self) -> list[dict]:
        return self.get("/api/v1/targets")["activeTargets"]
