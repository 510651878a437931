"""The correctness proof for the group, client and source rules: tables of observation
sequences -> the transitions they must produce (and nothing else).

Every run below also checks, after every step, that the entity state survives a JSON round
trip unchanged (it lives in Spark's state store) and stays within its caps."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from streaming.rules import base as rules
from streaming.rules import group as rg
from streaming.rules import client as rc
from streaming.rules import source as rsrc
from streaming.rules.base import Alert, Severity

S = 1_000
M = 60_000
CFG = rg.GroupRulesConfig()
#: the cases below count the factors' limits alone; the silence grace has its own tests
CCFG = rc.ClientRulesConfig(silence_grace_ms=0)
SCFG = rsrc.SourceRulesConfig(silence_grace_ms=0)
GE, CE, SE = "k/g", "k/probe-1", "k/probe-1"

STORM, STUCK, EMPTY = Alert.REBALANCE_STORM, Alert.REBALANCE_STUCK, Alert.GROUP_EMPTY_WITH_LAG
STALE, RSTORM, SILENT = Alert.METADATA_STALE, Alert.METADATA_REFRESH_STORM, Alert.SOURCE_SILENT


def _check_state(s: dict, cfg) -> None:
    assert json.loads(json.dumps(s)) == s
    for key, cap in (("rebalances", "rebalance_history_cap"), ("invalidations", "refresh_history_cap")):
        if key in s:
            assert len(s[key]) <= getattr(cfg, cap)
    for key in ("rebalances", "invalidations"):
        ts = [e[0] for e in s.get(key, ())]
        assert ts == sorted(ts)


# ---------------------------------------------------------------------------------------------
# Group: steps are ("gs", t, obs) | ("rb", t, obs) | ("tick", t, lags)
# ---------------------------------------------------------------------------------------------


def gs(t, state, gen=None, members=0):
    return ("gs", t, {"group": "g", "state": state, "generation": gen,
                      "members": [{"member_id": f"m{i}"} for i in range(members)]})


def rb(t, gen=None, member="m1", phase="assigned"):
    return ("rb", t, {"group": "g", "phase": phase, "member_id": member, "generation": gen})


def tick(t, lags=()):
    return ("tick", t, list(lags))


def run_group(steps, cfg=CFG, full=False):
    s = rg.new_group("k", "g")
    out = []
    for kind, t, arg in steps:
        if kind == "gs":
            got = rg.on_group_state(s, arg, t, GE, cfg)
        elif kind == "rb":
            got = rg.on_rebalance(s, arg, t, GE, cfg)
        else:
            got = rg.tick_group(s, t, GE, cfg, arg)
        _check_state(s, cfg)
        out += got if full else [(x.at, x.alert, x.action) for x in got]
    return out, s


def bounce(t0, times, step=M, gap=10 * S):
    """Stable -> PreparingRebalance -> Stable, ``times`` times, one every ``step``."""
    out = [gs(t0, "Stable", members=3)]
    for i in range(times):
        t = t0 + (i + 1) * step
        out += [gs(t, "PreparingRebalance", members=3), gs(t + gap, "Stable", members=3)]
    return out


def generations(t0, gens, step=M, members=("m1", "m2", "m3")):
    """Each generation assigned to every member, 200 ms apart."""
    return [rb(t0 + i * step + j * 200, gen=g, member=m) for i, g in enumerate(gens) for j, m in enumerate(members)]


# (name, steps, expected transitions, expected rebalances counted in total)
GROUP_CASES = [
    # ---- counting a rebalance once
    ("three members reporting the same generation are one rebalance",
     [rb(1000, 7, "m1"), rb(1200, 7, "m2"), rb(1500, 7, "m3")], [], 1),
    ("the same generation reported late (after W/2) is still one rebalance",
     [rb(1000, 7, "m1"), rb(5 * M, 7, "m2")], [], 1),
    ("members without a generation within the merge window are one rebalance",
     [rb(1000, None, "m1"), rb(2000, None, "m2"), rb(5500, None, "m3")], [], 1),
    ("members without a generation further apart than the merge window are two",
     [rb(1000, None, "m1"), rb(1000 + 5 * S + 1, None, "m2")], [], 2),
    ("a member without a generation and one with it, together: one rebalance",
     [rb(1000, None, "m1"), rb(1500, 8, "m2"), rb(1600, 8, "m3")], [], 1),
    ("revoked / lost / join_started / failed are not counted (they carry the old generation)",
     [rb(1000, 6, "m1", "revoked"), rb(1100, 6, "m2", "lost"), rb(1200, None, "m3", "join_started"),
      rb(1300, 6, "m3", "failed"), rb(2000, 7, "m1"), rb(2100, 7, "m2")], [], 1),
    ("a brief PreparingRebalance is one rebalance and nothing else",
     [gs(0, "Stable"), gs(30 * S, "PreparingRebalance"), gs(60 * S, "Stable")], [], 1),
    ("PreparingRebalance -> CompletingRebalance -> Stable is one rebalance",
     [gs(0, "Stable"), gs(10 * S, "PreparingRebalance"), gs(20 * S, "CompletingRebalance"), gs(30 * S, "Stable")],
     [], 1),
    ("CompletingRebalance -> PreparingRebalance is a new round (a new generation)",
     [gs(0, "Stable"), gs(10 * S, "PreparingRebalance"), gs(20 * S, "CompletingRebalance"),
      gs(30 * S, "PreparingRebalance"), gs(40 * S, "Stable")], [], 2),
    ("the poll missed PreparingRebalance: Stable -> CompletingRebalance counts",
     [gs(0, "Stable"), gs(10 * S, "CompletingRebalance"), gs(20 * S, "Stable")], [], 1),
    ("the first observation already rebalancing is not an entry (nothing came before it)",
     [gs(0, "PreparingRebalance"), gs(10 * S, "Stable")], [], 0),
    ("Empty -> PreparingRebalance (first member joins) counts",
     [gs(0, "Empty"), gs(10 * S, "PreparingRebalance"), gs(20 * S, "Stable")], [], 1),
    ("Stable -> Empty and Empty -> Stable: the polls missed whole rebalances, each counts",
     [gs(0, "Stable", members=1), gs(30 * S, "Empty"), gs(60 * S, "Stable", members=1)], [], 2),
    ("Stable -> Empty with the generation known: still one",
     [gs(0, "Stable", gen=3, members=1), gs(30 * S, "Empty", gen=4)], [], 1),
    ("transitions to and from Dead (other than into a rebalance) are not counted",
     [gs(0, "Empty"), gs(30 * S, "Dead"), gs(60 * S, "Empty"), gs(90 * S, "Dead"), gs(120 * S, "Stable")], [], 0),
    ("Dead -> PreparingRebalance (a group id reused) counts",
     [gs(0, "Dead"), gs(30 * S, "PreparingRebalance"), gs(60 * S, "Stable")], [], 1),
    ("Unknown is no information: Stable -> Unknown -> PreparingRebalance counts once",
     [gs(0, "Stable"), gs(10 * S, "Unknown"), gs(20 * S, "PreparingRebalance"), gs(30 * S, "Unknown"),
      gs(40 * S, "PreparingRebalance"), gs(50 * S, "Stable")], [], 1),
    ("a state name outside the contract is Unknown",
     [gs(0, "Stable"), gs(10 * S, "Rebalancing?"), gs(20 * S, "Stable")], [], 0),
    ("consumer protocol (KIP-848): Stable -> Assigning -> Reconciling -> Stable is one rebalance",
     [gs(0, "Stable"), gs(10 * S, "Assigning"), gs(20 * S, "Reconciling"), gs(30 * S, "Stable")], [], 1),
    ("consumer protocol: Reconciling -> Assigning is a new round (a new group epoch)",
     [gs(0, "Stable"), gs(10 * S, "Reconciling"), gs(20 * S, "Assigning"), gs(30 * S, "Stable")], [], 2),
    ("consumer protocol: Empty -> Reconciling (the poll missed Assigning) counts",
     [gs(0, "Empty"), gs(10 * S, "Reconciling"), gs(20 * S, "Stable")], [], 1),
    ("coordinator sees the start, three members the end (generation): one rebalance",
     [gs(0, "Stable", members=3), gs(10 * S, "PreparingRebalance", members=3),
      rb(15 * S, 6, "m1"), rb(15 * S + 100, 6, "m2"), rb(15 * S + 300, 6, "m3"), gs(40 * S, "Stable", members=3)],
     [], 1),
    ("coordinator sees the start, members without generation the end: one rebalance",
     [gs(0, "Stable"), gs(10 * S, "PreparingRebalance"), rb(15 * S, None, "m1"), rb(16 * S, None, "m2"),
      gs(40 * S, "Stable")], [], 1),
    ("the coordinator's report arriving after the members' (out of order across batches): one rebalance",
     [gs(0, "Stable"), rb(20 * S, 6, "m1"), gs(15 * S, "PreparingRebalance"), gs(40 * S, "Stable")], [], 1),
    ("a generation change between two polls (rebalance missed by both) counts",
     [gs(0, "Stable", gen=5), gs(30 * S, "Stable", gen=6)], [], 1),
    ("generation change and PreparingRebalance entry of the same rebalance: one",
     [gs(0, "Stable", gen=5), gs(30 * S, "PreparingRebalance", gen=5), gs(60 * S, "Stable", gen=6)], [], 1),
    ("generation from the coordinator and from the members: one",
     [gs(0, "Stable", gen=5), gs(30 * S, "PreparingRebalance", gen=5), rb(40 * S, 6, "m1"), rb(40 * S + 50, 6, "m2"),
      gs(60 * S, "Stable", gen=6)], [], 1),
    ("the first generation seen is a baseline, not a rebalance",
     [gs(0, "Stable", gen=41), gs(30 * S, "Stable", gen=41)], [], 0),
    ("a group_state report older than the latest one is ignored",
     [gs(0, "Stable"), gs(60 * S, "Stable"), gs(30 * S, "PreparingRebalance"), gs(90 * S, "Stable")], [], 0),

    # ---- RebalanceStorm
    ("polls bouncing Stable -> PreparingRebalance -> Stable five times within W: storm opens, "
     "resolves when the window slides past the first",
     bounce(0, 5) + [tick(5 * M + 10 * S), tick(1 * M + 10 * M), tick(1 * M + 10 * M + 1)],
     [(5 * M, STORM, "open"), (11 * M + 1, STORM, "resolve")], 5),
    ("four bounces within W: no storm",
     bounce(0, 4) + [tick(5 * M)], [], 4),
    ("five rebalances spread over more than W: no storm",
     bounce(0, 5, step=3 * M) + [tick(16 * M)], [], 5),
    ("five generations, three members each, a minute apart: storm opens at the fifth, once",
     generations(0, [11, 12, 13, 14, 15]) + [tick(4 * M + 30 * S), tick(10 * M), tick(10 * M + 1)],
     [(4 * M, STORM, "open"), (10 * M + 1, STORM, "resolve")], 5),
    ("a storm keeps going: stays open while the count stays >= N",
     generations(0, range(1, 9), members=("m1",)) + [tick(8 * M), tick(13 * M)],
     [(4 * M, STORM, "open")], 8),
    ("a later rebalance reopens a resolved storm (a new episode)",
     bounce(0, 5) + [tick(11 * M + 1)] + [gs(12 * M, "PreparingRebalance"), gs(12 * M + 10 * S, "Stable")],
     # at 12 min the window holds 2, 3, 4, 5, 12: five again; 10 s later the one at 2 min is out
     [(5 * M, STORM, "open"), (11 * M + 1, STORM, "resolve"), (12 * M, STORM, "open"),
      (12 * M + 10 * S, STORM, "resolve")], 6),

    # ---- RebalanceStuck
    ("stuck in CompletingRebalance for more than T: stuck opens; Stable resolves",
     [gs(0, "Stable"), gs(1 * M, "CompletingRebalance"), gs(3 * M, "CompletingRebalance"),
      gs(6 * M + 1, "CompletingRebalance"), gs(7 * M, "CompletingRebalance"), gs(8 * M, "Stable")],
     [(6 * M + 1, STUCK, "open"), (8 * M, STUCK, "resolve")], 1),
    ("rebalancing for exactly T is not stuck",
     [gs(0, "Stable"), gs(1 * M, "CompletingRebalance"), gs(6 * M, "CompletingRebalance"), gs(6 * M + 5, "Stable")],
     [], 1),
    ("Preparing and Completing alternating count as continuously rebalancing",
     [gs(0, "PreparingRebalance"), gs(2 * M, "CompletingRebalance"), gs(4 * M, "PreparingRebalance"),
      gs(5 * M + 1, "CompletingRebalance")],
     [(5 * M + 1, STUCK, "open")], 1),
    ("consumer protocol: stuck Reconciling for more than T opens stuck; Stable resolves",
     [gs(0, "Stable"), gs(1 * M, "Assigning"), gs(2 * M, "Reconciling"), gs(6 * M + 1, "Reconciling"),
      gs(7 * M, "Stable")],
     [(6 * M + 1, STUCK, "open"), (7 * M, STUCK, "resolve")], 1),
    ("the first observation already rebalancing starts the timer then",
     [gs(0, "PreparingRebalance"), gs(5 * M, "PreparingRebalance"), gs(5 * M + 1, "PreparingRebalance")],
     [(5 * M + 1, STUCK, "open")], 0),
    ("an Unknown report breaks the continuity (the timer restarts)",
     [gs(0, "PreparingRebalance"), gs(2 * M, "Unknown"), gs(4 * M, "PreparingRebalance"),
      gs(9 * M, "PreparingRebalance"), gs(9 * M + 1, "PreparingRebalance")],
     [(9 * M + 1, STUCK, "open")], 0),
    ("an Unknown report does not resolve an open stuck",
     [gs(0, "PreparingRebalance"), gs(6 * M, "PreparingRebalance"), gs(7 * M, "Unknown"), gs(8 * M, "Stable")],
     [(6 * M, STUCK, "open"), (8 * M, STUCK, "resolve")], 0),
    ("Dead resolves stuck (the group left the rebalancing states)",
     [gs(0, "PreparingRebalance"), gs(6 * M, "PreparingRebalance"), gs(7 * M, "Dead")],
     [(6 * M, STUCK, "open"), (7 * M, STUCK, "resolve")], 0),
    ("ticks never open stuck (a claim needs a report)",
     [gs(0, "Stable"), gs(1 * M, "PreparingRebalance"), tick(30 * M)], [], 1),

    # ---- GroupEmptyWithLag
    ("Empty with lag 0: nothing",
     [gs(0, "Empty"), tick(0, [0, 0]), tick(30 * M, [0, 0])], [], 0),
    ("Empty with lag > 0 for less than T: nothing",
     [gs(0, "Empty"), tick(0, [5, 0]), tick(5 * M, [7, 0]), tick(10 * M, [9, 0])], [], 0),
    ("Empty with lag > 0 for more than T: opens; members come back: resolves",
     [gs(0, "Empty"), tick(0, [5, 0]), tick(10 * M + 1, [9, 0]), tick(12 * M, [9, 0]),
      gs(13 * M, "Stable", members=2), tick(13 * M, [9, 0])],
     [(10 * M + 1, EMPTY, "open"), (13 * M, EMPTY, "resolve")], 1),
    ("the lag reaching 0 resolves",
     [gs(0, "Empty"), tick(0, [5]), tick(11 * M, [5]), tick(12 * M, [0])],
     [(10 * M + 1, EMPTY, "open"), (12 * M, EMPTY, "resolve")], 0),
    ("unknown lags don't count: all unknown never opens",
     [gs(0, "Empty"), tick(0, [None, None]), tick(11 * M, [None, None]), tick(30 * M, [None])], [], 0),
    ("unknown lags don't count: known zeros with unknowns is no lag",
     [gs(0, "Empty"), tick(0, [None, 0]), tick(11 * M, [None, 0])], [], 0),
    ("unknown lags don't count: one known lag is enough",
     [gs(0, "Empty"), tick(0, [None, 3]), tick(11 * M, [None, 3])], [(10 * M + 1, EMPTY, "open")], 0),
    ("all lags unknown holds an open alert (no recovery)",
     [gs(0, "Empty"), tick(0, [4]), tick(11 * M, [4]), tick(12 * M, [None]), tick(13 * M, [])],
     [(10 * M + 1, EMPTY, "open")], 0),
    ("the lag timer starts at the first tick that sees lag, not when the group emptied",
     [gs(0, "Empty"), tick(5 * M, [0]), tick(6 * M, [4]), tick(16 * M, [4]), tick(16 * M + 1, [4])],
     [(16 * M + 1, EMPTY, "open")], 0),
    ("lag back at 0 restarts the timer",
     [gs(0, "Empty"), tick(0, [4]), tick(9 * M, [0]), tick(10 * M + 1, [4]), tick(20 * M, [4]), tick(20 * M + 2, [4])],
     [(20 * M + 2, EMPTY, "open")], 0),
    ("lag while not Empty is not this alert",
     [gs(0, "Stable", members=1), tick(0, [100]), tick(30 * M, [100])], [], 0),
    ("Dead resolves GroupEmptyWithLag (no offsets to be behind on)",
     [gs(0, "Empty"), tick(0, [4]), tick(11 * M, [4]), gs(12 * M, "Dead"), tick(13 * M, [4])],
     [(10 * M + 1, EMPTY, "open"), (12 * M, EMPTY, "resolve")], 0),
    ("Unknown holds an open GroupEmptyWithLag, then Empty again keeps it open without reopening",
     [gs(0, "Empty"), tick(0, [4]), tick(11 * M, [4]), gs(12 * M, "Unknown"), tick(12 * M, [4]),
      gs(13 * M, "Empty"), tick(13 * M, [4]), tick(30 * M, [4])],
     [(10 * M + 1, EMPTY, "open")], 0),
    ("lag 0 resolves even while the coordinator's last word is Unknown",
     [gs(0, "Empty"), tick(0, [4]), tick(11 * M, [4]), gs(12 * M, "Unknown"), tick(12 * M, [0])],
     [(10 * M + 1, EMPTY, "open"), (12 * M, EMPTY, "resolve")], 0),
    ("Unknown does not start the lag timer",
     [gs(0, "Unknown"), tick(0, [4]), tick(30 * M, [4])], [], 0),
]


@pytest.mark.parametrize("name, steps, expected, counted", GROUP_CASES, ids=[c[0] for c in GROUP_CASES])
def test_group_rules(name, steps, expected, counted):
    got, s = run_group(steps)
    assert got == expected
    assert s["rebalances_total"] == counted


def test_storm_evidence_and_alert_identity():
    got, s = run_group(bounce(0, 5, gap=5 * S) + [tick(11 * M + 1)], full=True)
    opened, resolved = got
    assert (opened.alert, opened.action, opened.severity) == (STORM, "open", Severity.WARNING)
    assert opened.labels == {"cluster": "k", "group": "g"}
    assert opened.evidence["count"] == 5 and opened.evidence["threshold"] == 5
    assert opened.evidence["window_ms"] == 10 * M
    assert [r["at"] for r in opened.evidence["rebalances"]] == [1 * M, 2 * M, 3 * M, 4 * M, 5 * M]
    assert resolved.alert_id == opened.alert_id
    assert resolved.evidence["count"] == 4 and resolved.evidence["open_since"] == 5 * M


def test_storm_evidence_carries_generations():
    got, _ = run_group(generations(0, [21, 22, 23, 24, 25]), full=True)
    (opened,) = got
    assert [r["generation"] for r in opened.evidence["rebalances"]] == [21, 22, 23, 24, 25]


def test_stuck_evidence_and_severity():
    got, _ = run_group([gs(0, "Stable", gen=3), gs(1 * M, "CompletingRebalance", gen=4, members=2),
                        gs(4 * M, "CompletingRebalance", gen=4, members=2),
                        gs(6 * M + 1, "CompletingRebalance", gen=4, members=2), gs(7 * M, "Stable", gen=4)], full=True)
    opened, resolved = got
    assert opened.severity is Severity.CRITICAL
    assert opened.evidence == {"state": "CompletingRebalance", "rebalancing_since": 1 * M, "duration_ms": 5 * M + 1,
                               "threshold_ms": 5 * M, "reports": 3, "generation": 4, "members": 2}
    assert resolved.alert_id == opened.alert_id and resolved.evidence["state"] == "Stable"


def test_empty_with_lag_evidence_sums_known_lags():
    got, _ = run_group([gs(0, "Empty"), tick(0, [5, 0, None, 7]), tick(11 * M, [5, 0, None, 7])], full=True)
    (opened,) = got
    assert opened.severity is Severity.WARNING
    assert opened.evidence == {"total_lag": 12, "max_lag": 7, "lagging_partitions": 2, "known_partitions": 3,
                               "unknown_partitions": 1, "empty_since": 0, "lag_since": 0, "duration_ms": 10 * M + 1,
                               "threshold_ms": 10 * M, "observed_at": 11 * M}
    assert opened.at == 10 * M + 1  # when it fell due, not the tick that saw it: the same in any batches


def test_empty_with_lag_opens_with_one_id_whatever_the_micro_batches():
    """Two partitions whose lag began 84 ms apart, read in one batch or in two (a restarted job
    whose batch boundary fell between them, seen in CI): the same lag_since, the same alert."""
    from streaming.rules import lag as rl

    def run(batches):
        g = rg.new_group("k", "g")
        rg.on_group_state(g, gs(0, "Empty")[2], 0, GE, CFG)
        parts = {p: rl.new_group_partition("k", "g", "t", p) for p in (0, 1)}
        out = []
        for batch in batches:  # (partition, t, committed, hw) ..., then a tick at the batch's last time
            for p, t, c, hw in batch:
                rl.on_group_offsets(parts[p], {"committed_offset": c, "high_watermark": hw}, t, f"e{p}")
            out += rg.tick_group(g, max(b[1] for b in batch), GE, CFG, [s["lag"] for s in parts.values()],
                                 [s.get("lag_from") for s in parts.values()])
        return out, g["lag_since"]

    p0 = [(0, 1_000, 10, 10), (0, 20_345, 10, 50)]  # lag from 20 345 on partition 0
    p1 = [(1, 1_050, 10, 10), (1, 20_429, 10, 60)]  # from 20 429 on partition 1
    later = [(0, 11 * M, 10, 90), (1, 11 * M + 84, 10, 95)]
    runs = [run([p0[:1] + p1[:1], p0[1:], p1[1:], later]),  # one batch each
            run([p0[:1] + p1[:1], p0[1:] + p1[1:], later]),  # both lags in one batch: its tick at 20 429
            run([p0[:1] + p1[:1], p1[1:], p0[1:], later])]  # partition 1's lag read first
    assert [since for _, since in runs] == [20_345] * 3
    opened = [(a.alert_id, a.at, a.evidence["lag_since"]) for (a,), _ in runs]
    assert opened == [opened[0]] * 3 and opened[0][1] == 20_345 + 10 * M + 1


def test_a_partitions_lag_from_is_its_first_event_with_lag_until_lag_is_gone():
    from streaming.rules import lag as rl
    s = rl.new_group_partition("k", "g", "t", 0)
    for t, c, hw, want in [(1, 5, 5, None), (2, 5, 9, 2), (3, 6, 12, 2), (4, 12, 12, None), (5, 12, 13, 5)]:
        rl.on_group_offsets(s, {"committed_offset": c, "high_watermark": hw}, t, "e")
        assert s["lag_from"] == want, t


def test_empty_min_total_lag_is_configurable():
    cfg = rg.GroupRulesConfig(empty_min_total_lag=100)
    steps = [gs(0, "Empty"), tick(0, [50, 49]), tick(11 * M, [50, 49]), tick(12 * M, [50, 50]),
             tick(22 * M + 1, [50, 50])]
    got, _ = run_group(steps, cfg)
    assert got == [(22 * M + 1, EMPTY, "open")]


class _Untouchable:
    def __iter__(self):
        raise AssertionError("tick_group read the lags of a group that is not Empty")


def test_tick_group_does_not_read_lags_unless_empty():
    _, s = run_group([gs(0, "Stable", members=3)])
    assert rg.tick_group(s, 30 * M, GE, CFG, _Untouchable()) == []


# ---------------------------------------------------------------------------------------------
# Client: steps are ("mr", t, obs) | ("tick", t, None)
# ---------------------------------------------------------------------------------------------


def mr(t, ok=True, reason="periodic", cause=None, max_age=None, error=None, version=1):
    return ("mr", t, {"version": version, "reason": reason, "cause": cause, "ok": ok, "error": error,
                      "duration_ms": 3.0, "metadata_max_age_ms": max_age})


def inv(t, cause="error_response:NOT_LEADER_OR_FOLLOWER", ok=True):
    return mr(t, ok=ok, reason="invalidated", cause=cause, error=None if ok else "timed out")


def ctick(t):
    return ("tick", t, None)


def run_client(steps, cfg=CCFG, full=False):
    s = rc.new_client("k", "probe-1")
    out = []
    for kind, t, arg in steps:
        got = rc.on_metadata_refresh(s, arg, t, CE, cfg) if kind == "mr" else rc.tick_client(s, t, CE, cfg)
        _check_state(s, cfg)
        out += got if full else [(x.at, x.alert, x.action) for x in got]
    return out, s


CLIENT_CASES = [
    # ---- MetadataStale
    ("max age from the event (60 s): stale after 2 x 60 s without success",
     [mr(0, max_age=60_000), ctick(60_000), ctick(120_000), ctick(120_001), ctick(200_000)],
     [(120_001, STALE, "open")]),
    ("no max age in the event: the default (300 s) applies",
     [mr(0), ctick(120_001), ctick(600_000), ctick(600_001)],
     [(600_001, STALE, "open")]),
    ("the last max age a client announced is kept when a later event carries none",
     [mr(0, max_age=60_000), mr(30_000, max_age=None), ctick(150_000), ctick(150_001)],
     [(150_001, STALE, "open")]),
    ("periodic successes keep it quiet",
     [mr(t * 60_000, max_age=60_000) for t in range(10)] + [ctick(9 * 60_000 + 120_000)], []),
    ("a failed refresh past the limit opens it; failures keep it open; a success resolves it",
     [mr(0, max_age=60_000), mr(50_000, ok=False, error="timed out"), mr(130_000, ok=False, error="timed out"),
      mr(200_000, ok=False, error="refused"), ctick(250_000), mr(260_000), ctick(300_000)],
     [(130_000, STALE, "open"), (260_000, STALE, "resolve")]),
    ("a failed refresh within the limit opens nothing",
     [mr(0, max_age=60_000), mr(100_000, ok=False, error="timed out")], []),
    ("a client that never succeeded is measured from its first event",
     [mr(0, ok=False, error="no brokers"), mr(100_000, ok=False, error="no brokers"), ctick(600_000),
      ctick(600_001), mr(700_000, reason="bootstrap")],
     [(600_001, STALE, "open"), (700_000, STALE, "resolve")]),
    ("a late success (older than the last known) does not resolve",
     [mr(0, max_age=60_000), mr(100_000), ctick(220_001), mr(50_000), mr(-1)],
     [(220_001, STALE, "open")]),
    ("a late success newer than the last known one does resolve (the metadata was fresh then), "
     "stamped no earlier than the open",
     [mr(0, max_age=60_000), ctick(130_000), mr(125_000)],
     [(130_000, STALE, "open"), (130_000, STALE, "resolve")]),
    ("a late failure (older than the last success) is old news",
     [mr(0, max_age=60_000), mr(200_000), mr(150_000, ok=False, error="x"), ctick(320_000)], []),
    ("a tick earlier than the last success computes no negative age and opens nothing",
     [mr(500_000, max_age=60_000), ctick(0), ctick(500_000)], []),

    # ---- MetadataRefreshStorm
    ("ten invalidated refreshes in a minute: not above 10, nothing",
     [inv(i * 5_000) for i in range(10)], []),
    ("eleven invalidated refreshes in a minute: storm opens at the eleventh",
     [inv(i * 5_000) for i in range(11)], [(50_000, RSTORM, "open")]),
    ("periodic refreshes never count",
     [mr(i * 1_000) for i in range(40)], []),
    ("bootstrap and new_topic refreshes never count",
     [mr(i * 1_000, reason="bootstrap" if i % 2 else "new_topic") for i in range(40)], []),
    ("failed invalidated refreshes count (every attempt loads the cluster)",
     [inv(i * 1_000, cause="connect_failed", ok=False) for i in range(11)], [(10_000, RSTORM, "open")]),
    ("hysteresis: open above 10, resolved only at 5 or fewer in the window",
     # 20 refreshes, one a second, from t=0 to t=19 s; in the window at T: those with t >= T - 60 s
     [inv(i * 1_000) for i in range(20)]
     + [ctick(60_000 + 13_999), ctick(60_000 + 14_000), ctick(60_000 + 14_001)],
     [(10_000, RSTORM, "open"), (74_001, RSTORM, "resolve")]),
    ("between clear and threshold an open storm stays open on new refreshes too",
     [inv(i * 1_000) for i in range(11)] + [inv(66_000)], [(10_000, RSTORM, "open")]),
    ("spread over more than a minute: no storm",
     [inv(i * 6_001) for i in range(30)], []),
]


@pytest.mark.parametrize("name, steps, expected", CLIENT_CASES, ids=[c[0] for c in CLIENT_CASES])
def test_client_rules(name, steps, expected):
    got, _ = run_client(steps)
    assert got == expected


def test_stale_evidence_with_event_max_age():
    got, _ = run_client([mr(0, max_age=60_000), mr(90_000, ok=False, error="Timed out"),
                         mr(121_000, ok=False, error="Broker: Not coordinator")], full=True)
    (opened,) = got
    assert opened.severity is Severity.WARNING and opened.labels == {"cluster": "k", "source": "probe-1"}
    assert opened.evidence == {"last_success_at": 0, "measured_from": 0, "age_ms": 121_000, "max_age_ms": 60_000,
                               "max_age_from": "event", "limit_ms": 120_000, "grace_ms": 0,
                               "last_error": "Broker: Not coordinator",
                               "last_error_at": 121_000, "failures_since_success": 2, "last_attempt_at": 121_000}


def test_stale_evidence_with_default_max_age():
    got, _ = run_client([mr(0), ctick(600_001)], full=True)
    (opened,) = got
    assert (opened.evidence["max_age_ms"], opened.evidence["max_age_from"], opened.evidence["limit_ms"]) == \
        (300_000, "default", 600_000)
    assert opened.evidence["last_error"] is None


def test_refresh_storm_evidence_counts_causes_by_kind():
    steps = ([inv(i * 1_000, "error_response:NOT_LEADER_OR_FOLLOWER") for i in range(7)]
             + [inv(7_000 + i * 1_000, "disconnected") for i in range(3)]
             + [mr(10_500)]  # periodic: not counted
             + [inv(11_000, None)])
    got, s = run_client(steps, full=True)
    (opened,) = got
    assert opened.alert is RSTORM and opened.at == 11_000
    assert opened.evidence == {"count": 11, "window_ms": 60_000, "threshold": 10,
                               "causes": {"error_response:NOT_LEADER_OR_FOLLOWER": 7, "disconnected": 3, "unknown": 1},
                               "capped": False}
    assert s["invalidated_total"] == 11


def test_refresh_storm_capped_flag():
    cfg = rc.ClientRulesConfig(refresh_storm_max=3, refresh_storm_clear=1, refresh_history_cap=4)
    got, s = run_client([inv(i * 100) for i in range(10)], cfg, full=True)
    (opened,) = got
    assert opened.evidence["count"] == 4 and opened.evidence["capped"] is True
    assert s["invalidated_total"] == 10 and len(s["invalidations"]) == 4


# ---------------------------------------------------------------------------------------------
# Source: steps are ("hb", t, obs) | ("tick", t, None)
# ---------------------------------------------------------------------------------------------


def hb(t, interval=10_000, sent=0, dropped=0, started_at=1, seq=None):
    return ("hb", t, {"interval_ms": interval, "events_sent": sent, "events_dropped": dropped, "watching": ["t"],
                      "started_at": started_at, "seq": seq})


def stick(t):
    return ("tick", t, None)


def run_source(steps, cfg=SCFG, full=False):
    s = rsrc.new_source("k", "probe-1")
    out = []
    for kind, t, arg in steps:
        got = rsrc.on_heartbeat(s, arg, t, SE, cfg) if kind == "hb" else rsrc.tick_source(s, t, SE, cfg)
        _check_state(s, cfg)
        out += got if full else [(x.at, x.alert, x.action) for x in got]
    return out, s


SOURCE_CASES = [
    ("no heartbeat for 3 intervals: silent; the next heartbeat resolves",
     [hb(0), stick(10_000), stick(30_000), stick(30_001), stick(40_000), hb(45_000), stick(50_000)],
     [(30_001, SILENT, "open"), (45_000, SILENT, "resolve")]),
    ("regular heartbeats: never silent",
     [x for i in range(10) for x in (hb(i * 10_000), stick(i * 10_000 + 9_999))], []),
    ("the interval announced in the last heartbeat is used",
     [hb(0, interval=10_000), hb(10_000, interval=60_000), stick(40_001), stick(190_000), stick(190_001)],
     [(190_001, SILENT, "open")]),
    ("a tick before any heartbeat does nothing",
     [stick(10 * M)], []),
    ("a tick with a clock behind the last heartbeat does nothing (no negative age)",
     [hb(100_000), stick(0), stick(100_000)], []),
    ("an invalid interval falls back to the default (10 s)",
     [hb(0, interval=0), stick(30_001)], [(30_001, SILENT, "open")]),
    ("a late heartbeat (older than the last) neither resolves nor changes anything",
     [hb(0), hb(10_000), stick(40_001), hb(5_000)], [(40_001, SILENT, "open")]),
]


@pytest.mark.parametrize("name, steps, expected", SOURCE_CASES, ids=[c[0] for c in SOURCE_CASES])
def test_source_rules(name, steps, expected):
    got, _ = run_source(steps)
    assert got == expected


@pytest.mark.parametrize("name, steps, restarts, dropped_since_last, dropped_total", [
    ("same process: no restart, drops since last heartbeat",
     [hb(0, sent=10, dropped=2), hb(10_000, sent=20, dropped=7)], 0, 5, 7),
    ("first heartbeat: nothing to compare with",
     [hb(0, sent=10, dropped=2)], 0, None, 2),
    ("started_at changed: a restart; the new process's drops are all new",
     [hb(0, sent=50, dropped=2, started_at=1), hb(10_000, sent=60, dropped=4, started_at=9_000)], 1, 4, 6),
    ("no started_at, counters went back: a restart",
     [hb(0, sent=50, dropped=3, started_at=None), hb(10_000, sent=2, dropped=1, started_at=None)], 1, 1, 4),
    ("no started_at, seq went back: a restart",
     [hb(0, sent=50, dropped=0, started_at=None, seq=900), hb(10_000, sent=50, dropped=0, started_at=None, seq=3)],
     1, 0, 0),
    ("two restarts counted",
     [hb(0, started_at=1), hb(10_000, started_at=2), hb(20_000, started_at=2), hb(30_000, started_at=3)], 2, 0, 0),
    ("no drops: zeros",
     [hb(0), hb(10_000), hb(20_000)], 0, 0, 0),
])
def test_source_restarts_and_drops(name, steps, restarts, dropped_since_last, dropped_total):
    _, s = run_source(steps)
    assert (s["restarts"], s["dropped_since_last"], s["dropped_total"]) == (restarts, dropped_since_last, dropped_total)


def test_restart_is_recorded_and_resolve_says_so():
    got, s = run_source([hb(0, started_at=1), stick(30_001), hb(60_000, started_at=55_000, sent=1)], full=True)
    opened, resolved = got
    assert opened.severity is Severity.CRITICAL and opened.labels == {"cluster": "k", "source": "probe-1"}
    assert opened.evidence == {"last_heartbeat_at": 0, "silent_for_ms": 30_001, "interval_ms": 10_000,
                               "limit_ms": 30_000, "grace_ms": 0, "events_sent": 0, "events_dropped": 0}
    assert resolved.alert_id == opened.alert_id
    assert resolved.evidence["restarted"] is True and resolved.evidence["silent_for_ms"] == 60_000
    assert (s["restarts"], s["last_restart_at"], s["started_at"]) == (1, 60_000, 55_000)


# ---------------------------------------------------------------------------------------------
# Properties shared by all three entities
# ---------------------------------------------------------------------------------------------


def test_ticks_are_no_ops_when_nothing_is_due():
    # fresh entities
    for s, fn in ((rg.new_group("k", "g"), lambda s, t: rg.tick_group(s, t, GE, CFG, [5])),
                  (rc.new_client("k", "c"), lambda s, t: rc.tick_client(s, t, CE, CCFG)),
                  (rsrc.new_source("k", "c"), lambda s, t: rsrc.tick_source(s, t, SE, SCFG))):
        before = copy.deepcopy(s)
        assert fn(s, 10**12) == [] and s == before
    assert rg.group_due_at(rg.new_group("k", "g")) is None
    assert rc.client_due_at(rc.new_client("k", "c")) is None
    assert rsrc.source_due_at(rsrc.new_source("k", "c")) is None

    # healthy histories: a tick just before the due time changes nothing, at the due time it acts
    _, g = run_group(bounce(0, 3))
    before = copy.deepcopy(g)
    assert rg.group_due_at(g) is None
    assert rg.tick_group(g, 10**12, GE, CFG, _Untouchable()) == [] and g == before

    _, c = run_client([mr(0, max_age=60_000)])
    due = rc.client_due_at(c, CCFG)
    assert due == 120_001
    before = copy.deepcopy(c)
    assert rc.tick_client(c, due - 1, CE, CCFG) == [] and c == before
    assert [x.alert for x in rc.tick_client(c, due, CE, CCFG)] == [STALE]
    assert rc.client_due_at(c) is None

    _, src = run_source([hb(0)])
    due = rsrc.source_due_at(src, SCFG)
    assert due == 30_001
    before = copy.deepcopy(src)
    assert rsrc.tick_source(src, due - 1, SE, SCFG) == [] and src == before
    assert [x.alert for x in rsrc.tick_source(src, due, SE, SCFG)] == [SILENT]
    assert rsrc.source_due_at(src) is None


def test_due_at_of_open_storms_is_when_they_resolve():
    _, g = run_group(bounce(0, 6))  # rebalances at 1..6 min, open since 5 min
    due = rg.group_due_at(g)
    assert due == 2 * M + 10 * M + 1  # count drops to 4 when the second one ages out
    assert rg.tick_group(copy.deepcopy(g), due - 1, GE, CFG, []) == []
    assert [(x.alert, x.action) for x in rg.tick_group(g, due, GE, CFG, [])] == [(STORM, "resolve")]

    _, c = run_client([inv(i * 1_000) for i in range(12)])  # 0..11 s, open at 10 s
    due = rc.client_due_at(c)
    assert due == 6_000 + 60_000 + 1  # 5 left when the 7th (t = 6 s) ages out
    assert [x.alert for x in rc.tick_client(copy.deepcopy(c), due - 1, CE, CCFG) if x.action == "resolve"] == []
    assert [(x.alert, x.action) for x in rc.tick_client(c, due, CE, CCFG)] == [(RSTORM, "resolve")]


def test_empty_group_is_always_due():
    _, g = run_group([gs(5 * M, "Empty")])
    assert rg.group_due_at(g) == 5 * M


def test_bounded_lists_never_exceed_their_caps():
    # a rebalance every 2 s for over an hour, with and without generations, plus coordinator bounces
    steps = []
    for i in range(1_000):
        t = i * 4 * S
        steps.append(rb(t, gen=i if i % 3 else None, member="m1"))
        steps.append(gs(t + 2 * S, "PreparingRebalance" if i % 2 else "Stable"))
    got, g = run_group(steps)
    assert len(g["rebalances"]) == CFG.rebalance_history_cap
    assert got == [(got[0][0], STORM, "open")]  # opened once, never flapped
    # an invalidation every 100 ms for ten minutes
    _, c = run_client([inv(i * 100, cause=f"error_response:E{i % 3}") for i in range(6_000)])
    assert len(c["invalidations"]) == CCFG.refresh_history_cap
    assert c["invalidated_total"] == 6_000
    assert len(json.dumps(g)) < 8_000 and len(json.dumps(c)) < 8_000


def test_small_caps_hold_too():
    cfg = rg.GroupRulesConfig(storm_min_rebalances=2, rebalance_history_cap=3)
    _, g = run_group(generations(0, range(50), step=S, members=("m1",)), cfg)
    assert len(g["rebalances"]) == 3
    _, c = run_client([inv(i) for i in range(50)], rc.ClientRulesConfig(refresh_storm_max=2, refresh_storm_clear=0,
                                                                         refresh_history_cap=3))
    assert len(c["invalidations"]) == 3


ALL_TABLES = ([(run_group, c[1]) for c in GROUP_CASES] + [(run_client, c[1]) for c in CLIENT_CASES]
              + [(run_source, c[1]) for c in SOURCE_CASES])


def test_rules_are_deterministic():
    for runner, steps in ALL_TABLES:
        a, sa = runner(copy.deepcopy(steps), full=True)
        b, sb = runner(copy.deepcopy(steps), full=True)
        assert a == b and sa == sb


def test_processing_time_and_event_time_ticks_agree_on_what_opens():
    """The lead ticks with the batch's max event time or the wall clock; both open the same
    episode (the wall clock just sees it at its own, later, time)."""
    steps = [hb(0), hb(10_000)]
    _, a = run_source(steps)
    _, b = run_source(steps)
    ev = rsrc.tick_source(a, 40_001, SE, SCFG)
    wall = rsrc.tick_source(b, 40_001 + 7_000, SE, SCFG)
    assert [(x.alert, x.action) for x in ev] == [(x.alert, x.action) for x in wall] == [(SILENT, "open")]
    assert wall[0].evidence["silent_for_ms"] == 37_001


def test_eviction_resolves_open_group_alerts():
    _, g = run_group([gs(0, "PreparingRebalance"), gs(6 * M, "PreparingRebalance")])
    assert list(g["open"]) == [STUCK.value]
    gone = rules.evict(g, 6 * M + 15 * M + 1, 15 * M, GE, rg.group_labels(g))
    assert [(t.alert, t.action) for t in gone] == [(STUCK, "resolve")] and g["open"] == {}


def test_state_fields_the_state_function_reads():
    g, c, s = rg.new_group("k", "g"), rc.new_client("k", "x"), rsrc.new_source("k", "x")
    for st in (g, c, s):
        assert {"cluster", "last_seen", "open"} <= set(st)
    assert {"group", "state", "members", "generation", "rebalances_total"} <= set(g)
    assert {"source", "last_success_at", "invalidated_total"} <= set(c)
    assert {"source", "interval_ms", "events_dropped", "restarts", "dropped_since_last"} <= set(s)
    # client and source share the key cluster/source: their own fields do not collide
    shared = {"cluster", "source", "last_seen", "open", "ha_group"}
    assert (set(c) & set(s)) == shared


def test_members_may_arrive_as_a_count_or_an_array():
    for members, expected in (([{"member_id": "a"}, {"member_id": "b"}], 2), (3, 3), (None, None), ((), 0)):
        s = rg.new_group("k", "g")
        rg.on_group_state(s, {"state": "Stable", "members": members}, 0, GE, CFG)
        assert s["members"] == expected


def test_last_seen_tracks_the_latest_observation():
    s = rg.new_group("k", "g")
    rg.on_rebalance(s, {"phase": "assigned", "generation": 1}, 5_000, GE, CFG)
    rg.on_rebalance(s, {"phase": "revoked", "generation": 1}, 3_000, GE, CFG)
    assert s["last_seen"] == 5_000


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def test_defaults_are_the_catalogue_values():
    c = rg.GroupRulesConfig()
    assert (c.storm_min_rebalances, c.storm_window_ms, c.stuck_after_ms, c.empty_with_lag_after_ms) == \
        (5, 10 * M, 5 * M, 10 * M)
    cc, sc = rc.ClientRulesConfig(), rsrc.SourceRulesConfig()
    assert (cc.metadata_max_age_default_ms, cc.metadata_stale_factor, cc.refresh_storm_max,
            cc.refresh_storm_window_ms, sc.silent_factor) == (300_000, 2.0, 10, 60_000, 3.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.storm_window_ms = 1  # type: ignore[misc]


@pytest.mark.parametrize("cls, kwargs, field", [
    (rg.GroupRulesConfig, {"storm_min_rebalances": 0}, "storm_min_rebalances"),
    (rg.GroupRulesConfig, {"storm_window_ms": -1}, "storm_window_ms"),
    (rg.GroupRulesConfig, {"storm_merge_ms": 600_000}, "storm_merge_ms"),
    (rg.GroupRulesConfig, {"storm_merge_ms": -1}, "storm_merge_ms"),
    (rg.GroupRulesConfig, {"storm_min_rebalances": 65}, "storm_min_rebalances"),
    (rg.GroupRulesConfig, {"stuck_after_ms": 0}, "stuck_after_ms"),
    (rg.GroupRulesConfig, {"empty_min_total_lag": 0}, "empty_min_total_lag"),
    (rc.ClientRulesConfig, {"refresh_storm_clear": 10}, "refresh_storm_clear"),
    (rc.ClientRulesConfig, {"refresh_history_cap": 10}, "refresh_history_cap"),
    (rc.ClientRulesConfig, {"metadata_stale_factor": 0.5}, "metadata_stale_factor"),
    (rc.ClientRulesConfig, {"metadata_max_age_default_ms": 0}, "metadata_max_age_default_ms"),
    (rsrc.SourceRulesConfig, {"silent_factor": float("nan")}, "silent_factor"),
    (rg.GroupRulesConfig, {"stuck_after_ms": 1.5}, "stuck_after_ms"),
    (rg.GroupRulesConfig, {"stuck_after_ms": True}, "stuck_after_ms"),
    (rsrc.SourceRulesConfig, {"heartbeat_interval_default_ms": "10000"}, "heartbeat_interval_default_ms"),
])
def test_invalid_config_names_the_setting(cls, kwargs, field):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{field}:"):
        cls(**kwargs)


# ---------------------------------------------------------------------------------------------
# Rebalances between two polls: the members or their assignments changed (members_sig)
# ---------------------------------------------------------------------------------------------


def gss(t, state, sig, gen=None):
    """A group_state observation as the job parses it: with the members' fingerprint."""
    return ("gs", t, {"group": "g", "state": state, "generation": gen, "members": 2, "members_sig": sig})


