# kafka-monitor image: the `kafka-monitor` command (probe, job, demo, schema) with the Java
# runtime PySpark needs.  Used by docker-compose.yml for the `probe` and `job` services.
#
#   docker build -t kafka-monitor .
#   docker run --rm kafka-monitor probe --help
#
# Pinned to Debian bookworm: it is the Debian release that ships openjdk-17 (the plain
# python:3.11-slim tag follows the newest Debian, which has no openjdk-17 package).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The JRE's post-install step links its man pages, and slim images have no man directories.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*

COPY pyproject.toml README.md /tmp/src/
COPY monitor /tmp/src/monitor
COPY streaming /tmp/src/streaming
COPY kafka_monitor /tmp/src/kafka_monitor
RUN pip install /tmp/src \
 && rm -rf /tmp/src

# An unprivileged user; /checkpoint belongs to it so that a fresh named volume mounted there
# (the job's --checkpoint) is writable.
RUN useradd --system --create-home --home-dir /home/kafka-monitor --uid 10001 kafka-monitor \
 && mkdir -p /checkpoint \
 && chown kafka-monitor /checkpoint
USER kafka-monitor
WORKDIR /home/kafka-monitor

EXPOSE 9465
ENTRYPOINT ["kafka-monitor"]
CMD ["--help"]
