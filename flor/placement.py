"""Where this process stands: torchrun, Slurm and DDP environments -> worker index, rank,
the ids that the workers of one launch share, and the cores it may use.

Pure functions of the environment (torch.distributed is consulted only for an initialized
process group), so settings and the launcher read placement the same way.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from typing import Any, Mapping

from .errors import ConfigError

__all__ = ["IdleMeter", "OffCpu", "cores", "distributed", "group_size", "new_replay_id", "parse_segment", "pid_alive",
           "record_rank", "shared_replay_id", "worker_place"]


def parse_segment(text: str, origin: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)/(\d+)$", text.strip())
    if not m:
        raise ConfigError(
            f"{origin}: {text!r} is not PID/NGPUS; write two whole numbers like 0/4 "
            "(0-based PID, 0 <= PID < NGPUS), or leave the value out to replay every epoch"
        )
    pid, ngpus = int(m.group(1)), int(m.group(2))
    if ngpus < 1:
        raise ConfigError(f"{origin}: NGPUS must be at least 1 in {text!r}; for example 0/1")
    if pid >= ngpus:
        raise ConfigError(
            f"{origin}: PID {pid} is out of range in {text!r}: PIDs are 0-based, so with "
            f"{ngpus} workers use 0..{ngpus - 1}"
        )
    return pid, ngpus


def _int_env(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{key}={value!r} is not a whole number; unset it or fix it") from exc


def worker_place(env: Mapping[str, str]) -> tuple[int, int, str]:
    """Worker place from torchrun or Slurm variables, else a single worker."""
    candidates = [
        ("RANK", "WORLD_SIZE", "torchrun", 0),
        ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "slurm array", _int_env(env, "SLURM_ARRAY_TASK_MIN") or 0),
        ("SLURM_PROCID", "SLURM_NTASKS", "slurm", 0),
    ]
    for pid_key, n_key, origin, offset in candidates:
        pid, n = _int_env(env, pid_key), _int_env(env, n_key)
        if pid is None or n is None:
            continue
        pid -= offset
        text = f"{pid}/{n}"
        return (*parse_segment(text, f"{pid_key}/{n_key}"), origin)
    return 0, 1, "default"


def shared_replay_id(env: Mapping[str, str], placed_by: str) -> str | None:
    """The id that every worker of one Slurm job or torchrun launch derives alike, or None."""
    if placed_by == "slurm array" and env.get("SLURM_ARRAY_JOB_ID"):
        raw = f"slurm{env['SLURM_ARRAY_JOB_ID']}"
    elif placed_by == "slurm" and env.get("SLURM_JOB_ID"):
        raw = f"slurm{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID') or 0}"
    elif placed_by == "torchrun" and (env.get("TORCHELASTIC_RUN_ID") or "none") != "none":
        raw = f"tr-{env['TORCHELASTIC_RUN_ID']}"
    else:
        return None
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:64]


def new_replay_id() -> str:
    """A fresh replay id: the UTC time to the second and four random hex digits, so ids sort by
    start time and two launches in one second still differ.

    >>> len(new_replay_id()), new_replay_id()[8]
    (19, 'T')
    """
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + uuid.uuid4().hex[:4]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still exists (signal 0 checks without sending).

    >>> pid_alive(os.getpid())
    True
    """
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def distributed() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() else None


def group_size() -> tuple[int, int] | None:
    dist = distributed()
    if dist is not None and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return None


