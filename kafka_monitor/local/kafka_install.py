"""Apache Kafka for the local cluster (``kafka_monitor.local.kafka_cluster``): the jars of one of
the versions in ``KAFKA_RELEASES``, fetched from Maven Central through the ordinary Maven client
(``mvn``) on first use and cached (``~/.cache/kafka-monitor/kafka-<version>``, or
``$KAFKA_MONITOR_KAFKA_HOME/kafka-<version>``), and the Java and Maven checks, which raise
``KafkaSetupError`` with the Debian packages to install.

``$KAFKA_MONITOR_KAFKA_VERSION`` changes the default version (one of ``KAFKA_RELEASES``) for
everything that does not name one: the demo, the tests' cluster, the benchmarks.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SCALA_VERSION = "2.13"


@dataclass(frozen=True)
class KafkaRelease:
    """How a Kafka version is fetched and logs: ``log4j2`` is the Log4j 2 version its jars
    depend on (the slf4j binding added to match), None for a release that logs through
    reload4j (Log4j 1.x, the 3.x line), whose binding its jars already carry."""

    version: str
    log4j2: Optional[str]

    @property
    def reload4j(self) -> bool:
        return self.log4j2 is None


#: the versions the launcher runs: the last 3.x (the line with ZooKeeper; here KRaft), the one
#: the suite runs, the newest release
KAFKA_RELEASES = {r.version: r for r in (KafkaRelease("3.9.2", None), KafkaRelease("4.1.1", "2.24.3"),
                                         KafkaRelease("4.4.0", "2.25.5"))}
#: what the suite, the demo and the benchmarks run unless told otherwise
DEFAULT_KAFKA_VERSION = "4.1.1"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_INSTALL_HINT = "install the Debian packages openjdk-17-jre-headless and maven (apt-get install openjdk-17-jre-headless maven)"


class KafkaSetupError(RuntimeError):
    """Java or Maven missing, or the Kafka jars could not be fetched."""


# ---------------------------------------------------------------- artifacts

def default_version() -> str:
    """``$KAFKA_MONITOR_KAFKA_VERSION`` or ``DEFAULT_KAFKA_VERSION``."""
    return release(os.environ.get("KAFKA_MONITOR_KAFKA_VERSION") or DEFAULT_KAFKA_VERSION).version


def release(version: Optional[str] = None) -> KafkaRelease:
    """The ``KafkaRelease`` of ``version`` (default: ``default_version()``); a version the launcher
    does not know is a ``KafkaSetupError`` naming the ones it does."""
    version = version or default_version()
    try:
        return KAFKA_RELEASES[version]
    except KeyError:
        raise KafkaSetupError(f"Apache Kafka {version!r} is not one the launcher runs; choose one of "
                              f"{', '.join(KAFKA_RELEASES)} (KAFKA_MONITOR_KAFKA_VERSION)") from None


def kafka_home(version: Optional[str] = None) -> Path:
    """Cache directory for a Kafka version's jars (default: ``default_version()``)."""
    version = release(version).version
    root = os.environ.get("KAFKA_MONITOR_KAFKA_HOME")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "kafka-monitor"
    return base / f"kafka-{version}"


@functools.lru_cache(maxsize=None)
def java_bin() -> str:
    java = shutil.which("java")
    if java is None:
        raise KafkaSetupError(f"'java' not found (Apache Kafka needs Java 17+ here): {_INSTALL_HINT}")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):
        major = int(m.group(2))
    if major < 17:
        raise KafkaSetupError(f"Apache Kafka 4.x needs Java 17+, found: {out.splitlines()[:1]}; {_INSTALL_HINT}")
    return java


_LOG4J2_BINDING = """    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
"""

_POM = """<project>
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.kafka-monitor</groupId><artifactId>kafka-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_{scala}</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{kafka}</version></dependency>
{binding}  </dependencies>
</project>
"""


def ensure_kafka(version: Optional[str] = None, home: Optional[Path] = None) -> Path:
    """Fetch a Kafka version's jars (default: ``default_version()``) with ``mvn`` into
    ``<home>/libs`` unless already there; return ``libs``.

    A second call (or another process, after the first finished) is a no-op."""
    rel = release(version)
    kafka = rel.version
    home = Path(home) if home else kafka_home(kafka)
    libs = home / "libs"
    done = home / ".complete"
    if done.exists() and (libs / f"kafka_{SCALA_VERSION}-{kafka}.jar").exists():
        return libs
    java_bin()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaSetupError(f"'mvn' (Maven) not found; it fetches Apache Kafka {kafka} from Maven Central: {_INSTALL_HINT}")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time; the others wait and reuse it
        if done.exists() and (libs / f"kafka_{SCALA_VERSION}-{kafka}.jar").exists():
            return libs
        print(f"[kafka] fetching Apache Kafka {kafka} from Maven Central (first run only)...", file=sys.stderr, flush=True)
        binding = "" if rel.reload4j else _LOG4J2_BINDING.format(log4j=rel.log4j2)
        (home / "pom.xml").write_text(_POM.format(scala=SCALA_VERSION, kafka=kafka, binding=binding))
        tmp = home / "libs.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        proc = subprocess.run(
            [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(home / "pom.xml"), f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
             f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0 or not any(tmp.glob(f"kafka_{SCALA_VERSION}-{kafka}.jar")):
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise KafkaSetupError(
                f"mvn could not fetch Apache Kafka {kafka} from Maven Central (exit {proc.returncode}); "
                f"is Maven Central reachable from here (proxies go in ~/.m2/settings.xml)?\n{tail}")
        shutil.rmtree(libs, ignore_errors=True)
        tmp.rename(libs)
        done.write_text(kafka + "\n")
    return libs
