"""The partition and topic rules' settings (``[job.rules.partition]``): thresholds of
streaming/rules/partition.py and topic.py, checked when built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


class PartitionRulesConfigError(ValueError):
    """An invalid ``PartitionRulesConfig``; the message names the setting."""


@dataclass(frozen=True)
class PartitionRulesConfig:
    """Thresholds of the partition and topic rules (milliseconds unless said otherwise)."""

    #: LeaderChanged resolves after this long without a further change.  5 min: an election and
    #: the clients' metadata refresh after it (metadata.max.age.ms defaults to 5 min) settle well
    #: within it, and a rolling restart's successive moves of one partition stay one episode.
    leader_quiet_ms: int = 300_000
    #: leader changes kept as evidence per LeaderChanged episode (the count is always exact).
    leader_history_max: int = 20
    #: consecutive observations with a lower leader epoch before they are believed (a re-created
    #: topic) rather than ignored as a stale view.
    epoch_reset_after: int = 3
    #: PreferredLeaderImbalance opens after the leader has not been the preferred replica this
    #: long.  5 min = Kafka's leader.imbalance.check.interval.seconds (300): an election briefly
    #: moves leadership, and auto.leader.rebalance.enable would have moved it back by then.
    imbalance_after_ms: int = 300_000
    #: HighWatermarkStalled: how long writes may be pending with a flat HW.  10 s: an acks=all
    #: write takes milliseconds; a follower that stops fetching holds it (and the HW) until the
    #: leader drops it from the ISR after replica.lag.time.max.ms (30 s by default), so the
    #: stall says so before IsrShrink does.
    hw_stall_ms: int = 10_000
    #: PartitionUnobserved window when the observing source's interval is unknown.  60 s = 3 x a
    #: 20 s interval: twice the probe's default interval (10 s) with room for a slow refresh.
    unobserved_after_ms: int = 60_000
    #: PartitionUnobserved window in observation intervals when the interval is known (3 =
    #: SourceSilent's convention: three missed rounds).
    unobserved_intervals: int = 3
    #: PartitionCountChanged stays open (collecting clients' catch-up times) this long.  15 min:
    #: longer than the slowest default refresh among Kafka clients (the old producer's
    #: topic.metadata.refresh.interval.ms = 10 min; metadata.max.age.ms = 5 min).
    count_change_window_ms: int = 900_000
    #: clients listed per PartitionCountChanged episode; further clients are only counted.
    count_change_clients_max: int = 50

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise PartitionRulesConfigError(f"partition_rules.{f.name}: must be an integer, got {v!r}")
            if v < 1:
                raise PartitionRulesConfigError(f"partition_rules.{f.name}: must be >= 1, got {v}")


DEFAULT_CONFIG = PartitionRulesConfig()
