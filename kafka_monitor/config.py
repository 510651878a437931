"""Configuration: one TOML file, environment variables and command-line flags, in that order
of precedence (a flag beats the environment, which beats the file, which beats the default).

    [probe]                      # monitor.probe_config.ProbeConfig
    bootstrap_servers = "broker1:9092"
    interval_s = 10
    [probe.kafka]                # librdkafka properties for every client the probe creates
    "security.protocol" = "SASL_SSL"

    [job]                        # streaming.job.JobConfig
    checkpoint_dir = "/var/lib/kafka-monitor/checkpoint"
    [job.rules.lag]              # the alert rules' thresholds: lag, partition, group, client, source
    lag_high_offsets = 50000

Environment: ``KAFKA_MONITOR_<SECTION>_<SETTING>`` for a setting
(``KAFKA_MONITOR_PROBE_INTERVAL_S=5``) and ``KAFKA_MONITOR_<SECTION>_KAFKA_<PROPERTY>`` for a
librdkafka property, dots written as underscores (``KAFKA_MONITOR_PROBE_KAFKA_SASL_PASSWORD``);
``KAFKA_MONITOR_JOB_RULES_<FAMILY>_<SETTING>`` for a rule threshold
(``KAFKA_MONITOR_JOB_RULES_LAG_LAG_HIGH_OFFSETS=50000``).

Unknown settings are rejected, and every error names the setting and what is allowed; nothing
here opens a connection.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from typing import Any, Mapping, Optional, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

T = TypeVar("T")
ENV_PREFIX = "KAFKA_MONITOR_"


class ConfigError(ValueError):
    """A configuration error; the message names the setting."""


def read_file(path: Optional[str]) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML: {e}") from None


def _convert(section: str, name: str, typ: Any, value: Any) -> Any:
    path = f"{section}.{name}"
    origin = typing.get_origin(typ)
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if origin is typing.Union and len(args) == 1:
        if value is None or value == "":
            return None
        typ = args[0]
        origin = typing.get_origin(typ)
    if origin is dict and typing.get_origin(typing.get_args(typ)[1]) is dict:  # tables of settings
        if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
            raise ConfigError(f"{path}: must be tables of settings ([{path}.<name>] with key = value)")
        return {str(k): dict(v) for k, v in value.items()}
    if origin is dict or typ is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: must be a table of librdkafka properties (key = \"value\")")
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typ is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if typ is float:
            return float(value)
        if typ is str:
            if not isinstance(value, (str, int, float)):
                raise ValueError(value)
            return str(value)
    except (TypeError, ValueError):
        kind = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[typ]
        raise ConfigError(f"{path}: must be {kind}, got {value!r}") from None
    raise TypeError(f"unsupported setting type {typ!r} for {path}")


def _from_env(section: str, fields: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    prefix = f"{ENV_PREFIX}{section.upper()}_"
    out: dict[str, Any] = {}
    dict_fields = sorted((n for n, t in fields.items() if typing.get_origin(t) is dict or t is dict),
                         key=len, reverse=True)
    for key, value in env.items():
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix):].lower()
        for d in dict_fields:
            if rest.startswith(d + "_"):
                sub = rest[len(d) + 1:]
                if typing.get_origin(typing.get_args(fields[d])[1] if typing.get_args(fields[d]) else None) is dict:
                    table, _, name = sub.partition("_")  # RULES_LAG_LAG_HIGH_OFFSETS -> [rules.lag] lag_high_offsets
                    out.setdefault(d, {}).setdefault(table, {})[name] = value
                else:
                    out.setdefault(d, {})[sub.replace("_", ".")] = value
                break
        else:
            if (section, rest) in REMOVED:
                raise ConfigError(f"environment {key}: no longer a setting ({REMOVED[section, rest]}); unset it")
            if rest not in fields:
                raise ConfigError(f"environment {key}: {section} has no setting {rest!r} "
                                  f"(settings: {', '.join(sorted(fields))})")
            out[rest] = value
    return out


#: settings that were removed, and why: a file that still sets one is told so
REMOVED = {("probe", "stats_interval_s"): "leader epochs come with the offsets answers now, not the client's "
                                          "statistics"}


def build(cls: type[T], section: str, *, file_data: Optional[Mapping[str, Any]] = None,
          env: Optional[Mapping[str, str]] = None, flags: Optional[Mapping[str, Any]] = None) -> T:
    """Merge defaults < file < environment < flags into ``cls`` (a dataclass); validate types
    and unknown settings here, and the values with the class's own ``validate()``."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: hints[f.name] for f in dataclasses.fields(typing.cast(Any, cls))}
    merged: dict[str, Any] = {}
    from_file = dict((file_data or {}).get(section, {}))
    unknown = set(from_file) - set(fields)
    for name in sorted(unknown):
        if (section, name) in REMOVED:
            raise ConfigError(f"{section}.{name}: no longer a setting ({REMOVED[section, name]}); remove it")
    if unknown:
        raise ConfigError(f"{section}.{sorted(unknown)[0]}: unknown setting (settings: {', '.join(sorted(fields))})")
    for layer in (from_file, _from_env(section, fields, os.environ if env is None else env),
                  {k: v for k, v in (flags or {}).items() if v is not None}):
        for name, value in layer.items():
            if name not in fields:
                raise ConfigError(f"{section}.{name}: unknown setting")
            value = _convert(section, name, fields[name], value)
            if isinstance(value, dict) and isinstance(merged.get(name), dict):
                old = merged[name]  # property tables merge key by key; tables of tables, table by table
                value = {**old, **{k: ({**old[k], **v} if isinstance(v, dict) and isinstance(old.get(k), dict) else v)
                                   for k, v in value.items()}}
            merged[name] = value
    required = [f.name for f in dataclasses.fields(typing.cast(Any, cls))
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for name in required:
        if name not in merged:
            raise ConfigError(f"{section}.{name}: required (give the flag, the environment variable "
                              f"{ENV_PREFIX}{section.upper()}_{name.upper()}, or set it in the [{section}] "
                              f"table of the config file)")
    obj = cls(**merged)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return obj
