"""Group partitions at rest in columns (``streaming.state.idle_groups``) against the dict rules,
explored by Hypothesis (a stateful machine), as test_partition_table_stateful.py does for the
partition table.

Every kind of row a group partition can get is a rule: probe cycles that repeat a caught-up
consumer (what puts it at rest and keeps it there), commits that fall behind, catch up or go
back, high watermarks that move, last stable offsets that come and go, another source, replays
and late copies, two rows of one partition in a micro-batch, the group going Empty (its
GroupEmptyWithLag reads every partition's lag, at rest or not), the group or a committed offset
deleted, gaps past the TTL, state timeouts and new runs.  After every micro-batch the state
function (the job's default) and the one that folds every row through the dict rules must have
produced the same output rows and hold the same entity states.
"""

from __future__ import annotations

import copy
import random

import pytest

from hypothesis import HealthCheck, settings
from hypothesis import strategies as hs
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from streaming.rules.lag_config import LagConfig
from streaming.state import function as st
from streaming.state import codec
from streaming.state import idle_groups
from tests.support.partition_table import _rows, _state
from tests.support.state_fakes import FakeState, call, rows

pytestmark = pytest.mark.slow  # ~20 s of state-machine runs (docs/tests.md)

PARTS = 3
TTL_MS = 600_000
WINDOW = 3  # the lag rules' window: a partition is at rest after this many repeats


def _goff(part: int, seq: int, t: int, committed, hw, lso, source: str) -> dict:
    return {"type": "group_offsets", "entity": f"group_partition|k/g/t/{part}", "cluster": "k", "source": source,
            "seq": seq, "observed_at": t, "group": "g", "topic": "t", "partition": part, "committed_offset": committed,
            "high_watermark": hw, "last_stable_offset": lso, "event_id": f"g{seq}"}


class RestVersusDicts(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fast, self.ref = FakeState(), FakeState()
        self.run = "run-0"
        self.t, self.seq = 1_000_000, 0
        self.hw = dict.fromkeys(range(PARTS), 100)
        self.committed = dict.fromkeys(range(PARTS), 100)
        self.batch: list[dict] = []
        self.sent: list[dict] = []
        self.steps = 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    @rule(part=hs.integers(0, PARTS - 1), commit=hs.sampled_from([0, 0, 0, 5, -3, "hw"]),
          write=hs.sampled_from([0, 0, 0, 7]), lso=hs.sampled_from(["none", "none", "hw", "below", "negative"]),
          source=hs.sampled_from(["p", "p", "p", "q"]), dt=hs.sampled_from([0, 0, 1]))
    def offsets(self, part, commit, write, lso, source, dt):
        self.hw[part] += write
        c = self.hw[part] if commit == "hw" else max(0, min(self.hw[part], self.committed[part] + commit))
        self.committed[part] = c
        hw = self.hw[part]
        seq = self._next()
        self.batch.append(_goff(part, seq, self.t + dt, c, hw,
                                {"none": None, "hw": hw, "below": max(0, hw - 2), "negative": None}[lso], source))

    @rule(cycles=hs.integers(1, 5), lso=hs.sampled_from([None, "hw"]))
    def caught_up_cycles(self, cycles, lso):
        """A probe's cycles over consumers at the HW: each partition's offsets, one batch per cycle."""
        for _ in range(cycles):
            for part in range(PARTS):
                self.committed[part] = self.hw[part]
                self.batch.append(_goff(part, self._next(), self.t, self.hw[part], self.hw[part],
                                        None if lso is None else self.hw[part], "p"))
            self.micro_batch(random.Random(self.seq))
            self.time_passes(10_000)

    @rule(cycles=hs.integers(2, 5), shuffle=hs.randoms(use_true_random=False))
    def backlog(self, cycles, shuffle):
        """Several such cycles in one micro-batch, as a job catching up reads them."""
        for _ in range(cycles):
            for part in range(PARTS):
                self.committed[part] = self.hw[part]
                self.batch.append(_goff(part, self._next(), self.t, self.hw[part], self.hw[part], None, "p"))
            self.time_passes(10_000)
        self.micro_batch(shuffle)

    @rule(state=hs.sampled_from(["Empty", "Stable"]))
    def group_state(self, state):
        self.batch.append({"type": "group_state", "entity": "group|k/g", "cluster": "k", "source": "p",
                           "seq": self._next(), "observed_at": self.t, "group": "g", "group_state": state,
                           "members": 0, "event_id": f"s{self.seq}"})

    @rule(whole=hs.booleans(), part=hs.integers(0, PARTS - 1))
    def gone(self, whole, part):
        """The group deleted, or one of its committed offsets."""
        seq = self._next()
        if whole:
            self.batch.append({"type": "group_gone", "entity": "group|k/g", "cluster": "k", "source": "p", "seq": seq,
                               "observed_at": self.t, "group": "g", "refresh_reason": "group deleted"})
        else:
            self.batch.append({"type": "group_partition_gone", "entity": f"group_partition|k/g/t/{part}", "cluster": "k",
                               "source": "p", "seq": seq, "observed_at": self.t, "group": "g", "topic": "t",
                               "partition": part, "refresh_reason": "committed offset deleted"})

    @precondition(lambda self: self.sent)
    @rule(data=hs.data(), late=hs.booleans())
    def replay(self, data, late):
        row = dict(data.draw(hs.sampled_from(self.sent[-20:])))
        if late:
            row.update(observed_at=row["observed_at"] - 20_000, event_id=f"late{self.seq}")
        self.batch.append(row)

    @rule(gap=hs.sampled_from([10_000, 10_000, 70_000, 2_000_000]))
    def time_passes(self, gap):
        self.t += gap

    def _fns(self):
        cfg = st.StateConfig(entity_ttl_ms=TTL_MS, run_id=self.run, lag=LagConfig(window=WINDOW))
        return st.make_state_function(cfg), st.make_state_function(cfg, compact_partitions=False)

    def _compare(self, got, want, what):
        self.steps += 1
        assert _rows(got) == _rows(want), f"{what}: output rows differ"
        assert _state(self.fast, self.run) == _state(self.ref, self.run), f"{what}: states differ"

    @precondition(lambda self: self.batch)
    @rule(shuffle=hs.randoms(use_true_random=False))
    def micro_batch(self, shuffle):
        batch = list(self.batch)
        shuffle.shuffle(batch)  # the job sorts by (observed_at, seq) itself
        fast, ref = self._fns()
        got = call(fast, 0, rows(*copy.deepcopy(batch)), self.fast)
        want = call(ref, 0, rows(*copy.deepcopy(batch)), self.ref)
        self.sent += batch
        self.batch = []
        self._compare(got, want, "micro-batch")

    @precondition(lambda self: self.fast.value is not None)
    @rule(after=hs.sampled_from([1_000, 40_000, 700_000]))
    def timeout(self, after):
        fast, ref = self._fns()
        outs = []
        for s, fn in ((self.fast, fast), (self.ref, ref)):
            s.hasTimedOut, s.processing_time_ms = True, self.t + after
            outs.append(call(fn, 0, rows(), s))
            s.hasTimedOut = False
        self._compare(outs[0], outs[1], "timeout")

    @rule()
    def new_run(self):
        self.run = f"run-{self.seq}-{self.steps}"


RestVersusDicts.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_group_partitions_at_rest_and_the_dict_rules_agree = RestVersusDicts.TestCase


def test_the_machine_puts_partitions_at_rest_and_takes_them_back(monkeypatch):
    """The comparison means something only if the machine's traffic applies rows in columns and
    takes partitions back to the dicts: count both over a run of it."""
    seen = {"applied": 0, "taken": 0}
    real_fold, real_dict = idle_groups.IdleGroups.fold, idle_groups.IdleGroups._dict

    def fold(self, frames, entities):
        before = sum(len(f) for f in frames)
        out = real_fold(self, frames, entities)
        seen["applied"] += before - sum(len(f) for f in out)
        return out

    def as_dict(self, i):
        seen["taken"] += 1
        return real_dict(self, i)

    monkeypatch.setattr(idle_groups.IdleGroups, "fold", fold)
    monkeypatch.setattr(idle_groups.IdleGroups, "_dict", as_dict)
    run_state_machine_as_test(RestVersusDicts, settings=settings(
        max_examples=15, stateful_step_count=40, deadline=None, database=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow]))
    print(f"\nrows applied in columns: {seen['applied']}, partitions taken back: {seen['taken']}")
    assert seen["applied"] > 150 and seen["taken"] > 250, seen  # 311 and 545 when written


