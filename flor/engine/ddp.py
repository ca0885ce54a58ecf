"""Distributed training: one recording for all ranks, and ids that the workers of a launch share.

A script trained with DDP under torchrun passes ``--flor NAME`` on every rank. flor makes one
recording of it:

* rank 0 records as usual: ``run.json``, checkpoints, ``logs/record.jsonl``, ``stdout.log``.
  The ranks' states are identical (DDP keeps them so), so one copy is enough;
* every other rank R writes only what it logged, to ``logs/record-rank<R>.jsonl``, and what
  it printed, to ``stdout-rank<R>.log``. Readers tag those records with ``rank`` and leave
  them out unless asked (``read_run_logs(..., ranks=True)``): rank 0's values are the run's;
* the ranks agree on the run id through torchrun's own store (the elastic agent's TCPStore
  at ``MASTER_ADDR:MASTER_PORT``), or, without torchrun, by a broadcast when the process
  group is already up at the first flor call;
* at the end of every block each rank hashes a small sample of every tensor it passed to
  ``end()`` (at most 256 elements a tensor: microseconds, not a copy of the model) and the
  ranks all-gather the fingerprints. Rank 0 warns, once per block, when a rank differs and
  lists the epochs in ``run.json`` under ``rank_mismatches`` (BatchNorm statistics without
  SyncBatchNorm, or rank-dependent seeds, do that). Replay restores rank 0's state.

Replaying: every worker is a world of its own (``flor replay`` gives a DDP script
``RANK=0 WORLD_SIZE=1``); a replay inside a process group of several ranks would mix epochs
in their collectives, so it is refused (``check_replay_world``).
"""

from __future__ import annotations

import os
import weakref
from datetime import timedelta
from typing import Any, Iterator, Mapping

from ..errors import ReplayError, warn
from ..placement import distributed as _dist
from ..placement import group_size as _group_size
from ..placement import new_replay_id, record_rank
from ..logs import LogWriter
from .session import Session, as_result
from ..settings import Settings
from ..store.layout import RunLayout
from ..store.runmeta import RunMeta

__all__ = ["RankLink", "RankSession", "check_replay_world", "fingerprint", "record_rank", "shared_replay_id"]

_SAMPLE = 256


def _agent_store(timeout: float, env: Mapping[str, str] = os.environ) -> Any:
    """A client of torchrun's store that waits ``timeout`` seconds for a key (``Settings.rank_timeout``,
    ``FLOR_RANK_TIMEOUT``: rank 0 may still be loading data), or None when not under torchrun (or
    it cannot be reached)."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not env.get("MASTER_PORT"):
        return None
    try:
        from torch.distributed import TCPStore

        return TCPStore(env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"]), is_master=False,
                        timeout=timedelta(seconds=timeout))
    except (RuntimeError, ValueError, ImportError) as exc:
        warn("FL117", f"cannot reach torchrun's store at {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')} ({exc})")
        return None


def _agree(key: str, mine: str | None, rank: int, timeout: float) -> str | None:
    """The value rank 0 proposes for ``key``, on every rank (each waiting at most ``timeout``
    seconds for it); None when there is no channel."""
    store = _agent_store(timeout)
    full = f"flor/{key}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if store is not None:
        if rank == 0:
            store.set(full, mine or "")
            return mine
        try:
            return store.get(full).decode() or None
        except RuntimeError as exc:  # the store's timeout
            warn("FL118", f"rank {rank} waited {timeout:.0f}s for rank 0 to start recording ({exc}); if rank 0 "
                 "takes longer to start, raise FLOR_RANK_TIMEOUT")
            return None
    if _group_size() is not None:
        box = [mine]
        _dist().broadcast_object_list(box, src=0)
        return box[0]
    return None


def shared_replay_id(settings: Settings) -> str | None:
    """A replay id for the workers of one torchrun launch that derived none from the
    environment: worker 0 makes it, the others get it through torchrun's store."""
    if settings.placed_by != "torchrun" or settings.ngpus < 2 or settings.replay_id is not None:
        return None
    mine = new_replay_id() if settings.pid == 0 else None
    return _agree(f"{settings.name}/replay", mine, settings.pid, settings.rank_timeout)


