"""The correctness proof for streaming.rules.partition: tables of observation sequences -> the
transitions they must produce (and nothing else).

Partition steps are ``(t, kind, ...)``: ``md`` (a partition_metadata observation, folded by
the two halves of ``on_partition_metadata``, ``_replication`` and ``_leadership``), ``off``
(partition_offsets), ``tick``, ``blind_tick``, ``pending`` (``note_pending_writes``), ``set_pw``
(the job writing ``pending_writes_at`` directly) and ``seen`` (``on_partition_observed`` with an
interval).  Every table only looks at the alerts it is about; the harness checks after every
step that the state survives a JSON round trip."""

from __future__ import annotations

import copy
import dataclasses
import json
import time

import pytest

from streaming.rules import base as rules
from streaming.rules import partition as rp
from streaming.rules import partition_config as rpc
from streaming.rules import topic as rt
from streaming.rules.base import Alert, Severity

E = "k/t/0"
CFG = rpc.PartitionRulesConfig()
S = 1000
MIN = 60 * S

UNDER, AT = Alert.UNDER_MIN_ISR, Alert.AT_MIN_ISR
LC, PLI = Alert.LEADER_CHANGED, Alert.PREFERRED_LEADER_IMBALANCE
HWS, PU, PCC = Alert.HIGH_WATERMARK_STALLED, Alert.PARTITION_UNOBSERVED, Alert.PARTITION_COUNT_CHANGED


def md(isr=(1, 2, 3), replicas=(1, 2, 3), leader=1, epoch=None, min_isr=None):
    return {"replicas": list(replicas), "isr": list(isr), "leader": leader, "leader_epoch": epoch,
            "min_insync_replicas": min_isr}


def off(hw, metadata_at=None):
    return {"high_watermark": hw, "log_start_offset": 0, "metadata_at": metadata_at}


def json_round_trip(s):
    assert json.loads(json.dumps(s)) == s


def run(steps, only=None, cfg=CFG, order="after"):
    """-> ([(t, alert, action)], final state, [Transition])."""
    s = rp.new_partition("k", "t", 0)
    out = []
    for step in steps:
        t, kind = step[0], step[1]
        if kind == "md":
            if order == "after":
                rp._replication(s, step[2], t, E)
                out += rp._leadership(s, step[2], t, E, cfg)
            else:
                out += rp._leadership(s, step[2], t, E, cfg)
                rp._replication(s, step[2], t, E)
        elif kind == "off":
            if order == "after":
                rp._offsets(s, step[2], t)
                out += rp._progress(s, step[2], t, E, cfg)
            else:
                out += rp._progress(s, step[2], t, E, cfg)
                rp._offsets(s, step[2], t)
        elif kind == "tick":
            out += rp.tick_partition(s, t, E, cfg)
        elif kind == "blind_tick":
            out += rp.tick_partition(s, t, E, cfg, blind=True)
        elif kind == "pending":
            rp.note_pending_writes(s, t)
        elif kind == "set_pw":
            s["pending_writes_at"] = t
        elif kind == "seen":
            out += rp.on_partition_observed(s, t, E, cfg, interval_ms=step[2])
        else:
            raise AssertionError(kind)
        json_round_trip(s)
    if only is not None:
        out = [x for x in out if x.alert in only]
    return [(x.at, x.alert, x.action) for x in out], s, out


def case(name, steps, expected, only):
    return pytest.param(steps, expected, only, id=name)


# ---------------------------------------------------------------------------------------------
# UnderMinIsr / AtMinIsr
# ---------------------------------------------------------------------------------------------

