"""``reflexdb ui``: the MLflow UI on reflexdb's tracking store.

The MLflow server runs as a child in its own process group, which this command owns: SIGTERM,
SIGINT (Ctrl-C) and any exit of this command stop the whole group (the server and its workers),
so `kill PID` leaves nothing answering on the port. The port is checked before anything starts;
one web worker and no job consumers (reflexdb's runs need neither) keep the start-up to seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import typer

from reflexdb.errors import ReflexdbError

from .children import die_with_parent

#: how long the server may take to answer its first request
READY_TIMEOUT_S = 120.0


class UiError(ReflexdbError):
    """The UI cannot start: the port is taken, or the server exited."""

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


def ui(
    port: int = typer.Option(5000, "--port", min=1, max=65535, help="Port to serve on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (127.0.0.1: this machine only)."),
    tracking_uri: str = typer.Option(None, "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                     help="MLflow store (default: sqlite:///$REFLEXDB_HOME/mlflow.db)."),
    workers: int = typer.Option(1, "--workers", min=1, max=64, help="Web workers (one is plenty for one person)."),
) -> None:
    """Start the MLflow UI on the runs the learner and `reflexdb eval` logged; stop it with Ctrl-C or
    SIGTERM (the server and its workers stop with it)."""
    from reflexdb.settings import home
    from reflexdb.tracking import default_tracking_uri

    if not _port_free(host, port):
        raise UiError(f"port {port} on {host} is in use (another `reflexdb ui`?); pass --port to choose another")
    uri = tracking_uri or default_tracking_uri()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no huey job consumers
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
           "--default-artifact-root", (home() / "mlartifacts").as_uri(), "--host", host, "--port", str(port),
           "--workers", str(workers)]
    # its own process group, ours to stop; and told to stop if this process is killed outright
    proc = subprocess.Popen(cmd, env=env, stdout=sys.stderr, start_new_session=True,  # its chatter on stderr
                            preexec_fn=die_with_parent)

    stopping = {"signal": None}

    def _on_signal(signum, _frame):
        stopping["signal"] = signum
        raise KeyboardInterrupt

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise UiError(f"the MLflow server exited with code {proc.returncode} before serving {url} "
                              "(its messages are above)")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise UiError(f"the MLflow server did not answer on {url} within {READY_TIMEOUT_S:.0f} s") from None
                time.sleep(0.25)
        typer.echo(f"MLflow UI on {url} (store {uri}); Ctrl-C to stop", err=False)
        sys.stdout.flush()
        code = proc.wait()
        if code != 0:
            raise UiError(f"the MLflow server exited with code {code}")
    except KeyboardInterrupt:
        if stopping["signal"] not in (None, signal.SIGINT):
            typer.echo(f"stopping the UI ({signal.Signals(stopping['signal']).name})", err=True)
        raise typer.Exit(0) from None
    finally:
        _stop_group(proc)
        for s, handler in old.items():
            signal.signal(s, handler)
