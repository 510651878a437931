"""docker-compose.yml started for real (issue 46): the full stack with a real Docker engine.

    docker compose -f docker-compose.yml -f tests/compose/docker-compose.standins.yml up -d <all but grafana>
      kafka-1..3 (KRaft) -> kafka-init (kafka-monitor topics) -> probe -> kafka-monitor.events
      -> job (RocksDB checkpoint on a named volume) -> /metrics, kafka-monitor.alerts
      -> Prometheus (the shipped rules) -> Alertmanager (the shipped routing)

No image registry is reachable here, so the override replaces the upstream images with local
stand-ins built from a Debian base (tests/support/docker_engine.py) and makes the stack's network
internal; nothing else (the first test holds it to that).  Grafana is not packaged for Debian
and is not started.  The engine is the one at $DOCKER_HOST, or Debian's docker.io started here as
root; with neither the tier is skipped, except under ``KAFKA_MONITOR_REQUIRE_DOCKER=1`` (.ci/run),
where it fails.

Docker publishes no port of a container that is only on an internal network (Docker 20.10, as
measured): the tests reach /metrics, Prometheus and Alertmanager at the containers' addresses on
the network's bridge, which lives on this machine only.  The compose file itself binds every
published port to 127.0.0.1 (asserted).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from kafka_monitor import topics as monitor_topics
from kafka_monitor.local.kafka_install import DEFAULT_KAFKA_VERSION as KAFKA_VERSION
from kafka_monitor.local.kafka_install import ensure_kafka
from tests.conftest import wait_for
from tests.support.docker_engine import BASE_IMAGE, DockerEngine, EngineUnavailable, compose_binary

#: the first test also builds the images (setup counts toward pytest-timeout): cold, beside the other
#: worker, the base, the stand-ins and the monitor's image took ~5 min in CI
pytestmark = [pytest.mark.compose, pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
OVERRIDE = ROOT / "tests" / "compose" / "docker-compose.standins.yml"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "kafka-monitor.rules.yml"
#: every service but Grafana (not packaged for Debian; no registry to pull it from)
SERVICES = ("kafka-1", "kafka-2", "kafka-3", "kafka-init", "probe", "job", "prometheus", "alertmanager")
REQUIRED = os.environ.get("KAFKA_MONITOR_REQUIRE_DOCKER") == "1"
GROUP, ORDERS = "compose-app", "compose.orders"


def compose_config(*files: Path) -> dict:
    """The compose files as compose merges and normalises them (no engine needed)."""
    args = [compose_binary(), "-p", "kmcheck"]
    for f in files:
        args += ["-f", str(f)]
    p = subprocess.run([*args, "config", "--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT)})
    assert p.returncode == 0, f"docker-compose config exited {p.returncode}:\n{p.stderr}"
    return json.loads(p.stdout)


# -- the files, without an engine -------------------------------------------------------------

def test_the_override_changes_only_where_images_come_from():
    """Merged with the override, the stack is the user's one but for each service's image, its
    build arguments and build network, and the network made internal."""
    base, merged = compose_config(COMPOSE_FILE), compose_config(COMPOSE_FILE, OVERRIDE)
    raw = YAML(typ="safe").load(OVERRIDE.read_text(encoding="utf-8"))
    assert set(raw) - {"services", "networks"} <= {k for k in raw if k.startswith("x-")}, set(raw)
    changed = []
    for name, svc in merged["services"].items():
        mine = json.loads(json.dumps(svc))
        theirs = json.loads(json.dumps(base["services"][name]))
        for s in (mine, theirs):
            s.pop("image", None)
            build = s.get("build") or {}
            build.pop("args", None)
            build.pop("network", None)
        assert mine == theirs, f"{name}: the override changes more than where its image comes from"
        if svc.get("image") != base["services"][name].get("image") or svc.get("build") != base["services"][name].get("build"):
            changed.append(name)
    for name, net in merged["networks"].items():
        mine, theirs = dict(net), dict(base["networks"][name])
        assert mine.pop("internal", None) is True and theirs.pop("internal", None) in (None, False)
        assert mine == theirs, f"network {name}: the override changes more than 'internal'"
    assert set(changed) == set(SERVICES), changed  # every service the tests start, and Grafana untouched
    for name in SERVICES:
        build = merged["services"][name].get("build")
        if build:
            assert build["args"] == {"BASE_IMAGE": BASE_IMAGE} and build["network"] == "host", name


def test_compose_runs_the_tests_kafka_and_creates_the_topics_as_the_readme_says():
    stack = compose_config(COMPOSE_FILE)
    override = compose_config(COMPOSE_FILE, OVERRIDE)
    for node in ("kafka-1", "kafka-2", "kafka-3"):
        assert stack["services"][node]["image"] == f"apache/kafka:{KAFKA_VERSION}", \
            f"{node}: the compose file's Kafka is not the version the tests run ({KAFKA_VERSION})"
        assert override["services"][node]["image"].endswith(f":{KAFKA_VERSION}")
        env = stack["services"][node]["environment"]
        assert "KAFKA_MIN_INSYNC_REPLICAS" not in env, \
            "Kafka 4.1 formats clusters with eligible leader replicas on and refuses a broker-wide min.insync.replicas"
    init = stack["services"]["kafka-init"]
    assert init["command"][0] == "topics" and init["image"] == stack["services"]["job"]["image"]
    assert not {"--replication-factor", "--events-topic", "--alerts-topic"} & set(init["command"]), \
        "kafka-init creates the topics with kafka-monitor topics' defaults, the README's"
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
    rf, isr = monitor_topics.REPLICATION_FACTOR, monitor_topics.MIN_INSYNC_REPLICAS
    for topic in ("kafka-monitor.events", "kafka-monitor.alerts"):
        said = re.search(rf"`{re.escape(topic)}`[^)]*?replication factor (\d+), `min\.insync\.replicas=(\d+)`", readme)
        assert said, f"the README no longer says how to create {topic}"
        assert (int(said.group(1)), int(said.group(2))) == (rf, isr), (topic, said.group(0))
    job = stack["services"]["job"]["command"]
    assert job[job.index("--alerts-topic") + 1] == "kafka-monitor.alerts"


# -- the stack, with an engine ----------------------------------------------------------------

@pytest.fixture(scope="module")
def engine():
    e = DockerEngine()
    try:
        e.start()
    except EngineUnavailable as ex:
        if REQUIRED:
            pytest.fail(f"KAFKA_MONITOR_REQUIRE_DOCKER=1 and no Docker engine: {ex}", pytrace=False)
        pytest.skip(f"no Docker engine: {ex}")
    try:
        yield e
    finally:
        e.stop()


class Stack:
    """One compose project of the two files, and what the tests ask of it."""

    def __init__(self, engine: DockerEngine, project: str):
        self.engine, self.project = engine, project
        self.timings: dict[str, float] = {}

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([compose_binary(), "-p", self.project, "-f", str(COMPOSE_FILE), "-f", str(OVERRIDE), *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=self.engine.env)
        if check and p.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        return p

    def container(self, service: str) -> str:
        return f"{self.project}-{service}-1"

    def ip(self, service: str) -> str:
        out = self.engine.docker("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                                 self.container(service)).stdout.decode().split()
        assert len(out) == 1, f"{service}: expected one network, got {out}"
        return out[0]

    def get(self, service: str, port: int, path: str, timeout: float = 5) -> bytes:
        return urllib.request.urlopen(f"http://{self.ip(service)}:{port}{path}", timeout=timeout).read()

    def metrics(self) -> str:
        return self.get("job", 9465, "/metrics").decode()

    def prom(self, expr: str) -> list:
        body = self.get("prometheus", 9090, "/api/v1/query?query=" + urllib.parse.quote(expr))
        return json.loads(body)["data"]["result"]

    def prom_alerts(self) -> list[dict]:
        return json.loads(self.get("prometheus", 9090, "/api/v1/alerts"))["data"]["alerts"]

    def am_alerts(self) -> list[dict]:
        return json.loads(self.get("alertmanager", 9093, "/api/v2/alerts?active=true&silenced=false&inhibited=true"))

    def health(self, service: str) -> str:
        return self.engine.docker("inspect", "--format", "{{if .State.Health}}{{.State.Health.Status}}{{else}}"
                                  "{{.State.Status}}{{end}}", self.container(service), check=False).stdout.decode().strip()

    def python(self, script: str, timeout: float = 180) -> str:
        """Run ``script`` in a one-off container of the kafka-monitor image on the stack's network."""
        p = self.compose("run", "--rm", "--no-deps", "-T", "--entrypoint", "python", "probe", "-c", script,
                         timeout=timeout)
        return p.stdout

    def alerts_topic(self) -> list[dict]:
        out = self.python("import json; from streaming.sinks.alerts import read_published; print(json.dumps("
                          "read_published({'bootstrap.servers': 'kafka-1:9092,kafka-2:9092,kafka-3:9092'}, "
                          "'kafka-monitor.alerts', timeout_s=60)))")
        return json.loads(out.strip().splitlines()[-1])

    def containers(self) -> list[dict]:
        """``docker inspect`` of every container of the project, stopped ones too."""
        ids = self.engine.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}"
                                 ).stdout.decode().split()
        return json.loads(self.engine.docker("inspect", *ids).stdout) if ids else []

    def stats(self) -> dict[str, str]:
        out = self.engine.docker("stats", "--no-stream", "--format", "{{.Name}}\t{{.MemUsage}}").stdout.decode()
        return {n.replace(f"{self.project}-", "").rsplit("-1", 1)[0]: m.split(" / ")[0]
                for n, m in (line.split("\t") for line in out.splitlines() if line.startswith(self.project))}


