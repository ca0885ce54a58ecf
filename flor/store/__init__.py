"""Blobs, manifests, the background writer and the local backend."""

from .blobs import BlobStore, blob_key
from .experiment import ExperimentStore, checkpoint_key
from .hashing import hash_bytes
from .local import LocalBackend
from .writer import BackgroundWriter

__all__ = ["BackgroundWriter", "BlobStore", "ExperimentStore", "LocalBackend", "blob_key", "checkpoint_key", "hash_bytes"]
