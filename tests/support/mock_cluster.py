"""Drive librdkafka's built-in mock cluster (``rd_kafka_mock_*``) through ctypes.

The library is the librdkafka that the installed confluent-kafka wheel itself loads, so the mock
brokers and the Python clients run the same librdkafka build. The mock brokers listen on
127.0.0.1 only, on ephemeral ports.

The ``rd_kafka_mock_*`` API is marked experimental by librdkafka (no ABI guarantee). Every symbol
is looked up when the library is loaded; a missing one raises :class:`MockClusterUnavailable`
naming it, instead of failing later with an opaque ctypes error.

Known limits of the mock (design tests around them): ISR always equals replicas; the
CreateTopics admin API is not implemented (use :meth:`MockCluster.create_topic`);
``broker_down`` only closes/refuses the broker's connections, it does not move leaders.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path
from types import TracebackType
from typing import Sequence

__all__ = [
    "ApiKey",
    "Err",
    "MockCluster",
    "MockClusterError",
    "MockClusterUnavailable",
    "find_librdkafka",
]

#: Environment variable that overrides the library path (a path to librdkafka's shared object).
LIBRARY_ENV = "KAFKA_MONITOR_LIBRDKAFKA"


class ApiKey:
    """Kafka protocol request types (ApiKey) used with :meth:`MockCluster.push_request_errors`."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    DESCRIBE_CLUSTER = 60


class Err:
    """Kafka protocol error codes (``rd_kafka_resp_err_t`` values for broker errors)."""

    NO_ERROR = 0
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    NOT_ENOUGH_REPLICAS = 19
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    #: librdkafka-local error: makes the mock broker drop the client's connection on that request.
    TRANSPORT = -195


class MockClusterUnavailable(RuntimeError):
    """librdkafka, or one of the mock symbols, could not be found or loaded."""


class MockClusterError(RuntimeError):
    """A ``rd_kafka_mock_*`` call returned an error code."""


# --------------------------------------------------------------------------------------------
# Locating the library
# --------------------------------------------------------------------------------------------