def series(text: str, name: str, **labels: str) -> list[tuple[dict, float]]:
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        lab = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name):line.rindex("}") + 1]))
        if all(lab.get(k) == v for k, v in labels.items()):
            out.append((lab, float(line.rsplit(" ", 1)[1])))
    return out


@pytest.fixture(scope="module")
def stack(engine):
    s = Stack(engine, f"kmtest{os.getpid()}")
    t0 = time.monotonic()
    engine.build_standins(KAFKA_VERSION, ensure_kafka(KAFKA_VERSION))
    s.timings["stand-in images"] = time.monotonic() - t0
    t0 = time.monotonic()
    s.compose("build", "job", timeout=1800)
    s.timings["kafka-monitor image"] = time.monotonic() - t0
    try:
        t0 = time.monotonic()
        s.compose("up", "-d", *SERVICES, timeout=600)
        s.timings["up -d"] = time.monotonic() - t0
        wait_for(lambda: s.health("job") == "healthy" or s.health("job") == "exited", timeout=300, interval=1,
                 what="the job container healthy")
        assert s.health("job") == "healthy", s.compose("logs", "--tail", "50", "job", check=False).stdout
        yield s
    finally:
        s.compose("down", "-v", "--remove-orphans", "--timeout", "20", check=False)


def test_up_serves_the_bundled_clusters_partitions_and_a_groups_lag(stack):
    t0 = time.monotonic() - stack.timings["up -d"]

    def events_partitions():
        try:
            return len(series(stack.metrics(), "kafka_monitor_partition_in_sync_replicas", topic="kafka-monitor.events"))
        except OSError:
            return 0
    try:
        wait_for(lambda: events_partitions() == monitor_topics.EVENTS_PARTITIONS, timeout=300, interval=1,
                 what="the events topic's partitions on /metrics")
    except AssertionError as e:
        logs = stack.compose("logs", "--tail", "30", "kafka-init", "probe", "job", check=False).stdout
        raise AssertionError(f"{e}\n{stack.compose('ps', '-a', check=False).stdout}\n{logs[-6000:]}") from None
    stack.timings["up to the first metrics"] = time.monotonic() - t0
    # a consumer group of our own, 20 records in and 5 committed per partition: lag 15 each
    stack.python(f"""
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
boot = "kafka-1:9092,kafka-2:9092,kafka-3:9092"
admin = AdminClient({{"bootstrap.servers": boot}})
admin.create_topics([NewTopic("{ORDERS}", 2, 3)])["{ORDERS}"].result(60)
p = Producer({{"bootstrap.servers": boot}})
for i in range(40):
    p.produce("{ORDERS}", b"order-%d" % i, partition=i % 2)
assert p.flush(60) == 0
c = Consumer({{"bootstrap.servers": boot, "group.id": "{GROUP}", "enable.auto.commit": False}})
c.commit(offsets=[TopicPartition("{ORDERS}", q, 5) for q in (0, 1)], asynchronous=False)
c.close()
""")
    lags = wait_for(lambda: (lambda s: s if len(s) == 2 else None)(
        series(stack.metrics(), "kafka_monitor_group_partition_lag", group=GROUP, topic=ORDERS)),
        timeout=120, interval=1, what=f"{GROUP}'s lag on /metrics")
    assert sorted(v for _, v in lags) == [15.0, 15.0], lags
    assert all(lab["cluster"] == "compose" for lab, _ in lags)
    print("\n[compose] timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in stack.timings.items())
          + f"\n[compose] memory per container: {stack.stats()}")