def record_rank(env: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """``(rank, world size)`` of this recording process: from torchrun's ``RANK``/``WORLD_SIZE``,
    else from an initialized process group, else ``(0, 1)``."""
    try:
        rank, world = int(env.get("RANK", "")), int(env.get("WORLD_SIZE", ""))
        if world > 1 and 0 <= rank < world:
            return rank, world
    except ValueError:
        pass
    return group_size() or (0, 1)


def cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _busy_seconds(path: str = "/proc/stat") -> float | None:
    """CPU-seconds the cores this process may use have spent busy since boot (``/proc/stat``'s
    per-core lines; time stolen by a hypervisor counts as busy); None where unknown."""
    try:
        mine = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        mine = None
    try:
        busy = 0
        with open(path) as fh:
            for line in fh:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *fields = line.split()
                if mine is not None and int(name[3:]) not in mine:
                    continue
                ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
                busy += sum(ticks) - ticks[3] - ticks[4]
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


#: the shortest window an idle reading is made over: /proc/stat counts 10 ms ticks per core, so a
#: shorter one (the first checkpoint soon after the loop starts) may see a busy core as idle
IDLE_WINDOW_S = 0.25


class IdleMeter:
    """How many of this process's cores sat idle between two readings, leaving out CPU time
    the caller spent itself (the checkpoint writer), from ``/proc/stat``.

    Counts the whole machine's work on those cores, so other processes on a busy node count
    as busy. None where ``/proc/stat`` is not there, or less than ``IDLE_WINDOW_S`` passed since
    the last reading (then callers assume the cores are shared).

    >>> meter = IdleMeter(path="/nonexistent")
    >>> meter.idle() is None
    True
    """

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self.last = (_busy_seconds(path), time.perf_counter())

    def age(self) -> float:
        """Seconds since the last reading."""
        return time.perf_counter() - self.last[1]

    def idle(self, exclude_s: float = 0.0) -> float | None:
        """Idle cores (0..cores) on average since the last reading, as if ``exclude_s`` CPU-seconds
        of the caller's own work had not run; starts the next reading."""
        busy0, wall0 = self.last
        wall = time.perf_counter()
        if wall - wall0 < IDLE_WINDOW_S:
            return None  # too short to tell: /proc/stat counts in ticks; the reading goes on
        busy = _busy_seconds(self.path)
        self.last = (busy, wall)
        if busy is None or busy0 is None:
            return None
        used = max(busy - busy0 - exclude_s, 0.0) / (wall - wall0)
        return min(max(cores() - used, 0.0), float(cores()))


class OffCpu:
    """How long one thread spent waiting (for the GIL, a lock, I/O) between two readings
    (``mark``, ``since``), read from any thread: wall time less the thread's CPU time and less
    its time in a run queue (``/proc/self/task/TID/schedstat``), so a thread that other work
    kept from a core does not count as waiting; where schedstat is missing, a preempted
    thread counts too. Made on the thread to measure (the training thread); ``since`` gives
    None where its CPU clock cannot be read (not Linux, the thread gone).

    >>> meter = OffCpu()
    >>> mark = meter.mark()
    >>> _ = sum(range(10 ** 5))  # on its CPU
    >>> waited = meter.since(mark)
    >>> waited is None or 0.0 <= waited < 1.0
    True
    """

    def __init__(self) -> None:
        try:
            self.clock: int | None = time.pthread_getcpuclockid(threading.get_ident())
        except (AttributeError, OSError):  # no per-thread CPU clocks here
            self.clock = None
        self.schedstat: str | None = f"/proc/self/task/{threading.get_native_id()}/schedstat"

    def _queued(self) -> float | None:
        """Seconds the thread has waited in a run queue (for a core), from schedstat; None,
        from then on, where it cannot be read (read first by the writer, not the training
        thread: its first checkpoint is ~0.1 ms shorter)."""
        if self.schedstat is None:
            return None
        try:
            with open(self.schedstat, "rb") as fh:
                return int(fh.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            self.schedstat = None
            return None

    def mark(self) -> tuple[float, float] | None:
        """(wall, the thread's CPU time plus its time in a run queue) now; None where unknown."""
        if self.clock is None:
            return None
        try:
            return time.perf_counter(), time.clock_gettime(self.clock) + (self._queued() or 0.0)
        except OSError:  # the thread ended
            return None

    def since(self, mark: tuple[float, float] | None) -> float | None:
        """Seconds the thread spent waiting since ``mark``; None where unknown."""
        now = self.mark()
        if mark is None or now is None:
            return None
        return max((now[0] - mark[0]) - (now[1] - mark[1]), 0.0)
