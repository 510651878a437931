"""Ground truth, the Prometheus-only baseline and the scoring of ``bench/detection_bench.py``.

Pure functions over what a run recorded (no clock, no I/O), so a run's raw record can be scored
again (``python bench/detection_bench.py --rescore <raw.json>``):

- ``records``: the controller's ``__cluster_metadata`` records (``KafkaCluster.dump_metadata_log``),
  each with its CreateTime (the active controller's wall clock, ms);
- ``polls``: admin polls of the consumer groups (every ~0.5 s: committed offsets, end offsets,
  the coordinator's group state and member count);
- ``log``: what the workload did and when (faults, consumers stopped/slowed/started, every
  member's ``on_assign``, scenario markers);
- ``episodes``: the monitor's alerts as seen on its ``/metrics`` (a series present = open) and
  as published on its alerts topic (the job's own ``at``, event time);
- ``notifications``: what Alertmanager sent (a real Prometheus with the shipped rules scraping the
  job, a real Alertmanager with the shipped routes, timings and inhibit rules, every receiver a
  webhook to the bench): each notification's receive time, status, and its alerts' labels,
  status and startsAt; with ``alerting``: the settings, the holds, the rules' ``for:`` and
  entity labels, and Alertmanager's own view of each alert (inhibited or not).  A raw record
  without them (older runs) scores as before, with empty notification figures.

Ground truth (GT) per alert type, from the cluster's record, never from the monitor's events:

====================== ============================================================== ===========
alert                  raw condition (GT)                                              rule minimum
====================== ============================================================== ===========
IsrShrink              a replica left the ISR (replica set unchanged) until the ISR is   -
                       whole again (metadata log)
UnderReplicated        |ISR| < |replicas| (metadata log)                                 -
AtMinIsr               |ISR| == min.insync.replicas < |replicas|, partition led          -
UnderMinIsr            |ISR| < min.insync.replicas, partition led                        -
OfflinePartition       leader = -1 (metadata log)                                        -
LeaderChanged          a PartitionChangeRecord that sets the leader (every such record   episodes merged
                       bumps the leader epoch); changes < 5 min apart are one episode;   like the rule;
                       it ends 5 min after the last change (the rule's quiet window)     ends +300 s
PreferredLeaderImbalance leader != replicas[0] while led                                 300 s
PartitionCountChanged  a PartitionRecord for a topic that already had partitions         ends +900 s
ConsumerLagHigh        admin polls: lag > 10,000 offsets or lag in seconds > 300 s       60 s held
ConsumerLagStatus      admin polls: committed offset unchanged with lag > 0 for >= 30 s  STALL 90 s;
                       ("stuck"), or a window in which the workload made the consumer   WARN: 3 commit
                       slower than its producer ("slow")                               samples 30 s apart
GroupEmptyWithLag      admin polls: the group is Empty (ListGroups) and its lag > 0       600 s
RebalanceStorm         workload: >= 5 rebalances (members' on_assign, and the last       5 in 600 s
                       member leaving) within 10 minutes
RebalanceStuck         admin polls: Preparing/CompletingRebalance continuously           300 s
====================== ============================================================== ===========

The rule minimums are read from the job's own default configs (``RULES``), so they follow the
code under test.  A condition is *eligible* for recall when it lasted at least its rule minimum plus two probe
intervals (the monitor samples); one shorter than that but at least the minimum is
*borderline* (neither credited nor held against); an alert that matches any raw condition of its
type on its entity is never a false alert.  Matching: a monitor episode of the same alert on the
same entity that overlaps [condition start - 2 s, condition end + ``MATCH_AFTER_S``].

Notifications (``score_notifications``): for each episode the /metrics scoring counts (eligible and
detected), the time from the condition's start to the first *firing* notification listing an
alert of the same alertname on the same entity (the labels the rule's ``by (...)`` keeps: cluster
and topic+partition, group+topic, group, topic or broker) that started with the condition (its
startsAt at or after the condition's start, before its end + ``MATCH_AFTER_S`` + a scrape + an
evaluation).  An episode shorter than the job's rule minimum + the alert's notify hold (the
job's [job.rules.notify] hold + the rule's ``for:``) is expected not to notify and counted as
*shorter than the hold*, not as a miss; so are *borderline* ones (within a scrape, an evaluation and
two probe intervals of it), *inhibited* ones (Alertmanager listed the alert suppressed by an inhibit
rule) and ones that could still notify when the recording ended (*run ended*).  An alert that
notified firing and belongs to no condition of its type is a false notification.

The Prometheus-only baseline: the GT state sampled every 30 s (kafka_exporter scraped every 30 s;
its metadata refresh is 30 s too), rules evaluated every 30 s, 15 s after the scrape, with their
``for:`` as shipped; every figure is pooled over six scrape phases (0, 5, ..., 25 s).
"""

from __future__ import annotations

import bisect
import calendar
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

# ------------------------------------------------------------------------------------------------
# settings that mirror the job's defaults (streaming/rules_*.py) and the community rules
# ------------------------------------------------------------------------------------------------

def _rule_settings() -> dict:
    """The job's rule thresholds, read from its own default configs (the bench runs the job with
    its defaults), with the values of this file's writing as a fallback."""
    out = {"leader_quiet_s": 300.0, "imbalance_after_s": 300.0, "count_change_window_s": 900.0,
           "lag_high_offsets": 10_000, "lag_high_seconds": 300.0, "lag_high_for_s": 60.0, "stall_after_s": 90.0,
           "stop_after_s": 300.0, "warn_trend_s": 60.0, "storm_min": 5, "storm_window_s": 600.0,
           "empty_with_lag_s": 600.0, "stuck_after_s": 300.0, "hw_stall_s": 10.0, "stalling_after_s": 10.0,
           "source": "fallback"}
    try:
        from streaming.rules import broker as rules_broker
        from streaming.rules import group as rules_group
        from streaming.rules import lag_config as rules_lag_config
        from streaming.rules import partition as rules_partition
        pc, lc, gc = rules_partition.PartitionRulesConfig(), rules_lag_config.LagConfig(), rules_group.GroupRulesConfig()
        out.update(leader_quiet_s=pc.leader_quiet_ms / 1000, imbalance_after_s=pc.imbalance_after_ms / 1000,
                   count_change_window_s=pc.count_change_window_ms / 1000,
                   lag_high_offsets=lc.lag_high_offsets, lag_high_seconds=lc.lag_high_seconds,
                   lag_high_for_s=getattr(lc, "lag_high_for_ms", 0) / 1000,
                   stall_after_s=getattr(lc, "stall_after_ms", 0) / 1000, stop_after_s=lc.stop_after_ms / 1000,
                   # WARN: commit samples of the lag in seconds at least TREND_STEP_MS apart, min_points of them
                   warn_trend_s=(getattr(rules_lag_config, "TREND_STEP_MS", 0) / 1000) * (lc.min_points - 1),
                   storm_min=gc.storm_min_rebalances, storm_window_s=gc.storm_window_ms / 1000,
                   empty_with_lag_s=gc.empty_with_lag_after_ms / 1000, stuck_after_s=gc.stuck_after_ms / 1000,
                   hw_stall_s=pc.hw_stall_ms / 1000, stalling_after_s=rules_broker.STALLING_AFTER_MS / 1000,
                   source="streaming.rules_* defaults")
    except Exception:  # noqa: BLE001  (scoring a raw record without the job's code)
        pass
    return out


RULES = _rule_settings()
LEADER_QUIET_S = RULES["leader_quiet_s"]
IMBALANCE_AFTER_S = RULES["imbalance_after_s"]
COUNT_CHANGE_WINDOW_S = RULES["count_change_window_s"]
LAG_HIGH_OFFSETS = RULES["lag_high_offsets"]
LAG_HIGH_SECONDS = RULES["lag_high_seconds"]
STORM_MIN = RULES["storm_min"]
STORM_WINDOW_S = RULES["storm_window_s"]
EMPTY_WITH_LAG_S = RULES["empty_with_lag_s"]
STUCK_AFTER_S = RULES["stuck_after_s"]
HW_STALL_S = RULES["hw_stall_s"]
STALLING_AFTER_S = RULES["stalling_after_s"]
STUCK_GT_MIN_S = 30.0             # a "stuck" consumer GT condition lasts at least this long
POLL_GAP_S = 5.0                  # admin polls further apart than this: the GT is unknown in between
REBALANCE_MERGE_S = 3.0           # members' on_assign this close together = one rebalance

MATCH_BEFORE_S = 2.0
MATCH_AFTER_S = 60.0

SCRAPE_S = 30.0                   # kafka_exporter scraped every 30 s (its metadata refresh: 30 s)
EVAL_DELAY_S = 15.0               # rule evaluation 15 s after the scrape (evaluation_interval 30 s)
PHASES_S = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)

#: the community rules, as shipped
BASELINE_RULES = {
    "strimzi/UnderReplicatedPartition": {
        "expr": "kafka_topic_partition_under_replicated_partition > 0", "for_s": 10.0, "entity": "partition",
        "source": "strimzi/strimzi-kafka-operator examples/metrics/prometheus-install/prometheus-rules.yaml "
                  "(group kafkaExporter)"},
    "strimzi/TooLargeConsumerGroupLag": {
        "expr": "kafka_consumergroup_lag > 1000", "for_s": 10.0, "entity": "group_partition",
        "source": "strimzi/strimzi-kafka-operator examples/metrics/prometheus-install/prometheus-rules.yaml "
                  "(group kafkaExporter)"},
    "awesome/KafkaTopicsReplicas": {
        "expr": "sum(kafka_topic_partition_in_sync_replica) by (topic) < 3", "for_s": 0.0, "entity": "topic",
        "source": "samber/awesome-prometheus-alerts dist/rules/kafka/danielqsj-kafka-exporter.yml"},
    "awesome/KafkaConsumersGroup": {
        "expr": "sum(kafka_consumergroup_lag) by (consumergroup) > 50", "for_s": 60.0, "entity": "group",
        "source": "samber/awesome-prometheus-alerts dist/rules/kafka/danielqsj-kafka-exporter.yml"},
    "assumed/OfflinePartition": {
        "expr": "leader = -1 (kafka_exporter omits the leader series of such a partition; no shipped "
                "kafka_exporter rule covers offline partitions)", "for_s": 0.0, "entity": "partition",
        "source": "assumed (the best case for the baseline)"},
}

#: monitor alerts that are about a consumer falling behind (incident level: any of them)
MONITOR_LAG_ALERTS = ("ConsumerLagHigh", "ConsumerLagStatus", "GroupEmptyWithLag")


# ------------------------------------------------------------------------------------------------
# data classes
# ------------------------------------------------------------------------------------------------

