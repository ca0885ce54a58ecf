"""Secrets kept out of what flor writes: run.json's argv and hyperparameters, launch records,
and the patches of untracked files (``flor.runinfo.git_info``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_CODE_SUFFIXES = {".py", ".pyi", ".pyx", ".ipynb", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh"}

__all__ = ["REDACTED", "holds_secret", "is_secret_name", "redact_argv", "redact_command", "redact_text",
           "redact_value", "secret_file_name"]

#: words of a flag or variable name that mark its value secret (``--hf_tok``, ``--db-password``, ``HF_TOKEN``);
#: whole words, so ``--max_tokens``, ``--tokenizer``, ``--num_passes`` and ``--author`` stay readable
_SECRET_WORDS = frozenset({
    "token", "tok", "key", "secret", "secrets", "pass", "passwd", "password", "passphrase", "pwd", "pw", "auth",
    "authorization", "bearer", "credential", "credentials", "creds", "apikey", "cookie",
})



#: endings that mark a run-together word secret (``--dbpass``, ``--hftoken``, ``--apikey``, ``--sshkey``)
_SECRET_ENDINGS = ("token", "key", "secret", "pass", "passwd", "password", "pwd", "credential", "credentials")



#: short flags whose value is hidden unless it is a plain number (``-k 5`` is a top-k, ``-k s3cr3t`` is not)
_SECRET_SHORT = frozenset({"-k", "-p"})



_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")



#: secrets recognized by their shape wherever they appear: API tokens with a known prefix, JWTs
_SECRET_VALUE_RE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-[A-Za-z0-9_-]{16,}|sk_(?:live|test)_[A-Za-z0-9]{16,}|rk_live_[A-Za-z0-9]{16,}"  # OpenAI, Anthropic, Stripe
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"  # GitHub, GitLab
    r"|hf_[A-Za-z0-9]{20,}|(?:AKIA|ASIA)[A-Z0-9]{16}|AIza[0-9A-Za-z_-]{35}"  # Hugging Face, AWS, Google
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"  # Slack
    r"|pypi-[A-Za-z0-9_-]{32,}|npm_[A-Za-z0-9]{30,}|wandb_v1_[A-Za-z0-9_]{20,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # a JWT: header.payload.signature
    r")"
)



#: ``scheme://user:password@host``: the password is hidden, the URL kept
_URL_PASSWORD_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<pw>[^@\s/]+)(?P<at>@)")



#: ``Authorization: Bearer <token>`` (and Basic): the scheme kept, the credential hidden
_AUTH_HEADER_RE = re.compile(r"(?i)(?P<head>\b(?:bearer|basic|token)\s+)(?P<cred>[A-Za-z0-9._~+/=-]{8,})")

#: ``?password=...`` / ``&api_key=...`` in a URL's query: the value of a secret-named parameter hidden
_QUERY_RE = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z0-9_.-]+)=)(?P<value>[^&#\s'\"]+)")

#: ``NAME=value`` words (environment assignments, ``key=value`` configs)
_ASSIGN_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>.*)$", re.DOTALL)



_NUMBER_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")



REDACTED = "***"



def is_secret_name(name: str) -> bool:
    """Whether a flag, variable or hyperparameter called ``name`` holds a secret.

    >>> [is_secret_name(n) for n in ("--hf_tok", "--db-password", "HF_TOKEN", "apiKey", "--dbpass")]
    [True, True, True, True, True]
    >>> [is_secret_name(n) for n in ("--max_tokens", "--tokenizer", "--num_passes", "--author", "--lr")]
    [False, False, False, False, False]
    """
    words = [w.lower() for w in _WORD_SPLIT.split(name) if w]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)



def redact_text(text: str) -> str:
    """``text`` with secret-shaped values hidden: known token prefixes, JWTs, URL passwords.

    >>> redact_text("postgres://u:PASS@db:5432/x")
    'postgres://u:***@db:5432/x'
    >>> redact_text("Bearer ghp_abcdefghijklmnopqrstuvwxyz0123")
    'Bearer ***'
    >>> redact_text("Authorization: Bearer abc.def-123456"), redact_text("https://h/x?user=me&password=hunter2&n=1")
    ('Authorization: Bearer ***', 'https://h/x?user=me&password=***&n=1')
    """
    if not isinstance(text, str):
        return text
    text = _URL_PASSWORD_RE.sub(lambda m: m["head"] + REDACTED + m["at"], text)
    text = _AUTH_HEADER_RE.sub(lambda m: m["head"] + REDACTED, text)
    text = _QUERY_RE.sub(lambda m: m["head"] + REDACTED if is_secret_name(m["name"]) else m[0], text)
    text = _SECRET_PAIR_RE.sub(_hide_pair, text)  # {"api_key": "..."} or f(password="...") anywhere in a line
    return _SECRET_VALUE_RE.sub(REDACTED, text)



#: values of secret-named settings that are placeholders, not secrets
_PLACEHOLDERS = ("none", "null", "true", "false", "changeme", "required")


def _hide_pair(m: re.Match) -> str:
    if not is_secret_name(m["name"]) or m["quoted"].lower() in _PLACEHOLDERS:
        return m[0]
    return m[0][: m.start("quoted") - m.start()] + REDACTED + m["q"]


def redact_value(name: str, value: Any) -> Any:
    """A hyperparameter's value as it may be stored: hidden for a secret name (when set),
    secret-shaped parts of strings hidden otherwise."""
    if is_secret_name(name) and value not in (None, "", False):
        return REDACTED
    if f"-{name}" in _SECRET_SHORT and isinstance(value, str) and value and not _NUMBER_RE.match(value):
        return REDACTED  # the dest of -k/-p: as on the command line, numbers stay, words are hidden
    if isinstance(value, str):
        m = _ASSIGN_RE.match(value)  # --env AWS_SECRET_ACCESS_KEY=... (an append option): a list of these
        if m and is_secret_name(m["name"]) and m["value"]:
            return f"{m['name']}={REDACTED}"
        return redact_text(value)
    if isinstance(value, (list, tuple)):
        return [redact_value("", v) for v in value]
    if isinstance(value, dict):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    return value



def _takes_value(word: str | None) -> bool:
    """Whether ``word`` can be the value of the flag before it (not another flag)."""
    return word is not None and not (word.startswith("-") and len(word) > 1 and not _NUMBER_RE.match(word))



def redact_argv(argv: list[str], secret_flags: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The command line as flor may write it: secrets hidden by flag name and by value shape.

    ``--flag value`` and ``--flag=value`` with a secret-looking name (see ``is_secret_name``),
    ``NAME=value`` words likewise, ``-k``/``-p`` unless their value is a number, and anywhere
    a known token shape (``sk-``, ``ghp_``, ``hf_``, ``AKIA``, ``xox?-``, JWTs) or the password
    of a ``user:password@`` URL (the URL is kept). ``secret_flags`` are option strings whose
    argparse dest is secret-like (``--hf`` of ``dest="hf_token"``, ``-P`` of ``db_password``): their
    values are hidden too, also written together (``-PMyPass``) or abbreviated (``--hf_t``).

    >>> redact_argv(["train.py", "--hf_tok", "abc", "--pwd=x", "-k", "5", "--db", "postgres://u:PW@h/db"])
    ['train.py', '--hf_tok', '***', '--pwd=***', '-k', '5', '--db', 'postgres://u:***@h/db']
    >>> redact_argv(["t.py", "--hf", "S3CR3T", "-PMyDbPass", "-P", "x2"], {"--hf", "-P", "--hf-token"})
    ['t.py', '--hf', '***', '-P***', '-P', '***']
    """
    out: list[str] = []
    hide_next = False
    for i, word in enumerate(argv):
        word = str(word)
        if hide_next:
            hide_next = False
            if _takes_value(word):
                out.append(REDACTED)
                continue
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if word.startswith("-") and len(word) > 1 and not _NUMBER_RE.match(word):
            flag, eq, value = word.partition("=")
            short = flag in _SECRET_SHORT
            if not eq and not word.startswith("--") and len(word) > 2 and word[:2] in secret_flags:
                out.append(word[:2] + REDACTED)  # -PMyPass: a short option with its value attached
                continue
            if _is_secret_flag(flag, secret_flags):
                if eq:
                    out.append(f"{flag}={REDACTED}")
                else:
                    out.append(word)
                    hide_next = True
                continue
            if is_secret_name(flag.lstrip("-")) or short:
                if eq:
                    out.append(word if short and _NUMBER_RE.match(value) else f"{flag}={REDACTED}")
                else:
                    out.append(word)
                    hide_next = not (short and nxt is not None and _NUMBER_RE.match(nxt))
                continue
        else:
            m = _ASSIGN_RE.match(word)
            if m and is_secret_name(m["name"]) and m["value"]:
                out.append(f"{m['name']}={REDACTED}")
                continue
        out.append(redact_text(word))
    return out



