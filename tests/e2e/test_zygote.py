"""The suite's warm interpreter (``tests/zygote.py``) runs a script as a fresh ``python script.py``
would: what the script can see of its process, its exit status, its output and its exit hooks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import Runner, Zygote

PROBE = '''import torch
import atexit, json, os, random, sys, threading
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (__import__("time").sleep(0.2), print("thread joined", flush=True))).start()
print(json.dumps({"name": __name__, "file": __file__, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "probe": os.environ.get("PROBE"), "threads": torch.get_num_threads(),
                  "doc": __doc__, "stdin": sys.stdin.read(), "main": sys.modules["__main__"].__dict__ is globals()}))
print("seeds", torch.initial_seed(), random.random(), __import__("numpy").random.random(), file=sys.stderr)
print("to stderr", file=sys.stderr)
what = sys.argv[1]
if what == "raise":
    raise ValueError("boom")
if what == "kill":
    os.kill(os.getpid(), 9)
sys.exit(int(what))
'''


def fresh(r: Runner, script, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], cwd=r.cwd, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)


@pytest.mark.parametrize("what", ["0", "3", "raise", "kill"])
def test_a_forked_script_sees_and_ends_as_a_fresh_one(tmp_path, what):
    r = Runner(tmp_path)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = r.env(PROBE="x y")
    server = Zygote.get()
    assert server is not None
    warm = server.run([str(script), what], r.cwd, env, 120)
    cold = fresh(r, script, what, env=env)
    assert warm.returncode == cold.returncode == {"0": 0, "3": 3, "raise": 1, "kill": -9}[what]
    assert warm.stdout == cold.stdout and '"probe": "x y"' in warm.stdout, (warm.stdout, cold.stdout)
    if what != "kill":
        assert warm.stdout.endswith("thread joined\natexit ran\n")  # threads joined, then exit hooks
    assert warm.stderr.splitlines()[1] == cold.stderr.splitlines()[1] == "to stderr"
    again = server.run([str(script), what], r.cwd, env, 120)  # each draws its own seeds, as fresh ones do
    seeds = [p.stderr.splitlines()[0].split()[1:] for p in (warm, again, cold)]
    assert all(a != b for a, b in zip(seeds[0], seeds[1])), seeds
    assert warm.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1], (warm.stderr, cold.stderr)


def test_runner_forks_only_scripts_that_import_torch_with_an_environment_read_at_startup_unchanged(tmp_path):
    from zygote import safe_env

    base = {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "HOME": "/root"}
    assert safe_env(base, {**base, "FLOR_HOME": "/x", "AWS_ACCESS_KEY_ID": "k"})
    assert not safe_env(base, {**base, "OMP_NUM_THREADS": "2"})
    assert not safe_env(base, {**base, "PYTHONWARNINGS": "error"})
    assert not safe_env(base, {k: v for k, v in base.items() if k != "PYTHONHASHSEED"})
    r = Runner(tmp_path)
    script = tmp_path / "plain.py"
    script.write_text("import os\nprint(os.getppid())\n")
    assert int(r.run(script).stdout) == __import__("os").getpid()  # no torch: a fresh interpreter, our child