@dataclass
class Condition:
    kind: str                     # the alert type this condition should raise
    entity: tuple                 # ("p", topic, partition) | ("gp", group, topic, partition) | ("g", group) | ("t", topic)
    start: float                  # s, epoch
    end: Optional[float]          # s, epoch; None = still true at the end of the run
    rule_min_s: float = 0.0       # how long it must last before the rule may fire
    resolve_at: Optional[float] = None  # when the rule should resolve (end, or end + a window)
    scenario: Optional[str] = None
    repeat: Optional[int] = None
    pre_existing: bool = False    # true before the monitor was watching: not scored
    detail: dict = field(default_factory=dict)
    instant: bool = False         # an event (a leader change, partitions added): always eligible

    @property
    def duration(self) -> Optional[float]:
        return None if self.end is None else self.end - self.start

    def eligible(self, interval_s: float, run_end: float) -> bool:
        """Lasted at least the rule minimum plus two probe intervals."""
        if self.instant:
            return not self.pre_existing
        end = self.end if self.end is not None else run_end
        return not self.pre_existing and end - self.start >= self.rule_min_s + 2 * interval_s

    def borderline(self, interval_s: float, run_end: float) -> bool:
        if self.instant:
            return False
        end = self.end if self.end is not None else run_end
        return (not self.pre_existing and self.rule_min_s > 0
                and self.rule_min_s <= end - self.start < self.rule_min_s + 2 * interval_s)


@dataclass
class Episode:
    kind: str
    entity: tuple
    open: float
    close: Optional[float]
    source: str                   # "metrics" | "alerts_topic" | baseline rule name
    detail: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------
# ground truth: partitions from the metadata log
# ------------------------------------------------------------------------------------------------

def partition_timelines(records: list[dict], prefix: str) -> tuple[dict, dict, dict, list]:
    """``{(topic, partition): [(t_s, leader, replicas, isr, leader_set), ...]}`` for topics named
    ``prefix...``, the min.insync.replicas of each topic (``{topic: int}``, with the cluster
    default under ``None``), the time each topic was created, and the partition additions
    ``[(t_s, topic, old_count, new_count)]``.  ``leader_set``: this record set the leader (an
    election: the leader epoch went up)."""
    names: dict[str, str] = {}
    state: dict[tuple, dict] = {}
    lines: dict[tuple, list] = {}
    min_isr: dict[Optional[str], int] = {None: 1}
    created: dict[str, float] = {}
    topic_record_at: dict[str, float] = {}
    counts: dict[str, int] = {}
    additions: list = []
    pending_add: dict[str, list] = {}
    for r in sorted(records, key=lambda r: r["offset"]):
        typ, d, t = r.get("type"), r.get("data") or {}, r["create_time"] / 1000.0
        if typ == "TOPIC_RECORD":
            names[d["topicId"]] = d["name"]
            topic_record_at[d["name"]] = t
        elif typ == "CONFIG_RECORD" and d.get("name") == "min.insync.replicas" and d.get("value") is not None:
            if d.get("resourceType") == 2:
                min_isr[d["resourceName"]] = int(d["value"])
            elif d.get("resourceType") == 4 and not d.get("resourceName"):
                min_isr[None] = int(d["value"])
        elif typ in ("PARTITION_RECORD", "PARTITION_CHANGE_RECORD"):
            name = names.get(d.get("topicId"))
            if name is None or not name.startswith(prefix):
                continue
            key = (name, int(d["partitionId"]))
            if typ == "PARTITION_RECORD":
                # a CreateTopics writes the topic and its partitions in one batch (one CreateTime);
                # a PartitionRecord written later is a CreatePartitions
                if key not in state and t != topic_record_at.get(name):
                    pending_add.setdefault(name, []).append(t)
                if name not in created:
                    created[name] = t
                counts[name] = max(counts.get(name, 0), key[1] + 1)
                st = {"leader": int(d["leader"]), "replicas": tuple(d["replicas"]), "isr": tuple(d["isr"])}
                state[key] = st
                lines[key] = [(t, st["leader"], st["replicas"], st["isr"], False)]
                continue
            st = state.get(key)
            if st is None:
                continue
            leader_set = False
            if d.get("isr") is not None:
                st["isr"] = tuple(d["isr"])
            if d.get("replicas") is not None:
                st["replicas"] = tuple(d["replicas"])
            if "leader" in d and int(d["leader"]) != -2:
                st["leader"] = int(d["leader"])
                leader_set = True
            lines[key].append((t, st["leader"], st["replicas"], st["isr"], leader_set))
    for name, times in pending_add.items():  # one addition per CreatePartitions (records share a batch)
        times.sort()
        groups: list[list[float]] = []
        for t in times:
            if groups and t - groups[-1][-1] < 2.0:
                groups[-1].append(t)
            else:
                groups.append([t])
        total = counts[name]
        for g in reversed(groups):  # (counts: the highest partition id + 1 at the end)
            additions.append((g[0], name, total - len(g), total))
            total -= len(g)
    additions.sort()
    return lines, min_isr, created, additions


def _intervals(line: list, pred, t_end: float) -> list[tuple[float, Optional[float], tuple]]:
    """Maximal intervals of a partition timeline where ``pred(leader, replicas, isr)`` holds:
    ``[(start, end or None, state at start)]``."""
    out = []
    start = None
    first_state = None
    for t, leader, replicas, isr, _ in line:
        v = pred(leader, replicas, isr)
        if v and start is None:
            start, first_state = t, (leader, replicas, isr)
        elif not v and start is not None:
            out.append((start, t, first_state))
            start = None
    if start is not None:
        out.append((start, None, first_state))
    return out


def partition_conditions(lines: dict, min_isr: dict, additions: list, scope: tuple[float, float]) -> list[Condition]:
    t0, t_end = scope
    out: list[Condition] = []

    def add(kind, key, s, e, rule_min=0.0, resolve_at=None, detail=None, instant=False):
        c = Condition(kind, ("p",) + key, s, e, rule_min, resolve_at if resolve_at is not None else e,
                      detail=detail or {}, instant=instant)
        c.pre_existing = s < t0
        if e is None or e >= t0:
            out.append(c)

    for key, line in lines.items():
        mi = min_isr.get(key[0], min_isr[None])
        for s, e, st in _intervals(line, lambda l, r, i: len(set(i)) < len(set(r)), t_end):
            add("UnderReplicated", key, s, e, detail={"isr": list(st[2]), "replicas": list(st[1])})
        # IsrShrink: the ISR lost members with the replica set unchanged, until it is whole again
        prev = None
        shrink_start = None
        for t, leader, replicas, isr, _ in line:
            if prev is not None:
                lost = set(prev[2]) - set(isr)
                if shrink_start is None and lost and set(prev[1]) == set(replicas):
                    shrink_start = (t, sorted(lost))
                if shrink_start is not None and set(isr) >= set(replicas):
                    add("IsrShrink", key, shrink_start[0], t, detail={"removed": shrink_start[1]})
                    shrink_start = None
            prev = (leader, replicas, isr)
        if shrink_start is not None:
            add("IsrShrink", key, shrink_start[0], None, detail={"removed": shrink_start[1]})
        for s, e, st in _intervals(line, lambda l, r, i, mi=mi: l >= 0 and len(set(i)) == mi < len(set(r)), t_end):
            add("AtMinIsr", key, s, e, detail={"isr": list(st[2]), "min_isr": mi})
        for s, e, st in _intervals(line, lambda l, r, i, mi=mi: l >= 0 and len(set(i)) < mi, t_end):
            add("UnderMinIsr", key, s, e, detail={"isr": list(st[2]), "min_isr": mi})
        for s, e, st in _intervals(line, lambda l, r, i: l < 0, t_end):
            add("OfflinePartition", key, s, e, detail={"isr": list(st[2]), "replicas": list(st[1])})
        for s, e, st in _intervals(line, lambda l, r, i: l >= 0 and bool(r) and l != r[0], t_end):
            add("PreferredLeaderImbalance", key, s, e, rule_min=IMBALANCE_AFTER_S,
                detail={"leader": st[0], "preferred": st[1][0]})
        # LeaderChanged: leader-setting records after creation, merged like the rule merges them
        changes = [(t, leader) for t, leader, _, _, leader_set in line[1:] if leader_set]
        episode: list = []
        for t, leader in changes + [(math.inf, None)]:
            if episode and t - episode[-1][0] >= LEADER_QUIET_S:
                s, last = episode[0][0], episode[-1][0]
                add("LeaderChanged", key, s, last, resolve_at=last + LEADER_QUIET_S, instant=True,
                    detail={"changes": len(episode), "leaders": [x[1] for x in episode]})
                episode = []
            if t != math.inf:
                episode.append((t, leader))
    for t, topic, old, new in additions:
        c = Condition("PartitionCountChanged", ("t", topic), t, t, 0.0, t + COUNT_CHANGE_WINDOW_S,
                      detail={"old_count": old, "new_count": new}, instant=True)
        c.pre_existing = t < t0
        out.append(c)
    return out


# ------------------------------------------------------------------------------------------------
# ground truth: brokers and the write path
# ------------------------------------------------------------------------------------------------

def broker_timelines(records: list[dict]) -> dict[int, list[tuple[float, bool]]]:
    """``{broker: [(t_s, fenced), ...]}`` from the registration records: a broker is fenced from
    its registration until an unfence, and from a fence (or an unregistration) on."""
    out: dict[int, list] = {}
    for r in sorted(records, key=lambda r: r["offset"]):
        typ, d, t = r.get("type"), r.get("data") or {}, r["create_time"] / 1000.0
        if typ == "REGISTER_BROKER_RECORD":
            b, fenced = d.get("brokerId"), bool(d.get("fenced", True))
        elif typ in ("FENCE_BROKER_RECORD", "UNFENCE_BROKER_RECORD"):
            b, fenced = d.get("id"), typ == "FENCE_BROKER_RECORD"
        elif typ == "BROKER_REGISTRATION_CHANGE_RECORD" and d.get("fenced") in (1, -1):
            b, fenced = d.get("brokerId"), d["fenced"] == 1
        elif typ == "UNREGISTER_BROKER_RECORD":
            b, fenced = d.get("brokerId"), True
        else:
            continue
        if b is not None:
            out.setdefault(int(b), []).append((t, fenced))
    return out


def _pauses(log: list[dict]) -> list[tuple[int, float, float]]:
    """``[(broker, paused at, resumed at)]`` from the workload's log (inf: not resumed)."""
    out, open_ = [], {}
    for ev in log:
        if ev.get("event") == "pause_broker":
            open_[ev["broker"]] = ev["t"]
        elif ev.get("event") == "resume_broker" and ev.get("broker") in open_:
            out.append((ev["broker"], open_.pop(ev["broker"]), ev["t"]))
    out += [(b, t, math.inf) for b, t in open_.items()]
    return out


