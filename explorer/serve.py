"""``python -m reflexdb.explorer.serve``: the explorer's web server (uvicorn), as ``reflexdb ui`` starts it.

Prints nothing on stdout; answers ``/health`` once it serves. Stops on SIGTERM or SIGINT. Logs
warnings and errors on stderr, uvicorn's too, each record escaped (:class:`EscapedLog`): a
request's text never reaches the log raw.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading


def warm_tokenizers(db) -> None:
    from .tokens import tokenizer_for

    try:
        for model in sorted({str(r["model"] or "smollm2") for r in db.runs()})[:5]:
            tokenizer_for(model)
    except Exception as exc:  # a page loads it when it needs it
        logging.getLogger(__name__).debug("tokenizers not warmed: %s", exc)


def warm_choices(db) -> None:
    """Each run's filter options read once (a scan of the run), so that no list page waits for it."""
    try:
        for run in db.runs():
            db.choices(run)
    except Exception as exc:  # a page reads them when it needs them
        logging.getLogger(__name__).debug("filter options not read ahead: %s", exc)


def warm(db, app) -> None:
    """What a first page would wait for, done in the background: the runs' filter options, their
    tokenizers, MLflow's client (for the first click on a run's MLflow link)."""
    warm_choices(db)
    warm_tokenizers(db)
    app.state.mlflow.warm()


class EscapedLog(logging.Formatter):
    """A log record as lines no request can forge: its control characters, lone surrogates and
    line separators escaped (explorer/app.py, ``printable``), and every line after its first
    indented (a traceback's, or a newline a message let through), so that no text a request
    carries starts a line that reads as a record of its own or moves a terminal's cursor."""

    def format(self, record: logging.LogRecord) -> str:
        from .app import printable

        return printable(super().format(record), 1_000_000, newlines=True).replace("\n", "\n  ")


def log_to(stream) -> logging.Handler:
    """Warnings and errors of every logger (uvicorn's too: :data:`UVICORN`) to ``stream``,
    each record escaped (:class:`EscapedLog`). Returns the handler added to the root logger."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(EscapedLog("%(levelname)s:%(name)s:%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    return handler


#: uvicorn's settings: warnings and worse, no access log, and no logging setup of its own
#: (``log_config=None``: its loggers reach :func:`log_to`'s handler, escaped)
UVICORN = {"log_level": "warning", "access_log": False, "log_config": None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reflexdb.explorer.serve")
    ap.add_argument("--url", default=None, help="PostgreSQL URL (default: the configured database)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5001)
    ap.add_argument("--mlflow-url", default=None, help="where the MLflow UI answers (for links)")
    ap.add_argument("--tracking-uri", default=None, help="the MLflow store (to find a run's MLflow run)")
    ap.add_argument("--no-role", action="store_true", help="do not take the role reflexdb_reader")
    args = ap.parse_args(argv)

    import uvicorn

    from reflexdb.db import database_url
    from reflexdb.errors import ReflexdbError

    from .app import create_app
    from .data import READER, Explorer

    log_to(sys.stderr)
    try:
        db = Explorer(args.url or database_url(), role=None if args.no_role else READER)
    except ReflexdbError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    app = create_app(db, mlflow_url=args.mlflow_url, tracking_uri=args.tracking_uri)
    # the runs' tokenizers load in the background (seconds): the first trajectory page need not wait
    threading.Thread(target=warm, args=(db, app), daemon=True).start()
    uvicorn.run(app, host=args.host, port=args.port, **UVICORN)
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
