"""librdkafka's own log lines in a test: a client given ``logger=capture.logger`` (and a
``debug`` setting) hands them to Python on poll/flush, and they are kept here."""

from __future__ import annotations

import collections
import logging
from typing import Optional


class LogCapture(logging.Handler):
    """librdkafka debug lines, delivered through the client's ``logger`` on poll/flush, each
    with its time; ``maxlen``: keep only the last so many."""

    def __init__(self, maxlen: Optional[int] = None) -> None:
        super().__init__(logging.DEBUG)
        self.lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        self.logger = logging.getLogger(f"km.test.rdkafka.{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.created:.3f} {record.getMessage()}")

    def matching(self, *needles: str) -> list[str]:
        return [line for line in self.lines if all(n in line for n in needles)]

    def close(self) -> None:
        self.logger.removeHandler(self)
        super().close()
