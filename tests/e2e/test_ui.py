"""`reflexdb ui` owns its two servers, the trajectory explorer and MLflow: stopped with it on SIGTERM or
SIGINT (nothing left on either port), the ports checked before a URL is printed, a clear error when
one is taken."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest

from reflexdb.cli.children import python_module
from tests.e2e.test_children_path import beside_a_stale_clone

# As the console script starts it: the working directory off the path (`python -m` would put it first)
UI = [*python_module("reflexdb.cli.main"), "ui"]
# Starts the real MLflow server: on the embedded pass of CI, as the other process tests.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{d.name}: {cmd[:120]}")
    return found


def _first_line(proc, timeout: float) -> str:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return ""


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_ui_serves_and_stops_with_its_server(tmp_path, stop):
    """Served, then stopped by ``stop``: nothing left. The checks that do not depend on the signal
    (a second UI on the same port refused, the port served again at once after the stop: the same
    handler and the same stop of the group for both signals, cli/ui.py) run with SIGTERM only: each
    starts a UI process, one of them MLflow's server too.

    With SIGINT it starts in a folder that holds a stale ``reflexdb/`` package whose import raises
    (issue 60): the servers it starts with ``python -m`` took that folder for the package, and the
    explorer exited ("the explorer exited with code 1 before serving"); it must serve all the same."""
    home = tmp_path / "home"
    home.mkdir()
    env = dict({k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}, REFLEXDB_HOME=str(home))
    cwd = beside_a_stale_clone(tmp_path) if stop == signal.SIGINT else None
    port = _free_port()
    # Not in a session of its own: the test stops the command, as `kill PID` would, not its group.
    proc = subprocess.Popen(UI + ["--port", str(port)], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = _first_line(proc, 120)
        assert line.startswith(f"explorer on http://127.0.0.1:{port + 1} "), (
            line, proc.poll(), proc.stderr.read()[-3000:] if proc.poll() is not None else "")
        line = _first_line(proc, 10)
        assert line.startswith(f"MLflow UI on http://127.0.0.1:{port} "), (line, proc.poll())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:  # it answers once printed
            assert resp.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port + 1}/", timeout=10) as resp:  # the explorer too
            assert resp.status == 200 and b"Runs" in resp.read()
        if stop == signal.SIGTERM:  # a second UI on the same port: one line, a non-zero exit, no URL printed
            second = subprocess.run(UI + ["--port", str(port)], env=env, capture_output=True, text=True, timeout=60)
            assert second.returncode != 0 and f"port {port} on 127.0.0.1 is in use" in second.stderr
            assert "MLflow UI on" not in second.stdout and "explorer on" not in second.stdout
            assert "Traceback" not in second.stderr
        proc.send_signal(stop)
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    # the group is gone when the command returns: nothing answers on the port, nothing of it runs
    assert not _listening(port), "the MLflow server still answers on the port"
    assert not _listening(port + 1), "the explorer still answers on its port"
    assert _processes_mentioning(str(home)) == []
    if stop != signal.SIGTERM:
        return
    # and the port can be served again at once (its connections in TIME_WAIT do not count)
    again = subprocess.Popen(UI + ["--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert _first_line(again, 120).startswith(f"explorer on http://127.0.0.1:{port + 1} ")
    finally:
        again.terminate()
        assert again.wait(60) == 0
    assert not _listening(port) and not _listening(port + 1) and _processes_mentioning(str(home)) == []


def test_ui_refuses_a_bad_port_with_one_line(tmp_path):
    with socket.socket() as holder:  # something else listens on the port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = subprocess.run(UI + ["--port", str(port)], env=dict(os.environ, REFLEXDB_HOME=str(tmp_path)),
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert f"error: port {port} on 127.0.0.1 is in use" in proc.stderr