def test_prometheus_scrapes_the_job_and_loaded_the_shipped_rules(stack):
    wait_for(lambda: any(r["value"][1] == "1" for r in stack.prom('up{job="kafka-monitor"}')), timeout=90,
             interval=2, what="Prometheus's kafka-monitor target up")
    loaded = {r["name"] for g in json.loads(stack.get("prometheus", 9090, "/api/v1/rules"))["data"]["groups"]
              for r in g["rules"] if r.get("type") == "alerting"}
    shipped = set(re.findall(r"^\s+- alert: (\S+)", RULES.read_text(encoding="utf-8"), re.M))
    assert shipped and shipped <= loaded, sorted(shipped - loaded)
    prom = json.loads(stack.get("prometheus", 9090, "/api/v1/status/buildinfo"))["data"]["version"]
    am = json.loads(stack.get("alertmanager", 9093, "/api/v2/status"))["versionInfo"]["version"]
    am_targets = json.loads(stack.get("prometheus", 9090, "/api/v1/alertmanagers"))["data"]["activeAlertmanagers"]
    assert am_targets, "Prometheus has no Alertmanager"
    print(f"\n[compose] stand-ins that ran: Prometheus {prom} (Debian's; the compose file pins v2.53.2), "
          f"Alertmanager {am} (Debian's; pinned v0.27.0); {len(loaded)} alerting rules loaded")


