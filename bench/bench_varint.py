"""Varint reading: kio's native readers (what kafscale.protocol.varint uses) against the
hand-written loop the broker had before, per call including the tuple unpack.

    .venv/bin/python bench/bench_varint.py

Figures go in kafscale/protocol/varint.py's docstring.
"""

from __future__ import annotations

import timeit

SETUP = """
from kafscale.protocol.varint import read_uvarint, read_varlong

def hand_uvarint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise ValueError("varint too long")

def hand_zigzag(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
    return (result >> 1) ^ -(result & 1), pos

buf = bytes(b'\\x00' + b'\\x96\\x01' + b'\\x02' * 10 + b'\\xfe\\xff\\xff\\xff\\x0f')
"""

CASES = [
    ("zigzag 1 byte", "hand_zigzag(buf, 3)", "read_varlong(buf, 3)"),
    ("zigzag 5 bytes", "hand_zigzag(buf, 13)", "read_varlong(buf, 13)"),
    ("uvarint 1 byte", "hand_uvarint(buf, 3)", "read_uvarint(buf, 3)"),
    ("uvarint 2 bytes", "hand_uvarint(buf, 1)", "read_uvarint(buf, 1)"),
]


def per_call_ns(stmt: str, number: int = 300_000) -> float:
    return min(timeit.repeat(stmt, SETUP, number=number, repeat=5)) / number * 1e9


def main() -> None:
    for name, hand, kio in CASES:
        h, k = per_call_ns(hand), per_call_ns(kio)
        print(f"{name:16s} hand-written {h:5.0f} ns   kio {k:5.0f} ns   ratio {k / h:4.2f}")


if __name__ == "__main__":
    main()
