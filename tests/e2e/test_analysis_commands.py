"""The analysis commands on real recorded runs: a 2-learning-rate x 2-seed sweep of toy.py,
then a two-worker replay of one run that adds a hindsight ``flor.log`` and ``print``.

Everything is checked against what the runs themselves logged: CSV values, the statistics
computed by hand here, the PNGs' pixel sizes, and the TensorBoard events as TensorBoard's
own reader loads them.
"""

from __future__ import annotations

import csv
import io
import json
import math
import struct
from pathlib import Path

import pytest

from helpers import Runner

EPOCHS = 3
LRS = ("0.01", "0.03")
SEEDS = ("0", "1")
SWEEP_EDITS = {
    # parse_known_args: flor.arg's --width must get past the script's own parser
    "args = parser.parse_args()": 'args, _ = parser.parse_known_args()\nwidth = flor.arg("width", 24)',
    "torch.nn.Linear(12, 24), torch.nn.Dropout(0.25), torch.nn.ReLU(), torch.nn.Linear(24, 2)":
        "torch.nn.Linear(12, width), torch.nn.Dropout(0.25), torch.nn.ReLU(), torch.nn.Linear(width, 2)",
}
WNORM = "float(sum(p.detach().double().norm() for p in net.parameters()))"
HINDSIGHT_EDITS = {**SWEEP_EDITS, "    # OUTER": f'    flor.log("wnorm", {WNORM})\n    print(f"wnorm {{{WNORM}:.6e}}")'}
DEFS = [{"Name": "printed_acc", "Regex": r"acc ([0-9.]+)"}, {"Name": "printed_wnorm", "Regex": r"^wnorm (\S+)$"}]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    r = Runner(tmp_path_factory.mktemp("sweep"))
    script = r.script(edits=SWEEP_EDITS, dest="train.py")
    for lr in LRS:
        for seed in SEEDS:
            r.run(script, "--epochs", str(EPOCHS), "--lr", lr, "--seed", seed, "--flor", "toy")
    runs = sorted(p.name for p in (r.home / "toy" / "runs").iterdir())
    hindsight = r.script(edits=HINDSIGHT_EDITS, dest="train.py")  # the user edits the script in place
    env = r.env(FLOR_REPLAY_ID="hs1")
    procs = [r.run(hindsight, "--epochs", str(EPOCHS), "--lr", LRS[-1], "--seed", SEEDS[-1], "--width", "30",
                   "--flor", "toy", "--replay_flor", f"{w}/2", env=env) for w in (0, 1)]
    (r.cwd / "defs.json").write_text(json.dumps(DEFS))
    return {"r": r, "runs": runs, "replayed": runs[-1], "procs": procs}


def run_dir(sweep: dict, run: str) -> Path:
    return sweep["r"].home / "toy" / "runs" / run


def flor_ok(sweep: dict, *args: str) -> str:
    return sweep["r"].flor(*args).stdout


