"""Group rules (entity cluster/group, from ``group_state`` and ``rebalance`` events):
RebalanceStorm, RebalanceStuck, GroupEmptyWithLag; settings in ``GroupRulesConfig``
(``[job.rules.group]``).  Also the helpers the client and source rules share with them.

Pure functions of (entity state, one observation, now): the conventions of
:mod:`streaming.rules.base`.  How each alert decides: docs/rules.md.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, fields
from typing import Any, Iterable, Optional

from streaming.rules.base import Alert, Transition, _open, _resolve

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def check_settings(cfg: Any, positive: Iterable[str] = ()) -> None:
    """Every field of the settings dataclass ``cfg`` an integer (a ``float`` field: a finite
    number), never a bool; those named in ``positive`` > 0.  The message names the setting as
    ``<class>.<field>``."""
    name = type(cfg).__name__
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        kind = float if f.type in ("float", float) else int
        ok = (isinstance(v, (int, float)) if kind is float else isinstance(v, int)) and not isinstance(v, bool)
        if not ok or (kind is float and not math.isfinite(v)):
            raise ValueError(f"{name}.{f.name}: must be a{'' if kind is int else ' finite'} "
                             f"{'integer' if kind is int else 'number'}, got {v!r}")
    for p in positive:
        if getattr(cfg, p) <= 0:
            raise ValueError(f"{name}.{p}: must be > 0, got {getattr(cfg, p)!r}")


def check_grace(cfg: Any) -> None:
    """``silence_grace_ms`` >= 0 (the client and source rules' settings)."""
    if cfg.silence_grace_ms < 0:
        raise ValueError(f"{type(cfg).__name__}.silence_grace_ms: must be >= 0, got {cfg.silence_grace_ms!r}")


def check_factor(cfg: Any, name: str) -> None:
    """A factor of what a client announces (its max age, its heartbeat interval) >= 1."""
    if getattr(cfg, name) < 1:
        raise ValueError(f"{type(cfg).__name__}.{name}: must be >= 1 (less would fire between two "
                         f"healthy reports), got {getattr(cfg, name)!r}")


@dataclass(frozen=True)
class GroupRulesConfig:
    """Thresholds of the group rules (validated on construction)."""

    #: RebalanceStorm opens at this many rebalances within the window (catalogue: N = 5)
    storm_min_rebalances: int = 5
    #: RebalanceStorm window W (10 min: a healthy group rebalances on deploys and scaling, a
    #: handful an hour; five in ten minutes is a crash loop or a poll-interval problem)
    storm_window_ms: int = 600_000
    #: member ``assigned`` reports without a generation this close together are one rebalance
    #: (members get their SyncGroup answers within moments of each other)
    storm_merge_ms: int = 5_000
    #: at most this many rebalances are remembered (>= storm_min_rebalances; the count saturates
    #: here, which is far above any threshold)
    rebalance_history_cap: int = 64
    #: RebalanceStuck after this long continuously Preparing/CompletingRebalance (5 min: a
    #: rebalance waits at most max.poll.interval.ms, 5 min by default, for the slowest member)
    stuck_after_ms: int = 300_000
    #: GroupEmptyWithLag after Empty with lag for this long (10 min: longer than a redeploy)
    empty_with_lag_after_ms: int = 600_000
    #: total lag (offsets, over the group's partitions with a known lag) that counts as "lag"
    empty_min_total_lag: int = 1

    def __post_init__(self) -> None:
        check_settings(self, ("storm_min_rebalances", "storm_window_ms", "rebalance_history_cap", "stuck_after_ms",
                              "empty_with_lag_after_ms", "empty_min_total_lag"))
        if not 0 <= self.storm_merge_ms < self.storm_window_ms:
            raise ValueError(f"GroupRulesConfig.storm_merge_ms: must be within 0..storm_window_ms-1 "
                             f"({self.storm_window_ms - 1}), got {self.storm_merge_ms}")
        if self.storm_min_rebalances > self.rebalance_history_cap:
            raise ValueError(f"GroupRulesConfig.storm_min_rebalances: must be <= rebalance_history_cap "
                             f"({self.rebalance_history_cap}), got {self.storm_min_rebalances}")


DEFAULT_CONFIG = GroupRulesConfig()

# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

#: the classic protocol's states, and the consumer protocol's (KIP-848) Assigning and Reconciling
KNOWN_GROUP_STATES = frozenset({"Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead",
                                "Assigning", "Reconciling"})
REBALANCING = frozenset({"PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling"})
#: where a round of rebalancing starts (a new generation, or a new group epoch)
ROUND_STARTS = frozenset({"PreparingRebalance", "Assigning"})
UNKNOWN = "Unknown"
#: longest cause text kept as a "kind" (causes are short names; this only guards the state size)
MAX_CAUSE_LEN = 80


def _age(now: int, t: int) -> int:
    """now - t, never negative."""
    return max(0, now - t)


def _int(v: Any) -> Optional[int]:
    """An optional integer from an observation (None, NaN and non-numbers -> None)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(f):
        return None
    return int(f)


def _positive(v: Any) -> Optional[int]:
    i = _int(v)
    return i if i is not None and i > 0 else None


def _generation(v: Any) -> Optional[int]:
    g = _int(v)
    return g if g is not None and g >= 0 else None


def _member_count(v: Any) -> Optional[int]:
    """Members as a list (or array) of members, or already a count; None when absent."""
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _int(v)
    try:
        return len(v)
    except TypeError:
        return None


# ---------------------------------------------------------------------------------------------
# Group entity
# ---------------------------------------------------------------------------------------------


def group_labels(state: dict) -> dict[str, Any]:
    return {"cluster": state["cluster"], "group": state["group"]}


def new_group(cluster: str, group: str) -> dict:
    return {
        "cluster": cluster, "group": group, "last_seen": None, "open": {},
        # the coordinator's view (group_state)
        "state": None,            # last reported state, Unknown included (for export)
        "known_state": None,      # last reported state other than Unknown
        "state_seen_at": None,
        "late_reports": 0,        # group_state reports older than the latest one (ignored)
        "members": None,          # member count in the last report
        "members_sig": None,      # fingerprint of the members and assignments last reported
        "coord_generation": None,  # last generation a group_state carried
        "generation": None,       # last generation known from any witness
        # RebalanceStuck
        "rebalancing_since": None, "rebalancing_reports": 0,
        # GroupEmptyWithLag
        "empty_since": None, "lag_since": None,
        # RebalanceStorm: [t, generation or None, done_at or None], sorted by t, capped
        "rebalances": [], "rebalances_total": 0,
    }


def _prune(entries: list[list], now: int, window_ms: int) -> list[list]:
    """The entries (sorted by time) still within ``window_ms`` of ``now``; the list itself
    when none aged out (the common case costs one comparison)."""
    if not entries or _age(now, entries[0][0]) <= window_ms:
        return entries
    return [e for e in entries if _age(now, e[0]) <= window_ms]


def _insert_rebalance(state: dict, entry: list, cfg: GroupRulesConfig) -> None:
    entries = state["rebalances"]
    keys = [e[0] for e in entries]
    entries.insert(bisect.bisect_right(keys, entry[0]), entry)
    if len(entries) > cfg.rebalance_history_cap:
        del entries[: len(entries) - cfg.rebalance_history_cap]
    state["rebalances_total"] += 1


def _rebalance_started(state: dict, now: int, cfg: GroupRulesConfig) -> None:
    """The coordinator saw a rebalance begin at ``now``."""
    entries = state["rebalances"]
    keys = [e[0] for e in entries]
    i = bisect.bisect_right(keys, now)
    # arriving late, after a member already reported the end of this rebalance (and no other
    # start lies between): the same rebalance, seen from its beginning
    if i < len(entries) and entries[i][2] is not None and entries[i][0] == entries[i][2]:
        entries[i][0] = now
        entries.sort(key=lambda e: e[0])
        return
    _insert_rebalance(state, [now, None, None], cfg)


def _rebalance_done(state: dict, now: int, gen: Optional[int], cfg: GroupRulesConfig) -> None:
    """A witness says a rebalance completed at ``now`` (into ``gen`` when known)."""
    entries = state["rebalances"]
    if gen is not None and any(e[1] == gen for e in entries):
        return  # another member (or the coordinator) already reported this generation
    keys = [e[0] for e in entries]
    i = bisect.bisect_right(keys, now)
    if i > 0 and entries[i - 1][2] is None:
        entries[i - 1][1], entries[i - 1][2] = gen, now  # the end of the rebalance the coordinator saw begin
        return
    near = [e for e in entries if e[2] is not None and abs(e[2] - now) <= cfg.storm_merge_ms
            and (gen is None or e[1] is None)]
    if near:
        e = min(near, key=lambda e: (abs(e[2] - now), e[0]))
        if e[1] is None:
            e[1] = gen
        return
    _insert_rebalance(state, [now, gen, now], cfg)


def _members_changed(state: dict, since: int, now: int, cfg: GroupRulesConfig) -> None:
    """Two Stable observations (``since``, ``now``) with different members or assignments: a
    rebalance went by between two polls.  Counted unless a witness already put one there."""
    if any(since < e[0] <= now or (e[2] is not None and since < e[2] <= now) for e in state["rebalances"]):
        return
    _insert_rebalance(state, [now, None, now], cfg)


def _storm(state: dict, now: int, entity: str, labels: dict, cfg: GroupRulesConfig) -> list[Transition]:
    window = state["rebalances"] = _prune(state["rebalances"], now, cfg.storm_window_ms)
    count = len(window)
    is_open = Alert.REBALANCE_STORM.value in state["open"]
    if count >= cfg.storm_min_rebalances and not is_open:
        return _open(state, Alert.REBALANCE_STORM, entity, labels, now, {
            "count": count, "window_ms": cfg.storm_window_ms, "threshold": cfg.storm_min_rebalances,
            "rebalances": [{"at": e[0], "generation": e[1]} for e in window]})
    if count < cfg.storm_min_rebalances and is_open:
        return _resolve(state, Alert.REBALANCE_STORM, entity, labels, now,
                        {"count": count, "window_ms": cfg.storm_window_ms, "threshold": cfg.storm_min_rebalances})
    return []


def _enters_rebalance(prev: Optional[str], st: str) -> bool:
    """Whether the coordinator's move from ``prev`` (last known state) to ``st`` means a
    rebalance began (see the module doc)."""
    if prev is None or prev == st:
        return False
    if st in ROUND_STARTS:
        return True
    if st in REBALANCING:
        return prev not in REBALANCING
    return {prev, st} == {"Empty", "Stable"}


def on_group_state(state: dict, obs: dict, now: int, entity: str,
                   cfg: GroupRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one ``group_state`` observation (the coordinator's DescribeGroups answer) into the
    group's state; return RebalanceStorm / RebalanceStuck / GroupEmptyWithLag transitions."""
    now = int(now)
    labels = group_labels(state)
    if state["state_seen_at"] is not None and now < state["state_seen_at"]:
        state["late_reports"] += 1  # older than the report already folded: says nothing about now
        return []
    reported = obs.get("state")
    st = reported if reported in KNOWN_GROUP_STATES else UNKNOWN
    gen = _generation(obs.get("generation"))
    members = _member_count(obs.get("members"))
    seen_before = state["state_seen_at"]
    state.update(state=st, state_seen_at=now, members=members)
    if state["last_seen"] is None or now > state["last_seen"]:
        state["last_seen"] = now
    out: list[Transition] = []

    if st == UNKNOWN:
        # no information: continuity is broken (timers restart), nothing resolves
        state.update(rebalancing_since=None, rebalancing_reports=0, empty_since=None, lag_since=None)
        return out + _storm(state, now, entity, labels, cfg)

    prev = state["known_state"]
    rebalancing = st in REBALANCING
    sig, prev_sig = obs.get("members_sig"), state.get("members_sig")
    if sig is not None:
        state["members_sig"] = sig
    if _enters_rebalance(prev, st):
        _rebalance_started(state, now, cfg)
    elif prev == st == "Stable" and prev_sig is not None and sig is not None and sig != prev_sig \
            and seen_before is not None:
        _members_changed(state, seen_before, now, cfg)
    if gen is not None:
        if state["coord_generation"] is not None and gen != state["coord_generation"]:
            _rebalance_done(state, now, gen, cfg)
        state["coord_generation"] = gen
        state["generation"] = gen
    state["known_state"] = st

    # RebalanceStuck
    if rebalancing:
        if state["rebalancing_since"] is None:
            state["rebalancing_since"], state["rebalancing_reports"] = now, 0
        state["rebalancing_reports"] += 1
        since = state["rebalancing_since"]
        duration = _age(now, since)
        if duration > cfg.stuck_after_ms:
            out += _open(state, Alert.REBALANCE_STUCK, entity, labels, now, {
                "state": st, "rebalancing_since": since, "duration_ms": duration,
                "threshold_ms": cfg.stuck_after_ms, "reports": state["rebalancing_reports"],
                "generation": state["generation"], "members": members})
    else:
        state["rebalancing_since"], state["rebalancing_reports"] = None, 0
        out += _resolve(state, Alert.REBALANCE_STUCK, entity, labels, now,
                        {"state": st, "generation": state["generation"], "members": members})

    # GroupEmptyWithLag (opened by tick_group, which has the lags)
    if st == "Empty":
        if state["empty_since"] is None:
            state["empty_since"] = now
    else:
        state["empty_since"] = state["lag_since"] = None
        out += _resolve(state, Alert.GROUP_EMPTY_WITH_LAG, entity, labels, now, {"state": st, "members": members})

    return out + _storm(state, now, entity, labels, cfg)


def on_rebalance(state: dict, obs: dict, now: int, entity: str,
                 cfg: GroupRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one ``rebalance`` event (one member's phase of the protocol); only ``assigned``
    counts (see the module doc)."""
    now = int(now)
    if state["last_seen"] is None or now > state["last_seen"]:
        state["last_seen"] = now
    if obs.get("phase") == "assigned":
        gen = _generation(obs.get("generation"))
        _rebalance_done(state, now, gen, cfg)
        if gen is not None:
            state["generation"] = gen
    return _storm(state, now, entity, group_labels(state), cfg)


def tick_group(state: dict, now: int, entity: str, cfg: GroupRulesConfig = DEFAULT_CONFIG,
               partition_lags: Iterable[Optional[int]] = (),
               partition_lag_from: Iterable[Optional[int]] = ()) -> list[Transition]:
    """Time-driven group checks: an open RebalanceStorm whose window slid, and
    GroupEmptyWithLag with the lags of the group's partitions (None = unknown).  Does not
    touch ``partition_lags`` unless the group is Empty or the alert is open.

    ``partition_lag_from``: when each partition's lag began (its ``lag_from``, event time).  The
    lag's start is then the earliest of them, not before the group went Empty: the same in a job
    that read the same events in other micro-batches (restarted), where the tick's own ``now``
    differs.  Without them (or none known) it is the first tick that saw the lag."""
    now = int(now)
    out: list[Transition] = []
    open_ = state["open"]
    labels = None
    if Alert.REBALANCE_STORM.value in open_:
        labels = group_labels(state)
        out += _storm(state, now, entity, labels, cfg)
    empty = state["known_state"] == "Empty"
    if not empty and Alert.GROUP_EMPTY_WITH_LAG.value not in open_:
        return out
    # the coordinator's last word is Unknown: no timer runs and nothing opens, but lag back at
    # 0 still resolves (the condition is Empty AND lag; lag alone being gone ends it)
    unknown_state = state["state"] == UNKNOWN
    labels = labels or group_labels(state)
    if not empty:  # cannot happen through on_group_state; kept so the state cannot get stuck
        state["lag_since"] = None
        return out + _resolve(state, Alert.GROUP_EMPTY_WITH_LAG, entity, labels, now, {"state": state["state"]})

    total = largest = known = unknown = lagging = 0
    for v in partition_lags:
        lag = _int(v)
        if lag is None:
            unknown += 1
            continue
        lag = max(0, lag)
        known += 1
        total += lag
        largest = max(largest, lag)
        lagging += lag > 0
    if known == 0:
        return out  # nothing known: hold (neither a recovery nor evidence of lag)
    evidence = {"total_lag": total, "max_lag": largest, "lagging_partitions": lagging,
                "known_partitions": known, "unknown_partitions": unknown, "empty_since": state["empty_since"]}
    if total >= cfg.empty_min_total_lag:
        if unknown_state:
            return out
        began = min((int(f) for f in partition_lag_from if f is not None), default=None)
        since = now if began is None else min(now, max(began, state["empty_since"] or began))
        if state["lag_since"] is None or (since < state["lag_since"]
                                          and Alert.GROUP_EMPTY_WITH_LAG.value not in open_):
            # a partition seen later in event time order may show an earlier start: the earliest wins
            state["lag_since"] = since
        duration = _age(now, state["lag_since"])
        if duration > cfg.empty_with_lag_after_ms:
            # stamped with the moment it fell due, not the batch's: a job that read the same
            # events in other micro-batches (restarted, replayed) opens it with the same id
            at = min(now, state["lag_since"] + cfg.empty_with_lag_after_ms + 1)
            out += _open(state, Alert.GROUP_EMPTY_WITH_LAG, entity, labels, at, {
                **evidence, "lag_since": state["lag_since"], "duration_ms": _age(at, state["lag_since"]),
                "threshold_ms": cfg.empty_with_lag_after_ms, "observed_at": now})
    else:
        state["lag_since"] = None
        out += _resolve(state, Alert.GROUP_EMPTY_WITH_LAG, entity, labels, now, evidence)
    return out


def group_due_at(state: dict, cfg: GroupRulesConfig = DEFAULT_CONFIG) -> Optional[int]:
    """Earliest time at which :func:`tick_group` can produce a transition (None: nothing
    pending).  While the group is Empty (or GroupEmptyWithLag is open) every tick is due:
    the lags change between ticks, and the lag timer must see them return to 0."""
    due: list[int] = []
    if Alert.REBALANCE_STORM.value in state["open"]:
        ts = sorted(e[0] for e in state["rebalances"])
        # the count drops below N when the (count - N + 1) oldest have aged out
        k = len(ts) - cfg.storm_min_rebalances
        due.append(ts[k] + cfg.storm_window_ms + 1 if k >= 0 else 0)
    if state["empty_since"] is not None:
        due.append(state["empty_since"])
    elif Alert.GROUP_EMPTY_WITH_LAG.value in state["open"]:
        due.append(0)
    return min(due) if due else None
