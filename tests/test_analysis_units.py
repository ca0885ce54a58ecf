"""Units of flor.analysis and flor.hparams, on hand-made stores and real-world printed lines."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from flor import hparams
from flor.analysis import compare, records
from flor.analysis.compare import Group, render
from flor.analysis.metrics import MAX_DEFINITIONS, extract, load_definitions, printed_lines
from flor.logs import merge_newest, record_key, same_value
from flor.store.runlogs import retire_worker_files
from flor.logs.summary import goal_of, summarize
from flor.logs.tensorboard import EventFileWriter, global_step, write_replay_events
from flor.errors import ConfigError
from flor.store.runmeta import FORMAT as RUN_FORMAT
from flor.verify import compare_logs


def fake_run(home: Path, name: str, run: str, hp: dict, values: dict[str, list], *, status: str = "finished",
             replay: dict[str, list] | None = None) -> Path:
    """A run folder as a recording leaves it: run.json and logs (one value per epoch)."""
    d = home / name / "runs" / run
    (d / "logs").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"name": name, "run": run, "status": status, "hyperparameters": hp,
                                            "format": RUN_FORMAT}))

    def lines(vals: dict[str, list], t0: float) -> str:
        return "".join(json.dumps({"name": n, "value": v, "epoch": e, "step": None, "block": None, "t": t0 + e}) + "\n"
                       for n, vs in vals.items() for e, v in enumerate(vs))

    (d / "logs" / "record.jsonl").write_text(lines(values, 0))
    if replay:
        (d / "logs" / "replay-r1-0.jsonl").write_text(lines(replay, 100))
    return d


# -- statistics -----------------------------------------------------------------------------------

def test_group_statistics_by_hand():
    g = Group(("x",), [])
    g.runs = [type("R", (), {"value": v})() for v in (1.0, 2.0, 4.0)]
    assert g.n == 3 and g.mean == pytest.approx(7 / 3)
    # sample std: sqrt(((1-7/3)^2 + (2-7/3)^2 + (4-7/3)^2) / (3-1)) = sqrt(7/3)
    assert g.std == pytest.approx(math.sqrt(7 / 3)) and (g.min, g.max) == (1.0, 4.0)
    g.runs = g.runs[:1]
    assert g.std is None  # one run has no sample std


@pytest.fixture
def store(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    fake_run(home, "sw", "r1", {"lr": 0.1, "seed": 0}, {"loss": [3.0, 2.0, 1.0]})
    fake_run(home, "sw", "r2", {"lr": 0.1, "seed": 1}, {"loss": [3.0, 1.5, 2.0]})
    fake_run(home, "sw", "r3", {"lr": 0.5, "seed": 0}, {"loss": [4.0, 0.5, 0.7]},
             replay={"loss": [4.0, 0.5, 0.6], "gnorm": [9.0, 8.0, 7.0]})
    fake_run(home, "sw", "r4", {"lr": 0.5, "seed": 1}, {"loss": [4.0, 0.9]}, status="crashed")
    return home


def test_compare_final_best_and_epoch(store):
    c = compare(["sw"], by=["lr"], metric="loss", home=store)
    assert c.goal == "min" and [g.key for g in c.groups] == [(0.5,), (0.1,)]  # lower loss ranks first
    best, worst = c.groups
    assert best.values == [0.6]  # r3's replay replaced the recorded 0.7; crashed r4 is left out
    assert worst.values == [1.0, 2.0] and worst.mean == 1.5 and worst.std == pytest.approx(math.sqrt(0.5))
    assert c.excluded == [("r4", "status crashed")]
    assert compare(["sw"], by=["lr"], metric="loss", at="best", home=store).groups[1].values == [1.0, 1.5]
    assert compare(["sw"], by=["lr"], metric="loss", at=0, home=store).groups[0].values == [3.0, 3.0]
    with_crashed = compare(["sw"], by=["lr"], metric="loss", home=store, unfinished=True)
    assert sorted(with_crashed.groups[0].values) == [0.6, 0.9]
    assert compare(["sw"], by=["lr"], metric="loss", goal="max", home=store).groups[0].key == (0.1,)
    text = render(c).splitlines()
    assert text[0] == "loss: final value of each run, grouped by lr (lower is better); 3 runs"
    assert text[2].split() == ["1", "0.5", "1", "0.6", "±", "-", "0.6", "0.6"]
    assert text[3].split() == ["2", "0.1", "2", "1.5", "±", "0.70711", "1", "2"]


def test_compare_by_two_hyperparameters(store):
    c = compare(["sw"], by=["lr", "seed"], metric="loss", home=store)
    assert sorted(g.key for g in c.groups) == [(0.1, 0), (0.1, 1), (0.5, 0)]


def test_newest_replay_wins_and_hindsight_is_marked(store):
    recs = {(r["name"], r["epoch"]): r for r in records("sw", run="r3", home=store, newest=True)}
    assert recs[("loss", 2)]["value"] == 0.6 and recs[("loss", 2)]["source"] == "replay"
    assert not recs[("loss", 2)]["hindsight"]  # the recording had a loss at epoch 2 too
    assert recs[("gnorm", 0)]["hindsight"] and not recs[("loss", 0)]["hindsight"]


def test_summary_and_goals():
    assert [goal_of(n) for n in ("val_loss", "error_rate", "perplexity", "val_acc", "f1", "bleu")] == \
        ["min", "min", "min", "max", "max", "max"]
    s = summarize([{"name": "loss", "value": v, "epoch": e} for e, v in enumerate([3, 1, 2])]
                  + [{"name": "acc", "value": v, "epoch": e} for e, v in enumerate([0.1, 0.5, 0.4])]
                  + [{"name": "note", "value": "x", "epoch": 0}, {"name": "loss", "value": 0.0, "epoch": None}])
    assert s["loss"]["best"] == {"value": 1, "epoch": 1, "step": None} and s["loss"]["final"]["value"] == 2
    assert s["acc"]["best"]["value"] == 0.5 and "note" not in s


# -- regex metric definitions ------------------------------------------------------------------

# (line as real training scripts print it, regex, the value)
REAL_LINES = [
    ("{'loss': 0.6931, 'grad_norm': 1.23, 'learning_rate': 4.9e-05, 'epoch': 0.5}",  # HF Trainer
     r"'learning_rate': ([0-9.eE+-]+)", 4.9e-05),
    ("Train Epoch: 1 [640/60000 (1%)]\tLoss: 1.675413", r"Loss: ([0-9.]+)", 1.675413),  # pytorch/examples mnist
    ("Train_error=0.138318;  Valid_error=0.324557;", r"Valid_error=(.*?);", 0.324557),  # SageMaker docs' form
    ("469/469 [====] - 3s 6ms/step - loss: 0.2932 - accuracy: 0.9146 - val_loss: 0.1371",  # Keras
     r"val_loss: ([0-9.]+)", 0.1371),
    ("469/469 [====] - 3s 6ms/step - loss: 0.2932 - accuracy: 0.9146 - val_loss: 0.1371", r" - loss: ([0-9.]+)",
     0.2932),
    ("Epoch 0: 100%|##########| 10/10 [00:00<00:00, loss=2.3e+00, v_num=0]", r"loss=([0-9.eE+-]+)", 2.3),
    ("episode 12 reward -12.5", r"reward (-?[0-9.]+)", -12.5),
    ("step 10 lr 1E-3", r"lr (\S+)", 1e-3),
    ("val_loss nan", r"val_loss (\S+)", "nan"),
    ("accuracy: n/a", r"accuracy: (\S+)", None),  # not a number: no value
    ("nothing here", r"loss: (\S+)", None),
]


@pytest.mark.parametrize("line, regex, value", REAL_LINES)
def test_regexes_on_real_printed_lines(line, regex, value):
    (d,) = load_definitions([{"Name": "m", "Regex": regex}])
    got = d.value_in(line)
    if value == "nan":
        assert math.isnan(got)
    else:
        assert got == value


@pytest.mark.parametrize("spec, message", [
    ("[]", "expected a list"),
    ('[{"Name": "a"}]', 'needs a "Name" and a "Regex"'),
    ('[{"Name": "a", "Regex": "a ("}]', "is invalid"),
    ('[{"Name": "a", "Regex": "a [0-9]+"}]', "has no group"),
    ('[{"Name": "a", "Regex": "a (1)"}, {"Name": "a", "Regex": "b (1)"}]', "defined twice"),
    (json.dumps([{"Name": f"m{i}", "Regex": "(1)"} for i in range(MAX_DEFINITIONS + 1)]), "at most 40"),
    ("[{bad json", "not valid JSON"),
    ("nosuchfile.json", "not found"),
])
def test_bad_definitions_are_refused(spec, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_definitions(spec)


def test_definition_shapes(tmp_path):
    path = tmp_path / "defs.json"
    path.write_text(json.dumps({"MetricDefinitions": [{"Name": "a", "Regex": "a=(\\d+)"}]}))
    assert [d.name for d in load_definitions(str(path))] == ["a"]
    assert [d.name for d in load_definitions('{"name": "b", "regex": "b=(\\\\d+)"}')] == ["b"]
    assert len(load_definitions([{"Name": f"m{i}", "Regex": "(1)"} for i in range(MAX_DEFINITIONS)])) == 40


def write_log(path: Path, pieces: list) -> None:
    """Write an output log and its marks: str pieces are printed text, dicts are marks."""
    data, marks = b"", []
    for p in pieces:
        if isinstance(p, dict):
            marks.append({**p, "at": len(data), "t": 1000.0 + len(marks)})
        else:
            data += p.encode()
    path.write_bytes(data)
    path.with_name(path.stem + ".marks.jsonl").write_text("".join(json.dumps(m) + "\n" for m in marks))


def test_printed_lines_by_epoch_with_replay_rules(tmp_path):
    log = tmp_path / "replay-x-1.log"
    write_log(log, [{"mark": "start"}, "setup loss 9\n", {"mark": "epoch", "epoch": 2, "init": True},
                    "loss 5\n", {"mark": "epoch", "epoch": 3, "init": False}, "bar loss 4\rbar loss 3\npart",
                    {"mark": "epoch", "epoch": 4, "init": False}, "ial loss 2\n", {"mark": "after"},
                    "final loss 1\n", {"mark": "end", "worker": 1, "ngpus": 3}, "flor: replay loss 0\n"])
    got = [(line, epoch, loop) for line, epoch, loop, _ in printed_lines(log, worker=1)]
    # worker 1 of 3: no before/after lines, no initialization epoch, no flor report
    assert got == [("bar loss 4", 3, None), ("bar loss 3", 3, None), ("part", 3, None), ("ial loss 2", 4, None)]
    last = [(line, loop) for line, _, loop, _ in printed_lines(log, worker=2)]
    assert ("final loss 1", "after") in last and ("setup loss 9", "before") not in last


def test_extract_indexes_records_and_timestamps(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_log(run / "stdout.log", [{"mark": "start"}, {"mark": "epoch", "epoch": 0}, "loss 0.5 loss 0.4\n",
                                   "loss 0.3\n", {"mark": "epoch", "epoch": 1}, "loss 0.2\n", {"mark": "after"}])
    recs = extract(run, "r", load_definitions([{"Name": "loss", "Regex": r"loss ([0-9.]+)"}]))
    assert [(r["epoch"], r["k"], r["value"], r["timestamp"]) for r in recs] == \
        [(0, 0, 0.5, 2.0), (0, 1, 0.3, 2.0), (1, 0, 0.2, 3.0)]  # first match per line; t at the epoch's end
    assert {r["source"] for r in recs} == {"record"}


def test_unmarked_output_still_yields_values(tmp_path):
    log = tmp_path / "stdout.log"
    log.write_text("loss 1\nloss 2\n")
    assert [(line, epoch) for line, epoch, _, _ in printed_lines(log)] == [("loss 1", None), ("loss 2", None)]


# -- TensorBoard ----------------------------------------------------------------------------------

@pytest.mark.parametrize("rec, x", [
    ({"epoch": 3, "step": None}, 3),
    ({"epoch": 3, "step": 1200}, 1200),
    ({"epoch": 3, "step": 7.0}, 7),
    ({"epoch": 3, "step": "val"}, 3),
    ({"epoch": 3, "step": True}, 3),
    ({"epoch": None, "loop": "before"}, 0),
    ({"epoch": None, "loop": "after"}, 10),
])
def test_global_step(rec, x):
    assert global_step(rec, epochs=10) == x


def test_replay_events_leave_out_identical_values(tmp_path):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    rec = [{"name": "acc", "value": 0.5, "epoch": e, "step": None, "k": 0, "t": 1.0} for e in range(3)]
    mine = [dict(r, value=(0.5 if r["epoch"] < 2 else 0.75)) for r in rec]
    mine += [{"name": "gn", "value": v, "epoch": e, "step": None, "k": 0, "t": 2.0} for e, v in enumerate([1, True])]
    mine += [{"name": "tag", "value": "text", "epoch": 0, "step": None, "k": 0, "t": 2.0}]
    assert write_replay_events(tmp_path / "tb" / "replay-r1", 0, mine, rec, epochs=3) == 3
    ea = ea_mod.EventAccumulator(str(tmp_path / "tb" / "replay-r1"))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("acc")] == [(2, 0.75)]  # only the value that differs
    assert [(e.step, e.value) for e in ea.Scalars("gn")] == [(0, 1.0), (1, 1.0)]
    assert "tag" not in ea.Tags()["scalars"]


def test_event_writer_appends_and_closes_twice(tmp_path):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    w = EventFileWriter(tmp_path)
    w.add_scalar("loss", 2.5, step=-1, wall_time=5.0)
    w.add_scalars([("loss", 1e-30, 2**40, 6.0)])
    w.close()
    w.close()
    ea = ea_mod.EventAccumulator(str(tmp_path))
    ea.Reload()
    assert [(e.step, e.value, e.wall_time) for e in ea.Scalars("loss")] == \
        [(-1, 2.5, 5.0), (2**40, pytest.approx(1e-30), 6.0)]


def test_event_files_are_framed_as_tensorboard_frames_them(tmp_path):
    """flor writes TensorBoard's event files itself (importing TensorBoard's writer on the first
    value stalled training, issue #13): every frame's checksums are TensorBoard's own, and
    values past float32, NaN, non-ASCII tags and negative steps read back."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    w = EventFileWriter(tmp_path, suffix=".7")
    assert w.add_scalars([("lössé/τ", 1e300, -5, 1.5), ("nan", float("nan"), 0, 2.0), ("x", -2.25, 2**62, 3.0)]) == 3
    w.close()
    (path,) = tmp_path.iterdir()
    assert path.name.startswith("events.out.tfevents.") and path.name.endswith(".7")
    data, frames = path.read_bytes(), 0
    while data:
        (n,) = struct.unpack("<Q", data[:8])
        assert struct.unpack("<I", data[8:12])[0] == masked_crc32c(data[:8])
        assert struct.unpack("<I", data[12 + n:16 + n])[0] == masked_crc32c(data[12:12 + n])
        data, frames = data[16 + n:], frames + 1
    assert frames == 4  # the file version, then one per value
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    assert [(e.step, e.value, e.wall_time) for e in ea.Scalars("lössé/τ")] == [(-5, math.inf, 1.5)]
    assert math.isnan(ea.Scalars("nan")[0].value)
    assert [(e.step, e.value) for e in ea.Scalars("x")] == [(2**62, -2.25)]


