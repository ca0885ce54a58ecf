"""A warm interpreter that forks each test script, so the suite pays ``import torch`` once.

A test script costs about 2 s of CPU importing torch before its first line runs, and 1.5 s more
importing torch._dynamo at its optimizer's first step; the suite runs several hundred of them. ``Runner.run`` (``conftest.py``) therefore asks a
server started once per test worker, which has imported torch (and torch._dynamo) and nothing
of flor's, to fork: the child takes the test's pipes as its stdin, stdout and stderr, its
directory, environment and argv, and runs the script as ``python script.py`` would, in the real
``__main__`` module, then leaves through the interpreter's own exit (non-daemon threads joined,
atexit handlers, finalization). The exit status goes back as ``subprocess`` reports it.

Only what a fresh interpreter cannot tell apart goes this way: a script that imports torch
itself, with an environment that differs from the server's only in variables nothing reads
at import (``safe_env``). Everything else, and any test that needs its own process group,
limits or signal dispositions, starts a fresh interpreter as before.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

#: variables read as an interpreter, torch, numpy or OpenMP start: a request that changes one
#: gets a fresh interpreter
UNSAFE_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS", "TORCH", "PYTORCH", "CUDA", "NVIDIA",
                   "LD_", "MALLOC", "NUMPY", "TZ", "LC_", "LANG")


def safe_env(server: dict[str, str], wanted: dict[str, str]) -> bool:
    """Whether a child with environment ``wanted`` is indistinguishable from a fresh interpreter
    when forked from a server started with ``server``."""
    for key in server.keys() | wanted.keys():
        if server.get(key) != wanted.get(key) and key.upper().startswith(UNSAFE_PREFIXES):
            return False
    return True


def frame(obj: object) -> bytes:
    """``obj`` as JSON after its length: one message on the socket."""
    data = json.dumps(obj).encode()
    return struct.pack("!I", len(data)) + data


def recv(sock: socket.socket, start: bytes = b"") -> dict:
    """The next message (``frame``) on ``sock``, of which ``start`` was read already."""
    head = start[:4] + _exactly(sock, max(0, 4 - len(start)))
    size = struct.unpack("!I", head)[0]
    body = start[4:4 + size]
    return json.loads(body + _exactly(sock, size - len(body)))


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise EOFError("zygote connection closed")
        buf += got
    return buf


def serve(path: str) -> dict:
    """Accept requests on the Unix socket ``path`` until the parent goes. Each is handed to a
    forked shepherd, which forks the script's process, reports its pid and then its exit status,
    so the server takes the next request at once (a test may run two scripts side by side). In
    the script's process, return its request (it then runs the script at the top level)."""
    import ctypes
    import signal

    try:  # the test worker that started us is gone: so are we
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        conn, _ = listener.accept()
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:  # shepherds done since the last request
                pass
        except ChildProcessError:
            pass
        fds: list[int] = []
        try:
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = recv(conn, msg)
        except (OSError, EOFError, ValueError, struct.error):
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:  # the shepherd
            listener.close()
            pid = os.fork()
            if pid == 0:  # the script
                conn.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            code = 0
            try:
                conn.sendall(frame({"pid": pid}))
                _, status = os.waitpid(pid, 0)
                conn.sendall(frame({"returncode": os.waitstatus_to_exitcode(status)}))
            except OSError:
                code = 1
            os._exit(code)
        conn.close()
        for fd in fds:
            os.close(fd)


def become(request: dict) -> None:
    """Turn this forked child into ``python script args...`` run in ``cwd`` with ``env``."""
    import __main__
    import builtins

    script, cwd = request["argv"][0], request["cwd"]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    _reseed()
    with open(script, "rb") as fh:
        code = compile(fh.read(), script, "exec")
    namespace = __main__.__dict__
    namespace.clear()  # this module's globals too: nothing of the server's is left to the script
    namespace.update(__name__="__main__", __file__=script, __builtins__=builtins, __doc__=None,
                     __loader__=None, __spec__=None, __package__=None, __cached__=None)
    del request
    exec(code, namespace)


def _reseed() -> None:
    """Each fresh interpreter draws its own initial torch and numpy seeds (Python's ``random``
    reseeds itself after a fork): so does each child, not the server's once for all."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


if __name__ == "__main__":
    sys.path.pop(0)  # tests/: not a child's
    import importlib

    for module in ("torch", "torch._dynamo"):  # the point: children find them imported (the second is
        importlib.import_module(module)        # what an optimizer's first step imports: 1.5 s)

    become(serve(sys.argv[1]))