def broker_conditions(all_lines: dict, brokers: dict, log: list[dict], canary_topic: Optional[str],
                      scope: tuple[float, float]) -> list[Condition]:
    """- BrokerDown: a broker fenced (the metadata does not list it) while it holds replicas.
    - BrokerUnderReplicating: a broker unfenced while some partition it holds a replica of (any
      topic: the probe counts every partition) does not have it in its ISR.
    - HighWatermarkStalled: a canary partition (the canary writes all along) whose ISR holds a
      paused follower: from the pause until the follower leaves its ISR or resumes; or whose
      leader is paused: until it resumes or leadership moves.
    - BrokerStallingWrites: a paused broker that is such a follower: until the last of those
      partitions lets it go."""
    t0, t_end = scope
    out: list[Condition] = []

    def add(kind, ent, s, e, rule_min=0.0, detail=None):
        c = Condition(kind, ent, s, e, rule_min, e, detail=detail or {})
        c.pre_existing = s < t0
        if e is None or e >= t0:
            out.append(c)

    changes = sorted({t for line in all_lines.values() for t, *_ in line} | {t for line in brokers.values() for t, _ in line})
    for b, bline in brokers.items():
        down_at = behind_at = None
        for t in changes + [math.inf]:
            fenced = next((f for tt, f in reversed(bline) if tt <= t), True) if t != math.inf else None
            holds = behind = False
            if t != math.inf:
                for line in all_lines.values():
                    st = state_at(line, t)
                    if st is not None and b in st[1]:
                        holds = True
                        if b not in st[2]:
                            behind = True
                            break
            down = t != math.inf and fenced and holds
            under = t != math.inf and not fenced and behind
            if down and down_at is None:
                down_at = t
            elif not down and down_at is not None:
                add("BrokerDown", ("b", b), down_at, None if t == math.inf else t)
                down_at = None
            if under and behind_at is None:
                behind_at = t
            elif not under and behind_at is not None:
                add("BrokerUnderReplicating", ("b", b), behind_at, None if t == math.inf else t)
                behind_at = None
    if canary_topic is None:
        return out
    for b, paused, resumed in _pauses(log):
        ends = []
        for (topic, part), line in all_lines.items():
            if topic != canary_topic:
                continue
            st = state_at(line, paused)
            if st is None or st[0] < 0 or b not in st[2]:
                continue
            if st[0] == b:  # its leader paused: nothing is written until it resumes or leadership moves
                moved = next((t for t, leader, _, _, _ in line if t > paused and leader != b), math.inf)
                end = min(moved, resumed)
                add("HighWatermarkStalled", ("p", topic, part), paused, None if end == math.inf else end,
                    rule_min=HW_STALL_S, detail={"paused_leader": b})
                continue
            left = next((t for t, _, _, isr, _ in line if t > paused and b not in isr), math.inf)
            end = min(left, resumed)
            ends.append(end)
            add("HighWatermarkStalled", ("p", topic, part), paused, None if end == math.inf else end,
                rule_min=HW_STALL_S, detail={"paused": b})
        if ends:
            end = max(ends)
            add("BrokerStallingWrites", ("b", b), paused, None if end == math.inf else end,
                rule_min=STALLING_AFTER_S, detail={"partitions": len(ends)})
    return out


def state_at(line: list, t: float) -> Optional[tuple]:
    """(leader, replicas, isr) of a partition timeline at time ``t`` (None before it existed)."""
    times = [x[0] for x in line]
    i = bisect.bisect_right(times, t) - 1
    if i < 0:
        return None
    return line[i][1:4]


# ------------------------------------------------------------------------------------------------
# ground truth: consumers from admin polls and the workload's log
# ------------------------------------------------------------------------------------------------

def group_series(polls: list[dict]) -> tuple[dict, dict]:
    """``({(group, topic, partition): [(t, committed, end)]}, {group: [(t, state, members)]})``
    from the admin polls (a poll that failed for a group leaves that group out of it)."""
    gp: dict[tuple, list] = {}
    gs: dict[str, list] = {}
    for p in polls:
        t = p["t"]
        ends = p.get("end") or {}
        for g, offs in (p.get("committed") or {}).items():
            if offs is None:
                continue
            for tp, c in offs.items():
                topic, part = tp.rsplit("/", 1)
                e = ends.get(tp)
                if e is None:
                    continue
                gp.setdefault((g, topic, int(part)), []).append((t, c, e))
        for g, st in (p.get("groups") or {}).items():
            if st is not None:
                gs.setdefault(g, []).append((t, st[0], st[1]))
    return gp, gs


def _lag_seconds(series: list, i: int) -> float:
    """How long before sample ``i`` the end offset was at its committed offset (interpolated on the
    polled end-offset history, never before the first poll)."""
    t, c, e = series[i]
    if c is None or c >= e:
        return 0.0
    for j in range(i, -1, -1):
        tj, _, ej = series[j]
        if ej < c:  # the end offset crossed c between j and j + 1
            tk, _, ek = series[j + 1]
            at = tj + (tk - tj) * (c - ej) / max(1, ek - ej)
            return max(0.0, t - at)
    return t - series[0][0]


def consumer_conditions(gp: dict, gs: dict, log: list[dict], scope: tuple[float, float]) -> list[Condition]:
    t0, t_end = scope
    out: list[Condition] = []

    def add(c: Condition):
        c.pre_existing = c.start < t0
        if c.end is None or c.end >= t0:
            out.append(c)

    def runs(times, flags):
        """Maximal runs of True: [(start, end or None)] (end = first sample where it is False).
        A run that is true on both sides of a gap in the samples goes on across it (a stuck
        consumer's committed offset is the same on both sides); one that is false after a gap
        of more than ``POLL_GAP_S`` ends at the last sample before it; so does a run whose
        samples stop more than ``POLL_GAP_S`` before the end of the run."""
        res, s, prev = [], None, None
        for t, f in zip(times, flags):
            if s is not None and prev is not None and t - prev > POLL_GAP_S and not f:
                res.append((s, prev))  # it ended somewhere in the gap: count it to the last sample
                s = None
                prev = t
                continue
            if f and s is None:
                s = t
            elif not f and s is not None:
                res.append((s, t))
                s = None
            prev = t
        if s is not None:
            res.append((s, None if prev is None or t_end - prev <= POLL_GAP_S else prev))
        return res

    for (g, topic, part), series in gp.items():
        ent = ("gp", g, topic, part)
        times = [x[0] for x in series]
        lags = [None if c is None else max(0, e - c) for _, c, e in series]
        secs = [_lag_seconds(series, i) for i in range(len(series))]
        high = [lg is not None and (lg > LAG_HIGH_OFFSETS or s > LAG_HIGH_SECONDS) for lg, s in zip(lags, secs)]
        for s, e in runs(times, high):
            add(Condition("ConsumerLagHigh", ent, s, e, RULES["lag_high_for_s"], e))
        # stuck: committed unchanged while lag > 0
        flags = []
        for i, (_t, c, e) in enumerate(series):
            prev_c = series[i - 1][1] if i else None
            flags.append(c is not None and e > c and (i == 0 or c == prev_c))
        for s, e in runs(times, flags):
            end = e if e is not None else t_end
            if end - s >= STUCK_GT_MIN_S:
                add(Condition("ConsumerLagStatus", ent, s, e, 0.0, e, detail={"why": "stuck"}))

    # slow / stopped windows from the workload, per group partition of the group
    parts_of: dict[str, list] = {}
    for (g, topic, part) in gp:
        parts_of.setdefault(g, []).append((topic, part))
    for kind, start_ev, end_ev in (("slow", "slow_start", "slow_end"), ("stopped", "consumer_stop", "consumer_start")):
        opened: dict[str, dict] = {}
        for ev in log:
            if ev.get("event") == start_ev:
                opened[ev["group"]] = ev
            elif ev.get("event") == end_ev and ev["group"] in opened:
                s_ev = opened.pop(ev["group"])
                if kind == "slow":
                    for topic, part in parts_of.get(ev["group"], []):
                        add(Condition("ConsumerLagStatus", ("gp", ev["group"], topic, part), s_ev["t"], ev["t"], 0.0,
                                      ev["t"], scenario=s_ev.get("scenario"), repeat=s_ev.get("repeat"),
                                      detail={"why": "slow"}))
        for g, s_ev in opened.items():
            if kind == "slow":
                for topic, part in parts_of.get(g, []):
                    add(Condition("ConsumerLagStatus", ("gp", g, topic, part), s_ev["t"], None, 0.0, None,
                                  detail={"why": "slow"}))

    # STALL needs the whole window: mark the stuck conditions' rule minimum (set by the caller,
    # which knows the probe interval) -- see apply_rule_minimums

    # GroupEmptyWithLag: Empty with lag > 0
    for g, states in gs.items():
        lag_series = {k: v for k, v in gp.items() if k[0] == g}
        times = [x[0] for x in states]

        def total_lag(t, lag_series=lag_series):
            tot, known = 0, False
            for series in lag_series.values():
                i = bisect.bisect_right([x[0] for x in series], t) - 1
                if i >= 0 and series[i][1] is not None:
                    tot += max(0, series[i][2] - series[i][1])
                    known = True
            return tot if known else None

        flags = [st == "Empty" and (total_lag(t) or 0) > 0 for t, st, _ in states]
        for s, e in runs(times, flags):
            add(Condition("GroupEmptyWithLag", ("g", g), s, e, EMPTY_WITH_LAG_S, e))
        flags = [st in ("PreparingRebalance", "CompletingRebalance") for t, st, _ in states]
        for s, e in runs(times, flags):
            add(Condition("RebalanceStuck", ("g", g), s, e, STUCK_AFTER_S, e))

    # RebalanceStorm from the members' own view
    for g, times in rebalances(log).items():
        # condition: count in (t - W, t] >= N; it starts at a rebalance and ends W after the
        # rebalance that drops out of the window
        i = 0
        start = None
        events = sorted(set([t for t in times] + [t + STORM_WINDOW_S for t in times]))
        for t in events:
            cnt = sum(1 for x in times if t - STORM_WINDOW_S < x <= t)
            if cnt >= STORM_MIN and start is None:
                start = t
            elif cnt < STORM_MIN and start is not None:
                add(Condition("RebalanceStorm", ("g", g), start, t, 0.0, t,
                              detail={"rebalances": [round(x - start, 1) for x in times if start - STORM_WINDOW_S < x <= t]}))
                start = None
        if start is not None:
            add(Condition("RebalanceStorm", ("g", g), start, None, 0.0, None))
    return out


