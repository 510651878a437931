"""A bucket's stored value: its format (``_FORMAT``, documented below and in docs/state.md "The
stored format and upgrades"), the migrations from every older one, and reading and writing it
from the state function (``_load``, ``_store``).
"""

from __future__ import annotations

import json
import pickle
from typing import TYPE_CHECKING, Any, Callable, Optional

import pyarrow as pa

from streaming.rules.dispatch import TEMPLATES
from streaming.rules.lag_config import DEFAULT_CONFIG as LAG_DEFAULTS
from streaming.state.idle_groups import IdleGroups
from streaming.state.rows import _row
from streaming.state.table import PartitionTable
from streaming.state.table import decode as table_decode, encode as table_encode, from_lists as table_from_lists
from streaming.state.table import keyed_applied

if TYPE_CHECKING:
    from streaming.state.config import StateConfig


#: the state's schema for ``applyInPandasWithState``: a bucket is one binary value
STATE_SCHEMA = "entities binary"

#: The stored layout of a bucket, by format (docs/state.md "Stored format"):
#:   1  {entity key: entity dict} (before the partition table)
#:   2  {"format": 2, "entities": {key: dict}, "partitions": table state, "run": the job run
#:      that last restated the bucket's open alerts}
#:   3  format 2 plus "fields": the entity field signature (``FIELDS``) it was written with
#:   4  format 3 compressed (``_ENVELOPE``), the table's columns encoded (``table.encode``), its
#:      metadata signatures as their ``repr``
#:   5  format 4, the table's keys and cold parts in Arrow arrays, its sources, signatures and
#:      labels as codes into per-table lists, event ids (``admit``'s, everywhere) as their
#:      64-bit keys (``table.from_lists``, ``table.event_keys``)
#:   6  format 5, its table's int columns each in the narrowest type that holds them, its cold
#:      parts without the partition's cluster, topic and number (columns already), dictionary-encoded;
#:      "fences" (optional, absent when empty): an HA group's shards' fences (``fence``), which a
#:      reader that predates them ignores
#:   7  format 6 plus "groups" (optional, absent when empty): the group partitions at rest
#:      in columns (``idle_groups``)
#: A state is read through ``_MIGRATIONS`` up to ``_FORMAT``; a newer one is refused.
_FORMAT = 7

#: a format 4+ bucket: this prefix, the pickle's length (8 bytes, little endian), the pickle
#: compressed with zstd (at 300,000 partitions a bucket's pickle is ~2 MB, ~0.6 MB compressed:
#: Spark's state store moves and writes every bucket each batch)
_ENVELOPE = b"KMZ\x04"
_CODEC = pa.Codec("zstd")


def encode_state(v: dict) -> bytes:
    """A bucket's value (today's format) as it is stored."""
    v = {**v, "partitions": table_encode(v["partitions"])}
    raw = pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
    return _ENVELOPE + len(raw).to_bytes(8, "little") + _CODEC.compress(raw, asbytes=True)


def decode_state(value: bytes) -> dict:
    """A stored bucket's value in the format it was written in (1: a dict of entities)."""
    if value[:len(_ENVELOPE)] == _ENVELOPE:
        at = len(_ENVELOPE)
        size = int.from_bytes(value[at:at + 8], "little")
        v = pickle.loads(_CODEC.decompress(value[at + 8:], decompressed_size=size, asbytes=True))
        return {**v, "partitions": table_decode(v["partitions"])}
    return pickle.loads(value)


class StateFormatError(RuntimeError):
    """A stored bucket this version cannot read (written by a newer kafka-monitor)."""


def _from_1(v: dict) -> dict:
    return {"format": 2, "entities": v, "partitions": None, "run": None}


def _from_2(v: dict) -> dict:
    return {**v, "format": 3, "fields": None}  # fields unknown: completed on load


def _from_3(v: dict) -> dict:
    t = v["partitions"]  # the table's signatures are their repr from format 4 on
    if t:
        t = {**t, "objs": {**t["objs"], "sig": [None if x is None else repr(x) for x in t["objs"]["sig"]]}}
    return {**v, "format": 4, "partitions": t}


def _from_4(v: dict) -> dict:
    for e in v["entities"].values():  # admit remembers event ids by their key from format 5 on
        if e.get("applied"):
            e["applied"] = keyed_applied(e["applied"])
    return {**v, "format": 5, "partitions": table_from_lists(v["partitions"])}


def _from_5(v: dict) -> dict:
    return {**v, "format": 6}  # decode widens the columns; a cold part's names are overwritten by the columns'


def _from_6(v: dict) -> dict:
    return {**v, "format": 7}  # no group partition at rest yet: they are dicts


#: format N -> the function that turns it into format N + 1
_MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _from_1, 2: _from_2, 3: _from_3, 4: _from_4, 5: _from_5,
                                                 6: _from_6}

