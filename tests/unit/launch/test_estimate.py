"""flor.launch.estimate: the probed blocks a launch reads from the script."""

from __future__ import annotations

from pathlib import Path

import pytest

from flor.launch.estimate import probed_blocks


@pytest.mark.parametrize("source, expected", [
    ('flor.SkipBlock.step_into("a")', set()),
    ('flor.SkipBlock.step_into("a", probed=True)', {"a"}),
    ('flor.SkipBlock.step_into("a", probed=False)\nflor.SkipBlock.step_into("b", probed=args.p)', {"b"}),
    ('flor.SkipBlock.step_into(name, probed=True)', True),
])
def test_probed_blocks_are_read_from_the_script(tmp_path, source, expected):
    script = tmp_path / "s.py"
    script.write_text(source)
    assert probed_blocks(script) == expected
    assert probed_blocks(Path(tmp_path / "missing.py")) == set()
