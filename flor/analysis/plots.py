"""PNG (or SVG, PDF) plots of logged values against epoch or step, headless, with matplotlib.

Every value is plotted (no downsampling, no smoothing). Hindsight values (logged by a
replay where the recording has none) are drawn with open markers and named so in the
legend; a series that is hindsight throughout is dashed. Several runs are overlaid, labelled
by the hyperparameters that differ between them. Each plot is also saved into the run
directory (``runs/<run>/plots/``, the newest run plotted) so it travels with the run. These
functions only write files: uploading the kept copy to a spool target is the caller's choice
(``flor plot`` and ``flor compare --plot`` do it when a spool is set).

matplotlib is imported only here and only when plotting, through its object API (no
pyplot): the figure never touches a display or the caller's matplotlib state.

The file format is the one the output's suffix names (``.png``, ``.svg`` or ``.pdf``); the
output path is checked (:func:`check_output`) before any value is read, so a bad one costs
nothing and leaves nothing behind.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any, Sequence

from ..errors import ConfigError, warn
from ..store import ExperimentStore
from .compare import Comparison, series_of
from ..store.experiment import open_experiment
from ..store.ids import contained
from .frame import hyperparameters, records

__all__ = ["PLOT_FORMATS", "check_output", "plot_comparison", "plot_metrics"]

#: the suffixes a plot may be written as (matplotlib writes each without extra packages)
PLOT_FORMATS = (".png", ".svg", ".pdf")


def check_output(out: str | Path | None, flag: str = "out") -> Path | None:
    """The plot file ``out`` names, checked before any work: a file (not a folder) with a
    suffix of :data:`PLOT_FORMATS`, in a folder that exists and can be written. ``flag`` names
    the option in the error (``-o``, ``--plot``).

    >>> check_output("acc.svg", "-o")
    PosixPath('acc.svg')
    >>> check_output("acc.jpg", "-o")
    Traceback (most recent call last):
    ...
    flor.errors.ConfigError: -o 'acc.jpg': plots are written as .png, .svg or .pdf (the suffix names the format); name the file like acc.png
    """  # noqa: E501 - a doctest's expected output is one line
    if out is None:
        return None
    text = str(out)
    if not text.strip():
        raise ConfigError(f"{flag} {text!r}: an empty path; name the file to write, like {flag} acc.png")
    path = Path(text).expanduser()
    if path.is_dir():
        raise ConfigError(f"{flag} {text!r}: is a directory; name a file in it, like {flag} {path / 'plot.png'}")
    if path.suffix.lower() not in PLOT_FORMATS:
        raise ConfigError(f"{flag} {text!r}: plots are written as .png, .svg or .pdf (the suffix names the format); "
                          f"name the file like {path.with_suffix('.png') if path.suffix else path.name + '.png'}")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ConfigError(f"{flag} {text!r}: the folder {parent} {what}; create it first (mkdir -p {parent}) "
                          "or choose another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{flag} {text!r}: cannot be written (permission denied); choose another path")
    return path


def _figure(rows: int) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ConfigError("plotting needs matplotlib: pip install matplotlib"
                          " (or pip install -e '.[plot]' in flor's checkout)") from exc
    fig = Figure(figsize=(8, 3.2 * rows + 0.4), dpi=100, layout="constrained")
    return fig, [fig.add_subplot(rows, 1, i + 1) for i in range(rows)]


def _axes(ax: Any, x: str, metric: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and steps are whole numbers


def _label(run: str, hp: dict[str, Any], varying: list[str]) -> str:
    if not varying:
        return run
    return " ".join(f"{k}={hp.get(k)}" for k in varying)


def varying_hyperparameters(hps: dict[str, dict[str, Any]]) -> list[str]:
    """Names of the hyperparameters whose values differ between the runs, in first-seen order."""
    names = list(dict.fromkeys(k for hp in hps.values() for k in hp))
    return [k for k in names if len({repr(hp.get(k)) for hp in hps.values()}) > 1]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text)[:120] or "plot"


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` whole or not at all: a temporary file beside ``path``, then renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a leftover, or a link planted in a shared store: removed, never followed
        with open(tmp, "xb") as fh:  # O_EXCL: made here, so no link is written through
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _save(fig: Any, out: Path | None, store: ExperimentStore, run: str, default_name: str) -> list[Path]:
    """Save to ``out`` when given, and a copy into the run's ``plots/`` folder, in the format
    ``out``'s suffix names (PNG without ``out``); return the paths written: ``out`` first, the
    run's copy last. A store that cannot be written is an error without ``out``, and a warning
    (no copy kept) with it."""
    out = check_output(out)
    fmt = out.suffix.lower().lstrip(".") if out is not None else "png"
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    data = buf.getvalue()
    kept = store.run_path(run, "plots", _safe(out.name) if out is not None else default_name)
    written: list[Path] = []
    if out is not None:
        try:
            _write(out, data)
        except OSError as exc:
            raise ConfigError(f"cannot write the plot to {out} ({exc.strerror or exc}); choose another path") from None
        written.append(out)
        if out.resolve() == kept.resolve():
            return written
    try:
        if not contained(kept, store.root, parent_only=True):  # runs/<run>/plots -> elsewhere, planted
            raise OSError(f"{kept.parent} leads out of the store through a symbolic link (to "
                          f"{os.path.realpath(kept.parent)}); remove the link")
        kept.parent.mkdir(parents=True, exist_ok=True)
        _write(kept, data)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if out is None:
            raise ConfigError(f"cannot write the plot into {kept.parent} ({reason}): the store cannot be written "
                              "there; give -o FILE.png to write the plot elsewhere") from None
        warn("FL501", f"the plot was written to {out}, but no copy could be kept in {kept.parent} ({reason})")
        return written
    written.append(kept)
    return written


def plot_metrics(name: str, metrics: Sequence[str], *, runs: str | Sequence[str] | None = "all",
                 x: str = "epoch", out: Path | None = None, home: Path | None = None,
                 definitions: Any = None, title: str | None = None) -> list[Path]:
    """Plot ``metrics`` of experiment ``name`` against ``x`` (``epoch`` or ``step``), one panel
    per metric, one curve per run. Returns the files written: ``out`` first, if given, and
    the copy kept in the newest run's ``plots/`` folder last.

    (needs the recorded experiment ``cnn-demo``, so the example is not run as a doctest)

    >>> plot_metrics("cnn-demo", ["val_acc"], out=Path("acc.png"))  # doctest: +SKIP
    """
    out = check_output(out)
    if x not in ("epoch", "step"):
        raise ConfigError(f"--x {x!r}: plot against epoch or step")
    if not metrics:
        raise ConfigError("name at least one metric to plot")
    store = open_experiment(name, home)
    merged = records(name, run=runs, home=home, newest=True, definitions=definitions)
    run_ids = list(dict.fromkeys(r["run"] for r in merged)) or store.select_runs(None)
    logged = {r["name"] for r in merged}
    for m in metrics:
        if m not in logged:
            raise ConfigError(f"no run of {name} shown here logged {m!r}; the logged names are: "
                              f"{', '.join(sorted(logged)) or 'none'}")
    hps = {r: hyperparameters(store, r) for r in run_ids}
    varying = varying_hyperparameters(hps)
    fig, axes = _figure(len(metrics))
    for ax, metric in zip(axes, metrics):
        drawn = 0
        for i, run in enumerate(run_ids):
            recs = [r for r in merged if r["run"] == run and r["name"] == metric]
            series = series_of(recs, x)
            if not series:
                continue
            hind = [p for p in series if p[3]]
            all_hind = len(hind) == len(series)
            label = _label(run, hps[run], varying) + (" (hindsight)" if hind else "")
            color = f"C{i % 10}"
            ax.plot([p[0] for p in series], [p[1] for p in series], color=color, label=label,
                    linestyle="--" if all_hind else "-", marker="." if len(series) <= 60 else None)
            if hind:
                ax.plot([p[0] for p in hind], [p[1] for p in hind], linestyle="none", marker="o",
                        markerfacecolor="none", color=color)
            drawn += 1
        if not drawn:
            raise ConfigError(f"{metric!r} has no numeric values logged with a step; plot it with --x epoch"
                              if x == "step" else f"{metric!r} has no numeric values inside the epoch loop")
        _axes(ax, x, metric)
        ax.legend(fontsize="small")
    fig.suptitle(title or f"{name}: {', '.join(metrics)} by {x}" + (" (open markers: hindsight values)"
                                                                     if any(r.get("hindsight") for r in merged
                                                                            if r["name"] in metrics) else ""))
    default = _safe("-".join(metrics)) + f"-by-{x}.png"
    return _save(fig, out, store, run_ids[-1], default)


def plot_comparison(c: Comparison, *, out: Path | None = None, home: Path | None = None) -> list[Path]:
    """Per group: the mean over its runs (seeds) at each epoch or step, with a band from the
    minimum to the maximum. Returns the files written, as ``plot_metrics`` does."""
    out = check_output(out)
    if not c.groups:
        raise ConfigError(f"no runs to plot for {c.metric}")
    fig, (ax,) = _figure(1)
    for i, g in enumerate(c.groups):
        at: dict[float, list[float]] = {}
        for r in g.runs:
            for xv, v in r.series:
                at.setdefault(xv, []).append(v)
        xs = sorted(at)
        means = [sum(at[v]) / len(at[v]) for v in xs]
        color = f"C{i % 10}"
        label = " ".join(f"{k}={v}" for k, v in zip(c.by, g.key)) + f" (n={g.n})"
        ax.plot(xs, means, color=color, label=label, marker="." if len(xs) <= 60 else None)
        if g.n > 1:
            ax.fill_between(xs, [min(at[v]) for v in xs], [max(at[v]) for v in xs], color=color, alpha=0.2,
                            linewidth=0)
    _axes(ax, c.x, c.metric)
    ax.legend(fontsize="small", title="mean; band: min to max over runs")
    fig.suptitle(f"{c.metric} by {', '.join(c.by)}")
    newest = max((r for g in c.groups for r in g.runs), key=lambda r: r.run)
    store = open_experiment(newest.experiment, home)
    default = _safe(f"compare-{c.metric}-by-{'-'.join(c.by)}") + ".png"
    return _save(fig, out, store, newest.run, default)
