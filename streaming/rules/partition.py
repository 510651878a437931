"""Partition and topic rules beyond the skeleton: UnderMinIsr / AtMinIsr, LeaderChanged,
PreferredLeaderImbalance, HighWatermarkStalled, PartitionUnobserved (partition entity) and
PartitionCountChanged (topic entity).

Same conventions as ``streaming.rules.base``: pure functions of (entity state, observation, now),
no clock and no I/O; states are plain JSON-able dicts (only dict/list/int/str/bool/None), open
alerts live in ``state["open"]`` and go through ``rules._open`` / ``rules._resolve`` (stable
alert id per episode; ``rules.evict`` resolves them when the entity vanishes).

Call order (partition entity)
-----------------------------
Per ``partition_metadata`` row::

    out += rules.on_partition_metadata(s, r, t, key)
    out += rules_partition.on_partition_metadata_extra(s, r, t, key, cfg)

Per ``partition_offsets`` row::

    out += rules.on_partition_offsets(s, r, t)
    out += rules_partition.on_partition_offsets_extra(s, r, t, key, cfg)

Then, once per micro-batch (and on a state timeout) for every partition entity of the bucket,
*before* ``evict_stale``::

    out += rules_partition.tick_partition(s, now, key, cfg)

The ``*_extra`` functions read the observation only from ``obs`` and their history only from
their own state keys (below); they never read what ``rules.on_partition_metadata`` writes, except
``state["min_isr"]`` as a fallback when ``obs`` carries no ``min_insync_replicas`` — and that key
holds the same value before and after that call in that case.  So calling them before or after
the ``streaming.rules.base`` functions gives the same transitions and the same state (a test proves
it); *after* is the recommended order.  Both ``*_extra`` functions count as an observation of
the partition (they resolve PartitionUnobserved themselves); any other event that proves the
partition is reported can call ``on_partition_observed(s, t, key)``.  ``tick_partition`` runs after
the fold, so it may (and does, for evidence only) read ``state["replicas"]``.

Call order (topic entity)
-------------------------
Per ``partition_count_change`` row (one per ``metadata_refresh.partition_count_changes`` entry)::

    s = entities.get(key) or rules_partition.new_topic(cluster, topic)
    out += rules_partition.on_partition_count_change(
        s, {"topic", "old_count", "new_count", "unseen_for_at_most_ms", "source", "seen_at"}, t, key, cfg)

and ``tick_topic(s, now, key, cfg)`` every micro-batch, before ``evict_stale`` (the topic
state's ``last_seen`` only moves when a client reports a change, so with
``entity_ttl_s`` = 15 min eviction would otherwise race the 15 min window; a tick at
``now - since >= window`` wins over an eviction at ``now - last_seen > ttl``).  Labels for the
topic entity: ``topic_labels(s)``.

The rules
---------
UnderMinIsr (critical) / AtMinIsr (warning) — only when min.insync.replicas is known
    (``obs.min_insync_replicas``, else the last known ``state["min_isr"]``).  Under: |ISR| < min
    ISR: acks=all producers get NOT_ENOUGH_REPLICAS.  At: |ISR| == min ISR *and* |ISR| <
    |replicas|, i.e. the partition lost redundancy it is configured to have and one more loss
    stops acks=all writes.  A partition whose replica count equals min ISR (RF=1 / min=1, or
    RF=2 / min=2) sits "at min" by design; paging on it would fire on every such topic forever,
    so it is not an alert (that is a configuration review item, not an incident).  RF=3 / min=1
    with ISR down to one replica *is* AtMinIsr: one more loss takes the partition offline.
    Exactly one of the two is open; moving between them resolves the old one first, then
    opens the new one.  While the partition has no leader (leader = -1) both are frozen
    (neither opened nor resolved): OfflinePartition pages for it, and like Kafka's own
    UnderMinIsr/AtMinIsr partition counts (computed by the leader) there is nothing to count.
LeaderChanged (info) — event-like: opens on the first change of leader or leader epoch (an
    epoch-only change — the same broker re-elected — counts); further changes keep the same
    episode open and are counted (and the last ``leader_history_max`` kept as evidence); it
    resolves in ``tick_partition`` once ``leader_quiet_ms`` passed without a change (a change
    arriving after the quiet window when no tick ran in between resolves the old episode and
    opens a new one, so the result does not depend on how often ticks run).  The first
    observation of a partition is not a change; an epoch that is unknown on either side is not
    compared (only the leader is).  Stale views: several probes may report the same partition,
    one of them with older metadata; an observation whose leader epoch is *lower* than the last
    accepted one is ignored, unless ``epoch_reset_after`` such observations arrive in a row (a
    deleted and re-created topic starts again from epoch 0), which is then accepted as a change
    (evidence ``epoch_reset: true``).  An observation older than the last accepted one (out of
    order) is ignored by every rule here.
PreferredLeaderImbalance (info) — leader != replicas[0] (the preferred leader) continuously for
    ``imbalance_after_ms``; opens on the observation or the tick that reaches it (the tick only
    while the last partition_metadata is younger than the unobserved window: it does not claim
    an imbalance from a leader view it has stopped receiving: the view is current while the last
    partition_metadata, or the last partition_offsets whose ``metadata_at`` says the source's
    metadata still showed it, is younger than that window — a probe sends partition_metadata
    only when it changes); resolves on the
    first observation with leader == replicas[0] or with no leader (an offline partition is not
    "imbalanced" — OfflinePartition covers it).
HighWatermarkStalled (critical) — the HW did not move while writes were known to be pending:
    an observation of the HW taken at least ``hw_stall_ms`` after writes were first seen pending
    (after the HW's last move) still shows the same HW.  Resolves when the HW moves.

    THIS RULE CANNOT FIRE TODAY.  Its only input is ``state["pending_writes_at"]``: the epoch ms
    at which some client last saw writes pending on this partition (an instrumented producer or a
    canary whose produced offset is beyond the HW, or whose acks=all produce is outstanding).
    The v1 event contract has no event that carries that (client_fetch is a consumer's view; no
    producer-side event exists), so nothing sets the key and the rule stays silent.  It is
    implemented and tested so that the day a producer-side event exists, the job only has to
    feed it: call ``note_pending_writes(s, at)`` (or write ``s["pending_writes_at"]``; the next
    offsets observation or tick picks it up).  An HW that is merely flat is *not* a stall: an idle
    topic has a flat HW forever.
PartitionUnobserved (warning) — no partition_metadata / partition_offsets (or
    ``on_partition_observed``) for the window: ``unobserved_intervals`` x the observing source's
    interval when the job knows it (pass ``interval_ms`` to ``on_partition_observed``: the
    probe's heartbeat ``interval_ms`` is its observation interval), else ``unobserved_after_ms``.
    Opens in ``tick_partition``; resolves on the next (newer) observation.  Pass ``blind=True`` to
    the tick while the job knows its sources are silent (SourceSilent open): then one
    SourceSilent pages instead of one PartitionUnobserved per partition (already open ones stay
    open).  A partition that is never observed again is resolved by ``rules.evict`` after the TTL.
PartitionCountChanged (info, topic entity) — opens on the first report of a new partition count;
    every client (``source``) that reports the same new count while the episode is open is
    recorded with when its metadata showed it (``seen_at``), its ``unseen_for_at_most_ms`` and its
    own old count, up to ``count_change_clients_max`` clients (the rest are counted).  The change
    happened inside every reporting client's interval (seen_at - unseen_for_at_most_ms, seen_at],
    so the evidence also bounds when it happened (``changed_after`` / ``changed_by``) and, per
    client, how long it ran on the stale partition count (``stale_for_at_least_ms`` /
    ``stale_for_at_most_ms``): keys went to other partitions meanwhile (KAFKA-INTERNALS §2).
    Resolves ``count_change_window_ms`` after it opened, in ``tick_topic``.  A different new count
    while open (partitions added again; or fewer partitions reported by a client that had the
    current count: a re-created topic) resolves the episode and opens a new one.  A report of an
    earlier change (new count below the current one from a client that did not have the current
    one) is stale and only counted.  A client that catches up after the episode resolved opens a
    new, ``late_catch_up`` episode: a client that ran on stale partitioning for longer than the
    window is the most interesting evidence, not noise.

State keys added to a partition state (created lazily, so states made by
``rules.new_partition`` and states from before this module work unchanged): ``observed_at``,
``interval_ms``, ``md_at``, ``md_confirmed_at``, ``leader_seen``, ``epoch_seen``, ``epoch_regressions``,
``leader_episode``, ``imbalanced_since``, ``hw_seen``, ``hw_changed_at``, ``hw_observed_at``,
``pending_writes_at``, ``pending_since``, ``due``, ``due_pw``.  ``due`` is the earliest time at
which ``tick_partition`` has anything to do; before it the tick is two dict reads.

Thresholds compare with ``>=``: a duration that reaches the threshold counts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from streaming.rules.base import Alert, Transition, _open, _resolve, alert_id, partition_labels


class PartitionRulesConfigError(ValueError):
    """An invalid ``PartitionRulesConfig``; the message names the setting."""


@dataclass(frozen=True)
class PartitionRulesConfig:
    """Thresholds of the partition and topic rules (milliseconds unless said otherwise)."""

    #: LeaderChanged resolves after this long without a further change.  5 min: an election and
    #: the clients' metadata refresh after it (metadata.max.age.ms defaults to 5 min) settle well
    #: within it, and a rolling restart's successive moves of one partition stay one episode.
    leader_quiet_ms: int = 300_000
    #: leader changes kept as evidence per LeaderChanged episode (the count is always exact).
    leader_history_max: int = 20
    #: consecutive observations with a lower leader epoch before they are believed (a re-created
    #: topic) rather than ignored as a stale view.
    epoch_reset_after: int = 3
    #: PreferredLeaderImbalance opens after the leader has not been the preferred replica this
    #: long.  5 min = Kafka's leader.imbalance.check.interval.seconds (300): an election briefly
    #: moves leadership, and auto.leader.rebalance.enable would have moved it back by then.
    imbalance_after_ms: int = 300_000
    #: HighWatermarkStalled: how long writes may be pending with a flat HW.  60 s = 2 x Kafka's
    #: replica.lag.time.max.ms (30 s): a stuck follower is dropped from the ISR after 30 s and the
    #: HW moves again; a HW still flat after twice that is not replication lag any more.
    hw_stall_ms: int = 60_000
    #: PartitionUnobserved window when the observing source's interval is unknown.  60 s = 3 x a
    #: 20 s interval: twice the probe's default interval (10 s) with room for a slow refresh.
    unobserved_after_ms: int = 60_000
    #: PartitionUnobserved window in observation intervals when the interval is known (3 =
    #: SourceSilent's convention: three missed rounds).
    unobserved_intervals: int = 3
    #: PartitionCountChanged stays open (collecting clients' catch-up times) this long.  15 min:
    #: longer than the slowest default refresh among Kafka clients (the old producer's
    #: topic.metadata.refresh.interval.ms = 10 min; metadata.max.age.ms = 5 min).
    count_change_window_ms: int = 900_000
    #: clients listed per PartitionCountChanged episode; further clients are only counted.
    count_change_clients_max: int = 50

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise PartitionRulesConfigError(f"partition_rules.{f.name}: must be an integer, got {v!r}")
            if v < 1:
                raise PartitionRulesConfigError(f"partition_rules.{f.name}: must be >= 1, got {v}")


DEFAULT_CONFIG = PartitionRulesConfig()

_UNDER, _AT = Alert.UNDER_MIN_ISR, Alert.AT_MIN_ISR
_LC, _PLI = Alert.LEADER_CHANGED, Alert.PREFERRED_LEADER_IMBALANCE
_HWS, _PU = Alert.HIGH_WATERMARK_STALLED, Alert.PARTITION_UNOBSERVED
_PCC = Alert.PARTITION_COUNT_CHANGED

_PARTITION_KEYS = {
    "observed_at": None, "interval_ms": None, "md_at": None, "leader_seen": None, "epoch_seen": None,
    "epoch_regressions": 0, "leader_episode": None, "imbalanced_since": None, "hw_seen": None,
    "hw_changed_at": None, "hw_observed_at": None, "pending_writes_at": None, "pending_since": None,
    "md_confirmed_at": None,  # a new key goes last: _ensure looks for the last one first
}
_LAST_KEY = next(reversed(_PARTITION_KEYS))


def _int(v: Any) -> Optional[int]:
    """None stays None; numpy / pandas integers become Python ints (JSON-able)."""
    return None if v is None else int(v)


def _ensure(state: dict) -> None:
    if _LAST_KEY not in state:  # keys are added together and never removed: the last one says all are there
        for k, v in _PARTITION_KEYS.items():
            if k not in state:
                state[k] = v
    if state["observed_at"] is None and state.get("last_seen") is not None:
        state["observed_at"] = int(state["last_seen"])  # a state from before this module


def _view_at(state: dict) -> Optional[int]:
    """When the partition's leader view was last known current: its last partition_metadata,
    or a later offsets observation whose ``metadata_at`` confirms the source's view was unchanged.
    None before the first partition_metadata."""
    md, confirmed = state["md_at"], state.get("md_confirmed_at")
    if md is None or confirmed is None:
        return md
    return max(md, confirmed)


def _is_open(state: dict, alert: Alert) -> bool:
    return alert.value in state["open"]


# ---------------------------------------------------------------------------------------------
# Partition: observation
# ---------------------------------------------------------------------------------------------


def unobserved_window_ms(state: dict, cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> int:
    interval = state.get("interval_ms")
    if interval:
        return cfg.unobserved_intervals * int(interval)
    return cfg.unobserved_after_ms


def on_partition_observed(state: dict, now: int, entity: str, cfg: PartitionRulesConfig = DEFAULT_CONFIG,
                          interval_ms: Optional[int] = None) -> list[Transition]:
    """The partition was reported at ``now``: resolve PartitionUnobserved.  ``interval_ms``: the
    observing source's interval, when the caller knows it (sets the unobserved window).  An
    observation older than the newest one seen changes nothing."""
    _ensure(state)
    if interval_ms and int(interval_ms) != state["interval_ms"]:
        state["interval_ms"] = int(interval_ms)
        _schedule(state, cfg)
    prev = state["observed_at"]
    if prev is not None and now <= prev:
        return []
    state["observed_at"] = now
    out: list[Transition] = []
    if _is_open(state, _PU):
        out = _resolve(state, _PU, entity, partition_labels(state), now,
                       {"observed_at": now, "last_observed_at": prev,
                        "unobserved_for_ms": None if prev is None else now - prev})
    _schedule(state, cfg)
    return out


def on_partition_metadata_extra(state: dict, obs: dict, now: int, entity: str,
                                cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one partition_metadata observation (``obs``: leader, leader_epoch, replicas, isr,
    min_insync_replicas) into ``state`` for UnderMinIsr / AtMinIsr, LeaderChanged and
    PreferredLeaderImbalance; also resolves PartitionUnobserved.  Order-independent with
    ``rules.on_partition_metadata`` (see the module docstring); call it right after."""
    out = on_partition_observed(state, now, entity, cfg)
    if state["md_at"] is not None and now < state["md_at"]:
        return out  # out of order: older than what the rules already reflect
    labels = partition_labels(state)
    leader = int(obs["leader"])
    epoch = _int(obs.get("leader_epoch"))
    replicas = [int(r) for r in obs["replicas"]]
    isr = [int(r) for r in obs["isr"]]

    # -- stale view of another client (lower leader epoch): ignore, unless it persists -------
    epoch_reset = False
    prev_epoch = state["epoch_seen"]
    if state["md_at"] is not None and epoch is not None and prev_epoch is not None and epoch < prev_epoch:
        state["epoch_regressions"] += 1
        if state["epoch_regressions"] < cfg.epoch_reset_after:
            return out
        epoch_reset = True
    state["epoch_regressions"] = 0

    # -- LeaderChanged ------------------------------------------------------------------------
    first = state["md_at"] is None
    prev_leader = state["leader_seen"]
    changed = not first and (leader != prev_leader or epoch_reset
                             or (epoch is not None and prev_epoch is not None and epoch != prev_epoch))
    if changed:
        out += _leader_change(state, now, entity, labels, cfg, prev_leader, leader, prev_epoch, epoch,
                              replicas, epoch_reset)
    state.update(leader_seen=leader, epoch_seen=epoch, md_at=now)

    # -- UnderMinIsr / AtMinIsr ---------------------------------------------------------------
    min_isr = _int(obs.get("min_insync_replicas"))
    if min_isr is None:
        min_isr = _int(state.get("min_isr"))
    if min_isr is not None and min_isr >= 1 and leader >= 0:
        out += _min_isr(state, now, entity, labels, isr, replicas, min_isr)

    # -- PreferredLeaderImbalance -------------------------------------------------------------
    imbalanced = leader >= 0 and bool(replicas) and leader != replicas[0]
    if not imbalanced:
        state["imbalanced_since"] = None
        if state["open"]:
            out += _resolve(state, _PLI, entity, labels, now,
                            {"leader": leader, "preferred_leader": replicas[0] if replicas else None,
                             "offline": leader < 0})
    else:
        if state["imbalanced_since"] is None:
            state["imbalanced_since"] = now
        out += _maybe_open_imbalance(state, now, entity, labels, cfg, leader, replicas)

    _schedule(state, cfg)
    return out


