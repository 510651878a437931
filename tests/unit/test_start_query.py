"""``streaming.job.start_query``: a query whose source's Python runner did not connect back is
started again, also when the failed query still reports itself active while it stops (a
fake query stands in for Spark's: the race is in the order Spark updates its status)."""

from __future__ import annotations

import pytest

from streaming import job

CONNECT_BACK = "org.apache.spark.SparkException: Python worker failed to connect back."


class FakeQuery:
    """A query that fails at its source's start: it says ``ending`` for ``active_polls`` more
    looks at ``isActive`` before it is inactive, with ``error`` as its exception."""

    def __init__(self, ending: str, active_polls: int, error: str = CONNECT_BACK):
        self.ending, self.active_polls, self.error = ending, active_polls, error
        self.stopped = False

    @property
    def status(self) -> dict:
        return {"message": self.ending if self.active_polls < 3 else "Initializing sources"}

    @property
    def isActive(self) -> bool:  # noqa: N802 - Spark's name
        self.active_polls -= 1
        return self.active_polls >= 0

    def awaitTermination(self, timeout: float) -> None:  # noqa: N802 - Spark's name
        self.active_polls = 0
        raise RuntimeError(self.error)  # as PySpark raises the query's exception

    def exception(self):
        return None if self.active_polls > 0 else self.error


class StartedQuery(FakeQuery):
    def __init__(self):
        super().__init__("Waiting for next trigger", 10**9, "")

    @property
    def status(self) -> dict:
        return {"message": "Waiting for next trigger"}

    def exception(self):
        return None


@pytest.mark.parametrize("ending", ["Stopped", f"Terminated with exception: {CONNECT_BACK}"])
def test_a_failed_start_still_active_is_started_again(ending):
    made = [FakeQuery(ending, active_polls=2), StartedQuery()]
    queries = iter(made)
    cleaned = []
    q = job.start_query(lambda: next(queries), cleaned.append)
    assert q is made[1]
    assert cleaned == [made[0]]


def test_another_failure_is_returned_as_it_is():
    failed = FakeQuery("Stopped", active_polls=2, error="something else")
    assert job.start_query(lambda: failed, lambda q: pytest.fail("cleaned up")) is failed