def test_a_large_batch_is_framed_as_tensorboard_frames_it(tmp_path):
    """Many values in one write take the batched CRC (frames of one size checksummed together):
    each frame's checksums are still TensorBoard's own and every value reads back in order."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from flor.logs.tensorboard import BATCH_CRC_MIN

    tags = ["loss", "lössé/τ", "a" * 300]  # a tag whose length takes a two-byte varint
    items = [(tags[i % 3], i * 0.37 - 50.0, i * 997 - 3000, 1000.0 + i) for i in range(40 * BATCH_CRC_MIN)]
    w = EventFileWriter(tmp_path)
    assert w.add_scalars(items) == len(items)
    w.close()
    (path,) = tmp_path.iterdir()
    data, frames = path.read_bytes(), 0
    while data:
        (n,) = struct.unpack("<Q", data[:8])
        assert struct.unpack("<I", data[8:12])[0] == masked_crc32c(data[:8])
        assert struct.unpack("<I", data[12 + n:16 + n])[0] == masked_crc32c(data[12:12 + n]), frames
        data, frames = data[16 + n:], frames + 1
    assert frames == 1 + len(items)
    ea = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    ea.Reload()
    for tag in tags:
        want = [(step, pytest.approx(value, rel=1e-6), t) for name, value, step, t in items if name == tag]
        assert [(e.step, e.value, e.wall_time) for e in ea.Scalars(tag)] == want


def test_event_writer_that_writes_nothing_leaves_no_file(tmp_path):
    w = EventFileWriter(tmp_path / "tb", suffix=".3")
    assert w.add_scalars([]) == 0
    w.close()
    assert not (tmp_path / "tb").exists()


def test_replay_events_are_one_file_per_worker_and_retired_with_it(tmp_path):
    rec = [{"name": "acc", "value": 0.5, "epoch": 0, "step": None, "k": 0, "t": 1.0}]
    for worker in (0, 1):
        assert write_replay_events(tmp_path / "tb" / "replay-r1", worker, [dict(rec[0], value=0.6)], rec, epochs=1) == 1
    files = sorted(p.name for p in (tmp_path / "tb" / "replay-r1").iterdir())
    assert len(files) == 2 and [f.rsplit(".", 1)[1] for f in files] == ["0", "1"]
    retire_worker_files(tmp_path, "r1", 1)
    assert [p.name for p in (tmp_path / "tb" / "replay-r1").iterdir()] == [files[0]]


# -- record keys and value equality ---------------------------------------------------------------

@pytest.mark.parametrize("a, b, same, exact", [
    (float("nan"), float("nan"), True, True),
    (1, 1.0, True, False),
    (1, True, False, False),
    (True, True, True, True),
    (0.5, 0.75, False, False),
    ("1", 1, False, False),
    (None, None, True, True),
    ([1, 2], [1, 2], True, True),
])
def test_same_value(a, b, same, exact):
    assert same_value(a, b) is same and same_value(b, a) is same
    assert same_value(a, b, exact_type=True) is exact


@pytest.mark.parametrize("step_a, step_b, same", [
    (3, 3, True), (3, 3.0, False), (1, True, False), ("3", 3, False), (None, None, True),
    ([1, 2], [1, 2], True), ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
])
def test_record_key_step_rule(step_a, step_b, same):
    a = {"run": "r", "name": "x", "epoch": 0, "step": step_a}
    b = {"run": "r", "name": "x", "epoch": 0, "step": step_b}
    assert (record_key(a) == record_key(b)) is same


def test_verification_keys_int_and_float_steps_apart_and_values_by_number():
    recorded = [{"name": "loss", "value": 1, "epoch": 0, "step": 3, "k": 0},
                {"name": "loss", "value": float("nan"), "epoch": 1, "step": 3, "k": 0},
                {"name": "acc", "value": 0.5, "epoch": 0, "step": None, "k": 0}]
    replayed = [{"name": "loss", "value": 1.0, "epoch": 0, "step": 3, "k": 0},  # equal: 1 == 1.0
                {"name": "loss", "value": float("nan"), "epoch": 1, "step": 3, "k": 0},  # NaN equals NaN
                {"name": "gn", "value": 2.0, "epoch": 0, "step": 3.0, "k": 0},
                {"name": "acc", "value": 0.5, "epoch": 0, "step": 0.0, "k": 0},  # step 0.0 is not None
                {"name": "acc", "value": 0.25, "epoch": 0, "step": None, "k": 1}]  # a second occurrence
    shared, bad, hindsight = compare_logs(recorded, replayed, key=record_key, same=same_value)
    assert (shared, bad, hindsight) == (2, [], ["acc", "gn"])
    shared, bad, _ = compare_logs(recorded, [dict(replayed[0], value=2)], key=record_key, same=same_value)
    assert shared == 1 and bad == [{"name": "loss", "epoch": 0, "step": 3, "recorded": 1, "replayed": 2}]


def test_merge_newest_uses_the_record_key():
    recs = [{"run": "r", "source": "record", "name": "x", "epoch": 0, "step": [1, 2], "k": 0, "value": 1, "t": 1},
            {"run": "r", "source": "replay", "name": "x", "epoch": 0, "step": [1, 2], "k": 0, "value": 2, "t": 2},
            {"run": "r", "source": "replay", "name": "x", "epoch": 0, "step": 1.0, "k": 0, "value": 3, "t": 2},
            {"run": "r", "source": "record", "name": "x", "epoch": 0, "step": 1, "k": 0, "value": 4, "t": 1}]
    assert [r["value"] for r in merge_newest(recs)] == [2, 3, 4]


# -- hyperparameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, default, value", [
    (["--lr", "0.5"], 0.1, 0.5),
    (["--lr=0.5"], 0.1, 0.5),
    (["--lr", "-1e-3"], 0.1, -1e-3),
    (["--other", "1"], 0.1, 0.1),
    (["--lr", "3"], 1, 3),
    (["--lr"], False, True),
    (["--lr", "no"], True, False),
    (["--lr", "adam"], "sgd", "adam"),
    (["--l-r", "2"], 1, 1),
])
def test_arg_command_line(argv, default, value):
    given, text = hparams._from_command_line("lr", argv)
    assert (hparams._convert("lr", text, default) if given else default) == value


def test_arg_dashes_and_bad_values():
    assert hparams._from_command_line("batch_size", ["--batch-size", "8"]) == (True, "8")
    with pytest.raises(ConfigError, match="not a valid int"):
        hparams._convert("n", "x", 3)


def test_argparse_namespace_is_captured_with_subparsers(monkeypatch):
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", argparse.ArgumentParser.parse_known_args)
    monkeypatch.setattr(hparams, "_CAPTURED", {})
    monkeypatch.setattr(hparams, "_LISTENERS", [])
    seen = []
    hparams.subscribe(seen.append)
    hparams.install_argparse_capture()
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--api-key", default="x")
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("train").add_argument("--epochs", type=int, default=3)
    monkeypatch.setattr("sys.argv", ["train.py", "--lr", "0.2", "train", "--epochs", "5"])
    parser.parse_args()
    parser.parse_args(["--lr", "9", "train"])  # an explicit list is not the command line
    assert hparams.captured() == {"lr": 0.2, "api_key": "***", "cmd": "train", "epochs": 5}
    assert len(seen) == 1


# -- git metadata ---------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_diff_patch_includes_untracked_sources(tmp_path):
    from flor.runinfo import git_info

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "train.py").write_text("print(1)\n")
    git("add", ".")
    git("commit", "-qm", "init")
    (tmp_path / "train.py").write_text("print(2)\n")
    (tmp_path / "helper.py").write_text("X = 1")  # no final newline
    (tmp_path / "weights.bin").write_bytes(b"\0" * 10)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "run.json").write_text("{}")
    info, diff = git_info(str(tmp_path / "train.py"), exclude=[tmp_path / "store"])
    assert info["dirty"] and info["untracked_included"] == ["helper.py"]
    assert "+print(2)" in diff and "+++ b/helper.py" in diff and "weights.bin" not in diff
    patch = tmp_path.parent / "p.patch"
    patch.write_text(diff)
    git("stash", "-u", "-q")
    git("apply", str(patch))  # the patch recreates the code that ran
    assert (tmp_path / "helper.py").read_text() == "X = 1" and (tmp_path / "train.py").read_text() == "print(2)\n"


def test_gpu_query_never_waits_on_a_pipe_another_process_holds(monkeypatch, tmp_path):
    """The GPU query runs on the writer thread while the script forks (a DataLoader's
    persistent workers): a child forked while a pipe to nvidia-smi was open kept a copy, and
    reading the pipe to its end hung the writer for the whole run (its checkpoints were all
    abandoned at exit). Here nvidia-smi itself leaves such a process behind, holding its
    stdout for 30 s: the answer comes when nvidia-smi exits, not when its stdout closes."""
    import os
    import signal
    import time

    from flor.runinfo import gpus

    folder = tmp_path / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    held = tmp_path / "held.pid"
    smi.write_text(f'#!/bin/sh\necho "NVIDIA H200, 143771, 9.0, 580.159.03"\nsleep 30 &\necho $! > {held}\nexit 0\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    found = gpus()
    took = time.monotonic() - t0
    os.kill(int(held.read_text()), signal.SIGKILL)
    assert found.get("gpus") == ["NVIDIA H200"], found
    assert took < 4, took  # subprocess.run's capture waited out its 5 s timeout and found nothing
    smi.write_text("#!/bin/sh\nexec sleep 30\n")  # hangs: given up after the timeout, killed
    from flor.runinfo import _spawn_output

    t0 = time.monotonic()
    assert _spawn_output(["nvidia-smi"], timeout=0.3) is None and time.monotonic() - t0 < 3


def test_gpu_facts_never_make_a_cuda_context(monkeypatch, tmp_path):
    """run.json's GPUs come from torch only where the script has made CUDA's context, else from
    nvidia-smi (a real program on PATH here): flor making the context would put a CUDA
    generator into a CPU script's recorded random state, and its probed replay, which never
    makes one, reported every block diverged (seen on a GPU machine). Older drivers that do
    not know a field are asked again without it."""
    import os

    import torch

    from flor.runinfo import gpus, versions

    touched: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for name in ("get_device_name", "get_device_capability", "get_device_properties", "init", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, _name=name: touched.append(_name))
    folder = tmp_path / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$1" in *compute_cap*) echo "NVIDIA H200, 143771, 9.0, 580.159.03";; esac\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert not {"gpus", "gpu_driver"} & set(versions())
    assert gpus() == {"gpus": ["NVIDIA H200"], "gpu_memory_gb": [140.4], "gpu_capabilities": ["9.0"],
                      "gpu_driver": "580.159.03", "gpu_source": "nvidia-smi"}
    smi.write_text('#!/bin/sh\ncase "$1" in *compute_cap*) echo "A100, 40960, [Field not supported], 470.1";;'
                   ' *) echo "A100, 40960, 470.1";; esac\n')
    assert gpus() == {"gpus": ["A100"], "gpu_memory_gb": [40.0], "gpu_driver": "470.1", "gpu_source": "nvidia-smi"}
    assert touched == []
    smi.unlink()
    assert gpus() == {}
