"""flor.redact: secrets in argv never enter a store (issue #10)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv, want", [
    (["--hf_tok", "X"], ["--hf_tok", "***"]),
    (["--hf-token=X"], ["--hf-token=***"]),
    (["--pwd", "X", "--lr", "0.1"], ["--pwd", "***", "--lr", "0.1"]),
    (["--use_auth", "--lr", "0.1"], ["--use_auth", "--lr", "0.1"]),  # a switch: the next flag stays
    (["-k", "5", "-k", "s3cr3t", "-k=s3cr3t", "-p", "8080"], ["-k", "5", "-k", "***", "-k=***", "-p", "8080"]),
    (["--db", "postgres://u:PASS@h:5432/x"], ["--db", "postgres://u:***@h:5432/x"]),
    (["--url=https://me:tok@host/path"], ["--url=https://me:***@host/path"]),
    (["sk-ant-api03-abcdefghijklmnop", "xoxb-1234567890-abc"], ["***", "***"]),
    (["--x", "AKIAIOSFODNN7EXAMPLE"], ["--x", "***"]),
    (["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig"], ["***"]),
    (["HF_TOKEN=abc", "EPOCHS=3"], ["HF_TOKEN=***", "EPOCHS=3"]),
    (["--max_tokens", "512", "--tokenizer", "gpt2", "--num_passes", "3", "--author", "me", "--lr", "-1e-3"],
     ["--max_tokens", "512", "--tokenizer", "gpt2", "--num_passes", "3", "--author", "me", "--lr", "-1e-3"]),
])
def test_redact_argv(argv: list[str], want: list[str]) -> None:
    from flor.redact import redact_argv

    assert redact_argv(["train.py", *argv]) == ["train.py", *want]