@pytest.mark.parametrize("name, steps, expected, counted", [
    ("a member joins or leaves between polls, 5 times in 10 min: a storm",
     [gss(0, "Stable", "a")] + [gss(i * M, "Stable", "ab"[i % 2]) for i in range(1, 6)],
     [(5 * M, STORM, "open")], 5),
    ("the same members and assignments: nothing",
     [gss(i * M, "Stable", "a") for i in range(8)], [], 0),
    ("Dead -> Stable with other members: not counted (a coordinator unloading answers Dead)",
     [gss(0, "Stable", "a"), gss(1 * M, "Dead", "e"), gss(2 * M, "Stable", "b")], [], 0),
    ("a change seen through PreparingRebalance counts once, not again for the fingerprint",
     [gss(0, "Stable", "a"), gss(1 * M, "PreparingRebalance", "a"), gss(2 * M, "Stable", "b")], [], 1),
    ("no fingerprint (an older job's state, or a broker that names no members): nothing",
     [gss(0, "Stable", None), gss(1 * M, "Stable", "b"), gss(2 * M, "Stable", None)], [], 0),
])
def test_members_changed_between_polls(name, steps, expected, counted):
    got, s = run_group(steps)
    assert got == expected, name
    assert s["rebalances_total"] == counted, name


def test_a_member_report_in_the_gap_is_not_counted_twice():
    steps = [gss(0, "Stable", "a"), rb(30 * S, gen=8), gss(1 * M, "Stable", "b")]
    _, s = run_group(steps)
    assert s["rebalances_total"] == 1