def test_a_consumer_at_the_hw_is_kept_in_columns_and_comes_back_as_the_rules_left_it():
    """Three caught-up observations put a partition at rest: the stored bucket holds no dict for
    it; the next repeat is applied in columns; a commit that falls behind takes it back out and
    the lag rules see its whole history."""
    cfg = st.StateConfig(entity_ttl_ms=TTL_MS, run_id="r", lag=LagConfig(window=WINDOW))
    fast, ref = st.make_state_function(cfg), st.make_state_function(cfg, compact_partitions=False)
    a, b = FakeState(), FakeState()
    key = "group_partition|k/g/t/0"
    for i in range(5):
        t = 1_000_000 + 10_000 * i
        for fn, s in ((fast, a), (ref, b)):
            call(fn, 0, rows(_goff(0, i, t, 50, 50, None, "p")), s)
        assert _state(a, "r") == _state(b, "r")
    stored = codec.decode_state(a.value[0])
    assert key not in stored["entities"] and stored["groups"]["keys"].to_pylist() == [key]
    assert _state(a, "r")[key]["history"] == [[1_020_000 + 10_000 * i, 50, 50] for i in range(3)]
    for fn, s in ((fast, a), (ref, b)):
        out = call(fn, 0, rows(_goff(0, 9, 1_060_000, 50, 80, None, "p")), s)
        assert (out.kind == "group_partition").sum() == 1  # its lag changed: its gauges go out
    assert key in codec.decode_state(a.value[0])["entities"] and _state(a, "r") == _state(b, "r")


def test_the_lists_of_sources_and_groups_keep_only_what_partitions_at_rest_use():
    """Groups come and go: the (cluster, group) codes of the deleted ones leave the list."""
    cfg = st.StateConfig(entity_ttl_ms=TTL_MS, run_id="r", lag=LagConfig(window=WINDOW))
    fn = st.make_state_function(cfg)
    s = FakeState()
    t = 1_000_000

    def at(group: str, t: int) -> dict:
        return {**_goff(0, t, t, 5, 5, None, "p"), "group": group, "entity": f"group_partition|k/{group}/t/0",
                "event_id": f"{group}-{t}"}

    for g in range(100):  # a group at rest, then gone, one after another; group "keep" stays
        for _ in range(WINDOW + 1):
            call(fn, 0, rows(at("keep", t), at(f"g{g}", t)), s)
            t += 10_000
        call(fn, 0, rows({"type": "group_gone", "entity": f"group|k/g{g}", "cluster": "k", "source": "p", "seq": t,
                          "observed_at": t, "group": f"g{g}", "refresh_reason": "group deleted"}), s)
        t += 10_000
    groups = codec.decode_state(s.value[0])["groups"]
    assert groups["keys"].to_pylist() == ["group_partition|k/keep/t/0"]
    assert ("k", "keep") in groups["uniq"]["grp"] and len(groups["uniq"]["grp"]) <= 65