def _leader_change(state: dict, now: int, entity: str, labels: dict, cfg: PartitionRulesConfig,
                   old_leader: Optional[int], new_leader: int, old_epoch: Optional[int],
                   new_epoch: Optional[int], replicas: list[int], epoch_reset: bool) -> list[Transition]:
    out: list[Transition] = []
    ep = state["leader_episode"]
    if ep is not None and now - ep["last_change_at"] >= cfg.leader_quiet_ms:
        out += _resolve_leader_episode(state, now, entity, labels)  # no tick ran in between
        ep = None
    record = [now, old_leader, new_leader, old_epoch, new_epoch]
    if ep is None:
        state["leader_episode"] = {"changes": 1, "first_change_at": now, "last_change_at": now,
                                   "history": [record]}
        out += _open(state, _LC, entity, labels, now,
                     {"old_leader": old_leader, "new_leader": new_leader, "old_epoch": old_epoch,
                      "new_epoch": new_epoch, "changes": 1, "preferred_leader": replicas[0] if replicas else None,
                      "epoch_reset": epoch_reset})
    else:
        ep["changes"] += 1
        ep["last_change_at"] = now
        ep["history"].append(record)
        del ep["history"][:-cfg.leader_history_max]
    return out


def _resolve_leader_episode(state: dict, now: int, entity: str, labels: dict) -> list[Transition]:
    ep = state["leader_episode"]
    state["leader_episode"] = None
    history = [{"at": at, "old_leader": ol, "new_leader": nl, "old_epoch": oe, "new_epoch": ne}
               for at, ol, nl, oe, ne in ep["history"]]
    return _resolve(state, _LC, entity, labels, now,
                    {"changes": ep["changes"], "first_change_at": ep["first_change_at"],
                     "last_change_at": ep["last_change_at"], "quiet_for_ms": now - ep["last_change_at"],
                     "leader": state["leader_seen"], "leader_epoch": state["epoch_seen"],
                     "history": history, "history_truncated": ep["changes"] - len(history)})


