"""The alerts topic's record: the evidence spliced in as the state wrote it gives the bytes that
parsing it and dumping the whole record gives."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.sinks.alerts import SEQUENCE_STRIDE, record_value

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


def _dumped(r: dict, batch_id: int, index: int, query_id: str | None = None) -> bytes:
    """The record built as a dict and dumped whole (how it was made before the splice)."""
    return json.dumps({
        "alert": r["alert"], "action": r["action"], "alert_id": r["alert_id"], "severity": r["severity"],
        "at": r["at"], "labels": {k: r[c] for k, c in (("cluster", "cluster"), ("topic", "topic"),
                                                       ("partition", "partition"), ("group", "consumer_group"),
                                                       ("source", "source"), ("broker", "broker"))
                                  if r.get(c) is not None},
        "evidence": json.loads(r["evidence"]) if r.get("evidence") else {},
        "batch_id": batch_id, "index": index, "sequence": batch_id * SEQUENCE_STRIDE + index,
        **({} if query_id is None else {"query_id": query_id}),
    }).encode()


@settings(max_examples=300, deadline=None)
@given(evidence=st.none() | st.dictionaries(st.text(max_size=8), _JSON, max_size=5),
       topic=st.none() | st.text(max_size=6), partition=st.none() | st.integers(0, 10**6),
       at=st.none() | st.integers(0, 2**53), batch_id=st.integers(0, 10**9), index=st.integers(0, SEQUENCE_STRIDE - 1),
       query_id=st.none() | st.text(max_size=40))
def test_the_spliced_record_is_the_dumped_one(evidence, topic, partition, at, batch_id, index, query_id):
    r = {"alert": "UnderReplicated", "action": "open", "alert_id": "a-1", "severity": "warning", "at": at,
         "cluster": "c\u00e9", "topic": topic, "partition": partition, "consumer_group": None, "source": None,
         "broker": None,
         "evidence": None if evidence is None else json.dumps(evidence, sort_keys=True, default=str)}
    got = record_value(r, batch_id, index, query_id)
    assert got == _dumped(r, batch_id, index, query_id)
    assert isinstance(json.loads(got)["evidence"], dict)
