"""Bad input on the ``flor`` command line: one clear line naming the problem and the fix,
exit status 2, no traceback, and nothing already recorded lost or changed."""

from __future__ import annotations

import sys

import pytest

from helpers import Runner


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Runner:
    r = Runner(tmp_path_factory.mktemp("cli"))
    script = r.script()
    r.run(script, "--epochs", "3", "--flor", "toy")
    r.run(script, "--epochs", "3", "--lr", "0.02", "--flor", "toy")
    return r


def _one_line_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flor: error:"), proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def _latest_run(r: Runner) -> str:
    return sorted(p.name for p in (r.home / "toy" / "runs").iterdir())[-1]


# -- 1. flor show NAME all ---------------------------------------------------------------

def test_show_all_is_a_clear_error(two_runs):
    before = two_runs.tree()
    proc = two_runs.flor("show", "toy", "all", check=False)
    _one_line_error(proc, "one run", "flor logs toy --run all")
    assert two_runs.tree() == before
    assert two_runs.flor("show", "toy").returncode == 0  # one run still shows


# -- 2. flor plot -o / flor compare --plot -----------------------------------------------

def _bad_outputs(r: Runner) -> list[tuple[str, str]]:
    return [(str(r.cwd), "is a directory"), ("", "empty"),
            (str(r.cwd / "nodir" / "sub" / "x.png"), "does not exist"),
            ("x.jpg", ".png, .svg or .pdf"), ("curves", ".png, .svg or .pdf")]


@pytest.mark.parametrize("case", range(5))
@pytest.mark.parametrize("command", ["plot", "compare"])
def test_plot_output_is_checked_first(two_runs, command, case):
    out, message = _bad_outputs(two_runs)[case]
    before = two_runs.tree()
    listing = sorted(p.name for p in two_runs.cwd.iterdir())
    args = (["plot", "toy", "acc", "-o", out] if command == "plot"
            else ["compare", "toy", "--by", "lr", "--metric", "acc", "--plot", out])
    proc = two_runs.flor(*args, check=False)
    _one_line_error(proc, message, "-o" if command == "plot" else "--plot")
    if out:
        assert repr(out) in proc.stderr or out in proc.stderr  # the path is named
    assert two_runs.tree() == before  # no stray file in the run's plots/
    assert sorted(p.name for p in two_runs.cwd.iterdir()) == listing  # nothing created beside it
    assert not (two_runs.cwd / "nodir").exists()


@pytest.mark.parametrize("suffix, magic", [(".svg", b"<?xml"), (".pdf", b"%PDF"), (".png", b"\x89PNG")])
def test_plot_writes_the_format_its_suffix_names(two_runs, suffix, magic):
    proc = two_runs.flor("plot", "toy", "acc", "-o", f"acc{suffix}")
    out = two_runs.cwd / f"acc{suffix}"
    kept = two_runs.home / "toy" / "runs" / _latest_run(two_runs) / "plots" / f"acc{suffix}"
    assert out.read_bytes().startswith(magic) and kept.read_bytes().startswith(magic)
    assert f"wrote {out}" in proc.stdout or f"wrote acc{suffix}" in proc.stdout
    out.unlink()
    kept.unlink()


def test_plot_into_a_store_that_cannot_be_written(two_runs):
    """The run's plots/ folder cannot be made (a file is in its way, as on a read-only store):
    without -o that is one error naming the folder and the fix; with -o the plot is written
    there and the missing copy is a warning."""
    blocker = two_runs.home / "toy" / "runs" / _latest_run(two_runs) / "plots"
    aside = blocker.with_name("plots.aside")
    if blocker.exists():  # an earlier test's plots, put back below
        blocker.rename(aside)
    blocker.write_text("not a folder")
    try:
        before = two_runs.tree()
        proc = two_runs.flor("plot", "toy", "acc", check=False)
        _one_line_error(proc, str(blocker), "-o")
        assert two_runs.tree() == before
        proc = two_runs.flor("plot", "toy", "acc", "-o", "elsewhere.png", check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert (two_runs.cwd / "elsewhere.png").read_bytes().startswith(b"\x89PNG")
        assert "no copy could be kept" in proc.stderr
        assert two_runs.tree() == before
    finally:
        blocker.unlink()
        if aside.exists():
            aside.rename(blocker)
        (two_runs.cwd / "elsewhere.png").unlink(missing_ok=True)


# -- 3. flor replay NAME -- a command that does not exist -------------------------------

@pytest.mark.parametrize("command", ["nonexistent_cmd", "./no_such_script.sh"])
def test_replay_command_not_found(two_runs, command):
    before = two_runs.tree()
    proc = two_runs.flor("replay", "toy", "--workers", "1", "--", command, "toy.py", check=False)
    _one_line_error(proc, command, "not found")
    assert two_runs.tree() == before  # no launch record left behind


# -- 4. --workers and --gpus -------------------------------------------------------------

def test_replay_workers_are_capped(two_runs):
    before = two_runs.tree()
    proc = two_runs.flor("replay", "toy", "--plan", "--workers", "2000000", check=False)
    _one_line_error(proc, "--workers 2000000", "1000000")
    assert two_runs.tree() == before


@pytest.mark.parametrize("gpus", ["abc", "0,abc", "-1", "1.5", "0;1"])
def test_replay_gpus_are_checked(two_runs, gpus):
    before = two_runs.tree()
    proc = two_runs.flor("replay", "toy", "--workers", "1", f"--gpus={gpus}", "--", sys.executable, "toy.py",
                         "--epochs", "3", check=False)
    _one_line_error(proc, f"--gpus {gpus!r}", "none")
    assert two_runs.tree() == before  # no launch record, no replay logs
