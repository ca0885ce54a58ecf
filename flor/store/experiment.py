"""The layout of one experiment folder, ``FLOR_HOME/NAME``: runs, checkpoints and blobs.

All paths inside are relative to the experiment folder, so a copied or moved store still
replays.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterator, Sequence

from .._files import MAX_METADATA
from ..errors import CheckpointError, ConfigError, ReplayError, StorageError, warn
from ..settings import SETTINGS, validate_name
from .blobs import BlobStore, RemoteFetcher
from .ids import check_run_id, contained, is_block_name, is_checkpoint_file, is_run_id
from .layout import RunLayout
from .manifest import check_manifest
from .local import TMP_PREFIX, LocalBackend, remove_stale_tmp
from .runmeta import RunMeta

__all__ = [
    "ExperimentStore", "blob_hashes", "checkpoint_key", "dir_size", "open_experiment", "parse_checkpoint_key",
    "pick_run",
]

#: the most JSON objects and lists one metadata file (run.json, a manifest) may hold: a real manifest
#: holds a few per leaf; 60 MB of ``{}`` would cost GBs to parse
MAX_NODES = 2_000_000
#: the deepest nesting of objects and lists one metadata file may have (flor's own: a few dozen)
MAX_DEPTH = 256


def _deeper_than(obj: Any, depth: int) -> bool:
    """Whether ``obj`` nests dicts and lists more than ``depth`` levels (walked without recursion).

    >>> _deeper_than([[[]]], 2), _deeper_than({"a": [1, {"b": 2}]}, 3)
    (True, False)
    """
    stack = [(obj, 1)]
    while stack:
        cur, level = stack.pop()
        if level > depth:
            return True
        children = cur.values() if isinstance(cur, dict) else cur
        stack.extend((c, level + 1) for c in children if isinstance(c, (dict, list)))
    return False

_BLOCK_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def checkpoint_key(epoch: int | None, occurrence: int) -> str:
    """File stem of a checkpoint: the epoch (``outside`` for blocks outside ``flor.it``),
    with ``-K`` for the K-th repeat of the same block within one epoch."""
    base = "outside" if epoch is None else str(epoch)
    return base if occurrence == 0 else f"{base}-{occurrence}"


def parse_checkpoint_key(stem: str) -> tuple[int | None, int]:
    """``(epoch, occurrence)`` of a checkpoint file stem; ValueError for any other name.

    >>> parse_checkpoint_key("3-1"), parse_checkpoint_key("outside")
    ((3, 1), (None, 0))
    """
    if not is_checkpoint_file(f"{stem}.json"):
        raise ValueError(f"not a checkpoint file name: {stem!r}")
    base, _, occ = stem.partition("-")
    return (None if base == "outside" else int(base)), int(occ or 0)


def blob_hashes(node: Any, out: set[str] | None = None) -> set[str]:
    """Every blob hash a manifest (or part of one) names."""
    out = set() if out is None else out
    if isinstance(node, dict):
        if isinstance(node.get("h"), str):
            out.add(node["h"])
        for v in node.values():
            blob_hashes(v, out)
    elif isinstance(node, list):
        for v in node:
            blob_hashes(v, out)
    return out


def dir_size(path: Path) -> int:
    """Bytes of every file under ``path`` (links not followed), writes in progress (``.tmp-*``) not counted."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            if f.startswith(TMP_PREFIX):
                continue
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def pick_run(run: str | None, runs: list[str], name: str, where: str) -> str:
    """The run ``run`` names among ``runs`` (exactly or by unique prefix), or the latest.

    The one rule for choosing a run, local (``ExperimentStore.resolve_run``) or spooled.

    >>> pick_run("2026", ["20250101T0-a", "20260101T0-b"], "demo", "here")
    '20260101T0-b'
    """
    if not runs:
        raise ReplayError(f"nothing recorded for {name!r} {where}: record first with "
                          f"`python SCRIPT.py --flor {name}`, or check FLOR_HOME (and FLOR_SPOOL)")
    if run is None or run == "latest":
        return runs[-1]
    matches = [r for r in runs if r == run or r.startswith(run)]
    if len(matches) != 1:
        raise ReplayError(f"run {run!r} of {name} is {'ambiguous' if matches else 'unknown'} {where}; "
                          f"the runs are: {', '.join(runs[-10:])}")
    return matches[0]