def test_the_network_is_internal_and_nothing_is_forwarded_or_natted(stack):
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0", "IP forwarding is on"
    nat = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True) \
        if subprocess.run(["which", "iptables"], capture_output=True).returncode == 0 else None
    if nat is not None and nat.returncode == 0:
        assert "DOCKER" not in nat.stdout and "MASQUERADE" not in nat.stdout, nat.stdout
    net = json.loads(stack.engine.docker("network", "inspect", f"{stack.project}_default").stdout)[0]
    assert net["Internal"] is True, "the stack's network is not internal"
    for service in SERVICES:
        if service == "kafka-init":
            continue
        info = json.loads(stack.engine.docker("inspect", stack.container(service)).stdout)[0]
        nets = set(info["NetworkSettings"]["Networks"])
        assert nets == {f"{stack.project}_default"}, f"{service} is on {nets}"
        for bindings in (info["NetworkSettings"]["Ports"] or {}).values():
            for b in bindings or []:
                assert b["HostIp"] == "127.0.0.1", f"{service} publishes on {b}"
    for name, svc in compose_config(COMPOSE_FILE)["services"].items():
        for port in svc.get("ports") or []:
            assert port.get("host_ip") == "127.0.0.1", f"{name}: {port} is not bound to 127.0.0.1"
        assert svc.get("network_mode") in (None, ""), f"{name}: network_mode {svc.get('network_mode')}"


def broker_alerts(text: str) -> set[str]:
    return {lab["alert"] for lab, v in series(text, "kafka_monitor_alert_active", broker="3") if v == 1}


def test_a_stopped_kafka_container_alerts_and_resolves(stack):
    t0 = time.monotonic()
    stack.compose("stop", "kafka-3")
    try:
        wait_for(lambda: {"IsrShrink", "BrokerDown"} <= broker_alerts(stack.metrics()), timeout=120, interval=1,
                 what="IsrShrink and BrokerDown for broker 3 on /metrics")
        stack.timings["stop -> IsrShrink and BrokerDown on /metrics"] = time.monotonic() - t0
        wait_for(lambda: any(a["labels"].get("alertname") == "BrokerDown" and a["state"] == "firing"
                             and a["labels"].get("broker") == "3" for a in stack.prom_alerts()),
                 timeout=120, interval=1, what="BrokerDown firing in Prometheus")
        stack.timings["stop -> BrokerDown firing in Prometheus"] = time.monotonic() - t0
        wait_for(lambda: any(a["labels"].get("alertname") == "BrokerDown" and a["labels"].get("broker") == "3"
                             and a["status"]["state"] == "active" for a in stack.am_alerts()),
                 timeout=120, interval=1, what="BrokerDown active in Alertmanager")
        stack.timings["stop -> BrokerDown active in Alertmanager"] = time.monotonic() - t0
    finally:
        stack.compose("start", "kafka-3")
    t1 = time.monotonic()
    wait_for(lambda: not {"IsrShrink", "BrokerDown"} & broker_alerts(stack.metrics()), timeout=180, interval=1,
             what="IsrShrink and BrokerDown resolved on /metrics")
    stack.timings["start -> resolved on /metrics"] = time.monotonic() - t1
    # the relay keeps firing for 2 minutes after the job resolved (keep_firing_for: a flapping
    # broker pages once); then it resolves in Prometheus and Alertmanager
    wait_for(lambda: not any(a["labels"].get("alertname") == "BrokerDown" and a["labels"].get("broker") == "3"
                             for a in stack.prom_alerts()), timeout=240, interval=2,
             what="BrokerDown no longer firing in Prometheus")
    wait_for(lambda: not any(a["labels"].get("alertname") == "BrokerDown" and a["labels"].get("broker") == "3"
                             for a in stack.am_alerts()), timeout=240, interval=2,
             what="BrokerDown resolved in Alertmanager")
    stack.timings["start -> resolved in Alertmanager"] = time.monotonic() - t1
    print("\n[compose] " + ", ".join(f"{k} {v:.0f}s" for k, v in stack.timings.items() if "->" in k))