MIN_ISR = {UNDER, AT}
MIN_ISR_CASES = [
    case("min.insync.replicas unknown: neither alert, whatever the ISR",
         [(1000, "md", md([1])), (2000, "md", md([1, 2])), (3000, "md", md([]))], [], MIN_ISR),
    case("RF=1 / min=1 single-replica topic is healthy (at min by design)",
         [(t, "md", md([1], replicas=(1,), min_isr=1)) for t in (1000, 2000, 3000)], [], MIN_ISR),
    case("RF=2 / min=2 is AtMinIsr with every replica in sync: any loss refuses acks=all writes",
         [(t, "md", md([1, 2], replicas=(1, 2), min_isr=2)) for t in (1000, 2000)], [(1000, AT, "open")], MIN_ISR),
    case("min.insync.replicas raised to the replication factor at runtime (3 -> 3): AtMinIsr; lowered: resolved",
         [(1000, "md", md([1, 2, 3], min_isr=2)), (2000, "md", md([1, 2, 3], min_isr=3)),
          (3000, "md", md([1, 2, 3], min_isr=2))],
         [(2000, AT, "open"), (3000, AT, "resolve")], MIN_ISR),
    case("healthy RF=3 / min=2: nothing",
         [(t, "md", md([1, 2, 3], min_isr=2)) for t in (1000, 2000)], [], MIN_ISR),
    case("ISR 3 -> 2 -> 1 with min 2: AtMinIsr, then UnderMinIsr resolving AtMinIsr first; back to 3 resolves",
         [(1000, "md", md([1, 2, 3], min_isr=2)), (2000, "md", md([1, 2])), (3000, "md", md([1])),
          (4000, "md", md([1, 2, 3]))],
         [(2000, AT, "open"), (3000, AT, "resolve"), (3000, UNDER, "open"), (4000, UNDER, "resolve")], MIN_ISR),
    case("partial recovery moves from UnderMinIsr to AtMinIsr",
         [(1000, "md", md([1], min_isr=2)), (2000, "md", md([1, 3], min_isr=2))],
         [(1000, UNDER, "open"), (2000, UNDER, "resolve"), (2000, AT, "open")], MIN_ISR),
    case("staying at min does not open twice",
         [(1000, "md", md([1, 2], min_isr=2)), (2000, "md", md([2, 1], min_isr=2)), (3000, "md", md([1, 2]))],
         [(1000, AT, "open")], MIN_ISR),
    case("RF=3 / min=1 with one replica left is AtMinIsr: one more loss is offline",
         [(1000, "md", md([1, 2, 3], min_isr=1)), (2000, "md", md([1]))], [(2000, AT, "open")], MIN_ISR),
    case("min.insync.replicas above the replication factor: acks=all always fails",
         [(1000, "md", md([1], replicas=(1,), min_isr=2))], [(1000, UNDER, "open")], MIN_ISR),
    case("min ISR known from an earlier observation is used when later ones carry none",
         [(1000, "md", md([1, 2, 3], min_isr=2)), (2000, "md", md([1]))], [(2000, UNDER, "open")], MIN_ISR),
    case("a partition going offline opens neither (OfflinePartition pages); leader back: evaluated again",
         [(1000, "md", md([1, 2, 3], min_isr=2)), (2000, "md", md([1], leader=-1)), (3000, "md", md([1], leader=1))],
         [(3000, UNDER, "open")], MIN_ISR),
    case("an open UnderMinIsr is not resolved by the partition going offline (it got worse)",
         [(1000, "md", md([1], min_isr=2)), (2000, "md", md([], leader=-1)), (3000, "md", md([1, 2, 3]))],
         [(1000, UNDER, "open"), (3000, UNDER, "resolve")], MIN_ISR),
    case("reassignment adding a replica to an RF=3 / min=3 topic: at min until the new one is in sync",
         [(1000, "md", md([1, 2, 3], min_isr=3)), (2000, "md", md([1, 2, 3], replicas=(1, 2, 3, 4))),
          (3000, "md", md([1, 2, 3, 4], replicas=(1, 2, 3, 4)))],
         [(1000, AT, "open"), (3000, AT, "resolve")], MIN_ISR),
]


@pytest.mark.parametrize("steps, expected, only", MIN_ISR_CASES)
def test_min_isr(steps, expected, only):
    assert run(steps, only)[0] == expected


def test_min_isr_evidence_and_severity():
    _, _, out = run([(1000, "md", md([1, 2], min_isr=2)), (2000, "md", md([1]))], MIN_ISR)
    at_open, at_resolve, under_open = out
    assert at_open.severity is Severity.WARNING and under_open.severity is Severity.CRITICAL
    assert at_open.labels == {"cluster": "k", "topic": "t", "partition": 0, "broker": 3}  # the one missing
    assert "broker" not in under_open.labels  # two missing: no single broker to name
    assert under_open.evidence == {"isr": [1], "isr_size": 1, "min_insync_replicas": 2, "replicas": [1, 2, 3],
                                   "replication_factor": 3, "configured_margin": 1}
    assert at_resolve.alert_id == at_open.alert_id
    assert at_resolve.evidence["now"] == "under_min_isr" and at_resolve.evidence["open_since"] == 1000


# ---------------------------------------------------------------------------------------------
# LeaderChanged
# ---------------------------------------------------------------------------------------------

Q = CFG.leader_quiet_ms
LEADER = {LC}
LEADER_CASES = [
    case("first observation is not a change",
         [(1000, "md", md(leader=1, epoch=5))], [], LEADER),
    case("first observation without a leader is not a change either",
         [(1000, "md", md(leader=-1, epoch=5)), (2000, "md", md(leader=-1, epoch=5))], [], LEADER),
    case("same leader and epoch: nothing",
         [(t, "md", md(leader=1, epoch=5)) for t in (1000, 2000, 3000)], [], LEADER),
    case("leader change opens",
         [(1000, "md", md(leader=1, epoch=5)), (2000, "md", md(leader=2, epoch=6))], [(2000, LC, "open")], LEADER),
    case("epoch-only change (the same broker re-elected) is a change",
         [(1000, "md", md(leader=1, epoch=5)), (2000, "md", md(leader=1, epoch=6))], [(2000, LC, "open")], LEADER),
    case("leader change without epochs",
         [(1000, "md", md(leader=1)), (2000, "md", md(leader=2))], [(2000, LC, "open")], LEADER),
    case("an epoch unknown on either side is not compared",
         [(1000, "md", md(leader=1)), (2000, "md", md(leader=1, epoch=5)), (3000, "md", md(leader=1)),
          (4000, "md", md(leader=1, epoch=5))], [], LEADER),
    case("flapping within the quiet window is one episode; resolved by the tick once quiet",
         [(1000, "md", md(leader=1)), (2000, "md", md(leader=2)), (3000, "md", md(leader=1)),
          (4000, "md", md(leader=2)), (4000 + Q - 1, "tick"), (4000 + Q, "tick"), (4000 + Q + 1, "tick")],
         [(2000, LC, "open"), (4000 + Q, LC, "resolve")], LEADER),
    case("each change restarts the quiet window",
         [(1000, "md", md(leader=1)), (2000, "md", md(leader=2)), (2000 + Q - 1, "md", md(leader=3)),
          (2000 + Q, "tick"), (2000 + 2 * Q - 2, "tick"), (2000 + 2 * Q - 1, "tick")],
         [(2000, LC, "open"), (2000 + 2 * Q - 1, LC, "resolve")], LEADER),
    case("a change after the quiet window with no tick in between: old episode resolved, new one opened",
         [(1000, "md", md(leader=1)), (2000, "md", md(leader=2)), (2000 + Q, "md", md(leader=1))],
         [(2000, LC, "open"), (2000 + Q, LC, "resolve"), (2000 + Q, LC, "open")], LEADER),
    case("going offline and back: one episode",
         [(1000, "md", md(leader=1)), (2000, "md", md(leader=-1)), (3000, "md", md(leader=2)),
          (3000 + Q, "tick")],
         [(2000, LC, "open"), (3000 + Q, LC, "resolve")], LEADER),
    case("a stale view (lower epoch, e.g. a second probe with older metadata) is ignored",
         [(1000, "md", md(leader=1, epoch=5)), (2000, "md", md(leader=2, epoch=6)), (2000 + Q, "tick"),
          (3000 + Q, "md", md(leader=1, epoch=5)), (4000 + Q, "md", md(leader=2, epoch=6)),
          (5000 + Q, "md", md(leader=1, epoch=5)), (6000 + Q, "md", md(leader=2, epoch=6))],
         [(2000, LC, "open"), (2000 + Q, LC, "resolve")], LEADER),
    case("a lower epoch seen epoch_reset_after times in a row is believed (re-created topic)",
         [(1000, "md", md(leader=1, epoch=50))] + [(t, "md", md(leader=1, epoch=0)) for t in (2000, 3000, 4000, 5000)],
         [(4000, LC, "open")], LEADER),
    case("an out-of-order (older) observation is ignored",
         [(5000, "md", md(leader=1)), (4000, "md", md(leader=2)), (6000, "md", md(leader=1))], [], LEADER),
    case("tick with no episode does nothing",
         [(1000, "md", md(leader=1)), (1000 + Q, "tick"), (1000 + 10 * Q, "tick")], [], LEADER),
]


