"""What an observation writes into an entity's fields, as data: a ``Write`` names a field,
the observation field it comes from and how (the kinds below).  The partition rules declare
their writes with these (streaming/rules/partition.py, "What an observation writes");
``write`` applies them to one entity's dict, ``streaming.state.table.apply_writes`` to many
partitions' columns, so the two paths cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

#: how a write takes its value from an observation (``obs``, at time ``now``):
VALUE = "value"            # the observation's ``input`` as an int (None stays None)
INTS = "ints"              # the observation's ``input``, a list, as a list of ints
GIVEN = "given"            # like VALUE, but an observation without one leaves the field as it was
TIME = "time"              # ``now``
LATEST = "latest"          # ``now`` when later than the field (the field only moves forward)
CHANGED_AT = "changed_at"  # ``now`` when ``input`` differs from the field ``of`` (or ``of`` is None)
CONFIRMED = "confirmed"    # ``input`` capped at ``now``, when later than the field (never back)
#: the kinds whose value is a time the column path computes (the others it takes as repeated)
TIME_KINDS = frozenset({TIME, LATEST, CHANGED_AT, CONFIRMED})


@dataclass(frozen=True)
class Write:
    """One field an observation writes: ``field`` from ``input`` (an observation field) as
    ``how`` says; ``of``: the field CHANGED_AT compares ``input`` with."""

    field: str
    how: str
    input: str = ""
    of: str = ""


def _int(v: Any) -> Optional[int]:
    return None if v is None else int(v)


def write_ints(v: Any) -> list[int]:
    """An INTS write's value: a list of ints."""
    return [int(x) for x in v]


def write(state: Any, writes: tuple[Write, ...], obs: dict, now: int) -> None:
    """Apply ``writes`` of one observation ``obs`` at ``now`` to ``state`` (mutated)."""
    for w in writes:
        how, f = w.how, w.field
        if how == VALUE:
            state[f] = _int(obs.get(w.input))
        elif how == TIME:
            state[f] = now
        elif how == LATEST:
            if state.get(f) is None or now > state[f]:
                state[f] = now
        elif how == INTS:
            state[f] = write_ints(obs[w.input])
        elif how == GIVEN:
            v = obs.get(w.input)
            if v is not None:
                state[f] = int(v)
        elif how == CHANGED_AT:
            prev = state.get(w.of)
            if prev is None or _int(obs.get(w.input)) != prev:
                state[f] = now
        elif how == CONFIRMED:
            v = _int(obs.get(w.input))
            if v is not None:
                v = min(v, now)
                if state.get(f) is None or v > state[f]:
                    state[f] = v
        else:
            raise ValueError(f"unknown write {how!r} of {f}")


