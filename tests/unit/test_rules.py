"""The correctness proof for the replication half of the partition rules (IsrShrink,
UnderReplicated, OfflinePartition: ``rules.partition._replication``), eviction and the lag in
offsets: tables of observation sequences -> the transitions they must produce (and nothing
else)."""

from __future__ import annotations

import pytest

from streaming.rules import base as rules
from streaming.rules import lag as rules_lag
from streaming.rules import partition as rules_partition
from streaming.rules.base import Alert

E = "k/t/0"


def md(isr, replicas=(1, 2, 3), leader=1):
    return {"replicas": list(replicas), "isr": list(isr), "leader": leader}


def run(observations):
    """Feed partition_metadata observations at t = 1000, 2000, ...; return the transitions as
    (t, alert, action) and the final state."""
    s = rules_partition.new_partition("k", "t", 0)
    out = []
    for i, obs in enumerate(observations):
        t = (i + 1) * 1000
        out += [(x.at, x.alert, x.action) for x in rules_partition._replication(s, obs, t, E)]
    return out, s


CASES = [
    ("healthy partition raises nothing",
     [md([1, 2, 3]), md([1, 2, 3])], []),
    ("first observation already under-replicated: no shrink (no previous ISR), under-replicated opens",
     [md([1, 2])], [(1000, Alert.UNDER_REPLICATED, "open")]),
    ("a replica leaves the ISR: shrink and under-replicated open",
     [md([1, 2, 3]), md([1, 3])],
     [(2000, Alert.ISR_SHRINK, "open"), (2000, Alert.UNDER_REPLICATED, "open")]),
    ("it comes back: both resolve",
     [md([1, 2, 3]), md([1, 3]), md([1, 3, 2])],
     [(2000, Alert.ISR_SHRINK, "open"), (2000, Alert.UNDER_REPLICATED, "open"),
      (3000, Alert.ISR_SHRINK, "resolve"), (3000, Alert.UNDER_REPLICATED, "resolve")]),
    ("a second shrink while open does not open twice",
     [md([1, 2, 3]), md([1, 3]), md([1])],
     [(2000, Alert.ISR_SHRINK, "open"), (2000, Alert.UNDER_REPLICATED, "open")]),
    ("a partial return keeps both open",
     [md([1, 2, 3]), md([1]), md([1, 2])],
     [(2000, Alert.ISR_SHRINK, "open"), (2000, Alert.UNDER_REPLICATED, "open")]),
    ("reassignment that drops a replica from replicas and ISR is not a shrink",
     [md([1, 2, 3]), md([1, 2], replicas=(1, 2))], []),
    ("reassignment that adds a replica not yet in sync: under-replicated only",
     [md([1, 2, 3]), md([1, 2, 3], replicas=(1, 2, 3, 4))], [(2000, Alert.UNDER_REPLICATED, "open")]),
    ("ISR order changes are not shrinks",
     [md([1, 2, 3]), md([3, 2, 1])], []),
    ("leader lost: offline opens; leader back: resolves",
     [md([1, 2, 3]), md([1, 2, 3], leader=-1), md([1, 2, 3], leader=2)],
     [(2000, Alert.OFFLINE_PARTITION, "open"), (3000, Alert.OFFLINE_PARTITION, "resolve")]),
    ("single-replica partition (Tansu: replicas = ISR = [node]) is healthy",
     [md([111], replicas=(111,), leader=111)] * 3, []),
]


@pytest.mark.parametrize("name, observations, expected", CASES, ids=[c[0] for c in CASES])
def test_partition_rules(name, observations, expected):
    got, _ = run(observations)
    assert got == expected


def test_resolve_carries_the_id_of_the_open_and_evidence():
    s = rules_partition.new_partition("k", "t", 0)
    rules_partition._replication(s, md([1, 2, 3]), 1000, E)
    opened = rules_partition._replication(s, md([1, 3]), 2000, E)
    shrink = [t for t in opened if t.alert is Alert.ISR_SHRINK][0]
    assert shrink.evidence == {"isr_before": [1, 2, 3], "isr_after": [1, 3], "removed": [2], "replicas": [1, 2, 3]}
    # the one replica that left names the broker (Alertmanager inhibits it under that broker's alert)
    assert shrink.labels == {"cluster": "k", "topic": "t", "partition": 0, "broker": 2}
    assert shrink.severity is rules.Severity.WARNING
    closed = rules_partition._replication(s, md([1, 2, 3]), 5000, E)
    resolve = [t for t in closed if t.alert is Alert.ISR_SHRINK][0]
    assert resolve.alert_id == shrink.alert_id
    assert resolve.labels == shrink.labels  # the series it opened is the one it removes
    assert resolve.evidence["open_since"] == 2000
    # a new episode gets a new id
    again = [t for t in rules_partition._replication(s, md([2, 3]), 9000, E) if t.alert is Alert.ISR_SHRINK][0]
    assert again.alert_id != shrink.alert_id
    assert again.labels["broker"] == 1
    # two replicas gone at once: no single broker to blame
    both = [t for t in rules_partition._replication(s, md([3]), 9500, E) if t.alert is Alert.UNDER_REPLICATED]
    assert both == []  # UnderReplicated is open since 9000 (missing 1), labels unchanged
    t = rules_partition.new_partition("k", "t", 1)
    rules_partition._replication(t, md([1, 2, 3]), 1000, E)
    (under,) = [x for x in rules_partition._replication(t, md([1]), 2000, E) if x.alert is Alert.UNDER_REPLICATED]
    assert "broker" not in under.labels


def test_rules_are_deterministic():
    assert run(CASES[3][1]) == run(CASES[3][1])


def test_every_alert_has_a_severity_and_severities_are_ordered():
    assert set(rules.SEVERITY) == set(Alert)
    assert rules.Severity.INFO < rules.Severity.WARNING < rules.Severity.CRITICAL


@pytest.mark.parametrize("committed, hw, expected", [
    (None, 10, None),      # the group has committed nothing on this partition
    (5, None, None),       # HW not observed (partition not watched, or no fetch response yet)
    (5, 10, 5),
    (10, 10, 0),           # caught up
    (12, 10, 0),           # commit read after HW: clamp, never negative
    (0, 0, 0),             # empty partition
])
def test_lag_from_one_observation(committed, hw, expected):
    assert rules_lag.offset_lag(committed, hw) == expected


def test_eviction_resolves_open_alerts_of_a_vanished_entity():
    s = rules_partition.new_partition("k", "t", 0)
    rules_partition._replication(s, md([1, 2, 3]), 1000, E)
    rules_partition._replication(s, md([1]), 2000, E)
    assert rules.evict(s, 2000 + 60_000, 60_000, E, rules_partition.partition_labels(s)) is None  # still alive at the edge
    gone = rules.evict(s, 2001 + 60_000, 60_000, E, rules_partition.partition_labels(s))
    assert sorted((t.alert.value, t.action) for t in gone) == [("IsrShrink", "resolve"), ("UnderReplicated", "resolve")]
    assert s["open"] == {}
