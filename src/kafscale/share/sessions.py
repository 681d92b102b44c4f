"""Share sessions (KIP-932): the share session cache of one broker, without I/O.

A share consumer keeps one session per broker (its group and member id): a ShareFetch at
epoch 0 opens it with the partitions it names, later requests carry the next epoch and
add partitions (the ones they name) or drop them (ForgottenTopicsData), and epoch -1
closes it, after which the member's acquired records in those partitions are released
(the driver does that); so does the close of the connection it was opened on (Kafka 4.1). Kafka's errors: a request at any other epoch than the session's is
INVALID_SHARE_SESSION_EPOCH, one for a member without a session SHARE_SESSION_NOT_FOUND;
a ShareAcknowledge cannot open a session (epoch 0: INVALID_SHARE_SESSION_EPOCH); and when
the cache is full, SHARE_SESSION_LIMIT_REACHED. Sessions idle longer than `idle_ms` are
evicted (their records' locks time out by themselves)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kafscale.errors import ErrorCode, KafkaError

INITIAL_EPOCH = 0
FINAL_EPOCH = -1

SessionKey = tuple[str, str]  # (group id, member id)
Partition = tuple[str, int]  # (topic id, partition)


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= 2**31 - 1 else epoch + 1


@dataclass(slots=True)
class ShareSession:
    key: SessionKey
    epoch: int  # the epoch the next request must carry
    partitions: set[Partition] = field(default_factory=set)
    last_used: float = 0.0
    connection: str = ""  # the client connection it was opened on (it ends with it, as in Kafka 4.1)


class ShareSessionCache:
    def __init__(self, max_sessions: int = 2_000, idle_ms: int = 45_000):
        self.max_sessions = max_sessions
        self.idle_ms = idle_ms
        self.sessions: dict[SessionKey, ShareSession] = {}

    def fetch(self, key: SessionKey, epoch: int, now: float, add: set[Partition], forget: set[Partition],
              fetching: bool, connection: str = "") -> tuple[ShareSession, bool]:
        """A ShareFetch's session: (session, closing). `fetching`: it asks for records
        (a closing request may only acknowledge)."""
        if epoch == INITIAL_EPOCH:
            self.evict_idle(now)
            if key not in self.sessions and len(self.sessions) >= self.max_sessions:
                raise KafkaError(ErrorCode.share_session_limit_reached,
                                 f"The share session cache is full ({self.max_sessions} sessions).")
            session = ShareSession(key, next_epoch(INITIAL_EPOCH), set(add) - forget, now, connection)
            self.sessions[key] = session  # (a member opening again starts a new session)
            return session, False
        if epoch == FINAL_EPOCH:
            if fetching:
                raise KafkaError(ErrorCode.invalid_request, "A ShareFetch closing its session cannot fetch records.")
            return self.close(key), True
        session = self._current(key, epoch)
        session.partitions |= add
        session.partitions -= forget
        session.epoch = next_epoch(epoch)
        session.last_used = now
        return session, False

    def acknowledge(self, key: SessionKey, epoch: int, now: float) -> tuple[ShareSession, bool]:
        """A ShareAcknowledge's session: (session, closing)."""
        if epoch == INITIAL_EPOCH:
            raise KafkaError(ErrorCode.invalid_share_session_epoch, "A ShareAcknowledge cannot open a share session.")
        if epoch == FINAL_EPOCH:
            return self.close(key), True
        session = self._current(key, epoch)
        session.epoch = next_epoch(epoch)
        session.last_used = now
        return session, False

    def close(self, key: SessionKey) -> ShareSession:
        session = self.sessions.pop(key, None)
        if session is None:
            raise KafkaError(ErrorCode.share_session_not_found, f"No share session for member {key[1]} of group {key[0]}.")
        return session

    def _current(self, key: SessionKey, epoch: int) -> ShareSession:
        session = self.sessions.get(key)
        if session is None:
            raise KafkaError(ErrorCode.share_session_not_found, f"No share session for member {key[1]} of group {key[0]}.")
        if epoch != session.epoch:
            raise KafkaError(ErrorCode.invalid_share_session_epoch,
                             f"Share session epoch {epoch} is not the expected {session.epoch}.")
        return session

    def on_connection(self, connection: str) -> list[ShareSession]:
        """The sessions opened on a connection that closed: removed."""
        gone = [s for s in self.sessions.values() if s.connection and s.connection == connection]
        for s in gone:
            del self.sessions[s.key]
        return gone

    def evict_idle(self, now: float) -> list[ShareSession]:
        gone = [s for s in self.sessions.values() if now - s.last_used >= self.idle_ms]
        for s in gone:
            del self.sessions[s.key]
        return gone
