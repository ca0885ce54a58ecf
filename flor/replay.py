"""Replay: follow the plan, restore or execute each block, verify, and report."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from .errors import CheckpointError, FlorError, ReplayError, StateError
from .logs import LogWriter, read_run_logs
from .plan import ReplayPlan, block_action, make_plan
from .runinfo import redact_argv
from .session import Session, as_result, pid_alive
from .settings import Settings
from .verify import (
    CAUSE_CODE, CAUSE_NONDET, CAUSE_NOT_PASSED, CAUSE_RNG, BlockEvent, Summary, compare_logs,
    non_logging_changes,
)

__all__ = ["ReplaySession", "new_replay_id"]


def new_replay_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + uuid.uuid4().hex[:4]


def _hashes(node: Any, out: set[str]) -> set[str]:
    if isinstance(node, dict):
        if "h" in node:
            out.add(node["h"])
        for v in node.values():
            _hashes(v, out)
    elif isinstance(node, list):
        for v in node:
            _hashes(v, out)
    return out


class ReplaySession(Session):
    mode = "replay"

    def __init__(self, settings: Settings) -> None:
        import torch

        super().__init__(settings)
        self.run = self.store.resolve_run(settings.run)
        self.meta = self.store.read_run(self.run)
        self.run_dir = self.store.run_path(self.run)
        self.replay_id = settings.replay_id or new_replay_id()
        self.pid, self.ngpus = settings.pid, settings.ngpus
        self.plan: ReplayPlan | None = None
        self.initializing = False
        self.anchored = True  # the live state is exact (no epochs skipped since the start)
        self.from_restore = False  # ... and was last set from a checkpoint
        self.pending: tuple[str, dict | None, dict | None] | None = None
        self.available = set(self.store.manifests(self.run))
        self.notes: list[str] = []
        self.code_changed = False
        stem = f"replay-{self.replay_id}-{self.pid}"
        self.logs = LogWriter(self.run_dir / "logs" / f"{stem}.jsonl")
        self.summary_path = self.run_dir / "logs" / f"{stem}.summary.json"
        self.tee_output(self.run_dir / f"{stem}.log")

        status = self.meta.get("status")
        if status == "running" and pid_alive(int(self.meta.get("pid") or 0)):
            self.note("the recording is still running; replaying the checkpoints it has so far")
        elif status != "finished":
            self.note(f"the recording ended as {status!r}; epochs without checkpoints are re-executed")
        recorded_threads = self.meta.get("torch_threads")
        if recorded_threads and torch.get_num_threads() != recorded_threads:
            self.note(f"using {recorded_threads} torch threads as recorded (this process had "
                      f"{torch.get_num_threads()}), so that results are bit-identical")
            torch.set_num_threads(int(recorded_threads))
        self._compare_script()
        self.summary = Summary(header="")

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"flor: {text}", file=sys.stderr)

    def _compare_script(self) -> None:
        recorded_path = self.meta.get("script")
        current = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
        if recorded_path and current is not None and current.is_file():
            copy = self.run_dir / "source" / Path(recorded_path).name
            if copy.is_file():
                old, new = copy.read_text(errors="replace"), current.read_text(errors="replace")
                if non_logging_changes(old, new):
                    self.code_changed = True
                    self.note("the script changed by more than logging since the recording "
                              f"(compare with {copy}); replayed values may differ from the recording")
        rec_args = list(self.meta.get("argv") or [])[1:]
        now_args = redact_argv(list(sys.argv))[1:]
        if rec_args != now_args:
            self.note(f"the script's arguments differ from the recording: recorded {rec_args}, now {now_args}")

    # -- the loop ----------------------------------------------------------------------

    def restorable(self, epoch: int) -> bool:
        blocks = self.meta.get("epoch_blocks", {}).get(str(epoch))
        return bool(blocks) and all((name, epoch, occ) in self.available for name, occ in blocks)

    def iterate(self, iterable: Any) -> Iterator[Any]:
        self.begin_loop()
        try:
            length: int | None = len(iterable)
        except TypeError:
            length = None
        planned = self.meta.get("epochs_planned")
        if length is not None and planned is not None and length != planned:
            raise ReplayError(
                f"the epoch loop now has {length} epochs but the recording {self.run} had {planned}: "
                "replay with the recorded arguments, or record again"
            )
        epochs = length if length is not None else int(planned or self.meta.get("epochs_done") or 0)
        restorable = {e for e in range(epochs) if self.restorable(e)}
        plan = make_plan(epochs, self.pid, self.ngpus, restorable, strong=self.settings.strong)
        self.plan = plan
        self.anchored = plan.first == 0
        seg = f"{plan.segment.start}-{plan.segment.stop - 1}" if len(plan.segment) else "none"
        init = f"{plan.init.start}-{plan.init.stop - 1}" if len(plan.init) else "none"
        self.summary.header = (f"flor: replay {self.replay_id} of {self.settings.name} run {self.run}, worker "
                               f"{self.pid}/{self.ngpus}: epochs {seg} (initialization epochs {init})")
        try:
            seen = 0
            for epoch, item in enumerate(iterable):
                seen = epoch + 1
                if epoch < plan.first:
                    continue
                if epoch >= plan.stop:
                    break
                self.epoch, self.initializing = epoch, epoch < plan.segment.start
                yield item
                self.logs.flush()
            else:
                if seen < plan.stop:
                    self.note(f"the loop ended after {seen} epochs, before the planned {plan.stop}")
        finally:
            self.end_loop()
            self.initializing = False

    # -- blocks ------------------------------------------------------------------------

    def _check_recorded(self, name: str, epoch: int | None, occ: int) -> None:
        if epoch is None:
            recorded = self.meta.get("outside_blocks", [])
            finished = self.meta.get("status") == "finished"
        else:
            recorded = self.meta.get("epoch_blocks", {}).get(str(epoch))
            finished = recorded is not None
        if finished and [name, occ] not in recorded:
            where = "outside the loop" if epoch is None else f"at epoch {epoch}"
            names = sorted({n for n, _ in recorded}) or "none"
            raise ReplayError(
                f"SkipBlock {name!r} (occurrence {occ}) {where} is not in the recording {self.run}, whose "
                f"blocks there were {names}: the script's blocks no longer match; rename the block back "
                f"or record again with --flor {self.settings.name}"
            )

    def step_into(self, name: str, probed: bool) -> bool:
        _, epoch, occ = self.open_block(name)
        self._check_recorded(name, epoch, occ)
        checkpointed = (name, epoch, occ) in self.available
        action = block_action(checkpointed=checkpointed, probed=probed, initializing=self.initializing)
        manifest = cache = None
        if checkpointed:
            try:
                manifest = self.store.read_manifest(self.run, name, epoch, occ)
                if action == "restore":
                    cache = {h: self.store.blobs.get(h) for h in _hashes(manifest, set())}
            except FlorError as exc:
                if not self.anchored:
                    raise CheckpointError(
                        f"the checkpoint of {name!r} at epoch {epoch} cannot be read ({exc}); replay "
                        "with --flor_strong to rebuild this worker's state from epoch 0"
                    ) from exc
                self.note(f"checkpoint of {name!r} at epoch {epoch} is unusable ({exc}); re-executing it")
                action, manifest, cache = "execute", None, None
        self.pending = (action, manifest, cache)
        return action == "execute"

    def _restore(self, manifest: dict, cache: dict, objs: tuple) -> tuple:
        from .state import decode, restore, restore_rng

        restored = restore(list(objs), manifest["objects"], cache.__getitem__)
        restore_rng(decode(manifest["rng"], cache.__getitem__))
        self.anchored = self.from_restore = True
        return tuple(restored)

    def end(self, objs: tuple) -> Any:
        name, epoch, occ = self.close_block()
        assert self.pending is not None
        action, manifest, cache = self.pending
        self.pending = None
        if manifest is not None and manifest.get("count", len(objs)) != len(objs):
            raise StateError(
                f"SkipBlock.end({name!r}) got {len(objs)} objects at epoch {epoch}; the recording "
                f"passed {manifest['count']}: pass the same objects, in the same order"
            )
        event = BlockEvent(epoch, name, occ, "restored", initializing=self.initializing)
        if action == "restore":
            objs = self._restore(manifest, cache, objs)
        elif manifest is None:
            event.action = "executed (no checkpoint)"
        else:
            objs, event = self._verify(manifest, objs, event)
        self.summary.events.append(event)
        return as_result(objs)

    def _verify(self, manifest: dict, objs: tuple, event: BlockEvent) -> tuple[tuple, BlockEvent]:
        from .state import capture_rng, diff_nodes, snapshot

        now_objs = snapshot(list(objs), copy=False).materialize()
        now_rng = snapshot(capture_rng(), copy=False).materialize()
        diffs = [self._label(p, manifest) for p in diff_nodes(manifest["objects"], now_objs)]
        rng_diffs = ["RNG " + p for p in diff_nodes(manifest["rng"], now_rng)]
        if not diffs and not rng_diffs:
            event.action = "matched"
            self.from_restore = False
            return objs, event
        event.action, event.tensors = "diverged", diffs + rng_diffs
        if self.code_changed:
            event.cause = CAUSE_CODE
        elif not diffs:
            event.cause = CAUSE_RNG
        elif self.from_restore:
            event.cause = CAUSE_NOT_PASSED
        else:
            event.cause = CAUSE_NONDET
        cache = {h: self.store.blobs.get(h) for h in _hashes(manifest, set())}
        return self._restore(manifest, cache, objs), event  # go on from the recorded state

    @staticmethod
    def _label(path: str, manifest: dict) -> str:
        if not path.startswith("["):
            return path
        index, _, rest = path[1:].partition("]")
        try:
            node = manifest["objects"]["v"][int(index)]
            cls = node.get("cls", node.get("t", "")) if isinstance(node, dict) else type(node).__name__
        except (ValueError, IndexError, KeyError, TypeError):
            return path
        return f"end() argument {index} ({cls.rsplit('.', 1)[-1]}){rest}"

    # -- logs and exit -----------------------------------------------------------------

    def write_log(self, name: str, value: Any, step: Any) -> None:
        if self.loop == "in":
            if self.initializing:
                return
        elif self.loop == "before":
            if self.pid != 0:
                return
        elif self.pid != self.ngpus - 1:
            return
        self.logs.add(name, value, self.epoch, step, self.open[0] if self.open else None, self.where())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.logs.flush()
        records = read_run_logs(self.run_dir, self.run)
        recorded = [r for r in records if r["source"] == "record"]
        mine = [r for r in records if r["source"] == "replay" and r["replay"] == self.replay_id
                and r["worker"] == self.pid]
        s = self.summary
        if not s.header:
            s.header = f"flor: replay {self.replay_id} of {self.settings.name} run {self.run}, worker {self.pid}/{self.ngpus}"
        s.shared_logs, s.log_mismatches, s.hindsight = compare_logs(recorded, mine)
        if s.log_mismatches:
            if any(e.action == "diverged" for e in s.events):
                s.log_cause = "it follows from the diverged blocks above"
            elif self.code_changed:
                s.log_cause = CAUSE_CODE
            else:
                s.log_cause = ("code outside the blocks depends on state that was not passed to end(), "
                               "or on randomness drawn inside a block")
        s.notes = self.notes
        if self.exit_error is not None:
            s.notes.append(f"the script ended with {self.exit_error}")
        report = s.render()
        print(report, file=sys.stderr)
        sys.stderr.flush()
        try:
            self.summary_path.write_text(json.dumps({
                "replay": self.replay_id, "run": self.run, "worker": self.pid, "ngpus": self.ngpus,
                "segment": [self.plan.segment.start, self.plan.segment.stop] if self.plan else None,
                "init": [self.plan.init.start, self.plan.init.stop] if self.plan else None,
                "exit": self.exit_error, **s.to_json(),
            }, indent=1, default=str))
        except OSError as exc:
            print(f"flor: could not write {self.summary_path}: {exc}", file=sys.stderr)
        self.untee_output()
        if self.settings.strict and s.diverged and self.exit_error is None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)
