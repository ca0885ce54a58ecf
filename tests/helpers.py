"""Shared helpers of the tests: run real scripts in subprocesses against a private FLOR_HOME
(``Runner``), read their logged values (``values``), and a small model to train in process
(``make_training``).

Import them as ``from helpers import Runner, values`` (``tests/`` is on ``sys.path``: pytest puts
it there for ``tests/conftest.py``, which also re-exports these names for older imports).
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Collection

import zygote

HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
ROOT = HERE.parent


#: toy.py edited with a hindsight log in the outer loop (a replay restores every block)
OUTER_LOG = {"    # OUTER": '    flor.log("wnorm", float(sum(p.double().norm() for p in net.parameters())))'}
#: toy.py edited with a probed inner loop that logs each step's loss (a replay executes every block)
PROBED_LOG = {
    'step_into("training_loop")': 'step_into("training_loop", probed=True)',
    "            # INNER": '            flor.log("loss", loss.item(), step=step)',
}


def base_env() -> dict[str, str]:
    """The environment every test script starts from (``Runner.env`` adds FLOR_HOME and the rest)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOR_")}
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"):
        env.pop(k, None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONHASHSEED"] = "0"
    return env


class Zygote:
    """The client of ``tests/zygote.py``: one warm server per test worker, started at first use."""

    _server: "Zygote | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.env = base_env()
        self.dir = tempfile.mkdtemp(prefix="flor-zygote-")
        self.path = os.path.join(self.dir, "socket")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "zygote.py"), self.path], env=self.env,
                                     cwd=self.dir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == b"ready\n", "zygote did not start"
        atexit.register(self.close)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    @classmethod
    def get(cls) -> "Zygote | None":
        if os.environ.get("FLOR_TEST_FRESH") == "1":  # every script in a fresh interpreter
            return None
        with cls._lock:
            if cls._server is None or cls._server.proc.poll() is not None:
                cls._server = Zygote()
            return cls._server

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        message = zygote.frame({"argv": argv, "cwd": str(cwd), "env": env})
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(self.path)
                sent = socket.send_fds(sock, [message], [null, out_w, err_w])
                sock.sendall(message[sent:])
            finally:
                for fd in (null, out_w, err_w):
                    os.close(fd)
            chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}

            def drain(fd: int) -> None:
                with os.fdopen(fd, "rb", buffering=0) as fh:
                    while block := fh.read(65536):
                        chunks[fd].append(block)

            readers = [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in (out_r, err_r)]
            for t in readers:
                t.start()
            pid = zygote.recv(sock)["pid"]
            deadline = time.monotonic() + timeout
            for t in readers:
                t.join(max(0.0, deadline - time.monotonic()))
            if any(t.is_alive() for t in readers):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            code = zygote.recv(sock)["returncode"]
        enc = locale.getpreferredencoding(False)
        text = [b"".join(chunks[fd]).decode(enc).replace("\r\n", "\n").replace("\r", "\n") for fd in (out_r, err_r)]
        return subprocess.CompletedProcess([sys.executable, *argv], code, text[0], text[1])


_IMPORTS_TORCH = re.compile(r"^(import torch\b|from torch\b)", re.M)


