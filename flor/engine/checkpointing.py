"""A recording's checkpoints: the snapshot on the training thread, the job that stores it on
the background writer, and what the budget is charged with (``Checkpointing``, a part of
``flor.engine.record.RecordSession``)."""

from __future__ import annotations

import time
from typing import Any

from ..placement import OffCpu
from ..policy import charge_for
# here, not per checkpoint: an import statement costs ~10 us with cold caches
from ..state import (RNG_BYTES, BufferPool, PackIndex, TreeCache, capture_rng, hash_and_pack, same_rng, snapshot,
                     snapshot_rng)
from ..state.grads import module_grads
from ..store.hashing import hash_bytes
from ..store.manifest import FORMAT, canonical_json, has_pickles, sealed_bytes
from ..store.trust import signer
from ..store.writer import give_turn

IDLE_EVERY_S = 2.0  # how often the writer reads the idle cores (flor.placement.IdleMeter, flor.policy.charge_for)

__all__ = ["Checkpointing"]


class Checkpointing:
    """``RecordSession``'s checkpoints (its state: ``pool``, ``packs``, ``trees``, ``last_rng``,
    ``snapshot_bytes``, the writer, the store, the policy and the idle meter)."""

    def checkpoint(self, name: str, epoch: int | None, occ: int, objs: tuple, elapsed: float) -> None:
        if self.pool is None:
            self.pool, self.packs = BufferPool(), PackIndex()
        if not self.writer.has_room(self.snapshot_bytes.get(name, 0)):  # behind: skip, never wait
            self._skipped(name, epoch, "writer behind")
            return
        t0 = time.perf_counter()
        try:
            cache = self.trees.get(name)
            first = cache is None  # its one-time work is charged, but is no estimate (flor.policy)
            if cache is None:
                cache = self.trees[name] = TreeCache(memory=self.writer.budget)
            objects = snapshot(list(objs), pool=self.pool, cache=cache)
            grads = self._grads(name, epoch, objs)
            rng_state, rng_start_state = capture_rng(raw=True), self.rng_start  # fresh copies: encoded on the writer
        except Exception as exc:  # noqa: BLE001 - an object flor cannot capture must not stop training
            self._failed(name, epoch, exc)
            return
        snap_s = time.perf_counter() - t0
        nbytes = objects.nbytes + RNG_BYTES + (grads.nbytes if grads is not None else 0)
        self.snapshot_bytes[name] = nbytes
        trainer = getattr(self.off_cpu, "meter", None)  # this (training) thread's waits, read by the writer
        if trainer is None:
            trainer = self.off_cpu.meter = OffCpu()

        def job() -> None:
            cpu0 = time.thread_time()
            mark = trainer.mark()
            self._choose_charge()  # here, not in the stall
            give_turn()  # (between the steps: flor.store.writer)
            parts = [objects] if grads is None else [objects, grads]
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
            head = {"block": name, "epoch": epoch, "occurrence": occ, "count": len(objs)}
            give_turn()
            data, rng_text = self._sealed_manifest(head, objects, rng, start, grads, nbytes=nbytes,
                                                   new_bytes=new_bytes, block_s=elapsed, snapshot_s=snap_s)
            self.last_rng[name] = (rng_state, (rng.tree, rng_text))  # its blobs are durable: rng_start may point at them
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
            with self._meta_lock:  # per checkpoint, in the order written: the GIL time and what training waited of it
                self.meta.timings.setdefault("gil_s", []).append(round(held, 6))
                self.meta.timings.setdefault("gil_waited_s", []).append(round(charged, 6))

        if not self.writer.try_submit(job, nbytes, lambda exc: self._failed(name, epoch, exc), label=(name, epoch)):
            self._skipped(name, epoch, "writer behind")  # larger than the last one and no room: dropped
            return
        stall = time.perf_counter() - t0  # the snapshot (the writer never makes training wait)
        self.policy.observe(name, epoch, stall=stall, first=first)
        self.meta.timings.setdefault("stall_s", []).append(round(stall, 6))
        self.meta.timings.setdefault("copy_s", []).append(round(objects.copy_s, 6))  # of it: copying bytes
        self.meta.timings.setdefault("encoded", []).append(objects.encoded)  # "fast", "learned" or "full"

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
            self.warn_once("FL102", name, f"the gradients of block {name!r} could not be checkpointed at epoch "
                           f"{epoch} ({exc}); a replay re-executes the block from an earlier checkpoint instead")
            return None

    def _sealed_manifest(self, head: dict, objects: Any, rng: Any, start: tuple[Any, str | None], grads: Any = None,
                         *, nbytes: int, new_bytes: int, block_s: float, snapshot_s: float) -> tuple[bytes, str]:
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
        manifest = {
            "format": FORMAT, **head, **trees,
            "digest": hash_bytes(f'{{"objects":{done["objects"]},"rng":{done["rng"]}}}'.encode()),
            "bytes": nbytes, "new_bytes": new_bytes, "block_s": round(block_s, 6), "snapshot_s": round(snapshot_s, 6),
            "created": time.time(),
        }
        pickled = any('"pickle"' in text for text in done.values()) and has_pickles(manifest)
        return sealed_bytes(manifest, sign=signer(self.settings.config_dir) if pickled else None, done=done), done["rng"]

    def _failed(self, name: str, epoch: int | None, exc: BaseException) -> None:
        with self._meta_lock:
            self.meta.checkpoint_failures.append({"block": name, "epoch": epoch, "error": repr(exc)})
        self.warn_once("FL101", None, f"checkpoint of block {name!r} at epoch {epoch} failed ({exc}); training "
                       "goes on and a replay will re-execute that epoch (run.json lists every failed checkpoint)")
