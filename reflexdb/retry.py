"""Riding out database outages: retry a call with backoff while the server is unreachable.

Collectors and the learner wrap every database call of their loops in :class:`DbRetry`: an
unreachable server (restart, failover, network drop) makes the call wait and try again with
exponential backoff (0.5 s doubling to at most 10 s between tries), printing one line per try,
and one when the database is back. If it stays away longer than the limit, the call raises
:class:`~reflexdb.errors.DatabaseUnavailable` with a one-line message, which the command prints
before exiting. Errors that are not about the connection (a constraint, a bad query) are never
retried.

Only whole transactions are retried: a call that fails midway was rolled back by the server, so
trying it again cannot apply it twice. Calls whose commit may have happened without the client
hearing of it (the connection dropped at COMMIT) are made idempotent by the store itself (group
write keys, recorded steps, policy versions).
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

import psycopg
import sqlalchemy.exc
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from .errors import DatabaseUnavailable

T = TypeVar("T")

#: Exceptions that mean "the server could not be reached or went away", not "the call was wrong".
TRANSIENT = (DatabaseUnavailable, psycopg.OperationalError, psycopg.InterfaceError,
             sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class DbRetry:
    """Retry database calls while the server is unreachable, for at most ``limit_s`` seconds each.

    Args:
        limit_s: how long one call may keep failing before giving up.
        echo: where the waiting lines go.
        who: names the process in the give-up message (``the learner``).
    """

    def __init__(self, limit_s: float, echo: Callable[[str], None], *, who: str = "reflexdb"):
        self.limit_s = limit_s
        self.echo = echo
        self.who = who

    def __call__(self, fn: Callable[[], T]) -> T:
        failing_since: list[float] = []

        def before_sleep(state) -> None:
            if not failing_since:
                failing_since.append(time.monotonic())
            self.echo(f"database unreachable ({_reason(state.outcome.exception())}); retrying in "
                      f"{state.next_action.sleep:.1f}s (gives up after {self.limit_s:.0f}s)")

        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(TRANSIENT), stop=stop_after_delay(self.limit_s),
                wait=wait_exponential(multiplier=0.5, max=10), before_sleep=before_sleep, reraise=True,
            ):
                with attempt:
                    result = fn()
        except TRANSIENT as exc:
            raise DatabaseUnavailable(
                f"{self.who} stopped: the database has been unreachable for more than {self.limit_s:.0f}s "
                f"({_reason(exc)})") from None
        if failing_since:
            self.echo(f"database is back after {time.monotonic() - failing_since[0]:.1f}s")
        return result
