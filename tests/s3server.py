"""The tests' S3 server: benchmarks/s3server.py (moto's standalone server in its own process)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("s3server", Path(__file__).parents[1] / "benchmarks" / "s3server.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
S3Server, free_port = _module.S3Server, _module.free_port