@pytest.mark.parametrize("steps, expected, only", LEADER_CASES)
def test_leader_changed(steps, expected, only):
    assert run(steps, only)[0] == expected


def test_leader_changed_evidence_counts_the_episode():
    steps = [(1000, "md", md(leader=1, epoch=5)), (2000, "md", md(leader=2, epoch=6)),
             (3000, "md", md(leader=1, epoch=7)), (4000, "md", md(leader=1, epoch=8)), (4000 + Q, "tick")]
    _, s, out = run(steps, LEADER, cfg=rpc.PartitionRulesConfig(leader_history_max=2))
    opened, resolved = out
    assert opened.evidence == {"old_leader": 1, "new_leader": 2, "old_epoch": 5, "new_epoch": 6, "changes": 1,
                               "preferred_leader": 1, "epoch_reset": False}
    assert opened.severity is Severity.INFO
    assert resolved.alert_id == opened.alert_id
    ev = resolved.evidence
    assert (ev["changes"], ev["first_change_at"], ev["last_change_at"], ev["quiet_for_ms"]) == (3, 2000, 4000, Q)
    assert (ev["leader"], ev["leader_epoch"], ev["open_since"]) == (1, 8, 2000)
    assert ev["history"] == [{"at": 3000, "old_leader": 2, "new_leader": 1, "old_epoch": 6, "new_epoch": 7},
                             {"at": 4000, "old_leader": 1, "new_leader": 1, "old_epoch": 7, "new_epoch": 8}]
    assert ev["history_truncated"] == 1
    assert s["leader_episode"] is None


def test_epoch_reset_is_marked_in_the_evidence():
    steps = [(t, "md", md(leader=1, epoch=e)) for t, e in ((1000, 50), (2000, 0), (3000, 0), (4000, 0))]
    _, _, out = run(steps, LEADER)
    assert [x.evidence["epoch_reset"] for x in out] == [True]
    assert (out[0].evidence["old_epoch"], out[0].evidence["new_epoch"]) == (50, 0)


def test_a_fresh_view_between_stale_ones_restarts_the_reset_count():
    epochs = [(1000, 50), (2000, 0), (3000, 0), (4000, 50), (5000, 0), (6000, 0)]
    steps = [(t, "md", md(leader=1, epoch=e)) for t, e in epochs]
    assert run(steps, LEADER)[0] == []


# ---------------------------------------------------------------------------------------------
# PreferredLeaderImbalance
# ---------------------------------------------------------------------------------------------

