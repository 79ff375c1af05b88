"""numpy <-> PostgreSQL binary arrays: exact round trips through a real server."""

from __future__ import annotations

import numpy as np
import pytest

from reflexdb import codecs
from reflexdb.db import connect_raw

CASES = [
    ("int4[]", np.array([0, 1, -1, 2**31 - 1, -(2**31)], dtype=np.int32)),
    ("int8[]", np.array([0, 2**62, -(2**62)], dtype=np.int64)),
    ("float4[]", np.array([0.1, -2.5e-38, 3.4e38, -0.0, 1e-45], dtype=np.float32)),
    ("float8[]", np.array([0.1, -1e308, 5e-324], dtype=np.float64)),
    ("bool[]", np.array([True, False, True])),
    ("int4[]", np.empty(0, dtype=np.int32)),
    ("float4[]", np.empty(0, dtype=np.float32)),
]


@pytest.mark.parametrize("pgtype,arr", CASES)
def test_round_trip_param_and_copy(db_url, pgtype, arr):
    with connect_raw(db_url) as conn:
        conn.execute(f"CREATE TEMP TABLE t (a {pgtype})")
        conn.execute("INSERT INTO t VALUES (%b)", (arr,))
        with conn.cursor().copy("COPY t FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types([pgtype])
            cp.write_row((arr,))
        rows = conn.cursor(binary=True).execute("SELECT a FROM t").fetchall()
        # The server sees real arrays, not blobs.
        lengths = conn.execute("SELECT coalesce(array_length(a, 1), 0) FROM t").fetchall()
    assert [n for (n,) in lengths] == [arr.shape[0]] * 2
    for (got,) in rows:
        assert got.dtype == arr.dtype
        assert got.tobytes() == arr.tobytes()  # bit-exact, -0.0 and denormals included


def test_text_results_still_lists(db_url):
    with connect_raw(db_url) as conn:
        assert conn.execute("SELECT ARRAY[1,2]::int4[]").fetchone()[0] == [1, 2]


def test_encode_rejects_2d():
    with pytest.raises(ValueError, match="1-D"):
        codecs.encode_array(np.zeros((2, 2), dtype=np.int32), "int4")


def test_unsupported_dtype_is_a_clear_error(db_url):
    with connect_raw(db_url) as conn:
        with pytest.raises(TypeError, match="cannot store numpy dtype"):
            conn.execute("SELECT %b", (np.array(["a"]),))
