"""Faults of the local cluster (``kafka_monitor.local.kafka_cluster.KafkaCluster``): per-broker
process faults by PID (stop, kill, pause, resume, start, restart), the same for a dedicated
controller (kill, pause, resume, start), and leadership and replication
changes (leader elections, reassignments, replication throttles).  ``ClusterFaultsMixin`` holds
them as ``KafkaCluster``'s methods.
"""

from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from kafka_monitor.local.broker import stop_process

if TYPE_CHECKING:
    from kafka_monitor.local.kafka_cluster import _Node

#: a node's exit codes that are no crash: a clean exit, SIGKILL, SIGTERM (as a signal or 128+15)
CLEAN_EXITS = (0, -9, -15, 143)


class ClusterFaultsMixin:
    """``KafkaCluster``'s faults (mixed into it; not used on its own)."""

    if TYPE_CHECKING:  # provided by KafkaCluster
        broker_ids: list
        controllers: dict
        _admin: Any
        _observer_admin: Any

        @property
        def _harness_bootstrap(self) -> str: ...

        def admin(self): ...

        def wait_ready(self, timeout: float = 120.0, brokers: Optional[Iterable[int]] = None) -> None: ...

        def partitions(self, topic: str, timeout: float = 2.0) -> dict: ...

        def run_tool(self, main_class: str, *args: str, heap: str = "128M", timeout: float = 60.0) -> str: ...

        def _command_config(self, controller: bool = False) -> list: ...

        def _require_managed(self, what: str) -> None: ...

        def _broker(self, broker_id: int) -> _Node: ...

        def _tools_dir(self) -> Path: ...

        def _launch(self, n: _Node) -> None: ...

        def _signal(self, n: _Node, sig: int) -> None: ...

        def _nodes(self) -> list[_Node]: ...

        def live_brokers(self, request_timeout: float = 2.0) -> set: ...

        def fencings(self, last: int = 5, pause_ms: float = 1000.0) -> list[str]: ...

        @staticmethod
        def _tail(path: Path, lines: int = 20) -> str: ...

        @staticmethod
        def _wait(cond, timeout: float, what: str): ...

    # -- per-broker faults (by PID)

    def stop_broker(self, broker_id: int, timeout: float = 60.0) -> None:
        """Controlled shutdown: SIGTERM and wait for exit (SIGKILL after ``timeout``)."""
        self._require_managed("stop_broker")
        n = self._broker(broker_id)
        if n.paused:
            self.resume_broker(broker_id)
        stop_process(n.proc, timeout)

    def kill_broker(self, broker_id: int) -> None:
        """SIGKILL (unclean shutdown)."""
        self._require_managed("kill_broker")
        self._kill(self._broker(broker_id))

    def pause_broker(self, broker_id: int) -> None:
        """SIGSTOP: the JVM freezes (no fetches, no heartbeats)."""
        self._require_managed("pause_broker")
        self._pause(self._broker(broker_id), True)

    def resume_broker(self, broker_id: int) -> None:
        """SIGCONT."""
        self._require_managed("resume_broker")
        self._pause(self._broker(broker_id), False)

    def start_broker(self, broker_id: int, timeout: float = 120.0, wait: bool = True) -> None:
        """Start a stopped broker again (same ports and log dir) and wait until it is registered
        (``wait=False``: launch only, then :meth:`wait_ready` for several at once)."""
        self._require_managed("start_broker")
        n = self._broker(broker_id)
        if not n.running():
            self._launch(n)
            # fresh admin clients: a client that knew the broker before it went away could still
            # be waiting on its old connection 30 s later (CI, after every broker was restarted)
            self._admin = self._observer_admin = None
        if wait:
            self.wait_ready(timeout, brokers=[broker_id])

    def restart_broker(self, broker_id: int, timeout: float = 120.0) -> None:
        """Stop the broker if it runs (controlled), start it again, wait until it is registered."""
        self._require_managed("restart_broker")
        if self._broker(broker_id).running():
            self.stop_broker(broker_id)
        self.start_broker(broker_id, timeout)

    def restore(self, timeout: float = 120.0) -> list[str]:
        """Undo whatever process faults are left: resume paused nodes, start stopped or dead
        ones, wait until every broker is registered.  Returns what it found (empty when the
        cluster was whole), a line per node: for a shared cluster, a test's leftovers are named
        rather than failing the next test."""
        self._require_managed("restore")
        found = []
        for n in self._nodes():
            if n.paused and n.running():
                found.append(f"{n.name} was paused")
                self._pause(n, False)
            if n.proc is not None and not n.running():
                code = n.proc.returncode
                found.append(f"{n.name} was not running (exit {code})"
                             + ("" if code in CLEAN_EXITS else f": {self._tail(n.dir / 'server.log', 5)}"))
                self._launch(n)
                self._admin = self._observer_admin = None
        try:
            registered = self.live_brokers(request_timeout=5.0)
        except Exception as e:  # noqa: BLE001 - said, then waited for below
            registered, found = set(), found + [f"DescribeCluster failed: {e}"]
        missing = set(self.broker_ids) - registered
        if missing:
            found.append(f"brokers {sorted(missing)} were not registered; {self.fencings()}")
            self.wait_ready(timeout, brokers=self.broker_ids)
        return found

    # -- per-controller faults (by PID)

    def _controller_node(self, controller_id: int) -> _Node:
        try:
            return self.controllers[controller_id]
        except KeyError:
            raise KeyError(f"no controller {controller_id} (controllers: {sorted(self.controllers)})") from None

    def kill_controller(self, controller_id: int) -> None:
        """SIGKILL a dedicated controller (with three, the others elect a leader among them)."""
        self._require_managed("kill_controller")
        self._kill(self._controller_node(controller_id))

    def pause_controller(self, controller_id: int) -> None:
        """SIGSTOP a controller: no fetches, no votes, no heartbeats answered."""
        self._require_managed("pause_controller")
        self._pause(self._controller_node(controller_id), True)

    def resume_controller(self, controller_id: int) -> None:
        """SIGCONT."""
        self._require_managed("resume_controller")
        self._pause(self._controller_node(controller_id), False)

    # -- a node's process

    @staticmethod
    def _kill(n: _Node) -> None:
        if n.running():
            n.process.kill()
            n.process.wait()
        n.paused = False

    def _pause(self, n: _Node, paused: bool) -> None:
        self._signal(n, signal.SIGSTOP if paused else signal.SIGCONT)
        n.paused = paused

    def start_controller(self, controller_id: int) -> None:
        """Start a stopped controller again (same port and metadata log); it rejoins the quorum
        as a follower (poll ``quorum_status`` for it to catch up)."""
        self._require_managed("start_controller")
        n = self._controller_node(controller_id)
        if not n.running():
            self._launch(n)

    # -- leadership and replication

    def elect_leaders(self, kind: str = "preferred", partitions: Optional[Iterable[tuple]] = None,
                      timeout: float = 30.0) -> dict:
        """ElectLeaders (``'preferred'`` or ``'unclean'``) for ``[(topic, partition), ...]`` (None = all).

        Returns ``{(topic, partition): KafkaError or None}``; ELECTION_NOT_NEEDED counts as success.
        Leaders move asynchronously: poll metadata for the outcome."""
        from confluent_kafka import ElectionType, KafkaError, TopicPartition
        et = {"preferred": ElectionType.PREFERRED, "unclean": ElectionType.UNCLEAN}[kind]
        tps = None if partitions is None else [TopicPartition(t, p) for t, p in partitions]
        # no kwargs: confluent-kafka 2.16.1 raises SystemError for request/operation_timeout here
        res = self.admin().elect_leaders(et, tps).result(timeout)
        out = {}
        for tp, exc in res.items():
            err = exc.args[0] if isinstance(exc, Exception) and exc.args else exc  # KafkaError or KafkaException
            if err is not None and getattr(err, "code", lambda: None)() == KafkaError.ELECTION_NOT_NEEDED:
                err = None
            out[(tp.topic, tp.partition)] = err
        return out

    def reassign(self, topic: str, partition: int, replicas: Sequence[int], wait: bool = True,
                 timeout: float = 60.0) -> None:
        """AlterPartitionReassignments (Kafka's ReassignPartitionsCommand; confluent-kafka lacks it).

        With ``wait``, poll metadata until the replica list equals ``replicas``."""
        plan = {"version": 1, "partitions": [{"topic": topic, "partition": partition, "replicas": list(replicas)}]}
        f = Path(tempfile.mkstemp(prefix="reassign-", suffix=".json", dir=self._tools_dir())[1])
        f.write_text(json.dumps(plan))
        self.run_tool("org.apache.kafka.tools.reassign.ReassignPartitionsCommand", "--bootstrap-server",
                      self._harness_bootstrap, "--reassignment-json-file", str(f), "--execute", *self._command_config())
        if wait:
            want = list(replicas)

            def done():
                try:
                    _, reps, isr = self.partitions(topic, timeout=3)[partition]
                    return reps == want and set(want) <= set(isr)
                except Exception:
                    return False
            self._wait(done, timeout, f"reassignment of {topic}-{partition} to {want}")

    def throttle(self, rate_bytes: int, brokers: Optional[Iterable[int]] = None, topic: Optional[str] = None,
                 replicas: str = "*", timeout: float = 30.0) -> None:
        """Replication throttling: ``leader/follower.replication.throttled.rate`` on the brokers and,
        with ``topic``, ``leader/follower.replication.throttled.replicas`` (``"*"`` or ``"p:b,..."``).
        Only replicas outside the ISR are throttled (Kafka's rule)."""
        self._throttle_configs(brokers, topic, str(int(rate_bytes)), replicas, timeout)

    def clear_throttle(self, brokers: Optional[Iterable[int]] = None, topic: Optional[str] = None,
                       timeout: float = 30.0) -> None:
        self._throttle_configs(brokers, topic, None, None, timeout)

    def _throttle_configs(self, brokers, topic, rate, replicas, timeout) -> None:
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        def entries(names, value):
            op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
            return [ConfigEntry(n, value, incremental_operation=op) for n in names]
        res = [ConfigResource(ResourceType.BROKER, str(b), incremental_configs=entries(
            ["leader.replication.throttled.rate", "follower.replication.throttled.rate"], rate))
            for b in (self.broker_ids if brokers is None else brokers)]
        if topic:
            res.append(ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries(
                ["leader.replication.throttled.replicas", "follower.replication.throttled.replicas"], replicas)))
        for r in res:  # one BROKER resource per request (librdkafka rule)
            for fut in self.admin().incremental_alter_configs([r], request_timeout=timeout).values():
                fut.result(timeout)
