"""The stored bucket state across versions: a state written by the previous version (a fixture
kept in git, tests/fixtures/state/) is read, migrated and written back in today's format; a
field added to an entity since is filled with its default; a newer format is refused."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from streaming.rules import dispatch
from streaming.rules import partition as rules_partition
from streaming.state import function as st
from streaming.state import codec
from tests.support.state_fakes import FakeState, call, pmd, poff, rows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "state"
#: each fixture was written by the code of its format, before the next one replaced it
OLDER = [(FIXTURES / f"format{n}-bucket.pickle").read_bytes() for n in (2, 3, 4, 5, 6)]
OLDER_META = [json.loads((FIXTURES / f"format{n}-bucket.json").read_text()) for n in (2, 3, 4, 5, 6)]
FORMAT2, FORMAT2_META = OLDER[0], OLDER_META[0]


def test_every_older_format_has_a_migration():
    assert codec._FORMAT == 7
    assert sorted(codec._MIGRATIONS) == list(range(1, codec._FORMAT))


@pytest.mark.parametrize("old, meta", list(zip(OLDER, OLDER_META)), ids=["format2", "format3", "format4", "format5", "format6"])
def test_a_job_restarts_on_a_state_written_by_a_previous_version(old, meta):
    assert codec.decode_state(old)["format"] == meta["format"]
    s = FakeState(value=(old,))
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=3_600_000, run_id="after-upgrade"))
    # the first batch of the new run restates what the previous version had open ...
    out = call(fn, 0, rows(pmd(90, 31_000, [1, 3], part=0)), s)
    restated = out[out.kind == "open_alert"]
    assert sorted(restated.alert) == meta["open"]["partition|k/t/0"]
    assert out[out.kind == "alert"].empty
    # ... and when partition 0 gets its replica back, those same episodes resolve
    out = call(fn, 0, rows(pmd(91, 41_000, [1, 2, 3], part=0)), s)
    resolved = out[(out.kind == "alert") & (out.action == "resolve")]
    assert sorted(resolved.alert) == ["IsrShrink", "UnderReplicated"]
    assert set(resolved.alert_id) == set(restated.alert_id)  # the same episodes, not new ones
    stored = codec.decode_state(s.value[0])
    assert stored["format"] == codec._FORMAT and stored["fields"] == codec.FIELDS
    assert s.value[0].startswith(codec._ENVELOPE)
    assert sorted(codec.stored_entities(s.value[0])) == meta["entities"]
    assert len(stored["partitions"]["keys"]), "the quiet partitions are compacted into the table again"


def test_the_tables_columns_come_back_exactly_from_their_encoding():
    """Stored differences wrap in int64: missing values (NULL) and extremes survive."""
    import numpy as np
    from streaming.state import table as pt
    rng = np.random.default_rng(3)
    n = 500
    edge = np.array([pt.NULL, np.iinfo(np.int64).max, 0, -1, 1])
    ints = {c: np.where(rng.random(n) < 0.3, rng.choice(edge, n), rng.integers(-2**62, 2**62, n))
            for c in pt._INT_COLUMNS}
    state = {"keys": [str(i) for i in range(n)], "ints": ints}
    coded = pt.encode(state)
    assert any(not np.array_equal(coded["ints"][c], ints[c]) for c in ints)
    back = pt.decode(coded)["ints"]
    assert all(np.array_equal(back[c], ints[c]) for c in ints)
    assert pt.encode(None) is None and pt.decode({}) == {}


def test_the_oldest_format_a_dict_of_entities_is_read():
    entities = codec.stored_entities(FORMAT2)
    old = pickle.dumps(entities)  # format 1: no envelope, no partition table
    got, table, run, _ = codec._unpack(old, "r")
    assert sorted(got) == FORMAT2_META["entities"] and len(table) == 0 and run is None
    assert got["partition|k/t/0"]["open"].keys() == {"IsrShrink", "UnderReplicated"}


def test_a_field_added_to_an_entity_since_the_state_was_written_gets_its_default(monkeypatch):
    """The next version adds a field to partitions: a bucket stored before it lacks the field in
    its dict entities and in its table; both come back with the new entity's default."""
    s = FakeState()
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=3_600_000, run_id="r"))
    for t in (1_000, 11_000, 21_000):
        call(fn, 0, rows(*(x for p in range(3) for x in (pmd(t + p, t, [1, 2, 3], part=p), poff(t + 50 + p, t, 9, part=p)))), s)
    assert len(codec.decode_state(s.value[0])["partitions"]["keys"]), "precondition: partitions in the table"

    def new_partition(cluster, topic, partition):
        return {**rules_partition.new_partition(cluster, topic, partition), "added_later": 7}

    monkeypatch.setitem(dispatch.TEMPLATES, "partition", lambda e: new_partition(e["cluster"], e["topic"], e["partition"]))
    monkeypatch.setattr(codec, "FIELDS", codec.FIELDS + (("partition", ("added_later",)),))
    entities, table, _, _ = codec._unpack(s.value[0], "r")
    parts = {k: e for k, e in entities.items() if e["kind"] == "partition"}
    assert len(parts) == 3 and len(table) == 0
    assert all(e["added_later"] == 7 for e in parts.values())
    # stored again with the new signature: read as it is the next time
    codec._store(s, entities, table)
    assert codec.decode_state(s.value[0])["fields"] == codec.FIELDS


