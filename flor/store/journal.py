"""The spool journal: what has been uploaded to one spool URL and verified there.

One JSON line per object, ``NAME/spool/<bucket>-<id>.jsonl``, appended after verification.
It is what makes ``flor spool`` resumable and eviction safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from .._files import StoreFileError, lines, open_append, read_lines, read_text
from ..errors import ConfigError, StorageError, warn
from ..settings import parse_s3_url
from .ids import contained

__all__ = ["SpoolJournal", "spooled_to"]


class SpoolJournal:
    """What has been uploaded to one spool URL and verified there, one JSON line per object.

    Lines are appended after verification; a torn last line (a crash while writing) is
    ignored, which at worst costs one more HEAD or upload on resume.
    """

    def __init__(self, root: Path, url: str) -> None:
        bucket, _ = parse_s3_url(url)
        self.url = url
        self.path = Path(root) / "spool" / f"{bucket}-{hashlib.sha1(url.encode()).hexdigest()[:10]}.jsonl"
        self.done: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()
        self._fh: Any = None
        #: why the journal is neither read nor written (``spool/`` planted as a link out of the store)
        self.refused = None if contained(self.path, Path(root), parent_only=True) else (
            f"{self.path.parent} leads out of the store through a symbolic link (to "
            f"{os.path.realpath(self.path.parent)}); remove the link")
        if self.refused:
            warn("FL411", f"ignoring the spool journal: {self.refused}; what it listed is checked in the bucket again")
            return
        try:
            text = read_text(self.path)  # a regular file of at most MAX_METADATA, no link followed
        except FileNotFoundError:
            text = ""
        except OSError as exc:  # a FIFO, a link, a huge file put in its place: start a fresh record of uploads
            warn("FL411", f"ignoring the spool journal {exc.strerror if isinstance(exc, StoreFileError) else exc}; "
                 "what it listed is checked in the bucket again")
            text = ""
        if text:
            for line in text.splitlines():
                try:
                    rec = json.loads(line)
                    if "k" in rec:
                        self.done[rec["k"]] = (int(rec["n"]), str(rec["h"]))
                except (ValueError, KeyError, TypeError):
                    continue

    def has(self, key: str, size: int | None = None, digest: str | None = None) -> bool:
        entry = self.done.get(key)
        if entry is None:
            return False
        return (size is None or entry[0] == size) and (digest is None or entry[1] == digest)

    def add(self, key: str, size: int, digest: str) -> None:
        with self._lock:
            self.done[key] = (size, digest)
            if self.refused:
                raise StorageError(f"cannot write the spool journal {self.path}: {self.refused}")
            try:
                if self._fh is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    new = not self.path.exists()
                    self._fh = os.fdopen(open_append(self.path), "a", encoding="utf-8")  # never through a link
                    if new:
                        self._fh.write(json.dumps({"url": self.url}) + "\n")
                self._fh.write(json.dumps({"k": key, "n": size, "h": digest}, separators=(",", ":")) + "\n")
                self._fh.flush()
            except OSError as exc:
                raise StorageError(f"cannot write the spool journal {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                try:
                    self._fh.flush()
                    os.fsync(self._fh.fileno())
                finally:
                    self._fh.close()
                    self._fh = None


def spooled_to(root: Path, run: str) -> list[str]:
    """The spool URLs whose journals under ``root`` hold ``run``'s ``run.json``: where
    ``flor spool`` put the run (after the fact, so ``run.json`` names no spool). Read from the
    store, so untrusted: the caller trusts a URL only as ``flor.store.trust.spool_trusted`` says."""
    found = []
    if not contained(Path(root) / "spool", Path(root)):  # a link planted in its place: not read through
        return []
    try:
        names = sorted(e.name for e in os.scandir(Path(root) / "spool") if e.name.endswith(".jsonl"))
    except OSError:
        return []
    for name in names:
        try:
            with read_lines(Path(root) / "spool" / name) as fh:
                first = next(lines(fh), b"")
            url = json.loads(first).get("url")
            parse_s3_url(url)
        except (OSError, ValueError, AttributeError, ConfigError):
            continue  # not a journal flor wrote: ignored here, as the spooler ignores it
        journal = SpoolJournal(root, url)
        if journal.path.name == name and journal.has(f"runs/{run}/run.json"):
            found.append(url)
    return found
