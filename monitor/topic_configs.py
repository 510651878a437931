"""Each watched topic's min.insync.replicas, read by DescribeConfigs at the metadata refreshes
(``TopicConfigs.min_isr``): a new topic at once, every topic again every ``config_refresh_s``
without waiting, and the brokers' default from one broker at every refresh.

Every request names the broker it goes to, one the refresh's metadata lists (librdkafka would
send a topic's DescribeConfigs to the controller of its own cached metadata).  A request that
waits for a broker that is down makes librdkafka reconnect to it without backoff, thousands of
times a second, until the request times out (docs/limits.md); so a broker a request timed out
on is not asked again for ``SUSPECT_S``, or until it has left the metadata and come back.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import Any, Callable, Optional, Sequence

from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

from monitor.access import authorization_resource, missing_acl, timed_out
from monitor.probe_config import ProbeConfig

log = logging.getLogger("monitor.probe")  # the probe's log, whichever of its parts writes

#: topics read again at one refresh, in one DescribeConfigs request (each answered with every
#: entry of its config, 33 on Kafka 4.1): bounds a refresh's cost (see TopicConfigs.min_isr)
CONFIG_REREAD_MAX = 1000
#: how long a broker a DescribeConfigs timed out on is not asked (unless no other is listed)
SUSPECT_S = 60.0
#: ConfigEntry.source of a topic's own value
_TOPIC_CONFIG = ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def _config_int(entry: Any) -> Optional[int]:
    """A DescribeConfigs entry's integer value; None when absent or empty."""
    return int(entry.value) if entry is not None and entry.value else None


