"""flor.launch.report: the merged summary of a launch, read from its workers' summary files:
missing workers, notes once, the exit status of a divergence.
"""

from __future__ import annotations

import json

import pytest

from flor.launch.report import merged_summary


def test_merged_summary_lists_missing_workers(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    block = {"epoch": 0, "block": "b", "occurrence": 0, "action": "restored", "initializing": False,
             "tensors": [], "cause": None}
    (logs / "replay-r1-0.summary.json").write_text(json.dumps({
        "replay": "r1", "worker": 0, "ngpus": 3, "segment": [0, 1], "init": [0, 0], "exit": None,
        "verdict": "verified exact", "counts": {"restored": 1}, "shared_logs": 2, "log_mismatches": [],
        "hindsight": ["w"], "notes": ["n"], "blocks": [block]}))
    (logs / "replay-r1-1.summary.json").write_text(json.dumps({
        "replay": "r1", "worker": 1, "ngpus": 3, "segment": [1, 2], "init": [0, 1], "exit": "ValueError",
        "verdict": "failed", "counts": {}, "shared_logs": 0, "log_mismatches": [], "hindsight": [], "notes": ["n"],
        "blocks": []}))
    out = merged_summary(tmp_path, "r1")
    assert out["workers"] == 3 and out["missing"] == [1, 2] and out["verdict"] == "failed"
    assert "worker 2: missing" in out["text"] and "worker 1 failed (ValueError)" in out["text"]
    assert out["text"].count("note: n") == 1 and "hindsight values: w" in out["text"]


@pytest.mark.parametrize("lenient, status", [(False, "exit status 3 (--flor_lenient keeps 0)"),
                                             (True, "exit status 0 (--flor_lenient)")])
def test_the_merged_summary_says_the_exit_status_of_a_divergence(tmp_path, lenient, status):
    from flor.launch.report import merged_summary

    (tmp_path / "logs").mkdir()
    for w in range(2):  # worker 1's loop stopped at another epoch than recorded: only its summary says so
        (tmp_path / "logs" / f"replay-r1-{w}.summary.json").write_text(json.dumps({
            "segment": [w, w + 1], "init": [0, w], "verdict": "diverged" if w else "verified exact",
            "blocks": [], "loop": ["the loop stopped at epoch 1"] if w else [], "lenient": lenient}))
    text = merged_summary(tmp_path, "r1", 2)["text"]
    last = text.splitlines()[-1]
    assert last.startswith("flor: replay DIVERGED") and last.endswith(status), text


def test_a_file_several_workers_wrote_again_is_named_once_with_the_workers(tmp_path):
    """Each worker says FL340 for an unguarded write; the launch names the files more than one of
    them wrote (FL341), with which: ``ckpt.pt`` by workers 0 and 2, ``plot.png`` by worker 1 only."""
    (tmp_path / "logs").mkdir()
    wrote = {0: ["/w/ckpt.pt"], 1: ["/w/plot.png"], 2: ["/w/ckpt.pt", 7]}  # a damaged entry is skipped
    for w, paths in wrote.items():
        (tmp_path / "logs" / f"replay-r1-{w}.summary.json").write_text(json.dumps({
            "segment": [w, w + 1], "init": [w, w], "verdict": "verified exact", "blocks": [], "rewrote": paths,
            "notes": [f"FL340 this replay writes {p}" for p in paths if isinstance(p, str)]}))
    out = merged_summary(tmp_path, "r1", 3)
    assert out["raced"] == {"/w/ckpt.pt": [0, 2]}
    assert [n.split(" of this")[0] for n in out["notes"] if n.startswith("FL341")] == ["FL341 workers 0, 2"]
    assert "FL341 workers 0, 2 of this replay each wrote /w/ckpt.pt" in out["text"]
    assert "/w/plot.png" not in out["text"].split("FL341")[1]


def _new_logs(tmp_path, ran: dict[int, list[str]], extra: dict[int, dict]) -> dict:
    """Three workers of a launch of every epoch, each told the edit's two new logs and which ran in its segment."""
    (tmp_path / "logs").mkdir(exist_ok=True)
    new = [["late", "flor.log('late', ...) at line 34, in train()"], ["gn", "flor.log('gn', ...) at line 40"]]
    for w, names in ran.items():
        (tmp_path / "logs" / f"replay-r1-{w}.summary.json").write_text(json.dumps({
            "segment": [w, w + 1], "init": [w, w], "verdict": "verified exact", "blocks": [], "new_logs": new,
            "ran_new": names, **extra.get(w, {})}))
    return merged_summary(tmp_path, "r1", 3)


def test_a_new_log_no_worker_of_a_launch_ran_is_named_and_not_exact(tmp_path):
    """A segment does not know whether another ran a new flor.log; the launch does: 'gn' ran only in
    worker 2's segment (no FL338), 'late' in none (FL338, NOT EXACT, exit status 3)."""
    out = _new_logs(tmp_path, {0: [], 1: [], 2: ["gn"]}, {})
    assert [c["code"] for c in out["conditions"]] == ["FL338"] and out["verdict"] == "not exact"
    assert "FL338 the hindsight flor.log('late', ...) at line 34, in train() never ran in any worker" in out["text"]
    assert "'gn'" not in out["text"] and out["text"].splitlines()[-1].startswith("flor: replay NOT EXACT")


@pytest.mark.parametrize("ran, extra", [({0: [], 1: ["late"], 2: ["gn"]}, {}),  # each ran somewhere
                                        ({0: [], 1: []}, {}),  # worker 2 missing: not known
                                        ({0: [], 1: [], 2: []}, {2: {"new_logs": None}})])  # one did not tell
def test_no_fl338_where_every_new_log_ran_or_a_worker_did_not_tell(tmp_path, ran, extra):
    out = _new_logs(tmp_path, ran, extra)
    assert "FL338" not in out["text"] and "FL338" not in [c["code"] for c in out["conditions"]]


def test_the_plan_says_every_count_with_the_launchers_own_time_as_its_estimated_time():
    """`--plan` said "estimated time: 4.6 s" (the launcher's 0.5 s included) beside "fastest: 1 worker(s),
    estimated 3.7 s" (not included), so a count looked 24% slower than it was estimated."""
    import io

    from flor.launch.estimate import ReplayEstimate
    from flor.launch.report import print_plan
    from flor.plan import make_plan
    from flor.store.runmeta import RunMeta

    meta = RunMeta("x", "20261208T000000.000000-abcdef")
    meta.epochs_done = meta.epochs_planned = 6
    plans = [make_plan(6, p, 2, set(range(6))) for p in range(2)]
    est = ReplayEstimate(2, plans, [3.5, 4.0], (1, 3.7), {1: 3.7}, 3.0, "measured", set(), 2.0, 2, launcher_s=0.5)
    out = io.StringIO()
    print_plan(est, name="x", run=meta.run, meta=meta, gpus=[], within=None, out=out)
    text = out.getvalue()
    assert "estimated time: 4.5 s" in text and "fastest: 1 worker(s), estimated 4.2 s  (by worker count: 1: 4.2 s)" in text