def _loaded_librdkafka() -> str | None:
    """Path of the librdkafka mapped into this process by confluent_kafka's C extension (Linux)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    for line in maps.read_text().splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and os.path.basename(fields[5]).startswith("librdkafka"):
            return fields[5]
    return None


def find_librdkafka() -> str:
    """Path of the librdkafka shared library that the installed confluent-kafka uses.

    Order: ``$KAFKA_MONITOR_LIBRDKAFKA``; the copy already mapped by ``confluent_kafka.cimpl``
    (Linux); then the wheel's vendored locations next to the ``confluent_kafka`` package
    (``confluent_kafka.libs/`` for manylinux/Windows wheels, ``confluent_kafka/.dylibs/`` on macOS).
    """
    override = os.environ.get(LIBRARY_ENV)
    if override:
        if not os.path.isfile(override):
            raise MockClusterUnavailable(f"${LIBRARY_ENV}={override!r} is not a file")
        return override
    try:
        import confluent_kafka
        import confluent_kafka.cimpl  # noqa: F401  (loads librdkafka into the process)
    except ImportError as exc:  # pragma: no cover - the project depends on confluent-kafka
        raise MockClusterUnavailable(f"confluent_kafka is not importable: {exc}") from exc

    loaded = _loaded_librdkafka()
    if loaded and os.path.isfile(loaded):
        return loaded

    pkg = Path(confluent_kafka.__file__).resolve().parent
    patterns = [
        pkg.parent / "confluent_kafka.libs" / "librdkafka*.so*",
        pkg.parent / "confluent_kafka.libs" / "librdkafka*.dll",
        pkg / ".dylibs" / "librdkafka*.dylib",
        pkg / "librdkafka*",
    ]
    for pattern in patterns:
        hits = sorted(glob.glob(str(pattern)))
        if hits:
            return hits[0]
    tried = ", ".join(str(p) for p in patterns)
    raise MockClusterUnavailable(
        f"librdkafka shared library of confluent_kafka {confluent_kafka.version()[0]} not found "
        f"(tried the mapped copy and {tried}); set ${LIBRARY_ENV} to its path")


# --------------------------------------------------------------------------------------------
# Bindings. C types: rd_kafka_resp_err_t / rd_kafka_type_t / rd_kafka_conf_res_t are C enums
# (int); opaque handles (rd_kafka_t*, rd_kafka_conf_t*, rd_kafka_mock_cluster_t*) are void*.
# --------------------------------------------------------------------------------------------

_vp, _cp, _i32, _i16, _int, _sz = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int16,
                                   ctypes.c_int, ctypes.c_size_t)

# name: (restype, argtypes, C signature)
_SIGNATURES: dict[str, tuple[object, list[object], str]] = {
    "rd_kafka_version": (
        _int, [],
        "int rd_kafka_version(void)"),
    "rd_kafka_err2name": (
        _cp, [_int],
        "const char *rd_kafka_err2name(rd_kafka_resp_err_t err)"),
    "rd_kafka_conf_new": (
        _vp, [],
        "rd_kafka_conf_t *rd_kafka_conf_new(void)"),
    "rd_kafka_conf_set": (
        _int, [_vp, _cp, _cp, ctypes.c_char_p, _sz],
        "rd_kafka_conf_res_t rd_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, "
        "const char *value, char *errstr, size_t errstr_size)"),
    "rd_kafka_conf_destroy": (
        None, [_vp],
        "void rd_kafka_conf_destroy(rd_kafka_conf_t *conf)"),
    "rd_kafka_new": (
        # takes ownership of conf only on success
        _vp, [_int, _vp, ctypes.c_char_p, _sz],
        "rd_kafka_t *rd_kafka_new(rd_kafka_type_t type, rd_kafka_conf_t *conf, char *errstr, "
        "size_t errstr_size)"),
    "rd_kafka_destroy": (
        None, [_vp],
        "void rd_kafka_destroy(rd_kafka_t *rk)"),
    "rd_kafka_mock_cluster_new": (
        # broker ids are 1..broker_cnt
        _vp, [_vp, _int],
        "rd_kafka_mock_cluster_t *rd_kafka_mock_cluster_new(rd_kafka_t *rk, int broker_cnt)"),
    "rd_kafka_mock_cluster_bootstraps": (
        _cp, [_vp],
        "const char *rd_kafka_mock_cluster_bootstraps(const rd_kafka_mock_cluster_t *mcluster)"),
    "rd_kafka_mock_cluster_destroy": (
        None, [_vp],
        "void rd_kafka_mock_cluster_destroy(rd_kafka_mock_cluster_t *mcluster)"),
    "rd_kafka_mock_topic_create": (
        _int, [_vp, _cp, _int, _int],
        "rd_kafka_resp_err_t rd_kafka_mock_topic_create(rd_kafka_mock_cluster_t *mcluster, "
        "const char *topic, int partition_cnt, int replication_factor)"),
    "rd_kafka_mock_partition_set_leader": (
        # broker_id -1 makes the partition leaderless; bumps the partition's leader epoch
        _int, [_vp, _cp, _i32, _i32],
        "rd_kafka_resp_err_t rd_kafka_mock_partition_set_leader(rd_kafka_mock_cluster_t *mcluster, "
        "const char *topic, int32_t partition, int32_t broker_id)"),
    "rd_kafka_mock_partition_set_follower": (
        # the preferred replica a consumer is told to fetch from (KIP-392)
        _int, [_vp, _cp, _i32, _i32],
        "rd_kafka_resp_err_t rd_kafka_mock_partition_set_follower(rd_kafka_mock_cluster_t *mcluster, "
        "const char *topic, int32_t partition, int32_t broker_id)"),
    "rd_kafka_mock_broker_set_down": (
        _int, [_vp, _i32],
        "rd_kafka_resp_err_t rd_kafka_mock_broker_set_down(rd_kafka_mock_cluster_t *mcluster, "
        "int32_t broker_id)"),
    "rd_kafka_mock_broker_set_up": (
        _int, [_vp, _i32],
        "rd_kafka_resp_err_t rd_kafka_mock_broker_set_up(rd_kafka_mock_cluster_t *mcluster, "
        "int32_t broker_id)"),
    "rd_kafka_mock_push_request_errors_array": (
        # the non-variadic twin of rd_kafka_mock_push_request_errors(mcluster, ApiKey, cnt, ...)
        None, [_vp, _i16, _sz, ctypes.POINTER(_int)],
        "void rd_kafka_mock_push_request_errors_array(rd_kafka_mock_cluster_t *mcluster, "
        "int16_t ApiKey, size_t cnt, const rd_kafka_resp_err_t *errors)"),
    "rd_kafka_mock_clear_request_errors": (
        None, [_vp, _i16],
        "void rd_kafka_mock_clear_request_errors(rd_kafka_mock_cluster_t *mcluster, int16_t ApiKey)"),
    "rd_kafka_mock_set_controller_id": (
        # controller id reported in Metadata responses; -1 = no controller
        None, [_vp, _i32],
        "void rd_kafka_mock_set_controller_id(rd_kafka_mock_cluster_t *mcluster, "
        "int32_t controller_id)"),
}

_RD_KAFKA_PRODUCER = 0  # rd_kafka_type_t
_RD_KAFKA_CONF_OK = 0   # rd_kafka_conf_res_t
_lib: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    """Load librdkafka once and bind every symbol in ``_SIGNATURES``."""
    global _lib
    if _lib is not None:
        return _lib
    path = find_librdkafka()
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise MockClusterUnavailable(f"cannot load {path}: {exc}") from exc
    missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
    if missing:
        raise MockClusterUnavailable(f"{path} does not export {', '.join(missing)} "
                                     "(librdkafka too old, or built without the mock cluster)")
    for name, (restype, argtypes, _c_signature) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    _lib = lib
    return lib


def _err_name(code: int) -> str:
    return (_library().rd_kafka_err2name(code) or b"?").decode()


# --------------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------------

class MockCluster:
    """A librdkafka mock cluster with ``brokers`` brokers (ids ``1..brokers``) on 127.0.0.1.

    Use as a context manager (or call :meth:`close`). Close the clients that talk to it first:
    once the cluster is gone they only see connection refusals.
    """

    def __init__(self, brokers: int = 3, controller: int | None = 1) -> None:
        if brokers < 1:
            raise ValueError("brokers must be >= 1")
        lib = _library()
        self.broker_ids: list[int] = list(range(1, brokers + 1))
        self._rk: int | None = None
        self._mc: int | None = None
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # The bookkeeping handle never connects anywhere: hide its "no bootstrap.servers" notice (level 5).
        for key, value in (("client.id", "kafka-monitor-mock-cluster"), ("log_level", "4")):
            if lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), errstr, len(errstr)) != _RD_KAFKA_CONF_OK:
                lib.rd_kafka_conf_destroy(conf)
                raise MockClusterError(f"rd_kafka_conf_set({key}): {errstr.value.decode()}")
        rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not rk:
            lib.rd_kafka_conf_destroy(conf)  # not taken over on failure
            raise MockClusterError(f"rd_kafka_new: {errstr.value.decode()}")
        self._rk = rk
        mc = lib.rd_kafka_mock_cluster_new(rk, brokers)
        if not mc:
            self.close()
            raise MockClusterError(f"rd_kafka_mock_cluster_new({brokers}) failed")
        self._mc = mc
        self.bootstrap: str = lib.rd_kafka_mock_cluster_bootstraps(mc).decode()
        if controller is not None:
            # Without a controller id in Metadata, admin calls that go to the controller
            # (describe_cluster / describe_topics ...) wait for one until they time out.
            self.set_controller(controller)

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self) -> MockCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:  # last resort; tests should use the context manager
        try:
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        """Destroy the mock cluster (closing its listeners) and the bookkeeping handle. Idempotent."""
        lib = _lib
        if lib is None:
            return
        mc, self._mc = self._mc, None
        rk, self._rk = self._rk, None
        if mc:
            lib.rd_kafka_mock_cluster_destroy(mc)
        if rk:
            lib.rd_kafka_destroy(rk)

    @property
    def closed(self) -> bool:
        return self._mc is None

    def _handle(self) -> int:
        if self._mc is None:
            raise MockClusterError("mock cluster is closed")
        return self._mc

    @staticmethod
    def _check(what: str, code: int) -> None:
        if code != 0:
            raise MockClusterError(f"{what}: {_err_name(code)} ({code})")

    # -- topology -------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, replication_factor: int) -> None:
        """Create ``name`` (the mock does not implement the CreateTopics admin API).

        The mock would silently cap the replication factor at the broker count; refuse instead."""
        if partitions < 1 or not 1 <= replication_factor <= len(self.broker_ids):
            raise ValueError(f"need partitions >= 1 and 1 <= replication_factor <= {len(self.broker_ids)} "
                             f"(got {partitions}, {replication_factor})")
        self._check(f"topic_create({name!r}, {partitions}, {replication_factor})",
                    _library().rd_kafka_mock_topic_create(self._handle(), name.encode(), partitions,
                                                          replication_factor))

    def set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Move the leader of ``topic``/``partition`` to ``broker_id`` (-1: no leader).

        The mock bumps the partition's leader epoch on every call. Clients only learn of the move
        with their next Metadata response (or an error from the old leader)."""
        self._check(f"partition_set_leader({topic!r}, {partition}, {broker_id})",
                    _library().rd_kafka_mock_partition_set_leader(self._handle(), topic.encode(),
                                                                  partition, broker_id))

    def set_follower(self, topic: str, partition: int, broker_id: int) -> None:
        """Make ``broker_id`` the preferred read replica returned to consumers (KIP-392)."""
        self._check(f"partition_set_follower({topic!r}, {partition}, {broker_id})",
                    _library().rd_kafka_mock_partition_set_follower(self._handle(), topic.encode(),
                                                                    partition, broker_id))

    def set_controller(self, broker_id: int) -> None:
        """Controller id reported in Metadata responses (-1: no controller)."""
        _library().rd_kafka_mock_set_controller_id(self._handle(), broker_id)

    # -- faults -----------------------------------------------------------------------------------
    def broker_down(self, broker_id: int) -> None:
        """Close the broker's connections and refuse new ones (-1: all). Leaders do not move."""
        self._check(f"broker_set_down({broker_id})",
                    _library().rd_kafka_mock_broker_set_down(self._handle(), broker_id))

    def broker_up(self, broker_id: int) -> None:
        """Accept connections on the broker again (-1: all)."""
        self._check(f"broker_set_up({broker_id})",
                    _library().rd_kafka_mock_broker_set_up(self._handle(), broker_id))

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """The next ``len(errors)`` requests of type ``api_key`` (to any broker) fail with these
        error codes, in order, one each. :attr:`Err.TRANSPORT` disconnects the client instead."""
        if not errors:
            return
        arr = (ctypes.c_int * len(errors))(*errors)
        _library().rd_kafka_mock_push_request_errors_array(self._handle(), api_key, len(errors), arr)

    def clear_request_errors(self, api_key: int) -> None:
        """Drop the errors still queued for ``api_key``."""
        _library().rd_kafka_mock_clear_request_errors(self._handle(), api_key)

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.bootstrap
        return f"MockCluster(brokers={len(self.broker_ids)}, {state})"


def librdkafka_version() -> str:
    """Version of the loaded librdkafka, e.g. '2.16.0' (for diagnostics)."""
    v = _library().rd_kafka_version()
    return f"{(v >> 24) & 0xFF}.{(v >> 16) & 0xFF}.{(v >> 8) & 0xFF}"


if __name__ == "__main__":  # quick manual check: python -m tests.support.mock_cluster
    with MockCluster(3) as mc:
        print(find_librdkafka(), librdkafka_version(), mc, file=sys.stdout)
