"""The user's own key, and the HMAC that lets a replay load pickled leaves it wrote itself.

A pickle can run code when loaded, and anyone who can write to a shared store or bucket can
plant one. So a replay loads a pickled leaf only from a manifest signed with this user's key
(HMAC-SHA256 over the manifest's canonical bytes, which name each pickle's SHA-256), or when
the user opts in with ``--flor_trust_pickles`` / ``FLOR_TRUST_PICKLES=1``.

The key is 32 random bytes, hex, in ``key`` under flor's config directory
(``FLOR_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/flor``, else ``~/.config/flor``), created
with mode 0600 the first time a recording pickles a leaf. A team may share it deliberately:
copying the file to a colleague lets their replays load the pickles of your recordings.
A key file that others may write is refused.

The same key signs what a recording says to run: its source copy and its argv (``sign_run``,
kept in ``run.json`` as ``signature``). A sweep (``flor replay NAME --all``) runs a run's recorded
code and arguments only when they are signed by this key or by a key the user put in the
``trusted-keys`` folder beside it (one file a key, 64 hex digits, not writable by others), or when
the user opts in for that run after ``--dry-run`` (``flor.launch.sweep``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from .._files import open_append, open_file
from ..errors import ConfigError, printable, warn

__all__ = ["KEY_FILE", "SPOOLS_FILE", "TRUSTED_KEYS", "key_file", "key_id", "load_key", "remember_spool",
           "run_bytes", "sign_run", "sign_trackers", "signer", "spool_trusted", "trackers_bytes",
           "trusted_keys", "verify", "verify_run", "verify_trackers"]

KEY_FILE = "key"


def key_file(config_dir: Path) -> Path:
    """Where the key lives in ``config_dir`` (``Settings.config_dir``)."""
    return Path(config_dir) / KEY_FILE


def key_id(key: bytes) -> str:
    """A short, public name of a key (16 hex digits), written beside each signature."""
    return hashlib.sha256(b"flor key id:" + key).hexdigest()[:16]


def _read(path: Path) -> bytes:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"flor's key {path} is not a regular file; remove it (a new key is made on first use)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"flor's key {path} may be written by others (mode {stat.S_IMODE(st.st_mode):o}); "
                          f"make it private: chmod 600 {path}")
    text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ConfigError(f"flor's key {path} is not 64 hex digits; restore it from where it was shared, "
                          "or remove it (recordings signed with it then need --flor_trust_pickles)")
    return key


def load_key(config_dir: Path, *, create: bool = False) -> bytes | None:
    """The key in ``config_dir``; made (mode 0600, its folder 0700) when ``create`` and there is
    none; None when there is none and ``create`` is False."""
    path = key_file(config_dir)
    if not path.exists():
        if not create:
            return None
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(secrets.token_hex(32) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            try:  # whole before anyone sees it; fails if another process made one first: use theirs
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    return _read(path)


def signer(config_dir: Path):
    """A function ``sign(canonical_bytes) -> {"key", "mac"}`` with the key in ``config_dir``
    (made on first use); None, with a warning, when no key can be made or read."""

    def sign(data: bytes) -> dict | None:
        try:
            key = load_key(config_dir, create=True)
        except (OSError, ConfigError) as exc:  # a recording goes on unsigned: its replay then needs the opt-in
            warn("FL112", f"cannot sign checkpoints with a key in {config_dir} ({exc}); "
                 "a replay will load their pickled leaves only with --flor_trust_pickles")
            return None
        assert key is not None  # create=True makes one or raises
        return {"key": key_id(key), "mac": hmac.new(key, data, hashlib.sha256).hexdigest()}

    return sign


def verify(mac: object, data: bytes, config_dir: Path) -> str | None:
    """None when ``mac`` (a manifest's ``hmac`` field) signs ``data`` with the key in
    ``config_dir``; else why not, in words."""
    if not isinstance(mac, dict) or not isinstance(mac.get("mac"), str):
        return "its manifest is not signed"
    try:
        key = load_key(config_dir)
    except (ConfigError, OSError) as exc:
        return f"this machine's key cannot be read ({exc})"
    if key is None:
        return f"this machine has no key ({key_file(config_dir)} does not exist)"
    if mac.get("key") != key_id(key):
        return f"it was signed with another key (id {str(mac.get('key'))[:16]}, this machine's is {key_id(key)})"
    if not hmac.compare_digest(mac["mac"], hmac.new(key, data, hashlib.sha256).hexdigest()):
        return "its signature does not match its content (the manifest was changed after it was signed)"
    return None


#: the spools this user recorded to, one URL a line, beside the key (``remember_spool``)
SPOOLS_FILE = "spools"


def remember_spool(config_dir: Path, url: str) -> None:
    """Note that this user records to ``url`` (``--flor_spool`` / ``FLOR_SPOOL``), so that a
    replay of such a run may fetch its evicted blobs from the URL its ``run.json`` names
    (``spool_trusted``). Never raises: a recording goes on, and its replay then needs
    ``FLOR_SPOOL`` to fetch evicted blobs."""
    url = url.rstrip("/")
    path = Path(config_dir) / SPOOLS_FILE
    try:
        if url in _spools(path):
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with os.fdopen(open_append(path, 0o600), "a", encoding="utf-8") as fh:
            fh.write(url + "\n")
    except (OSError, ValueError) as exc:
        warn("FL412", f"cannot note the spool {url} in {path} ({exc}); a replay fetches this run's evicted blobs "
             f"only with FLOR_SPOOL={url}")


def spool_trusted(config_dir: Path, url: str) -> bool:
    """Whether this user recorded to ``url``: only then does a replay send this user's S3
    credentials to the spool a ``run.json`` names. A store is anyone's to write, and its
    ``run.json`` could name someone else's bucket, which would then see this user's signed
    requests; a spool the user set (``FLOR_SPOOL``) is used as it is."""
    return url.rstrip("/") in _spools(Path(config_dir) / SPOOLS_FILE)


def _spools(path: Path) -> set[str]:
    try:
        fd, _ = open_file(path)  # none yet, a link or not a regular file: an OSError
    except OSError:
        return set()
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return set()  # others could add a bucket: trust none of it
        text = fh.read(1 << 20).decode("utf-8", errors="replace")
    return {line.strip() for line in text.splitlines() if line.strip()}


#: the folder beside the key holding the keys of others whose recordings this user trusts
TRUSTED_KEYS = "trusted-keys"


def trusted_keys(config_dir: Path) -> list[bytes]:
    """The keys in ``config_dir/trusted-keys/`` (each file 64 hex digits); a file that is a link,
    not a regular file, writable by others or not a key is left out (anyone could add one)."""
    folder = Path(config_dir) / TRUSTED_KEYS
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    keys = []
    for name in names:
        if (folder / name).is_symlink():
            continue
        try:
            keys.append(_read(folder / name))
        except (OSError, ConfigError):
            continue
    return keys


def run_bytes(argv: list[str], source_sha256: str | None) -> bytes:
    """What a run's signature covers: its recorded argv and the SHA-256 of its source copy."""
    import json

    return b"flor run:" + json.dumps({"argv": list(argv), "source": source_sha256}, sort_keys=True).encode()


def sign_run(config_dir: Path, argv: list[str], source_sha256: str | None) -> dict | None:
    """The signature (``{"key", "mac"}``) of a recording's argv and source copy with the user's
    key (made on first use); None, with a warning (FL415), when no key can be made or read:
    a sweep then runs that run only on the user's opt-in. Never raises."""
    try:
        key = load_key(config_dir, create=True)
    except (OSError, ConfigError) as exc:
        warn("FL415", f"cannot sign this run's script and arguments with a key in {config_dir} ({exc}); "
             "a sweep replays it only after `--dry-run` and `--trust`")
        return None
    assert key is not None  # create=True makes one or raises
    return {"key": key_id(key), "mac": hmac.new(key, run_bytes(argv, source_sha256), hashlib.sha256).hexdigest()}


def verify_run(signature: object, argv: list[str], source_sha256: str | None, config_dir: Path) -> str | None:
    """None when ``signature`` signs ``argv`` and the source with the user's key or a trusted key;
    else why not, in words."""
    return _verify(signature, run_bytes(argv, source_sha256), config_dir, "the run's argv or source copy")


def trackers_bytes(trackers: dict) -> bytes:
    """What a run's ``trackers_signature`` covers: where the recording saw the script report."""
    import json

    return b"flor trackers:" + json.dumps(trackers, sort_keys=True, default=str).encode()


def sign_trackers(config_dir: Path, trackers: dict) -> dict | None:
    """The signature of the trackers a recording noted (run.json ``trackers``) with the user's key,
    which ``sign_run`` made at the run's start; None where there is none. ``flor export`` writes into
    a recorded destination only when it is signed by a key the user trusts. Never raises."""
    try:
        key = load_key(config_dir)
    except (OSError, ConfigError):
        return None
    if key is None:
        return None
    return {"key": key_id(key), "mac": hmac.new(key, trackers_bytes(trackers), hashlib.sha256).hexdigest()}


def verify_trackers(signature: object, trackers: dict, config_dir: Path) -> str | None:
    """None when ``signature`` signs ``trackers`` with the user's key or a trusted key; else why not."""
    return _verify(signature, trackers_bytes(trackers), config_dir, "the run's trackers")


def _verify(signature: object, data: bytes, config_dir: Path, what: str) -> str | None:
    if not isinstance(signature, dict) or not isinstance(signature.get("mac"), str):
        return "they are not signed"
    keys = trusted_keys(config_dir)
    try:
        own = load_key(config_dir)
    except (ConfigError, OSError):
        own = None
    if own is not None:
        keys.insert(0, own)
    key = next((k for k in keys if key_id(k) == signature.get("key")), None)
    if key is None:
        return (f"they are signed with a key you do not trust (id {printable(signature.get('key'))[:16]}); "
                f"add it to {Path(config_dir) / TRUSTED_KEYS}/ to trust its runs")
    mac = hmac.new(key, data, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(signature["mac"], mac):
        return f"their signature does not match them ({what} changed after it was signed)"
    return None