class TopicConfigs:
    """The probe's reads of topic (and broker) configurations, through a client of their own
    (``client``, see Probe.__init__)."""

    def __init__(self, client: Any, cfg: ProbeConfig, warn_once: Callable[..., None]):
        self._client = client
        self._cfg = cfg
        self._warn_once = warn_once
        #: topic -> its min.insync.replicas (None: unknown), and when it was last asked for
        self._values: dict[str, Optional[int]] = {}
        self._read_at: dict[str, float] = {}
        #: topics whose min.insync.replicas is their own (not the brokers' default)
        self._own: set[str] = set()
        #: the re-read of topic configurations in flight (ConfigResource -> future), sent when
        self._out: dict[Any, Any] = {}
        self._out_at = 0.0
        #: the read of one broker's configuration in flight, the brokers' default it last gave,
        #: and when that last changed
        self._default_out: dict[Any, Any] = {}
        self._default: Optional[int] = None
        self._default_changed_at = -1.0
        self._default_denied = False  # no DESCRIBE_CONFIGS on the Cluster resource: not asked again
        #: the broker the reads in flight went to; brokers a read timed out on -> until when avoided
        self._out_broker: Optional[int] = None
        self._default_broker: Optional[int] = None
        self._suspect: dict[int, float] = {}
        #: topic configurations read (first reads and re-reads), and changes of a known value seen
        self.config_reads = 0
        self.min_isr_changes = 0

    def min_isr(self, topics: list[str], brokers: Sequence[int] = (), read_default: bool = True
                ) -> dict[str, Optional[int]]:
        """Each topic's min.insync.replicas (DescribeConfigs); None where the broker does not
        report it (Tansu reports none).  ``brokers``: the ones the refresh's metadata lists (each
        request goes to one of them); ``read_default``: whether to read the brokers' default.

        A topic seen for the first time is read at once, so that its first partition_metadata
        carries the value.  Later reads do not wait: a request goes out at one refresh and its
        answer is used at the first refresh after it arrived.

        - The brokers' default (what a topic without a value of its own reports) is read at
          every refresh from one broker (one resource: cheap); when it changes,
          every topic without its own value takes the new one at once.  So a change of the
          default shows within two intervals on any cluster.
        - Each topic is read again every ``config_refresh_s`` (10 s: every refresh at the
          default interval), at most ``CONFIG_REREAD_MAX`` topics a refresh, the longest unread
          first: a topic's own value changed at runtime shows within two intervals up to that
          many topics, within n / CONFIG_REREAD_MAX + 1 beyond.  DescribeConfigs answers every entry of a topic's
          config (confluent-kafka cannot name the one wanted), about 0.4 ms of this process's
          CPU per topic (bench/config_cost_bench.py), so this bounds a refresh's share."""
        now = time.monotonic()
        for t in set(self._values) - set(topics):
            self._values.pop(t, None)
            self._read_at.pop(t, None)
            self._own.discard(t)
        if self._default_out and all(f.done() for f in self._default_out.values()):
            out, self._default_out = self._default_out, {}
            self._read_default(out, self._default_broker)
        if self._out and all(f.done() for f in self._out.values()):
            out, self._out = self._out, {}
            self._read_topics(out, self._out_broker, follows_default=self._out_at > self._default_changed_at)
        target = self._target(brokers, now)  # after the answers: one that timed out is not asked again
        new = [t for t in topics if t not in self._read_at]
        if new:
            for t in new:  # read or not, not asked again before config_refresh_s
                self._read_at[t] = now
                self._values.setdefault(t, None)
            self._read_topics(self._describe(ResourceType.TOPIC, new, target), target, follows_default=True)
        if not self._out:
            due = heapq.nsmallest(CONFIG_REREAD_MAX, (t for t in topics if t not in new and now - self._read_at[t]
                                                      >= self._cfg.config_refresh_s), key=self._read_at.__getitem__)
            for t in due:
                self._read_at[t] = now
            self._out, self._out_at, self._out_broker = self._describe(ResourceType.TOPIC, due, target), now, target
        if (not self._default_out and read_default and target is not None and topics
                and not self._default_denied):
            self._default_out = self._describe(ResourceType.BROKER, [str(target)], target)
            self._default_broker = target
        return {t: self._values.get(t) for t in topics}

    def _target(self, brokers: Sequence[int], now: float) -> Optional[int]:
        """The broker this refresh's requests go to: the lowest id listed that no read timed
        out on lately (a broker gone from the metadata is forgiven); None when none is listed
        (then librdkafka picks: the controller of its metadata)."""
        for b in set(self._suspect) - set(brokers):
            del self._suspect[b]
        if not brokers:
            return None
        ok = [b for b in brokers if self._suspect.get(b, 0.0) <= now]
        return min(ok) if ok else min(brokers, key=self._suspect.__getitem__)

    def _suspect_on_timeout(self, broker: Optional[int], e: Exception) -> None:
        if broker is None or not timed_out(e):
            return
        now = time.monotonic()
        if self._suspect.get(broker, 0.0) <= now:
            log.info("DescribeConfigs to broker %s timed out (%s): other brokers are asked for %.0f s",
                     broker, e, SUSPECT_S)
        self._suspect[broker] = now + SUSPECT_S

    def _describe(self, kind: Any, names: list[str], broker: Optional[int]) -> dict[Any, Any]:
        """DescribeConfigs of ``names`` (one kind), ``CONFIG_REREAD_MAX`` to a request, to
        ``broker`` (None: librdkafka's choice): ConfigResource -> future."""
        futs: dict[Any, Any] = {}
        to = {} if broker is None else {"broker": broker}
        for i in range(0, len(names), CONFIG_REREAD_MAX):
            try:
                futs.update(self._client.describe_configs(
                    [ConfigResource(kind, n) for n in names[i:i + CONFIG_REREAD_MAX]],
                    request_timeout=self._cfg.request_timeout_s, **to))
            except Exception as e:
                self._warn_once("describe_configs", "describe_configs failed: %s", e)
        return futs

    def _read_topics(self, futs: dict[Any, Any], broker: Optional[int], follows_default: bool) -> None:
        """Take the topics' answers of :meth:`_describe` (waiting for them); a topic whose read
        failed keeps the value it had.  ``follows_default`` False: the brokers' default changed
        after these were sent, so a topic without its own value keeps the newer default."""
        for res, fut in futs.items():
            try:
                entry = fut.result().get("min.insync.replicas")
            except Exception as e:
                self._suspect_on_timeout(broker, e)
                self._warn_once("describe_configs", "topic configurations (min.insync.replicas) "
                                "unavailable, reported as unknown: %s%s", e,
                                missing_acl(e, topic=("DESCRIBE_CONFIGS", res.name)))
                continue
            t = res.name
            if t not in self._read_at:  # no longer watched
                continue
            self.config_reads += 1
            own = entry is not None and getattr(entry.source, "value", entry.source) == _TOPIC_CONFIG
            if own:
                self._own.add(t)
            else:
                self._own.discard(t)
                if not follows_default:
                    continue
            self._set(t, _config_int(entry))

    def _read_default(self, futs: dict[Any, Any], broker: Optional[int]) -> None:
        """The brokers' min.insync.replicas from one broker's configuration: on a change, every
        topic without its own value takes it."""
        for _res, fut in futs.items():
            try:
                entry = fut.result().get("min.insync.replicas")
            except Exception as e:
                self._suspect_on_timeout(broker, e)
                if authorization_resource(e) is not None:  # optional: the topics' re-reads see it too
                    self._default_denied = True
                    log.info("the brokers' configuration is not readable (%s): a change of their default "
                             "min.insync.replicas shows through each topic's re-read instead (DESCRIBE_CONFIGS "
                             "on the Cluster resource, optional, lets the probe see it within two intervals)", e)
                else:
                    self._warn_once("describe_broker_configs", "the brokers' configuration (their default "
                                    "min.insync.replicas) unavailable: %s", e)
                continue
            value = _config_int(entry)
            if value is None:
                continue
            if self._default is not None and value != self._default:
                log.info("the brokers' min.insync.replicas changed from %s to %s", self._default, value)
                self._default_changed_at = time.monotonic()
                for t in list(self._values):
                    if t not in self._own and self._values[t] is not None:
                        self._set(t, value)
            self._default = value

    def _set(self, topic: str, value: Optional[int]) -> None:
        old = self._values.get(topic)
        if old is not None and value != old:
            self.min_isr_changes += 1
            log.info("min.insync.replicas of topic %s changed from %s to %s", topic, old, value)
        self._values[topic] = value

    def pending(self) -> list[Any]:
        """The reads still in flight (close() waits for them)."""
        return list(self._out.values()) + list(self._default_out.values())

    def close(self) -> None:
        """Forget the reads in flight and release the client."""
        self._out, self._default_out = {}, {}
        self._client = None
