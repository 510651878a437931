"""The results file every benchmark writes: what ran, when, on what machine, and its figures."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]


def portable(v: Any) -> Any:
    """``v`` with this machine's paths taken out of its strings: the checkout's become relative
    to it, the temporary directory's ``<tmp>/...`` (a results file is read on other machines)."""
    if isinstance(v, str):
        return v.replace(f"{ROOT}/", "").replace(str(ROOT), ".").replace(f"{tempfile.gettempdir()}/", "<tmp>/")
    if isinstance(v, dict):
        return {k: portable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [portable(x) for x in v]
    return v


def machine_info() -> dict[str, Any]:
    """The platform, the CPU model and the load average at the start of a run (a noisy machine
    shows in it)."""
    info: dict[str, Any] = {"platform": platform.platform()}
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        info["loadavg_at_start"] = pathlib.Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    return info


def write(path: str, benchmark: str, machine: dict[str, Any] | None = None, **figures: Any) -> pathlib.Path:
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": benchmark, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **(machine or {})},
           **figures}
    out.write_text(json.dumps(portable(doc), indent=2) + "\n")
    print(f"[bench] written to {out}", file=sys.stderr)
    return out
