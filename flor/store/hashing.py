"""Content hashes for blobs: xxh3-128, hex. Fast enough that addressing costs less than writing."""

from __future__ import annotations

import xxhash

__all__ = ["HASH_NAME", "hash_bytes"]

HASH_NAME = "xxh3_128"


#: the hex content hash of ``data`` (any object with the buffer protocol); xxhash's own function,
#: not a wrapper: the writer hashes each leaf of a checkpoint (~40 for a small CNN)
hash_bytes = xxhash.xxh3_128_hexdigest