def test_a_late_heartbeat_resolves_source_silent_no_earlier_than_its_open():
    """A heartbeat delayed in an events partition whose leader was paused arrives after a
    batch opened SourceSilent at its due time; it ends the silence at its own, earlier time,
    but the resolve is never stamped before the open (seen on the real cluster, issue 33)."""
    s = rsrc.new_source("c", "p")
    rsrc.on_heartbeat(s, {"interval_ms": 1000, "events_sent": 1, "events_dropped": 0}, 10_000, "src")
    opened = rsrc.tick_source(s, 13_001, "src", SCFG)
    assert [t.action for t in opened] == ["open"]
    late = rsrc.on_heartbeat(s, {"interval_ms": 1000, "events_sent": 2, "events_dropped": 0}, 12_500, "src")
    assert [(t.action, t.at) for t in late] == [("resolve", 13_001)]
    assert late[0].evidence["open_since"] == 13_001


def test_the_silence_grace_adds_to_both_limits():
    """Events held back by a stalled follower of the events topic: SourceSilent and
    MetadataStale wait silence_grace_ms (30 s by default) beyond their factors' limits."""
    cfg, ccfg = rsrc.SourceRulesConfig(), rc.ClientRulesConfig()
    assert cfg.silence_grace_ms == ccfg.silence_grace_ms == 30_000
    src = rsrc.new_source("k", "probe-1")
    rsrc.on_heartbeat(src, {"interval_ms": 5_000, "events_sent": 1, "events_dropped": 0}, 0, SE, cfg)
    assert rsrc.source_due_at(src, cfg) == 15_000 + 30_000 + 1
    assert rsrc.tick_source(src, 45_000, SE, cfg) == []
    (opened,) = rsrc.tick_source(src, 45_001, SE, cfg)
    assert (opened.alert, opened.evidence["limit_ms"], opened.evidence["grace_ms"]) == (SILENT, 45_000, 30_000)
    got, s = run_client([mr(0, max_age=5_000), ctick(40_000), ctick(40_001)], cfg=ccfg, full=True)
    (stale,) = got
    assert (stale.at, stale.evidence["limit_ms"], stale.evidence["grace_ms"]) == (40_001, 40_000, 30_000)
    assert rc.client_due_at(s, ccfg) is None


@pytest.mark.parametrize("cls", [rc.ClientRulesConfig, rsrc.SourceRulesConfig])
def test_the_silence_grace_is_checked(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.silence_grace_ms: must be >= 0"):
        cls(silence_grace_ms=-1)
