"""flor.store.trust: only the spools this user recorded to are trusted."""

from __future__ import annotations


def test_only_spools_this_user_recorded_to_are_trusted(tmp_path) -> None:
    from flor.store.trust import SPOOLS_FILE, remember_spool, spool_trusted

    config = tmp_path / "config"
    assert not spool_trusted(config, "s3://mine/flor")  # nothing recorded yet
    remember_spool(config, "s3://mine/flor/")
    remember_spool(config, "s3://mine/flor")  # noted once
    assert spool_trusted(config, "s3://mine/flor") and spool_trusted(config, "s3://mine/flor/")
    assert not spool_trusted(config, "s3://theirs/flor") and not spool_trusted(config, "s3://mine")
    path = config / SPOOLS_FILE
    assert path.read_text() == "s3://mine/flor\n" and path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o666)  # others could add their bucket: none of it counts
    assert not spool_trusted(config, "s3://mine/flor")
    path.chmod(0o600)
    path.rename(tmp_path / "elsewhere")
    path.symlink_to(tmp_path / "elsewhere")  # a link at its name is not followed
    assert not spool_trusted(config, "s3://mine/flor")


def test_a_runs_signature_holds_with_the_users_key_or_a_trusted_one_only(tmp_path) -> None:
    import secrets

    from flor.store.trust import TRUSTED_KEYS, sign_run, verify_run

    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    argv, sha = ["train.py", "--lr", "0.1"], "ab" * 32
    signature = sign_run(mine, argv, sha)
    assert signature is not None and verify_run(signature, argv, sha, mine) is None
    assert "changed after it was signed" in verify_run(signature, [*argv, "--flor_trust_pickles"], sha, mine)
    assert "changed after it was signed" in verify_run(signature, argv, "cd" * 32, mine)
    assert "not signed" in verify_run(None, argv, sha, mine)
    assert "key you do not trust" in verify_run(signature, argv, sha, theirs)
    folder = theirs / TRUSTED_KEYS
    folder.mkdir(parents=True)
    (folder / "colleague").write_text((mine / "key").read_text())
    (folder / "colleague").chmod(0o600)
    assert verify_run(signature, argv, sha, theirs) is None
    (folder / "colleague").chmod(0o622)  # others may write it: not a key to trust
    assert verify_run(signature, argv, sha, theirs) is not None
    (folder / "colleague").unlink()
    (folder / "colleague").symlink_to(mine / "key")  # a link planted there is not followed
    assert verify_run(signature, argv, sha, theirs) is not None
    forged = {"key": signature["key"], "mac": secrets.token_hex(32)}
    assert verify_run(forged, argv, sha, mine) is not None
