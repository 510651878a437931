"""The KRaft controller quorum of a cluster (entity ``quorum|<cluster>``), from ``quorum_state``
events (DescribeQuorum, asked by the unshared probe or share 1 of n every
``probe.quorum_interval_s``; monitor/quorum.py).  Every alert is the cluster's (label
``cluster``); the evidence names the nodes.

- **QuorumUnavailable (critical)**: for ``unavailable_after_ms`` the quorum answered with no
  leader, or with fewer than a majority of its voters caught up (the leader counts; a voter is
  caught up when it was within ``voter_lag_ms``), or the brokers answered DescribeQuorum with an
  error (not a permission or version refusal, not silence: those are the monitor's own
  blindness).  The cluster's metadata cannot change: no leader elections, no new topics, no
  fenced broker let back in.  Resolves at the first answer with a leader and a majority.
- **QuorumVoterLagging (warning)**: a voter other than the leader has not been caught up for
  more than ``voter_lag_ms`` (a controller stopped, paused or too slow): one more loss and there
  may be no majority.  A voter a new leader has not heard from in its term (the one that was
  lost: the new leader knows no time or offset of it) counts once the term is ``voter_lag_ms``
  old.  Resolves when every voter is caught up.
- **QuorumLeaderFlapping (warning)**: the leader changed ``flap_changes`` times or more within
  ``flap_window_ms`` (a new leader epoch each time).  Resolves when fewer remain in the window.
- **BrokerMetadataLagging (warning)**: a broker (an observer of the quorum) has not been caught
  up with the metadata log for more than ``observer_lag_ms``: it serves metadata older than the
  cluster's, and clients that ask it work from a stale view.  The leader drops an observer that
  stops fetching (a stopped broker is BrokerDown, not this).  Resolves when every broker is caught up.

An answer's times are the leader's clock read against the probe's (``*_ms_ago``).  ``no_answer``,
``permission`` and ``unsupported`` answers change nothing here (the probe logs them; ``quorum_up``
is 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from streaming.rules.base import Alert, Transition, _open, _resolve
from streaming.rules.group import check_settings

#: the answers that are the monitor's blindness, not the quorum's state
BLIND = ("no_answer", "permission", "unsupported")


@dataclass(frozen=True)
class QuorumRulesConfig:
    """``[job.rules.quorum]``."""

    #: QuorumUnavailable after no leader, no caught-up majority or error answers for this long
    #: (10 s: longer than an election, ~1-3 s at Kafka's defaults)
    unavailable_after_ms: int = 10_000
    #: a voter is caught up when it last was within this; QuorumVoterLagging past it
    voter_lag_ms: int = 15_000
    #: BrokerMetadataLagging when a broker was last caught up longer ago than this
    observer_lag_ms: int = 30_000
    #: QuorumLeaderFlapping at this many leader changes within flap_window_ms
    flap_changes: int = 3
    flap_window_ms: int = 600_000

    def __post_init__(self) -> None:
        check_settings(self, ("unavailable_after_ms", "voter_lag_ms", "observer_lag_ms", "flap_changes",
                              "flap_window_ms"))


DEFAULT_CONFIG = QuorumRulesConfig()


def new_quorum(cluster: str) -> dict:
    return {"cluster": cluster, "last_seen": None, "open": {}, "observed_at": None, "report": None,
            "epoch": None, "leader": None, "changes": [], "unavailable_since": None, "up": None,
            "term_since": None}


def quorum_labels(state: dict) -> dict:
    return {"cluster": state["cluster"]}


def _report(ev: dict[str, Any]) -> dict:
    try:
        rep = json.loads(ev.get("report") or "{}")
    except ValueError:
        return {}
    return rep if isinstance(rep, dict) else {}


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def caught_up(r: dict, within_ms: int, term_ms: int) -> bool:
    """Caught up within ``within_ms``.  A node the leader has not heard from in its term (a new
    leader knows nothing of a voter that is gone: no time, no offset) counts as caught up for
    the first ``within_ms`` of the term (``term_ms``: how long the leader has led, as seen), then
    not, unless it shows no lag."""
    ago = _int(r.get("last_caught_up_ms_ago"))
    if ago is not None:
        return ago <= within_ms
    return _int(r.get("lag")) == 0 or term_ms <= within_ms


def _behind(replicas: list, within_ms: int, term_ms: int, skip: Optional[int] = None) -> list[dict]:
    return [{"node": r["replica_id"], "lag": _int(r.get("lag")), "last_caught_up_ms_ago": _int(r.get("last_caught_up_ms_ago")),
             "last_fetch_ms_ago": _int(r.get("last_fetch_ms_ago"))}
            for r in replicas if r.get("replica_id") != skip and not caught_up(r, within_ms, term_ms)]


def on_quorum_state(state: dict, ev: dict[str, Any], now: int, entity: str,
                    cfg: QuorumRulesConfig = DEFAULT_CONFIG) -> list[Transition]:
    if state["observed_at"] is not None and now < state["observed_at"]:
        return []  # older than what the entity shows
    state["observed_at"] = now
    rep = _report(ev)
    state["up"] = bool(rep.get("ok"))
    if rep.get("ok"):
        state["report"] = ev.get("report")  # the gauges keep the last answer while there is none
    labels = quorum_labels(state)
    out: list[Transition] = []
    if not rep.get("ok"):
        if rep.get("error_kind") in BLIND:
            return out
        return out + _unavailable(state, entity, labels, now, cfg,
                                  {"reason": "error", "error": rep.get("error"), "error_kind": rep.get("error_kind")})
    leader = _int(rep.get("leader_id"))
    voters = [r for r in rep.get("voters") or [] if isinstance(r, dict)]
    observers = [r for r in rep.get("observers") or [] if isinstance(r, dict)]
    epoch = _int(rep.get("leader_epoch"))

    # leadership changes (a new epoch), for flapping
    if epoch is not None and state["epoch"] is not None and epoch > state["epoch"]:
        state["changes"].append([now, leader, epoch])
    if epoch is not None and (state["epoch"] is None or epoch > state["epoch"]):
        state["epoch"] = epoch
        state["term_since"] = now  # the first answer of this leader's term
    term_ms = now - (state.get("term_since") or now)
    state["leader"] = leader
    state["changes"] = [c for c in state["changes"] if now - c[0] <= cfg.flap_window_ms][-(2 * cfg.flap_changes):]
    if len(state["changes"]) >= cfg.flap_changes:
        out += _open(state, Alert.QUORUM_LEADER_FLAPPING, entity, labels, now,
                     {"changes": len(state["changes"]), "window_ms": cfg.flap_window_ms,
                      "leaders": [[c[0], c[1], c[2]] for c in state["changes"]]})
    else:
        out += _resolve(state, Alert.QUORUM_LEADER_FLAPPING, entity, labels, now,
                        {"changes": len(state["changes"]), "window_ms": cfg.flap_window_ms})

    # the leader and a caught-up majority
    majority = len(voters) // 2 + 1
    up = [r["replica_id"] for r in voters if r.get("replica_id") == leader or caught_up(r, cfg.voter_lag_ms, term_ms)]
    if leader is None or leader < 0:
        out += _unavailable(state, entity, labels, now, cfg, {"reason": "no leader", "voters": len(voters)})
    elif voters and len(up) < majority:
        out += _unavailable(state, entity, labels, now, cfg,
                            {"reason": "no caught-up majority", "caught_up": up, "voters": len(voters),
                             "majority": majority, "behind": _behind(voters, cfg.voter_lag_ms, term_ms, leader)})
    else:
        state["unavailable_since"] = None
        out += _resolve(state, Alert.QUORUM_UNAVAILABLE, entity, labels, now,
                        {"leader": leader, "epoch": epoch, "caught_up": up, "voters": len(voters)})

    behind = _behind(voters, cfg.voter_lag_ms, term_ms, leader) if leader is not None and leader >= 0 else []
    if behind:
        out += _open(state, Alert.QUORUM_VOTER_LAGGING, entity, labels, now,
                     {"behind": behind, "threshold_ms": cfg.voter_lag_ms, "leader": leader, "voters": len(voters)})
    elif leader is not None and leader >= 0:
        out += _resolve(state, Alert.QUORUM_VOTER_LAGGING, entity, labels, now, {"leader": leader})

    stale = _behind(observers, cfg.observer_lag_ms, term_ms)
    if stale:
        out += _open(state, Alert.BROKER_METADATA_LAGGING, entity, labels, now,
                     {"brokers": stale, "threshold_ms": cfg.observer_lag_ms, "high_watermark": rep.get("high_watermark")})
    else:
        out += _resolve(state, Alert.BROKER_METADATA_LAGGING, entity, labels, now, {"brokers": len(observers)})
    return out


def _unavailable(state: dict, entity: str, labels: dict, now: int, cfg: QuorumRulesConfig,
                 evidence: dict) -> list[Transition]:
    if state["unavailable_since"] is None:
        state["unavailable_since"] = now
    since = state["unavailable_since"]
    if now - since < cfg.unavailable_after_ms:
        return []
    return _open(state, Alert.QUORUM_UNAVAILABLE, entity, labels, now,
                 {**evidence, "since": since, "threshold_ms": cfg.unavailable_after_ms})
