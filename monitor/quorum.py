"""The KRaft controller quorum as the probe asks it: DescribeQuorum on the ``__cluster_metadata``
log (the leader, its epoch and high watermark, and per voter and observer its log end offset and
when it last fetched and last caught up).

librdkafka has no DescribeQuorum; the pure-Python ``kafka-python`` 3.x has it
(``KafkaAdminClient.describe_metadata_quorum``).  ``QuorumWatcher`` asks on a thread of its own,
every ``interval_s``: a call that hangs or fails costs that thread, never the probe's cycle, which
emits the newest answer once (``take``).  An answer that does not come is itself reported
(``error_kind="no_answer"``), once per interval, so the job can tell the monitor's blindness from
the quorum's health.  A cluster without DescribeQuorum (ZooKeeper, Kafka before 3.3, a one-node
broker such as Tansu) is said once in the log and sends nothing: there is no quorum to report.

The probe's librdkafka settings (``-X``) are translated once (``kafka_python_conf``); a security
setting without a kafka-python equivalent is refused at start, naming it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, TypeVar

from monitor.contract import NO_LEADER, QuorumReplica, QuorumState

log = logging.getLogger(__name__)

#: librdkafka property -> kafka-python KafkaAdminClient argument (value as given, or converted)
_SIMPLE = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
}
#: librdkafka properties that tune librdkafka itself and do not change what these requests may
#: reach or how they authenticate: ignored here
_NOT_SECURITY_PREFIXES = ("socket.", "reconnect.", "statistics.", "topic.metadata.", "metadata.", "api.version",
                          "broker.version", "log", "debug", "enable.sparse", "queue.", "retry.", "retries",
                          "message.", "receive.message", "fetch.", "allow.auto.create", "connections.max.idle")
_SECURITY_PREFIXES = ("security.", "sasl.", "ssl.", "ssl_", "enable.ssl.")


class QuorumConfigError(ValueError):
    """A ``-X`` setting that the quorum's client cannot honour."""


def kafka_python_conf(conf: dict[str, Any], purpose: str = "DescribeQuorum and DescribeTopicPartitions",
                      off: str = "--quorum-interval 0 and --elr-interval 0") -> dict[str, Any]:
    """The probe's librdkafka properties as ``KafkaAdminClient`` arguments.  Security settings
    without an equivalent raise ``QuorumConfigError`` naming them (the requests would otherwise
    go out with less than the operator asked for); tuning settings are left out."""
    out: dict[str, Any] = {}
    refused = []
    for key, value in conf.items():
        if key in _SIMPLE:
            v = str(value)
            if key == "security.protocol":
                v = v.upper()
            out[_SIMPLE[key]] = v
        elif key == "ssl.endpoint.identification.algorithm":
            if str(value).lower() not in ("https", "none", ""):
                refused.append(f"{key}={value}")
            out["ssl_check_hostname"] = str(value).lower() == "https"
        elif key == "enable.ssl.certificate.verification":
            if str(value).lower() in ("false", "0"):
                refused.append(key)  # kafka-python always verifies with ssl_cafile
        elif key.startswith(_SECURITY_PREFIXES):
            refused.append(key)
        elif not key.startswith(_NOT_SECURITY_PREFIXES):
            log.debug("quorum client: librdkafka setting %s has no kafka-python equivalent; not applied", key)
    if refused:
        raise QuorumConfigError(
            f"the client for {purpose} (kafka-python) has no equivalent of the setting(s) "
            f"{', '.join(sorted(refused))}; remove them or turn it off ({off})")
    if out.get("sasl_mechanism") and out["sasl_mechanism"].upper() not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise QuorumConfigError(f"sasl.mechanism {out['sasl_mechanism']}: the client for {purpose} (kafka-python) "
                                f"supports PLAIN and SCRAM here; turn it off ({off})")
    return out


def admin_kwargs(kp_conf: dict[str, Any], timeout_s: float, client_id: str) -> dict[str, Any]:
    """kafka-python's KafkaAdminClient arguments; one it does not know is a QuorumConfigError (at start)."""
    from kafka import KafkaAdminClient

    ms = int(timeout_s * 1000)
    kw = {**kp_conf, "client_id": kp_conf.get("client_id", client_id),
          "request_timeout_ms": ms, "bootstrap_timeout_ms": ms, "reconnect_backoff_max_ms": 1000,
          "connections_max_idle_ms": max(60_000, 3 * ms)}
    unknown = sorted(set(kw) - set(KafkaAdminClient.DEFAULT_CONFIG))
    if unknown:
        import kafka

        raise QuorumConfigError(f"kafka-python {getattr(kafka, '__version__', '?')} has no setting(s) "
                                f"{', '.join(unknown)}")
    return kw