def _is_secret_flag(flag: str, secret_flags: frozenset[str] | set[str]) -> bool:
    """``flag`` is one of ``secret_flags`` or, for a long one, the unique-prefix abbreviation
    argparse accepts for one."""
    if flag in secret_flags:
        return True
    return flag.startswith("--") and len(flag) > 3 and any(s.startswith(flag) for s in secret_flags)


def redact_command(command: list[str]) -> str:
    """``shlex.join`` of the redacted command: a command line that is safe to print or keep."""
    import shlex

    return shlex.join(redact_argv(list(command)))



#: names (of the file or of a folder above it) that hold secrets: never included, whatever the suffix
_SECRET_FILE_RE = re.compile(
    r"^(\.env.*|.*\.env|.*\.pem|.*\.key|.*\.p12|.*\.pfx|.*\.jks|.*\.keystore|.*\.kdbx|credentials?.*"
    # ssh keys (id_rsa, id_ed25519.pub...), not every id_*: id_mapping.py is source
    r"|id_(rsa|dsa|ecdsa|ed25519)(_sk)?(\..*)?|secrets?([._-].*)?|.*[._-]secrets?(\..*)?|tokens?([._-].*)?"
    r"|.*[._-]tokens?(\..*)?|\.netrc|_netrc|\.pgpass|\.npmrc|\.pypirc|\.htpasswd|\.git-credentials"
    r"|\.aws|\.ssh|\.gnupg|service[-_]?account.*)$",
    re.IGNORECASE,
)



