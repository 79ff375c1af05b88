"""What the command line shows and starts: result tables (``reflexdb sql``, ``similar``) and ``psql``.

The database work behind those commands is in :mod:`reflexdb.admin`; this module only formats
and hands the terminal over.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from decimal import Decimal

from reflexdb.lazy import lazy
from reflexdb.storable import printable

# imported when a table is printed or psql started, not when the CLI starts
np = lazy("numpy")
admin = lazy("reflexdb.ops.admin")
embedded = lazy("reflexdb.embedded")


def _cell(value, max_width: int) -> str:
    if value is None:
        s = ""
    elif isinstance(value, float):
        s = f"{value:.6g}"
    elif isinstance(value, (dt.datetime, dt.date, Decimal)):
        s = str(value)
    elif isinstance(value, np.ndarray):
        s = "{" + ",".join(str(x) for x in value[:50].tolist()) + (",…" if value.shape[0] > 50 else "") + "}"
    else:
        s = str(value)
    s = printable(s)[0].replace("\n", "↵")  # model text: no escape reaches the terminal (OSC 52, ...)
    if max_width and len(s) > max_width:
        s = s[: max_width - 1] + "…"
    return s


def format_table(columns: list[str], rows: list[tuple], *, max_width: int = 60) -> str:
    """psql-style aligned table with a row count footer."""
    if not columns:
        return ""
    cells = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], (int, float, Decimal)) or row[i] is None for row in rows) and rows
               for i in range(len(columns))]
    lines = [" | ".join(c.center(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("-+-".join("-" * w for w in widths))
    for r in cells:
        lines.append(" | ".join(
            (v.rjust(w) if numeric[i] else v.ljust(w)) for i, (v, w) in enumerate(zip(r, widths))
        ).rstrip())
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)


def _plain(value):
    """A cell as JSON / CSV take it: numbers stay numbers, arrays lists, times ISO 8601."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)  # uuid, interval, range, ...


def format_json(columns: list[str], rows: list[tuple]) -> str:
    """The rows as a JSON array of objects (``reflexdb sql --json``)."""
    import json

    return json.dumps([dict(zip(columns, map(_plain, row))) for row in rows], ensure_ascii=False)


def format_csv(columns: list[str], rows: list[tuple]) -> str:
    """The rows as CSV with a header line (``reflexdb sql --csv``); arrays and objects as JSON."""
    import csv
    import io
    import json

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if columns:
        writer.writerow(columns)
    for row in rows:
        cells = [_plain(v) for v in row]
        writer.writerow(["" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else v for v in cells])
    return out.getvalue()


def psql(url: str | None, args: list[str]) -> int:
    """Run psql (from PATH, else the embedded server's) on the database; return its exit code."""
    full = admin.libpq_url_for(url)  # a clear error if unreachable
    exe = shutil.which("psql") or str(embedded.psql_path())
    from sqlalchemy.engine import make_url

    parsed = make_url(full)
    env = dict(os.environ)
    if parsed.password:  # not on psql's command line, where `ps` shows it to every user
        env["PGPASSWORD"] = parsed.password
        full = parsed.set(password=None).render_as_string(hide_password=False)
    return subprocess.call([exe, full, *args], env=env)
