"""The dashboards keep clusters apart (issue 34): every query of a series that carries a
``cluster`` label follows the dashboard's ``$cluster`` variable, and every legend that names an
entity names its cluster too (two clusters with a topic of the same name draw two lines that
must not look alike).  The committed JSON is what Grafana reads; tests/integration/
test_dashboards.py keeps it equal to dashboards/generate.py's output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from streaming.sinks.catalogue import CATALOGUE

DASH_DIR = Path(__file__).resolve().parents[2] / "dashboards"
DASHBOARDS = sorted(p.name for p in DASH_DIR.glob("*.json"))
SELECTOR = re.compile(r"\b(ALERTS|kafka_monitor_[a-z0-9_]+)\b(\{[^}]*\})?")
FOLLOWS = 'cluster=~"$cluster"'
ENTITY_LEGEND = re.compile(r"\{\{\s*(topic|group|partition|source|broker)\s*\}\}")


def clustered(metric: str) -> bool:
    """Whether the series of ``metric`` carry a cluster label (Prometheus's ALERTS do for
    every alert about a cluster)."""
    if metric == "ALERTS":
        return True
    for suffix in ("", "_bucket", "_sum", "_count"):
        name = metric[: len(metric) - len(suffix)] if suffix and metric.endswith(suffix) else metric
        if name in CATALOGUE:
            return "cluster" in CATALOGUE[name][2]
    raise AssertionError(f"{metric}: not in the exporter's catalogue")


def selector_problems(expr: str) -> list[str]:
    """Selectors of clustered series that ignore ``$cluster``.  A selector may instead ask for
    the series without a cluster (``cluster=""``: the monitor's own alerts) when the query also
    reads the same metric for ``$cluster``."""
    found = [(m.group(1), m.group(2) or "") for m in SELECTOR.finditer(expr)]
    following = {name for name, sel in found if FOLLOWS in sel}
    return [f"{name}{sel}" for name, sel in found if clustered(name) and FOLLOWS not in sel
            and not ('cluster=""' in sel and name in following)]


def targets(name: str) -> list[tuple[str, dict]]:
    d = json.loads((DASH_DIR / name).read_text(encoding="utf-8"))
    return [(p["title"], t) for p in d["panels"] for t in p.get("targets", [])]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_clustered_series_follows_the_cluster_variable(name):
    problems = [f"{title!r}: {bad}" for title, t in targets(name) for bad in selector_problems(t["expr"])]
    assert not problems, f"{name}: selectors without {FOLLOWS}:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_legend_naming_an_entity_names_its_cluster(name):
    problems = [f"{title!r}: {t['legendFormat']!r}" for title, t in targets(name)
                if ENTITY_LEGEND.search(t.get("legendFormat", "")) and "{{cluster}}" not in t["legendFormat"]]
    assert not problems, f"{name}: legends without {{{{cluster}}}}:\n" + "\n".join(problems)


def test_the_selector_check_sees_a_query_that_ignores_the_cluster():
    assert selector_problems('max by (cluster) (kafka_monitor_partition_leader{topic=~"$topic"})')
    assert selector_problems('ALERTS{alertname=~"X"}')
    assert selector_problems('ALERTS{cluster=""}')  # only the cluster-less half
    assert not selector_problems('ALERTS{cluster=~"$cluster"} or ALERTS{cluster=""}')
    assert not selector_problems("max by (instance) (kafka_monitor_job_up)")  # the job's own: no cluster
