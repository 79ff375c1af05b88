"""REFLEXDB_HOME is created private, and a home that exists is never narrowed again."""

from __future__ import annotations

import os
import stat

from reflexdb import settings


def test_a_new_home_is_private_whatever_the_umask(tmp_path, monkeypatch):
    home = tmp_path / "a" / "home"
    monkeypatch.setenv("REFLEXDB_HOME", str(home))
    old = os.umask(0)
    try:
        assert settings.ensure_home() == home
    finally:
        os.umask(old)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_a_home_that_exists_keeps_its_mode(tmp_path, monkeypatch):
    """Another process (the embedded server's start, as root) may have opened it for the server's
    OS user: narrowing it again would shut that server's initdb out."""
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o710)
    monkeypatch.setenv("REFLEXDB_HOME", str(home))
    settings.ensure_home()
    settings.make_dirs(home / "pgdata")
    assert stat.S_IMODE(home.stat().st_mode) == 0o710


def test_a_home_made_by_another_process_after_our_check_is_not_narrowed(tmp_path, monkeypatch):
    """The race of CI stop 45, replayed in order: this process finds no home; another creates it and
    its embedded server's start opens it (0710, as root); only then does this process go on. The
    code before the fix then did chmod 0700 and shut that server's initdb out."""
    import pathlib

    home = tmp_path / "home"
    monkeypatch.setenv("REFLEXDB_HOME", str(home))
    real_exists = pathlib.Path.exists

    def exists_then_the_other_process_runs(self, *a, **kw):
        found = real_exists(self, *a, **kw)
        if self == home and not found:
            home.mkdir()
            home.chmod(0o710)
        return found

    monkeypatch.setattr(pathlib.Path, "exists", exists_then_the_other_process_runs)
    settings.ensure_home()
    monkeypatch.setattr(pathlib.Path, "exists", real_exists)
    assert stat.S_IMODE(home.stat().st_mode) == 0o710
