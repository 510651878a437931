"""The partition table against the dict rules, explored by Hypothesis (a stateful machine).

The seeded scenarios of test_partition_table.py only ever raise high watermarks.  Here every
kind of row a partition can get is a rule of the machine: offsets whose high watermark goes up,
stays or goes back (a truncation, an unclean election, a re-created topic), log start and last
stable offsets that come and go, metadata that repeats, changes (ISR, leader, epoch up or down,
no leader, min.insync.replicas) or comes from another source, partitions seen for the first time
(their metadata, then their offsets), replays of earlier events, events older than the
partition's last ones, gaps long enough for PartitionUnobserved and eviction, state timeouts and
new runs of the job.  After every micro-batch the state function with the
table (the job's default) and the one that folds every row through the dict rules must have
produced the same output rows and must hold the same entity states.  Any rule that reacts to a
row the table applies in columns (and so never sees) makes them differ.
"""

from __future__ import annotations

import copy
import random

import pytest

from hypothesis import HealthCheck, settings
from hypothesis import strategies as hs
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from streaming.state import function as st
from streaming.state import codec
from tests.support.partition_table import _rows, _state, counting_table_paths
from tests.support.state_fakes import FakeState, call, rows

pytestmark = pytest.mark.slow  # ~35 s of state-machine runs (docs/tests.md)

PARTS = 3
TTL_MS = 600_000
SOURCES = ("p", "p", "p", "q")  # mostly the usual probe; sometimes another one


def _md(part: int, seq: int, t: int, source: str, m: dict) -> dict:
    return {"type": "partition_metadata", "entity": f"partition|k/t/{part}", "cluster": "k", "source": source,
            "seq": seq, "observed_at": t, "topic": "t", "partition": part, "leader": m["leader"],
            "leader_epoch": m["epoch"], "replicas": list(m["replicas"]), "isr": list(m["isr"]),
            "min_insync_replicas": m["min_isr"], "event_id": f"m{seq}"}


