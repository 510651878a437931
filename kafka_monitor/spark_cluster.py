"""A Spark standalone cluster on loopback (a master and N workers, each its own JVM), and the jars
of Spark's own Kafka source, for tests, benchmarks and anyone trying the job on a cluster.

The pip-installed pyspark is a full Spark home (``bin/spark-class``, ``bin/spark-submit``,
``jars/``).  Every process is started by us in its own process group, asked to die with its
parent, and stopped by PID; each writes its log into the cluster's directory.  Executors are
the worker JVMs' children (``CoarseGrainedExecutorBackend``), found through /proc.

Spark's Kafka source (``org.apache.spark:spark-sql-kafka-0-10_2.13``) is fetched with the
ordinary Maven client, runtime scope only, into ``~/.cache/kafka-monitor/spark-kafka-<version>``
(or ``$KAFKA_MONITOR_SPARK_KAFKA_HOME``).  Only the jars pyspark does not ship are kept (the
connector, its token provider, kafka-clients, commons-pool2): the others (Scala, Hadoop client,
spark-tags) would put a second version of a class on the classpath.  Maven Central has no
connector for every Spark release (4.3.0 was missing on 2026-11-29): pyspark's own version is
tried first, then ``SPARK_KAFKA_FALLBACK``, which tests/integration/test_spark_kafka_source.py
runs against the installed Spark.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO, Optional

from kafka_monitor.local.broker import free_port, popen_dying_with_parent, stop_process
from kafka_monitor.local.kafka_install import _DEPENDENCY_PLUGIN, KafkaSetupError, java_bin

SCALA_VERSION = "2.13"
#: the connector used when Maven Central has none for the installed Spark
SPARK_KAFKA_FALLBACK = "4.2.0"
#: artifacts of the connector's runtime closure that pyspark does not ship
_KEEP = ("spark-sql-kafka-0-10_", "spark-token-provider-kafka-0-10_", "kafka-clients-", "commons-pool2-")
_DAEMON_MEMORY = "256m"  # master and worker JVMs only place executors; executors get --memory


def spark_home() -> Path:
    """The installed pyspark's directory: a Spark home with bin/ and jars/."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


# ---------------------------------------------------------------- Spark's Kafka source jars

_POM = """<project>
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.kafka-monitor</groupId><artifactId>spark-kafka-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_{scala}</artifactId><version>{version}</version></dependency>
  </dependencies>
</project>
"""


def spark_kafka_home(version: str) -> Path:
    env = os.environ.get("KAFKA_MONITOR_SPARK_KAFKA_HOME")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "kafka-monitor"
    return base / f"spark-kafka-{version}"


def _cached(version: str) -> Optional[list[Path]]:
    home = spark_kafka_home(version)
    if (home / ".complete").exists():
        jars = sorted((home / "jars").glob("*.jar"))
        if any(j.name.startswith(_KEEP[0]) for j in jars):
            return jars
    return None


