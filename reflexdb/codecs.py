"""numpy arrays <-> PostgreSQL binary arrays, as psycopg adapters.

psycopg converts ``int4[]`` and ``float4[]`` to and from Python lists one element at a time;
for trajectories of thousands of tokens that dominates ingest and sampling. These adapters use
PostgreSQL's binary array wire format directly::

    int32 ndim | int32 has_nulls | uint32 element oid | (int32 size, int32 lbound) * ndim
    then per element: int32 byte length, big-endian value

so an array of N elements is one numpy structured view (length, value) and one ``astype``.
Registered per connection (:func:`register`): binary-format results of ``int4[]``, ``float4[]``
and ``bool[]`` come back as 1-D numpy arrays, and numpy arrays are sent as those types, in
queries and in binary COPY alike. Values round-trip exactly (float32 stays float32).
"""

from __future__ import annotations

import struct

import numpy as np
from psycopg import adapt
from psycopg.pq import Format

_HEADER = struct.Struct(">iiI")
_DIM = struct.Struct(">ii")
_HEADER_1D = struct.Struct(">iiIii")  # _HEADER + _DIM: a 1-D array's whole header in one unpack

# name -> (array oid, element oid, big-endian element dtype, numpy dtype of the result)
_TYPES = {
    "int4": (1007, 23, np.dtype(">i4"), np.dtype(np.int32)),
    "int8": (1016, 20, np.dtype(">i8"), np.dtype(np.int64)),
    "float4": (1021, 700, np.dtype(">f4"), np.dtype(np.float32)),
    "float8": (1022, 701, np.dtype(">f8"), np.dtype(np.float64)),
    "bool": (1000, 16, np.dtype("u1"), np.dtype(np.bool_)),
}
# name -> (element oid, element size, (length, value) record dtype, result dtype), built once:
# making a structured dtype costs about as much as decoding a 300-element array.
_CODEC = {
    name: (elem_oid, be.itemsize, np.dtype([("len", ">i4"), ("v", be)]), native)
    for name, (_, elem_oid, be, native) in _TYPES.items()
}


def encode_array(values: np.ndarray, elem: str) -> bytes:
    """Encode a 1-D array as the binary wire format of a PostgreSQL ``elem[]`` array."""
    elem_oid, size, rec_dtype, _ = _CODEC[elem]
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"only 1-D arrays are stored, got shape {a.shape}")
    n = a.shape[0]
    if n == 0:
        return _HEADER.pack(0, 0, elem_oid)
    rec = np.empty(n, dtype=rec_dtype)
    rec["len"] = size
    rec["v"] = a
    return _HEADER_1D.pack(1, 0, elem_oid, n, 1) + rec.tobytes()


def decode_array(data: bytes | memoryview, elem: str) -> np.ndarray:
    """Decode a binary PostgreSQL ``elem[]`` value into a 1-D numpy array (a copy)."""
    _, _, rec_dtype, native = _CODEC[elem]
    if len(data) < _HEADER_1D.size:
        ndim, has_nulls, _ = _HEADER.unpack_from(data, 0)
        if ndim == 0:
            return np.empty(0, dtype=native)
        n = None  # truncated: let the checks below (or unpacking) fail as before
    else:
        ndim, has_nulls, _, n, _ = _HEADER_1D.unpack_from(data, 0)
    if ndim == 0:
        return np.empty(0, dtype=native)
    if ndim != 1:
        raise ValueError(f"expected a 1-D array, got {ndim} dimensions")
    if has_nulls:
        raise ValueError("array contains NULL elements; reflexdb arrays never do")
    if n is None:
        n, _ = _DIM.unpack_from(data, _HEADER.size)
    rec = np.frombuffer(data, dtype=rec_dtype, count=n, offset=_HEADER_1D.size)
    return rec["v"].astype(native)


def _dumper(elem: str) -> type[adapt.Dumper]:
    array_oid = _TYPES[elem][0]

    class NumpyArrayDumper(adapt.Dumper):
        format = Format.BINARY
        oid = array_oid

        def dump(self, obj) -> bytes:
            return encode_array(obj, elem)

    NumpyArrayDumper.__name__ = f"Numpy{elem.capitalize()}ArrayDumper"
    return NumpyArrayDumper


def _loader(elem: str) -> type[adapt.Loader]:
    class NumpyArrayLoader(adapt.Loader):
        format = Format.BINARY

        def load(self, data) -> np.ndarray:
            return decode_array(data, elem)

    NumpyArrayLoader.__name__ = f"Numpy{elem.capitalize()}ArrayLoader"
    return NumpyArrayLoader


_DUMPERS = {elem: _dumper(elem) for elem in _TYPES}
_LOADERS = {elem: _loader(elem) for elem in _TYPES}

# numpy dtype kind/size -> element type used when a bare ndarray is passed as a query parameter
_BY_DTYPE = {
    np.dtype(np.int32): "int4",
    np.dtype(np.int64): "int8",
    np.dtype(np.float32): "float4",
    np.dtype(np.float64): "float8",
    np.dtype(np.bool_): "bool",
}


class _NdarrayDumper(adapt.Dumper):
    """Dispatch a bare ``np.ndarray`` parameter to the array type matching its dtype."""

    format = Format.BINARY

    def __init__(self, cls, context=None):
        super().__init__(cls, context)
        self._context = context

    def get_key(self, obj, format):
        return (np.ndarray, _BY_DTYPE.get(np.asarray(obj).dtype, "float8"))

    def upgrade(self, obj, format):
        elem = _BY_DTYPE.get(np.asarray(obj).dtype)
        if elem is None:
            raise TypeError(f"cannot store numpy dtype {obj.dtype}; use int32, int64, float32, float64 or bool")
        return _DUMPERS[elem](np.ndarray, self._context)

    def dump(self, obj) -> bytes:  # pragma: no cover - upgrade() always replaces this dumper
        raise NotImplementedError


def register(context) -> None:
    """Install the numpy array adapters on a psycopg connection (or cursor / adapters map).

    After this, binary results of ``int4[]``/``int8[]``/``float4[]``/``float8[]``/``bool[]`` load
    as numpy arrays and binary COPY columns declared with those types accept numpy arrays.
    """
    adapters = context.adapters
    for elem, (oid, *_rest) in _TYPES.items():
        adapters.register_loader(oid, _LOADERS[elem])
    for dumper in _DUMPERS.values():
        # Registered by OID for COPY ... set_types([...]); the Python type is ndarray.
        adapters.register_dumper(None, dumper)
    adapters.register_dumper(np.ndarray, _NdarrayDumper)
