"""A real job whose query can be made to stall or fail (tests of ``streaming.watchdog``).

``blocking_state(release_path, fail=False)`` wraps the job's state function: a bucket that gets
an event from source ``MARKER`` blocks its Spark task until ``release_path`` exists (at most
``BLOCK_MAX_S``), or raises with ``fail``.  Everything else is the real job.

    python -m tests.support.stall_job <kafka-monitor job arguments>

runs ``kafka-monitor job`` (``kafka_monitor.cli.main``) with that state function and exits with
its status."""

from __future__ import annotations

import sys
from typing import Any, Callable

MARKER = "block-me"
BLOCK_MAX_S = 300.0


def blocking_state(release_path: str, fail: bool = False) -> Callable[..., Any]:
    """A replacement for ``streaming.state.function.make_state_function`` (monkeypatch it)."""
    from streaming.state import function as state

    real_make = state.make_state_function

    def make(cfg: Any, *args: Any, **kw: Any) -> Callable[..., Any]:
        real = real_make(cfg, *args, **kw)

        def update_bucket(key: tuple, pdfs: Any, st: Any) -> Any:
            import os
            import time

            frames = list(pdfs)
            if any((f["source"] == MARKER).any() for f in frames if "source" in f.columns):
                if fail:
                    raise RuntimeError("the test's state function failed on purpose")
                deadline = time.monotonic() + BLOCK_MAX_S
                while not os.path.exists(release_path) and time.monotonic() < deadline:
                    time.sleep(0.2)
            yield from real(key, iter(frames), st)

        return update_bucket

    return make


def main(argv: list[str]) -> int:
    from kafka_monitor import cli
    from streaming.state import function as state

    state.make_state_function = blocking_state("/nonexistent/never-released")
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
