"""[job.rules.*]: every rule threshold settable from the config file and the environment,
validated with errors that name the setting, handed to the state function, and listed in
docs/settings.md with its default."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

from kafka_monitor.config import ConfigError, build
from streaming.rules import group as rules_group
from streaming.rules import lag_config as rules_lag_config
from streaming.rules import notify as rules_notify
from streaming.rules import partition as rules_partition
from streaming.job import RULE_FAMILIES, JobConfig, JobConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = {"bootstrap_servers": "x:1", "checkpoint_dir": "/tmp/c"}


def job(rules=None, env=None) -> JobConfig:
    return build(JobConfig, "job", file_data={"job": {**BASE, **({"rules": rules} if rules else {})}}, env=env or {})


def test_file_and_environment_settings_reach_each_family_over_its_defaults():
    cfg = job({"lag": {"lag_high_offsets": 50_000, "lag_high_seconds": "none"}, "partition": {"hw_stall_ms": 120_000},
               "notify": {"isr_shrink_after_ms": 30_000}},
              env={"KAFKA_MONITOR_JOB_RULES_GROUP_SILENT_FACTOR": "5",
                   "KAFKA_MONITOR_JOB_RULES_LAG_STALL_AFTER_MS": "120000",
                   "KAFKA_MONITOR_JOB_RULES_NOTIFY_BROKER_DOWN_AFTER_MS": "60000"})
    r = cfg.rule_configs()
    assert r["lag"] == rules_lag_config.LagConfig(lag_high_offsets=50_000, lag_high_seconds=None, stall_after_ms=120_000)
    assert r["partition"] == rules_partition.PartitionRulesConfig(hw_stall_ms=120_000)
    assert r["group"] == rules_group.GroupRulesConfig(silent_factor=5.0)
    assert r["notify"] == rules_notify.NotifyConfig(isr_shrink_after_ms=30_000, broker_down_after_ms=60_000)
    assert r["notify"].holds_s()["IsrShrink"] == 30.0
    assert job().rule_configs() == {"lag": rules_lag_config.LagConfig(), "partition": rules_partition.PartitionRulesConfig(),
                                    "group": rules_group.GroupRulesConfig(), "notify": rules_notify.NotifyConfig()}


@pytest.mark.parametrize("rules, env, message", [
    ({"lag": {"window": 2}}, {}, "job.rules.lag.window: must be an integer within 3..64, got 2"),
    ({"lag": {"lag_high_ofsets": 1}}, {}, "job.rules.lag.lag_high_ofsets: unknown setting (settings: window, "),
    ({"lagg": {"window": 5}}, {}, "job.rules.lagg: unknown rule family (families: lag, partition, group, notify)"),
    ({"notify": {"broker_down_after_ms": -1}}, {}, "job.rules.notify.broker_down_after_ms: must be an integer >= 0"),
    ({"partition": {"hw_stall_ms": 0}}, {}, "job.rules.partition.hw_stall_ms: must be >= 1, got 0"),
    ({"group": {"silent_factor": 0.5}}, {}, "job.rules.group.silent_factor: must be >= 1"),
    (None, {"KAFKA_MONITOR_JOB_RULES_LAG_WINDOW": "ten"}, "job.rules.lag.window: must be an integer, got 'ten'"),
    ({"lag": 5}, {}, "job.rules: must be tables of settings"),
])
def test_a_wrong_setting_is_refused_by_its_name(rules, env, message):
    with pytest.raises((ConfigError, JobConfigError)) as e:
        job(rules, env)
    assert message in str(e.value)


def test_the_job_hands_the_settings_to_the_state_function(spark, monkeypatch):
    from streaming import job as job_module
    from streaming.ingest import parsing

    seen = {}
    real = job_module.st.make_state_function

    def capture(cfg, *a, **kw):
        seen["cfg"] = cfg
        return real(cfg, *a, **kw)
    monkeypatch.setattr(job_module.st, "make_state_function", capture)
    cfg = job({"lag": {"lag_high_offsets": 123}, "group": {"stuck_after_ms": 60_000}})
    job_module.stateful(spark.createDataFrame([], parsing.FLAT_DDL), cfg)
    assert seen["cfg"].lag.lag_high_offsets == 123 and seen["cfg"].group.stuck_after_ms == 60_000
    assert seen["cfg"].partition == rules_partition.PartitionRulesConfig()


def test_the_settings_doc_lists_every_setting_with_its_default():
    doc = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    for family, cls in RULE_FAMILIES.items():
        for f in dataclasses.fields(cls):
            d = f.default
            shown = "none" if d is None else f"{d:,}" if isinstance(d, int) else f"{d:g}"
            row = rf"\| `\[job\.rules\.{family}\]` \| `{f.name}` \| {re.escape(shown)} \|"
            assert re.search(row, doc), f"docs/settings.md: no row for [job.rules.{family}] {f.name} = {shown}"
