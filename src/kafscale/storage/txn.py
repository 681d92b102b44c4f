"""The marker contract between the transaction coordinator and the partitions (docs/transactions.md).

The coordinator decides a transaction's outcome; every partition in the transaction then gets one
end-transaction control batch (COMMIT or ABORT) for the producer, appended by the partition's owner
(`LogManager.write_txn_markers`, or WriteTxnMarkers from another broker).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TxnMarker:
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool  # True: COMMIT control record, False: ABORT
    partitions: list[tuple[str, int]] = field(default_factory=list)