def kafka_python_admin(kp_conf: dict[str, Any], timeout_s: float, client_id: str) -> Any:
    """A kafka-python ``KafkaAdminClient`` with ``admin_kwargs``, its reconnect chatter silenced
    (its errors come back to the caller)."""
    from kafka import KafkaAdminClient

    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    made: list[Any] = []

    def client(**kw: Any) -> Any:
        made.append(KafkaAdminClient.DEFAULT_CONFIG["kafka_client"](**kw))
        return made[-1]
    try:
        return KafkaAdminClient(**admin_kwargs(kp_conf, timeout_s, client_id), kafka_client=client)
    except BaseException:
        # kafka-python 3.0 leaves a client that failed to bootstrap running: its IO thread, still
        # connecting, one more for every watcher's retry (seen: a thread per failed attempt)
        for c in made:
            close_quietly(c)
            try:
                c._manager._net.stop()
            except Exception:  # noqa: BLE001, S110 - stopping what is already broken
                pass
        raise


def close_quietly(admin: Any) -> None:
    """Close a kafka-python client that may be broken (None: nothing to close)."""
    if admin is not None:
        try:
            admin.close()
        except Exception:  # noqa: BLE001 - closing a broken client
            pass


def error_kind(e: BaseException) -> str:
    """permission, unsupported, no_answer or error (``QuorumState.error_kind``)."""
    from kafka import errors as E

    def of(*names: str) -> tuple:
        return tuple(getattr(E, n) for n in names if hasattr(E, n))
    if isinstance(e, of("ClusterAuthorizationFailedError", "AuthorizationError")):
        return "permission"
    if isinstance(e, of("UnsupportedVersionError", "IncompatibleBrokerVersion")) or "not support" in str(e).lower():
        return "unsupported"
    if isinstance(e, of("KafkaTimeoutError", "NoBrokersAvailable", "NodeNotReadyError", "KafkaConnectionError",
                        "RequestTimedOutError", "BrokerNotAvailableError") + (TimeoutError, OSError)):
        return "no_answer"
    return "error"


