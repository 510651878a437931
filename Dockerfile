# kafka-monitor image: the `kafka-monitor` command (probe, job, topics, snapshot, replay...) with
# the Java runtime PySpark needs.  docker-compose.yml runs its probe, job and topic set-up from it.
#
#   docker build -t kafka-monitor .
#   docker run --rm kafka-monitor probe --help
#
# BASE_IMAGE: any Debian bookworm image (it ships openjdk-17); users build on the public Python
# image, the tests on a local Debian base made with debootstrap (no image registry there: docs/deploy.md).
# Where the base has no Python, Debian's python3 (3.11 on bookworm) is installed.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/kafka-monitor \
    PATH=/opt/kafka-monitor/bin:$PATH

# The JRE's post-install step links its man pages, and slim images have no man directories.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
      $(command -v python3 >/dev/null || echo python3 python3-venv) \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/kafka-monitor

# The dependencies first, in a layer of their own: a change of the code rebuilds only the last one.
COPY pyproject.toml README.md /tmp/src/
RUN mkdir -p /tmp/src/monitor /tmp/src/streaming /tmp/src/kafka_monitor \
 && pip install /tmp/src && pip uninstall -y kafka-monitor
COPY monitor /tmp/src/monitor
COPY streaming /tmp/src/streaming
COPY kafka_monitor /tmp/src/kafka_monitor
RUN pip install --no-deps /tmp/src && rm -rf /tmp/src

# An unprivileged user.  /var/lib/kafka-monitor holds the job's checkpoint (its state store) and
# the event archive: a fresh named volume mounted there is owned by this user.
RUN useradd --system --create-home --home-dir /home/kafka-monitor --uid 10001 kafka-monitor \
 && mkdir -p /var/lib/kafka-monitor/checkpoint /var/lib/kafka-monitor/archive \
 && chown -R kafka-monitor /var/lib/kafka-monitor
VOLUME ["/var/lib/kafka-monitor/checkpoint", "/var/lib/kafka-monitor/archive"]
USER kafka-monitor
WORKDIR /home/kafka-monitor

EXPOSE 9465
ENTRYPOINT ["kafka-monitor"]
CMD ["--help"]
