"""The command line: every subcommand explains itself; bad settings exit 2 with a message."""

from __future__ import annotations

import json
import logging

import pytest

from kafka_monitor import cli


@pytest.mark.parametrize("argv", [[], ["demo"], ["probe"], ["job"], ["schema"]])
def test_help_explains(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv + ["--help"])
    assert e.value.code == 0
    assert len(capsys.readouterr().out) > 200


@pytest.mark.parametrize("argv, message", [
    (["probe"], "probe.bootstrap_servers: required"),
    (["probe", "--bootstrap-servers", "x:1", "--interval", "0"], "probe.interval_s: must be > 0"),
    (["probe", "--bootstrap-servers", "x:1", "--metadata-snapshot", "-1"], "probe.metadata_snapshot_s: must be >= 0"),
    (["probe", "--bootstrap-servers", "x:1", "-X", "novalue"], "expects key=value"),
    (["job", "--bootstrap-servers", "x:1"], "job.checkpoint_dir: required"),
    (["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c", "--buckets", "0"], "job.buckets"),
    (["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c", "--source", "kafka"], "invalid choice: 'kafka'"),
    (["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c", "--source", "spark-kafka",
      "--starting-offsets", "{nope"], "job.starting_offsets: must be earliest, latest or JSON"),
])
def test_bad_settings_exit_2_with_the_setting_named(argv, message, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
        err = str(e.code) + capsys.readouterr().err
    else:
        err = capsys.readouterr().err
    assert code == 2
    assert message in err


def test_schema_prints_the_contract(capsys):
    assert cli.main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out)["$id"] == "kafka-monitor/v3"


def test_json_log_lines():
    rec = logging.LogRecord("monitor.probe", logging.WARNING, __file__, 1, "lost %s", ("broker 2",), None)
    line = json.loads(cli.JsonFormatter().format(rec))
    assert line["level"] == "WARNING" and line["message"] == "lost broker 2" and line["logger"] == "monitor.probe"


@pytest.mark.parametrize("argv, source, fail_on_data_loss", [
    ([], "python", True),
    (["--source", "spark-kafka", "--no-fail-on-data-loss"], "spark-kafka", False),
    (["--source", "python", "--fail-on-data-loss"], "python", True),
])
def test_job_source_flags(monkeypatch, argv, source, fail_on_data_loss):
    import signal

    import streaming.job

    seen = {}
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's handlers
    monkeypatch.setattr(streaming.job, "run", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    assert cli.main(["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c", *argv]) == 0
    assert (seen["cfg"].source, seen["cfg"].fail_on_data_loss) == (source, fail_on_data_loss)


def test_job_max_series_flag_reaches_the_config(monkeypatch):
    import signal

    import streaming.job

    seen = {}
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(streaming.job, "run", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    assert cli.main(["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c", "--max-series", "700000"]) == 0
    assert seen["cfg"].max_series == 700_000
    assert seen["cfg"].metrics_granularity == "partition"
    seen.clear()
    assert cli.main(["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c",
                     "--metrics-granularity", "topic"]) == 0
    assert seen["cfg"].metrics_granularity == "topic"


def test_a_wrong_metrics_granularity_names_the_setting():
    from streaming.job import JobConfig, JobConfigError

    with pytest.raises(JobConfigError, match="job.metrics_granularity: must be one of partition, topic, got 'topc'"):
        JobConfig(bootstrap_servers="x:1", checkpoint_dir="/tmp/c", metrics_granularity="topc").validate()


def test_job_hostile_input_and_stall_flags_reach_the_config(monkeypatch):
    import signal

    import streaming.job

    seen = {}
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(streaming.job, "run", lambda cfg, **kw: seen.update(cfg=cfg, **kw))
    assert cli.main(["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c"]) == 0
    assert (seen["cfg"].max_event_bytes, seen["cfg"].max_clock_skew_s, seen["cfg"].stall_timeout_s) == (65_536, 300, 600)
    assert callable(seen["hard_exit"])  # a stuck JVM cannot keep the process alive
    assert cli.main(["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c", "--max-event-bytes", "4096",
                     "--max-clock-skew", "0", "--stall-timeout", "60"]) == 0
    assert (seen["cfg"].max_event_bytes, seen["cfg"].max_clock_skew_s, seen["cfg"].stall_timeout_s) == (4096, 0, 60)
    assert seen["cfg"].limits() == streaming.job.parsing.Limits(max_event_bytes=4096, max_clock_skew_ms=0)


def test_a_failed_query_exits_1_with_the_reason(monkeypatch, capsys):
    import signal

    import streaming.job

    def fail(cfg, **kw):
        raise streaming.job.JobFailed("streaming query failed: boom")

    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(streaming.job, "run", fail)
    assert cli.main(["job", "--bootstrap-servers", "x:1", "--checkpoint", "/tmp/c"]) == 1
    assert "error: job failed: streaming query failed: boom" in capsys.readouterr().err
