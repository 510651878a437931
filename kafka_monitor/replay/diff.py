"""Alert episodes and their differences: what a replay would have raised against what the job
published, over a range.  Pure functions of alerts-topic records (``streaming.sinks.alerts``:
``alert``, ``action``, ``alert_id``, ``severity``, ``at``, ``labels``).

An episode is an alert on one entity from its open to its resolve; the resolve carries the open's
``alert_id``.  Within [start, end] each side's episodes are compared per alert and entity, in time
order, and each is *same* (both ends equal), *shifted* (they overlap, an end differs: by how many
seconds), *added* (the replay's, overlapping none of the job's) or *removed* (the job's alone).
Only the range is judged: an episode that began before it counts as starting at its start, one
still open after it (or never resolved) as ending at its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

#: the labels that name an entity, in the order they are shown
ENTITY_LABELS = ("cluster", "topic", "partition", "group", "source", "broker")


@dataclass(frozen=True)
class Episode:
    alert: str
    #: the entity's labels, sorted (values as text)
    entity: tuple[tuple[str, str], ...]
    #: ms; None: opened before the transitions read
    start: Optional[int]
    #: ms; None: not resolved in the transitions read (still open)
    end: Optional[int]
    alert_id: str
    severity: str

    def clamped(self, lo: int, hi: int) -> tuple[int, int]:
        """(start, end) within [lo, hi]."""
        s = lo if self.start is None else max(self.start, lo)
        e = hi if self.end is None else min(self.end, hi)
        return s, max(s, e)

    def overlaps(self, lo: int, hi: int) -> bool:
        return (self.start is None or self.start <= hi) and (self.end is None or self.end >= lo)

    def to_json(self) -> dict[str, Any]:
        return {"alert": self.alert, "entity": dict(self.entity), "start": self.start, "end": self.end,
                "alert_id": self.alert_id, "severity": self.severity}


def entity_of(labels: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items() if v is not None))


def entity_text(entity: tuple[tuple[str, str], ...]) -> str:
    """``cluster k topic t partition 0``: the entity's labels in a fixed order."""
    d = dict(entity)
    return " ".join(f"{k} {d[k]}" for k in ENTITY_LABELS if k in d) + "".join(
        f" {k}={v}" for k, v in entity if k not in ENTITY_LABELS)


def episodes(records: Iterable[dict]) -> list[Episode]:
    """The episodes of alerts-topic records (any order; a repeated record counts once), sorted by
    alert, entity and start."""
    opens: dict[str, dict] = {}
    resolves: dict[str, dict] = {}
    for r in records:
        if r.get("action") == "open":
            opens.setdefault(r["alert_id"], r)
        elif r.get("action") == "resolve":
            resolves.setdefault(r["alert_id"], r)
    out = []
    for aid in set(opens) | set(resolves):
        o, c = opens.get(aid), resolves.get(aid)
        first = o if o is not None else c
        assert first is not None
        out.append(Episode(first["alert"], entity_of(first.get("labels") or {}), None if o is None else int(o["at"]),
                           None if c is None else int(c["at"]), aid, (o or first).get("severity") or ""))
    return sorted(out, key=lambda e: (e.alert, e.entity, -1 if e.start is None else e.start, e.alert_id))


@dataclass
class Shift:
    job: Episode
    replay: Episode
    #: replay minus job, seconds, within the range
    start_s: float
    end_s: float

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job.to_json(), "replay": self.replay.to_json(), "start_shift_s": self.start_s,
                "end_shift_s": self.end_s}


@dataclass
class AlertDiff:
    same: list[tuple[Episode, Episode]] = field(default_factory=list)
    added: list[Episode] = field(default_factory=list)
    removed: list[Episode] = field(default_factory=list)
    shifted: list[Shift] = field(default_factory=list)

    @property
    def differs(self) -> bool:
        return bool(self.added or self.removed or self.shifted)

    def counts(self) -> dict[str, int]:
        return {"same": len(self.same), "added": len(self.added), "removed": len(self.removed),
                "shifted": len(self.shifted)}


def _match(job: list[Episode], rep: list[Episode], lo: int, hi: int, d: AlertDiff) -> None:
    """One alert and entity: both sides' episodes in time order, paired while they overlap."""
    i = j = 0
    while i < len(job) and j < len(rep):
        js, je = job[i].clamped(lo, hi)
        rs, re_ = rep[j].clamped(lo, hi)
        if js <= re_ and rs <= je:
            if (js, je) == (rs, re_):
                d.same.append((job[i], rep[j]))
            else:
                d.shifted.append(Shift(job[i], rep[j], (rs - js) / 1000, (re_ - je) / 1000))
            i += 1
            j += 1
        elif je < rs:
            d.removed.append(job[i])
            i += 1
        else:
            d.added.append(rep[j])
            j += 1
    d.removed += job[i:]
    d.added += rep[j:]


def diff(job: Iterable[Episode], replay: Iterable[Episode], start_ms: int, end_ms: int) -> dict[str, AlertDiff]:
    """Per alert (sorted by name): the episodes of ``job`` and ``replay`` that overlap
    [start_ms, end_ms], compared."""
    sides: dict[tuple[str, tuple], tuple[list[Episode], list[Episode]]] = {}
    for n, eps in enumerate((job, replay)):
        for e in eps:
            if e.overlaps(start_ms, end_ms):
                sides.setdefault((e.alert, e.entity), ([], []))[n].append(e)
    out: dict[str, AlertDiff] = {}
    for (alert, _), (js, rs) in sorted(sides.items()):
        key = lambda e: e.clamped(start_ms, end_ms)  # noqa: E731
        _match(sorted(js, key=key), sorted(rs, key=key), start_ms, end_ms, out.setdefault(alert, AlertDiff()))
    return out