IMB = CFG.imbalance_after_ms
IMBALANCE = {PLI}
IMBALANCE_CASES = [
    case("the preferred replica leads: nothing",
         [(1000, "md", md(leader=1)), (1000 + 2 * IMB, "md", md(leader=1)), (1000 + 2 * IMB, "tick")], [], IMBALANCE),
    case("an election blip shorter than the threshold: nothing",
         [(1000, "md", md(leader=1)), (2000, "md", md(leader=2)), (2000 + IMB - 30 * S, "md", md(leader=2)),
          (2000 + IMB - 1, "md", md(leader=1)), (2000 + 3 * IMB, "md", md(leader=1)), (2000 + 3 * IMB, "tick")],
         [], IMBALANCE),
    case("an observation that reaches the threshold opens it",
         [(1000, "md", md(leader=2)), (1000 + IMB - 1, "md", md(leader=2)), (1000 + IMB, "md", md(leader=2)),
          (1000 + IMB + 10 * S, "md", md(leader=2))],
         [(1000 + IMB, PLI, "open")], IMBALANCE),
    case("the tick opens it once it lasted long enough (partition still observed)",
         [(1000, "md", md(leader=2)), (1000 + IMB - 10 * S, "md", md(leader=2)), (1000 + IMB - 1, "tick"),
          (1000 + IMB, "tick")],
         [(1000 + IMB, PLI, "open")], IMBALANCE),
    case("resolves when the preferred replica leads again",
         [(1000, "md", md(leader=3)), (1000 + IMB, "md", md(leader=3)), (2000 + IMB, "md", md(leader=1))],
         [(1000 + IMB, PLI, "open"), (2000 + IMB, PLI, "resolve")], IMBALANCE),
    case("an offline partition is not imbalanced, and going offline resolves it",
         [(1000, "md", md(leader=3)), (1000 + IMB, "md", md(leader=3)), (2000 + IMB, "md", md(leader=-1)),
          (2000 + 3 * IMB, "md", md(leader=-1)), (2000 + 3 * IMB, "tick")],
         [(1000 + IMB, PLI, "open"), (2000 + IMB, PLI, "resolve")], IMBALANCE),
    case("going offline restarts the imbalance clock",
         [(1000, "md", md(leader=2)), (2000, "md", md(leader=-1)), (3000, "md", md(leader=2)),
          (1000 + IMB, "md", md(leader=2)), (3000 + IMB, "md", md(leader=2))],
         [(3000 + IMB, PLI, "open")], IMBALANCE),
    case("reassignment: the new preferred replica must take over within the threshold",
         [(1000, "md", md(leader=1)), (2000, "md", md(leader=1, replicas=(4, 2, 3), isr=(1, 2, 3, 4))),
          (2000 + IMB, "md", md(leader=1, replicas=(4, 2, 3), isr=(2, 3, 4)))],
         [(2000 + IMB, PLI, "open")], IMBALANCE),
    case("not opened by the tick while the partition is unobserved (its leader is unknown by then)",
         [(1000, "md", md(leader=2)), (1000 + IMB, "tick"), (1000 + 2 * IMB, "tick")], [], IMBALANCE),
    case("not opened by the tick from a stale leader view (offsets still flowing); the next metadata opens it",
         [(1000, "md", md(leader=2))] + [(t * 30 * S, "off", off(1)) for t in range(1, 12)]
         + [(1000 + IMB, "tick"), (1000 + IMB + 1, "tick"), (2000 + IMB, "md", md(leader=2))],
         [(2000 + IMB, PLI, "open")], IMBALANCE),
    # a probe sends partition_metadata only when it changes; its offsets say when its metadata
    # last showed the partition (metadata_at), which keeps the view it sent once current
    case("sent once, then confirmed by the offsets' metadata_at: the tick opens it",
         [(1000, "md", md(leader=2))] + [(t * 10 * S + 500, "off", off(t, metadata_at=t * 10 * S))
                                         for t in range(1, 31)] + [(1000 + IMB, "tick")],
         [(1000 + IMB, PLI, "open")], IMBALANCE),
    case("metadata_at stops moving (the source's refreshes fail): the view goes stale, the tick stays quiet",
         [(1000, "md", md(leader=2))] + [(t * 10 * S + 500, "off", off(t, metadata_at=min(t, 3) * 10 * S))
                                         for t in range(1, 31)] + [(1000 + IMB, "tick")],
         [], IMBALANCE),
    case("a metadata_at from the future counts as the observation's own time, no later",
         [(1000, "md", md(leader=2)), (2000, "off", off(1, metadata_at=1000 + 10 * IMB)),
          (1000 + IMB, "tick")],
         [], IMBALANCE),
]


@pytest.mark.parametrize("steps, expected, only", IMBALANCE_CASES)
def test_preferred_leader_imbalance(steps, expected, only):
    assert run(steps, only)[0] == expected


def test_imbalance_evidence():
    _, _, out = run([(1000, "md", md(leader=2)), (1000 + IMB, "md", md(leader=2)), (2000 + IMB, "md", md(leader=1))],
                    IMBALANCE)
    opened, resolved = out
    assert opened.evidence == {"leader": 2, "preferred_leader": 1, "replicas": [1, 2, 3], "imbalanced_since": 1000,
                               "imbalanced_for_ms": IMB, "last_observed_at": 1000 + IMB}
    assert resolved.alert_id == opened.alert_id and resolved.evidence["leader"] == 1


# ---------------------------------------------------------------------------------------------
# HighWatermarkStalled (the canary's reports feed pending writes, streaming/rules/canary.py; the
# rule is driven here through note_pending_writes / the state key)
# ---------------------------------------------------------------------------------------------

