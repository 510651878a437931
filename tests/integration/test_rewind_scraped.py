"""A rewind that recovers within one micro-batch still pages, through a real Prometheus.

The job's gauges carry each entity's state after a whole micro-batch.  A consumer whose
committed offset goes back (confirmed at two observations) and is past its old offset by the
next one used to be REWIND for that one observation only: inside one batch the gauge never
showed it, and the shipped ConsumerLagStatus{status="REWIND"} rule never fired.  The lag rules
now hold REWIND for ``[job.rules.lag] rewind_hold_ms`` from when it is first seen.

Here: the state function folds such a batch (the hold's default, and without it), the exporter
serves the result, and a real Prometheus scrapes it every second with the shipped rules file
evaluated every second: the REWIND alert fires with the hold; without it the gauge is OK.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from streaming.rules.lag_config import LagConfig
from streaming.sinks.batch import sink_rows
from streaming.sinks.exporter import Exporter
from streaming.state import function as st
from tests.conftest import wait_for
from tests.support.prometheus import PrometheusServer
from tests.support.state_fakes import FakeState, call, goff, rows

pytestmark = pytest.mark.integration

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules" / "kafka-monitor.rules.yml"

#: observations 10 s apart in one batch: keeping up 50 behind, a reset to a lower offset
#: confirmed at the second lower observation (70 s), past the old offset again at 80 s
REWIND_THEN_BACK = ([(1000 * i, 1000 * i + 50) for i in range(6)]
                    + [(1000, 6050), (2000, 7050), (8000, 8050)])


def _batch() -> object:
    return rows(*[goff(i + 1, 10_000 * i, c, hw) for i, (c, hw) in enumerate(REWIND_THEN_BACK)])


def _exported(lag: LagConfig) -> tuple[Exporter, list]:
    fn = st.make_state_function(st.StateConfig(run_id="r", lag=lag))
    out = call(fn, 0, _batch(), FakeState())
    exporter = Exporter()
    exporter.apply(sink_rows(pa.Table.from_pandas(out, preserve_index=False)), batch_id=0)
    alerts = out[out.kind == "alert"]
    return exporter, list(zip(alerts.alert, alerts.action, alerts.evidence.map(lambda e: json.loads(e)["status"])))


def _status(exporter: Exporter) -> float:
    return exporter.registry.get_sample_value("kafka_monitor_group_partition_lag_status", {
        "cluster": "k", "group": "g", "topic": "t", "partition": "0"})


def test_without_the_hold_the_batch_ends_ok_and_the_gauge_never_shows_rewind():
    exporter, transitions = _exported(LagConfig(rewind_hold_ms=0))
    assert transitions == [("ConsumerLagStatus", "open", "REWIND"), ("ConsumerLagStatus", "resolve", "OK")]
    assert _status(exporter) == 0  # OK: what the rule reads never says REWIND


def test_a_rewind_back_by_the_next_observation_fires_the_rewind_rule(tmp_path):
    exporter, transitions = _exported(LagConfig())
    assert transitions == [("ConsumerLagStatus", "open", "REWIND")]  # resolved when the hold ends
    assert _status(exporter) == 4  # REWIND
    port = exporter.serve(0)
    try:
        config = ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                  f"rule_files:\n  - {json.dumps(str(RULES))}\n"
                  "scrape_configs:\n  - job_name: kafka-monitor\n"
                  f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
        with PrometheusServer(config, tmp_path / "prometheus") as prom:
            def firing():
                data = prom.get("/api/v1/alerts")
                got = [a for a in (data or {}).get("alerts", [])
                       if a["labels"].get("alertname") == "ConsumerLagStatus" and a["state"] == "firing"]
                return got or None

            (alert,) = wait_for(firing, timeout=60, what="ConsumerLagStatus REWIND to fire in Prometheus")
            assert {k: alert["labels"][k] for k in ("status", "severity", "cluster", "group", "topic")} == {
                "status": "REWIND", "severity": "critical", "cluster": "k", "group": "g", "topic": "t"}
    finally:
        exporter.shutdown()