def last_commit(stack: Stack) -> int:
    out = stack.compose("exec", "-T", "job", "ls", "/var/lib/kafka-monitor/checkpoint/commits").stdout.split()
    return max(int(f) for f in out if f.isdigit())


def test_the_restarted_job_resumes_from_its_checkpoint_volume_and_publishes_nothing_twice(stack):
    before = stack.alerts_topic()
    assert before, "the broker fault published no transition: the comparison proves little"
    held = {lab["alert"] for lab, v in series(stack.metrics(), "kafka_monitor_alert_active") if v == 1}
    commit = last_commit(stack)
    t0 = time.monotonic()
    stack.compose("restart", "job")
    wait_for(lambda: stack.health("job") == "healthy", timeout=300, interval=1, what="the restarted job healthy")
    wait_for(lambda: last_commit(stack) > commit, timeout=120, interval=1, what="a batch committed after the restart")
    stack.timings["job restart -> healthy and committing"] = time.monotonic() - t0
    # the state came back from the checkpoint: the alerts open before are open again (restated
    # from the state, not opened anew: the alerts topic has no second open below), unless they
    # resolved since (LeaderChanged closes 5 minutes after the broker fault: in CI, under load,
    # that moment can fall within the restart)
    published = {(r["alert_id"], r["action"], r["at"]) for r in before}

    def restored():
        again = {lab["alert"] for lab, v in series(stack.metrics(), "kafka_monitor_alert_active") if v == 1}
        missing = held - again
        if missing:
            missing -= {r["alert"] for r in stack.alerts_topic() if r["action"] == "resolve"
                        and (r["alert_id"], r["action"], r["at"]) not in published}
        return not missing
    wait_for(restored, timeout=120, interval=2, what=f"the alerts open before the restart ({sorted(held)}) "
                                                      "open again on /metrics, or resolved since")
    after = stack.alerts_topic()
    keys = [(r["alert_id"], r["action"], r["at"]) for r in after]
    assert len(keys) == len(set(keys)), "a transition is on the alerts topic twice"
    assert {(r["alert_id"], r["action"], r["at"]) for r in before} <= set(keys)
    print(f"\n[compose] job restarted at commit {commit}, committing again in "
          f"{stack.timings['job restart -> healthy and committing']:.0f}s; {len(after)} transitions, none twice; "
          f"open before and after: {sorted(held)}")


def test_down_leaves_no_container_volume_network_mount_or_process(stack):
    made = stack.containers()
    ids = {c["Id"] for c in made}
    merged = {c["GraphDriver"]["Data"]["MergedDir"] for c in made if c.get("GraphDriver", {}).get("Data")}
    assert len(made) >= len(SERVICES), [c["Name"] for c in made]
    stack.compose("down", "-v", "--remove-orphans", "--timeout", "20")
    label = f"label=com.docker.compose.project={stack.project}"
    assert stack.engine.docker("ps", "-aq", "--filter", label).stdout.strip() == b""
    assert stack.engine.docker("volume", "ls", "-q", "--filter", label).stdout.strip() == b""
    assert stack.engine.docker("network", "ls", "-q", "--filter", label).stdout.strip() == b""
    mounts = [line for line in Path("/proc/mounts").read_text().splitlines()
              if any(i in line for i in ids) or any(m in line for m in merged)]
    assert not mounts, mounts
    left = []
    for cg in Path("/proc").glob("[0-9]*/cgroup"):
        try:
            text = cg.read_text()
        except OSError:  # the process ended meanwhile
            continue
        if any(i in text for i in ids):
            left.append(cg.parent.name)
    assert not left, f"processes of the stack's containers still running: {left}"
