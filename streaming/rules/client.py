"""Client rules (entity cluster/source, one client's metadata cache, from ``metadata_refresh``
events): MetadataStale, MetadataRefreshStorm.  Settings in ``ClientRulesConfig``
(``[job.rules.client]``); how each alert decides: docs/rules.md.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Optional

from streaming.rules.base import Alert, Transition, _open, _resolve
from streaming.rules.group import (MAX_CAUSE_LEN, _age, _int, _positive, _prune, check_factor, check_grace,
                                   check_settings)

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientRulesConfig:
    """Thresholds of the client rules (validated on construction)."""

    #: metadata.max.age.ms when the client's events do not carry it (Kafka's default)
    metadata_max_age_default_ms: int = 300_000
    #: MetadataStale after this many max ages without a successful refresh (catalogue: 2)
    metadata_stale_factor: float = 2.0
    #: MetadataRefreshStorm opens when invalidated refreshes in the window are MORE than this
    refresh_storm_max: int = 10
    #: ... and resolves when they are this many or fewer (hysteresis, see docs/rules.md)
    refresh_storm_clear: int = 5
    #: the refresh storm's sliding window ("per minute")
    refresh_storm_window_ms: int = 60_000
    #: at most this many invalidated refreshes are remembered (> refresh_storm_max)
    refresh_history_cap: int = 64
    #: added to MetadataStale's limit: how long the events topic may hold a client's events back
    #: without the client being at fault (``SourceRulesConfig.silence_grace_ms``)
    silence_grace_ms: int = 30_000

    def __post_init__(self) -> None:
        check_settings(self, ("metadata_max_age_default_ms", "refresh_storm_max", "refresh_storm_window_ms",
                              "refresh_history_cap"))
        if not 0 <= self.refresh_storm_clear < self.refresh_storm_max:
            raise ValueError(f"ClientRulesConfig.refresh_storm_clear: must be within 0..refresh_storm_max-1 "
                             f"({self.refresh_storm_max - 1}), got {self.refresh_storm_clear}")
        if self.refresh_history_cap <= self.refresh_storm_max:
            raise ValueError(f"ClientRulesConfig.refresh_history_cap: must be > refresh_storm_max "
                             f"({self.refresh_storm_max}), got {self.refresh_history_cap}")
        check_grace(self)
        check_factor(self, "metadata_stale_factor")


DEFAULT_CONFIG = ClientRulesConfig()

# ---------------------------------------------------------------------------------------------
# Client entity (one source's metadata cache)
# ---------------------------------------------------------------------------------------------


def client_labels(state: dict) -> dict[str, Any]:
    return {"cluster": state["cluster"], "source": state["source"]}


def new_client(cluster: str, source: str) -> dict:
    return {
        "cluster": cluster, "source": source, "last_seen": None, "open": {},
        "first_refresh_at": None,    # first metadata_refresh seen (the reference until a success)
        "last_attempt_at": None,
        "last_success_at": None,
        "last_error": None, "last_error_at": None,
        "failures_since_success": 0,
        "version": None,
        "max_age_ms": None,          # metadata.max.age.ms the client's events carried (last known)
        "invalidations": [],         # [t, cause kind] of invalidated refreshes, sorted by t, capped
        "invalidated_total": 0,
        "ha_group": None,            # an HA group's probe: MetadataStale only while it still tries
    }


def _max_age(state: dict, cfg: ClientRulesConfig) -> tuple[int, str]:
    if state["max_age_ms"] is not None:
        return state["max_age_ms"], "event"
    return cfg.metadata_max_age_default_ms, "default"


def _stale_reference(state: dict) -> Optional[int]:
    return state["last_success_at"] if state["last_success_at"] is not None else state["first_refresh_at"]


def _stale_limit(max_age: int, cfg: ClientRulesConfig) -> int:
    """``metadata_stale_factor`` max ages, and the time the events topic may hold the refresh
    events back (``silence_grace_ms``)."""
    return int(cfg.metadata_stale_factor * max_age) + cfg.silence_grace_ms


def _stale(state: dict, now: int, entity: str, cfg: ClientRulesConfig) -> list[Transition]:
    ref = _stale_reference(state)
    if ref is None or Alert.METADATA_STALE.value in state["open"]:
        return []
    max_age, origin = _max_age(state, cfg)
    limit = _stale_limit(max_age, cfg)
    age = _age(now, ref)
    if age <= limit:
        return []
    if state.get("ha_group") and _age(now, state["last_attempt_at"] or ref) > limit:
        return []  # an HA group's probe that stopped: the group's coverage judges it (rules.ha)
    return _open(state, Alert.METADATA_STALE, entity, client_labels(state), now, {
        "last_success_at": state["last_success_at"], "measured_from": ref, "age_ms": age,
        "max_age_ms": max_age, "max_age_from": origin, "limit_ms": limit, "grace_ms": cfg.silence_grace_ms,
        "last_error": state["last_error"],
        "last_error_at": state["last_error_at"], "failures_since_success": state["failures_since_success"],
        "last_attempt_at": state["last_attempt_at"]})


def _refresh_storm(state: dict, now: int, entity: str, cfg: ClientRulesConfig) -> list[Transition]:
    window = state["invalidations"] = _prune(state["invalidations"], now, cfg.refresh_storm_window_ms)
    count = len(window)
    is_open = Alert.METADATA_REFRESH_STORM.value in state["open"]
    labels = client_labels(state)
    if count > cfg.refresh_storm_max and not is_open:
        causes: dict[str, int] = {}
        for _, cause in window:
            causes[cause] = causes.get(cause, 0) + 1
        ordered = dict(sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])))
        return _open(state, Alert.METADATA_REFRESH_STORM, entity, labels, now, {
            "count": count, "window_ms": cfg.refresh_storm_window_ms, "threshold": cfg.refresh_storm_max,
            "causes": ordered, "capped": count >= cfg.refresh_history_cap})
    if count <= cfg.refresh_storm_clear and is_open:
        return _resolve(state, Alert.METADATA_REFRESH_STORM, entity, labels, now,
                        {"count": count, "window_ms": cfg.refresh_storm_window_ms, "clear_at": cfg.refresh_storm_clear})
    return []


def on_metadata_refresh(state: dict, obs: dict, now: int, entity: str,
                        cfg: ClientRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one ``metadata_refresh`` attempt (ok or failed) into the client's state."""
    now = int(now)
    labels = client_labels(state)
    out: list[Transition] = []
    if state["last_seen"] is None or now > state["last_seen"]:
        state["last_seen"] = now
    if state["first_refresh_at"] is None or now < state["first_refresh_at"]:
        state["first_refresh_at"] = now
    if state["last_attempt_at"] is None or now > state["last_attempt_at"]:
        state["last_attempt_at"] = now
    max_age = _positive(obs.get("metadata_max_age_ms"))
    if max_age is not None:
        state["max_age_ms"] = max_age
    version = _int(obs.get("version"))
    if version is not None:
        state["version"] = version
    state["ha_group"] = obs.get("ha_group") or None

    if obs.get("reason") == "invalidated":
        cause = obs.get("cause")
        kind = str(cause)[:MAX_CAUSE_LEN] if cause else "unknown"
        entries = state["invalidations"]
        entries.insert(bisect.bisect_right([e[0] for e in entries], now), [now, kind])
        if len(entries) > cfg.refresh_history_cap:
            del entries[: len(entries) - cfg.refresh_history_cap]
        state["invalidated_total"] += 1

    if obs.get("ok") is True:
        previous = state["last_success_at"]
        if previous is None or now > previous:
            state["last_success_at"] = now
            state["failures_since_success"] = 0
            out += _resolve(state, Alert.METADATA_STALE, entity, labels, now,
                            {"last_success_at": now, "previous_success_at": previous})
    elif state["last_success_at"] is None or now > state["last_success_at"]:  # a late failure is old news
        state["failures_since_success"] += 1
        error = obs.get("error")
        state["last_error"] = str(error) if error else "refresh failed (no error text)"
        state["last_error_at"] = now
        out += _stale(state, now, entity, cfg)
    return out + _refresh_storm(state, now, entity, cfg)


def tick_client(state: dict, now: int, entity: str, cfg: ClientRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Time-driven client checks: MetadataStale opens; an open MetadataRefreshStorm resolves
    once the window slid."""
    now = int(now)
    out = _stale(state, now, entity, cfg)
    if Alert.METADATA_REFRESH_STORM.value in state["open"]:
        out += _refresh_storm(state, now, entity, cfg)
    return out


def client_due_at(state: dict, cfg: ClientRulesConfig = DEFAULT_CONFIG) -> Optional[int]:
    """Earliest time at which :func:`tick_client` can produce a transition (None: never
    without a new event)."""
    due: list[int] = []
    ref = _stale_reference(state)
    if ref is not None and Alert.METADATA_STALE.value not in state["open"]:
        due.append(ref + _stale_limit(_max_age(state, cfg)[0], cfg) + 1)
    if Alert.METADATA_REFRESH_STORM.value in state["open"]:
        ts = sorted(e[0] for e in state["invalidations"])
        k = len(ts) - cfg.refresh_storm_clear - 1  # the count reaches clear when ts[k] ages out
        due.append(ts[k] + cfg.refresh_storm_window_ms + 1 if k >= 0 else 0)
    return min(due) if due else None
