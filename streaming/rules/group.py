"""Group, client and source rules: pure functions of (entity state, one observation, now).

The conventions are those of :mod:`streaming.rules.base`: entity states are plain dicts (only dict,
list, int, float, str, bool and None, so they survive the state store), ``state["open"]`` holds
the open alerts, transitions come from ``rules._open`` / ``rules._resolve``, and no clock is
read here (``now`` is an argument, epoch ms).  Every ``on_*`` function folds one observation
into the state (mutated) and returns the transitions it caused; every ``tick_*`` function
evaluates the time-driven conditions and is a few comparisons when nothing is due
(``*_due_at`` say when something next can be).

``now`` in a tick may be the wall clock at the call (processing time) or the batch's largest
event time; both work.  Ages are never negative: a time later than ``now`` (a tick whose
clock is behind the events, or an event that arrives late) has age 0.  Windows are evaluated
at the ``now`` given, so with a processing-time tick a lagging pipeline sees its windows
slightly ahead of event time (a storm may resolve up to the pipeline's lag early).

Three entities, each with its key:

Group (cluster/group) -- ``group_state`` and ``rebalance`` events
    RebalanceStorm (warning): >= ``storm_min_rebalances`` rebalances within
    ``storm_window_ms``; resolves when the count in the window drops below that.  Each
    rebalance is counted once however many witnesses report it; the evidence are kept as a
    bounded, time-sorted list ``rebalances`` of ``[t, generation, done_at]``:

    - the coordinator (``group_state``) *starts* a rebalance when the group enters
      PreparingRebalance from another known state (Stable, Empty, Dead, or CompletingRebalance:
      a new round, which makes a new generation) or enters CompletingRebalance from outside the
      rebalancing states (the poll missed PreparingRebalance); for the consumer protocol
      (KIP-848) Assigning (a new group epoch) and Reconciling the same way, or goes Empty -> Stable or
      Stable -> Empty (the polls missed the whole rebalance: the coordinator changes membership
      only through one), or stays Stable with other members or assignments than at its
      previous observation (``members_sig``: a rebalance went by between two polls; counted
      unless a witness already put one in that gap).  PreparingRebalance -> CompletingRebalance is the same rebalance;
      transitions between Dead and Empty/Stable are not counted (Dead is also what a coordinator
      that is unloading or has lost the group answers).  The first observation of an entity is
      never an entry (nothing says what came before); Unknown is no information (the next known
      state is compared with the last known one).
    - a rebalance is *done* when a member reports ``assigned`` (members report the generation
      they were assigned into) or when the coordinator's generation changes between two
      ``group_state`` observations that both carry one.  A done with a generation already in the
      list is a duplicate (three members of generation 7 = one rebalance); a done claims the
      latest start before it that no done has claimed yet (the coordinator saw that rebalance
      begin, the members see it end); a done without a generation within ``storm_merge_ms`` of
      another done is the same rebalance (members get their assignment within moments of each
      other); otherwise it is a new rebalance.
    - ``revoked``, ``lost``, ``join_started`` and ``failed`` are one member's view of a
      rebalance that the group completes (``assigned``) or the coordinator sees; they carry the
      member's *previous* generation, so they are not counted (that would count each rebalance
      twice).
    Assumes the probe's and the members' clocks agree to better than a rebalance's duration.

    RebalanceStuck (critical): every ``group_state`` observation since the group entered
    PreparingRebalance/CompletingRebalance (or Assigning/Reconciling; any of them, continuously) said so, for more than
    ``stuck_after_ms``.  Opened on an observation (never by a tick: a claim needs a report);
    resolves when the coordinator reports any other known state.  An Unknown report breaks the
    continuity (the timer restarts at the next rebalancing report) but does not resolve.  The
    first observation already rebalancing starts the timer then (conservative).

    GroupEmptyWithLag (warning): the coordinator reports Empty and the group's partition lags
    add up to >= ``empty_min_total_lag`` (default 1: "lag > 0"), continuously for more than
    ``empty_with_lag_after_ms``.  Evaluated in :func:`tick_group` with the lags of the group's
    partitions (the lead's ``group_partition`` states; None = unknown, not counted).  Sum, not
    max: lags are never negative, so "sum > 0" and "max > 0" are the same condition; the sum is
    the work nobody is doing, which is what the evidence should say (the max and the number of
    lagging partitions are in it too).  Only known lags count; when none is known the condition
    holds as it was (neither opens nor resolves: an HW missing for a moment is no recovery).
    The lag timer starts at the first tick that sees Empty with lag (ticks run every batch).
    Resolves when the coordinator reports another known state (members came back, or the group
    is Dead) or a tick sees every known lag at 0.  Unknown breaks the continuity (the timer
    restarts at the next Empty report) and does not resolve; lag at 0 still resolves.

    Dead and vanished groups: Dead is a known non-rebalancing, non-Empty state, so it resolves
    RebalanceStuck and GroupEmptyWithLag (a deleted group has no offsets left to be behind on;
    DescribeGroups also answers Dead for a group id that does not exist).  An open storm
    resolves by itself as the window slides (in ticks).  A group that stops being observed is
    evicted by the lead's TTL (``last_seen``); ``rules.evict`` then resolves whatever is still
    open with "entity no longer observed".  Dead -> PreparingRebalance (a group id reused) is a
    rebalance like any other.

Client (cluster/source) -- ``metadata_refresh`` events, one client's metadata cache
    MetadataStale (warning): no successful refresh for more than ``metadata_stale_factor``
    (2) x ``metadata.max.age.ms``.  The max age is the last value the client's events carried
    (a client does not change it while running), else ``metadata_max_age_default_ms`` (Kafka's
    default, 300000).  Opened by a failed refresh or a tick; resolved by the next successful
    refresh (a late success older than the one already known changes nothing).  A client that
    never succeeded is measured from its first event.  Evidence: last success time, age, the
    max age used and where it came from, the last error, failures since the last success.

    MetadataRefreshStorm (warning): more than ``refresh_storm_max`` refreshes with reason
    ``invalidated`` (ok or failed: every attempt loads the cluster) within the sliding
    ``refresh_storm_window_ms`` (60 s).  Periodic, bootstrap and new_topic refreshes never
    count.  Resolves with hysteresis, when the count falls to ``refresh_storm_clear`` (5) or
    fewer: invalidations come in bursts (a broker bounce gives a connect_failed per reconnect
    backoff, a leader election a NOT_LEADER per retry), so the 60-s count hovers around the
    threshold while the cause lasts and a plain "below N" would open and resolve every few
    seconds; once the invalidations stop the count reaches 5 within one window, so the cost is
    at most 60 s of extra open time.  Evidence: the count, the causes counted by kind
    (``{"error_response:NOT_LEADER_OR_FOLLOWER": 7, ...}``), and ``capped`` when the bounded
    list (``refresh_history_cap``) was full, i.e. the real count may be higher.

Source (cluster/source) -- ``heartbeat`` events, the monitor's own eyes
    SourceSilent (critical): no heartbeat for more than ``silent_factor`` (3) x the interval the
    source announced in its last heartbeat.  Opened by a tick, resolved by the next heartbeat.
    A restarted source (``started_at`` changed, or its counters or ``seq`` went backwards) is
    recorded: ``restarts`` (count), ``last_restart_at``; no alert.  ``dropped_since_last``: events
    the source dropped since its previous heartbeat (after a restart: all the new process
    dropped; None on the first heartbeat, nothing to compare with); ``dropped_total``: every drop
    the job has seen reported (a counter that survives source restarts).  A heartbeat older than
    the latest one (late) is counted in ``late_heartbeats`` and otherwise ignored.
    Note for eviction: a source that stays silent longer than the entity TTL is evicted, and
    ``rules.evict`` resolves its SourceSilent although the source is still silent.

Call order for the lead: per batch and entity, the ``on_*`` functions in event order
(observed_at, seq) with ``now`` = the event's observed_at, then the entity's ``tick_*`` with the
batch's ``now``; on a state timeout, ``tick_*`` with the processing time; then ``rules.evict``.
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


@dataclass(frozen=True)
class GroupRulesConfig:
    """Thresholds of the group, client and source rules (validated on construction)."""

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
    #: metadata.max.age.ms when the client's events do not carry it (Kafka's default)
    metadata_max_age_default_ms: int = 300_000
    #: MetadataStale after this many max ages without a successful refresh (catalogue: 2)
    metadata_stale_factor: float = 2.0
    #: MetadataRefreshStorm opens when invalidated refreshes in the window are MORE than this
    refresh_storm_max: int = 10
    #: ... and resolves when they are this many or fewer (hysteresis, see the module doc)
    refresh_storm_clear: int = 5
    #: the refresh storm's sliding window ("per minute")
    refresh_storm_window_ms: int = 60_000
    #: at most this many invalidated refreshes are remembered (> refresh_storm_max)
    refresh_history_cap: int = 64
    #: SourceSilent after this many announced heartbeat intervals without one (catalogue: 3)
    silent_factor: float = 3.0
    #: heartbeat interval assumed when a heartbeat announces none (the probe's default, 10 s)
    heartbeat_interval_default_ms: int = 10_000

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            kind = float if f.type in ("float", float) else int
            ok = (isinstance(v, (int, float)) if kind is float else isinstance(v, int)) and not isinstance(v, bool)
            if not ok or (kind is float and not math.isfinite(v)):
                raise ValueError(f"GroupRulesConfig.{f.name}: must be a{'' if kind is int else ' finite'} "
                                 f"{'integer' if kind is int else 'number'}, got {v!r}")
        positive = ("storm_min_rebalances", "storm_window_ms", "rebalance_history_cap", "stuck_after_ms",
                    "empty_with_lag_after_ms", "empty_min_total_lag", "metadata_max_age_default_ms",
                    "refresh_storm_max", "refresh_storm_window_ms", "refresh_history_cap",
                    "heartbeat_interval_default_ms")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"GroupRulesConfig.{name}: must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.storm_merge_ms < self.storm_window_ms:
            raise ValueError(f"GroupRulesConfig.storm_merge_ms: must be within 0..storm_window_ms-1 "
                             f"({self.storm_window_ms - 1}), got {self.storm_merge_ms}")
        if self.storm_min_rebalances > self.rebalance_history_cap:
            raise ValueError(f"GroupRulesConfig.storm_min_rebalances: must be <= rebalance_history_cap "
                             f"({self.rebalance_history_cap}), got {self.storm_min_rebalances}")
        if not 0 <= self.refresh_storm_clear < self.refresh_storm_max:
            raise ValueError(f"GroupRulesConfig.refresh_storm_clear: must be within 0..refresh_storm_max-1 "
                             f"({self.refresh_storm_max - 1}), got {self.refresh_storm_clear}")
        if self.refresh_history_cap <= self.refresh_storm_max:
            raise ValueError(f"GroupRulesConfig.refresh_history_cap: must be > refresh_storm_max "
                             f"({self.refresh_storm_max}), got {self.refresh_history_cap}")
        for name in ("metadata_stale_factor", "silent_factor"):
            if getattr(self, name) < 1:
                raise ValueError(f"GroupRulesConfig.{name}: must be >= 1 (less would fire between two "
                                 f"healthy reports), got {getattr(self, name)!r}")


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
               partition_lags: Iterable[Optional[int]] = ()) -> list[Transition]:
    """Time-driven group checks: an open RebalanceStorm whose window slid, and
    GroupEmptyWithLag with the lags of the group's partitions (None = unknown).  Does not
    touch ``partition_lags`` unless the group is Empty or the alert is open."""
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
        if state["lag_since"] is None:
            state["lag_since"] = now
        duration = _age(now, state["lag_since"])
        if duration > cfg.empty_with_lag_after_ms:
            out += _open(state, Alert.GROUP_EMPTY_WITH_LAG, entity, labels, now, {
                **evidence, "lag_since": state["lag_since"], "duration_ms": duration,
                "threshold_ms": cfg.empty_with_lag_after_ms})
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
    }


def _max_age(state: dict, cfg: GroupRulesConfig) -> tuple[int, str]:
    if state["max_age_ms"] is not None:
        return state["max_age_ms"], "event"
    return cfg.metadata_max_age_default_ms, "default"


def _stale_reference(state: dict) -> Optional[int]:
    return state["last_success_at"] if state["last_success_at"] is not None else state["first_refresh_at"]


def _stale(state: dict, now: int, entity: str, cfg: GroupRulesConfig) -> list[Transition]:
    ref = _stale_reference(state)
    if ref is None or Alert.METADATA_STALE.value in state["open"]:
        return []
    max_age, origin = _max_age(state, cfg)
    limit = int(cfg.metadata_stale_factor * max_age)
    age = _age(now, ref)
    if age <= limit:
        return []
    return _open(state, Alert.METADATA_STALE, entity, client_labels(state), now, {
        "last_success_at": state["last_success_at"], "measured_from": ref, "age_ms": age,
        "max_age_ms": max_age, "max_age_from": origin, "limit_ms": limit, "last_error": state["last_error"],
        "last_error_at": state["last_error_at"], "failures_since_success": state["failures_since_success"],
        "last_attempt_at": state["last_attempt_at"]})


def _refresh_storm(state: dict, now: int, entity: str, cfg: GroupRulesConfig) -> list[Transition]:
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
                        cfg: GroupRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
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


def tick_client(state: dict, now: int, entity: str, cfg: GroupRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Time-driven client checks: MetadataStale opens; an open MetadataRefreshStorm resolves
    once the window slid."""
    now = int(now)
    out = _stale(state, now, entity, cfg)
    if Alert.METADATA_REFRESH_STORM.value in state["open"]:
        out += _refresh_storm(state, now, entity, cfg)
    return out


