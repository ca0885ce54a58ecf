"""Blobs, manifests, the background writer, and the storage backends (local, S3) behind one protocol."""

from .backend import Backend, open_backend
from .blobs import BlobStore, blob_key
from .experiment import ExperimentStore, checkpoint_key
from .hashing import hash_bytes
from .local import LocalBackend
from .writer import BackgroundWriter

__all__ = [
    "BackgroundWriter", "Backend", "BlobStore", "ExperimentStore", "LocalBackend", "blob_key", "checkpoint_key",
    "hash_bytes", "open_backend",
]