def rebalances(log: list[dict]) -> dict[str, list[float]]:
    """Rebalance completion times per group: members' ``on_assign`` (merged when within
    ``REBALANCE_MERGE_S``), and a group's last member leaving (the coordinator bumps the
    generation and goes Empty)."""
    raw: dict[str, list[float]] = {}
    for ev in log:
        if ev.get("event") == "assign" or (ev.get("event") == "member_left" and ev.get("last_member")):
            raw.setdefault(ev["group"], []).append(ev["t"])
    out = {}
    for g, ts in raw.items():
        ts.sort()
        merged: list[float] = []
        for t in ts:
            if not merged or t - merged[-1] > REBALANCE_MERGE_S:
                merged.append(t)
        out[g] = merged
    return out


def incident_conditions(log: list[dict], gp: dict) -> list[Condition]:
    """Consumer incidents at the group level, from the workload: a consumer stopped (closed) or
    slowed below its producer's rate.  For the monitor vs baseline comparison."""
    out = []
    for kind, a, b in (("ConsumerStopped", "consumer_stop", "consumer_start"), ("ConsumerSlow", "slow_start", "slow_end")):
        opened: dict[str, dict] = {}
        for ev in log:
            if ev.get("event") == a:
                opened[ev["group"]] = ev
            elif ev.get("event") == b and ev["group"] in opened:
                s = opened.pop(ev["group"])
                out.append(Condition(kind, ("g", ev["group"]), s["t"], ev["t"], 0.0, ev["t"],
                                     scenario=s.get("scenario"), repeat=s.get("repeat")))
        for g, s in opened.items():
            out.append(Condition(kind, ("g", g), s["t"], None, 0.0, None, scenario=s.get("scenario"),
                                 repeat=s.get("repeat")))
    return out


def apply_rule_minimums(conds: list[Condition], interval_s: float) -> None:
    """ConsumerLagStatus: a stuck consumer is STALL after ``stall_after_ms`` (at least: the
    limit grows with a slow commit cadence; the bench's consumers commit every 5 s, so the
    floor applies); a slow one is WARN once its commit samples of the lag in seconds (at least
    ``TREND_STEP_MS`` apart, ``min_points`` of them) rise."""
    for c in conds:
        if c.kind == "ConsumerLagStatus" and c.detail.get("why") == "stuck":
            c.rule_min_s = RULES["stall_after_s"]
        elif c.kind == "ConsumerLagStatus" and c.detail.get("why") == "slow":
            c.rule_min_s = RULES["warn_trend_s"]


#: scenarios whose conditions are found by time (the replication faults hit every topic)
TIME_SCENARIOS = ("broker_stopped", "follower_paused", "two_replicas_lost", "preferred_election")
#: a scenario's own topics / groups (PREFIX + "<base>-r<repeat>")
OWN = {"stop": "consumer_stopped", "slow": "consumer_slow", "storm": "rebalance_storm", "le": "leader_election",
       "pa": "partitions_added"}


def scenario_windows(log: list[dict], after_s: float = 60.0) -> list[tuple]:
    """``[(start, end + after_s, scenario, repeat)]`` from the workload's scenario markers."""
    windows = []
    open_: dict[tuple, dict] = {}
    for ev in log:
        if ev.get("event") == "scenario_start":
            open_[(ev["scenario"], ev["repeat"])] = ev
        elif ev.get("event") == "scenario_end":
            s = open_.pop((ev["scenario"], ev["repeat"]), None)
            if s is not None:
                windows.append((s["t"], ev["t"] + after_s, ev["scenario"], ev["repeat"]))
    for (sc, rp), s in open_.items():
        windows.append((s["t"], math.inf, sc, rp))
    return sorted(windows)


def attribute(conds: list[Condition], log: list[dict], prefix: str, after_s: float = 60.0) -> None:
    """Scenario (and repeat) of each condition.  A consumer condition belongs to the scenario of
    its group (``stop-r0`` -> consumer_stopped of repeat 0) while inside that scenario's window
    (+ ``after_s``); so do the leader-election topic's leader conditions and the
    partitions-added topic's count change.  Any other partition condition belongs to the
    replication fault whose window holds its start (the latest one), else to "healthy"."""
    windows = scenario_windows(log, after_s)
    by_key = {(w[2], w[3]): w for w in windows}
    own_kinds = {"leader_election": ("LeaderChanged", "PreferredLeaderImbalance"),
                 "partitions_added": ("PartitionCountChanged",)}
    for c in conds:
        if c.scenario is not None:
            continue
        if c.entity[0] == "b":
            hit = [w for w in windows if w[2] in TIME_SCENARIOS and w[0] - 2.0 <= c.start <= w[1]]
            c.scenario, c.repeat = (hit[-1][2], hit[-1][3]) if hit else ("healthy", None)
            continue
        name = c.entity[1][len(prefix):] if c.entity[1].startswith(prefix) else c.entity[1]
        m = re.match(r"^(\w+)-r(\d+)$", name)
        own = (OWN.get(m.group(1)), int(m.group(2))) if m else (None, None)
        if own[0] is not None and (c.entity[0] in ("g", "gp") or c.kind in own_kinds.get(own[0], ())):
            w = by_key.get(own)
            if w is not None and w[0] - 2.0 <= c.start <= w[1]:
                c.scenario, c.repeat = own
            else:
                c.scenario = "healthy"
            continue
        if c.entity[0] in ("g", "gp"):
            c.scenario = "healthy"
            continue
        hit = [w for w in windows if w[2] in TIME_SCENARIOS and w[0] - 2.0 <= c.start <= w[1]]
        if hit:
            c.scenario, c.repeat = hit[-1][2], hit[-1][3]
        else:
            c.scenario = "healthy"


# ------------------------------------------------------------------------------------------------
# the monitor's episodes
# ------------------------------------------------------------------------------------------------

def entity_of(alert: str, labels: dict) -> tuple:
    topic, part, group = labels.get("topic") or "", labels.get("partition"), labels.get("group") or labels.get("consumer_group") or ""
    part = None if part in (None, "") else int(part)
    if group and topic and part is not None:
        return ("gp", group, topic, part)
    if group:
        return ("g", group)
    if topic and part is not None:
        return ("p", topic, part)
    if topic:
        return ("t", topic)
    if labels.get("broker") not in (None, ""):
        return ("b", int(labels["broker"]))
    return ("s", labels.get("source") or "")


def metrics_episodes(raw: list[dict]) -> list[Episode]:
    return [Episode(e["alert"], entity_of(e["alert"], e["labels"]), e["open"], e.get("close"), "metrics",
                    {"severities": e.get("severities", [])}) for e in raw]


def topic_episodes(records: list[dict]) -> list[Episode]:
    """Open/resolve pairs by alert id from the alerts topic (times = the job's ``at``, event time)."""
    opens: dict[str, dict] = {}
    out = []
    for r in sorted(records, key=lambda r: (r.get("sequence") or 0)):
        if r["action"] == "open":
            opens[r["alert_id"]] = r
        elif r["action"] == "resolve":
            o = opens.pop(r["alert_id"], None)
            if o is not None:
                out.append(Episode(o["alert"], entity_of(o["alert"], o["labels"]), o["at"] / 1000.0, r["at"] / 1000.0,
                                   "alerts_topic", {"status": (o.get("evidence") or {}).get("status")}))
    for o in opens.values():
        out.append(Episode(o["alert"], entity_of(o["alert"], o["labels"]), o["at"] / 1000.0, None, "alerts_topic",
                           {"status": (o.get("evidence") or {}).get("status")}))
    return out


def to_group_level(episodes: Iterable[Episode], kinds: Iterable[str], kind: str) -> list[Episode]:
    """Episodes of any of ``kinds`` lifted to their group entity, merged when they overlap."""
    by_group: dict[tuple, list] = {}
    for e in episodes:
        if e.kind in kinds and e.entity[0] in ("gp", "g"):
            by_group.setdefault(("g", e.entity[1]), []).append(e)
    out = []
    for ent, eps in by_group.items():
        eps.sort(key=lambda e: e.open)
        cur: Optional[list] = None
        for e in eps:
            close = e.close if e.close is not None else math.inf
            if cur is not None and e.open <= cur[1]:
                cur[1] = max(cur[1], close)
                cur[2].add(e.kind)
            else:
                if cur is not None:
                    out.append(Episode(kind, ent, cur[0], None if cur[1] == math.inf else cur[1], eps[0].source,
                                       {"alerts": sorted(cur[2])}))
                cur = [e.open, close, {e.kind}]
        if cur is not None:
            out.append(Episode(kind, ent, cur[0], None if cur[1] == math.inf else cur[1], eps[0].source,
                               {"alerts": sorted(cur[2])}))
    return out


# ------------------------------------------------------------------------------------------------
# the Prometheus-only baseline
# ------------------------------------------------------------------------------------------------

def _latest_le(series: list, t: float):
    i = bisect.bisect_right([x[0] for x in series], t) - 1
    return series[i] if i >= 0 else None


def simulate_rule(evals: list[float], active: dict, for_s: float, kind: str, source: str) -> list[Episode]:
    """Prometheus' ``for:``: pending at the first evaluation where the expression holds, firing
    at the first one at least ``for_s`` later while it still holds, resolved at the first one
    where it does not.  ``active``: {entity: [bool per evaluation]}."""
    out = []
    for ent, flags in active.items():
        since = None
        fired: Optional[float] = None
        for t, v in zip(evals, flags):
            if v:
                if since is None:
                    since = t
                if fired is None and t - since >= for_s:
                    fired = t
            else:
                if fired is not None:
                    out.append(Episode(kind, ent, fired, t, source))
                fired, since = None, None
        if fired is not None:
            out.append(Episode(kind, ent, fired, None, source))
    return out


