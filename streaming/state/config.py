"""The state function's settings: the entity TTL, the tick, the run id, and each rule
family's thresholds (``[job.rules.<family>]``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from streaming.rules import client as rules_client
from streaming.rules import group as rules_group
from streaming.rules import lag_config as rules_lag_config
from streaming.rules import logdirs as rules_logdirs
from streaming.rules import partition_config as rules_partition_config
from streaming.rules import quorum as rules_quorum
from streaming.rules import source as rules_source
from streaming.rules import transactions as rules_transactions


@dataclass(frozen=True)
class StateConfig:
    entity_ttl_ms: int = 900_000
    #: how often a bucket without new events is woken to run the time-driven checks
    tick_ms: int = 30_000
    #: identifies this run of the job: an entity's gauges are sent to the exporter when they
    #: change, and once per run (a restarted job starts with an empty exporter)
    run_id: str = ""
    #: emit, per bucket and batch, the rows it received (an ``archive_block`` row: the event
    #: archive's, ``job.archive_dir``)
    archive: bool = False
    lag: rules_lag_config.LagConfig = field(default_factory=rules_lag_config.LagConfig)
    partition: rules_partition_config.PartitionRulesConfig = field(default_factory=rules_partition_config.PartitionRulesConfig)
    group: rules_group.GroupRulesConfig = field(default_factory=rules_group.GroupRulesConfig)
    client: rules_client.ClientRulesConfig = field(default_factory=rules_client.ClientRulesConfig)
    source: rules_source.SourceRulesConfig = field(default_factory=rules_source.SourceRulesConfig)
    quorum: rules_quorum.QuorumRulesConfig = field(default_factory=rules_quorum.QuorumRulesConfig)
    log_dirs: rules_logdirs.LogDirRulesConfig = field(default_factory=rules_logdirs.LogDirRulesConfig)
    transactions: rules_transactions.TransactionRulesConfig = field(
        default_factory=rules_transactions.TransactionRulesConfig)
