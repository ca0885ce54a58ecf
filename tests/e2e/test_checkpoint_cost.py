"""What makes a checkpoint cheap must not make it wrong (issue #13), end to end: a real recording
stores a few files per checkpoint instead of one per tensor, ``flor verify`` passes and a
replay is exact; a checkpoint's random state points at the last end()'s where nothing drew;
the writer's CPU and GIL time is charged only where training waited for it (cores kept busy by
spinning processes). The parts are tested in process under ``unit/state/`` and
``unit/store/``.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from helpers import values

from flor.placement import OffCpu, cores
from flor.policy import CHARGE_IDLE, CHARGE_SHARED, charge_for
from flor.state import (
    snapshot,
)
from flor.store.hashing import hash_bytes
from flor.store.manifest import seal


def full(objs) -> dict:
    return json.loads(json.dumps(snapshot(objs, copy=False).materialize()))


def _nodes(node, keep):
    """Every dict of a node tree for which ``keep`` holds."""
    if isinstance(node, dict):
        if keep(node):
            yield node
        for v in node.values():
            yield from _nodes(v, keep)
    elif isinstance(node, list):
        for v in node:
            yield from _nodes(v, keep)


def _leaves(node):
    return _nodes(node, lambda n: isinstance(n.get("h"), str))


def test_a_recording_stores_few_files_per_checkpoint_and_replays_exactly(runner):
    script = runner.script()
    proc = runner.run(script, "--epochs", "4", "--flor", "packs")
    home = runner.home / "packs"
    # the exit line says what was checkpointed and which rule charged the budget, as run.json does
    meta = json.loads(next((home / "runs").glob("*/run.json")).read_text())
    policy = meta["checkpoint_policy"]
    assert policy["charged"] in (CHARGE_IDLE, CHARGE_SHARED)
    assert "flor: checkpointed 4 of 4 epochs" in proc.stderr and f"charged: {policy['charged']})" in proc.stderr
    assert 0 < policy["gil_s"] and policy["stall_s"] <= policy["charged_s"]
    assert 0 <= policy["gil_waited_s"] <= policy["gil_s"]  # the GIL time charged: what training waited, at most
    if policy["charged"] == CHARGE_IDLE:
        assert policy["charged_s"] == pytest.approx(policy["stall_s"] + policy["watch_s"] + policy["gil_waited_s"], abs=1e-5)
    # each stall with the part of it that copied bytes; each epoch's RNG capture at step_into
    timings = meta["timings"]
    assert len(timings["copy_s"]) == len(timings["stall_s"]) == 4 and len(timings["start_s"]) == 4
    assert all(0 < c <= s for c, s in zip(timings["copy_s"], timings["stall_s"]))  # the first too: the walk's copies
    assert timings["encoded"] == ["learned", "fast", "fast", "fast"]  # the template made once, then reused
    objects = [p for p in (home / "objects").rglob("*") if p.is_file()]
    manifests = sorted((home / "runs").glob("*/checkpoints/*/*.json"))
    assert len(manifests) == 4
    leaves = 0
    for m in manifests:
        body = json.loads(m.read_text())
        nodes = [n for k in ("objects", "rng", "rng_start") for n in _leaves(body[k])]
        leaves += len(nodes)
        assert any("o" in n for n in nodes), f"{m.name}: no small leaf was packed"
    assert len(objects) < leaves / 2, f"{len(objects)} files for {leaves} leaves"
    assert "no problems" in runner.flor("verify", "packs").stdout
    hindsight = {"    # OUTER": '    flor.log("wnorm", float(sum(p.double().norm() for p in net.parameters())))'}
    edited = runner.script(edits=hindsight, dest="edited.py")
    runner.run(edited, "--epochs", "4", "--flor", "full")
    runner.run(edited, "--epochs", "4", "--flor", "packs", "--replay_flor")
    got = values([x for x in runner.logs("packs") if x["source"] == "replay"])
    want = values(runner.logs("full"), "record")
    assert {k for k in got if k[0] == "wnorm"} == {("wnorm", e, None) for e in range(4)}
    assert got == want
    # a manifest resealed with a packed leaf's offset moved: verify finds the slice is not that leaf
    body = json.loads(manifests[-1].read_text())
    leaf = next(n for n in _leaves(body["objects"]) if "o" in n and n["o"] > 0)
    leaf["o"] -= 4
    manifests[-1].write_text(json.dumps(seal(body)))
    report = runner.flor("verify", "packs", check=False)
    assert report.returncode != 0 and "a pack whose bytes" in report.stdout + report.stderr


@pytest.mark.parametrize("evaluation", ["draws", "does not draw"])
def test_rng_start_points_at_the_last_end_state_only_when_nothing_drew(runner, evaluation):
    """Where nothing draws a random number between a checkpoint and the next block's start (an
    evaluation without dropout or shuffling), the recorder stores that block's ``rng_start`` as
    the tree of the last checkpoint's ``rng`` (no second encoding); where something does, its
    own. Either way a probed replay (which restores ``rng_start`` when it re-executes a block)
    gives the recording's values."""
    edits = {} if evaluation == "draws" else {"    jitter = random.random()": "    jitter = 0.5"}
    script = runner.script(edits=edits)
    runner.run(script, "--epochs", "4", "--flor", "rs")
    manifests = sorted((runner.home / "rs" / "runs").glob("*/checkpoints/*/*.json"))
    bodies = [json.loads(m.read_text()) for m in manifests]
    assert [b["epoch"] for b in bodies] == [0, 1, 2, 3]
    reused = [bodies[k]["rng_start"] == bodies[k - 1]["rng"] for k in range(1, 4)]
    assert reused == [evaluation == "does not draw"] * 3
    assert "no problems" in runner.flor("verify", "rs").stdout
    probe = {'step_into("training_loop")': 'step_into("training_loop", probed=True)',
             "            # INNER": '            flor.log("inner_loss", loss.item(), step=step)'}
    edited = runner.script(edits={**edits, **probe}, dest="probed.py")
    runner.run(edited, "--epochs", "4", "--flor", "rs_full")
    runner.run(edited, "--epochs", "4", "--flor", "rs", "--replay_flor")
    got = values([x for x in runner.logs("rs") if x["source"] == "replay"])
    want = values(runner.logs("rs_full"), "record")
    assert {k[0] for k in got} >= {"inner_loss", "acc", "jitter"} and got == want