def _fetch(version: str, mvn: str) -> tuple[Optional[list[Path]], str]:
    """(the jars, "") or (None, Maven's last lines)."""
    home = spark_kafka_home(version)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time; the others wait and reuse it
        jars = _cached(version)
        if jars:
            return jars, ""
        (home / "pom.xml").write_text(_POM.format(scala=SCALA_VERSION, version=version))
        tmp = home / "jars.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        proc = subprocess.run(
            [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(home / "pom.xml"),
             f"{_DEPENDENCY_PLUGIN}:copy-dependencies", f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0 or not any(tmp.glob(f"{_KEEP[0]}*.jar")):
            shutil.rmtree(tmp, ignore_errors=True)
            return None, "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        for jar in tmp.glob("*.jar"):
            if not jar.name.startswith(_KEEP):
                jar.unlink()
        shutil.rmtree(home / "jars", ignore_errors=True)
        tmp.rename(home / "jars")
        (home / ".complete").write_text(version + "\n")
    return _cached(version), ""


def ensure_spark_kafka(version: Optional[str] = None) -> list[Path]:
    """The jars of Spark's Kafka source for the installed Spark (fetched with ``mvn`` on first
    use), for ``spark.jars`` / ``spark-submit --jars``.  Raises KafkaSetupError saying what to do."""
    versions = [version] if version else list(dict.fromkeys([spark_version(), SPARK_KAFKA_FALLBACK]))
    for v in versions:
        jars = _cached(v)
        if jars:
            return jars
    java_bin()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaSetupError("'mvn' (Maven) not found; it fetches Spark's Kafka source from Maven Central: "
                              "apt-get install maven")
    tails = []
    for v in versions:
        print(f"[spark] fetching Spark's Kafka source {v} from Maven Central (first run only)...",
              file=sys.stderr, flush=True)
        jars, tail = _fetch(v, mvn)
        if jars:
            return jars
        tails.append(f"{v}: {tail}")
    raise KafkaSetupError("mvn could not fetch org.apache.spark:spark-sql-kafka-0-10_2.13 "
                          f"({', '.join(versions)}) from Maven Central; is it reachable from here "
                          "(proxies go in ~/.m2/settings.xml)?\n" + "\n".join(tails))


# ---------------------------------------------------------------- the standalone cluster

def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


class SparkCluster:
    """A standalone master and ``workers`` workers (``cores`` and ``memory`` each) on 127.0.0.1.

    ``master_url`` is what ``spark-submit --master`` takes; ``env()`` the environment a driver
    on this machine needs (loopback, this interpreter for the Python workers)."""

    managed = True  # its processes are ours: executors and workers may be killed

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g",
                 work_dir: Optional[Path] = None, python: str = sys.executable):
        self.n_workers, self.cores, self.memory, self.python = workers, cores, memory, python
        self._own_dir = work_dir is None
        self.dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="km-spark-cluster-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = self.ui_port = 0
        self.master: Optional[subprocess.Popen] = None
        self.workers: list[Optional[subprocess.Popen]] = [None] * workers
        self._logs: list[IO[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   PYSPARK_PYTHON=self.python, PYSPARK_DRIVER_PYTHON=self.python,
                   SPARK_DAEMON_MEMORY=_DAEMON_MEMORY, SPARK_LOG_DIR=str(self.dir / "logs"))
        env.pop("PYSPARK_GATEWAY_PORT", None)
        env.pop("PYSPARK_GATEWAY_SECRET", None)
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        java_bin()
        log = open(self.dir / f"{name}.log", "ab")
        self._logs.append(log)
        return popen_dying_with_parent([str(spark_home() / "bin" / "spark-class"), *args], env=self.env(),
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def start(self, timeout: float = 120.0) -> "SparkCluster":
        try:
            self.port, self.ui_port = free_port(), free_port()
            self.master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                                 "--port", str(self.port), "--webui-port", str(self.ui_port)])
            self._wait(lambda s: True, "the master", timeout)
            for i in range(self.n_workers):
                self.start_worker(i, wait=False)
            self.wait_workers(self.n_workers, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def start_worker(self, i: int, wait: bool = True, timeout: float = 120.0) -> None:
        work = self.dir / f"worker-{i}"
        work.mkdir(parents=True, exist_ok=True)
        self.workers[i] = self._spawn(f"worker-{i}", [
            "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
            "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", str(self.cores),
            "--memory", self.memory, "--work-dir", str(work)])
        if wait:
            self.wait_workers(sum(1 for w in self.workers if w is not None and w.poll() is None), timeout)

    def status(self) -> dict:
        """The master's JSON status (workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def alive_workers(self) -> int:
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def _wait(self, cond, what: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.master is None or self.master.poll() is not None:
                raise RuntimeError(f"the Spark master exited; see {self.dir / 'master.log'}")
            try:
                st = self.status()
                if cond(st):
                    return st
                last = st
            except OSError as e:
                last = e
            time.sleep(0.3)
        raise TimeoutError(f"{what} not ready after {timeout:.0f} s (last: {last!r}); logs in {self.dir}")

    def wait_workers(self, n: int, timeout: float = 120.0) -> None:
        self._wait(lambda s: sum(1 for w in s.get("workers", []) if w.get("state") == "ALIVE") >= n,
                   f"{n} Spark worker(s)", timeout)

    def executor_pids(self, worker: Optional[int] = None) -> list[int]:
        """PIDs of the executor JVMs the workers (or worker ``worker``) started."""
        procs = self.workers if worker is None else [self.workers[worker]]
        out = []
        for w in procs:
            if w is not None and w.poll() is None:
                out += [c for c in _children(w.pid) if "CoarseGrainedExecutorBackend" in _cmdline(c)]
        return out

    def executors(self) -> dict[str, int]:
        """{Spark's executor id: PID} of the running executor JVMs."""
        out = {}
        for pid in self.executor_pids():
            args = _cmdline(pid).split()
            if "--executor-id" in args:
                out[args[args.index("--executor-id") + 1]] = pid
        return out

    def kill_executor(self, executor_id: str) -> int:
        """SIGKILL the executor JVM Spark calls ``executor_id``; its PID."""
        pid = self.executors().get(executor_id)
        if pid is None:
            raise RuntimeError(f"no executor {executor_id} runs here (running: {self.executors()})")
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` and its executors, as a lost machine."""
        w = self.workers[i]
        if w is None:
            return
        for pid in self.executor_pids(i):
            _kill(pid, signal.SIGKILL)
        _kill(w.pid, signal.SIGKILL)
        w.wait(30)
        self.workers[i] = None

    def stop(self) -> None:
        """Stop every process by PID (workers with their executors first), close the logs; the
        directory is removed when it was ours, unless ``KAFKA_MONITOR_KEEP_SPARK`` is set."""
        for i, w in enumerate(self.workers):
            if w is not None:
                execs = self.executor_pids(i)
                stop_process(w, timeout=15)
                for pid in execs:
                    _kill(pid, signal.SIGKILL)
                self.workers[i] = None
        stop_process(self.master, timeout=15)
        self.master = None
        for log in self._logs:
            log.close()
        self._logs = []
        if self._own_dir and not os.environ.get("KAFKA_MONITOR_KEEP_SPARK"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "SparkCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
