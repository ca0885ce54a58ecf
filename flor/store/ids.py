"""The grammar of every identifier that a store or a bucket names, checked before it touches the filesystem.

A store or a spool may be shared, so each name read from one (a blob hash in a manifest, a
run id listed in a bucket, a block folder, a checkpoint file, a replay id in a launch record,
an S3 key below a run's prefix) is untrusted input. Each kind has one grammar here, and the
store layer checks names against it where they enter; ``contained`` then makes sure that a
path, once resolved (symlinks followed), still lies inside the store.

>>> is_blob_hash("0" * HASH_HEX_LEN), is_blob_hash("../../etc/passwd")
(True, False)
>>> check_key("runs/r1/checkpoints/train/3.json")
'runs/r1/checkpoints/train/3.json'
>>> bad_key_reason("runs/r1/../../x")
"a '..' segment"
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StorageError
from .hashing import hash_bytes

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10+: annotations only

__all__ = [
    "HASH_HEX_LEN", "bad_key_reason", "check_blob_hash", "check_key", "check_run_id", "contained", "is_blob_hash",
    "is_block_name", "is_checkpoint_file", "is_replay_id", "is_run_id",
]

#: the length of a blob hash: lowercase hex, as ``flor.store.hashing.hash_bytes`` writes it
HASH_HEX_LEN = len(hash_bytes(b""))
_HASH = re.compile(rf"^[0-9a-f]{{{HASH_HEX_LEN}}}$")
#: run ids are ``20261130T050012.123456-1a2b3c`` (``flor.engine.session.new_run_id``); any one path
#: component of this alphabet is accepted, so copied or hand-named runs still open
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
#: SkipBlock names (``step_into(name)``): also a folder name under ``checkpoints/``
_BLOCK = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
#: ``checkpoints/<block>/<file>``: the epoch (or ``outside``), ``-K`` for the K-th repeat, ``.json``
_CHECKPOINT = re.compile(r"^(outside|0|[1-9][0-9]{0,8})(-[1-9][0-9]{0,5})?\.json$")
#: replay ids (``flor.placement.new_replay_id``, or ``FLOR_REPLAY_ID``)
_REPLAY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def is_blob_hash(text: object) -> TypeGuard[str]:
    return isinstance(text, str) and _HASH.match(text) is not None


def is_run_id(text: object) -> TypeGuard[str]:
    return isinstance(text, str) and _RUN.match(text) is not None and ".." not in text


def is_block_name(text: object) -> bool:
    return isinstance(text, str) and _BLOCK.match(text) is not None


def is_checkpoint_file(text: object) -> bool:
    """``3.json``, ``3-1.json``, ``outside.json``; not ``03.json``, ``+3.json`` or ``../3.json``."""
    return isinstance(text, str) and _CHECKPOINT.match(text) is not None


def is_replay_id(text: object) -> bool:
    return isinstance(text, str) and _REPLAY.match(text) is not None


def check_blob_hash(digest: object, where: str = "") -> str:
    """``digest`` if it is a blob hash, else a StorageError naming it (and ``where`` it was read)."""
    if not is_blob_hash(digest):
        raise StorageError(
            f"invalid blob hash {digest!r:.80}{' in ' + where if where else ''}: a blob hash is "
            f"{HASH_HEX_LEN} lowercase hex digits; the manifest was damaged or tampered with, so that "
            "checkpoint cannot be used (`flor verify NAME` lists every problem)")
    return digest


def check_run_id(run: object, where: str = "") -> str:
    if not is_run_id(run):
        raise StorageError(
            f"invalid run id {run!r:.80}{' in ' + where if where else ''}: a run id is one name of letters, "
            "digits, '.', '_', '+' or '-' (like 20261130T050012.123456-1a2b3c); it is ignored")
    return run


_CONTROL = re.compile("[\x00-\x1f\x7f]")  # a regular expression: a per-character loop cost the writer ~15 us a key
_DRIVE = re.compile(r"[A-Za-z]:")


def bad_key_reason(key: object) -> str | None:
    """Why ``key`` is not a safe relative store key (``a/b/c``), or None when it is.

    Refused: absolute keys, backslashes, NUL and other control characters, empty segments
    (``a//b``, a trailing ``/``), ``.`` and ``..`` segments.
    """
    if not isinstance(key, str) or not key:
        return "an empty key"
    if key.startswith("/"):
        return "an absolute path"
    if "\\" in key:
        return "a backslash"
    if "\0" in key:
        return "a NUL byte"
    if _CONTROL.search(key):
        return "a control character"
    parts = key.split("/")
    if "" in parts:
        return "an empty segment"
    if ".." in parts:
        return "a '..' segment"
    if "." in parts:
        return "a '.' segment"
    if _DRIVE.match(parts[0]):
        return "a drive letter"
    return None


def check_key(key: str) -> str:
    """``key`` if it is a safe relative key, else a StorageError naming it and why."""
    reason = bad_key_reason(key)
    if reason is not None:
        raise StorageError(f"refusing the store key {key!r:.120}: it has {reason}, so it could name a file "
                           "outside the store; the store or bucket holds a damaged or planted name")
    return key


def contained(path: Path, root: Path, *, parent_only: bool = False) -> bool:
    """Whether ``path`` lies inside ``root`` once both are resolved (symlinks followed).

    With ``parent_only``, only the folder holding ``path`` is resolved: right for a write
    (``os.replace`` replaces a symlink at ``path`` itself) and an unlink (which removes the
    link, not its target).
    """
    try:
        base = root.resolve()
        target = path.parent.resolve() / path.name if parent_only else path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return False
    return target == base or target.is_relative_to(base)