class TableVersusDicts(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fast, self.ref = FakeState(), FakeState()
        self.run = "run-0"
        self.t, self.seq = 1_000_000, 0
        self.hw = dict.fromkeys(range(PARTS), 1_000)
        self.meta = {p: {"leader": 1, "epoch": 5, "replicas": (1, 2, 3), "isr": (1, 2, 3), "min_isr": 2}
                     for p in range(PARTS)}
        self.batch: list[dict] = []
        self.sent: list[dict] = []  # every row already sent, for replays
        self.steps = 0

    # -- rows of the next micro-batch ------------------------------------------------------------

    @rule(part=hs.integers(0, PARTS - 1), move=hs.sampled_from([0, 0, 5, 300, -1, -400, -1_000_000]),
          source=hs.sampled_from(SOURCES), log_start=hs.sampled_from([0, 0, 10, None]),
          lso=hs.sampled_from(["hw", "hw", None, "below"]), meta_at=hs.sampled_from(["none", "before", "after"]),
          dt=hs.sampled_from([0, 0, 1, 1_000]))
    def offsets(self, part, move, source, log_start, lso, meta_at, dt):
        self.hw[part] = max(0, self.hw[part] + move)
        hw = self.hw[part]
        self.seq += 1
        t = self.t + dt
        self.batch.append({
            "type": "partition_offsets", "entity": f"partition|k/t/{part}", "cluster": "k", "source": source,
            "seq": self.seq, "observed_at": t, "topic": "t", "partition": part, "high_watermark": hw,
            "log_start_offset": None if log_start is None else min(log_start, hw),
            "last_stable_offset": {"hw": hw, "below": max(0, hw - 3), None: None}[lso],
            "metadata_at": {"none": None, "before": t - 500, "after": t + 500}[meta_at], "event_id": f"o{self.seq}"})

    @rule(part=hs.integers(0, PARTS - 1),
          change=hs.sampled_from(["repeat", "repeat", "repeat", "shrink", "full", "leader", "epoch_up",
                                  "epoch_down", "offline", "min_isr", "no_min_isr"]),
          source=hs.sampled_from(SOURCES), dt=hs.sampled_from([-1, 0, 1]))
    def metadata(self, part, change, source, dt):
        m = self.meta[part]
        if change == "shrink":
            m["isr"] = m["isr"][:-1] or m["isr"]
        elif change == "full":
            m["isr"] = m["replicas"]
        elif change == "leader":
            m["leader"] = 2 if m["leader"] != 2 else 1
            m["epoch"] += 1
        elif change == "epoch_up":
            m["epoch"] += 1
        elif change == "epoch_down":
            m["epoch"] = max(0, m["epoch"] - 1)
        elif change == "offline":
            m["leader"] = -1
        elif change == "min_isr":
            m["min_isr"] = 3 if m["min_isr"] == 2 else 2
        elif change == "no_min_isr":
            m["min_isr"] = None
        self.seq += 1
        self.batch.append(_md(part, self.seq, self.t + dt, source, m))
        if change == "offline":
            m["leader"] = 1  # back next time

    @rule(moves=hs.lists(hs.sampled_from([0, 0, 0, 5, 40]), min_size=PARTS, max_size=PARTS),
          repeat=hs.booleans(), cycles=hs.integers(1, 4))
    def probe_cycles(self, moves, repeat, cycles):
        """What a probe sends most of the time: offsets of every partition from its usual name
        (and, with ``repeat``, their unchanged metadata), a micro-batch per cycle, 10 s apart."""
        for _ in range(cycles):
            for part, move in enumerate(moves):
                self.offsets(part, move, "p", 0, "hw", "none", 0)
                if repeat:
                    self.metadata(part, "repeat", "p", 0)
            self.micro_batch(random.Random(self.seq))
            self.time_passes(10_000)

    @rule(changes=hs.lists(hs.sampled_from(["repeat", "repeat", "repeat", "shrink", "full", "leader", "offline",
                                            "min_isr", "no_min_isr"]), min_size=PARTS, max_size=PARTS),
          fresh=hs.booleans(), dt=hs.sampled_from([0, 1]), shuffle=hs.randoms(use_true_random=False))
    def partitions_appear(self, changes, fresh, dt, shuffle):
        """A first sight as a probe sends it: each partition's metadata, then its offsets, in one
        micro-batch (``state.fold_new``); with ``fresh``, after the job forgot every partition."""
        if fresh and self.fast.value is not None:
            self.time_passes(2_000_000)
            self.timeout(1_000)  # past the TTL: every partition is evicted
        for part, change in enumerate(changes):
            self.metadata(part, change, "p", 0)
            self.offsets(part, 5, "p", 0, "hw", "before", dt)
        self.micro_batch(shuffle)

    @precondition(lambda self: self.sent)
    @rule(data=hs.data(), late=hs.booleans())
    def replay(self, data, late):
        """An event already applied (a producer retry, a replayed batch) or, with ``late``, a
        copy older than anything the partition has seen (a slow source)."""
        row = dict(data.draw(hs.sampled_from(self.sent[-30:])))
        if late:
            row.update(observed_at=row["observed_at"] - 20_000, event_id=f"late{self.seq}")
        self.batch.append(row)

    @rule(gap=hs.sampled_from([10_000, 10_000, 70_000, 2_000_000]))
    def time_passes(self, gap):
        self.t += gap

    # -- micro-batches, timeouts, runs -----------------------------------------------------------

    def _fns(self):
        cfg = st.StateConfig(entity_ttl_ms=TTL_MS, run_id=self.run)
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
    @rule(after=hs.sampled_from([1_000, 40_000, 700_000, 2_000_000]))
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

    @invariant()
    def the_reference_keeps_every_partition_a_dict(self):
        if self.ref.value is not None:
            assert not (codec.decode_state(self.ref.value[0])["partitions"] or {}).get("keys")


TableVersusDicts.TestCase.settings = settings(
    max_examples=60, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_the_table_and_the_dict_rules_agree_on_every_kind_of_row = TableVersusDicts.TestCase


def test_the_machine_reaches_the_table_and_hands_partitions_back():
    """The comparison means something only if the machine's traffic makes the table take rows
    in columns and hand partitions back to the dict rules: count both over a run of it."""
    with counting_table_paths() as seen:
        run_state_machine_as_test(TableVersusDicts, settings=settings(
            max_examples=40, stateful_step_count=50, deadline=None, database=None, derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))
    print(f"\nrows applied in columns: {seen['quiet_rows']}, partitions handed back: {seen['taken']}")
    assert seen["quiet_rows"] > 600 and seen["taken"] > 150, seen  # 1,285 and 305 when written
