"""One run at a glance: configuration, status, epochs, checkpoints, storage, replays and values."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

from ..logs import merge_newest
from ..store.runlogs import read_run_logs
from .._files import read_text
from .._fmt import human_size
from ..errors import ConfigError, FlorError
from ..store.experiment import dir_size
from ..store.runmeta import RunMeta
from ..store.experiment import open_experiment
from .frame import mark_hindsight
from .plots import PLOT_FORMATS
from ..logs.summary import summarize

__all__ = ["run_report", "render_report"]


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "-"


def run_report(name: str, run: str | None = None, *, home: Path | None = None) -> dict[str, Any]:
    """Everything ``flor show`` prints, as data: ``run.json`` plus what is computed from the
    store (checkpoints, sizes, replays, the last and best value of every logged name)."""
    if run == "all":  # `flor logs --run all` reads every run; a report is of one
        raise ConfigError(f"flor show summarizes one run, not 'all': give a run id or prefix (`flor ls {name}` "
                          f"lists them), or read every run's values with `flor logs {name} --run all`")
    store = open_experiment(name, home)
    run_id = store.select_runs(run)[0]  # the latest is the newest run that reads
    meta = store.read_run(run_id)
    run_dir = store.run_path(run_id)
    manifests = list(store.manifests(run_id))
    ckpt_bytes = damaged = 0
    for block, epoch, occ in manifests:
        try:
            ckpt_bytes += int(store.read_manifest(run_id, block, epoch, occ).get("new_bytes", 0))
        except FlorError:  # a damaged manifest is counted, not summed; `flor verify` names it
            damaged += 1
    everything = read_run_logs(run_dir, run_id)
    merged = mark_hindsight(merge_newest(everything), everything)
    values = summarize(merged)
    for m in values:
        values[m]["hindsight"] = any(r.get("hindsight") for r in merged if r["name"] == m)
    replays: dict[str, dict[str, Any]] = {}
    for replay_id, _, path in store.layout(run_id).replay_summaries():
        try:
            s = json.loads(read_text(path))  # a regular file, capped, no link followed
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(s, dict):  # untrusted: a summary of another shape says nothing
            continue
        # the id its file name holds (checked against the grammar), not what the file claims
        r = replays.setdefault(replay_id, {"workers": 0, "verdicts": set(), "hindsight": set()})
        r["workers"] += 1
        verdict, hindsight = s.get("verdict", "?"), s.get("hindsight")
        r["verdicts"].add(verdict if isinstance(verdict, str) else "?")
        if isinstance(hindsight, list):
            r["hindsight"].update(h for h in hindsight if isinstance(h, str))
    return {
        "name": name, "run": run_id, "meta": meta, "run_dir": str(run_dir),
        "checkpoints": len(manifests), "damaged_checkpoints": damaged,
        "checkpoint_blocks": sorted({b for b, _, _ in manifests}),
        "checkpoint_bytes": ckpt_bytes, "run_bytes": dir_size(run_dir), "experiment_bytes": store.disk_usage(),
        "values": values,
        "replays": {k: {"workers": v["workers"], "verdict": " / ".join(sorted(v["verdicts"])),
                        "hindsight": sorted(v["hindsight"])} for k, v in replays.items()},
        "tensorboard": str(run_dir / "tb") if (run_dir / "tb").is_dir() else None,
        "plots": sorted(p.name for p in (run_dir / "plots").iterdir() if p.suffix.lower() in PLOT_FORMATS)
        if (run_dir / "plots").is_dir() else [],
    }


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _policy(meta: RunMeta) -> str:
    policy = meta.checkpoint_policy
    if not isinstance(policy, dict):
        every = meta.checkpoint_every
        return f", every {every} epoch(s)" if every else ""
    if policy.get("every"):
        how = f"every {policy['every']} epoch(s)"
    else:
        budget = policy.get("overhead_budget")
        how = f"{policy.get('mode', 'adaptive')}" + (f", within {budget:.0%} overhead" if budget else "")
    done = policy.get("checkpointed_epochs")
    return f", {how}" + (f"; epochs checkpointed: {_ranges(done)}" if done else "")


def _ranges(epochs: list[int]) -> str:
    out: list[list[int]] = []
    for e in sorted(epochs):
        if out and out[-1][1] == e - 1:
            out[-1][1] = e
        else:
            out.append([e, e])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _trackers(notes: dict[str, Any]) -> list[tuple[str, str]]:
    """The trackers run.json notes, one line each (``flor.engine.trackers``): what ``flor export`` fills.

    >>> _trackers({"mlflow": {"run_id": "ab12", "tracking_uri": "sqlite:////w/m.db"},
    ...            "tensorboard": {"logdirs": ["/w/tb"]}})
    [('mlflow run', 'ab12 at sqlite:////w/m.db'), ('script logdir', '/w/tb')]
    """
    out = []
    mlflow, wandb, tb = (notes.get(k) or {} for k in ("mlflow", "wandb", "tensorboard"))
    if mlflow.get("run_id"):
        out.append(("mlflow run", f"{mlflow['run_id']} at {mlflow.get('tracking_uri') or '?'}"))
    if wandb.get("id"):
        path = "/".join(str(x) for x in (wandb.get("entity"), wandb.get("project"), wandb["id"]) if x)
        out.append(("wandb run", f"{path} ({wandb.get('mode') or '?'})"))
    if tb.get("logdirs"):
        out.append(("script logdir", ", ".join(map(str, tb["logdirs"]))))
    return out


def render_report(rep: dict[str, Any]) -> str:
    meta = rep["meta"]
    v = meta.versions
    lines = [f"{rep['name']} run {rep['run']}: {meta.status_text()}"
             + (f" ({meta.error})" if meta.error else "")]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<16}{text}")

    row("command", "python " + shlex.join(meta.argv))
    if meta.script:
        row("script", f"{meta.script} (sha256 {str(meta.script_sha256)[:12]})")
    git = meta.git
    if git:
        dirty = "dirty, see source/diff.patch" if git.get("dirty") else "clean"
        extra = f"; {len(git['untracked_included'])} untracked source files in the patch" \
            if git.get("untracked_included") else ""
        row("git", f"{str(git.get('commit'))[:12]} on {git.get('branch') or '?'}, {dirty}{extra}")
    else:
        row("git", "not in a git repository")
    hp = meta.hyperparameters
    row("hyperparameters", " ".join(f"{k}={_fmt(x)}" for k, x in hp.items()) or "none captured")
    started, ended = meta.started, meta.ended
    took = f", took {ended - started:.1f} s" if started and ended else ""
    row("time", f"started {_when(started)}, ended {_when(ended)}{took}")
    gpus = ", ".join(v.get("gpus") or []) or "none"
    row("host", f"{v.get('host', '?')}: python {v.get('python', '?')}, torch {v.get('torch', '?')}, "
                f"cuda {v.get('cuda') or '-'}, gpus {gpus}")
    row("epochs", meta.epochs_text())  # "3 of 6 planned (stopped early)": what a replay covers
    fails = len(meta.checkpoint_failures)
    row("checkpoints", f"{rep['checkpoints']} ({', '.join(rep['checkpoint_blocks']) or 'no blocks'})"
                       + _policy(meta) + (f", {fails} failed" if fails else ""))
    row("storage", f"run folder {human_size(rep['run_bytes'])}, "
                   f"new checkpoint bytes {human_size(rep['checkpoint_bytes'])}, "
                   f"experiment (shared objects) {human_size(rep['experiment_bytes'])}")
    if rep["replays"]:
        for rid, r in rep["replays"].items():
            hs = f"; hindsight: {', '.join(r['hindsight'])}" if r["hindsight"] else ""
            row("replay", f"{rid}: {r['workers']} worker(s), {r['verdict']}{hs}")
    else:
        row("replays", "none")
    if rep["tensorboard"]:
        row("tensorboard", f"tensorboard --logdir {rep['tensorboard']}")
    for tracker, where in _trackers(meta.trackers):  # where the script reported: what `flor export` fills
        row(tracker, where)
    if rep["plots"]:
        row("plots", ", ".join(rep["plots"]))
    values = rep["values"]
    if values:
        head = ["name", "last", "(epoch)", "best", "(epoch)", "goal", "n", ""]
        body = [[m, _fmt(x["final"]["value"]), str(x["final"]["epoch"]), _fmt(x["best"]["value"]),
                 str(x["best"]["epoch"]), x["goal"], str(x["n"]), "hindsight" if x.get("hindsight") else ""]
                for m, x in values.items()]
        widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
        lines.append("  values (newest replay's where a replay logged them):")
        for r in [head, *body]:
            lines.append("    " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    else:
        lines.append("  values          none logged inside the epoch loop")
    return "\n".join(lines)