ST = CFG.hw_stall_ms
HW = {HWS}
HW_CASES = [
    case("a flat HW without pending writes never fires (an idle topic)",
         [(t * MIN, "off", off(100)) for t in range(1, 60)] + [(61 * MIN, "tick")], [], HW),
    case("writes pending and the HW flat for the stall window: opens; the HW moves: resolves",
         [(1000, "off", off(100)), (2000, "pending"), (1000 + ST // 2, "off", off(100)), (1999 + ST, "off", off(100)),
          (2000 + ST, "off", off(100)), (2000 + ST + 10 * S, "off", off(100)), (80 * S, "off", off(101))],
         [(2000 + ST, HWS, "open"), (80 * S, HWS, "resolve")], HW),
    case("writes pending but the HW keeps moving: nothing",
         [(t * 10 * S, kind, off(100 + t)) if kind == "off" else (t * 10 * S + 1, "pending")
          for t in range(1, 20) for kind in ("off", "pending")],
         [], HW),
    case("writes pending before the HW's last move do not count",
         [(1000, "off", off(100)), (2000, "pending"), (3000, "off", off(101)), (10 * MIN, "off", off(101))], [], HW),
    case("the HW not observed after writes became pending: no claim (PartitionUnobserved speaks)",
         [(1000, "off", off(100)), (2000, "pending"), (10 * MIN, "tick")], [], HW),
    case("pending writes but the HW never observed: nothing",
         [(1000, "pending"), (1000 + 2 * ST, "tick")], [], HW),
    case("pending_writes_at written into the state directly is picked up (by the tick, then the next offsets)",
         [(1000, "off", off(100)), (2000, "set_pw"), (3000, "tick"), (2000 + ST, "off", off(100))],
         [(2000 + ST, HWS, "open")], HW),
    case("pending_writes_at written directly and only the next offsets observation sees it",
         [(1000, "off", off(100)), (2000, "set_pw"), (2000 + ST, "off", off(100))],
         [(2000 + ST, HWS, "open")], HW),
    case("a new stall after recovery is a new episode",
         [(1000, "off", off(100)), (2000, "pending"), (2000 + ST, "off", off(100)), (3000 + ST, "off", off(200)),
          (4000 + ST, "pending"), (4000 + 2 * ST, "off", off(200))],
         [(2000 + ST, HWS, "open"), (3000 + ST, HWS, "resolve"), (4000 + 2 * ST, HWS, "open")], HW),
]


@pytest.mark.parametrize("steps, expected, only", HW_CASES)
def test_high_watermark_stalled(steps, expected, only):
    assert run(steps, only)[0] == expected


def test_hw_stall_evidence_and_new_id_per_episode():
    steps = HW_CASES[-1].values[0]
    _, _, out = run(steps, HW)
    first, resolve, second = out
    assert first.severity is Severity.CRITICAL
    assert first.evidence == {"high_watermark": 100, "hw_unchanged_since": 1000, "pending_writes_since": 2000,
                              "pending_writes_last_seen_at": 2000, "last_hw_observation_at": 2000 + ST,
                              "stalled_for_at_least_ms": ST}
    assert resolve.alert_id == first.alert_id and resolve.evidence["hw_after"] == 200
    assert second.alert_id != first.alert_id


# ---------------------------------------------------------------------------------------------
# PartitionUnobserved
# ---------------------------------------------------------------------------------------------

W = CFG.unobserved_after_ms
UNOBS = {PU}
UNOBSERVED_CASES = [
    case("observed every 10 s: nothing",
         [(t * 10 * S, "md" if t % 2 else "off", md() if t % 2 else off(1)) for t in range(1, 30)]
         + [(t * 10 * S + 5 * S, "tick") for t in range(1, 30)], [], UNOBS),
    case("opens when the window is reached, not before; resolves on the next metadata observation",
         [(1000, "md", md()), (1000 + W - 1, "tick"), (1000 + W, "tick"), (1000 + 2 * W, "tick"),
          (1000 + 3 * W, "md", md())],
         [(1000 + W, PU, "open"), (1000 + 3 * W, PU, "resolve")], UNOBS),
    case("an offsets observation resolves it too",
         [(1000, "off", off(1)), (1000 + W, "tick"), (2000 + W, "off", off(1))],
         [(1000 + W, PU, "open"), (2000 + W, PU, "resolve")], UNOBS),
    case("the observing source's interval, when known, sets the window (3 x interval)",
         [(1000, "seen", 5000), (15999, "tick"), (16000, "tick"), (17000, "md", md())],
         [(16000, PU, "open"), (17000, PU, "resolve")], UNOBS),
    case("blind (the job's sources are silent): not opened",
         [(1000, "md", md()), (1000 + W, "blind_tick"), (1000 + 5 * W, "blind_tick")], [], UNOBS),
    case("an older (out-of-order) observation does not resolve it",
         [(10 * S, "md", md()), (10 * S + W, "tick"), (5 * S, "md", md()), (11 * S + W, "off", off(1))],
         [(10 * S + W, PU, "open"), (11 * S + W, PU, "resolve")], UNOBS),
    case("unobserved again later: a second episode",
         [(1000, "md", md()), (1000 + W, "tick"), (2000 + W, "md", md()), (2000 + 2 * W, "tick")],
         [(1000 + W, PU, "open"), (2000 + W, PU, "resolve"), (2000 + 2 * W, PU, "open")], UNOBS),
]


@pytest.mark.parametrize("steps, expected, only", UNOBSERVED_CASES)
def test_partition_unobserved(steps, expected, only):
    assert run(steps, only)[0] == expected


def test_unobserved_opens_at_its_moment_whatever_the_tick():
    """Jobs that tick at other moments (processing time, a restart) open it under one id."""
    early = run([(1000, "md", md()), (1000 + W, "tick")], UNOBS)[2]
    late = run([(1000, "md", md()), (1000 + W + 28_000, "tick")], UNOBS)[2]
    assert [(o.alert_id, o.at, o.evidence["unobserved_for_ms"]) for o in early] == \
        [(o.alert_id, o.at, o.evidence["unobserved_for_ms"]) for o in late] == [(early[0].alert_id, 1000 + W, W)]


def test_unobserved_evidence():
    _, _, out = run([(1000, "md", md()), (1000 + W, "tick"), (5000 + W, "md", md())], UNOBS)
    opened, resolved = out
    assert opened.severity is Severity.WARNING
    assert opened.evidence == {"last_observed_at": 1000, "unobserved_for_ms": W, "window_ms": W, "interval_ms": None}
    assert resolved.alert_id == opened.alert_id
    assert resolved.evidence == {"observed_at": 5000 + W, "last_observed_at": 1000, "unobserved_for_ms": 4000 + W,
                                 "open_since": 1000 + W}


def test_tick_works_on_a_state_only_the_skeleton_rules_touched():
    """States created before this module (no extra keys) are initialised lazily."""
    s = rp.new_partition("k", "t", 0)
    rp._replication(s, md(), 1000, E)
    assert rp.tick_partition(s, 1000 + W - 1, E, CFG) == []
    got = rp.tick_partition(s, 1000 + W, E, CFG)
    assert [(x.alert, x.action) for x in got] == [(PU, "open")]
    json_round_trip(s)


# ---------------------------------------------------------------------------------------------
# The tick: cheap, and a no-op when nothing is due
# ---------------------------------------------------------------------------------------------


def _observed_partition(leader=1, t=1000):
    s = rp.new_partition("k", "t", 0)
    rp._replication(s, md(leader=leader), t, E)
    rp._leadership(s, md(leader=leader), t, E, CFG)
    return s


@pytest.mark.parametrize("tick_at", [1000, 2000, 1000 + W - 1])
def test_tick_is_a_no_op_when_nothing_is_due(tick_at):
    s = _observed_partition()
    before = copy.deepcopy(s)
    assert rp.tick_partition(s, tick_at, E, CFG) == []
    assert s == before


def test_tick_due_follows_the_earliest_timer():
    s = _observed_partition(leader=1)
    assert s["due"] == 1000 + W                                # only the unobserved timer
    rp._replication(s, md(leader=2), 2000, E)
    rp._leadership(s, md(leader=2), 2000, E, CFG)
    assert s["due"] == 2000 + W                                # unobserved < quiet < imbalance
    rp.on_partition_observed(s, 2000, E, CFG, interval_ms=10 * MIN)
    assert s["due"] == 2000 + min(30 * MIN, Q, IMB)


def test_tick_is_cheap():
    states = [_observed_partition(t=1000) for _ in range(10_000)]
    start = time.perf_counter()
    for s in states:
        rp.tick_partition(s, 2000, E, CFG)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"10,000 not-due ticks took {elapsed:.3f} s"


# ---------------------------------------------------------------------------------------------
# Whole-partition properties
# ---------------------------------------------------------------------------------------------

ALL_PARTITION_CASES = MIN_ISR_CASES + LEADER_CASES + IMBALANCE_CASES + HW_CASES + UNOBSERVED_CASES


def _full(steps, order="after"):
    got, s, out = run(steps, order=order)
    return [(x.alert, x.action, x.alert_id, x.at, x.evidence, x.labels) for x in out], s


@pytest.mark.parametrize("steps, expected, only", ALL_PARTITION_CASES)
def test_deterministic_and_json_serialisable(steps, expected, only):
    first, s1 = _full(steps)
    second, s2 = _full(steps)
    assert first == second and s1 == s2
    for *_, evidence, labels in first:
        json_round_trip(evidence)
        json_round_trip(labels)
    json_round_trip(s1)


@pytest.mark.parametrize("steps, expected, only", ALL_PARTITION_CASES)
def test_calling_before_or_after_the_skeleton_rules_gives_the_same_result(steps, expected, only):
    assert _full(steps, order="after") == _full(steps, order="before")


def test_numpy_values_from_pandas_rows_are_stored_as_python_ints():
    np = pytest.importorskip("numpy")
    s = rp.new_partition("k", "t", 0)
    obs = {"replicas": np.array([1, 2, 3]), "isr": np.array([1]), "leader": np.int64(1),
           "leader_epoch": np.int64(4), "min_insync_replicas": np.int64(2)}
    rp._replication(s, obs, 1000, E)
    out = rp._leadership(s, obs, 1000, E, CFG)
    rp._progress(s, {"high_watermark": np.int64(7)}, 1000, E, CFG)
    mine = {k: v for k, v in s.items() if k not in ("leader_epoch",)}  # rules.py stores leader_epoch as given
    json_round_trip(mine)
    assert [type(s[k]) for k in ("leader_seen", "epoch_seen", "hw_seen")] == [int, int, int]
    json.dumps([x.evidence for x in out])


def test_evict_resolves_the_alerts_of_a_vanished_partition():
    steps = [(1000, "md", md([1], leader=2, min_isr=2)), (2000, "md", md([1], leader=3)), (1000 + IMB, "tick")]
    _, s, _ = run(steps)
    assert set(s["open"]) >= {"UnderMinIsr", "LeaderChanged", "PartitionUnobserved"}
    gone = rules.evict(s, 10 ** 9, 60_000, E, rp.partition_labels(s))
    assert all(x.action == "resolve" for x in gone) and s["open"] == {}


# ---------------------------------------------------------------------------------------------
# PartitionCountChanged (topic entity)
# ---------------------------------------------------------------------------------------------

TE = "k/orders"
PW = CFG.count_change_window_ms


def chg(source, old, new, seen_at, unseen=None):
    return {"topic": "orders", "old_count": old, "new_count": new, "unseen_for_at_most_ms": unseen,
            "source": source, "seen_at": seen_at}


def run_topic(steps, cfg=CFG):
    s = rt.new_topic("k", "orders")
    out = []
    for t, kind, *rest in steps:
        if kind == "chg":
            out += rt.on_partition_count_change(s, rest[0], t, TE, cfg)
        else:
            out += rt.tick_topic(s, t, TE, cfg)
        json_round_trip(s)
    return [(x.at, x.action) for x in out], s, out


TOPIC_CASES = [
    pytest.param([(1000, "chg", chg("p", 3, 6, 1000))], [(1000, "open")], id="first report opens"),
    pytest.param([(1000, "chg", chg("p", 3, 6, 1000)), (2000, "chg", chg("app-1", 3, 6, 2000)),
                  (1000 + PW - 1, "tick"), (1000 + PW, "tick"), (2000 + PW, "tick")],
                 [(1000, "open"), (1000 + PW, "resolve")],
                 id="a second client joins the episode; the window resolves it"),
    pytest.param([(1000, "chg", chg("p", 3, 6, 1000)), (1000, "tick"), (PW, "tick")], [(1000, "open")],
                 id="tick before the window is a no-op"),
    pytest.param([(1000, "tick"), (10 * PW, "tick")], [], id="tick with no episode is a no-op"),
    pytest.param([(1000, "chg", chg("p", 3, 3, 1000))], [], id="old == new is not a change"),
    pytest.param([(1000, "chg", chg("p", 3, 6, 1000)), (5000, "chg", chg("p", 6, 9, 5000))],
                 [(1000, "open"), (5000, "resolve"), (5000, "open")], id="a second change while open: new episode"),
    pytest.param([(1000, "chg", chg("p", 3, 6, 1000)), (5000, "chg", chg("p", 6, 9, 5000)),
                  (6000, "chg", chg("app-1", 3, 6, 6000)), (7000, "chg", chg("app-2", 3, 9, 7000))],
                 [(1000, "open"), (5000, "resolve"), (5000, "open")],
                 id="a late report of an earlier change is stale, not a new change; a jump to the current count joins"),
    pytest.param([(1000, "chg", chg("p", 3, 6, 1000)), (1000 + PW, "tick"),
                  (2000 + PW, "chg", chg("old-producer", 3, 6, 2000 + PW))],
                 [(1000, "open"), (1000 + PW, "resolve"), (2000 + PW, "open")],
                 id="a client catching up after the window opens a late_catch_up episode"),
    pytest.param([(1000, "chg", chg("p", 6, 9, 1000)), (1000 + PW, "tick"),
                  (5000 + PW, "chg", chg("p", 9, 4, 5000 + PW))],
                 [(1000, "open"), (1000 + PW, "resolve"), (5000 + PW, "open")],
                 id="fewer partitions from a client that had the current count: a re-created topic"),
    pytest.param([(1000, "chg", chg("p", 3, 6, 1000)), (2000, "chg", chg("p", 3, 6, 2000))], [(1000, "open")],
                 id="the same client twice: one record"),
]


@pytest.mark.parametrize("steps, expected", TOPIC_CASES)
def test_partition_count_changed(steps, expected):
    assert run_topic(steps)[0] == expected


def test_partition_count_changed_collects_each_clients_catch_up():
    steps = [(61_000, "chg", chg("probe-a", 3, 6, 60_000, unseen=10_000)),       # changed in (50 s, 60 s]
             (300_000, "chg", chg("app-1", 3, 6, 300_000, unseen=280_000)),       # (20 s, 300 s]
             (310_000, "chg", chg("app-2", 3, 6, 310_000)),                         # bound unknown
             (310_500, "chg", chg("probe-a", 3, 6, 310_500, unseen=10_000)),      # repeat: ignored
             (61_000 + PW - 1, "tick"), (61_000 + PW, "tick")]
    got, s, out = run_topic(steps)
    assert got == [(61_000, "open"), (61_000 + PW, "resolve")]
    opened, resolved = out
    assert opened.alert is PCC and opened.severity is Severity.INFO
    assert opened.labels == {"cluster": "k", "topic": "orders"}
    assert opened.evidence == {"old_count": 3, "new_count": 6, "first_seen_by": "probe-a", "first_seen_at": 60_000,
                               "unseen_for_at_most_ms": 10_000, "late_catch_up": False, "changed_by": 60_000,
                               "changed_after": 50_000}
    assert resolved.alert_id == opened.alert_id
    ev = resolved.evidence
    assert (ev["changed_after"], ev["changed_by"], ev["bounds_consistent"]) == (50_000, 60_000, True)
    assert (ev["reason"], ev["window_ms"], ev["open_since"]) == ("window elapsed", PW, 61_000)
    assert ev["clients"] == [
        {"source": "probe-a", "seen_at": 60_000, "old_count": 3, "unseen_for_at_most_ms": 10_000,
         "stale_for_at_least_ms": 0, "stale_for_at_most_ms": 10_000},
        {"source": "app-1", "seen_at": 300_000, "old_count": 3, "unseen_for_at_most_ms": 280_000,
         "stale_for_at_least_ms": 240_000, "stale_for_at_most_ms": 250_000},
        {"source": "app-2", "seen_at": 310_000, "old_count": 3, "unseen_for_at_most_ms": None,
         "stale_for_at_least_ms": 250_000, "stale_for_at_most_ms": 260_000},
    ]
    assert (ev["clients_reported"], ev["clients_not_listed"]) == (3, 0)
    assert s["episode"] is None and s["open"] == {}


def test_inconsistent_bounds_claim_no_upper_bound():
    """app-1 refreshed at 100 s and still got 3 partitions although probe-a saw 6 at 60 s (a broker
    with a stale metadata cache, or clock skew): no instant fits both, so no "at most"."""
    steps = [(60_000, "chg", chg("probe-a", 3, 6, 60_000, unseen=10_000)),
             (400_000, "chg", chg("app-1", 3, 6, 400_000, unseen=300_000)), (60_000 + PW, "tick")]
    ev = run_topic(steps)[2][-1].evidence
    assert (ev["changed_after"], ev["changed_by"], ev["bounds_consistent"]) == (100_000, 60_000, False)
    bounds = [(c["stale_for_at_least_ms"], c["stale_for_at_most_ms"]) for c in ev["clients"]]
    assert bounds == [(0, None), (340_000, None)]


def test_superseded_episode_evidence_and_distinct_ids_in_the_same_millisecond():
    _, s, out = run_topic([(1000, "chg", chg("p", 3, 6, 1000)), (1000, "chg", chg("q", 6, 9, 1000))])
    first, resolved, second = out
    assert resolved.alert_id == first.alert_id
    assert second.alert_id != first.alert_id
    assert resolved.evidence["reason"] == "superseded"
    assert resolved.evidence["superseded_by"] == {"old_count": 6, "new_count": 9}
    assert second.evidence["old_count"] == 6 and s["partition_count"] == 9


def test_late_catch_up_evidence():
    steps = [(1000, "chg", chg("p", 3, 6, 1000, unseen=500)), (1000 + PW, "tick"),
             (2000 + PW, "chg", chg("old-producer", 3, 6, 2000 + PW, unseen=PW + 1600)), (2000 + 2 * PW, "tick")]
    _, _, out = run_topic(steps)
    late_open, late_resolve = out[2], out[3]
    assert late_open.evidence["late_catch_up"] is True
    assert late_resolve.evidence["clients"] == [
        {"source": "old-producer", "seen_at": 2000 + PW, "old_count": 3, "unseen_for_at_most_ms": PW + 1600,
         "stale_for_at_least_ms": 1000 + PW, "stale_for_at_most_ms": 1500 + PW}]


def test_stale_reports_are_counted():
    steps = [(1000, "chg", chg("p", 3, 6, 1000)), (5000, "chg", chg("p", 6, 9, 5000)),
             (6000, "chg", chg("app-1", 3, 6, 6000)), (5000 + PW, "tick")]
    _, _, out = run_topic(steps)
    assert out[-1].evidence["stale_reports_of_earlier_changes"] == 1
    assert [c["source"] for c in out[-1].evidence["clients"]] == ["p"]


def test_client_list_is_bounded():
    cfg = rpc.PartitionRulesConfig(count_change_clients_max=50)
    steps = [(1000 + i, "chg", chg(f"app-{i}", 3, 6, 1000 + i)) for i in range(60)] + [(1000 + PW, "tick")]
    _, s, out = run_topic(steps, cfg)
    ev = out[-1].evidence
    assert len(ev["clients"]) == 50 and ev["clients_not_listed"] == 10 and ev["clients_reported"] == 60
    assert ev["clients"][-1]["source"] == "app-49"


def test_topic_state_is_evictable_and_ticks_survive_an_eviction():
    _, s, _ = run_topic([(1000, "chg", chg("p", 3, 6, 1000))])
    gone = rules.evict(s, 1000 + 10 ** 7, 60_000, TE, rt.topic_labels(s))
    assert [(x.alert, x.action) for x in gone] == [(PCC, "resolve")]
    assert rt.tick_topic(s, 1000 + 10 ** 7, TE, CFG) == [] and s["episode"] is None


def test_topic_rules_are_deterministic():
    steps = TOPIC_CASES[6].values[0]
    a = [(x.alert_id, x.evidence) for x in run_topic(steps)[2]]
    b = [(x.alert_id, x.evidence) for x in run_topic(steps)[2]]
    assert a == b


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def test_config_defaults():
    assert dataclasses.asdict(CFG) == {
        "leader_quiet_ms": 300_000, "leader_history_max": 20, "epoch_reset_after": 3,
        "imbalance_after_ms": 300_000, "hw_stall_ms": 10_000, "unobserved_after_ms": 60_000,
        "unobserved_intervals": 3, "count_change_window_ms": 900_000, "count_change_clients_max": 50}


@pytest.mark.parametrize("field, value", [
    ("leader_quiet_ms", 0), ("imbalance_after_ms", -1), ("hw_stall_ms", 1.5), ("unobserved_after_ms", "60s"),
    ("count_change_clients_max", True), ("epoch_reset_after", None)])
def test_config_is_validated(field, value):
    with pytest.raises(rpc.PartitionRulesConfigError, match=f"partition_rules.{field}: must be"):
        rpc.PartitionRulesConfig(**{field: value})


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CFG.hw_stall_ms = 1  # type: ignore[misc]


def test_a_state_saved_before_md_confirmed_at_existed_gets_it():
    s = rp.new_partition("k", "t", 0)
    rp._progress(s, off(1), 1000, E, CFG)
    del s["md_confirmed_at"]  # what a checkpoint from before that key holds
    rp._progress(s, off(2, metadata_at=1500), 2000, E, CFG)
    assert s["md_confirmed_at"] == 1500