def _min_isr(state: dict, now: int, entity: str, labels: dict, isr: list[int], replicas: list[int],
             min_isr: int) -> list[Transition]:
    n_isr, n_rep = len(set(isr)), len(set(replicas))
    if n_isr < min_isr:
        target: Optional[Alert] = _UNDER
    elif n_isr == min_isr and n_isr < n_rep:
        target = _AT
    else:
        target = None
    if target is None and not state["open"]:
        return []  # healthy, nothing open to resolve
    evidence = {"isr": isr, "isr_size": n_isr, "min_insync_replicas": min_isr, "replicas": replicas,
                "replication_factor": n_rep}
    out: list[Transition] = []
    now_is = {None: "healthy", _UNDER: "under_min_isr", _AT: "at_min_isr"}[target]
    for alert in (_UNDER, _AT):
        if alert is not target:
            out += _resolve(state, alert, entity, labels, now, {**evidence, "now": now_is})
    if target is not None:
        out += _open(state, target, entity, labels, now, evidence)
    return out


def _maybe_open_imbalance(state: dict, now: int, entity: str, labels: dict, cfg: PartitionRulesConfig,
                          leader: int, replicas: Optional[list[int]]) -> list[Transition]:
    since = state["imbalanced_since"]
    if since is None or _is_open(state, _PLI) or now - since < cfg.imbalance_after_ms:
        return []
    return _open(state, _PLI, entity, labels, now,
                 {"leader": leader, "preferred_leader": replicas[0] if replicas else None,
                  "replicas": replicas, "imbalanced_since": since, "imbalanced_for_ms": now - since,
                  "last_observed_at": state["md_at"]})


