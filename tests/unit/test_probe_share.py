"""Probes that share a cluster: the setting, the stable split, what one probe keeps of it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kafka_monitor.config import ConfigError as SettingError
from kafka_monitor.config import build, read_file
from monitor.contract import Heartbeat
from monitor.emitter import EventEmitter
from monitor.probe import Probe
from monitor.probe_config import ConfigError, ProbeConfig, parse_share, share_of
from tests.support.capture import CapturingProducer

ROOT = Path(__file__).resolve().parents[2]
NAMES = [f"orders.{i}" for i in range(2000)] + [f"app-{i}" for i in range(2000)] + ["", "é-ü", "a" * 300]


def test_share_setting_is_i_of_n():
    assert parse_share("1/2") == (1, 2) and parse_share(" 3 / 3 ") == (3, 3) and parse_share("1/1") == (1, 1)
    assert parse_share("") is None and parse_share(None) is None
    for bad in ("0/2", "3/2", "1/0", "2", "a/b", "1/2/3", "-1/2", "1.5/2"):
        with pytest.raises(ConfigError, match=r"probe\.share"):
            parse_share(bad)
    with pytest.raises(ConfigError, match=r"probe\.share"):
        ProbeConfig(bootstrap_servers="x:1", share="2/1").validate()


def test_share_from_file_environment_and_flag(tmp_path):
    f = tmp_path / "probe.toml"
    f.write_text('[probe]\nbootstrap_servers = "b:9092"\nshare = "2/3"\n')
    assert build(ProbeConfig, "probe", file_data=read_file(str(f)), env={}).share == "2/3"
    assert build(ProbeConfig, "probe", file_data=read_file(str(f)), env={"KAFKA_MONITOR_PROBE_SHARE": "1/3"}).share == "1/3"
    assert build(ProbeConfig, "probe", file_data=read_file(str(f)), env={}, flags={"share": "3/3"}).share == "3/3"
    with pytest.raises(SettingError, match=r"probe\.share"):
        build(ProbeConfig, "probe", file_data=read_file(str(f)), env={}, flags={"share": "4/3"})


def test_cli_help_explains_share():
    out = subprocess.run([sys.executable, "-m", "kafka_monitor.cli", "probe", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60).stdout
    assert "--share I/N" in out and "exactly one probe" in " ".join(out.split())


def test_every_name_is_in_exactly_one_share_and_shares_are_even():
    for n in (1, 2, 3, 7):
        shares = [share_of(name, n) for name in NAMES]
        assert set(shares) <= set(range(1, n + 1))
        counts = Counter(shares)
        assert len(counts) == n
        assert max(counts.values()) - min(counts.values()) < 0.1 * len(NAMES) / n, counts


def test_the_split_is_the_same_in_every_process():
    """Not Python's hash(): two interpreters with different hash seeds split names alike."""
    code = ("import sys; from monitor.probe_config import share_of; "
            "print(''.join(str(share_of(n, 5)) for n in sys.stdin.read().split(',')))")
    got = set()
    for seed in ("1", "2", "random"):
        r = subprocess.run([sys.executable, "-c", code], input=",".join(NAMES[:500]), capture_output=True,
                           text=True, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60)
        assert r.returncode == 0, r.stderr
        got.add(r.stdout.strip())
    assert got == {"".join(str(share_of(n, 5)) for n in NAMES[:500])}


def _probe(**kw) -> tuple[Probe, CapturingProducer]:
    cfg = ProbeConfig(bootstrap_servers="unused:9092", cluster="c", source=kw.pop("source", "p"), **kw)
    producer = CapturingProducer()
    emitter = EventEmitter({}, cfg.events_topic, cluster="c", source=cfg.source, producer=producer)
    return Probe(cfg, emitter=emitter, admin=object()), producer


def test_probes_of_one_cluster_watch_disjoint_topics_that_cover_it():
    probes = [_probe(share=f"{i}/3", source=f"p{i}")[0] for i in (1, 2, 3)]
    whole = _probe()[0]
    topics = [f"t{i}" for i in range(300)] + ["__consumer_offsets"]
    for t in topics:
        owners = [p for p in probes if p._scope.watched(t)]
        assert len(owners) == (1 if whole._scope.watched(t) else 0), t
        assert all(p._scope.owns(t) == (share_of(t, 3) == i) for i, p in enumerate(probes, 1))
    # the other filters still apply inside a share
    narrow = _probe(share="1/2", topics_include="^t1")[0]
    assert ([t for t in topics if narrow._scope.watched(t)]
            == [t for t in topics if t.startswith("t1") and share_of(t, 2) == 1])


def test_heartbeat_says_which_share():
    assert "share" in {f for f in Heartbeat.__dataclass_fields__}
    shared, cap = _probe(share="2/2", source="p2")
    whole, cap_whole = _probe(source="p")
    for p in (shared, whole):
        p.observe()  # no metadata yet: nothing observed, but a heartbeat
        p.emitter.flush(1)
    assert [e.data.share for e in cap.events if e.type == "heartbeat"] == ["2/2"]
    assert [e.data.share for e in cap_whole.events if e.type == "heartbeat"] == [None]