def test_a_state_from_a_newer_version_is_refused_with_what_to_do():
    newer = pickle.dumps({"format": codec._FORMAT + 1, "entities": {}, "partitions": None, "run": None})
    with pytest.raises(codec.StateFormatError, match=r"format 8, written by a newer kafka-monitor.*formats 1\.\.7"):
        codec._unpack(newer, "r")


def test_a_state_in_todays_format_is_not_reworked():
    s = FakeState()
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=3_600_000, run_id="r"))
    for t in (1_000, 11_000):
        call(fn, 0, rows(*(x for p in range(3) for x in (pmd(t + p, t, [1, 2, 3], part=p), poff(t + 50 + p, t, 9, part=p)))), s)
    _, table, _, _ = codec._unpack(s.value[0], "r")
    assert len(table) > 0, "the table is kept as it is when the signature matches"


def test_format6_stores_a_cold_part_once_for_partitions_alike_and_narrow_columns():
    """Format 6: a cold part holds no partition's name, so partitions alike share one stored
    value; int columns are stored narrow; both come back as they were, names included."""
    import numpy as np
    import pyarrow as pa
    from streaming.state import table as pt
    s = FakeState()
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=3_600_000, run_id="r"))
    for t in (1_000, 11_000):
        call(fn, 0, rows(*(x for p in range(20) for x in (pmd(t + p, t, [1, 2, 3], part=p), poff(t + 50 + p, t, 9, part=p)))), s)
    table = codec.decode_state(s.value[0])["partitions"]
    assert len(table["keys"]) == 20
    stored = pt.encode(table)
    cold = stored["arrays"]["cold"]
    assert isinstance(cold, pa.DictionaryArray) and len(cold.dictionary) == 1
    assert stored["ints"]["partition"].dtype == np.int8 and stored["ints"]["hw"].dtype == np.int8
    back = pt.decode(stored)
    assert back["arrays"]["cold"].equals(table["arrays"]["cold"])
    assert all(back["ints"][c].dtype == np.int64 and np.array_equal(back["ints"][c], table["ints"][c]) for c in table["ints"])
    _, t, _, _ = codec._unpack(s.value[0], "r")
    got = {(d["cluster"], d["topic"], d["partition"]) for d in map(t.peek, t.live_keys())}
    assert got == {("k", "t", p) for p in range(20)}


def test_format3_table_signatures_are_read_as_the_strings_format4_compares():
    """Format 4 keeps a quiet partition's metadata signature as its repr: a format 3 table's
    tuples are converted, so a repeated snapshot still finds its partition quiet."""
    from streaming.state.table import PartitionTable
    v = codec.decode_state(OLDER[1])
    assert v["format"] == 3
    table = PartitionTable(codec._MIGRATIONS[4](codec._MIGRATIONS[3](v))["partitions"], run_id="r")
    keys = table.live_keys()
    assert keys, "precondition: the fixture has partitions in the table"
    sigs = [table.value("sig", table.index[k]) for k in keys]
    assert all(isinstance(x, str) for x in sigs)
    assert sigs == [repr(rules_partition.repeat_signature(table.peek(k))) for k in keys]


def test_event_ids_a_format4_state_remembers_still_tell_a_replay_from_a_new_event():
    """Format 5 remembers event ids by their 64-bit key.  A bucket written by format 4's code
    (``format4-ids-bucket.pickle``: partitions 1-3 in the table, partition 0 a dict with its
    alerts open; the last events at 21,000 with ids ``off-2-<p>`` and ``md-2-<p>``) has its ids
    converted, so replaying one of them is still a duplicate, in the table and in a dict, and a
    new id at the same millisecond is still applied."""
    s = FakeState(value=((FIXTURES / "format4-ids-bucket.pickle").read_bytes(),))
    fn = st.make_state_function(st.StateConfig(entity_ttl_ms=3_600_000, run_id="r"))
    replays = [{**poff(121, 21_000, 502, part=1), "event_id": "off-2-1"},
               {**pmd(20, 21_000, [1, 3], part=0), "event_id": "md-2-0"}]
    new = {**poff(122, 21_000, 502, part=2), "event_id": "off-2-2-again"}
    out = call(fn, 0, rows(*replays, new), s)
    dropped = out[out.kind == "dropped"]
    assert list(zip(dropped.alert, dropped["count"])) == [("duplicate", 2)]
    # the new one was applied: its id is remembered, so sending it again is a duplicate
    out = call(fn, 0, rows(new), s)
    assert list(out[out.kind == "dropped"].alert) == ["duplicate"]
