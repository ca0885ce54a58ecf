"""flor.analysis.metrics: regex metric definitions on lines real training scripts print, and a
run's printed lines by epoch with the replay rules.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flor.analysis.metrics import MAX_DEFINITIONS, extract, load_definitions, printed_lines
from flor.errors import ConfigError

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