def dumps(obj: Any) -> bytes:
    return _text(obj).encode()


def _text(obj: Any) -> str:
    """The store's JSON text of ``obj`` (``dumps``, and ``GrowingDumps``' pieces)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=True)


class GrowingDumps:
    """``dumps`` of a document rewritten as it grows (run.json), its long lists and dicts encoded
    once: a list or dict of ``LONG`` items or more, in a dict at most ``DEPTH`` levels down, keeps
    the text of its items and a copy of them, and where the same object still starts with those
    items (compared by ``==``: the same objects compare at once) only the items after them are
    encoded. A loop of short epochs (a block per iteration, docs/loops.md) grows run.json by a
    few list items and a dict entry an epoch; encoding all of it at every write made a recording
    quadratic in its epochs. The text is ``dumps``' exactly.

    Items are taken as unchanged once added where they are the same objects (a list held in a
    dict entry and changed in place afterwards is not seen): run.json's growing containers
    (epoch lists, per-epoch timings, the epochs' blocks) only append, and a list's end may be
    popped (the policy's ``replay_epochs``): the last ``TAIL`` items are encoded at every write,
    and a change before them is seen by the comparison (the whole container encoded again).

    >>> g, doc = GrowingDumps(), {"a": list(range(3000)), "b": {"x": 1}}
    >>> g(doc) == dumps(doc); doc["a"].append(0.5); _ = doc["a"].pop(0); g(doc) == dumps(doc)
    True
    True
    """

    LONG = 512
    DEPTH = 3
    TAIL = 16

    def __init__(self) -> None:
        self._token = f"flor-splice-{os.urandom(8).hex()}-"
        self._cache: dict[tuple, tuple[Any, list[list], str]] = {}  # path -> (container, its items then, their text)

    def __call__(self, obj: Any) -> bytes:
        if type(obj) is not dict:
            return dumps(obj)
        bodies: list[str] = []
        text = _text(self._swapped(obj, (), bodies))
        if bodies:  # each placeholder once, in order: one pass
            parts = text.split(f'"{self._token}')
            out = [parts[0]]
            for part in parts[1:]:
                index, _, rest = part.partition('"')
                out += (bodies[int(index)], rest)
            text = "".join(out)
        return text.encode()

    def _swapped(self, obj: dict, path: tuple, bodies: list[str]) -> dict:
        """``obj`` with its long containers as placeholders (their text in ``bodies``)."""
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            kind = type(value)
            if (kind is list or kind is dict) and len(value) >= self.LONG:
                out[key] = f"{self._token}{len(bodies)}"
                bodies.append(self._encoded((*path, key), value))
            elif kind is dict and len(path) < self.DEPTH:
                out[key] = self._swapped(value, (*path, key), bodies)
            else:
                out[key] = value
        return out

    def _encoded(self, path: tuple, container: Any) -> str:
        # a dict as its keys and its values: two lists, no tuple an item (a dict of many epochs made
        # that many tuples a write, and the collector's passes over them cost more than encoding)
        is_list = type(container) is list
        items = [container] if is_list else [list(container), list(container.values())]
        cached = self._cache.get(path)
        done, text = 0, ""
        if cached is not None and cached[0] is container:
            known = cached[1]
            n = len(known[0])
            if len(items[0]) >= n and all(now[:n] == then for now, then in zip(items, known)):
                done, text = n, cached[2]
        # the last TAIL items are encoded at every write, not kept: a list's end taken back (popped)
        # and grown again leaves the kept part as it was
        keep = max(len(items[0]) - self.TAIL, done)
        text = self._joined(text, [part[done:keep] for part in items], is_list)
        self._cache[path] = (container, [part[:keep] for part in items], text)
        text = self._joined(text, [part[keep:] for part in items], is_list)
        return f"[{text}]" if is_list else f"{{{text}}}"

    @staticmethod
    def _joined(text: str, new: list[list], is_list: bool) -> str:
        if not new[0]:
            return text
        more = _text(new[0] if is_list else dict(zip(new[0], new[1])))[1:-1]
        return f"{text},{more}" if text else more


class ExperimentStore:
    """One experiment: ``objects/`` shared by its ``runs/<run-id>/``."""

    def __init__(self, home: Path, name: str, *, remote: RemoteFetcher | None = None) -> None:
        self.name = name
        self.root = Path(home) / name
        self.backend = LocalBackend(self.root)
        #: ``remote``: where blobs missing here come from (``flor.store.sync.RemoteBlobs`` in a replay)
        self.blobs = BlobStore(self.backend, remote=remote)

    # -- runs --------------------------------------------------------------------------

    def exists(self) -> bool:
        return (self.root / "runs").is_dir() and contained(self.root / "runs", self.root)

    def no_runs(self) -> str:
        """Why ``runs()`` is empty, for the error a command gives: no such experiment, or one
        whose run folders hold no run.json (a recording killed before it wrote one)."""
        if self.exists():
            return (f"experiment {self.name!r} under {self.root.parent} has no run to read: no run folder holds a "
                    f"run.json (a recording killed, or stopped by a full disk, before it wrote one); "
                    f"`flor verify {self.name}` checks them")
        return f"no experiment {self.name!r} under {self.root.parent}; `flor ls` lists them"

    def runs(self) -> list[str]:
        """Run ids, oldest first (they sort by start time).

        A folder of any other name is not a run; one linked to a place outside the store (planted
        in a shared store) is left out with one warning naming it."""
        base = self.root / "runs"
        if not self.exists():
            return []
        out = []
        for p in base.iterdir():
            if not is_run_id(p.name):
                continue
            if p.is_symlink() and not contained(p, self.root):
                warn("FL401", f"skipped run folder {p}: it leads out of the store {self.root} through a symbolic link "
                     f"(to {os.path.realpath(p)}); remove the link (`flor verify {self.name}` lists such problems)")
                continue
            if os.path.lexists(p / "run.json"):  # one that is not a file (a FIFO, a link) is reported by its readers
                out.append(p.name)
            elif p.is_dir() and not os.access(p, os.R_OK | os.X_OK):  # lexists() was False: it cannot tell
                warn("FL417", f"skipped run {p.name} of {self.name}: its folder {p} cannot be read by you; "
                     "ask its owner to make it readable (`flor verify` also names it)")
        return sorted(out)

    def resolve_run(self, run: str | None) -> str:
        """The run ``run`` names, or the latest; a clear error when there is none."""
        return pick_run(run, self.runs(), self.name, f"under {self.root} (FLOR_HOME={self.root.parent})")

    def replay_run(self, run: str | None) -> tuple[str, str | None]:
        """The run a replay of ``run`` uses, and a note when it is not simply the latest.

        Named runs are taken as named. For "the latest", runs that recorded nothing (no epoch,
        no checkpoint, no logged value: a script that stopped before its loop, or a recording
        that never got going) are passed over for the newest earlier run that recorded
        something, since replaying an empty run checks nothing. When every run is empty, the
        latest is used.
        """
        chosen = self.resolve_run(run)
        if run not in (None, "latest"):
            return chosen, None
        empty: list[tuple[str, str]] = []  # (run, why it counts as empty)
        for candidate in reversed(self.runs()):
            why = self.recorded_nothing(candidate)
            if why is None:
                break
            empty.append((candidate, why))
        else:
            return chosen, None
        if not empty:
            return chosen, None
        skipped = f"the latest run {empty[0][0]} ({empty[0][1]})" if len(empty) == 1 else \
            f"the {len(empty)} latest runs ({', '.join(r for r, _ in empty[:3])}{', ...' if len(empty) > 3 else ''})"
        return candidate, (f"{skipped} of {self.name} recorded nothing (no epoch, checkpoint or logged value); "
                           f"replaying {candidate}, the latest run that did (--flor_run RUN picks a run)")

    def recorded_nothing(self, run: str) -> str | None:
        """Why ``run`` counts as empty (its status, or that it has no run.json), or None when it
        finished an epoch, committed a checkpoint or logged a value, or its run.json is damaged
        (the replay then names the damage)."""
        key = self.run_key(run, "run.json")
        if not self.backend.path(key).exists():
            return "no run.json"
        try:
            meta = self.read_run(run)
        except Exception:  # noqa: BLE001 - a damaged run.json is reported where the run is replayed
            return None
        if meta.epochs_done or next(self.manifests(run), None) is not None:
            return None
        log = self.layout(run).record_log
        return None if log.is_file() and log.stat().st_size else f"status {meta.status}"

    def run_key(self, run: str, *parts: str) -> str:
        return "/".join(("runs", check_run_id(run), *parts))

    def run_path(self, run: str, *parts: str) -> Path:
        return self.root / self.run_key(run, *parts)

    def read_json(self, key: str) -> Any:
        data = self.backend.read(key, limit=MAX_METADATA)
        nodes = data.count(b"{") + data.count(b"[")  # an upper bound on the objects and lists parsed, in C
        if nodes > MAX_NODES:
            raise StorageError(f"{self.backend.path(key)} holds {nodes} JSON objects and lists, more than flor reads "
                               f"({MAX_NODES}; each costs memory to parse): it was damaged or planted")
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested past what the parser takes
            raise StorageError(f"{self.backend.path(key)} is not valid JSON ({type(exc).__name__}: {exc}); "
                               "it was damaged") from exc
        if nodes > MAX_DEPTH and _deeper_than(obj, MAX_DEPTH):  # the readers walk it recursively
            raise StorageError(f"{self.backend.path(key)} nests JSON deeper than {MAX_DEPTH} levels, deeper than "
                               "flor writes: it was damaged or planted")
        return obj

    def write_json(self, key: str, obj: Any, *, durable: bool = True) -> None:
        self.backend.write(key, dumps(obj), durable=durable)

    def read_run(self, run: str) -> RunMeta:
        """The run's ``run.json``, checked and typed: a damaged one is a StorageError naming the
        run, what is wrong and how to set the run aside."""
        key = self.run_key(run, "run.json")
        try:
            return RunMeta.from_json(self.read_json(key), str(self.backend.path(key)))
        except StorageError as exc:
            raise StorageError(f"run {run} of {self.name}: {exc}; to set the run aside, move {self.run_path(run)} "
                               f"out of {self.root / 'runs'} (`flor verify {self.name}` lists every problem)") from exc

    def readable_runs(self, runs: Sequence[str] | None = None) -> list[str]:
        """The runs among ``runs`` (default: every run) whose ``run.json`` reads, in order.

        A store is untrusted input and one damaged run must not hide the others from the
        commands that list or aggregate runs: each damaged one is left out with one warning
        that names it, what is wrong and what to do. A command that names a run reads it with
        ``read_run`` and gets the error instead.
        """
        out = []
        for run in self.runs() if runs is None else runs:
            try:
                self.read_run(run)
            except StorageError as exc:
                warn("FL402", f"skipped {exc}")
            else:
                out.append(run)
        return out

    def layout(self, run: str) -> RunLayout:
        """The file names of ``run``'s directory."""
        return RunLayout(self.run_path(run))

    def select_runs(self, run: str | Sequence[str] | None) -> list[str]:
        """Run ids: the latest for None, every run for ``"all"``, else each id or unique prefix given.

        For ``"all"`` and the latest, damaged runs are skipped with a warning
        (``readable_runs``); the latest is then the newest run that reads. Runs named by id or
        prefix are returned as named: reading a damaged one is the caller's error.
        """
        if run == "all" or (run is not None and not isinstance(run, str) and "all" in run):
            return self._some_readable(self.runs())
        if run is None or run == "latest":
            for latest in reversed(self.runs()):  # newest first: stop at the first that reads
                if self.readable_runs([latest]):
                    return [latest]
            self._some_readable([])  # raises when there are runs: every one is damaged
            return [self.resolve_run(run)]  # raises: nothing recorded
        if isinstance(run, str):
            return [self.resolve_run(run)]
        return list(dict.fromkeys(self.resolve_run(r) for r in run))

    def _some_readable(self, runs: list[str]) -> list[str]:
        good = self.readable_runs(runs)
        if not good and self.runs():
            raise StorageError(f"no run of {self.name} under {self.root} can be read: every run.json is damaged "
                               f"(each is named above); `flor verify {self.name}` lists every problem")
        return good

    # -- checkpoints -------------------------------------------------------------------

    @staticmethod
    def check_block_name(name: str) -> str:
        if not isinstance(name, str) or not _BLOCK_RE.match(name):
            raise CheckpointError(
                f"invalid SkipBlock name {name!r}: use letters, digits, '.', '_' or '-' "
                "(for example step_into('training_loop'))"
            )
        return name

    def manifest_key(self, run: str, block: str, epoch: int | None, occurrence: int) -> str:
        if not is_block_name(block):  # names come from run.json too, which may be damaged
            raise StorageError(f"invalid SkipBlock name {block!r:.80} in the store of run {run}; "
                               "the run.json or checkpoint folder was damaged or tampered with")
        return self.run_key(run, "checkpoints", block, checkpoint_key(epoch, occurrence) + ".json")

    def manifests(self, run: str) -> Iterator[tuple[str, int | None, int]]:
        """(block, epoch, occurrence) of every committed checkpoint of ``run``."""
        base = self.run_path(run, "checkpoints")
        if not base.is_dir():
            return
        for block_dir in sorted(base.iterdir()):
            if not is_block_name(block_dir.name) or not block_dir.is_dir():
                continue
            for f in sorted(block_dir.glob("*.json")):
                try:
                    epoch, occ = parse_checkpoint_key(f.stem)
                except ValueError:
                    continue
                yield block_dir.name, epoch, occ

    def read_manifest(self, run: str, block: str, epoch: int | None, occurrence: int) -> dict:
        """The checkpoint's manifest, validated and checked against its whole-manifest checksum
        (``flor.store.manifest``): a damaged one is a CheckpointError naming the file."""
        key = self.manifest_key(run, block, epoch, occurrence)
        return check_manifest(self.read_json(key), str(self.backend.path(key)), block=block, epoch=epoch,
                              occurrence=occurrence)

    def disk_usage(self) -> int:
        return dir_size(self.root)

    def remove_stale_tmp(self) -> int:
        """Remove the temp files that writers which died mid-write left in this experiment
        (their process is gone); return the bytes freed. A recording calls it in the background
        when it starts."""
        folders = [dirpath for dirpath, _, _ in os.walk(self.root)]
        return remove_stale_tmp(folders, _alive)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (OSError, OverflowError):
        return False
    return True


def open_experiment(name: str | None, home: Path | None = None) -> ExperimentStore:
    """The recorded experiment ``name`` under ``home`` (default: this process's ``--flor`` name
    and ``FLOR_HOME``); a clear error when nothing is recorded there."""
    name = name or SETTINGS.name
    if name is None:
        raise ConfigError("no experiment named: pass name=NAME (the NAME given to --flor)")
    store = ExperimentStore(home or SETTINGS.home, validate_name(name))
    if not store.runs():
        raise ReplayError(store.no_runs())
    return store