def check_replay_world(ngpus: int, meta: RunMeta, plan: Any, restorable: set[int]) -> list[str]:
    """Refuse to replay inside a process group whose ranks replay different epochs; return
    notes for a distributed recording whose replay re-executes epochs without checkpoints."""
    group = _group_size()
    if group is not None and ngpus > 1:
        raise ReplayError(
            f"this replay worker is rank {group[0]} of a process group of {group[1]}, and the ranks replay "
            "different epochs, so collectives (DDP's gradient all-reduce, metric all-reduces) would mix "
            "epochs: replay with `flor replay NAME -- python SCRIPT` (each worker a world of one), or start "
            "each worker with RANK=0 WORLD_SIZE=1 and FLOR_REPLAY=PID/N"
        )
    world = meta.world_size
    missing = [e for e in range(plan.first, plan.stop) if e not in restorable]
    if world > 1 and missing:
        return [f"the run was recorded by {world} ranks (DDP) and epochs {missing[:10]} have no checkpoint: "
                f"they re-execute here in a world of {group[1] if group else 1}, which does not reproduce "
                "the distributed training; record with --flor_every 1 to checkpoint every epoch"]
    return []


def fingerprint(objs: Any) -> str:
    """A cheap digest of the tensors and plain values in ``objs``: at most 256 evenly spaced
    elements of each tensor, with its shape and dtype. Equal states give equal fingerprints;
    ranks that drifted apart almost surely do not."""
    import torch
    import xxhash

    h = xxhash.xxh3_64()

    def walk(x: Any, depth: int = 0) -> None:
        if depth > 50:
            return
        if isinstance(x, torch.Tensor):
            flat = x.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // _SAMPLE)][:_SAMPLE].to("cpu").contiguous()
            h.update(f"T{tuple(x.shape)}{x.dtype}".encode())
            if sample.numel():
                h.update(sample.view(torch.uint8).numpy().tobytes())
        elif hasattr(x, "state_dict") and callable(x.state_dict):
            walk(x.state_dict(), depth + 1)
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(f"K{k}".encode())
                walk(x[k], depth + 1)
        elif isinstance(x, (list, tuple)):
            h.update(f"L{len(x)}".encode())
            for v in x:
                walk(v, depth + 1)
        elif isinstance(x, (int, float, str, bool)) or x is None:
            h.update(f"V{x!r}".encode())
        else:
            h.update(f"O{type(x).__qualname__}".encode())

    walk(objs)
    return h.hexdigest()


