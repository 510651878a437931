"""A broker's log dirs (entity ``log_dirs|<cluster>/broker/<id>``), from ``log_dirs`` events
(DescribeLogDirs, asked of each broker by the unshared probe or share 1 of n every
``probe.log_dirs_interval_s``; monitor/logdirs.py).  Every alert is the broker's (labels
``cluster``, ``broker``); the evidence names the dirs.

- **LogDirOffline (critical)**: the broker answers and reports a dir offline (a failed disk, a
  filesystem that filled, KAFKA_STORAGE_ERROR): the broker stays up and serves its other dirs,
  the replicas the dir held are out of every ISR and cannot come back until the dir does (in
  practice, a broker restart with the dir repaired or removed).  The evidence names each offline
  dir, its error and the partitions it held when last seen online.  Resolves when every dir the
  broker reports is online.
- **LogDirFilling (warning)**: an online dir is ``usage_percent`` full or more, or at its growth
  over the last ``growth_window_ms`` it is full within ``full_within_ms``.  A full dir goes
  offline (and with it every replica on it).  The evidence names each such dir with its use, its
  growth and its time to full.  Resolves when no dir is either, with a margin so that a dir
  hovering at the setting (retention deletes whole segments) does not flap: once open it stays
  open down to ``usage_percent`` - 2 and up to 1.25 x ``full_within_ms``.

Growth is the change of used bytes (total - usable) between the oldest and the newest answer
within the window, once they are at least ``min_growth_span_ms`` apart; used bytes count
everything on the filesystem, not only Kafka's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from streaming.rules.base import Alert, Transition, _open, _resolve
from streaming.rules.group import check_settings

#: growth samples kept per dir (thinned to this many within the window)
MAX_SAMPLES = 64
#: LogDirFilling, once open, resolves only this many percentage points below usage_percent, and
#: only once the time to full is this many times full_within_ms
RESOLVE_MARGIN_PERCENT, RESOLVE_MARGIN_FACTOR = 2, 1.25


@dataclass(frozen=True)
class LogDirRulesConfig:
    """``[job.rules.log_dirs]``."""

    #: LogDirFilling at this share of the filesystem used, in percent
    usage_percent: int = 85
    #: LogDirFilling when the dir is full within this at its recent growth (6 h)
    full_within_ms: int = 6 * 3_600_000
    #: the growth is measured over this much of the past (30 min)
    growth_window_ms: int = 1_800_000
    #: and only once the answers it compares are this far apart (5 min)
    min_growth_span_ms: int = 300_000

    def __post_init__(self) -> None:
        check_settings(self, ("usage_percent", "full_within_ms", "growth_window_ms", "min_growth_span_ms"))
        if self.usage_percent > 100:
            raise ValueError(f"LogDirRulesConfig.usage_percent: must be within 1..100, got {self.usage_percent!r}")
        if self.min_growth_span_ms > self.growth_window_ms:
            raise ValueError("LogDirRulesConfig.min_growth_span_ms: must be <= growth_window_ms, got "
                             f"{self.min_growth_span_ms!r} > {self.growth_window_ms!r}")


DEFAULT_CONFIG = LogDirRulesConfig()


def new_log_dirs(cluster: str, broker: int) -> dict:
    return {"cluster": cluster, "broker": int(broker), "last_seen": None, "open": {}, "observed_at": None,
            "report": None, "samples": {}}


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _dirs(ev: dict[str, Any]) -> list[dict]:
    try:
        rep = json.loads(ev.get("report") or "{}")
    except ValueError:
        return []
    dirs = rep.get("dirs") if isinstance(rep, dict) else None
    return [d for d in dirs or [] if isinstance(d, dict) and isinstance(d.get("log_dir"), str)]


def _growth(samples: list[list[int]], now: int, cfg: LogDirRulesConfig) -> Optional[float]:
    """Bytes a second over the window; None while the samples span less than min_growth_span_ms."""
    if len(samples) < 2 or samples[-1][0] - samples[0][0] < cfg.min_growth_span_ms:
        return None
    (t0, u0), (t1, u1) = samples[0], samples[-1]
    return (u1 - u0) * 1000.0 / (t1 - t0)


def on_log_dirs(state: dict, ev: dict[str, Any], now: int, entity: str,
                cfg: LogDirRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    if state["observed_at"] is not None and now < state["observed_at"]:
        return []  # older than what the entity shows
    state["observed_at"] = now
    dirs = _dirs(ev)
    labels = {"cluster": state["cluster"], "broker": state["broker"]}
    samples: dict[str, list[list[int]]] = state["samples"]
    for gone in set(samples) - {d["log_dir"] for d in dirs}:
        del samples[gone]
    filling, shown = [], []
    was_filling = Alert.LOG_DIR_FILLING.value in state["open"]
    usage = cfg.usage_percent - (RESOLVE_MARGIN_PERCENT if was_filling else 0)
    within_ms = cfg.full_within_ms * (RESOLVE_MARGIN_FACTOR if was_filling else 1)
    for d in dirs:
        path, total, usable = d["log_dir"], _int(d.get("total_bytes")), _int(d.get("usable_bytes"))
        row = {k: d.get(k) for k in ("log_dir", "online", "error", "total_bytes", "usable_bytes", "held_replicas",
                                     "held_bytes", "moving_replicas")}
        if d.get("online") and total and usable is not None:
            used = total - usable
            s = samples.setdefault(path, [])
            s.append([now, used])
            while s and now - s[0][0] > cfg.growth_window_ms:
                s.pop(0)
            if len(s) > MAX_SAMPLES:
                del s[1:len(s) - MAX_SAMPLES + 1]  # the oldest (the window's start) and the newest stay
            growth = _growth(s, now, cfg)
            to_full = usable / growth if growth is not None and growth > 0 else None
            pct = 100.0 * used / total
            row.update(used_percent=round(pct, 2), growth_bytes_per_s=None if growth is None else round(growth, 1),
                       seconds_to_full=None if to_full is None else round(to_full, 1))
            if pct >= usage or (to_full is not None and to_full * 1000 <= within_ms):
                filling.append({k: row[k] for k in ("log_dir", "used_percent", "usable_bytes", "total_bytes",
                                                    "growth_bytes_per_s", "seconds_to_full")})
        else:
            samples.pop(path, None)
        shown.append(row)
    state["report"] = json.dumps({"dirs": shown}, separators=(",", ":"))

    out: list[Transition] = []
    offline = [{"log_dir": d["log_dir"], "error": d.get("error"), "held_replicas": d.get("held_replicas"),
                "held_bytes": d.get("held_bytes"), "held_partitions": list(d.get("held_partitions") or [])}
               for d in dirs if not d.get("online")]
    if offline:
        out += _open(state, Alert.LOG_DIR_OFFLINE, entity, labels, now,
                     {"dirs": offline, "online_dirs": len(dirs) - len(offline)})
    elif dirs:
        out += _resolve(state, Alert.LOG_DIR_OFFLINE, entity, labels, now, {"online_dirs": len(dirs)})
    if filling:
        out += _open(state, Alert.LOG_DIR_FILLING, entity, labels, now,
                     {"dirs": filling, "usage_percent": cfg.usage_percent, "full_within_ms": cfg.full_within_ms})
    elif dirs:
        out += _resolve(state, Alert.LOG_DIR_FILLING, entity, labels, now, {"dirs": len(dirs)})
    return out