def recorded(sweep: dict, run: str) -> dict[tuple[str, int], float]:
    out = {}
    for line in (run_dir(sweep, run) / "logs" / "record.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[(rec["name"], rec["epoch"])] = rec["value"]
    return out


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


# -- run metadata ---------------------------------------------------------------------------

def test_run_json_holds_hyperparameters_versions_and_results(sweep):
    for i, run in enumerate(sweep["runs"]):
        meta = json.loads((run_dir(sweep, run) / "run.json").read_text())
        lr, seed = LRS[i // 2], SEEDS[i % 2]
        assert meta["hyperparameters"] == {"epochs": EPOCHS, "lr": float(lr), "seed": int(seed), "width": 24}
        assert {"python", "torch", "cuda", "host"} <= set(meta["versions"])
        assert meta["status"] == "finished" and meta["ended"] >= meta["started"]
        acc = recorded(sweep, run)
        final = meta["metrics"]["acc"]["final"]
        assert (final["epoch"], final["value"]) == (EPOCHS - 1, acc[("acc", EPOCHS - 1)])
        best = max(range(EPOCHS), key=lambda e: acc[("acc", e)])
        assert meta["metrics"]["acc"]["best"]["value"] == acc[("acc", best)]
        assert meta["metrics"]["acc"]["goal"] == "max"


def test_flor_arg_replays_the_recorded_value(sweep):
    for proc in sweep["procs"]:
        assert "the command line asks for 30, the recording used 24" in proc.stderr
        assert "replay verified exact" in proc.stderr  # width 30 would not even load the weights


def test_stdout_log_is_untouched_and_marked_by_epoch(sweep):
    d = run_dir(sweep, sweep["runs"][0])
    text = (d / "stdout.log").read_text()
    assert text.splitlines()[0].startswith("epoch 0 acc")
    marks = [json.loads(x) for x in (d / "stdout.marks.jsonl").read_text().splitlines()]
    epochs = [m for m in marks if m["mark"] == "epoch"]
    assert [m["epoch"] for m in epochs] == list(range(EPOCHS))
    for m in epochs:  # each epoch's output starts at its mark
        assert text.encode()[m["at"]:].startswith(f"epoch {m['epoch']} acc".encode())


# -- show, logs ------------------------------------------------------------------------------

def test_show_summarizes_a_run(sweep):
    out = flor_ok(sweep, "show", "toy")
    run = sweep["replayed"]
    assert out.splitlines()[0] == f"toy run {run}: finished"
    assert f"hyperparameters epochs={EPOCHS} lr={LRS[-1]} seed={SEEDS[-1]} width=24" in out
    assert f"{EPOCHS} of {EPOCHS} done" in out and "3 (training_loop)" in out
    assert "hs1: 2 worker(s), verified exact; hindsight: wnorm" in out
    acc = recorded(sweep, run)[("acc", EPOCHS - 1)]
    assert any(line.split()[:2] == ["acc", f"{acc:.6g}"] for line in out.splitlines())
    assert any(line.split()[0] == "wnorm" and line.rstrip().endswith("hindsight") for line in out.splitlines()
               if line.strip())
    first = flor_ok(sweep, "show", "toy", sweep["runs"][0][:20])
    assert f"lr={LRS[0]} seed={SEEDS[0]}" in first and "replays         none" in first


def test_logs_table_shows_record_and_hindsight_side_by_side(sweep):
    out = flor_ok(sweep, "logs", "toy", "--format", "table").splitlines()
    head = out[0].split()
    assert head == ["run", "epochs", "lr", "seed", "width", "epoch", "acc", "jitter", "log.step", "wnorm*"]
    rows = [line.split() for line in out[1:1 + EPOCHS]]
    acc = recorded(sweep, sweep["replayed"])
    assert [float(r[head.index("acc")]) for r in rows] == pytest.approx([acc[("acc", e)] for e in range(EPOCHS)],
                                                                       abs=5e-6)
    assert all(r[head.index("wnorm*")] for r in rows) and out[-1].startswith("* hindsight")


def test_logs_csv_is_exact_and_carries_hyperparameters(sweep):
    out = flor_ok(sweep, "logs", "toy", "--run", "all", "--format", "csv", "--wide")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == len(sweep["runs"]) * EPOCHS
    for row in rows:
        assert float(row["acc"]) == recorded(sweep, row["run"])[("acc", int(row["epoch"]))]  # every digit
        i = sweep["runs"].index(row["run"])
        assert (row["lr"], row["seed"]) == (LRS[i // 2], SEEDS[i % 2])
    assert {r["wnorm"] != "" for r in rows if r["run"] == sweep["replayed"]} == {True}
    long = list(csv.DictReader(io.StringIO(flor_ok(sweep, "logs", "toy", "--format", "csv", "--newest"))))
    assert {r["name"] for r in long} == {"acc", "jitter", "step", "wnorm"}
    assert {r["source"] for r in long} == {"replay"} and {r["hp.lr"] for r in long} == {LRS[-1]}


def test_dataframe_has_one_row_per_run_and_epoch(sweep):
    pd = pytest.importorskip("pandas")
    import flor
    from flor.analysis import dataframe

    df = dataframe("acc", "wnorm", name="toy", home=sweep["r"].home, hparams=True)
    assert len(df) == len(sweep["runs"]) * EPOCHS and list(df.columns[:3]) == ["run", "epochs", "lr"]
    last = df[df.run == sweep["replayed"]]
    assert last.wnorm.notna().all() and df[df.run != sweep["replayed"]].wnorm.isna().all()
    assert isinstance(df, pd.DataFrame) and callable(flor.dataframe)

    from flor.analysis.metrics import analytics_frame

    tja = analytics_frame("toy", DEFS[:1], run=sweep["runs"][0], home=sweep["r"].home)
    assert list(tja.columns[:4]) == ["timestamp", "metric_name", "value", "epoch"]
    assert list(tja.epoch) == list(range(EPOCHS)) and set(tja.metric_name) == {"printed_acc"}


# -- compare -----------------------------------------------------------------------------------

def test_compare_statistics_match_hand_computed_values(sweep):
    out = flor_ok(sweep, "compare", "toy", "--by", "lr", "--metric", "acc", "--format", "csv")
    got = {row["lr"]: row for row in csv.DictReader(io.StringIO(out))}
    for i, lr in enumerate(LRS):
        finals = [recorded(sweep, sweep["runs"][2 * i + j])[("acc", EPOCHS - 1)] for j in range(len(SEEDS))]
        mean = sum(finals) / len(finals)
        std = math.sqrt(sum((x - mean) ** 2 for x in finals) / (len(finals) - 1))  # sample std
        row = got[lr]
        assert int(row["n"]) == 2
        assert float(row["mean"]) == pytest.approx(mean, rel=1e-12)
        assert float(row["std"]) == pytest.approx(std, rel=1e-12)
        assert (float(row["min"]), float(row["max"])) == (min(finals), max(finals))
    ranked = sorted(got.values(), key=lambda r: int(r["rank"]))
    assert float(ranked[0]["mean"]) >= float(ranked[1]["mean"])  # higher accuracy ranks first

    table = flor_ok(sweep, "compare", "toy", "--by", "lr", "--metric", "acc").splitlines()
    assert table[0] == "acc: final value of each run, grouped by lr (higher is better); 4 runs"
    assert table[1].split() == ["rank", "lr", "n", "mean", "±", "std", "min", "max"]
    assert table[2].split()[:3] == ["1", ranked[0]["lr"], "2"]


def test_compare_plots_mean_and_band(sweep):
    out = flor_ok(sweep, "compare", "toy", "--by", "lr", "--metric", "acc", "--plot", "cmp.png")
    png = sweep["r"].cwd / "cmp.png"
    assert png_size(png) == (800, 360)
    kept = run_dir(sweep, sweep["runs"][-1]) / "plots" / "cmp.png"
    assert kept.read_bytes() == png.read_bytes() and f"wrote {kept}" in out


# -- plot ----------------------------------------------------------------------------------------

def test_plot_overlays_runs_with_epoch_axis(sweep):
    out = flor_ok(sweep, "plot", "toy", "acc", "wnorm", "-o", "curves.png")
    assert png_size(sweep["r"].cwd / "curves.png") == (800, 680)  # two panels
    assert (run_dir(sweep, sweep["runs"][-1]) / "plots" / "curves.png").is_file() and "wrote" in out


# -- TensorBoard ---------------------------------------------------------------------------------

def test_tensorboard_events_read_back_with_tensorboard(sweep):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    run = sweep["replayed"]
    acc = recorded(sweep, run)
    rec = ea_mod.EventAccumulator(str(run_dir(sweep, run) / "tb" / "record"))
    rec.Reload()
    assert set(rec.Tags()["scalars"]) == {"acc", "jitter", "step"}
    assert [(e.step, e.value) for e in rec.Scalars("acc")] == \
        [(e, pytest.approx(acc[("acc", e)], rel=1e-6)) for e in range(EPOCHS)]
    rep = ea_mod.EventAccumulator(str(run_dir(sweep, run) / "tb" / "replay-hs1"))
    rep.Reload()
    # acc, jitter and step were re-logged identically: only the hindsight value is new
    assert rep.Tags()["scalars"] == ["wnorm"]
    assert sorted(e.step for e in rep.Scalars("wnorm")) == list(range(EPOCHS))
    assert len(list((run_dir(sweep, run) / "tb" / "replay-hs1").iterdir())) == 2  # one file per worker


# -- regex metrics -----------------------------------------------------------------------------

def test_metrics_from_printed_lines(sweep):
    run = sweep["replayed"]
    out = flor_ok(sweep, "metrics", "toy", "--definitions", "defs.json", "--format", "csv", "--newest")
    rows = list(csv.DictReader(io.StringIO(out)))
    every = list(csv.DictReader(io.StringIO(flor_ok(sweep, "metrics", "toy", "--definitions", "defs.json",
                                                    "--format", "csv"))))
    acc = recorded(sweep, run)
    got = {(r["name"], int(r["epoch"])): float(r["value"]) for r in rows}
    assert set(got) == {(n, e) for n in ("printed_acc", "printed_wnorm") for e in range(EPOCHS)}
    for e in range(EPOCHS):
        assert got[("printed_acc", e)] == pytest.approx(acc[("acc", e)], abs=5e-7)  # printed with 6 decimals
    replayed = {(json.loads(x)["epoch"]): json.loads(x)["value"]
                for p in (run_dir(sweep, run) / "logs").glob("replay-hs1-*.jsonl")
                for x in p.read_text().splitlines() if json.loads(x)["name"] == "wnorm"}
    for e in range(EPOCHS):  # hindsight print == hindsight flor.log, to the printed precision
        assert got[("printed_wnorm", e)] == pytest.approx(replayed[e], rel=1e-6)
    # worker 1 printed its initialization epoch too; those lines are not reported
    assert sorted(int(r["epoch"]) for r in every if r["name"] == "printed_wnorm") == list(range(EPOCHS))
    assert {r["source"] for r in every if r["name"] == "printed_acc"} == {"record", "replay"}


def test_metrics_analytics_table(sweep):
    inline = json.dumps(DEFS[:1])
    out = flor_ok(sweep, "metrics", "toy", "--run", "all", "--definitions", inline, "--format", "analytics")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["timestamp", "metric_name", "value", "epoch", "run", "source", "replay"]
    record_rows = [r for r in rows if r["source"] == "record"]
    assert len(record_rows) == len(sweep["runs"]) * EPOCHS
    for run in sweep["runs"]:
        mine = [r for r in record_rows if r["run"] == run]
        assert [int(r["epoch"]) for r in mine] == list(range(EPOCHS))
        times = [float(r["timestamp"]) for r in mine]
        assert times == sorted(times) and times[0] >= 0


def test_plot_and_compare_take_regex_metrics(sweep):
    flor_ok(sweep, "plot", "toy", "printed_acc", "--definitions", "defs.json", "-o", "printed.png")
    assert png_size(sweep["r"].cwd / "printed.png") == (800, 360)
    out = flor_ok(sweep, "compare", "toy", "--by", "lr", "--metric", "printed_acc", "--definitions", "defs.json")
    assert "printed_acc: final value of each run, grouped by lr" in out


# -- errors and help --------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (("show", "nosuch"), "no experiment 'nosuch'"),
    (("show", "toy", "zzz"), "run 'zzz' of toy is unknown"),
    (("logs", "toy", "--metric", "nope"), "'nope' is not among the names toy logged"),
    (("plot", "toy", "nope", "-o", "x.png"), "logged 'nope'"),
    (("plot", "toy", "acc", "--x", "step"), "plot it with --x epoch"),
    (("compare", "toy", "--by", "lrr", "--metric", "acc"),
     "hyperparameter 'lrr'; the runs have: epochs, lr, seed, width"),
    (("compare", "toy", "--by", "lr", "--metric", "nope"), "no run of toy logged 'nope'"),
    (("compare", "toy", "--by", "lr", "--metric", "acc", "--at", "99"), "no acc at epoch 99"),
    (("metrics", "toy", "--definitions", "missing.json"), "metric definitions file 'missing.json' not found"),
    (("metrics", "toy", "--definitions", '[{"Name": "x", "Regex": "acc"}]'), "has no group"),
])
def test_errors_exit_2_with_one_line(sweep, args, message):
    proc = sweep["r"].flor(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("flor: error: ") and message in proc.stderr


@pytest.mark.parametrize("command", ["logs", "metrics", "show", "plot", "compare"])
def test_help_has_examples(sweep, command):
    out = sweep["r"].flor(command, "--help").stdout
    assert "examples:" in out and f"flor {command} " in out