def baseline_episodes(lines: dict, gp: dict, scope: tuple[float, float], phase: float) -> list[Episode]:
    """Every baseline rule's alert episodes for one scrape phase."""
    t0, t_end = scope
    scrapes = []
    t = t0 + phase
    while t <= t_end:
        scrapes.append(t)
        t += SCRAPE_S
    evals = [s + EVAL_DELAY_S for s in scrapes if s + EVAL_DELAY_S <= t_end]
    scrape_of_eval = scrapes[:len(evals)]
    out: list[Episode] = []

    urp: dict = {}
    offline: dict = {}
    topic_isr: dict = {}
    for key, line in lines.items():
        fl_u, fl_o = [], []
        for s in scrape_of_eval:
            st = state_at(line, s)
            if st is None:
                fl_u.append(False)
                fl_o.append(False)
                continue
            leader, replicas, isr = st
            fl_u.append(len(isr) < len(replicas))
            fl_o.append(leader < 0)
            topic_isr.setdefault(key[0], {}).setdefault(s, 0)
            topic_isr[key[0]][s] += len(isr)
        urp[("p",) + key] = fl_u
        offline[("p",) + key] = fl_o
    topics_active = {("t", topic): [by_s.get(s) is not None and by_s[s] < 3 for s in scrape_of_eval]
                     for topic, by_s in topic_isr.items()}
    out += simulate_rule(evals, urp, BASELINE_RULES["strimzi/UnderReplicatedPartition"]["for_s"],
                         "strimzi/UnderReplicatedPartition", "baseline")
    out += simulate_rule(evals, topics_active, BASELINE_RULES["awesome/KafkaTopicsReplicas"]["for_s"],
                         "awesome/KafkaTopicsReplicas", "baseline")
    out += simulate_rule(evals, offline, BASELINE_RULES["assumed/OfflinePartition"]["for_s"],
                         "assumed/OfflinePartition", "baseline")

    lag_part: dict = {}
    group_sum: dict = {}
    for (g, topic, part), series in gp.items():
        flags = []
        for i, s in enumerate(scrape_of_eval):
            x = _latest_le(series, s)
            lag = None if x is None or x[1] is None else max(0, x[2] - x[1])
            flags.append(lag is not None and lag > 1000)
            if lag is not None:
                group_sum.setdefault(g, [0] * len(scrape_of_eval))
                group_sum[g][i] += lag
        lag_part[("gp", g, topic, part)] = flags
    out += simulate_rule(evals, lag_part, BASELINE_RULES["strimzi/TooLargeConsumerGroupLag"]["for_s"],
                         "strimzi/TooLargeConsumerGroupLag", "baseline")
    out += simulate_rule(evals, {("g", g): [v > 50 for v in sums] for g, sums in group_sum.items()},
                         BASELINE_RULES["awesome/KafkaConsumersGroup"]["for_s"], "awesome/KafkaConsumersGroup", "baseline")
    return out


# ------------------------------------------------------------------------------------------------
# scoring
# ------------------------------------------------------------------------------------------------