def _not_negative(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and v >= 0 else None


def quorum_state(resp: dict, now_ms: int, interval_ms: int) -> QuorumState:
    """A DescribeQuorum answer (kafka-python's dict) as a ``QuorumState``."""
    part = resp["topics"][0]["partitions"][0]
    if part.get("error"):
        return QuorumState(ok=False, interval_ms=interval_ms, error=str(part["error"])[:1024], error_kind="error")
    leader = part.get("leader_id")
    voters, observers = part.get("current_voters") or [], part.get("observers") or []
    leader_leo = next((v.get("log_end_offset") for v in voters if v.get("replica_id") == leader), None)

    def ago(ts: Any) -> Optional[int]:
        return max(0, now_ms - ts) if isinstance(ts, int) and ts >= 0 else None

    def replica(r: dict) -> QuorumReplica:
        leo = r.get("log_end_offset")
        leo = leo if isinstance(leo, int) and leo >= 0 else None
        lag = max(0, leader_leo - leo) if leo is not None and isinstance(leader_leo, int) and leader_leo >= 0 else None
        return QuorumReplica(replica_id=int(r["replica_id"]), log_end_offset=leo, lag=lag,
                             last_fetch_ms_ago=ago(r.get("last_fetch_timestamp")),
                             last_caught_up_ms_ago=ago(r.get("last_caught_up_timestamp")))
    return QuorumState(ok=True, interval_ms=interval_ms,
                       leader_id=leader if isinstance(leader, int) and leader >= 0 else NO_LEADER,
                       leader_epoch=_not_negative(part.get("leader_epoch")),
                       high_watermark=_not_negative(part.get("high_watermark")),  # -1 in an election: null (contract)
                       voters=sorted(map(replica, voters), key=lambda r: r.replica_id),
                       observers=sorted(map(replica, observers), key=lambda r: r.replica_id))


_W = TypeVar("_W", bound="WatcherThread")


class WatcherThread:
    """The thread of a kafka-python watcher (quorum, ELR, log dirs, transactions): ``start()``
    runs ``_run`` on a daemon thread named ``thread_name``; ``stop()`` sets ``_stop``, waits for
    the thread and closes the client (``_admin``).  ``_every_interval`` and ``_take_latest`` are
    the loop and the hand-over of the watchers that answer once a round."""

    thread_name = "watcher"
    interval_s: float
    _thread: Optional[threading.Thread]
    _stop: threading.Event
    _admin: Any
    _lock: threading.Lock
    _latest: Any

    def _run(self) -> None:
        raise NotImplementedError

    def _every_interval(self, one_round: Callable[[], Any]) -> None:
        """``one_round()`` every ``interval_s`` (from one round's start to the next) until stopped,
        or until the cluster said it has no such request (``available`` False)."""
        while not self._stop.is_set() and getattr(self, "available", None) is not False:
            started = time.monotonic()
            one_round()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def _take_latest(self) -> Any:
        """The newest answer not handed over yet (``_latest``), once."""
        with self._lock:
            latest, self._latest = self._latest, None
        return latest

    def start(self: _W) -> _W:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._close_admin()

    def run_while(self, on: bool) -> None:
        """Run while ``on`` (an HA group's probe: while it holds the cluster shard), from the
        probe's loop: started when off, told to stop when on (not waited for: its round ends on
        its own, its answer is dropped).  A thread still ending is started again at a later call."""
        alive = self._thread is not None and self._thread.is_alive()
        if on and not alive:
            self._stop.clear()
            self.start()
        elif not on and alive and not self._stop.is_set():
            self._stop.set()
            with self._lock:
                self._latest = None
        elif not on and not alive and self._admin is not None:
            self._close_admin()

    def _close_admin(self) -> None:
        """Drop the client (a new one is made for the next request) and close it."""
        admin, self._admin = self._admin, None
        close_quietly(admin)


class QuorumWatcher(WatcherThread):
    """DescribeQuorum every ``interval_s`` on a thread; ``take()`` hands the newest answer over once.

    ``admin_factory()`` makes the client (default: kafka-python's ``KafkaAdminClient`` from
    ``conf``, the probe's librdkafka settings); tests pass a fake with
    ``describe_metadata_quorum()``."""

    thread_name = "quorum"

    def __init__(self, conf: dict[str, Any], interval_s: float, timeout_s: float,
                 clock: Callable[[], float] = time.time, admin_factory: Optional[Callable[[], Any]] = None):
        self.interval_s, self.timeout_s, self._clock = interval_s, timeout_s, clock
        self._kp_conf = kafka_python_conf(conf)  # raises on a setting it cannot honour: at start
        if admin_factory is None:
            self._admin_kwargs()  # a setting kafka-python does not take: refused now, not at every request
        self._factory = admin_factory or self._kafka_python_admin
        self._admin: Any = None
        self._lock = threading.Lock()
        self._latest: Optional[tuple[int, QuorumState]] = None
        self._taken_at: Optional[int] = None
        self._answered_at: Optional[float] = None  # monotonic
        self._silence_reported_at: Optional[float] = None
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: the newest leader seen, and when (epoch ms): the probe's controller_id while fresh
        self.leader: Optional[int] = None
        self.leader_at: Optional[int] = None
        self.unsupported_said = self.permission_said = False

    def _admin_kwargs(self) -> dict[str, Any]:
        return admin_kwargs(self._kp_conf, self.timeout_s, "kafka-monitor-quorum")

    def _kafka_python_admin(self) -> Any:
        return kafka_python_admin(self._kp_conf, self.timeout_s, "kafka-monitor-quorum")

    def ask(self) -> tuple[int, QuorumState]:
        """One DescribeQuorum (a new client after a failure); the state, stamped with the time asked."""
        now = int(self._clock() * 1000)
        interval_ms = int(self.interval_s * 1000)
        try:
            if self._admin is None:
                self._admin = self._factory()
            state = quorum_state(self._admin.describe_metadata_quorum(), now, interval_ms)
        except Exception as e:  # noqa: BLE001 - every failure is reported as a state
            self._close_admin()
            kind = error_kind(e)
            if kind == "unsupported" and not self.unsupported_said:
                self.unsupported_said = True
                log.warning("the cluster does not answer DescribeQuorum (%s): no controller quorum to report "
                            "(a ZooKeeper cluster or Kafka before 3.3: --quorum-interval 0 turns it off)", e)
            if kind == "permission" and not self.permission_said:
                self.permission_said = True
                log.info("DescribeQuorum refused: the probe's user has no DESCRIBE on the Cluster resource; no "
                         "controller quorum to report until it has (docs/security.md)")
            state = QuorumState(ok=False, interval_ms=interval_ms, error=f"{type(e).__name__}: {e}"[:1024],
                                error_kind=kind)
        return now, state

    def _run(self) -> None:
        self._every_interval(self._round)

    def _round(self) -> None:
        at, state = self.ask()
        with self._lock:
            self._latest = (at, state)
            self._answered_at = time.monotonic()
            if state.ok:
                self.leader = state.leader_id if state.leader_id != NO_LEADER else None
                self.leader_at = at

    def take(self) -> Optional[tuple[int, QuorumState]]:
        """The newest answer not handed over yet; or, when the thread has not answered for
        ``interval_s + timeout_s`` (a call hanging), a ``no_answer`` state, once per interval."""
        with self._lock:
            if self._latest is not None and self._latest[0] != self._taken_at:
                self._taken_at = self._latest[0]
                if self._latest[1].error_kind == "unsupported":
                    return None  # said once in the log; no quorum to report (Tansu, ZooKeeper, before 3.3)
                return self._latest
            mono = time.monotonic()
            last = self._answered_at if self._answered_at is not None else self._started
            overdue = mono - last > self.interval_s + self.timeout_s
            if overdue and (self._silence_reported_at is None or mono - self._silence_reported_at >= self.interval_s):
                self._silence_reported_at = mono
                return int(self._clock() * 1000), QuorumState(
                    ok=False, interval_ms=int(self.interval_s * 1000), error_kind="no_answer",
                    error=f"DescribeQuorum unanswered for {mono - last:.0f} s")
            return None

    def controller_id(self, now_ms: int) -> Optional[int]:
        """The active controller, when an answer within two intervals named one."""
        with self._lock:
            if self.leader_at is None or now_ms - self.leader_at > 2 * self.interval_s * 1000 + self.timeout_s * 1000:
                return None
            return self.leader