def client_due_at(state: dict, cfg: GroupRulesConfig = DEFAULT_CONFIG) -> Optional[int]:
    """Earliest time at which :func:`tick_client` can produce a transition (None: never
    without a new event)."""
    due: list[int] = []
    ref = _stale_reference(state)
    if ref is not None and Alert.METADATA_STALE.value not in state["open"]:
        due.append(ref + int(cfg.metadata_stale_factor * _max_age(state, cfg)[0]) + 1)
    if Alert.METADATA_REFRESH_STORM.value in state["open"]:
        ts = sorted(e[0] for e in state["invalidations"])
        k = len(ts) - cfg.refresh_storm_clear - 1  # the count reaches clear when ts[k] ages out
        due.append(ts[k] + cfg.refresh_storm_window_ms + 1 if k >= 0 else 0)
    return min(due) if due else None


# ---------------------------------------------------------------------------------------------
# Source entity (a probe or instrumented client, seen through its heartbeats)
# ---------------------------------------------------------------------------------------------


def source_labels(state: dict) -> dict[str, Any]:
    return {"cluster": state["cluster"], "source": state["source"]}


def new_source(cluster: str, source: str) -> dict:
    return {
        "cluster": cluster, "source": source, "last_seen": None, "open": {},
        "last_heartbeat_at": None,
        "interval_ms": None,          # as announced in the last heartbeat
        "events_sent": None, "events_dropped": None,  # the source's counters (since it started)
        "started_at": None, "seq": None,
        "restarts": 0, "last_restart_at": None,
        "dropped_since_last": None,   # drops between the two last heartbeats (None: first one)
        "dropped_total": 0,           # every drop reported, across restarts
        "late_heartbeats": 0,
        "cycle_duration_ms": None, "observation_lag_ms": None,  # the last heartbeat's cycle figures
    }