def pct(xs: list[float], q: float) -> Optional[float]:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    f = math.floor(k)
    c = min(len(xs) - 1, f + 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def _overlaps(e: Episode, c: Condition) -> bool:
    lo = c.start - MATCH_BEFORE_S
    hi = (c.end if c.end is not None else math.inf) + MATCH_AFTER_S
    e_close = e.close if e.close is not None else math.inf
    return e.open <= hi and e_close >= lo


def _entity_matches(ep_entity: tuple, cond_entity: tuple) -> bool:
    if ep_entity == cond_entity:
        return True
    # a topic-level alert covers the topic's partitions
    if ep_entity[0] == "t" and cond_entity[0] == "p" and ep_entity[1] == cond_entity[1]:
        return True
    # a group-level alert covers the group's partitions (and vice versa for incidents)
    if ep_entity[0] == "g" and cond_entity[0] == "gp" and ep_entity[1] == cond_entity[1]:
        return True
    if ep_entity[0] == "gp" and cond_entity[0] == "g" and ep_entity[1] == cond_entity[1]:
        return True
    return False


def match(conds: list[Condition], episodes: list[Episode], interval_s: float, run_end: float) -> dict:
    """Score one alert type (``conds`` and ``episodes`` already filtered to it).

    Per condition entity, each episode goes to at most one of that entity's conditions: the
    latest one that started (``MATCH_BEFORE_S`` slack) before the episode opened, if the episode
    opened before that condition ended + ``MATCH_AFTER_S``.  A condition also counts as detected
    when an episode opened earlier is still open when it starts (``carried_over``: no open
    latency).  The resolve latency is measured on the episode open when the condition ended (or
    the last one assigned to it).  An episode assigned to no condition of any entity, and
    overlapping none, is a false alert."""
    by_entity: dict[tuple, list[int]] = {}
    for i, c in enumerate(conds):
        by_entity.setdefault(c.entity, []).append(i)
    assigned: dict[int, list[Episode]] = {i: [] for i in range(len(conds))}
    carried: dict[int, Episode] = {}
    used: set[int] = set()
    for ent, idx in by_entity.items():
        idx.sort(key=lambda i: conds[i].start)
        cands = [(j, e) for j, e in enumerate(episodes) if _entity_matches(e.entity, ent)]
        for j, e in cands:
            home = None
            for i in idx:
                c = conds[i]
                if c.start - MATCH_BEFORE_S <= e.open:
                    home = i
            if home is not None:
                c = conds[home]
                if c.end is None or e.open <= c.end + MATCH_AFTER_S:
                    assigned[home].append(e)
                    used.add(j)
                    continue
            # opened before a condition and still open when it started: carried over
            for i in idx:
                c = conds[i]
                e_close = e.close if e.close is not None else math.inf
                if e.open < c.start - MATCH_BEFORE_S and e_close >= c.start:
                    carried.setdefault(i, e)
                    used.add(j)
    rows = []
    for i, c in enumerate(conds):
        eps = sorted(assigned[i], key=lambda e: e.open)
        row = {"entity": list(c.entity), "scenario": c.scenario, "repeat": c.repeat, "start": c.start, "end": c.end,
               "duration_s": c.duration, "rule_min_s": c.rule_min_s, "resolve_at": c.resolve_at,
               "eligible": c.eligible(interval_s, run_end), "borderline": c.borderline(interval_s, run_end),
               "pre_existing": c.pre_existing, "detail": c.detail, "detected": bool(eps) or i in carried,
               "episodes": len(eps)}
        if eps:
            first = eps[0]
            row["open_at"] = first.open
            row["open_latency_s"] = first.open - c.start
            row["open_after_rule_min_s"] = first.open - (c.start + c.rule_min_s)
            row["carried_over"] = False
        elif i in carried:
            row["open_at"] = carried[i].open
            row["carried_over"] = True
            eps = [carried[i]]
        if eps:
            end = c.end if c.end is not None else run_end
            at_end = [e for e in eps if e.open <= end + MATCH_AFTER_S]
            last = (at_end or eps)[-1]
            row["close_at"] = last.close
            if c.resolve_at is not None and last.close is not None:
                row["resolve_latency_s"] = last.close - c.resolve_at
        rows.append(row)
    false = [e for j, e in enumerate(episodes) if j not in used
             and not any(_entity_matches(e.entity, c.entity) and _overlaps(e, c) for c in conds)]
    return {"rows": rows, "false": false}


def summarize(result: dict, hours: float, healthy: set) -> dict:
    rows = result["rows"]
    elig = [r for r in rows if r["eligible"]]
    det = [r for r in elig if r["detected"]]
    opens = [r["open_latency_s"] for r in det if not r.get("carried_over")]
    resolves = [r["resolve_latency_s"] for r in det if r.get("resolve_latency_s") is not None]
    false = result["false"]
    healthy_false = [e for e in false if _healthy_entity(e.entity, healthy)]
    return {
        "conditions": len([r for r in rows if not r["pre_existing"]]),
        "eligible": len(elig), "detected": len(det),
        "recall": (len(det) / len(elig)) if elig else None,
        "detected_below_minimum": len([r for r in rows if r["detected"] and not r["eligible"]
                                       and not r["borderline"] and not r["pre_existing"]]),
        "false_alerts": len(false), "false_alerts_per_hour": len(false) / hours if hours else None,
        "false_alerts_healthy": len(healthy_false),
        "false_alerts_healthy_per_hour": len(healthy_false) / hours if hours else None,
        "open_p50_s": pct(opens, 0.5), "open_p95_s": pct(opens, 0.95),
        "resolve_p50_s": pct(resolves, 0.5), "resolve_p95_s": pct(resolves, 0.95),
        "unresolved_at_end": len([r for r in det if r.get("close_at") is None]),
        "flapping": len([r for r in det if r["episodes"] > 1]),
        "carried_over": len([r for r in det if r.get("carried_over")]),
        "missed": [{"entity": r["entity"], "scenario": r["scenario"], "repeat": r["repeat"],
                    "duration_s": r["duration_s"]} for r in elig if not r["detected"]],
        "false_list": [{"entity": list(e.entity), "open": e.open, "close": e.close, **e.detail} for e in false],
    }


def _healthy_entity(ent: tuple, healthy: set) -> bool:
    if ent[0] in ("p", "t"):
        return ent[1] in healthy
    if ent[0] in ("g", "gp", "gt"):
        return ent[1] in healthy
    return False


#: monitor alert -> the GT kind it is scored against
MONITOR_KINDS = ("IsrShrink", "UnderReplicated", "AtMinIsr", "UnderMinIsr", "OfflinePartition", "LeaderChanged",
                 "PreferredLeaderImbalance", "PartitionCountChanged", "ConsumerLagHigh", "ConsumerLagStatus",
                 "RebalanceStorm", "GroupEmptyWithLag", "RebalanceStuck", "BrokerDown", "BrokerUnderReplicating",
                 "HighWatermarkStalled", "BrokerStallingWrites")

#: (row name, GT kind, baseline rule) -- rows of the comparison table for the baseline
BASELINE_ROWS = (
    ("IsrShrink", "IsrShrink", "strimzi/UnderReplicatedPartition"),
    ("UnderReplicated", "UnderReplicated", "strimzi/UnderReplicatedPartition"),
    ("UnderReplicated", "UnderReplicated", "awesome/KafkaTopicsReplicas"),
    ("AtMinIsr", "AtMinIsr", "strimzi/UnderReplicatedPartition"),
    ("UnderMinIsr", "UnderMinIsr", "strimzi/UnderReplicatedPartition"),
    ("OfflinePartition", "OfflinePartition", "assumed/OfflinePartition"),
    ("OfflinePartition", "OfflinePartition", "strimzi/UnderReplicatedPartition"),
    ("ConsumerStopped", "ConsumerStopped", "strimzi/TooLargeConsumerGroupLag"),
    ("ConsumerStopped", "ConsumerStopped", "awesome/KafkaConsumersGroup"),
    ("ConsumerSlow", "ConsumerSlow", "strimzi/TooLargeConsumerGroupLag"),
    ("ConsumerSlow", "ConsumerSlow", "awesome/KafkaConsumersGroup"),
)


def score_run(raw: dict) -> dict:
    """Everything: GT conditions, the monitor's episodes (from /metrics and from the alerts
    topic), the baseline's; per alert type and per incident class."""
    p = raw["params"]
    interval = float(p["probe_interval_s"])
    scope = (raw["scope"]["start"], raw["scope"]["end"])
    hours = (scope[1] - scope[0]) / 3600.0
    prefix = p["prefix"]
    healthy = set(raw["healthy_entities"])
    lines, min_isr, created, additions = partition_timelines(raw["metadata_records"], prefix)
    gp, gs = group_series(raw["polls"])
    conds = partition_conditions(lines, min_isr, additions, scope) + consumer_conditions(gp, gs, raw["log"], scope)
    conds += broker_conditions(partition_timelines(raw["metadata_records"], "")[0],
                               broker_timelines(raw["metadata_records"]), raw["log"], p.get("canary_topic"), scope)
    apply_rule_minimums(conds, interval)
    attribute(conds, raw["log"], prefix)
    incidents = incident_conditions(raw["log"], gp)
    for c in incidents:
        c.pre_existing = c.start < scope[0]

    def in_scope(e: Episode) -> bool:
        ent = e.entity
        return ent[0] == "b" or (ent[0] in ("p", "t", "g", "gp") and ent[1].startswith(prefix))

    mon = {src: [e for e in eps if in_scope(e)] for src, eps in
           (("metrics", metrics_episodes(raw["metrics_episodes"])), ("alerts_topic", topic_episodes(raw["alerts_topic"])))}
    out: dict[str, Any] = {"per_alert": {}, "per_alert_alerts_topic": {}, "per_alert_notify": {}, "incidents": {},
                           "baseline": {}, "other_alerts": {}, "conditions": {}}
    nctx = notify_context(raw, prefix, scope, interval)  # None: a record from before notifications
    for kind in MONITOR_KINDS:
        cs = [c for c in conds if c.kind == kind]
        for src, key in (("metrics", "per_alert"), ("alerts_topic", "per_alert_alerts_topic")):
            res = match(cs, [e for e in mon[src] if e.kind == kind], interval, scope[1])
            s = summarize(res, hours, healthy)
            s["rule_min_s"] = sorted({c.rule_min_s for c in cs})
            if src == "metrics":
                s["rows"] = res["rows"]
                if nctx is not None:
                    out["per_alert_notify"][kind] = score_notifications(kind, cs, res["rows"], nctx, healthy)
            out[key][kind] = s
    out["notify"] = None if nctx is None else {**notify_setup(raw), "other": notify_other(nctx)}
    known = set(MONITOR_KINDS)
    for src in ("metrics",):
        for e in mon[src]:
            if e.kind not in known:
                o = out["other_alerts"].setdefault(e.kind, [])
                o.append({"entity": list(e.entity), "open": e.open, "close": e.close})

    # incidents: monitor (any lag alert on the group) vs baseline
    mon_lag = to_group_level(mon["metrics"], MONITOR_LAG_ALERTS, "lag")
    consumer_gt_for_fa = [c for c in conds if c.kind in ("ConsumerLagHigh", "ConsumerLagStatus", "GroupEmptyWithLag")]
    for kind in ("ConsumerStopped", "ConsumerSlow"):
        cs = [c for c in incidents if c.kind == kind]
        res = match(cs, mon_lag, interval, scope[1])
        out["incidents"].setdefault(kind, {})["monitor"] = _incident_summary(res, cs, mon_lag, consumer_gt_for_fa, hours, healthy)
        # per monitor alert: first open after the incident start
        per = {}
        for a in MONITOR_LAG_ALERTS:
            eps = to_group_level(mon["metrics"], (a,), a)
            r = match(cs, eps, interval, scope[1])
            per[a] = {"detected": sum(1 for x in r["rows"] if x["detected"]), "of": len(cs),
                      "open_latency_s": [x.get("open_latency_s") for x in r["rows"]],
                      "resolve_latency_s": [x.get("resolve_latency_s") for x in r["rows"]]}
        out["incidents"][kind]["monitor_by_alert"] = per

    # the baseline, pooled over scrape phases
    for phase in PHASES_S:
        beps = baseline_episodes(lines, gp, scope, phase)
        for row, gt_kind, rule in BASELINE_ROWS:
            if gt_kind in ("ConsumerStopped", "ConsumerSlow"):
                cs = [c for c in incidents if c.kind == gt_kind]
                eps = to_group_level([e for e in beps if e.kind == rule], (rule,), rule)
                res = match(cs, eps, interval, scope[1])
                acc = out["baseline"].setdefault(f"{row}|{rule}", {"rows": [], "false": []})
                acc["rows"] += res["rows"]
                acc["false"] += [e for e in _false_against(eps, consumer_gt_for_fa + [c for c in incidents])]
            else:
                cs = [c for c in conds if c.kind == gt_kind]
                eps = [e for e in beps if e.kind == rule]
                res = match(cs, eps, interval, scope[1])
                acc = out["baseline"].setdefault(f"{row}|{rule}", {"rows": [], "false": []})
                acc["rows"] += res["rows"]
                # false = an alert that matches no replication condition of any kind
                acc["false"] += _false_against(eps, [c for c in conds if c.kind in (
                    "UnderReplicated", "OfflinePartition", "UnderMinIsr", "AtMinIsr", "IsrShrink")])
    n_phases = len(PHASES_S)
    for key, acc in list(out["baseline"].items()):
        s = summarize({"rows": acc["rows"], "false": acc["false"]}, hours * n_phases, healthy)
        s["phases"] = n_phases
        s.pop("false_list", None)
        s["missed"] = len(s["missed"])
        out["baseline"][key] = s
    # the monitor's own false alerts for incidents (any lag alert matching no consumer condition)
    out["conditions"] = {
        "counts": _count_by(conds), "incidents": [asdict(c) for c in incidents],
        "partition_timelines": {f"{k[0]}/{k[1]}": [[round(t, 3), l, list(r), list(i), s] for t, l, r, i, s in v]
                                for k, v in lines.items()},
        "partition_additions": additions, "topics_created": created, "min_isr": {str(k): v for k, v in min_isr.items()},
        "rebalances": rebalances(raw["log"]),
    }
    out["scope"] = {"start": scope[0], "end": scope[1], "hours": hours}
    return out


def _false_against(eps: list[Episode], conds: list[Condition]) -> list[Episode]:
    return [e for e in eps if not any(_entity_matches(e.entity, c.entity) and _overlaps(e, c) for c in conds)]


def _incident_summary(res: dict, cs: list, eps: list, consumer_conds: list, hours: float, healthy: set) -> dict:
    s = summarize({"rows": res["rows"], "false": _false_against(eps, consumer_conds + cs)}, hours, healthy)
    s["false_list"] = s["false_list"][:50]
    return s


def _count_by(conds: list[Condition]) -> dict:
    out: dict[str, dict] = {}
    for c in conds:
        d = out.setdefault(c.kind, {})
        d[c.scenario or "?"] = d.get(c.scenario or "?", 0) + 1
    return out


# ------------------------------------------------------------------------------------------------
# Alertmanager's notifications
# ------------------------------------------------------------------------------------------------

def _notify_holds_default() -> dict:
    """The job's [job.rules.notify] holds in seconds (``NotifyConfig`` defaults: the bench runs the
    job with them), for a raw record that does not carry them; the values of this file's writing
    as a fallback."""
    try:
        from streaming.rules.notify import NotifyConfig
        return NotifyConfig().holds_s()
    except Exception:  # noqa: BLE001  (scoring without the job's code)
        return {"IsrShrink": 300.0, "UnderReplicated": 300.0, "UnderMinIsr": 0.0, "AtMinIsr": 300.0,
                "OfflinePartition": 0.0, "BrokerDown": 0.0, "BrokerUnderReplicating": 300.0, "LeaderChanged": 60.0,
                "PartitionCountChanged": 60.0, "MetadataRefreshStorm": 120.0}


#: a ConsumerLagStatus condition (``detail["why"]``) -> the lag status (rule label) it raises
LAG_STATUS_OF = {"slow": "WARN", "stuck": "STALL"}
#: not-notified categories of an episode, in the order they are decided
NOT_NOTIFIED = ("shorter_than_hold", "borderline", "inhibited", "run_ended", "missed")

_RFC3339 = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?([Zz]|[+-]\d\d:\d\d)$")


def rfc3339_s(text: Optional[str]) -> Optional[float]:
    """Unix time of an RFC 3339 timestamp as Alertmanager writes them (nanoseconds in webhooks,
    milliseconds in its API); None for an empty one or Go's zero time (an unset endsAt)."""
    if not text:
        return None
    m = _RFC3339.match(text.strip())
    if m is None:
        return None
    y, mo, d, h, mi, s, frac, tz = m.groups()
    if int(y) <= 1:
        return None
    secs = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    if tz not in ("Z", "z"):
        secs -= (1 if tz[0] == "+" else -1) * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    return secs + (int(frac[:9].ljust(9, "0")) / 1e9 if frac else 0.0)


def _ms(t: Optional[float]) -> Optional[int]:
    """A startsAt to the millisecond (Alertmanager's API truncates to it; webhooks do not)."""
    return None if t is None else math.floor(t * 1000 + 1e-3)


def notify_entity(labels: dict) -> tuple:
    """The entity an alert of the shipped rules is about, from its labels: a rule keeps the
    labels of its outermost ``by (...)`` (cluster and the entity: topic and partition; group and
    topic; group; broker; source) and adds static ones (severity, status).  ``("gt", group,
    topic)``: ConsumerLagHigh and ConsumerLagStatus, per group and topic.  A partition alert's
    ``broker`` (the one broker the job blames, when there is exactly one) is not part of its
    entity: the ground truth is per partition."""
    group, topic = labels.get("group") or "", labels.get("topic") or ""
    if group and topic and labels.get("partition") in (None, ""):
        return ("gt", group, topic)
    return entity_of(labels.get("alertname", ""), labels)


def _notify_entity_matches(ent: tuple, cond_entity: tuple) -> bool:
    if _entity_matches(ent, cond_entity):
        return True
    if ent[0] == "gt":  # per (group, topic): the group's partitions of that topic, or the group
        return ((cond_entity[0] == "gp" and cond_entity[1:3] == ent[1:3])
                or (cond_entity[0] == "g" and cond_entity[1] == ent[1]))
    return False


def notification_instances(notifications: list[dict]) -> list[dict]:
    """Every alert the notifications list, once per Prometheus alert (alertname, labels,
    startsAt: an alert that fires again after it resolved has a new startsAt): when it was first
    notified firing (the webhook's receive time), when it resolved (its endsAt in the first
    notification that lists it resolved), in how many notifications and to which receivers."""
    out: dict[tuple, dict] = {}
    for n in sorted(notifications, key=lambda n: n["t"]):
        for a in n.get("alerts") or []:
            labels = a.get("labels") or {}
            starts = rfc3339_s(a.get("startsAt"))
            key = (tuple(sorted(labels.items())), _ms(starts))
            d = out.get(key)
            if d is None:
                d = out[key] = {"alert": labels.get("alertname"), "labels": labels, "entity": notify_entity(labels),
                                "starts_at": starts, "first_firing": None, "last_firing": None,
                                "resolved_at": None, "notifications": 0, "receivers": []}
            d["notifications"] += 1
            if n.get("receiver") not in d["receivers"]:
                d["receivers"].append(n.get("receiver"))
            if a.get("status") == "firing":
                if d["first_firing"] is None:
                    d["first_firing"] = n["t"]
                d["last_firing"] = n["t"]
            elif a.get("status") == "resolved" and d["resolved_at"] is None:
                d["resolved_at"] = rfc3339_s(a.get("endsAt")) or n["t"]
    return list(out.values())


def am_instances(am_alerts: list[dict], until: float, poll_s: float = 2.0) -> list[dict]:
    """Alertmanager's own view of each alert (``AlertmanagerPoller``): when it was listed, and
    whether an inhibit rule suppressed it.  Its close: the last poll that listed it (None when
    that is the end of the recording)."""
    out = []
    for a in am_alerts:
        labels = a.get("labels") or {}
        last = a.get("last_seen")
        out.append({"alert": labels.get("alertname"), "labels": labels, "entity": notify_entity(labels),
                    "starts_at": rfc3339_s(a.get("startsAt")), "first_seen": a.get("first_seen"), "last_seen": last,
                    "close": None if last is None or last >= until - 3 * poll_s else last,
                    "inhibited_first": a.get("inhibited_first"), "inhibited_last": a.get("inhibited_last")})
    return out


def _close_instances(insts: list[dict], am: list[dict]) -> None:
    """Each notified alert's close: its resolved endsAt, else the last time Alertmanager listed
    it (None: still listed when the recording ended), else (Alertmanager's polls never saw it)
    its last firing notification: nothing says it fired any longer."""
    last = {(tuple(sorted(a["labels"].items())), _ms(a["starts_at"])): a["close"] for a in am}
    for x in insts:
        key = (tuple(sorted(x["labels"].items())), _ms(x["starts_at"]))
        if x["resolved_at"] is not None:
            x["close"] = x["resolved_at"]
        elif key in last:
            x["close"] = last[key]
        else:
            x["close"] = x["last_firing"]


def _notify_end(c: Condition) -> Optional[float]:
    """When the job's alert for a condition closes, as the rule sees it: the end, or for an
    event (LeaderChanged, PartitionCountChanged) the end of the job's window (``resolve_at``);
    None: still true at the end of the run."""
    if c.instant and c.resolve_at is not None:
        return c.resolve_at
    return c.end


def _assign_instances(conds: list[Condition], insts: list[dict], after_s: float) -> tuple[dict, dict, set]:
    """Like ``match``, for alert instances (by their startsAt): per condition entity, an instance
    goes to the latest condition that started (``MATCH_BEFORE_S`` slack) before it, if it started
    before that condition's end (``_notify_end``) + ``after_s``; an instance that started before a
    condition and had not closed when it started is *carried* into it (already firing)."""
    by_entity: dict[tuple, list[int]] = {}
    for i, c in enumerate(conds):
        by_entity.setdefault(c.entity, []).append(i)
    home: dict[int, list] = {i: [] for i in range(len(conds))}
    carried: dict[int, list] = {i: [] for i in range(len(conds))}
    used: set[int] = set()
    for ent, idx in by_entity.items():
        idx.sort(key=lambda i: conds[i].start)
        for j, x in enumerate(insts):
            if x["starts_at"] is None or not _notify_entity_matches(x["entity"], ent):
                continue
            h = None
            for i in idx:
                if conds[i].start - MATCH_BEFORE_S <= x["starts_at"]:
                    h = i
            if h is not None:
                end = _notify_end(conds[h])
                if end is None or x["starts_at"] <= end + after_s:
                    home[h].append(x)
                    used.add(j)
            for i in idx:
                c = conds[i]
                if i != h and x["starts_at"] < c.start - MATCH_BEFORE_S and (x.get("close") is None
                                                                            or x["close"] >= c.start):
                    carried[i].append(x)
                    used.add(j)
    return home, carried, used


def notify_hold_s(c: Condition, holds: dict, rules: dict) -> float:
    """How long past what puts the alert on /metrics it must last to notify: the job's
    [job.rules.notify] hold for its alert plus its rule's ``for:`` (for ConsumerLagStatus the
    rule of the lag status the condition raises: WARN for a slow consumer, STALL for a stuck
    one).  The job's own hold (``rule_min_s``) comes on top."""
    rs = rules.get(c.kind) or []
    status = LAG_STATUS_OF.get(c.detail.get("why")) if c.kind == "ConsumerLagStatus" else None
    cand = [r for r in rs if status is not None and r.get("labels", {}).get("status") == status] or rs
    return float(holds.get(c.kind, 0.0)) + min((float(r.get("for_s") or 0.0) for r in cand), default=0.0)


def notify_hold_text(kind: str, holds: dict, rules: dict) -> str:
    rs = rules.get(kind) or []
    job = float(holds.get(kind, 0.0))
    if len(rs) > 1 and any(r.get("labels", {}).get("status") for r in rs):
        return ", ".join(f"{r['labels'].get('status')} {job + float(r.get('for_s') or 0):.0f} s" for r in rs)
    rule_for = min((float(r.get("for_s") or 0.0) for r in rs), default=0.0)
    return f"{job + rule_for:.0f} s"


def notify_context(raw: dict, prefix: str, scope: tuple[float, float], interval_s: float) -> Optional[dict]:
    """What scoring notifications needs from a raw record; None for a record without them."""
    if raw.get("notifications") is None:
        return None
    setup = raw.get("alerting") or {}
    prom, am = setup.get("prometheus") or {}, setup.get("alertmanager") or {}
    until = setup.get("recorded_until") or scope[1]
    cluster = setup.get("cluster")
    amx = am_instances(setup.get("am_alerts") or [], until)
    insts = notification_instances(raw["notifications"])
    _close_instances(insts, amx)

    def in_scope(x: dict) -> bool:
        ent = x["entity"]
        if cluster is not None and x["labels"].get("cluster") != cluster:
            return False
        return ent[0] == "b" or (ent[0] in ("p", "t", "g", "gp", "gt") and ent[1].startswith(prefix))

    scrape = float(prom.get("scrape_interval_s") or 15.0)
    evaluation = float(prom.get("evaluation_interval_s") or 15.0)
    return {"instances": [x for x in insts if in_scope(x)], "other": [x for x in insts if not in_scope(x)],
            "am": [x for x in amx if in_scope(x)], "until": until, "scope": scope, "interval_s": interval_s,
            "scrape_s": scrape, "eval_s": evaluation,
            "group_wait_s": float(am.get("group_wait_s") or 30.0),
            "group_interval_s": float(am.get("group_interval_s") or 300.0),
            "holds": setup.get("holds_s") or NOTIFY_HOLDS_DEFAULT, "rules": setup.get("rules") or {},
            "notifications": len(raw["notifications"])}


def score_notifications(kind: str, conds: list[Condition], rows: list[dict], ctx: dict, healthy: set) -> dict:
    """One alert type: each of its conditions' first firing notification (``rows``: ``match``'s
    rows for ``conds``, annotated in place), and the summary over the episodes the /metrics
    scoring counts (eligible and detected: the same set as its open latency).

    An episode that notified: ``notify_latency_s`` from the condition's start to the webhook's
    receipt of the first firing notification listing an alert of its type on its entity that
    started with it (or ``already_firing``: one that fired before and had not resolved).  One
    that did not, in this order: ``shorter_than_hold`` (it lasted less than the job's hold plus
    its notify hold, ``notify_hold_s``), ``borderline`` (less than that plus a scrape, an
    evaluation and two probe intervals: whether a rule evaluation saw it held is luck),
    ``inhibited`` (Alertmanager listed its alert suppressed by an inhibit rule), ``run_ended``
    (it could still have notified after the recording ended: its /metrics open + notify hold + a
    scrape + an evaluation + group_wait + group_interval), else ``missed``.  A false notification:
    an alert of this type that notified firing and belongs to no condition of its type."""
    insts = [x for x in ctx["instances"] if x["alert"] == kind]
    am = [x for x in ctx["am"] if x["alert"] == kind]
    after = MATCH_AFTER_S + ctx["scrape_s"] + ctx["eval_s"]
    home, carried, used = _assign_instances(conds, insts, after)
    am_home, am_carried, _ = _assign_instances(conds, am, after)
    slack = ctx["scrape_s"] + ctx["eval_s"] + 2 * ctx["interval_s"]
    for i, (c, row) in enumerate(zip(conds, rows)):
        hold = notify_hold_s(c, ctx["holds"], ctx["rules"])
        need = c.rule_min_s + hold
        end = _notify_end(c)
        span = None if end is None else end - c.start
        fired = sorted((x for x in home[i] if x["first_firing"] is not None), key=lambda x: x["first_firing"])
        already = [x for x in carried[i] if x["first_firing"] is not None]
        row.update(notify_hold_s=hold, notify_span_s=span, shorter_than_hold=span is not None and span < need,
                   notified_at=None, notify_latency_s=None, notify_after_metrics_s=None, notify_labels=None)
        if fired:
            at = fired[0]["first_firing"]
            row.update(notify="notified", notified_at=at, notify_latency_s=at - c.start,
                       notify_labels=fired[0]["labels"])
            if row.get("open_at") is not None and not row.get("carried_over"):
                row["notify_after_metrics_s"] = at - row["open_at"]
            continue
        if already:
            row.update(notify="already_firing", notify_labels=already[0]["labels"])
            continue
        opened = row.get("open_at") if row.get("open_at") is not None and not row.get("carried_over") \
            else c.start + c.rule_min_s
        due = opened + hold + ctx["scrape_s"] + ctx["eval_s"] + ctx["group_wait_s"] + ctx["group_interval_s"]
        if span is not None and span < need:
            row["notify"] = "shorter_than_hold"
        elif span is not None and span < need + slack:
            row["notify"] = "borderline"
        elif any(x["inhibited_first"] is not None for x in am_home[i] + am_carried[i]):
            row["notify"] = "inhibited"
        elif due > ctx["until"]:
            row["notify"] = "run_ended"
        else:
            row["notify"] = "missed"
        row["in_alertmanager"] = bool(am_home[i] or am_carried[i])
    sel = [r for r in rows if r["eligible"] and r["detected"] and not r["pre_existing"]]
    notified = [r for r in sel if r["notify"] in ("notified", "already_firing")]
    lat = [r["notify_latency_s"] for r in sel if r["notify"] == "notified"]
    after_metrics = [r["notify_after_metrics_s"] for r in sel if r.get("notify_after_metrics_s") is not None]
    t0, t1 = ctx["scope"]
    false = [x for j, x in enumerate(insts) if j not in used and x["first_firing"] is not None
             and x["starts_at"] is not None and t0 <= x["starts_at"] <= ctx["until"]]
    hours = max(1e-9, (min(ctx["until"], t1) - t0) / 3600.0)
    healthy_false = [x for x in false if _healthy_entity(x["entity"], healthy)]
    out = {"hold": notify_hold_text(kind, ctx["holds"], ctx["rules"]),
           "episodes": len(sel), "notified": len(notified),
           "already_firing": sum(1 for r in sel if r["notify"] == "already_firing"),
           "notified_shorter_than_hold": sum(1 for r in notified if r["shorter_than_hold"]),
           "notify_p50_s": pct(lat, 0.5), "notify_p95_s": pct(lat, 0.95),
           "after_metrics_p50_s": pct(after_metrics, 0.5), "after_metrics_p95_s": pct(after_metrics, 0.95),
           **{k: sum(1 for r in sel if r["notify"] == k) for k in NOT_NOTIFIED},
           "false_notifications": len(false), "false_notifications_per_hour": len(false) / hours,
           "false_notifications_healthy": len(healthy_false),
           "not_notified_list": [{"entity": r["entity"], "scenario": r["scenario"], "repeat": r["repeat"],
                                  "why": r["notify"], "span_s": r["notify_span_s"],
                                  "in_alertmanager": r.get("in_alertmanager")}
                                 for r in sel if r["notify"] not in ("notified", "already_firing")][:50],
           "false_list": [{"labels": x["labels"], "starts_at": x["starts_at"], "first_firing": x["first_firing"],
                           "close": x.get("close")} for x in false][:50]}
    out["expected"] = out["episodes"] - sum(1 for r in sel if r["notify"] in ("shorter_than_hold", "borderline"))
    return out


def notify_other(ctx: dict) -> dict:
    """Notified alerts outside the scored types or scope (the monitor's own health, another
    cluster's, topics not the bench's): per alert name, how many and each one's labels."""
    out: dict[str, list] = {}
    for x in ctx["other"] + [x for x in ctx["instances"] if x["alert"] not in MONITOR_KINDS]:
        if x["first_firing"] is None:
            continue
        out.setdefault(x["alert"] or "?", []).append({"labels": x["labels"], "starts_at": x["starts_at"],
                                                     "first_firing": x["first_firing"], "close": x.get("close")})
    return out


def notify_setup(raw: dict) -> dict:
    """The alerting path's settings, as the results and the table show them."""
    setup = raw.get("alerting") or {}
    prom, am = setup.get("prometheus") or {}, setup.get("alertmanager") or {}
    return {"prometheus": {k: prom.get(k) for k in ("version", "source", "rule_files", "scrape_interval_s",
                                                    "scrape_timeout_s", "evaluation_interval_s")},
            "alertmanager": {"version": am.get("version"), "source": am.get("source"),
                             "group_wait_s": am.get("group_wait_s"), "group_interval_s": am.get("group_interval_s"),
                             "repeat_interval_s": am.get("repeat_interval_s"),
                             "inhibit_rules": len(am.get("inhibit_rules") or []),
                             "receivers": "each replaced by a webhook to the bench (send_resolved)"},
            "holds_s": setup.get("holds_s") or NOTIFY_HOLDS_DEFAULT,
            "rules": {a: [{k: r.get(k) for k in ("for_s", "keep_firing_for_s", "by", "labels")} for r in rs]
                      for a, rs in (setup.get("rules") or {}).items()},
            "notifications": len(raw.get("notifications") or []),
            "recorded_from": setup.get("started_at"), "recorded_until": setup.get("recorded_until"),
            "prometheus_health": setup.get("prometheus_health"), "exited": setup.get("exited"),
            "am_polls": setup.get("am_polls"), "am_poll_failures": setup.get("am_poll_failures"),
            "webhook_errors": setup.get("webhook_errors")}


NOTIFY_HOLDS_DEFAULT = _notify_holds_default()


# ------------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------------

def _f(v, fmt="{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _lat(s: dict, a: str) -> str:
    p50, p95 = s.get(f"{a}_p50_s"), s.get(f"{a}_p95_s")
    if p50 is None:
        return "-"
    return f"{p50:.0f} / {p95:.0f}"


def _recall(s: dict) -> str:
    if not s.get("eligible"):
        return "n/a (0)"
    out = f"{s['detected']}/{s['eligible']} ({100 * s['recall']:.0f}%)"
    if s.get("carried_over"):
        out += f", {s['carried_over']} already firing"
    return out


def _notify_cells(n: Optional[dict]) -> str:
    """The notification columns of a monitor row (``-`` without a notification record)."""
    if not n:
        return "- | - | - | - | - |"
    notes = ([f"{n['already_firing']} already firing"] if n.get("already_firing") else []) + \
        ([f"{n['notified_shorter_than_hold']} shorter than the hold"] if n.get("notified_shorter_than_hold") else [])
    notified = f"{n['notified']}/{n['expected']}" + (f" ({'; '.join(notes)})" if notes else "")
    why = " / ".join(str(n[k]) for k in NOT_NOTIFIED)
    return (f"{n['hold']} | {notified} | {_lat(n, 'notify')} | {why} | "
            f"{n['false_notifications']} ({n['false_notifications_healthy']}) |")


def table(scored: dict) -> str:
    """Markdown: per alert type the monitor's figures and the baseline rule's on the same GT, and
    the monitor's notifications through Prometheus and Alertmanager."""
    notify = scored.get("per_alert_notify") or {}
    lines = ["| condition (GT) | approach | rule (for:) | recall | false alerts/h (healthy parts) | "
             "open on /metrics p50 / p95 s | resolve p50 / p95 s | notify hold | notified / expected | "
             "to notification p50 / p95 s | not notified: shorter than hold / borderline / inhibited / run ended / "
             "missed | false notifications (healthy parts) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    none = " |" * 5  # the notification columns: the monitor's only
    R = RULES
    rule_min = {"PreferredLeaderImbalance": f"{R['imbalance_after_s']:.0f} s",
                "GroupEmptyWithLag": f"{R['empty_with_lag_s']:.0f} s",
                "RebalanceStorm": f"{R['storm_min']} in {R['storm_window_s'] / 60:.0f} min",
                "LeaderChanged": f"resolves {R['leader_quiet_s']:.0f} s after",
                "PartitionCountChanged": f"resolves {R['count_change_window_s']:.0f} s after",
                "ConsumerLagHigh": f"{R['lag_high_for_s']:.0f} s",
                "ConsumerLagStatus": f"STALL {R['stall_after_s']:.0f} s; WARN ~{R['warn_trend_s']:.0f} s",
                "RebalanceStuck": f"{R['stuck_after_s']:.0f} s",
                "HighWatermarkStalled": f"{R['hw_stall_s']:.0f} s", "BrokerStallingWrites": f"{R['stalling_after_s']:.0f} s"}
    base_by_row: dict[str, list] = {}
    for key, s in scored["baseline"].items():
        row, rule = key.split("|")
        base_by_row.setdefault(row, []).append((rule, s))

    def fa(s):
        return f"{_f(s.get('false_alerts_per_hour'), '{:.1f}')} ({_f(s.get('false_alerts_healthy_per_hour'), '{:.1f}')})"

    for kind in MONITOR_KINDS:
        s = scored["per_alert"][kind]
        if not s["conditions"] and not s["false_alerts"]:
            lines.append(f"| {kind} | monitor | {rule_min.get(kind, '-')} | no condition occurred | 0 (0) | - | - | "
                         + _notify_cells(notify.get(kind)))
        else:
            lines.append(f"| {kind} | monitor | {rule_min.get(kind, '-')} | {_recall(s)} | {fa(s)} | {_lat(s, 'open')} | "
                         f"{_lat(s, 'resolve')} | " + _notify_cells(notify.get(kind)))
        for rule, b in base_by_row.get(kind, []):
            spec = BASELINE_RULES[rule]
            lines.append(f"| | Prometheus-only | {rule} ({spec['for_s']:.0f} s) | {_recall(b)} | {fa(b)} | "
                         f"{_lat(b, 'open')} | {_lat(b, 'resolve')} |" + none)
        if kind not in base_by_row and kind not in ("ConsumerLagHigh", "ConsumerLagStatus", "GroupEmptyWithLag"):
            lines.append("| | Prometheus-only | no rule | - | - | - | - |" + none)
    for kind in ("ConsumerStopped", "ConsumerSlow"):
        s = scored["incidents"][kind]["monitor"]
        lines.append(f"| {kind} (incident) | monitor | any of {', '.join(MONITOR_LAG_ALERTS)} | {_recall(s)} | {fa(s)} | "
                     f"{_lat(s, 'open')} | {_lat(s, 'resolve')} |" + none)
        for rule, b in base_by_row.get(kind, []):
            spec = BASELINE_RULES[rule]
            lines.append(f"| | Prometheus-only | {rule} ({spec['for_s']:.0f} s) | {_recall(b)} | {fa(b)} | "
                         f"{_lat(b, 'open')} | {_lat(b, 'resolve')} |" + none)
    lines += notify_footer(scored.get("notify"))
    return "\n".join(lines)


def notify_footer(n: Optional[dict]) -> list[str]:
    """The alerting path's settings under the table (and what else notified)."""
    if n is None:
        return ["", "Notifications: not in this raw record (recorded before the bench ran Prometheus and "
                "Alertmanager): the notification columns are empty."]
    prom, am = n["prometheus"], n["alertmanager"]

    def secs(v):
        return "?" if v is None else f"{v:.0f} s"

    out = ["", f"Notifications: {prom.get('version') or 'prometheus'} scraping the job every "
               f"{secs(prom.get('scrape_interval_s'))}, evaluating every {secs(prom.get('evaluation_interval_s'))} "
               f"({prom.get('source')}; rules {', '.join(prom.get('rule_files') or [])} unmodified) -> "
               f"{am.get('version') or 'alertmanager'} ({am.get('source')}: group_wait {secs(am.get('group_wait_s'))}, "
               f"group_interval {secs(am.get('group_interval_s'))}, repeat_interval {secs(am.get('repeat_interval_s'))}, "
               f"{am.get('inhibit_rules')} inhibit rules; receivers replaced by a webhook); "
               f"{n.get('notifications')} notifications recorded.",
           "notify hold: the job's [job.rules.notify] hold + the rule's for: (on top of the job's own rule "
           "minimum); notified / expected: of the eligible episodes detected on /metrics, those notified and "
           "those that lasted the hold plus a scrape, an evaluation and two probe intervals; to notification: "
           "condition start -> the webhook's receipt of the first firing notification with its alert."]
    other = n.get("other") or {}
    if other:
        out.append("Other alerts notified (the monitor's own, or outside the bench's topics and groups): "
                   + ", ".join(f"{a} x{len(v)}" for a, v in sorted(other.items())))
    health = n.get("prometheus_health") or {}
    if health.get("rules_not_ok"):
        out.append("Prometheus rules not ok at the end: "
                   + "; ".join(f"{r['rule']}: {r['health']} {r.get('error') or ''}" for r in health["rules_not_ok"]))
    bad_targets = [t for t in health.get("targets") or [] if t.get("health") != "up"]
    if bad_targets:
        out.append("Prometheus targets not up at the end: "
                   + "; ".join(f"{t['job']}: {t['health']} {t.get('error') or ''}" for t in bad_targets))
    if n.get("exited"):
        out.append(f"Exited during the run: {n['exited'][:300]}")
    return out
