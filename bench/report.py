"""The results file every benchmark writes: what ran, when, on what machine, and its figures."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import time
from typing import Any


def write(path: str, benchmark: str, machine: dict[str, Any] | None = None, **figures: Any) -> pathlib.Path:
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": benchmark, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **(machine or {})},
           **figures}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"[bench] written to {out}", file=sys.stderr)
    return out
