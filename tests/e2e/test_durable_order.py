"""A checkpoint's manifest is written only after its blobs are durable: a real recording whose
fsync, fdatasync and rename calls are logged in order. Every manifest is renamed into place only
after each blob it names was synced to disk, renamed and its folder fsynced
(``unit/store/test_write_batch.py`` tests the one barrier per batch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flor.store.blobs import blob_key


TRACE = '''
import os, runpy, sys
LOG = open(os.environ["TRACE_LOG"], "a", buffering=1)
real = {n: getattr(os, n) for n in ("fsync", "fdatasync", "replace")}

def synced(name):
    def sync(fd):
        real[name](fd)
        LOG.write(f"sync {os.readlink(f'/proc/self/fd/{fd}')}\\n")
    return sync

def replace(src, dst, **kw):
    real["replace"](src, dst, **kw)
    LOG.write(f"rename {os.path.abspath(dst)}\\n")

os.fsync, os.fdatasync, os.replace = synced("fsync"), synced("fdatasync"), replace
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name the synced files")
def test_manifest_only_after_its_blobs_are_durable(runner, tmp_path: Path):
    script = runner.script()
    wrapper = tmp_path / "trace.py"
    wrapper.write_text(TRACE)
    log = tmp_path / "trace.log"
    runner.run(wrapper, str(script), "--epochs", "3", "--flor", "batched", env=runner.env(TRACE_LOG=str(log)))
    events = [line.split(" ", 1) for line in log.read_text().splitlines()]
    manifests = [i for i, (op, p) in enumerate(events) if op == "rename" and "/checkpoints/" in p]
    assert len(manifests) == 3
    for i in manifests:
        manifest = json.loads(Path(events[i][1]).read_text())
        digests = set()

        def walk(node):
            if isinstance(node, dict):
                if isinstance(node.get("h"), str):
                    digests.add(node["h"])
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk({k: manifest[k] for k in ("objects", "rng", "rng_start")})
        assert digests
        before = events[:i]
        for digest in digests:
            dest = str(runner.home / "batched" / blob_key(digest))
            renamed = [j for j, (op, p) in enumerate(before) if op == "rename" and p.endswith(blob_key(digest))]
            if not renamed:
                continue  # deduplicated: written (and made durable) by an earlier checkpoint
            j = renamed[-1]
            folder = os.path.dirname(events[j][1])
            assert any(op == "sync" and p == folder for op, p in before[j:]), f"{dest}: folder not synced before the manifest"
        assert any(op == "rename" and "/objects/" in p for op, p in before)
