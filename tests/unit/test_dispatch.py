"""The rules' dispatch table (streaming/rules/dispatch.py): every contract type the job keeps
reaches a rule or the gone path, with settings the state function has; and the partition's
pending-writes hook."""

from __future__ import annotations

import dataclasses

from streaming.job import ENTITY_OF_TYPE
from streaming.rules import dispatch
from streaming.rules import partition as rp
from streaming.rules import partition_config as rpc
from streaming.rules.base import Alert
from streaming.state import function as st
from streaming.state import fold as sfold


def test_every_kept_type_has_a_rule_or_is_a_gone_event():
    assert set(dispatch.EVENTS) | set(sfold.GONE) == set(ENTITY_OF_TYPE)
    assert not set(dispatch.EVENTS) & set(sfold.GONE)


def test_every_family_is_a_setting_of_the_state_function():
    fields = {f.name for f in dataclasses.fields(st.StateConfig)}
    families = {on.family for on in dispatch.EVENTS.values() if on.family} | {d.family for d in dispatch.DUE.values()}
    assert families <= fields


def test_every_kind_has_a_template_and_labels():
    for kind in set(ENTITY_OF_TYPE.values()):
        s = dispatch.new_entity(kind, {"cluster": "k", "topic": "t", "partition": 0, "group": "g", "source": "p",
                                       "node_id": 1})
        assert (s["kind"], s["open"], s["last_seen"]) == (kind, {}, None)
        assert dispatch.labels(s)["cluster"] == "k"


def canary_row(pending, oldest=None, part=0):
    return {"cluster": "k", "topic": "t", "partition": part,
            "report": f'{{"pending": {pending}, "oldest_pending_ms": {"null" if oldest is None else oldest}}}'}


def test_pending_writes_are_noted_on_an_observed_partition_only():
    p = rp.new_partition("k", "t", 0)
    asked = []

    def find(key):
        asked.append(key)
        return p if key == "partition|k/t/0" else None

    on = dispatch.EVENTS["canary"]
    assert on.writes(canary_row(0), 1_000, find, rpc.DEFAULT_CONFIG) == [] and asked == []  # nothing pending
    assert on.writes(canary_row(2), None, find, rpc.DEFAULT_CONFIG) == [] and asked == []   # no time
    assert on.writes(canary_row(2, part=1), 1_000, find, rpc.DEFAULT_CONFIG) == []          # not observed
    assert on.writes(canary_row(2), 2_000, find, rpc.DEFAULT_CONFIG) == []
    assert asked == ["partition|k/t/1", "partition|k/t/0"] and p["pending_writes_at"] == 2_000
    (opened,) = on.writes(canary_row(1, oldest=rpc.DEFAULT_CONFIG.hw_stall_ms), 3_000, find, rpc.DEFAULT_CONFIG)
    assert (opened.alert, opened.action, opened.entity) == (Alert.HIGH_WATERMARK_STALLED, "open", "partition|k/t/0")
