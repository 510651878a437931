"""Configuration layering: defaults < file < environment < flags; errors name the setting."""

from __future__ import annotations

import pytest

from kafka_monitor.config import ConfigError, build, read_file
from monitor.probe_config import ProbeConfig
from streaming.job import JobConfig


def test_precedence_and_property_tables(tmp_path):
    f = tmp_path / "km.toml"
    f.write_text('[probe]\nbootstrap_servers = "file:9092"\ninterval_s = 30\ncluster = "from-file"\n'
                 '[probe.kafka]\n"security.protocol" = "SASL_SSL"\n"sasl.username" = "file-user"\n')
    env = {"KAFKA_MONITOR_PROBE_INTERVAL_S": "20", "KAFKA_MONITOR_PROBE_KAFKA_SASL_USERNAME": "env-user",
           "KAFKA_MONITOR_PROBE_KAFKA_SASL_PASSWORD": "s3cret", "UNRELATED": "x"}
    cfg = build(ProbeConfig, "probe", file_data=read_file(str(f)), env=env, flags={"interval_s": 5.0, "cluster": None})
    assert cfg.bootstrap_servers == "file:9092"
    assert cfg.interval_s == 5.0            # flag beats env beats file
    assert cfg.cluster == "from-file"       # a flag left unset does not override
    assert cfg.kafka == {"security.protocol": "SASL_SSL", "sasl.username": "env-user", "sasl.password": "s3cret"}
    assert cfg.offsets_via == "list_offsets"  # default


@pytest.mark.parametrize("file_text, env, flags, message", [
    ("[probe]\nbootstrap_server = 'x'\n", {}, {}, "probe.bootstrap_server: unknown setting"),
    ("", {"KAFKA_MONITOR_PROBE_INTERVALL": "3"}, {"bootstrap_servers": "x"}, "has no setting 'intervall'"),
    ("", {"KAFKA_MONITOR_PROBE_INTERVAL_S": "soon"}, {"bootstrap_servers": "x"}, "probe.interval_s: must be a number"),
    ("", {}, {}, "probe.bootstrap_servers: required"),
    ("[probe]\nbootstrap_servers = 'x'\ninterval_s = -1\n", {}, {}, "probe.interval_s: must be > 0"),
    ("[probe]\nbootstrap_servers = 'x'\nkafka = 'nope'\n", {}, {}, "probe.kafka: must be a table"),
    ("", {"KAFKA_MONITOR_PROBE_CLUSTER": "prod/eu"}, {"bootstrap_servers": "x"},
     'probe.cluster: must not contain "/"'),
    ("[probe\n", {}, {}, "not valid TOML"),
    # a removed setting says so, and why
    ("[probe]\nbootstrap_servers = 'x'\nstats_interval_s = 5\n", {}, {},
     "probe.stats_interval_s: no longer a setting (leader epochs come with the offsets answers"),
    ("", {"KAFKA_MONITOR_PROBE_STATS_INTERVAL_S": "5"}, {"bootstrap_servers": "x"},
     "KAFKA_MONITOR_PROBE_STATS_INTERVAL_S: no longer a setting"),
])
def test_errors_name_the_setting(tmp_path, file_text, env, flags, message):
    f = tmp_path / "km.toml"
    f.write_text(file_text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build(ProbeConfig, "probe", file_data=read_file(str(f)), env=env, flags=flags)


def test_job_section_and_validation():
    cfg = build(JobConfig, "job", env={"KAFKA_MONITOR_JOB_BUCKETS": "32"},
                flags={"bootstrap_servers": "b:1", "checkpoint_dir": "/tmp/c"})
    assert cfg.buckets == 32 and cfg.state_store == "hdfs"
    with pytest.raises(ConfigError, match="job.state_store"):
        build(JobConfig, "job", env={}, flags={"bootstrap_servers": "b:1", "checkpoint_dir": "/c", "state_store": "s3"})
    with pytest.raises(ConfigError, match="job.buckets: must be an integer"):
        build(JobConfig, "job", env={"KAFKA_MONITOR_JOB_BUCKETS": "1.5"}, flags={"bootstrap_servers": "b", "checkpoint_dir": "/c"})


def test_job_source_and_fail_on_data_loss(tmp_path):
    base = {"bootstrap_servers": "b:1", "checkpoint_dir": "/c"}
    cfg = build(JobConfig, "job", env={}, flags=base)
    assert cfg.source == "python" and cfg.fail_on_data_loss is True  # defaults
    f = tmp_path / "km.toml"
    f.write_text('[job]\nsource = "spark-kafka"\nfail_on_data_loss = false\n')
    cfg = build(JobConfig, "job", file_data=read_file(str(f)), env={}, flags=base)
    assert cfg.source == "spark-kafka" and cfg.fail_on_data_loss is False
    cfg = build(JobConfig, "job", file_data=read_file(str(f)),
                env={"KAFKA_MONITOR_JOB_SOURCE": "python", "KAFKA_MONITOR_JOB_FAIL_ON_DATA_LOSS": "true"}, flags=base)
    assert cfg.source == "python" and cfg.fail_on_data_loss is True  # env beats file
    cfg = build(JobConfig, "job", env={"KAFKA_MONITOR_JOB_SOURCE": "python"},
                flags={**base, "source": "spark-kafka", "fail_on_data_loss": False})
    assert cfg.source == "spark-kafka" and cfg.fail_on_data_loss is False  # flag beats env
    with pytest.raises(ConfigError, match="job.source: must be one of python, spark-kafka"):
        build(JobConfig, "job", env={"KAFKA_MONITOR_JOB_SOURCE": "kafka"}, flags=base)
    with pytest.raises(ConfigError, match="job.fail_on_data_loss: must be true or false"):
        build(JobConfig, "job", env={"KAFKA_MONITOR_JOB_FAIL_ON_DATA_LOSS": "maybe"}, flags=base)


def test_missing_file_is_a_clear_error():
    with pytest.raises(ConfigError, match="not found"):
        read_file("/nonexistent/km.toml")


@pytest.mark.parametrize("env, message", [
    ({"KAFKA_MONITOR_JOB_MAX_EVENT_BYTES": "100"}, "job.max_event_bytes: must be in 1024..67108864"),
    ({"KAFKA_MONITOR_JOB_MAX_CLOCK_SKEW_S": "-1"}, "job.max_clock_skew_s: must be >= 0"),
    ({"KAFKA_MONITOR_JOB_STALL_TIMEOUT_S": "10"}, r"job.stall_timeout_s: must be 0 \(off\) or at least 3 triggers \(15s\)"),
])
def test_hostile_input_and_stall_settings_are_validated(env, message):
    base = {"bootstrap_servers": "b:1", "checkpoint_dir": "/c"}
    with pytest.raises(ConfigError, match=message):
        build(JobConfig, "job", env=env, flags=base)
    cfg = build(JobConfig, "job", env={"KAFKA_MONITOR_JOB_STALL_TIMEOUT_S": "0", "KAFKA_MONITOR_JOB_MAX_EVENT_BYTES": "2048"},
                flags=base)
    assert (cfg.stall_timeout_s, cfg.max_event_bytes, cfg.max_clock_skew_s) == (0, 2048, 300)