def _interval(state: dict, cfg: GroupRulesConfig) -> int:
    return state["interval_ms"] if state["interval_ms"] is not None else cfg.heartbeat_interval_default_ms


def on_heartbeat(state: dict, obs: dict, now: int, entity: str,
                 cfg: GroupRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one heartbeat: resolves SourceSilent, records restarts and drops."""
    now = int(now)
    previous_at = state["last_heartbeat_at"]
    if previous_at is not None and now < previous_at:
        state["late_heartbeats"] += 1  # older than what we know: nothing new
        return []
    if state["last_seen"] is None or now > state["last_seen"]:
        state["last_seen"] = now
    sent, dropped = _int(obs.get("events_sent")), _int(obs.get("events_dropped"))
    started_at, seq = _int(obs.get("started_at")), _int(obs.get("seq"))
    restarted = False
    if previous_at is not None:
        def went_back(new: Optional[int], old: Optional[int]) -> bool:
            return new is not None and old is not None and new < old

        restarted = ((started_at is not None and state["started_at"] is not None and started_at != state["started_at"])
                     or went_back(sent, state["events_sent"]) or went_back(dropped, state["events_dropped"])
                     or went_back(seq, state["seq"]))
    if restarted:
        state["restarts"] += 1
        state["last_restart_at"] = now
    if dropped is None:
        since_last = None
    elif previous_at is None:
        since_last = None
        state["dropped_total"] += max(0, dropped)
    elif restarted or state["events_dropped"] is None:
        since_last = max(0, dropped)
    else:
        since_last = max(0, dropped - state["events_dropped"])
    if since_last is not None:
        state["dropped_total"] += since_last
    state["dropped_since_last"] = since_last

    interval = _positive(obs.get("interval_ms"))
    state.update(cycle_duration_ms=_int(obs.get("cycle_duration_ms")),
                 observation_lag_ms=_int(obs.get("observation_lag_ms")))
    state.update(last_heartbeat_at=now, events_sent=sent, events_dropped=dropped,
                 started_at=started_at if started_at is not None else (None if restarted else state["started_at"]),
                 seq=seq)
    if interval is not None:
        state["interval_ms"] = interval
    return _resolve(state, Alert.SOURCE_SILENT, entity, source_labels(state), now, {
        "last_heartbeat_at": now, "previous_heartbeat_at": previous_at,
        "silent_for_ms": None if previous_at is None else _age(now, previous_at), "restarted": restarted})


def tick_source(state: dict, now: int, entity: str, cfg: GroupRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Time-driven source check: SourceSilent opens after ``silent_factor`` x the announced
    interval without a heartbeat."""
    at = state["last_heartbeat_at"]
    if at is None or Alert.SOURCE_SILENT.value in state["open"]:
        return []
    now = int(now)
    interval = _interval(state, cfg)
    limit = int(cfg.silent_factor * interval)
    silent = _age(now, at)
    if silent <= limit:
        return []
    return _open(state, Alert.SOURCE_SILENT, entity, source_labels(state), now, {
        "last_heartbeat_at": at, "silent_for_ms": silent, "interval_ms": interval, "limit_ms": limit,
        "events_sent": state["events_sent"], "events_dropped": state["events_dropped"]})


def source_due_at(state: dict, cfg: GroupRulesConfig = DEFAULT_CONFIG) -> Optional[int]:
    """Earliest time at which :func:`tick_source` can open SourceSilent (None: not pending)."""
    at = state["last_heartbeat_at"]
    if at is None or Alert.SOURCE_SILENT.value in state["open"]:
        return None
    return at + int(cfg.silent_factor * _interval(state, cfg)) + 1