def test_with_every_core_busy_the_writers_cpu_is_charged(runner):
    """A CPU recording is charged the writer's GIL time only where a core sat idle (measured
    on the digits CNN: one torch thread on two cores, a checkpoint took the stall plus less
    than the writer's GIL time from its epoch). With every core kept busy by other processes
    it is charged all of the writer's CPU, and says so."""
    assert charge_for(cores() - 0.1) == CHARGE_IDLE and charge_for(0.5) == CHARGE_SHARED
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores())]
    try:
        time.sleep(0.5)
        proc = runner.run(runner.script(), "--epochs", "3", "--flor", "busy")
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    policy = json.loads(next((runner.home / "busy" / "runs").glob("*/run.json")).read_text())["checkpoint_policy"]
    assert policy["charged"] == CHARGE_SHARED and f"charged: {CHARGE_SHARED})" in proc.stderr
    assert policy["charged_s"] == pytest.approx(policy["stall_s"] + policy["watch_s"] + policy["background_share_s"],
                                                abs=1e-5)


def test_off_cpu_is_the_wait_for_the_gil_not_the_writers_hold():
    """``OffCpu``, read from another thread, gives the time the measured thread spent waiting.
    Another thread holds the GIL for 30 ms without using a core (a ``PyDLL`` call keeps the
    GIL): a thread running Python meanwhile waits through nearly all of it; one inside a long
    hash (xxhash releases the GIL) loses nothing, though the GIL was held as long. Kept from a
    core by other processes, it does not wait either (its run-queue time is left out). The
    policy charges the writer's GIL time only up to that wait. (Tried a few times: scheduling
    on a busy machine varies.)"""
    meter = OffCpu()
    assert meter.clock is not None and meter.schedstat is not None  # Linux: per-thread CPU clocks, schedstat
    usleep = ctypes.PyDLL(None).usleep
    usleep.argtypes = [ctypes.c_uint]

    def waited_share(work) -> tuple[float, bool]:
        """The share of another thread's 30 ms hold of the GIL this thread spent off its CPU
        while doing ``work``, and whether ``work`` outlasted the hold."""
        out: list = []
        go = threading.Event()

        def hold() -> None:
            go.wait()
            mark, t0 = meter.mark(), time.perf_counter()
            usleep(30_000)
            out.append((meter.since(mark) / (time.perf_counter() - t0), time.perf_counter()))

        thread = threading.Thread(target=hold)
        thread.start()
        go.set()
        ended = work()
        thread.join()
        return out[0][0], ended > out[0][1]

    def python_loop() -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.2:
            sum(range(100))
        return time.perf_counter()

    data = memoryview(bytes(2 << 30))
    hash_bytes(data)  # its pages mapped: ~60 ms a hash from now on

    def hashing() -> float:
        hash_bytes(data)
        return time.perf_counter()

    for _ in range(5):
        beside_python, _ = waited_share(python_loop)
        beside_hash, outlasted = waited_share(hashing)
        if beside_python > 0.5 and outlasted and beside_hash < 0.2:
            break
    else:
        pytest.fail(f"off the CPU: {beside_python:.0%} of another thread's hold of the GIL while running Python "
                    f"(expected ~100%), {beside_hash:.0%} while hashing without the GIL (expected ~0)")

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores() + 1)]
    try:  # more busy processes than cores: the hashing thread waits for a core, not for anything of its own
        time.sleep(0.2)
        out: list = []

        def read() -> None:
            mark = meter.mark()
            time.sleep(0.3)
            out.append(meter.since(mark))

        reader = threading.Thread(target=read)
        reader.start()
        while reader.is_alive():
            hash_bytes(data)
        reader.join()
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert out[0] < 0.1, f"{out[0]:.3f} s of 0.3 s counted as waiting while other processes held the cores"


