"""``reflexdb ui``: the trajectory explorer (docs/explorer.md) and the MLflow UI, side by side.

Each server runs as a child in its own process group, which this command owns: SIGTERM, SIGINT
(Ctrl-C) and any exit of this command stop both groups (the servers and their workers), so
`kill PID` leaves nothing answering on either port. The ports are checked before anything starts;
one MLflow web worker and no job consumers (reflexdb's runs need neither) keep the start-up to
seconds. Before the explorer starts, the database is brought to the current schema and the
read-only role ``reflexdb_reader`` is made if this login may (the explorer's sessions take it).
Once both serve, the MLflow runs' links to the explorer are pointed at the address it serves on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import typer

from reflexdb.errors import ReflexdbError

from .children import die_with_parent, python_module

#: how long the server may take to answer its first request
READY_TIMEOUT_S = 120.0
#: how often the MLflow runs' explorer links are pointed at the address served (runs started meanwhile)
RELINK_EVERY_S = 60.0


class UiError(ReflexdbError):
    """The UI cannot start: a port is taken, or a server exited."""

    exit_code = 1


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as the server sets it: connections in TIME_WAIT (a UI stopped a moment ago)
        # do not count, a socket listening on the port (here or on every address) does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after ``grace_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)  # anyone of the group left?
        except ProcessLookupError:
            break
        proc.poll()
        time.sleep(0.1)
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.poll()


def _wait_ready(proc: subprocess.Popen, url: str, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise UiError(f"the {what} exited with code {proc.returncode} before serving {url} (its messages are above)")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except Exception:
            if time.monotonic() > deadline:
                raise UiError(f"the {what} did not answer on {url} within {READY_TIMEOUT_S:.0f} s") from None
            time.sleep(0.25)


def _keep_links_on(mlflow_url: str, explorer: str) -> None:
    """Point the explorer links of the MLflow runs this UI shows at ``explorer`` now, and again every
    :data:`RELINK_EVERY_S` (the learner writes its links before anyone knows the port ``ui`` will
    serve on: ``reflexdb.tracking.point_runs_at_explorer``). Through the MLflow server, which owns
    its store. Runs in a daemon thread; a failure costs the links, never the UI."""
    from reflexdb.tracking import point_runs_at_explorer

    said = None
    while True:
        try:
            point_runs_at_explorer(mlflow_url, explorer)
        except Exception as exc:
            if str(exc) != said:  # once, not every minute
                typer.echo(f"note: the MLflow runs' links to the explorer were not updated: {exc}", err=True)
            said = str(exc)
        time.sleep(RELINK_EVERY_S)


def _prepare_database(url: str | None) -> str:
    """The database's URL, its schema current and the read-only role there when this login may make it."""
    from reflexdb import roles
    from reflexdb.ops import admin
    from reflexdb.db import database_url, make_engine
    from reflexdb.settings import resolve_target

    target = database_url(resolve_target(url))
    admin.upgrade(target)
    engine = make_engine(target, pool_size=1)
    try:
        try:  # the roles made, or their grants made again on this database (as `reflexdb db roles`)
            roles.apply(engine)
        except ReflexdbError as exc:
            typer.echo(f"note: {exc}; the explorer's sessions are read-only all the same", err=True)
    finally:
        engine.dispose()
    return target


def ui(
    port: int = typer.Option(5000, "--port", min=1, max=65535, help="Port of the MLflow UI."),
    explorer_port: int = typer.Option(None, "--explorer-port", min=1, max=65535,
                                      help="Port of the trajectory explorer (default: --port + 1)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (127.0.0.1: this machine only)."),
    tracking_uri: str = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                     help="MLflow store (default: sqlite:///$REFLEXDB_HOME/mlflow.db)."),
    url: str = typer.Option(None, "--url", envvar="REFLEXDB_DATABASE_URL",
                            help="PostgreSQL URL the explorer reads (default: embedded)."),
    workers: int = typer.Option(1, "--workers", min=1, max=64, help="MLflow web workers (one is plenty for one person)."),
) -> None:
    """Start the trajectory explorer (runs, learner steps, groups, trajectories) and the MLflow UI on the
    runs the learner and `reflexdb eval` logged; stop both with Ctrl-C or SIGTERM."""
    from reflexdb.settings import home
    from reflexdb.tracking import EXPLORER_URL_ENV, default_tracking_uri

    explorer_port = explorer_port or (port + 1 if port < 65535 else port - 1)
    if explorer_port == port:
        raise UiError(f"--explorer-port and --port are both {port}; give two ports")
    for p in (port, explorer_port):
        if not _port_free(host, p):
            raise UiError(f"port {p} on {host} is in use (another `reflexdb ui`?); pass --port and --explorer-port "
                          "to choose others")
    uri = tracking_uri or default_tracking_uri()
    database = _prepare_database(url)
    web = f"http://{'[' + host + ']' if ':' in host else host}"
    mlflow_url, explorer_url = f"{web}:{port}", f"{web}:{explorer_port}"
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no huey job consumers
    # both as `python -m`, the working directory kept off their path (a `reflexdb/` folder there would
    # shadow the installed package: cli/children.py)
    cmd = [*python_module("mlflow"), "server", "--backend-store-uri", uri,
           "--default-artifact-root", (home() / "mlartifacts").as_uri(), "--host", host, "--port", str(port),
           "--workers", str(workers)]
    explorer_cmd = [*python_module("reflexdb.explorer.serve"), "--url", database, "--host", host,
                    "--port", str(explorer_port), "--mlflow-url", mlflow_url, "--tracking-uri", uri]
    procs: list[subprocess.Popen] = []

    stopping = {"signal": None}

    def _on_signal(signum, _frame):
        stopping["signal"] = signum
        raise KeyboardInterrupt

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        # each in its own process group, ours to stop; and told to stop if this process is killed outright
        for c in (cmd, explorer_cmd):
            procs.append(subprocess.Popen(c, env=env, stdout=sys.stderr, start_new_session=True,  # chatter on stderr
                                          preexec_fn=die_with_parent))
        _wait_ready(procs[0], mlflow_url, "MLflow server")
        _wait_ready(procs[1], explorer_url, "explorer")
        # the MLflow runs' links to the explorer lead here (or to REFLEXDB_EXPLORER_URL when set: a proxy's address)
        threading.Thread(target=_keep_links_on, args=(mlflow_url, os.environ.get(EXPLORER_URL_ENV) or explorer_url),
                         daemon=True).start()
        typer.echo(f"explorer on {explorer_url} (runs, steps, groups, trajectories)")
        typer.echo(f"MLflow UI on {mlflow_url} (store {uri}); Ctrl-C to stop")
        sys.stdout.flush()
        while True:
            for proc, what in zip(procs, ("MLflow server", "explorer")):
                code = proc.poll()
                if code is not None:
                    raise UiError(f"the {what} exited with code {code}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        if stopping["signal"] not in (None, signal.SIGINT):
            typer.echo(f"stopping the UI ({signal.Signals(stopping['signal']).name})", err=True)
        raise typer.Exit(0) from None
    finally:
        for proc in procs:
            _stop_group(proc)
        for s, handler in old.items():
            signal.signal(s, handler)
