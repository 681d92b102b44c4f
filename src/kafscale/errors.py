"""Kafka error codes and the one exception that carries them to the handlers.

Every Kafka error code the broker answers comes from `ErrorCode` (kio's enum of the
protocol's codes, re-exported here): `ErrorCode.not_leader_or_follower` is an int equal
to 6 on the wire and knows whether clients retry it (`.retriable`, Apache Kafka's
classification: a code is retriable when its exception is a `RetriableException`).

Storage, protocol validation, topic administration and request validation raise
`KafkaError(code, message)` (or a subclass, where a layer catches its own family); a
handler answers with `.code` and `str(error)`. The shape is aiokafka's `errors.py` and
franz-go's `kerr`: one error type, one table of codes.

What the metadata and object stores raise (MetadataUnavailable, ConflictError,
ObjectStoreError) are not Kafka errors: the code a store failure is answered with depends
on the request (KAFKA_STORAGE_ERROR for a produce, COORDINATOR_NOT_AVAILABLE for an offset
commit, REQUEST_TIMED_OUT for an admin change), so the layer that knows turns it into one.

This module imports nothing of kafscale, so every layer can import it.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError", "retriable"]


def retriable(code: int) -> bool:
    """Whether clients retry a request answered with `code` (False for an unknown code)."""
    try:
        return ErrorCode(code).retriable
    except ValueError:
        return False


class KafkaError(Exception):
    """A request (or part of one) refused with a Kafka error code.

    `code` is the ErrorCode to answer with (an int on the wire); `error_code` is the same
    value under the name the response schemas use; str(error) is the message."""

    def __init__(self, code: ErrorCode | int, message: str = ""):
        # ErrorCode(code) refuses an int that is no Kafka error code (ValueError): a code
        # that does not exist must fail where it is written, not on the client.
        self.code = ErrorCode(code)
        self.message = message or self.code.name
        super().__init__(self.message)

    @property
    def error_code(self) -> ErrorCode:
        return self.code

    @property
    def retriable(self) -> bool:
        return self.code.retriable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.name}, {self.message!r})"

    def __reduce__(self):
        # Subclasses keep their own argument order (StorageError(message, code)), so a
        # pickled error is rebuilt from its attributes, not by calling the class again.
        return _rebuild, (type(self), self.code, self.message), self.__dict__


def _rebuild(cls: type[KafkaError], code: ErrorCode, message: str) -> KafkaError:
    error = cls.__new__(cls)
    KafkaError.__init__(error, code, message)
    return error
