"""Apache Kafka for the local cluster (``kafka_monitor.local.kafka_cluster``): the jars, fetched
from Maven Central through the ordinary Maven client (``mvn``) on first use and cached
(``~/.cache/kafka-monitor/kafka-<version>``, or ``$KAFKA_MONITOR_KAFKA_HOME``), and the Java and
Maven checks, which raise ``KafkaSetupError`` with the Debian packages to install.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.24.3"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_INSTALL_HINT = "install the Debian packages openjdk-17-jre-headless and maven (apt-get install openjdk-17-jre-headless maven)"


class KafkaSetupError(RuntimeError):
    """Java or Maven missing, or the Kafka jars could not be fetched."""


# ---------------------------------------------------------------- artifacts

def kafka_home() -> Path:
    """Cache directory for this Kafka version's jars."""
    env = os.environ.get("KAFKA_MONITOR_KAFKA_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kafka-monitor" / f"kafka-{KAFKA_VERSION}"


@functools.lru_cache(maxsize=None)
def java_bin() -> str:
    java = shutil.which("java")
    if java is None:
        raise KafkaSetupError(f"'java' not found (Apache Kafka {KAFKA_VERSION} needs Java 17+): {_INSTALL_HINT}")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):
        major = int(m.group(2))
    if major < 17:
        raise KafkaSetupError(f"Apache Kafka {KAFKA_VERSION} needs Java 17+, found: {out.splitlines()[:1]}; {_INSTALL_HINT}")
    return java


_POM = """<project>
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.kafka-monitor</groupId><artifactId>kafka-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_{scala}</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""


def ensure_kafka(home: Optional[Path] = None) -> Path:
    """Fetch the Kafka jars with ``mvn`` into ``<home>/libs`` unless already there; return ``libs``.

    A second call (or another process, after the first finished) is a no-op."""
    home = Path(home) if home else kafka_home()
    libs = home / "libs"
    done = home / ".complete"
    if done.exists() and (libs / f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar").exists():
        return libs
    java_bin()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaSetupError(f"'mvn' (Maven) not found; it fetches Apache Kafka {KAFKA_VERSION} from Maven Central: {_INSTALL_HINT}")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time; the others wait and reuse it
        if done.exists() and (libs / f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar").exists():
            return libs
        print(f"[kafka] fetching Apache Kafka {KAFKA_VERSION} from Maven Central (first run only)...", file=sys.stderr, flush=True)
        (home / "pom.xml").write_text(_POM.format(scala=SCALA_VERSION, kafka=KAFKA_VERSION, log4j=LOG4J_VERSION))
        tmp = home / "libs.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        proc = subprocess.run(
            [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(home / "pom.xml"), f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
             f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0 or not any(tmp.glob(f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar")):
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise KafkaSetupError(
                f"mvn could not fetch Apache Kafka {KAFKA_VERSION} from Maven Central (exit {proc.returncode}); "
                f"is Maven Central reachable from here (proxies go in ~/.m2/settings.xml)?\n{tail}")
        shutil.rmtree(libs, ignore_errors=True)
        tmp.rename(libs)
        done.write_text(KAFKA_VERSION + "\n")
    return libs