def test_the_writers_gil_time_is_charged_only_as_far_as_training_waited_for_it(runner):
    """A block that spends its time in one long torch operation (the GIL released) loses
    nothing to the writer's Python work on an idle core: what each checkpoint is charged for
    the writer's GIL time (run.json ``timings.gil_waited_s``) falls well below that GIL time
    (``timings.gil_s``). Before, all of it was charged. Time training spent waiting for a core
    (other work on a busy machine) is not counted as waiting (``OffCpu``: run-queue time from
    schedstat). Per checkpoint, over up to three recordings."""
    script = runner.cwd / "matmul.py"
    script.write_text(textwrap.dedent("""
        import torch
        import flor
        torch.manual_seed(0)
        torch.set_num_threads(1)
        net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(12)])
        opt = torch.optim.Adam(net.parameters())
        a = torch.randn(900, 900)
        for epoch in flor.it(range(6)):
            if flor.SkipBlock.step_into("train"):
                a = torch.mm(a, torch.mm(a, a)).clamp_(-1, 1)  # ~0.1 s of torch's own code, without the GIL
                net(torch.randn(8, 64)).sum().backward()
                opt.step()
            net, opt = flor.SkipBlock.end(net, opt)
    """))
    shares = []
    for attempt in range(3):
        name = f"mm{attempt}"
        runner.run(script, "--flor", name, env=runner.env(FLOR_EVERY="1"))
        meta = json.loads(next((runner.home / name / "runs").glob("*/run.json")).read_text())
        held, waited, policy = meta["timings"]["gil_s"], meta["timings"]["gil_waited_s"], meta["checkpoint_policy"]
        assert len(held) == len(waited) == 6 and all(0 <= w <= h for w, h in zip(waited, held))
        assert policy["gil_s"] == pytest.approx(sum(held), abs=1e-5)
        assert policy["gil_waited_s"] == pytest.approx(sum(waited), abs=1e-5)
        shares += [w / h for w, h in zip(waited[:-1], held[:-1]) if h > 0]  # the last: training waits at exit
        if min(shares, default=1.0) < 0.5:
            break
    else:
        pytest.fail(f"each checkpoint was charged {min(shares):.0%} or more of the writer's GIL time, though "
                    "training ran torch's own code without the GIL meanwhile")
