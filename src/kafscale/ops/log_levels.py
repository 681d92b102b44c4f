"""This broker's logger levels as Kafka's BROKER_LOGGER config resource shows and changes
them (DescribeConfigs, IncrementalAlterConfigs; `kafka-configs --entity-type broker-loggers`):
every logger of the process plus `root`, with log4j level names. Changes are not persisted
(Kafka's are not either) and apply to this broker only.

log4j -> Python: TRACE and ALL are DEBUG, WARN is WARNING, FATAL is CRITICAL, OFF is above
CRITICAL; levels are reported back with the log4j names (a TRACE level reads back DEBUG)."""

from __future__ import annotations

import logging

from kafscale.errors import ErrorCode, KafkaError

ROOT = "root"
OFF = logging.CRITICAL + 10
TO_PYTHON = {"ALL": logging.DEBUG, "TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
             "ERROR": logging.ERROR, "FATAL": logging.CRITICAL, "OFF": OFF}
SET, DELETE = 0, 1


def _name(level: int) -> str:
    if level > logging.CRITICAL:
        return "OFF"
    if level >= logging.CRITICAL:
        return "FATAL"
    if level >= logging.ERROR:
        return "ERROR"
    if level >= logging.WARNING:
        return "WARN"
    if level >= logging.INFO:
        return "INFO"
    return "DEBUG" if level > logging.NOTSET else "ALL"


def _loggers() -> dict[str, logging.Logger]:
    out = {ROOT: logging.getLogger()}
    out.update({n: lg for n, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)})
    return out


def levels() -> dict[str, str]:
    """Every logger's effective level, by name (`root` for the root logger)."""
    return {name: _name(lg.getEffectiveLevel()) for name, lg in sorted(_loggers().items())}


def change(ops: list[tuple[str, int, str | None]], validate_only: bool = False) -> None:
    """Apply (logger, SET/DELETE, level) operations, all checked first; KafkaError with
    Kafka's code (INVALID_CONFIG for an unknown logger or level; INVALID_REQUEST for a null
    value, APPEND/SUBTRACT or deleting root's level)."""
    loggers = _loggers()
    for name, op, value in ops:
        if op == SET and value is None:
            raise KafkaError(ErrorCode.invalid_request, f"null value not supported for {name}")
        if name not in loggers:
            raise KafkaError(ErrorCode.invalid_config, f"logger {name} does not exist")
        if op not in (SET, DELETE):
            raise KafkaError(ErrorCode.invalid_request, f"operation {op} is not supported for broker loggers (only SET and DELETE)")
        if op == SET and value.upper() not in TO_PYTHON:
            raise KafkaError(ErrorCode.invalid_config, f"cannot set logger {name} to {value!r}: valid levels are {', '.join(TO_PYTHON)}")
        if op == DELETE and name == ROOT:
            raise KafkaError(ErrorCode.invalid_request, "removing the level of the root logger is not allowed")
    if validate_only:
        return
    for name, op, value in ops:
        loggers[name].setLevel(TO_PYTHON[value.upper()] if op == SET else logging.NOTSET)