_SAMPLE = {"cluster": "", "topic": "", "partition": 0, "group": "", "source": "", "ha_group": ""}
#: the fields every new entity starts with, per kind: a stored bucket whose signature differs
#: has its entities completed (a field added since keeps its new entity's default)
FIELDS: tuple = tuple(sorted((kind, tuple(sorted(make(_SAMPLE)))) for kind, make in TEMPLATES.items()))


def _complete(entities: dict[str, Any], table: PartitionTable) -> None:
    """Give every entity the fields a new one of its kind has (defaults for those it lacks);
    the table's partitions become dicts for it (the next store compacts them again)."""
    for k in table.live_keys():
        got = table.take(k)
        if got is not None:
            entities[k] = got
    entities.update(table.groups.take_all())
    for e in entities.values():
        make = TEMPLATES.get(e.get("kind", ""))
        if make is None:
            continue
        for name, default in make(e).items():
            e.setdefault(name, default)
        e.setdefault("open", {})
        e.setdefault("last_seen", None)


def _unpack(value: bytes, run_id: str, cfg: Optional[StateConfig] = None
            ) -> tuple[dict[str, Any], PartitionTable, Optional[str], dict]:
    v = decode_state(value)
    fmt: int = v["format"] if isinstance(v.get("format"), int) else 1
    if fmt > _FORMAT:
        raise StateFormatError(
            f"a bucket's state has format {fmt}, written by a newer kafka-monitor; this one reads formats "
            f"1..{_FORMAT}: run the newer version, or start from a new checkpoint directory (alerts open "
            f"in the old one are then raised again)")
    while fmt < _FORMAT:
        v = _MIGRATIONS[fmt](v)
        fmt = v["format"]
    entities = v["entities"]
    table = _table(v["partitions"], run_id, cfg, v.get("groups"))
    if table.groups.stale:  # another run's, or another window's: the rules take them again
        entities.update(table.groups.take_all())
    if v.get("fields") != FIELDS:
        _complete(entities, table)
    return entities, table, v.get("run"), v.get("fences") or {}


def _table(stored: Optional[dict], run_id: str, cfg: Optional[StateConfig], groups: Optional[dict] = None) -> PartitionTable:
    """The bucket's partition table, its group partitions at rest with it (``table.groups``)."""
    if cfg is None:
        table = PartitionTable(stored, run_id=run_id)
    else:
        table = PartitionTable(stored, run_id=run_id, cfg=cfg.partition, ttl_ms=cfg.entity_ttl_ms)
    table.groups = IdleGroups(groups, run_id, (cfg.lag if cfg is not None else LAG_DEFAULTS).window)
    return table


def _load(state: Any, cfg: StateConfig) -> tuple[dict[str, Any], PartitionTable, Optional[str], dict]:
    """A bucket's entities, partition table (with ``cfg``'s settings), the run that last
    restated its alerts and its shards' fences (``fence``); an empty bucket for a new one."""
    if state.exists:
        return _unpack(state.get[0], cfg.run_id, cfg)
    return {}, _table(None, cfg.run_id, cfg), cfg.run_id, {}


def _store(state: Any, entities: dict, table: PartitionTable, compact: bool = True, bucket: int = 0,
           fences: Optional[dict] = None) -> tuple[dict, bool]:
    """Write the bucket back (or remove it when empty); ``compact``: quiet dict partitions go
    into the table.  Returns (the bucket's ``state`` row: its entities by kind, ``report``,
    JSON, and its stored bytes, ``count``; whether anything is stored: the caller then sets
    its timeout)."""
    partitions = table.state(entities if compact else {})
    groups = table.groups.state(entities if compact else {})
    kinds: dict[str, int] = {}
    for v in entities.values():
        kinds[v["kind"]] = kinds.get(v["kind"], 0) + 1
    if groups is not None:
        kinds["group_partition"] = kinds.get("group_partition", 0) + len(groups["keys"])
    size = 0
    if entities or len(partitions["keys"]) or fences or groups is not None:
        value = encode_state({"format": _FORMAT, "entities": entities, "partitions": partitions, "run": table.run_id,
                              "fields": FIELDS, **({"fences": fences} if fences else {}),
                              **({"groups": groups} if groups is not None else {})})
        size = len(value)
        state.update((value,))
        if len(partitions["keys"]):
            kinds["partition"] = kinds.get("partition", 0) + len(partitions["keys"])
    else:
        state.remove()
    return _row(kind="state", action="count", count=size,
                report=json.dumps({"bucket": bucket, "entities": kinds}, sort_keys=True)), size > 0


def stored_entities(value: bytes, run_id: str = "") -> dict[str, Any]:
    """Every entity of a stored bucket state as a dict, the table's partitions included (for
    tests and debugging)."""
    entities, table, _, _ = _unpack(value, run_id)
    return {**entities, **{k: table.peek(k) for k in table.live_keys()},
            **{k: table.groups.peek(k) for k in table.groups.live_keys()}}