class RankLink:
    """What the ranks of one recording share: the run id, and a fingerprint check per block."""

    def __init__(self, name: str, rank: int, world: int, *, timeout: float) -> None:
        self.name, self.rank, self.world = name, rank, world
        self.timeout = timeout  # Settings.rank_timeout: how long a rank waits for rank 0
        self._group: Any = None  # NCCL only: flor's gloo group beside the script's default group
        self._group_of: Any = None  # a weak reference to that default group
        self._warned: set[str] = set()

    @classmethod
    def for_record(cls, settings: Settings) -> RankLink | None:
        rank, world = record_rank()
        return cls(settings.name or "", rank, world, timeout=settings.rank_timeout) if world > 1 else None

    def agree_run(self, run: str | None) -> str | None:
        """Rank 0 passes its new run id; every rank gets it back (None: no channel to rank 0)."""
        return _agree(f"{self.name}/run", run, self.rank, self.timeout)

    def check(self, block: str, epoch: int | None, objs: Any, meta: RunMeta | None = None) -> list[int]:
        """All-gather every rank's fingerprint of ``objs``; the ranks that differ from rank 0.

        Every rank calls it at the end of every block (the same points of the same script),
        so the collective lines up; without a process group it does nothing.
        """
        dist = _dist()
        if dist is None or _group_size() is None:
            self.release()  # the script destroyed its process group: hold nothing of it
            return []
        prints: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(prints, [fingerprint(o) for o in objs], group=self._gather_group(dist))
        differ = [r for r, fp in enumerate(prints) if fp != prints[0]]
        if differ and meta is not None:
            args = sorted({i for fp in prints[1:] for i, (a, b) in enumerate(zip(prints[0], fp)) if a != b})
            what = ", ".join(f"{i} ({type(objs[i]).__name__})" for i in args if i < len(objs))
            found = meta.rank_mismatches
            if len(found) < 100:
                found.append({"block": block, "epoch": epoch, "ranks": differ, "arguments": args})
            if block not in self._warned:
                self._warned.add(block)
                warn("FL119", f"the state of block {block!r} at epoch {epoch} differs between rank 0 and rank(s) "
                     f"{differ} in end() argument(s) {what} (by fingerprint): replay restores rank 0's state, "
                     "so values only the other ranks computed are not reproducible. Unsynchronized BatchNorm "
                     "statistics or rank-dependent seeds do this; see run.json's rank_mismatches")
        return differ

    def _gather_group(self, dist: Any) -> Any:
        """Where the fingerprints are gathered: the default group (None) where it is gloo; beside
        NCCL, which gathers objects through the GPU, a gloo group of flor's own, made once per
        default group. The default group itself is never held: a reference kept past the script's
        ``destroy_process_group`` would free gloo's threads at interpreter exit, which can abort
        the process ("terminate called without an active exception"), and a group the script
        makes again would be gathered through the old one."""
        if dist.get_backend() == "gloo":
            return None
        world = dist.group.WORLD
        if self._group_of is None or self._group_of() is not world:  # set and dropped with _group
            self._group = dist.new_group(backend="gloo")
            self._group_of = weakref.ref(world)
        return self._group

    def release(self) -> None:
        """Drop flor's own group (at the session's close, while the interpreter is whole)."""
        self._group = self._group_of = None


class RankSession(Session):
    """A rank other than 0 of a distributed recording: its logs and output, no checkpoints."""

    mode = "record"

    def __init__(self, settings: Settings, rank: int, world: int) -> None:
        super().__init__(settings)
        self.rank = rank
        self.link = RankLink(settings.name or "", rank, world, timeout=settings.rank_timeout)
        self.run = self.link.agree_run(None)
        self.logs: LogWriter | None = None
        if self.run is None:  # training goes on; this rank's logs are not kept, its checks still line up
            warn("FL120", f"rank {rank} of {world} cannot learn the run id from rank 0, so its logs are not kept: "
                 "launch with torchrun, or call torch.distributed.init_process_group before the first flor call")
        else:
            self.run_dir = self.store.run_path(self.run)
            layout = RunLayout(self.run_dir)
            self.logs = LogWriter(layout.rank_log(rank))
            self.tee_output(layout.rank_stdout(rank))
        self._install_hooks()

    def iterate(self, iterable: Any) -> Iterator[Any]:
        self.begin_loop()
        try:
            for epoch, item in enumerate(iterable):
                self.epoch = epoch
                self.mark("epoch", epoch)
                yield item
                if self.logs is not None:
                    self.logs.flush()
        finally:
            self.mark("after")
            self.end_loop()

    def step_into(self, name: str, probed: bool) -> bool:
        self.open_block(name)
        return True

    def end(self, objs: tuple) -> Any:
        name, epoch, _ = self.close_block()
        self.link.check(name, epoch, objs)
        return as_result(objs)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.mark("end")
        self.link.release()
        if self.logs is not None:
            self.logs.flush()
        self.untee_output()
