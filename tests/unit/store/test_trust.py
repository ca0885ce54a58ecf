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
