"""The partition table (quiet partitions in columns) against the dict rules it stands in for.

The state function with ``compact_partitions=False`` folds every row through the dict rules;
with the table (the default) quiet partitions' offsets rows are applied with numpy.  Random
batches of offsets and metadata — several sources, replays, out-of-order and same-time
events, ISR and leader changes, gaps long enough for PartitionUnobserved and eviction, state
timeouts, a new run — must give the same output rows and the same entity states both ways.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from streaming.rules import partition as rules_partition
from streaming.state import table as pt
from streaming.state import function as st
from streaming.state import columns
from streaming.state import codec
from tests.support.partition_table import _rows, _state, counting_table_paths
from tests.support.state_fakes import FakeState, call, rows


def _offsets(rng: random.Random, part: int, seq: int, t: int, hw: int, source: str) -> dict:
    return {"type": "partition_offsets", "entity": f"partition|k/t/{part}", "cluster": "k", "source": source,
            "seq": seq, "observed_at": t, "topic": "t", "partition": part, "high_watermark": hw,
            "log_start_offset": rng.choice([0, 0, 5, None]), "last_stable_offset": rng.choice([None, None, hw]),
            "metadata_at": rng.choice([None, t - 500, t + 500]), "event_id": f"o{seq}"}


def _metadata(rng: random.Random, part: int, seq: int, t: int, source: str) -> dict:
    isr = rng.choice([[1, 2, 3]] * 4 + [[1, 2], [1]])
    return {"type": "partition_metadata", "entity": f"partition|k/t/{part}", "cluster": "k", "source": source,
            "seq": seq, "observed_at": t, "topic": "t", "partition": part, "leader": rng.choice([1] * 6 + [2, -1]),
            "leader_epoch": rng.choice([3] * 8 + [4, 2]), "replicas": [1, 2, 3], "isr": isr,
            "min_insync_replicas": rng.choice([2, None]), "event_id": f"m{seq}"}


def _scenario(seed: int, parts: int = 8, batches: int = 40):
    """(kind, payload) steps: ("batch", rows), ("timeout", now) or ("run", run_id)."""
    rng = random.Random(seed)
    t, seq = 1_000_000, 0
    hws = dict.fromkeys(range(parts), 100)
    last_md: dict[int, dict] = {}
    replay: list[dict] = []
    steps = []
    for _ in range(batches):
        r = rng.random()
        if r < 0.08:
            steps.append(("timeout", t + rng.choice([1_000, 40_000, 2_000_000])))
            continue
        if r < 0.11:
            steps.append(("run", f"run-{len(steps)}"))  # every run of the job has its own id
            continue
        t += rng.choice([10_000, 10_000, 10_000, 70_000, 1_000_000])
        calm = rng.random() < 0.5  # a quiet cycle: offsets from the usual source only
        batch = []
        for p in range(parts):
            if rng.random() < 0.1:
                continue  # not observed this cycle
            for k in range(rng.choice([1, 1, 1, 2, 3])):  # several cycles in one batch (a backlog)
                seq += 1
                hws[p] += rng.choice([0, 0, 10, 25])
                at = t + k * rng.choice([0, 1, 1000])
                source = "p" if calm or rng.random() < 0.9 else "q"
                batch.append(_offsets(rng, p, seq, at, hws[p], source))
                if not calm and rng.random() < 0.15:
                    seq += 1
                    last_md[p] = _metadata(rng, p, seq, at + rng.choice([-1, 0, 1]), source)
                    batch.append(last_md[p])
                elif p in last_md and rng.random() < 0.3:  # a snapshot: the same metadata again
                    seq += 1
                    snap = {**last_md[p], "seq": seq, "observed_at": at + rng.choice([-1, 0, 1]), "event_id": f"m{seq}"}
                    if rng.random() < 0.3:
                        snap["min_insync_replicas"] = rng.choice([None, 2, 3])
                    if rng.random() < 0.1:
                        snap["leader_epoch"] = snap["leader_epoch"] + 1
                    batch.append(snap)
        if replay and not calm and rng.random() < 0.3:
            batch += rng.sample(replay, min(3, len(replay)))  # replays and stale events
        if not calm and rng.random() < 0.2 and batch:
            late = dict(rng.choice(batch))
            late.update(observed_at=late["observed_at"] - 20_000, seq=late["seq"] - 1, event_id="late")
            batch.append(late)
        replay = batch[-5:]
        rng.shuffle(batch)
        steps.append(("batch", batch))
    return steps


def _run(steps, compact: bool):
    s = FakeState()
    run = "run-0"
    outs, states = [], []
    for kind, payload in steps:
        if kind == "run":
            run = payload
            continue
        fn = st.make_state_function(st.StateConfig(entity_ttl_ms=600_000, run_id=run), compact_partitions=compact)
        if kind == "timeout":
            if s.value is None:
                continue
            s.hasTimedOut, s.processing_time_ms = True, payload
            out = call(fn, 0, rows(), s)
            s.hasTimedOut = False
        else:
            out = call(fn, 0, rows(*payload), s)
        outs.append(out)
        states.append(_state(s, run))
    return outs, states


@pytest.mark.parametrize("seed", range(12))
def test_the_table_gives_the_rows_and_states_the_dict_rules_give(seed):
    steps = _scenario(seed)
    got_out, got_states = _run(steps, compact=True)
    want_out, want_states = _run(steps, compact=False)
    assert len(got_out) == len(want_out)
    for i, (g, w) in enumerate(zip(got_out, want_out)):
        assert _rows(g) == _rows(w), f"step {i}"
        assert got_states[i] == want_states[i], f"step {i}"


def test_the_scenarios_exercise_both_paths_and_the_alerts():
    """The comparison above means something only if the table took rows, handed partitions
    back to the dict rules, and alerts opened and resolved on the way."""
    seen: dict = {"alerts": set()}
    with counting_table_paths() as counts:
        for seed in range(12):
            outs, _ = _run(_scenario(seed), compact=True)
            for o in outs:
                a = o[o.kind == "alert"]
                seen["alerts"] |= set(zip(a.alert, a.action))
    seen.update(counts)
    assert seen["quiet_rows"] > 500 and seen["quiet_metadata"] > 50 and seen["taken"] > 100
    for alert in ("PartitionUnobserved", "UnderReplicated", "LeaderChanged", "OfflinePartition"):
        assert (alert, "open") in seen["alerts"] and (alert, "resolve") in seen["alerts"], alert


def test_an_upsert_comes_before_the_removal_of_the_same_partition():
    """The sink applies rows in order: a quiet partition's gauge row sent in the batch that
    also evicts it must not come after its removal (it would bring the series back)."""
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=60_000, run_id="r"))
    s = FakeState()
    base = {"type": "partition_offsets", "cluster": "k", "source": "p", "topic": "t", "log_start_offset": 0}
    call(fn, 0, rows({**base, "entity": "partition|k/t/0", "partition": 0, "seq": 1, "observed_at": 1000,
                      "high_watermark": 5, "event_id": "a"}), s)
    call(fn, 0, rows({**base, "entity": "partition|k/t/0", "partition": 0, "seq": 2, "observed_at": 2000,
                      "high_watermark": 6, "event_id": "b"}), s)
    assert "partition|k/t/0" in pt.PartitionTable(codec._load(s, st.StateConfig(run_id="r"))[1].state({}), "r")
    # partition 0 moves once more, long before another partition's observation ends the batch
    out = call(fn, 0, rows({**base, "entity": "partition|k/t/0", "partition": 0, "seq": 3, "observed_at": 3000,
                            "high_watermark": 7, "event_id": "c"},
                           {**base, "entity": "partition|k/t/1", "partition": 1, "seq": 4, "observed_at": 100_000,
                            "high_watermark": 1, "event_id": "d"}), s)
    p0 = [(r.kind, r.action) for r in out.itertuples() if r.kind == "partition" and r.partition == 0]
    assert p0 == [("partition", "upsert"), ("partition", "remove")]


def test_a_state_stored_before_the_table_is_read():
    """Checkpoints written before the table hold a pickled dict of entities."""
    import pickle
    old = FakeState()
    fn = st.make_state_function(st.StateConfig(run_id="r"), compact_partitions=False)
    call(fn, 0, rows({"type": "partition_offsets", "entity": "partition|k/t/0", "cluster": "k", "source": "p",
                      "seq": 1, "observed_at": 1000, "topic": "t", "partition": 0, "high_watermark": 5}), old)
    entities = codec.stored_entities(old.value[0])
    old.value = (pickle.dumps(entities),)  # the layout before the table
    out = call(st.make_state_function(st.StateConfig(run_id="r")), 0,
               rows({"type": "partition_offsets", "entity": "partition|k/t/0", "cluster": "k", "source": "p",
                     "seq": 2, "observed_at": 2000, "topic": "t", "partition": 0, "high_watermark": 9}), old)
    assert list(out[out.kind == "partition"].high_watermark) == [9]
    assert codec.stored_entities(old.value[0])["partition|k/t/0"]["hw"] == 9


def test_a_probe_restarted_under_a_new_name_takes_over_the_columns():
    """A probe's source is ``probe-<hostname>``: a restarted pod reports under a new name, and
    the old name's admit entry stays on every partition.  After one batch on the dict rules the
    partitions are back in the columns, taking the new source's rows (and the same as the dict
    rules all along)."""
    rng = random.Random(3)
    steps, t, seq = [], 1_000_000, 0
    for cycle in range(8):
        t += 10_000
        batch = []
        for p in range(4):
            seq += 1
            batch.append(_offsets(rng, p, seq, t, 100 + cycle, "probe-a" if cycle < 4 else "probe-b"))
            if cycle in (0, 2, 6):
                seq += 1
                batch.append({**_metadata(rng, p, seq, t, "probe-a" if cycle < 4 else "probe-b"),
                              "leader": 1, "leader_epoch": 3, "isr": [1, 2, 3], "min_insync_replicas": 2})
        steps.append(("batch", batch))
    taken = []
    real = pt.PartitionTable.fold_quiet

    def fold_quiet(self, cols):
        done, gauges = real(self, cols)
        taken.append(int(done.sum()))
        return done, gauges

    pt.PartitionTable.fold_quiet = fold_quiet
    try:
        got_out, got_states = _run(steps, compact=True)
    finally:
        pt.PartitionTable.fold_quiet = real
    want_out, want_states = _run(steps, compact=False)
    assert [_rows(o) for o in got_out] == [_rows(o) for o in want_out] and got_states == want_states
    # cycles 1-3 in the columns (cycle 0 creates the partitions; cycle 2 with its metadata
    # snapshots); cycle 4, the new name's first offsets, on the dict rules; 5 in the columns
    # again; 6 on the dict rules, the new name's first metadata; 7 in the columns
    assert taken == [4, 8, 4, 0, 4, 0, 4], taken
    assert {k[1] for k in got_states[-1]["partition|k/t/0"]["applied"]} == {"probe-a", "probe-b"}


def test_signature_texts_are_the_repr_of_the_rules_signature():
    """The table compares a snapshot's metadata with the stored ``repr`` of
    ``rules.partition.signature``; it builds that text for a batch's rows at once in Arrow."""
    rng = random.Random(5)
    cases = []
    for _ in range(300):
        lists = [rng.sample(range(-2, 2_000_000), rng.choice([0, 1, 1, 2, 3, 5])) for _ in range(2)]
        cases.append((rng.choice([-1, 0, 1, 7, 2**40]), rng.choice([None, 0, 3, 2**33]), *lists))
    leader = np.array([c[0] for c in cases], np.int64)
    epoch = np.array([pt.NULL if c[1] is None else c[1] for c in cases], np.int64)
    replicas = np.array([np.array(c[2], np.int64) for c in cases] + [None], dtype=object)[:-1]
    isr = np.array([c[3] for c in cases] + [None], dtype=object)[:-1]
    got = pt.signature_texts(leader, epoch, replicas, isr)
    want = [repr(rules_partition.signature(*c)) for c in cases]
    assert list(got) == want


