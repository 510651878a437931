"""The lag in seconds of one group-partition: when the record at the committed offset was
written, placed in the history of the partition's high watermark, and that history (the HW
marks) kept bounded.  How and why: ``docs/lag-rules.md``."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

from streaming.rules.lag_config import DEFAULT_CONFIG, LagConfig

#: HW marks: an inner mark is dropped when its neighbours are within this fraction of the
#: younger neighbour's age of each other (the HW history's resolution: under 40 % of the age)
MARK_RATIO = 0.4

Point = Sequence[int]  # [t, committed, hw]; HW histories: [t, hw] or [t, committed, hw] (the HW is last)


class LagSeconds(NamedTuple):
    """``seconds`` ≥ 0 and finite; ``basis`` says how it was obtained:

    - ``caught-up``: committed ≥ the latest HW, 0;
    - ``interpolated``: the record at the committed offset was written between two points of
      the HW history (the first with HW > committed and the one before it); placed within them;
    - ``extrapolated``: it was written before the oldest point; estimated with the history's
      HW rate;
    - ``lower-bound``: before the oldest point, and the estimate hit ``max_extrapolation_ms``,
      or there is no rate: the true lag is at least ``seconds``.
    """

    seconds: float
    basis: str

    @property
    def lower_bound(self) -> bool:
        return self.basis == "lower-bound"


def written_at(history: Sequence[Point], committed: int, cfg: LagConfig = DEFAULT_CONFIG) -> tuple[float, str]:
    """(epoch ms, basis): when the record at offset ``committed`` — the oldest one the group
    has not consumed — was written, from the ``(t, HW)`` history (oldest first, HW last in each
    point); ``committed`` must be below the latest HW.

    The record was written by the first point whose HW is above ``committed`` and after the
    point before it (on a flat HW, the *last* point of the flat run, not the first).  Between
    those two points the HW is taken to rise evenly and the record is placed in the middle of
    its slot: the ``(committed - h0 + 1)``-th of the ``h1 - h0`` records written between them.
    The divisor is > 0 by construction (no Inf, no NaN).  When already the oldest point has
    HW > committed, the time is extrapolated back from it with the history's HW rate, at most
    ``max_extrapolation_ms`` (then a lower bound), or is the oldest point's (a lower bound)."""
    k = 0
    for p in history:
        if p[-1] > committed:
            break
        k += 1
    if k > 0:  # k < len: the latest HW is above committed
        t0, h0 = history[k - 1][0], history[k - 1][-1]
        t1, h1 = history[k][0], history[k][-1]
        return t0 + (t1 - t0) * (committed - h0 + 0.5) / (h1 - h0), "interpolated"
    t_first, hw_first = history[0][0], history[0][-1]
    t_last, hw_last = history[-1][0], history[-1][-1]
    if hw_last > hw_first and t_last > t_first:
        back = (hw_first - committed - 0.5) * (t_last - t_first) / (hw_last - hw_first)
        if back > cfg.max_extrapolation_ms:
            return float(t_first - cfg.max_extrapolation_ms), "lower-bound"
        return t_first - back, "extrapolated"
    return float(t_first), "lower-bound"


def estimate_lag_seconds(history: Sequence[Point], committed: Optional[int], now: int,
                         cfg: LagConfig = DEFAULT_CONFIG, behind_since: Optional[int] = None) -> Optional[LagSeconds]:
    """The lag in seconds: the age at ``now`` of the record at offset ``committed`` (the
    oldest record the group has not consumed), from the ``(t, HW)`` history — see
    :func:`written_at`.

    - None when ``committed`` is None (nothing committed: no lag, not an infinite one) or
      there is no history.
    - 0 when ``committed`` ≥ the latest HW: caught up, including an idle topic whose HW has
      been flat for hours.
    - A flat HW at the committed offset counts up to its *last* point: on an idle topic the
      first new record was written after the HW last stood at the committed offset, not when
      the HW first got there.  A HW that went back (a new leader whose HW lags) does not
      unwrite records: the first time the HW was above ``committed`` counts.
    - ``behind_since``: a time at which the HW is known to have been above ``committed``
      already (the start of the stuck run); the result is never less than ``now - behind_since``.
    - Never negative (``now`` before the record's time is clamped to 0).
    """
    if committed is None or not history:
        return None
    if committed >= history[-1][-1]:
        return LagSeconds(0.0, "caught-up")
    at, basis = written_at(history, committed, cfg)
    if behind_since is not None and behind_since < at:
        at, basis = float(behind_since), "lower-bound"
    return LagSeconds(round(max(0.0, (now - at) / 1000.0), 3), basis)


def lag_seconds(history: Sequence[Point], committed: Optional[int], now: int,
                cfg: LagConfig = DEFAULT_CONFIG, behind_since: Optional[int] = None) -> Optional[float]:
    """The number of :func:`estimate_lag_seconds` (use that one to know whether it is a lower bound)."""
    est = estimate_lag_seconds(history, committed, now, cfg, behind_since)
    return None if est is None else est.seconds


def add_mark(marks: list, t: int, hw: int, cap: int) -> None:
    """Append ``[t, hw]`` to the long HW history and keep it bounded: the middle of three
    equal HWs carries nothing (a flat run keeps its first and last point); an inner mark goes
    when its two neighbours are within ``MARK_RATIO`` × the younger neighbour's age of each
    other (the resolution falls with age: under 40 %); past ``cap`` the oldest goes.  The thinning
    pass runs when the list is full or its length a multiple of 8 (in between the marks are
    only finer than that)."""
    if marks and t <= marks[-1][0]:
        return
    marks.append([t, hw])
    n = len(marks)
    if n >= 3 and marks[-3][1] == marks[-2][1] == hw:
        del marks[-2]
        return
    if n <= cap and n & 7:
        return
    i = 1
    while i < len(marks) - 1:
        if marks[i + 1][0] - marks[i - 1][0] <= MARK_RATIO * (t - marks[i + 1][0]):
            del marks[i]
        else:
            i += 1
    if len(marks) > cap:
        del marks[:len(marks) - cap]

