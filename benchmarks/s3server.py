"""A real S3 server for the tests, the failure drill and the benchmarks: moto's standalone server
(the S3 HTTP API, state in memory), started as its own process on a free port of 127.0.0.1, so a
caller can stop it for a while (SIGSTOP: connections hang, as with storage that stops answering)
and let it go on (SIGCONT) with its objects intact.

Credentials are fake and given the usual way, through the environment (:func:`S3Server.env`).
Scripts here import it as ``from s3server import S3Server`` (a script's own folder is first on its
path); the tests through ``tests/s3server.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """``python -m moto.server`` on 127.0.0.1:<free port>."""

    def __init__(self, log_path=None):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=2).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start (exit {self.proc.poll()})") from None
                time.sleep(0.2)

    def env(self) -> dict[str, str]:
        """What a reflexdb process needs to reach it: fake credentials and the endpoint."""
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint}

    def make_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing-secret", region_name="us-east-1").create_bucket(Bucket=name)

    def pause(self) -> None:
        """Storage stops answering (connections are accepted by the kernel and hang)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()