class Runner:
    """Runs scripts with ``python`` in ``cwd`` with FLOR_HOME at ``home``; one torch thread by default."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "florhome"
        self.cwd = tmp_path

    def env(self, **extra: str) -> dict[str, str]:
        env = base_env()
        env["FLOR_HOME"] = str(self.home)
        env["FLOR_CONFIG_DIR"] = str(self.cwd / "florconfig")  # the signing key: never the user's own
        # toy epochs last milliseconds, so the adaptive policy would thin their checkpoints:
        # tests get a fixed schedule unless they test the policy itself
        env["FLOR_EVERY"] = "1"
        env.update(extra)
        return env

    def script(self, name: str = "toy.py", edits: dict[str, str] | None = None, dest: str | None = None) -> Path:
        """Copy a test script into cwd, applying ``{old: new}`` text edits (each must apply)."""
        text = (SCRIPTS / name).read_text()
        for old, new in (edits or {}).items():
            assert old in text, f"edit target {old!r} not in {name}"
            text = text.replace(old, new)
        path = self.cwd / (dest or name)
        path.write_text(text)
        return path

    def run(self, script: Path, *args: str, check: bool = True, env: dict | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        """``python script args...``; a script that imports torch itself, run with an environment
        nothing reads at startup differently, is forked from a warm interpreter (``tests/zygote.py``)."""
        env = env or self.env()
        server = Zygote.get() if _IMPORTS_TORCH.search(Path(script).read_text()) else None
        if server is not None and zygote.safe_env(server.env, env):
            proc = server.run([str(script), *args], self.cwd, env, timeout)
        else:
            proc = subprocess.run(
                [sys.executable, str(script), *args], cwd=self.cwd, env=env,
                capture_output=True, text=True, timeout=timeout,
            )
        if check and proc.returncode != 0:
            raise AssertionError(f"{script.name} {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def replay_workers(self, script: Path, name: str, workers: int,
                       names: Collection[str] | None = None) -> dict[tuple, object]:
        """Replay ``name`` with ``script`` as ``workers`` workers one after the other, each
        verified exact; the values their replays logged (of ``names`` only, when given)."""
        got: dict[tuple, object] = {}
        for pid in range(workers):
            proc = self.run(script, "--flor", name, f"--replay_flor={pid}/{workers}")
            assert "replay verified exact" in proc.stderr, proc.stderr
            assert "FL328" not in proc.stderr, proc.stderr  # none of these scripts' lines trains
            replay = proc.stderr.split("flor: replay ")[1].split()[0]
            got.update(values([x for x in self.logs(name) if x["replay"] == replay]))
        return got if names is None else {k: v for k, v in got.items() if k[0] in names}

    def flor(self, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "flor", *args], cwd=self.cwd, env=env if env is not None else self.env(),
            capture_output=True, text=True, timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"flor {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def logs(self, name: str, run: str | None = None) -> list[dict]:
        out = self.flor("logs", name, *(["--run", run] if run else []))
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    def tree(self) -> dict[str, bytes]:
        """Every file under FLOR_HOME with its bytes: to prove nothing was lost or changed."""
        if not self.home.exists():
            return {}
        return {str(p.relative_to(self.home)): p.read_bytes() for p in sorted(self.home.rglob("*")) if p.is_file()}


def git_repo(cwd: Path, *tracked: Path) -> None:
    """Make ``cwd`` a git repository with ``tracked`` committed (what a recording's diff.patch is made against)."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=t", *args], cwd=cwd, check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", *(p.name for p in tracked))
    git("commit", "-qm", "init")


def reseal_manifest(path: Path, edit: Callable[[dict], None]) -> None:
    """Rewrite the checkpoint manifest at ``path`` with ``edit(manifest)`` applied and its checksum
    made to fit, as someone who can write to a shared store can: a checksum is no signature."""
    from flor.store.manifest import sealed_bytes

    manifest = json.loads(path.read_text())
    for field in ("sha256", "hmac"):
        manifest.pop(field, None)
    edit(manifest)
    path.write_bytes(sealed_bytes(manifest))


def copy_of(recorded: Runner, tmp_path: Path) -> Runner:
    """A runner in ``tmp_path`` with a copy of ``recorded``'s store, its config (the signing key)
    and its scripts: tests share one recording (a module-scoped fixture), and each replays or
    damages its own copy, as the store can be moved."""
    r = Runner(tmp_path)
    shutil.copytree(recorded.home, r.home, symlinks=True)
    if (recorded.cwd / "florconfig").is_dir():
        shutil.copytree(recorded.cwd / "florconfig", r.cwd / "florconfig")
    for script in recorded.cwd.glob("*.py"):
        shutil.copy(script, r.cwd / script.name)
    return r


_CODE = re.compile(r"(?<![\"'\w])FL[0-9]{3}\b")  # not a quoted code: a warning's source line quotes it


def said(text: str, *words: str) -> list[str]:
    """The lines of ``text`` that carry one of the finding codes among ``words`` and every other
    word: ``said(err, "FL204", "`out`")`` is the FL204 lines that name `out`, ``said(err, "FL201",
    "FL203")`` every FL201 or FL203 line. Tests match codes, not sentences (docs/findings.md)."""
    codes = [w for w in words if _CODE.fullmatch(w)]
    others = [w for w in words if not _CODE.fullmatch(w)]
    assert codes, "said() needs at least one code"
    return [line for line in text.splitlines()
            if set(_CODE.findall(line)) & set(codes) and all(w in line for w in others)]


def values(records: list[dict], source: str | None = None) -> dict[tuple, object]:
    """{(name, epoch, step): value} of records (optionally of one source)."""
    out = {}
    for r in records:
        if source is None or r["source"] == source:
            out[(r["name"], r["epoch"], r["step"])] = r["value"]
    return out


def record_and_full_run(r: Runner, script: str, hindsight: dict[str, str], names: set[str],
                        every: str = "2") -> tuple[Path, dict[tuple, object]]:
    """Record ``script`` as experiment "r" with a checkpoint every ``every`` epochs, and run it
    edited with ``hindsight`` in full as "full": the edited script, and the values of ``names``
    the full run logged, which a replay of "r" with the edited script must give."""
    env = r.env(FLOR_EVERY=every)
    r.run(r.script(script), "--flor", "r", env=env)
    edited = r.script(script, hindsight, dest="hindsight.py")
    r.run(edited, "--flor", "full", env=env)
    return edited, {k: v for k, v in values(r.logs("full"), "record").items() if k[0] in names}


def make_training():
    """A small model with BatchNorm, AdamW, OneCycleLR and a GradScaler, seeded: the objects a
    training loop gives ``end()``."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=100)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return net, opt, sched, scaler


def train_steps(net, opt, sched, n=3):
    """``n`` training steps of ``make_training``'s objects on random data."""
    import torch

    for _ in range(n):
        loss = net(torch.randn(16, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


# -- an absurd value of every setting: unit/test_settings.py checks the table covers them all,
# e2e/test_error_messages.py that each ends a script with one line and exit status 2

HUGE = "999999999999999999999"
#: (flags, environment) with an absurd value of every setting; "replay" cases need a recording
ABSURD = [
    (["--flor", "../x"], {}), (["--flor", "a" * 300], {}), ([], {"FLOR_NAME": "/etc"}),
    (["--flor", "t", "--replay_flor=5/2"], {}), (["--flor", "t", "--replay_flor=-1/2"], {}),
    (["--flor", "t", f"--replay_flor={HUGE}/{HUGE}9"], {}), (["--flor", "t", "--replay_flor=x/y"], {}),
    (["--flor", "t"], {"FLOR_REPLAY": "abc"}), (["--flor", "t"], {"FLOR_REPLAY": "1/0"}),
    (["--flor", "t", "--replay_flor", "--flor_run", "../../etc"], {}), (["--flor", "t", "--replay_flor"], {"FLOR_RUN": "../x"}),
    (["--flor", "t", "--flor_strict=maybe"], {}), (["--flor", "t"], {"FLOR_STRICT": "2"}),
    (["--flor", "t", "--flor_lenient=maybe"], {}), (["--flor", "t"], {"FLOR_LENIENT": "x"}),
    (["--flor", "t", "--flor_verdict", "harsh"], {}), (["--flor", "t"], {"FLOR_VERDICT": "1"}),
    (["--flor", "t", "--replay_flor", "--flor_verdict=lenient", "--flor_strict"], {}),
    (["--flor", "t"], {"FLOR_RANK_TIMEOUT": "nan"}), (["--flor", "t"], {"FLOR_RANK_TIMEOUT": "0"}),
    (["--flor", "t", "--flor_strong=maybe"], {}), (["--flor", "t"], {"FLOR_STRONG": "x"}),
    (["--flor", "t", "--flor_trust_pickles=maybe"], {}), (["--flor", "t"], {"FLOR_TRUST_PICKLES": "x"}),
    (["--flor", "t", "--flor_every", "0"], {}), (["--flor", "t", "--flor_every=-3"], {}),
    (["--flor", "t", "--flor_every", "nan"], {}), (["--flor", "t", "--flor_every", HUGE], {}),
    (["--flor", "t"], {"FLOR_EVERY": "1e400"}),
    (["--flor", "t", "--flor_overhead", "nan"], {}), (["--flor", "t", "--flor_overhead=-1"], {}),
    (["--flor", "t", "--flor_overhead", "inf"], {}), (["--flor", "t", "--flor_overhead", "1e400"], {}),
    (["--flor", "t"], {"FLOR_OVERHEAD": "2"}), (["--flor", "t"], {"FLOR_OVERHEAD": "1e-400"}),
    (["--flor", "t", "--flor_spool", "http://x"], {}), (["--flor", "t"], {"FLOR_SPOOL": "s3://A_B/x"}),
    (["--flor", "t", "--replay_flor", "--flor_epochs", HUGE + ":"], {}), (["--flor", "t", "--replay_flor", "--flor_epochs", "5:3"], {}),
    (["--flor", "t", "--replay_flor", "--flor_epochs", "a:b"], {}), (["--flor", "t", "--replay_flor", "--flor_epochs=-1:"], {}),
    (["--flor", "t", "--replay_flor"], {"FLOR_EPOCHS": ":" + HUGE}),
    (["--flor", "t", "--replay_flor", "--flor_threads", "100000"], {}), (["--flor", "t", "--replay_flor", "--flor_threads", "0"], {}),
    (["--flor", "t", "--replay_flor", "--flor_threads=-1"], {}), (["--flor", "t", "--replay_flor"], {"FLOR_THREADS": HUGE}),
    (["--flor", "t", "--replay_flor", "--flor_export", "neptune"], {}), (["--flor", "t"], {"FLOR_EXPORT": "mlflow,x"}),
    (["--flor", "t"], {"FLOR_SPOOL_WAIT": "abc"}), (["--flor", "t"], {"FLOR_SPOOL_WAIT": "-5"}),
    (["--flor", "t"], {"FLOR_SPOOL_WAIT": "nan"}), (["--flor", "t"], {"FLOR_SPOOL_WAIT": "inf"}),
    (["--flor", "t"], {"FLOR_SPOOL_BUDGET": "abc"}), (["--flor", "t"], {"FLOR_SPOOL_BUDGET": "-5"}),
    (["--flor", "t"], {"FLOR_SPOOL_BUDGET": "9" * 400 + "TB"}),
    (["--flor", "t", "--replay_flor"], {"FLOR_REPLAY_ID": "../x"}), (["--flor", "t", "--replay_flor"], {"FLOR_REPLAY_ID": "a" * 100}),
    (["--flor", "t"], {"FLOR_FLUSH_TIMEOUT": "abc"}), (["--flor", "t"], {"FLOR_FLUSH_TIMEOUT": "-1"}),
    (["--flor", "t"], {"FLOR_FLUSH_TIMEOUT": "nan"}), (["--flor", "t"], {"FLOR_FLUSH_TIMEOUT": "inf"}),
    (["--flor", "t"], {"FLOR_FLUSH_TIMEOUT": HUGE}),
    (["--flor", "t"], {"FLOR_WRITER_MEMORY": "abc"}), (["--flor", "t"], {"FLOR_WRITER_MEMORY": "0"}),
    (["--flor", "t"], {"FLOR_WRITER_MEMORY": "9" * 400 + "TB"}),
    (["--flor", "t"], {"FLOR_DEBUG": "maybe"}), (["--flor", "t"], {"FLOR_MALLOC": "off"}),
    (["--flor", "t", "--replay_flor"], {"RANK": "5", "WORLD_SIZE": "2"}),
    (["--flor", "t", "--replay_flor"], {"SLURM_PROCID": HUGE, "SLURM_NTASKS": HUGE + "9"}),
    (["--flor", "t", "--flor_everyy", "1"], {}), (["--flor", "t", "--flor", "u"], {}), (["--flor"], {}),
]
#: values that are well-formed but wrong only once the run starts (a recording "t" exists)
ABSURD_AT_START = [
    (["--flor", "t"], {"FLOR_HOME": "FILE/sub"}),
    (["--flor", "nothing", "--replay_flor"], {}),
    (["--flor", "t", "--replay_flor", "--flor_epochs", "99:"], {}),
    (["--flor", "t", "--replay_flor", "--flor_run", "1999"], {}),
    (["--flor", "t", "--replay_flor", "--flor_threads", str(1024)], {"FLOR_EPOCHS": "5:"}),
]


def note_trackers(store, trackers: dict, config_dir: Path | None = None) -> None:
    """Run "r1" of ``store`` noted ``trackers`` as a recording does: signed with the key in
    ``config_dir`` (made there) where given, unsigned (as a planted run.json is) where not."""
    from flor.store.trust import load_key, sign_trackers

    run_json = store.run_path("r1", "run.json")
    obj = {**json.loads(run_json.read_text()), "trackers": trackers}
    if config_dir is not None:
        load_key(config_dir, create=True)
        obj["trackers_signature"] = sign_trackers(config_dir, trackers)
    run_json.write_text(json.dumps(obj))


def fake_run(home: Path, recorded: list[dict], replayed: list[dict], epochs: int = 3):
    """Experiment "ex" with one finished run "r1" as a recording and one replay leave it: run.json and
    the records given (step, block and t filled in); its ExperimentStore."""
    from flor.store import ExperimentStore
    from flor.store.runmeta import FORMAT as RUN_FORMAT

    d = home / "ex" / "runs" / "r1"
    (d / "logs").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"name": "ex", "run": "r1", "status": "finished", "format": RUN_FORMAT,
                                            "epochs_done": epochs}))
    for name, rows in (("record.jsonl", recorded), ("replay-p1-0.jsonl", replayed)):
        (d / "logs" / name).write_text("".join(json.dumps({"step": None, "block": None, "t": 1.0, **r}) + "\n"
                                               for r in rows))
    return ExperimentStore(home, "ex")


class RecordingLoop:
    """The loop protocol of a record session (``iterate``, ``step_into``, ``end``, ``warn_once``),
    in process, for a framework callback's unit tests (``monkeypatch.setattr(flor.hooks, "current",
    lambda: loop)``): every epoch runs, ``end()`` snapshots what it is given as a recording does
    (calling each object's ``state_dict``), and warnings go through the engine's own ``warn_once``.
    A real session under a real trainer is tests/e2e/test_frameworks.py's."""

    mode = "record"
    watch = None

    def __init__(self) -> None:
        from flor.engine.session import Session

        self._warned: set = set()
        self._warned_lock = threading.Lock()
        self._warn_once = Session.warn_once
        self.ends = 0

    def warn_once(self, code: str, subject: object, message: str) -> bool:
        return self._warn_once(self, code, subject, message)  # type: ignore[arg-type]

    def iterate(self, items):
        yield from items

    def step_into(self, name: str, probed: bool) -> bool:
        return True

    def end(self, objs: tuple):
        from flor.state import snapshot

        snapshot(list(objs))
        self.ends += 1
        return objs

    def close_left_open(self, when: str) -> None:
        pass

    def log(self, name: str, value: object, step: object) -> None:
        pass
