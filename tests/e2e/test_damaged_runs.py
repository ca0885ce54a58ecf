"""One damaged run in a store must not take the experiment down with it (DESIGN.md §3: a
store is untrusted input).

Three real recordings of toy.py; each test damages one run's files in a copy of the store.
Commands that list or aggregate runs skip the damaged one with one line on stderr naming it,
what is wrong and what to do, and exit 0 with the good runs' output; a command that names the
damaged run exits 2 with one line; a replay of another run is unaffected. Nothing recorded is
changed by any of it.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from helpers import Runner

LRS = ("0.01", "0.02", "0.03")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Runner:
    r = Runner(tmp_path_factory.mktemp("damaged"))
    script = r.script()
    for lr in LRS:
        r.run(script, "--epochs", "2", "--lr", lr, "--flor", "toy")
    return r


@pytest.fixture
def store(recorded: Runner, tmp_path) -> Runner:  # noqa: ANN001
    """A copy of the recorded store and script, to damage."""
    r = Runner(tmp_path)
    shutil.copytree(recorded.home, r.home)
    shutil.copytree(recorded.cwd / "florconfig", r.cwd / "florconfig")  # the key that signed the runs (a sweep)
    shutil.copy(recorded.cwd / "toy.py", r.cwd / "toy.py")
    return r


def runs(r: Runner) -> list[str]:
    return sorted(p.name for p in (r.home / "toy" / "runs").iterdir())


#: run.json contents and a fragment of what the note must say is wrong
DAMAGED_RUN_JSON = {
    "truncated": (b'{"name": "toy", "run', "not valid JSON"),
    "not json": (b"\x00\xff\xfe binary", "not valid JSON"),
    "a list": (b"[1, 2]", "expected a JSON object, found list"),
    "wrong type": (b'{"format": 2, "name": "toy", "run": "r", "status": "finished", "hyperparameters": [1]}',
                   "hyperparameters is list"),
    "bad status": (b'{"format": 2, "name": "toy", "run": "r", "status": "../../etc"}', "status '../../etc' is not one of"),
    "no format": (b'{"name": "toy", "run": "r", "status": "finished"}', "format is None, not a run.json format"),
    "older flor": (b'{"format": 1, "name": "toy", "run": "r", "status": "finished"}',
                   "recorded by flor older than 0.1.0 (format 1); record again"),
    "nested too deep": (b"[" * 100000, "not valid JSON"),
}


def damage(r: Runner, run: str, raw: bytes) -> None:
    (r.home / "toy" / "runs" / run / "run.json").write_bytes(raw)


def one_note(proc, run: str, *fragments: str) -> None:  # noqa: ANN001
    """Exit 0, no traceback, and exactly one line on stderr: the note about ``run``."""
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"flor: FL402 skipped run {run} of toy: "), lines[0]
    for f in (*fragments, "move ", "flor verify toy"):
        assert f in lines[0], (f, lines[0])


def one_error(proc, *fragments: str) -> None:  # noqa: ANN001
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flor: error:"), proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def not_plots(tree: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in tree.items() if "/plots/" not in k}


@pytest.mark.parametrize("kind", list(DAMAGED_RUN_JSON))
def test_commands_over_many_runs_skip_a_damaged_run_json(store: Runner, kind: str) -> None:
    first, bad, last = runs(store)
    raw, why = DAMAGED_RUN_JSON[kind]
    damage(store, bad, raw)
    before = store.tree()
    (store.cwd / "defs.json").write_text(json.dumps([{"Name": "printed_acc", "Regex": r"acc ([0-9.]+)"}]))
    for args in (["logs", "toy", "--run", "all", "--format", "csv"], ["logs", "toy", "--run", "all", "--format", "table"],
                 ["metrics", "toy", "--run", "all", "--definitions", "defs.json"],
                 ["compare", "toy", "--by", "lr", "--metric", "acc"],
                 ["plot", "toy", "acc", "-o", str(store.cwd / "acc.png")]):
        proc = store.flor(*args, check=False)
        one_note(proc, bad, why)
        if args[0] in ("logs", "metrics"):
            assert first in proc.stdout and last in proc.stdout and bad not in proc.stdout, args
    compared = store.flor("compare", "toy", "--by", "lr", "--metric", "acc", "--format", "json", check=False)
    assert [g["lr"] for g in json.loads(compared.stdout)["groups"]] and \
        sorted(g["lr"] for g in json.loads(compared.stdout)["groups"]) == [0.01, 0.03]
    listed = store.flor("ls", "toy", check=False)
    one_note(listed, bad, why)
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
    assert rows == {first: "finished", bad: "damaged", last: "finished"}
    assert not_plots(store.tree()) == not_plots(before)


def test_naming_the_damaged_run_is_one_line_and_exit_2(store: Runner) -> None:
    _, bad, _ = runs(store)
    damage(store, bad, b"[]")
    before = store.tree()
    for args in (["show", "toy", bad], ["logs", "toy", "--run", bad], ["plot", "toy", "acc", "--runs", bad[:24]],
                 ["compare", "toy", "--by", "lr", "--metric", "acc", "--runs", bad]):
        proc = store.flor(*args, check=False)
        one_error(proc, f"run {bad} of toy", "expected a JSON object", "move ")
    assert store.tree() == before


def test_the_latest_is_the_newest_run_that_reads(store: Runner) -> None:
    _, middle, last = runs(store)
    damage(store, last, b"{")
    shown = store.flor("show", "toy", check=False)
    one_note(shown, last, "not valid JSON")
    assert shown.stdout.startswith(f"toy run {middle}: finished")
    logged = store.flor("logs", "toy", check=False)
    one_note(logged, last, "not valid JSON")
    assert {json.loads(line)["run"] for line in logged.stdout.splitlines()} == {middle}


def test_every_run_damaged_is_an_error(store: Runner) -> None:
    for run in runs(store):
        damage(store, run, b"7")
    proc = store.flor("logs", "toy", "--run", "all", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("flor: error: no run of toy")
    proc = store.flor("show", "toy", check=False)
    assert proc.returncode == 2 and "no run of toy" in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_replay_beside_a_damaged_run(store: Runner) -> None:
    """A damaged other run does not touch a replay; a damaged latest run is not swapped for an
    older one behind the user's back (the edited script was meant for it): one line, exit 2,
    nothing written, and --flor_run replays another."""
    first, middle, last = runs(store)
    script = store.script(edits={"    # OUTER": '    flor.log("hs", 1.0)'})
    damage(store, middle, b"[]")
    ok = store.run(script, "--epochs", "2", "--lr", "0.03", "--flor", "toy", "--replay_flor")
    assert "replay verified exact" in ok.stderr.strip().splitlines()[-1]
    damage(store, last, b"[]")
    before = store.tree()
    proc = store.run(script, "--epochs", "2", "--lr", "0.03", "--flor", "toy", "--replay_flor", check=False)
    one_error(proc, "the latest recording cannot be replayed", f"run {last} of toy", "--flor_run")
    assert store.tree() == before
    ok = store.run(script, "--epochs", "2", "--lr", "0.01", "--flor", "toy", "--replay_flor", "--flor_run", first)
    assert "replay verified exact" in ok.stderr.strip().splitlines()[-1]


def test_replay_all_leaves_out_a_damaged_run(store: Runner) -> None:
    first, bad, last = runs(store)
    damage(store, bad, b'{"format": 2, "name": "toy", "run": "r", "status": 3}')
    before = store.tree()
    proc = store.flor("replay", "toy", "--all", "--dry-run", "--", sys.executable, "toy.py", check=False)
    one_note(proc, bad, "status is int 3")
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("run ")] == [first, last]
    assert store.tree() == before


# -- damaged log files ---------------------------------------------------------------------

def _log_dir_in_place(run_dir) -> str:  # noqa: ANN001
    (run_dir / "logs" / "replay-x-0.jsonl").mkdir()
    return "replay-x-0.jsonl: a folder, not a regular file"


def _fifo_in_place(run_dir) -> str:  # noqa: ANN001
    import os

    os.mkfifo(run_dir / "logs" / "replay-x-0.jsonl")  # opening it would wait for a writer forever
    return "replay-x-0.jsonl: a FIFO, not a regular file"


def _marks_of_other_shapes(run_dir) -> str:  # noqa: ANN001
    (run_dir / "stdout.marks.jsonl").write_text(
        '[1]\n{"mark": "epoch", "at": "x", "epoch": 0}\n{"mark": "epoch", "at": 5, "epoch": "z", "t": "q"}\n'
        '{"mark": "end", "at": -9}\n{"mark": "end", "at": 1000000, "ngpus": "2"}\n')
    return ""


def _summary_of_other_types(run_dir) -> str:  # noqa: ANN001
    (run_dir / "logs" / "replay-x-0.summary.json").write_text(
        '{"replay": [1], "script_sha256": [2], "verdict": {}, "hindsight": 5}')
    (run_dir / "logs" / "replay-x-0.jsonl").write_text('{"name": "acc", "value": 1.5, "epoch": 0}\n')
    return ""


@pytest.mark.parametrize("damage_logs", [_log_dir_in_place, _fifo_in_place, _marks_of_other_shapes,
                                         _summary_of_other_types], ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_log_file_costs_only_itself(store: Runner, damage_logs) -> None:  # noqa: ANN001
    first, bad, last = runs(store)
    note = damage_logs(store.home / "toy" / "runs" / bad)
    before = store.tree() if "fifo" not in damage_logs.__name__ else None  # a FIFO cannot be read
    (store.cwd / "defs.json").write_text(json.dumps([{"Name": "printed_acc", "Regex": r"acc ([0-9.]+)"}]))
    for args in (["logs", "toy", "--run", "all", "--format", "csv"], ["show", "toy", bad],
                 ["metrics", "toy", "--run", "all", "--definitions", "defs.json"],
                 ["compare", "toy", "--by", "lr", "--metric", "acc"],
                 ["plot", "toy", "acc", "-o", str(store.cwd / "acc.png")]):
        proc = store.flor(*args, check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        if note and args[0] != "metrics":  # metrics reads printed output, not log files
            assert len(lines) == 1 and lines[0].startswith("flor: FL413 skipped ") and note in lines[0], (args, lines)
        else:
            assert lines == [], (args, lines)
        if args[0] in ("logs", "metrics"):
            assert all(run in proc.stdout for run in (first, bad, last)), args
    if before is not None:
        assert not_plots(store.tree()) == not_plots(before)
