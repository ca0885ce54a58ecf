"""Every file name of a run directory, in one place (DESIGN.md §3).

::

    runs/<run>/
      run.json                          RunMeta
      source/<script>, source/diff.patch
      checkpoints/<block>/<key>.json    manifests (``checkpoint_key``)
      logs/record.jsonl, logs/record-rank<R>.jsonl
      logs/state.jsonl                  the loop's plain-data variables after each epoch, and what code
                                        outside the blocks changed in place before each block run
      logs/replay-<replay>-<worker>.jsonl, .summary.json
      logs/launch-<replay>.json         a ``flor replay`` launch
      stdout.log, stdout-rank<R>.log, replay-<replay>-<worker>.log (+ .marks.jsonl beside each)
      tb/record/, tb/replay-<replay>/   TensorBoard events
      attempts/<replay>-<worker>-<n>/   an earlier attempt of a replay worker
      transplants/<sha12>/<script>      the run's own script with today's logging (``flor replay --all``)

A replay worker's files share one stem, ``replay-<replay>-<worker>``; ``parse_replay_stem``
reads it back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunLayout", "marks_of", "parse_replay_stem", "replay_stem"]

_REPLAY_STEM = re.compile(r"^replay-(?P<replay>[A-Za-z0-9._-]+)-(?P<worker>\d+)$")


def replay_stem(replay: str, worker: int) -> str:
    """``replay-<replay>-<worker>``: the stem of every file of one replay worker.

    >>> replay_stem("20261201T0700ab", 3)
    'replay-20261201T0700ab-3'
    """
    return f"replay-{replay}-{worker}"


def parse_replay_stem(stem: str) -> tuple[str, int] | None:
    """``(replay, worker)`` from a replay worker's file stem, None for any other name.

    >>> parse_replay_stem("replay-20261201T0700ab-3")
    ('20261201T0700ab', 3)
    >>> parse_replay_stem("record") is None
    True
    """
    m = _REPLAY_STEM.match(stem)
    return (m["replay"], int(m["worker"])) if m else None


def marks_of(log: Path) -> Path:
    """The side file of epoch marks of an output log: ``stdout.log`` -> ``stdout.marks.jsonl``."""
    return log.with_name(log.stem + ".marks.jsonl")


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory."""

    root: Path

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def source(self) -> Path:
        return self.root / "source"

    @property
    def diff_patch(self) -> Path:
        return self.source / "diff.patch"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def record_log(self) -> Path:
        return self.logs / "record.jsonl"

    @property
    def state(self) -> Path:
        """The loop's plain-data variables at the end of each epoch, and the in-place changes code
        outside the blocks made before each block run (``flor.watch.loop.StateFile``)."""
        return self.logs / "state.jsonl"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"record-rank{rank}.jsonl"

    def rank_logs(self) -> list[tuple[int, Path]]:
        """``(rank, path)`` of the other ranks' logs of a distributed recording, by rank."""
        found = [(p.stem[len("record-rank"):], p) for p in self.logs.glob("record-rank*.jsonl")]
        return sorted((int(r), p) for r, p in found if r.isdigit())

    @property
    def stdout(self) -> Path:
        return self.root / "stdout.log"

    def rank_stdout(self, rank: int) -> Path:
        return self.root / f"stdout-rank{rank}.log"

    def replay_log(self, replay: str, worker: int) -> Path:
        return self.logs / f"{replay_stem(replay, worker)}.jsonl"

    def replay_summary(self, replay: str, worker: int) -> Path:
        return self.logs / f"{replay_stem(replay, worker)}.summary.json"

    def replay_output(self, replay: str, worker: int) -> Path:
        return self.root / f"{replay_stem(replay, worker)}.log"

    def replay_marks(self, replay: str, worker: int) -> Path:
        return marks_of(self.replay_output(replay, worker))

    def replay_files(self, replay: str, worker: int) -> list[Path]:
        """Everything one replay worker writes (its TensorBoard file is in ``tb_replay``)."""
        return [self.replay_log(replay, worker), self.replay_summary(replay, worker),
                self.replay_output(replay, worker), self.replay_marks(replay, worker)]

    def replay_logs(self) -> list[tuple[str, int, Path]]:
        """``(replay, worker, path)`` of every replay worker's log file."""
        return self._by_stem(self.logs.glob("replay-*.jsonl"), ".jsonl")

    def replay_summaries(self, replay: str | None = None) -> list[tuple[str, int, Path]]:
        """``(replay, worker, path)`` of the workers' summaries, of one replay or of all."""
        found = self._by_stem(self.logs.glob("replay-*.summary.json"), ".summary.json")
        return [x for x in found if replay is None or x[0] == replay]

    def replay_outputs(self) -> list[tuple[str, int, Path]]:
        """``(replay, worker, path)`` of every replay worker's printed output."""
        return self._by_stem(self.root.glob("replay-*.log"), ".log")

    @staticmethod
    def _by_stem(paths: object, suffix: str) -> list[tuple[str, int, Path]]:
        out = []
        for p in paths:  # type: ignore[attr-defined]
            parsed = parse_replay_stem(p.name[: -len(suffix)])
            if parsed is not None:
                out.append((*parsed, p))
        return sorted(out, key=lambda x: (x[0], x[1]))

    def attempt(self, replay: str, worker: int, n: int) -> Path:
        """Where the ``n``-th earlier attempt of a replay worker is kept."""
        return self.root / "attempts" / f"{replay}-{worker}-{n}"

    def transplant(self, digest: str, script: str) -> Path:
        """Where a transplanted script is kept: by its content's sha256 (``digest[:12]``), so the same
        ``flor replay`` command finds the same file again when it resumes."""
        return self.root / "transplants" / digest[:12] / Path(script).name

    def launch_record(self, replay: str) -> Path:
        return self.logs / f"launch-{replay}.json"

    def launch_records(self) -> list[Path]:
        return sorted(self.logs.glob("launch-*.json"))

    @property
    def tb_record(self) -> Path:
        return self.root / "tb" / "record"

    def tb_replay(self, replay: str) -> Path:
        return self.root / "tb" / f"replay-{replay}"
