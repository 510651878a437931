"""[job.rules.*]: every rule threshold settable from the config file and the environment,
validated with errors that name the setting, handed to the state function, and listed in
docs/settings.md with its default."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

from kafka_monitor.config import ConfigError, build
from streaming.rules import client as rules_client
from streaming.rules import group as rules_group
from streaming.rules import lag_config as rules_lag_config
from streaming.rules import notify as rules_notify
from streaming.rules import partition_config as rules_partition_config
from streaming.rules import logdirs as rules_logdirs
from streaming.rules import quorum as rules_quorum
from streaming.rules import source as rules_source
from streaming.rules import transactions as rules_transactions
from streaming.job import MOVED_RULES, RULE_FAMILIES, STATE_FAMILIES, JobConfig, JobConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = {"bootstrap_servers": "x:1", "checkpoint_dir": "/tmp/c"}


def job(rules=None, env=None) -> JobConfig:
    return build(JobConfig, "job", file_data={"job": {**BASE, **({"rules": rules} if rules else {})}}, env=env or {})


def test_file_and_environment_settings_reach_each_family_over_its_defaults():
    cfg = job({"lag": {"lag_high_offsets": 50_000, "lag_high_seconds": "none"}, "partition": {"hw_stall_ms": 120_000},
               "notify": {"isr_shrink_after_ms": 30_000}, "client": {"metadata_stale_factor": 4}},
              env={"KAFKA_MONITOR_JOB_RULES_SOURCE_SILENT_FACTOR": "5",
                   "KAFKA_MONITOR_JOB_RULES_GROUP_STUCK_AFTER_MS": "60000",
                   "KAFKA_MONITOR_JOB_RULES_CLIENT_SILENCE_GRACE_MS": "0",
                   "KAFKA_MONITOR_JOB_RULES_LAG_STALL_AFTER_MS": "120000",
                   "KAFKA_MONITOR_JOB_RULES_NOTIFY_BROKER_DOWN_AFTER_MS": "60000"})
    r = cfg.rule_configs()
    assert r["lag"] == rules_lag_config.LagConfig(lag_high_offsets=50_000, lag_high_seconds=None, stall_after_ms=120_000)
    assert r["partition"] == rules_partition_config.PartitionRulesConfig(hw_stall_ms=120_000)
    assert r["group"] == rules_group.GroupRulesConfig(stuck_after_ms=60_000)
    assert r["client"] == rules_client.ClientRulesConfig(metadata_stale_factor=4.0, silence_grace_ms=0)
    assert r["source"] == rules_source.SourceRulesConfig(silent_factor=5.0)
    assert r["notify"] == rules_notify.NotifyConfig(isr_shrink_after_ms=30_000, broker_down_after_ms=60_000)
    assert r["notify"].holds_s()["IsrShrink"] == 30.0
    assert job().rule_configs() == {"lag": rules_lag_config.LagConfig(), "partition": rules_partition_config.PartitionRulesConfig(),
                                    "group": rules_group.GroupRulesConfig(), "client": rules_client.ClientRulesConfig(),
                                    "source": rules_source.SourceRulesConfig(), "quorum": rules_quorum.QuorumRulesConfig(),
                                    "log_dirs": rules_logdirs.LogDirRulesConfig(),
                                    "transactions": rules_transactions.TransactionRulesConfig(),
                                    "notify": rules_notify.NotifyConfig()}


@pytest.mark.parametrize("rules, env, message", [
    ({"lag": {"window": 2}}, {}, "job.rules.lag.window: must be an integer within 3..64, got 2"),
    ({"lag": {"lag_high_ofsets": 1}}, {}, "job.rules.lag.lag_high_ofsets: unknown setting (settings: window, "),
    ({"lagg": {"window": 5}}, {}, "job.rules.lagg: unknown rule family (families: lag, partition, group, client, "
                                  "source, quorum, log_dirs, transactions, notify)"),
    ({"notify": {"broker_down_after_ms": -1}}, {}, "job.rules.notify.broker_down_after_ms: must be an integer >= 0"),
    ({"partition": {"hw_stall_ms": 0}}, {}, "job.rules.partition.hw_stall_ms: must be >= 1, got 0"),
    ({"source": {"silent_factor": 0.5}}, {}, "job.rules.source.silent_factor: must be >= 1"),
    ({"client": {"refresh_storm_clear": 10}}, {}, "job.rules.client.refresh_storm_clear: must be within 0..refresh_storm_max-1 (9), got 10"),
    ({"group": {"silent_factor": 0.5}}, {}, "job.rules.group.silent_factor: must be >= 1"),  # its old place
    (None, {"KAFKA_MONITOR_JOB_RULES_GROUP_SILENCE_GRACE_MS": "-1"}, "job.rules.group.silence_grace_ms: must be >= 0"),
    (None, {"KAFKA_MONITOR_JOB_RULES_GROUP_HEARTBEAT_INTERVAL_DEFAULT_MS": "x"},
     "job.rules.group.heartbeat_interval_default_ms: must be an integer, got 'x'"),
    ({"client": {"silent_factor": 5}}, {}, "job.rules.client.silent_factor: unknown setting"),
    (None, {"KAFKA_MONITOR_JOB_RULES_LAG_WINDOW": "ten"}, "job.rules.lag.window: must be an integer, got 'ten'"),
    ({"lag": 5}, {}, "job.rules: must be tables of settings"),
])
def test_a_wrong_setting_is_refused_by_its_name(rules, env, message):
    with pytest.raises((ConfigError, JobConfigError)) as e:
        job(rules, env)
    assert message in str(e.value)


def test_the_job_hands_the_settings_to_the_state_function(spark, monkeypatch):
    from streaming import job as job_module
    from streaming.ingest import packing

    seen = {}
    real = job_module.st.make_state_function

    def capture(cfg, *a, **kw):
        seen["cfg"] = cfg
        return real(cfg, *a, **kw)
    monkeypatch.setattr(job_module.st, "make_state_function", capture)
    cfg = job({"lag": {"lag_high_offsets": 123}, "group": {"stuck_after_ms": 60_000},
               "client": {"refresh_storm_max": 20}, "source": {"silent_factor": 4}})
    job_module.stateful(spark.createDataFrame([], packing.PACKED_DDL), cfg)
    assert seen["cfg"].lag.lag_high_offsets == 123 and seen["cfg"].group.stuck_after_ms == 60_000
    assert seen["cfg"].client.refresh_storm_max == 20 and seen["cfg"].source.silent_factor == 4.0
    assert seen["cfg"].partition == rules_partition_config.PartitionRulesConfig()
    assert set(STATE_FAMILIES) == set(RULE_FAMILIES) - {"notify"}


def test_the_settings_doc_lists_every_setting_with_its_default():
    doc = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    for family, cls in RULE_FAMILIES.items():
        for f in dataclasses.fields(cls):
            d = f.default
            shown = "none" if d is None else f"{d:,}" if isinstance(d, int) else f"{d:g}"
            row = rf"\| `\[job\.rules\.{family}\]` \| `{f.name}` \| {re.escape(shown)} \|"
            assert re.search(row, doc), f"docs/settings.md: no row for [job.rules.{family}] {f.name} = {shown}"


def test_client_and_source_settings_at_their_old_place_are_still_read_with_a_warning(caplog):
    """Before [job.rules.client] and [job.rules.source], their settings were in [job.rules.group]:
    a config that still has them there works as before and says where they went."""
    with caplog.at_level("WARNING", logger="streaming.job"):
        cfg = job({"group": {"silent_factor": 5, "stuck_after_ms": 60_000, "silence_grace_ms": 0}},
                  env={"KAFKA_MONITOR_JOB_RULES_GROUP_METADATA_STALE_FACTOR": "3"})
    r = cfg.rule_configs()
    assert r["group"] == rules_group.GroupRulesConfig(stuck_after_ms=60_000)
    assert r["source"] == rules_source.SourceRulesConfig(silent_factor=5.0, silence_grace_ms=0)
    assert r["client"] == rules_client.ClientRulesConfig(metadata_stale_factor=3.0, silence_grace_ms=0)
    said = [m.getMessage() for m in caplog.records]
    assert len(said) == 3 and all(m.endswith("move it there (taken from here until then)") for m in said)
    assert ("job.rules.group.silent_factor: this setting is read from [job.rules.source] "
            "(KAFKA_MONITOR_JOB_RULES_SOURCE_SILENT_FACTOR) now") in said[1]
    assert "job.rules.group.silence_grace_ms: this setting is read from [job.rules.client] " in said[2]
    assert "and [job.rules.source] (KAFKA_MONITOR_JOB_RULES_SOURCE_SILENCE_GRACE_MS) now" in said[2]
    caplog.clear()
    with caplog.at_level("WARNING", logger="streaming.job"):
        assert job().rule_configs()["source"] == rules_source.SourceRulesConfig()
    assert not caplog.records


def test_a_setting_at_its_new_place_wins_over_its_old_place(caplog):
    with caplog.at_level("WARNING", logger="streaming.job"):
        cfg = job({"group": {"silent_factor": 5, "silence_grace_ms": 0}, "source": {"silent_factor": 4},
                   "client": {"silence_grace_ms": 1_000}})
    r = cfg.rule_configs()
    assert r["source"] == rules_source.SourceRulesConfig(silent_factor=4.0, silence_grace_ms=0)
    assert r["client"] == rules_client.ClientRulesConfig(silence_grace_ms=1_000)
    said = [m.getMessage() for m in caplog.records]
    assert said[0].endswith("(ignored here: [job.rules.source] sets it)")
    assert said[1].endswith("(taken from here for [job.rules.source] until then; [job.rules.client] sets its own)")


def test_every_moved_setting_is_at_its_new_place_only():
    for (old, name), families in MOVED_RULES.items():
        assert name not in {f.name for f in dataclasses.fields(RULE_FAMILIES[old])}, (old, name)
        for family in families:
            assert name in {f.name for f in dataclasses.fields(RULE_FAMILIES[family])}, (family, name)
