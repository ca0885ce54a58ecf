"""flor.cli.common: what the commands print from a store reaches the terminal inert."""

from __future__ import annotations

import io

from flor.cli.common import InertStream


def test_control_characters_are_escaped_and_only_a_progress_bars_leading_cr_is_kept() -> None:
    raw = io.StringIO()
    out = InertStream(raw)
    out.write("run r1 (lr=0.1\x1b]52;c;aGk=\x07)\rflor: replay verified exact\n\ttab kept\n")
    assert raw.getvalue() == "run r1 (lr=0.1\\x1b]52;c;aGk=\\x07)\\rflor: replay verified exact\n\ttab kept\n"
    err = io.StringIO()
    bar = InertStream(err, keep_cr=True)
    bar.write("\r 40%|####      | 2/5 epochs")
    bar.write("flor: note \rflor: replay verified exact\u202e\n")
    assert err.getvalue() == "\r 40%|####      | 2/5 epochs" + "flor: note \\rflor: replay verified exact\\u202e\n"
    assert bar.getvalue() == err.getvalue()  # the rest is the wrapped stream's
