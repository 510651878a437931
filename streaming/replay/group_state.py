"""A stand-in for pyspark's ``GroupState`` under ``GroupStateTimeout.ProcessingTimeTimeout``, for
running the job's state function outside Spark (the replay).

Only what Spark documents for that timeout mode, and what ``streaming.state.function`` and
``streaming.state.codec`` use: ``exists``, ``get``, ``getOption``, ``update``, ``remove``,
``hasTimedOut``, ``setTimeoutDuration``, ``getCurrentProcessingTimeMs``.  The rules it keeps:

- ``get`` raises when there is no state; ``update(None)`` raises; ``remove`` drops the value.
- The timeout is reset every time the function is called on a key: it must be set again in each
  call, else the key gets none.  A duration must be a positive int.
- Only a key that has state can time out (a removed state takes its timeout with it), and only
  when its timeout was set in its last call.
- ``getCurrentProcessingTimeMs`` is the batch's processing time, the same for every key of a
  batch.  A replay knows it only for the calls its timeouts made (the archive records those
  moments); asking for it in another call is an error, not a guess.
- The query runs without a watermark and with processing-time timeouts: ``getCurrentWatermarkMs``
  and ``setTimeoutTimestamp`` raise, as in Spark.
"""

from __future__ import annotations

from typing import Any, Optional


class GroupStateError(RuntimeError):
    """The state function asked the stand-in for something Spark would refuse, or that a replay
    does not know."""


class ReplayGroupState:
    """One key's state across calls: ``begin`` a call, hand the object to the function, then
    read ``value`` and ``armed`` (whether a timeout is set for the key)."""

    def __init__(self, value: Optional[tuple] = None):
        self._value: Optional[tuple] = None if value is None else tuple(value)
        self._timed_out = False
        self._now: Optional[int] = None
        self._duration: Optional[int] = None
        self._armed = False
        self._deadline: Optional[int] = None

    # -- the replay's side ---------------------------------------------------------------------

    def begin(self, timed_out: bool = False, processing_time_ms: Optional[int] = None) -> None:
        """A new call on the key: by its timeout at ``processing_time_ms``, or with rows (the
        processing time unknown unless given).  Clears the timeout the last call set."""
        if timed_out and processing_time_ms is None:
            raise GroupStateError("a timeout call needs its processing time")
        if timed_out and not self.armed:
            raise GroupStateError("a key without state, or without a timeout set in its last call, cannot time out")
        self._timed_out = timed_out
        self._now = processing_time_ms
        self._duration = None
        self._armed = False
        self._deadline = None

    def end(self) -> None:
        """The call returned: the key keeps a timeout only if it has state and the call set one,
        due at the call's processing time plus the duration (when the processing time is known)."""
        self._armed = self._value is not None and self._duration is not None
        self._deadline = None
        if self._armed and self._now is not None and self._duration is not None:
            self._deadline = self._now + self._duration

    @property
    def value(self) -> Optional[tuple]:
        return self._value

    @property
    def armed(self) -> bool:
        """Whether the key can time out: it has state and its last call set a timeout."""
        return self._armed

    def due(self, processing_time_ms: int) -> bool:
        """Whether a batch at ``processing_time_ms`` times the key out (Spark: the timeout's
        timestamp is before the batch's); only when the call that set it had a processing time."""
        return self._armed and self._deadline is not None and self._deadline < processing_time_ms

    @property
    def timeout_ms(self) -> Optional[int]:
        """The duration the current (or last) call set, or None."""
        return self._duration

    # -- what the state function sees (pyspark.sql.streaming.state.GroupState) -------------------

    @property
    def exists(self) -> bool:
        return self._value is not None

    @property
    def get(self) -> tuple:
        if self._value is None:
            raise GroupStateError("STATE_NOT_EXISTS: the key has no state (GroupState.get)")
        return self._value

    @property
    def getOption(self) -> Optional[tuple]:
        return self._value

    @property
    def hasTimedOut(self) -> bool:
        return self._timed_out

    def update(self, newValue: Any) -> None:
        if newValue is None:
            raise GroupStateError("CANNOT_BE_NONE: newValue (GroupState.update)")
        self._value = tuple(newValue)

    def remove(self) -> None:
        self._value = None

    def setTimeoutDuration(self, durationMs: int) -> None:
        if isinstance(durationMs, bool) or not isinstance(durationMs, int):
            raise GroupStateError(f"NOT_EXPECTED_TYPE: durationMs must be an int, got {type(durationMs).__name__}")
        if durationMs <= 0:
            raise GroupStateError(f"VALUE_NOT_POSITIVE: durationMs must be positive, got {durationMs}")
        self._duration = durationMs

    def setTimeoutTimestamp(self, timestampMs: int) -> None:
        raise GroupStateError("CANNOT_WITHOUT: a timeout timestamp needs EventTimeTimeout; the job's query uses "
                              "ProcessingTimeTimeout")

    def getCurrentWatermarkMs(self) -> int:
        raise GroupStateError("CANNOT_WITHOUT: the job's query sets no watermark")

    def getCurrentProcessingTimeMs(self) -> int:
        if self._now is None:
            raise GroupStateError("the processing time of a call with rows is not recorded in the archive; the "
                                  "state function must not depend on it")
        return self._now