# ---------------------------------------------------------------------------------------------
# Partition: offsets and HighWatermarkStalled
# ---------------------------------------------------------------------------------------------


def note_pending_writes(state: dict, at: int) -> None:
    """Some client saw writes pending on this partition at ``at`` (epoch ms): an offset beyond
    the HW.  Nothing in the v1 contract calls this yet (see the module docstring)."""
    _ensure(state)
    at = int(at)
    if state["pending_writes_at"] is None or at > state["pending_writes_at"]:
        state["pending_writes_at"] = at
    _sync_pending(state)


def _sync_pending(state: dict) -> None:
    """pending_since = the first pending-writes time seen after the HW's last move."""
    pw, changed = state["pending_writes_at"], state["hw_changed_at"]
    if state["pending_since"] is None and pw is not None and changed is not None and pw > changed:
        state["pending_since"] = int(pw)


def _maybe_open_stall(state: dict, now: int, entity: str, cfg: PartitionRulesConfig) -> list[Transition]:
    since, seen = state["pending_since"], state["hw_observed_at"]
    if since is None or seen is None or _is_open(state, _HWS) or seen - since < cfg.hw_stall_ms:
        return []
    return _open(state, _HWS, entity, partition_labels(state), now,
                 {"high_watermark": state["hw_seen"], "hw_unchanged_since": state["hw_changed_at"],
                  "pending_writes_since": since, "pending_writes_last_seen_at": state["pending_writes_at"],
                  "last_hw_observation_at": seen, "stalled_for_at_least_ms": seen - since})


