#!/usr/bin/env bash
# kafka-monitor quick start.
#   ./run.sh demo   run the embedded default: Tansu broker, workload, probe, Spark job, exporter
#   ./run.sh test   run the test suite (unit, integration, end-to-end)
#   ./run.sh lint   ruff (every .py) and mypy (the packages), as configured in pyproject.toml
# Each sets up what it needs first: a virtual environment in .venv with this package installed,
# and Java (PySpark's one system requirement) from apt when it is missing and we are root.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}

need_apt() {  # need_apt <command> <debian package>...
  local cmd=$1; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[run.sh] installing $* (for $cmd)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "[run.sh] error: '$cmd' is missing; install the Debian package(s): $*" >&2
    exit 1
  fi
}

setup() {
  need_apt java openjdk-17-jre-headless
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || { echo "[run.sh] error: Python >= 3.10 is required (set PYTHON=...)" >&2; exit 1; }
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  local stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    echo "[run.sh] installing kafka-monitor and its dependencies into .venv (about a minute the first time)" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
    touch "$stamp"
  fi
}

case "${1:-}" in
  demo)
    shift; setup
    case " $* " in *" --real-cluster "*) need_apt mvn maven ;; esac   # Maven fetches Apache Kafka
    exec .venv/bin/kafka-monitor demo "$@" ;;
  lint)
    shift; setup
    .venv/bin/ruff check .
    exec .venv/bin/mypy ;;
  test)
    shift; setup
    need_apt promtool prometheus                # promtool + a real Prometheus server
    need_apt amtool prometheus-alertmanager     # amtool + Alertmanager for the routing/inhibit tests
    need_apt mvn maven                          # Maven fetches Apache Kafka for the real-cluster tests
    # three workers: the real-cluster tests in one group (one cluster), the other end-to-end modules
    # in one, every other module a group (docs/tests.md)
    exec .venv/bin/python -m pytest -q -rfE --durations=10 -n 3 --dist loadgroup --no-loadscope-reorder "$@" ;;
  *)
    echo "usage: ./run.sh demo [--metrics-port N] [--duration S] [--real-cluster [--fault-every S]] | ./run.sh test [pytest args] | ./run.sh lint" >&2
    exit 2 ;;
esac