def _first_sight(part: int, seq: int, t: int, *, leader=1, replicas=(1, 2, 3), isr=(1, 2, 3), min_isr=2,
                 md_source="p", off_source="p", offsets_first=False, epoch=4) -> list[dict]:
    md = {"type": "partition_metadata", "entity": f"partition|k/t/{part}", "cluster": "k", "source": md_source,
          "seq": seq, "observed_at": t, "topic": "t", "partition": part, "leader": leader, "leader_epoch": epoch,
          "replicas": list(replicas), "isr": list(isr), "min_insync_replicas": min_isr, "event_id": f"m{part}-{seq}"}
    off = {"type": "partition_offsets", "entity": f"partition|k/t/{part}", "cluster": "k", "source": off_source,
           "seq": seq + 1, "observed_at": t, "topic": "t", "partition": part, "high_watermark": 100 + part,
           "log_start_offset": 0, "last_stable_offset": 90 + part, "metadata_at": t - 300,
           "event_id": f"o{part}-{seq}"}
    if offsets_first:
        md["seq"], off["seq"] = off["seq"], md["seq"]
    return [md, off]


def test_new_healthy_partitions_go_into_the_table_in_their_first_batch():
    """``state.fold_new``: a partition first seen with its metadata then its offsets, healthy,
    is put in the table without the dict rules; every other first sight goes through them.  Both
    give what the dict rules alone give, in this batch and the next."""
    from tests.support.state_fakes import canary
    first = (_first_sight(0, 1, 1000) + _first_sight(1, 3, 1000, epoch=None, min_isr=None)
             + _first_sight(2, 5, 1000, replicas=(2, 3, 1), leader=2, isr=(3, 1, 2))
             + _first_sight(3, 7, 1000, isr=(1, 2))               # under-replicated
             + _first_sight(4, 9, 1000, leader=2)                 # not the preferred leader
             + _first_sight(5, 11, 1000, min_isr=4)               # under min.insync.replicas
             + _first_sight(6, 13, 1000, offsets_first=True)      # offsets before metadata
             + _first_sight(7, 15, 1000, off_source="q")          # two sources
             + _first_sight(8, 17, 1000) + [canary(19, 1000, 2, part=8)]  # a canary writes to it
             + _first_sight(9, 20, 1000, leader=-1)               # offline
             + _first_sight(10, 22, 1000)[1:])                    # offsets only
    later = [r for p in range(11) for r in _first_sight(p, 100 + 2 * p, 11_000)]
    with counting_table_paths() as counts:
        got_out, got_states = _run([("batch", first), ("batch", later)], compact=True)
    want_out, want_states = _run([("batch", first), ("batch", later)], compact=False)
    assert counts["born"] == 3
    for g, w in zip(got_out, want_out):
        assert _rows(g) == _rows(w)
    assert got_states == want_states
    alerts = got_out[0][got_out[0].kind == "alert"]
    assert {a for a, _ in zip(alerts.alert, alerts.action)} >= {"UnderReplicated", "UnderMinIsr", "OfflinePartition"}


def test_the_column_path_for_new_partitions_defers_to_the_rules_when_they_disagree(monkeypatch, caplog):
    """The first new partition of a batch goes through the dict rules too: a rule that makes
    something the column path does not (here: the columns' declaration of a metadata row's
    writes left empty, so ``md_at`` stays unset) sends them all there, with a warning, and the
    result is still the dict rules'."""
    monkeypatch.setitem(rules_partition.QUIET_WRITES, "partition_metadata", ())
    monkeypatch.setattr(columns, "_new_warned", False)
    batch = [r for p in range(4) for r in _first_sight(p, 1 + 2 * p, 1000)]
    with counting_table_paths() as counts, caplog.at_level("WARNING", logger=columns.__name__):
        got_out, got_states = _run([("batch", batch)], compact=True)
    want_out, want_states = _run([("batch", batch)], compact=False)
    assert counts["born"] == 0
    assert _rows(got_out[0]) == _rows(want_out[0]) and got_states == want_states
    assert "does not match the rules" in caplog.text
