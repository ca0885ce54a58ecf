"""A recording's checkpoints: the snapshot on the training thread, the job that stores it on
the background writer, and what the budget is charged with (``Checkpointer``, a part
``flor.engine.record.RecordSession`` owns)."""

from __future__ import annotations

import time
from typing import Any

import threading
from typing import Callable

from ..placement import IdleMeter, OffCpu
from ..policy import CheckpointPolicy, charge_for
from ..settings import Settings
# here, not per checkpoint: an import statement costs ~10 us with cold caches
from ..state import (RNG_BYTES, BufferPool, PackIndex, TreeCache, capture_rng, hash_and_pack, same_rng, snapshot,
                     snapshot_rng)
from ..state.grads import module_grads
from ..store.manifest import FORMAT, canonical_json, has_pickles, sealed_bytes, state_digest
from ..store.trust import signer
from ..store import BackgroundWriter, ExperimentStore
from ..store.writer import give_turn
from .runrecord import RunRecord

IDLE_EVERY_S = 2.0  # how often the writer reads the idle cores (flor.placement.IdleMeter, flor.policy.charge_for)

__all__ = ["Checkpointer"]


class Checkpointer:
    """A recording's checkpoints: the background writer and the policy, the snapshot buffers
    (``pool``, ``packs``, ``trees``: flor.state), each block's last RNG capture and snapshot size,
    and what the background work cost (``background_cpu_s``, ``bytes_written``).

    ``say(code, subject, text)`` warns once; ``record`` is the run's run.json."""

    def __init__(self, store: ExperimentStore, run: str, record: RunRecord, settings: Settings,
                 say: Callable[[str, Any, str], Any]) -> None:
        self.store, self.run, self.record, self.settings, self.say = store, run, record, settings, say
        self.meta = record.meta
        self.writer = BackgroundWriter(budget=settings.writer_memory)  # never blocks training; see writer.py
        self.policy = CheckpointPolicy(overhead=settings.overhead, every=settings.every)
        self.spool: Any = None  # flor.store.sync.BackgroundSpool, when spooling
        self.snapshot_bytes: dict[str, int] = {}  # per block: the size of its last snapshot
        self.pool: Any = None  # snapshot buffers and where small leaves went (flor.state), on first use
        self.packs: Any = None
        self.trees: dict[str, Any] = {}  # block name -> flor.state.TreeCache
        self.last_rng: dict[str, tuple] = {}  # block name -> its last checkpoint's RNG capture, stored tree and text
        self.rng_start: Any = None  # the RNG state the open block started from (captured at step_into)
        self.background_cpu_s = 0.0
        self.background_seen = 0.0  # background_cpu_s at the last idle-core reading
        self.idle_meter = IdleMeter()  # restarted when the loop starts
        self.charge_read = False  # whether the writer has chosen the charge (flor.policy) yet
        self.off_cpu = threading.local()  # .meter: each training thread's OffCpu (a new thread, a new clock)
        self.bytes_written = 0

    def block_started(self) -> None:
        """The RNG state the block starts from: a replay that re-executes the block starts it from
        here too, even when the script never seeded Python's or NumPy's generator."""
        t0 = time.perf_counter()
        self.rng_start = capture_rng(raw=True)  # for snapshot_rng only: raw bytes where it can
        self.record.timing("start_s", time.perf_counter() - t0)  # fixed cost too

    def checkpoint(self, name: str, epoch: int | None, occ: int, objs: tuple, elapsed: float,
                   noted: dict[str, Any] | None = None, carried: dict[str, Any] | None = None) -> None:
        """Snapshot ``objs`` and the random state now, and queue their storing; ``noted``: what the
        probes noted of this block run outside ``end()`` (``flor.watch``), kept in the manifest;
        ``carried``: the values its next run reads before binding (``flor.watch.carried``), kept
        beside the objects (the manifest's ``"carried"`` tree)."""
        if self.pool is None:
            self.pool, self.packs = BufferPool(), PackIndex()
        if not self.writer.has_room(self.snapshot_bytes.get(name, 0)):  # behind: skip, never wait
            self.skipped(name, epoch, "writer behind")
            return
        t0 = time.perf_counter()
        try:
            cache = self.trees.get(name)
            first = cache is None  # its one-time work is charged, but is no estimate (flor.policy)
            if cache is None:
                cache = self.trees[name] = TreeCache(memory=self.writer.budget)
            objects = snapshot(list(objs), pool=self.pool, cache=cache)
            grads = self._grads(name, epoch, objs)
            kept = snapshot(carried, pool=self.pool) if carried else None
            rng_state, rng_start_state = capture_rng(raw=True), self.rng_start  # fresh copies: encoded on the writer
        except Exception as exc:  # noqa: BLE001 - an object flor cannot capture must not stop training
            self._failed(name, epoch, exc)
            return
        snap_s = time.perf_counter() - t0
        nbytes = objects.nbytes + RNG_BYTES + sum(p.nbytes for p in (grads, kept) if p is not None)
        self.snapshot_bytes[name] = nbytes
        trainer = getattr(self.off_cpu, "meter", None)  # this (training) thread's waits, read by the writer
        if trainer is None:
            trainer = self.off_cpu.meter = OffCpu()

        def job() -> None:
            cpu0 = time.thread_time()
            mark = trainer.mark()
            self._choose_charge()  # here, not in the stall
            give_turn()  # (between the steps: flor.store.writer)
            parts = [p for p in (objects, grads, kept) if p is not None]
            nogil: list[float] = []  # the hashing's CPU time: with the GIL released
            last = self.last_rng.pop(name, None)
            try:  # hashed once; large leaves written straight from the pooled buffers, small ones in one
                # pack; all behind ONE durability barrier
                rng = snapshot_rng(rng_state)
                parts.append(rng)
                if last is not None and same_rng(rng_start_state, last[0]):
                    start = last[1]  # the generators did not move since the last end(): its stored tree and text
                else:
                    parts.append(snapshot_rng(rng_start_state))
                    start = (parts[-1].tree, None)  # its nodes get their hashes in place
                give_turn()
                cache.top_up(nogil)  # a spare buffer set for the next snapshot, should this job still be running then
                give_turn()
                cache.prime()  # where a template was just learned: its text, now rather than in the next job
                give_turn()
                blobs, packed = hash_and_pack(parts, self.packs, nogil=nogil)
                give_turn()
                io0 = time.thread_time()
                new_bytes = self.store.blobs.put_many(blobs)
                io_s = time.thread_time() - io0  # in system calls, the GIL released
                self.packs.remember(packed)  # durable now: later checkpoints may point into these packs
            finally:
                self.packs.give_back()  # its pack is written (or failed): the buffer may be reused
                for part in parts:
                    part.release()
            head: dict[str, Any] = {"block": name, "epoch": epoch, "occurrence": occ, "count": len(objs)}
            if noted:
                head["watch"] = noted
            give_turn()
            data, rng_text = self._sealed_manifest(head, objects, rng, start, grads, kept, nbytes=nbytes,
                                                   new_bytes=new_bytes, block_s=elapsed, snapshot_s=snap_s)
            # its blobs are durable: rng_start may point at them
            self.last_rng[name] = (rng_state, (rng.tree, rng_text))
            give_turn()
            manifest_key = self.store.manifest_key(self.run, name, epoch, occ)
            if not self.writer.may_commit():
                return  # abandoned at exit: without its manifest the checkpoint does not exist
            io0 = time.thread_time()
            self.store.backend.write(manifest_key, data, durable=True)
            io_s += time.thread_time() - io0
            if self.spool is not None:  # queued only now: a manifest goes up after its blobs
                self.spool.checkpoint(manifest_key)
            cpu = time.thread_time() - cpu0
            self.background_cpu_s += cpu
            self.bytes_written += new_bytes
            held = max(cpu - io_s - sum(nogil), 0.0)  # outside the system calls and the hashing: holding the GIL
            waited = trainer.since(mark)  # of which training can have waited for at most this
            charged = self.policy.observe_background(name, cpu, held=held, first=first, waited=waited)
            # per checkpoint, in the order written: the GIL time and what training waited of it
            self.record.timing("gil_s", held, "gil_waited_s", charged)

        if not self.writer.try_submit(job, nbytes, lambda exc: self._failed(name, epoch, exc), label=(name, epoch)):
            self.skipped(name, epoch, "writer behind")  # larger than the last one and no room: dropped
            return
        stall = time.perf_counter() - t0  # the snapshot (the writer never makes training wait)
        self.policy.observe(name, epoch, stall=stall, first=first)
        # of it: copying bytes; and how it was encoded: "fast", "learned" or "full"
        self.record.timing("stall_s", stall, "copy_s", objects.copy_s, "encoded", objects.encoded)

    def _choose_charge(self) -> None:
        """What the budget is charged with (``flor.policy``), for the checkpoints to come; on the
        writer thread. Where a core sat idle since the last checkpoint (training on a GPU, or on
        the CPU with fewer threads than cores) the writer's I/O runs there for free and only its
        Python work, which holds the GIL the training thread needs, is charged, as far as the
        training thread waited meanwhile (``flor.placement.OffCpu``); where training
        (or other work on the node) kept every core busy, all of the writer's CPU time is.

        Measured on the digits CNN (2 cores, 60 epochs checkpointed at every other one, a
        checkpointed epoch against its two neighbours in the same process): with one torch
        thread a checkpoint lengthened its epoch by 1.1 ms (stall 0.5 ms, writer's GIL time
        1.2 ms, its CPU 2.9 ms); with two torch threads, by 3.5 ms (stall 0.6 ms, writer's
        CPU 3.0 ms). Both charges are at or above what the checkpoint took.

        Read at the first checkpoint, then at most every ``IDLE_EVERY_S`` (the charge stays as
        it was in between): reading ``/proc/stat`` cost the writer 0.1-0.3 ms of CPU per
        checkpoint of the CNN."""
        if self.charge_read and self.idle_meter.age() < IDLE_EVERY_S:
            return
        self.charge_read = True
        idle = self.idle_meter.idle(exclude_s=self.background_cpu_s - self.background_seen)
        if idle is not None:  # else too soon to tell (or no /proc/stat): the writer's CPU stays to exclude
            self.background_seen = self.background_cpu_s
        self.policy.charge = charge_for(idle)

    def _grads(self, name: str, epoch: int | None, objs: tuple) -> Any:
        """The modules' gradients (a ``Pending``) where the block adds to those its previous run
        left (run.json: ``grads_carried``, ``flor.state.grads``); else None. One that cannot be
        captured (a sparse gradient) is left out with one warning: a replay then re-executes
        from an earlier checkpoint rather than restore this one."""
        if name not in self.meta.grads_carried:
            return None
        try:
            return snapshot(module_grads(objs), pool=self.pool)
        except Exception as exc:  # noqa: BLE001 - never stops training
            self.say("FL102", name, f"the gradients of block {name!r} could not be checkpointed at epoch "
                           f"{epoch} ({exc}); a replay re-executes the block from an earlier checkpoint instead")
            return None

    def _sealed_manifest(self, head: dict, objects: Any, rng: Any, start: tuple[Any, str | None], grads: Any = None,
                         carried: Any = None, *, nbytes: int, new_bytes: int, block_s: float,
                         snapshot_s: float) -> tuple[bytes, str]:
        """The manifest file of a checkpoint whose blobs are stored, and its RNG tree's text: each
        state tree serialized once, for the state digest, the checksum and the file
        (``sealed_bytes``); an HMAC with the user's key where a leaf is pickled
        (flor.store.trust). ``start``: the ``rng_start`` tree and its text where known (an
        earlier checkpoint's ``rng``, the same state), else None."""
        start_tree, start_text = start
        trees = {"objects": objects.tree, "rng": rng.tree, "rng_start": start_tree}  # objects: None, rendered
        done = {"objects": objects.canonical(), "rng": canonical_json(rng.tree),
                "rng_start": start_text or canonical_json(start_tree)}
        if grads is not None:  # "grads": outside the state digest (a re-executed block's are not compared)
            trees["grads"], done["grads"] = grads.tree, grads.canonical()
        if carried is not None:  # the values the block's next run reads first (flor.watch.carried)
            trees["carried"], done["carried"] = carried.tree, carried.canonical()
        manifest = {
            "format": FORMAT, **head, **trees,
            "digest": state_digest({**done, **({"watch": canonical_json(head["watch"])} if "watch" in head else {})}),
            "bytes": nbytes, "new_bytes": new_bytes, "block_s": round(block_s, 6), "snapshot_s": round(snapshot_s, 6),
            "created": time.time(),
        }
        pickled = any('"pickle"' in text for text in done.values()) and has_pickles(manifest)
        sign = signer(self.settings.config_dir) if pickled else None
        return sealed_bytes(manifest, sign=sign, done=done), done["rng"]

    def skipped(self, name: str, epoch: int | None, reason: str) -> None:
        """A checkpoint not taken (the writer is behind) or abandoned (the exit flush timed out)."""
        self.record.checkpoint_skipped(name, epoch, reason)
        if reason == "writer behind":
            self.say("FL103", None, (
                f"the background writer is behind ({self.writer.pending_bytes / 2**20:.0f} MiB of checkpoints queued, "
                f"the limit is {self.writer.budget / 2**20:.0f} MiB, FLOR_WRITER_MEMORY): checkpoint of block {name!r} "
                f"at epoch {epoch} skipped rather than making training wait; replay re-executes such epochs "
                "(run.json: checkpoint_skipped)"))

    def _failed(self, name: str, epoch: int | None, exc: BaseException) -> None:
        self.record.checkpoint_failed(name, epoch, repr(exc))
        self.say("FL101", None, f"checkpoint of block {name!r} at epoch {epoch} failed ({exc}); training "
                       "goes on and a replay will re-execute that epoch (run.json lists every failed checkpoint)")
