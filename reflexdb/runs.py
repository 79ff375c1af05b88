"""The runs as a whole: listing, evaluations, origins, live processes, sizes and deletion.

The one module that reads ``sql/runs.sql``; ``reflexdb runs``, ``reflexdb db status``, archive,
import and MLflow tracking go through it. Making a run and its settings are the store's
(:meth:`reflexdb.Store.create_run`, ``set_settings``), as its groups, steps and versions are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .sqlfile import load_queries

if TYPE_CHECKING:
    from .storage import Owner
    from .store import Store

Q = load_queries("runs.sql")


def list_runs(store: Store, name: str | None = None) -> list[dict[str, Any]]:
    """Every run (or the one named), a dict per run with the columns of ``list_runs``."""
    with store.transaction() as conn:
        cur = conn.execute(Q["list_runs"], {"name": name})
        cols = [d.name for d in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]


def evals(store: Store, run_id: int) -> list[tuple]:
    """The run's held-out evaluations, one row per (policy version, attempts): ``run_evals``."""
    with store.transaction() as conn:
        return conn.execute(Q["run_evals"], {"run_id": run_id}).fetchall()


def origins(store: Store, run_id: int) -> list[tuple]:
    """What the run holds by origin: ``run_origins``."""
    with store.transaction() as conn:
        return conn.execute(Q["run_origins"], {"run_id": run_id}).fetchall()


def processes(store: Store, name: str) -> list[tuple]:
    """The run's live processes (connected sessions, collectors with a recent heartbeat): ``run_processes``."""
    with store.transaction() as conn:
        return conn.execute(Q["run_processes"], {"name": name}).fetchall()


def sizes(conn) -> list[tuple]:
    """Every run's size on disk (``run_sizes``), on a SQLAlchemy connection (``reflexdb db status``)."""
    from sqlalchemy import text

    return [tuple(r) for r in conn.execute(text(Q["run_sizes"]))]


def holding(conn, origins: list[str], kinds: list[str]) -> list[tuple[str, list[str], list[str]]]:
    """The runs whose rows use these origins or group kinds, or others of their methods (``runs_holding``),
    each as (name, what it uses, the methods), on a SQLAlchemy connection (``reflexdb db downgrade``)."""
    return [tuple(r) for r in conn.exec_driver_sql(Q["runs_holding"], {"origins": origins, "kinds": kinds})]


def owner(store: Store, run_id: int) -> Owner:
    """Who run ``run_id`` is, as its checkpoint prefix's marker records it (``run_owner``).

    Raises:
        NotFound: no such run.
    """
    from .errors import NotFound
    from .storage import Owner

    with store.transaction() as conn:
        row = conn.execute(Q["run_owner"], {"run_id": run_id}).fetchone()
    if row is None:
        raise NotFound(f"no run with id {run_id}")
    return Owner.of(row[0], run_id, row[1])


def published(store: Store, run_id: int) -> list[tuple]:
    """``(version, checkpoint_uri, sha256, meta)`` of each version the run's learner recorded (``run_published``)."""
    with store.transaction() as conn:
        return conn.execute(Q["run_published"], {"run_id": run_id}).fetchall()


def find(store: Store, name: str) -> tuple[int, int | None] | None:
    """``(id, embedding_dim)`` of the run named ``name``; ``None`` when there is none (``find_run``)."""
    with store.transaction() as conn:
        row = conn.execute(Q["find_run"], {"name": name}).fetchone()
    return None if row is None else (row[0], row[1])


def privileges(store: Store) -> tuple[bool, bool]:
    """Whether this login may create a run, and record a run's embedding dimension (``run_privileges``)."""
    with store.transaction() as conn:
        row = conn.execute(Q["run_privileges"]).fetchone()
    return bool(row[0]), bool(row[1])


def delete(store: Store, run_id: int) -> None:
    """Delete a run: its partitions dropped, then its other rows (``delete_run``)."""
    with store.transaction() as conn:
        conn.execute(Q["delete_run"], {"run_id": run_id})


__all__ = ["delete", "evals", "find", "holding", "list_runs", "origins", "owner", "privileges", "processes",
           "published", "sizes"]
