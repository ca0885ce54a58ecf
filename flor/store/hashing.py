"""Content hashes for blobs: xxh3-128, hex. Fast enough that addressing costs less than writing."""

from __future__ import annotations

import xxhash

__all__ = ["HASH_NAME", "hash_bytes"]

HASH_NAME = "xxh3_128"


def hash_bytes(data: bytes | bytearray | memoryview) -> str:
    """The hex content hash of ``data`` (any object with the buffer protocol)."""
    return xxhash.xxh3_128_hexdigest(data)
