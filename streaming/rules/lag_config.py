"""Settings of the consumer-lag rules (``[job.rules.lag]``), validated when built, and their caps."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

#: hard cap on ``LagConfig.window``: the state of every group-partition holds this many points
WINDOW_CAP = 64
#: hard cap on ``LagConfig.hw_marks``
MARKS_CAP = 128
#: rule 6: commit samples of the lag in seconds: at most this many, at least this far apart
TREND_POINTS = 10
TREND_STEP_MS = 30_000
#: rule 5 (drift): the long series of commit samples: at most this many, at least this far apart
DRIFT_POINTS = 10
DRIFT_STEP_MS = 180_000


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


@dataclass(frozen=True)
class LagConfig:
    """Settings of the lag rules (config section ``lag``); validated when built.  Defaults are
    for a probe that observes every 10 s; ``docs/lag-rules.md`` says why each is what it is.

    - ``window`` 10 observations: the span of rule 5 (kept up) and of the status evidence,
      and where blips and rewinds are recognised.  At most 64.
    - ``lag_high_offsets`` 10 000, ``lag_high_seconds`` 300 (None disables that half) and
      ``lag_high_for_ms`` 60 000: ConsumerLagHigh opens once a threshold has been exceeded at
      every observation for at least that long (0: at the first observation).
    - ``stall_after_ms`` 90 000 and ``stop_after_ms`` 300 000 (Kafka's default
      ``max.poll.interval.ms``): how long a consumer may sit on one committed offset with
      records waiting before STALL / STOP, at least; ``cadence_factor`` 3: and at least 3 ×
      (STALL) and 6 × (STOP) its longest recent wait between commits.
    - ``rewind_confirmations`` 2 and ``blip_max_ms`` 30 000: a lower commit seen at 2
      observations is a rewind; one that is back before that is a blip only if it cannot have
      lasted longer than ``blip_max_ms`` (the observations around it are that close).
    - ``rewind_hold_ms`` 120 000: a confirmed rewind stays REWIND at least this long after it
      was first seen, even when the consumer is back (or caught up) at the next observation:
      long enough for several scrapes and micro-batches to show it (0: no hold).
    - ``warn_min_rise_ms`` 30 000: WARN needs the lag in seconds to have risen by this much
      over its commit samples (3 probe intervals: above the estimate's error).
    - ``min_points`` 3: a least-squares trend needs a residual to tell a rise from noise.
    - ``hw_marks`` 32: points of the long HW history (at one per 10 s: about 6 h, each gap
      under 40 % of its age).
    - ``max_extrapolation_ms`` 3 600 000: how far before the oldest HW mark the lag in seconds
      may be extrapolated; past that it is reported as a lower bound.
    """

    window: int = 10
    lag_high_offsets: Optional[int] = 10_000
    lag_high_seconds: Optional[float] = 300.0
    lag_high_for_ms: int = 60_000
    stall_after_ms: int = 90_000
    stop_after_ms: int = 300_000
    cadence_factor: float = 3.0
    rewind_confirmations: int = 2
    blip_max_ms: int = 30_000
    rewind_hold_ms: int = 120_000
    warn_min_rise_ms: int = 30_000
    min_points: int = 3
    hw_marks: int = 32
    max_extrapolation_ms: int = 3_600_000

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "LagConfig":
        """Raise ValueError naming the setting (``lag.<name>: ...``)."""
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"lag.{name}: {rule}, got {getattr(self, name)!r}")

        def non_negative_int(name: str) -> None:
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "must be an integer >= 0")

        if not _is_int(self.window) or not 3 <= self.window <= WINDOW_CAP:
            raise bad("window", f"must be an integer within 3..{WINDOW_CAP}")
        if self.lag_high_offsets is not None and (not _is_int(self.lag_high_offsets) or self.lag_high_offsets < 0):
            raise bad("lag_high_offsets", "must be an integer >= 0, or None to disable")
        if self.lag_high_seconds is not None and (not _is_number(self.lag_high_seconds) or self.lag_high_seconds < 0):
            raise bad("lag_high_seconds", "must be a finite number >= 0, or None to disable")
        non_negative_int("lag_high_for_ms")
        if not _is_int(self.stop_after_ms) or self.stop_after_ms <= 0:
            raise bad("stop_after_ms", "must be an integer > 0")
        if not _is_int(self.stall_after_ms) or self.stall_after_ms <= 0:
            raise bad("stall_after_ms", "must be an integer > 0")
        if not _is_number(self.cadence_factor) or self.cadence_factor < 1:
            raise bad("cadence_factor", "must be a finite number >= 1")
        if not _is_int(self.rewind_confirmations) or not 1 <= self.rewind_confirmations < self.window:
            raise bad("rewind_confirmations", f"must be an integer within 1..window-1 ({self.window - 1})")
        non_negative_int("blip_max_ms")
        non_negative_int("rewind_hold_ms")
        non_negative_int("warn_min_rise_ms")
        if not _is_int(self.min_points) or not 3 <= self.min_points <= TREND_POINTS:
            raise bad("min_points", f"must be an integer within 3..{TREND_POINTS}")
        if not _is_int(self.hw_marks) or not 3 <= self.hw_marks <= MARKS_CAP:
            raise bad("hw_marks", f"must be an integer within 3..{MARKS_CAP}")
        non_negative_int("max_extrapolation_ms")
        return self


DEFAULT_CONFIG = LagConfig()