def on_partition_offsets_extra(state: dict, obs: dict, now: int, entity: str,
                               cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Fold one partition_offsets observation (``obs["high_watermark"]``) for
    HighWatermarkStalled; also resolves PartitionUnobserved.  Order-independent with
    ``rules.on_partition_offsets``; call it right after."""
    out = on_partition_observed(state, now, entity, cfg)
    if state["hw_observed_at"] is not None and now < state["hw_observed_at"]:
        return out  # out of order
    confirmed = _int(obs.get("metadata_at"))
    if confirmed is not None and (state["md_confirmed_at"] is None or confirmed > state["md_confirmed_at"]):
        state["md_confirmed_at"] = min(confirmed, now)
    hw = int(obs["high_watermark"])
    prev = state["hw_seen"]
    state["hw_observed_at"] = now
    if prev is None or hw != prev:
        state.update(hw_seen=hw, hw_changed_at=now, pending_since=None)
        if prev is not None:
            out += _resolve(state, _HWS, entity, partition_labels(state), now,
                            {"hw_before": prev, "hw_after": hw})
    _sync_pending(state)
    out += _maybe_open_stall(state, now, entity, cfg)
    _schedule(state, cfg)
    return out


# ---------------------------------------------------------------------------------------------
# Partition: time
# ---------------------------------------------------------------------------------------------


def _schedule(state: dict, cfg: PartitionRulesConfig) -> None:
    """state["due"] = the earliest time at which tick_partition has something to decide."""
    due: Optional[int] = None
    unobserved = _is_open(state, _PU)
    if not unobserved and state["observed_at"] is not None:
        due = state["observed_at"] + unobserved_window_ms(state, cfg)
    ep = state["leader_episode"]
    if ep is not None:
        t = ep["last_change_at"] + cfg.leader_quiet_ms
        due = t if due is None else min(due, t)
    if state["imbalanced_since"] is not None and not _is_open(state, _PLI):
        t = state["imbalanced_since"] + cfg.imbalance_after_ms
        view_at = _view_at(state)  # set: the imbalance was seen in a metadata observation
        if view_at is not None and t < view_at + unobserved_window_ms(state, cfg):  # else only a new observation can open it
            due = t if due is None else min(due, t)
    state["due"] = due
    state["due_pw"] = state["pending_writes_at"]


def tick_partition(state: dict, now: int, entity: str, cfg: PartitionRulesConfig = DEFAULT_CONFIG,
                   *, blind: bool = False) -> list[Transition]:
    """Time-driven checks for one partition state: PartitionUnobserved opens, LeaderChanged
    resolves after the quiet window, PreferredLeaderImbalance opens once it lasted long enough,
    a ``pending_writes_at`` written directly into the state is taken into account.  O(1); when
    nothing is due (``now < state["due"]`` and ``pending_writes_at`` unchanged) it returns at
    once without touching the state.  ``blind``: the job's sources are silent — do not open
    PartitionUnobserved (SourceSilent says it once)."""
    if "due" in state and state.get("pending_writes_at") == state["due_pw"]:
        due = state["due"]
        if due is None or now < due:
            return []
    _ensure(state)
    labels = partition_labels(state)
    out: list[Transition] = []
    last = state["observed_at"]
    window = unobserved_window_ms(state, cfg)
    if not blind and last is not None and not _is_open(state, _PU) and now - last >= window:
        out += _open(state, _PU, entity, labels, now,
                     {"last_observed_at": last, "unobserved_for_ms": now - last, "window_ms": window,
                      "interval_ms": state["interval_ms"]})
    ep = state["leader_episode"]
    if ep is not None and now - ep["last_change_at"] >= cfg.leader_quiet_ms:
        out += _resolve_leader_episode(state, now, entity, labels)
    view_at = _view_at(state)
    if view_at is not None and now - view_at < window:  # the leader view is current
        out += _maybe_open_imbalance(state, now, entity, labels, cfg, state["leader_seen"], state.get("replicas"))
    _sync_pending(state)
    out += _maybe_open_stall(state, now, entity, cfg)
    _schedule(state, cfg)
    return out


# ---------------------------------------------------------------------------------------------
# Topic entity: PartitionCountChanged
# ---------------------------------------------------------------------------------------------


def new_topic(cluster: str, topic: str) -> dict:
    return {"kind": "topic", "cluster": cluster, "topic": topic, "partition_count": None,
            "changed_after": None, "changed_by": None, "episode": None, "last_since": None,
            "last_seen": None, "open": {}}


def topic_labels(state: dict) -> dict[str, Any]:
    return {"cluster": state["cluster"], "topic": state["topic"]}


def on_partition_count_change(state: dict, change: dict, now: int, entity: str,
                              cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """One client (``change["source"]``) saw the topic's partition count change from
    ``old_count`` to ``new_count`` in a refresh at ``seen_at`` (default ``now``);
    ``unseen_for_at_most_ms`` bounds how long before that the change happened (may be None)."""
    old, new = int(change["old_count"]), int(change["new_count"])
    source = str(change.get("source"))
    seen_at = _int(change.get("seen_at"))
    seen_at = now if seen_at is None else seen_at
    unseen = _int(change.get("unseen_for_at_most_ms"))
    state["last_seen"] = now if state["last_seen"] is None else max(state["last_seen"], now)
    if old == new:
        return []
    labels = topic_labels(state)
    current = state["partition_count"]
    ep = state["episode"]
    out: list[Transition] = []

    if current is not None and new == current:
        if ep is not None:
            _add_client(ep, state, source, seen_at, old, unseen, cfg)
            return []
        # a client caught up after the episode closed: it ran stale for longer than the window
        return _open_count_episode(state, now, entity, labels, cfg, old, new, source, seen_at, old, unseen,
                                   late=True)

    is_new_change = current is None or new > current or old == current
    if not is_new_change:  # a late report of an earlier change: this client is still stale
        if ep is not None:
            ep["stale_reports"] += 1
        return []

    if ep is not None:
        out += _resolve_count_episode(state, now, entity, labels, {
            "reason": "superseded", "superseded_by": {"old_count": current, "new_count": new}})
    state.update(partition_count=new, changed_after=None, changed_by=None)
    out += _open_count_episode(state, now, entity, labels, cfg, current if current is not None else old,
                               new, source, seen_at, old, unseen, late=False)
    return out


def _bound(state: dict, seen_at: int, unseen: Optional[int]) -> None:
    """The change happened in (seen_at - unseen, seen_at] for every reporting client."""
    state["changed_by"] = seen_at if state["changed_by"] is None else min(state["changed_by"], seen_at)
    if unseen is not None:
        lo = seen_at - unseen
        state["changed_after"] = lo if state["changed_after"] is None else max(state["changed_after"], lo)


def _add_client(ep: dict, state: dict, source: str, seen_at: int, old: int, unseen: Optional[int],
                cfg: PartitionRulesConfig) -> None:
    if any(c[0] == source for c in ep["clients"]):
        return  # a replay, or a client reporting twice: its first catch-up is the one that counts
    _bound(state, seen_at, unseen)
    if len(ep["clients"]) < cfg.count_change_clients_max:
        ep["clients"].append([source, seen_at, old, unseen])
    else:
        ep["clients_not_listed"] += 1  # not de-duplicated: may count a replayed report twice


def _open_count_episode(state: dict, now: int, entity: str, labels: dict, cfg: PartitionRulesConfig,
                        old_count: int, new_count: int, source: str, seen_at: int, client_old: int,
                        unseen: Optional[int], late: bool) -> list[Transition]:
    state["episode"] = {"old_count": old_count, "new_count": new_count, "late_catch_up": late,
                        "clients": [], "clients_not_listed": 0, "stale_reports": 0}
    _add_client(state["episode"], state, source, seen_at, client_old, unseen, cfg)
    # ids are alert|entity|since: keep ``since`` strictly increasing per topic so two episodes
    # opened in the same millisecond (two changes in one batch) never share an id
    since = now if state["last_since"] is None or now > state["last_since"] else state["last_since"] + 1
    state["last_since"] = since
    evidence = {"old_count": old_count, "new_count": new_count, "first_seen_by": source,
                "first_seen_at": seen_at, "unseen_for_at_most_ms": unseen, "late_catch_up": late,
                "changed_by": state["changed_by"], "changed_after": state["changed_after"]}
    aid = alert_id(_PCC, entity, since)
    state["open"][_PCC.value] = {"id": aid, "since": since, "evidence": evidence}
    return [Transition(_PCC, "open", aid, now, entity, labels, evidence)]


def _bounds_consistent(state: dict) -> bool:
    """False when no instant fits every client's (seen_at - unseen, seen_at]: clients' clocks
    disagree, or a client refreshed from a broker whose metadata cache still had the old count
    after another client had seen the new one.  Then no "at most" is claimed."""
    by, after = state["changed_by"], state["changed_after"]
    return after is None or by is None or after < by


def _client_evidence(state: dict, c: list) -> dict:
    source, seen_at, old, unseen = c
    by, after = state["changed_by"], state["changed_after"]
    at_least = max(0, seen_at - by) if by is not None else None
    at_most = seen_at - after if after is not None and _bounds_consistent(state) else None
    return {"source": source, "seen_at": seen_at, "old_count": old, "unseen_for_at_most_ms": unseen,
            "stale_for_at_least_ms": at_least, "stale_for_at_most_ms": at_most}


def _resolve_count_episode(state: dict, now: int, entity: str, labels: dict, extra: dict) -> list[Transition]:
    ep = state["episode"]
    state["episode"] = None
    clients = [_client_evidence(state, c) for c in ep["clients"]]
    return _resolve(state, _PCC, entity, labels, now,
                    {"old_count": ep["old_count"], "new_count": ep["new_count"], "late_catch_up": ep["late_catch_up"],
                     "changed_after": state["changed_after"], "changed_by": state["changed_by"],
                     "bounds_consistent": _bounds_consistent(state), "clients": clients,
                     "clients_reported": len(clients) + ep["clients_not_listed"],
                     "clients_not_listed": ep["clients_not_listed"],
                     "stale_reports_of_earlier_changes": ep["stale_reports"], **extra})


def tick_topic(state: dict, now: int, entity: str, cfg: PartitionRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    """Resolve PartitionCountChanged ``count_change_window_ms`` after it opened.  O(1)."""
    if state.get("episode") is None:
        return []
    opened = state["open"].get(_PCC.value)
    if opened is None:  # resolved elsewhere (rules.evict): drop the episode
        state["episode"] = None
        return []
    if now - opened["since"] < cfg.count_change_window_ms:
        return []
    return _resolve_count_episode(state, now, entity, topic_labels(state),
                                  {"reason": "window elapsed", "window_ms": cfg.count_change_window_ms})
