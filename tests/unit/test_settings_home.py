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