#: a line that assigns a secret-named setting a value (``password = x``, ``api_key: x``, ``"token": "x"``)
_SECRET_LINE_RE = re.compile(
    r"""^\s*[{,]?\s*(?:export\s+)?["']?(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)["']?\s*[:=]\s*"""
    r"""(?:(?P<q>["'])(?P<quoted>[^"'\s]{4,})(?P=q)|(?P<bare>[^\s"'#$%{(<\[][^\s"'#]{3,})\s*(?:#.*)?$)""")



#: a secret-named key given a quoted literal anywhere in a line: a dict entry, a keyword argument
_SECRET_PAIR_RE = re.compile(
    r"""(?<![A-Za-z0-9_])["']?(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)["']?\s*[:=]\s*(?P<q>["'])(?P<quoted>[^"'\s]{4,})(?P=q)""")


def secret_file_name(rel: str) -> bool:
    """Whether a file at ``rel`` (relative path) is named like one that holds secrets.

    >>> [secret_file_name(n) for n in (".env", ".env.local", "keys/id_rsa", "secrets.yaml", "conf/prod.pem")]
    [True, True, True, True, True]
    >>> [secret_file_name(n) for n in ("train.py", "configs/model.yaml", "README.md")]
    [False, False, False]
    """
    return any(_SECRET_FILE_RE.match(part) for part in Path(rel).parts)



def holds_secret(text: str, suffix: str = "") -> bool:
    """Whether ``text`` (a file's contents) assigns a secret-named setting a literal value or
    holds a secret-shaped one (``flor.redact.redact_text``).

    >>> holds_secret("[db]\\npassword = hunter2\\n"), holds_secret("lr: 0.1\\nepochs: 3\\n")
    (True, False)
    >>> holds_secret("api_key = os.environ['KEY']\\n", ".py"), holds_secret("api_key = 'abcd1234'\\n", ".py")
    (False, True)
    >>> holds_secret("cfg = {'lr': 0.1, 'api_key': 'abcd1234'}\\n", ".py")
    True
    >>> holds_secret("db = connect(host, password='hunter22')\\n", ".py")
    True
    """
    if redact_text(text) != text:
        return True
    for line in text.splitlines():
        m = _SECRET_LINE_RE.match(line)
        if m is None or not is_secret_name(m["name"]):
            continue
        value = m["quoted"] or ("" if suffix in _CODE_SUFFIXES else m["bare"] or "")
        if value and value.lower() not in _PLACEHOLDERS:
            return True
    return False
