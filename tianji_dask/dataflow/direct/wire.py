"""The direct path's wire format: a chunk as a JSON description plus its arrays' own bytes, and
the checks that refuse anything else before a byte of the body is allocated (see direct.py).

- once per connection: the sink's secret (``SECRET_BYTES`` random bytes), compared in constant
  time by the sink;
- per chunk: ``HEAD`` (magic, description length, body length, the sender's clock), then the
  description, UTF-8 JSON: ``{"key", "type", "fields": [{"name", "dtype", "shape"[, "scalar"]}],
  "values": {name: JSON scalar}}``, each dtype one of ``ARRAY_DTYPES``; then the body: each
  field's C-order bytes where ``array_layout`` puts them (64-byte aligned), nothing else.

Nothing here can run code: no pickle, and dtypes from an allow-list. Imports no Dask.
"""

from __future__ import annotations

import json
import math
import struct
from typing import NamedTuple, NoReturn

import numpy as np

from tianji_dask.chunk import SampleChunk, array_layout, arrays_from

MAGIC = b"TJC1"  # names the format (and its version) at the start of every message
HEAD = struct.Struct("!4sIQd")  # magic, description length, body length (bytes), sender's time.time() at send
SECRET_BYTES = 32
MAX_DESCRIPTION_BYTES = 2**20
MAX_BODY_BYTES = 4 * 2**30
MAX_KEY_CHARS = 1024
MAX_NDIM = 32
#: why a connection was refused: no secret (closed or silent before it), a wrong one, a header or
#: description that does not parse or validate, a length over the bounds, a body whose bytes are
#: not the arrays the description names
REFUSALS = ("no_secret", "bad_secret", "bad_header", "oversized", "malformed_body")
#: the array dtypes a chunk may carry: plain numbers and bools, either byte order
ARRAY_DTYPES = frozenset(np.dtype(t).newbyteorder(order).str for order in "<>" for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64))
_CHUNK_TYPES = {"SampleChunk": SampleChunk, "dict": dict}  # the dict types a chunk may arrive as
_FIELD_KEYS = frozenset({"name", "dtype", "shape"})  # each field's description; "scalar" may be added
_VALUE_TYPES = (bool, int, float, str, type(None))  # a non-array value: what JSON carries as it is


class Unencodable(TypeError):
    """A chunk the wire format cannot carry (another type, an object array, a non-JSON value):
    it goes through Dask instead."""


class Refused(ValueError):
    """A message the sink will not take; ``reason`` is one of ``REFUSALS``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class _FieldSpec(NamedTuple):  # what ``array_layout`` reads of an array, without the array
    dtype: np.dtype
    shape: tuple
    nbytes: int


class Plan(NamedTuple):  # a validated description
    key: str
    cls: type
    layout: list  # array_layout's [(name, dtype, shape, offset)]
    scalars: tuple  # fields that go back as numpy scalars
    bools: tuple  # bool fields, whose bytes must be 0 or 1
    values: dict


def encode(chunk: dict, key: str = "") -> tuple[bytes, list]:
    """A chunk as (description, body parts): the description (its key and type, each array's
    name, dtype and shape, the non-array values) as JSON; the body the arrays' own memory with
    padding between them, where ``array_layout`` puts them. No array is copied or pickled.
    Raises ``Unencodable`` for a chunk the format cannot carry."""
    kind = next((name for name, cls in _CHUNK_TYPES.items() if type(chunk) is cls), None)
    if kind is None:
        raise Unencodable(f"direct send: a chunk is a dict or SampleChunk, got {type(chunk).__name__}")
    arrays, fields, values = [], [], {}
    for name, value in chunk.items():
        if not isinstance(name, str):
            raise Unencodable(f"direct send: field names are strings, got {name!r}")
        if isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
            if array.dtype.str not in ARRAY_DTYPES:
                raise Unencodable(f"direct send: chunk.{name} has dtype {array.dtype}, not a plain number or bool")
            fields.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape)})
            if isinstance(value, np.generic):
                fields[-1]["scalar"] = True
            arrays.append((name, array))
        elif type(value) in _VALUE_TYPES:
            values[name] = value
        else:
            raise Unencodable(f"direct send: chunk.{name} is a {type(value).__name__}, not an array or JSON scalar")
    layout, size = array_layout(arrays)
    parts, end = [], 0
    for (_, value), (_, _, _, offset) in zip(arrays, layout):
        if not value.nbytes:
            continue
        if offset > end:
            parts.append(bytes(offset - end))
        if not value.flags.c_contiguous or not value.ndim:
            value = np.ascontiguousarray(value).reshape(-1)
        parts.append(memoryview(value).cast("B"))
        end = offset + value.nbytes
    if size > end:
        parts.append(bytes(size - end))
    description = json.dumps({"key": key, "type": kind, "fields": fields, "values": values}, separators=(",", ":"))
    return description.encode(), parts


def decode(description: bytes, body: np.ndarray) -> dict:
    """``encode``'s chunk back; its arrays are views into ``body`` (one allocation, writable).
    Raises ``Refused`` for a description or body that is not a chunk's."""
    return assemble(plan(description, body.nbytes), body)


def plan(description: bytes, body_bytes: int) -> Plan:
    """A description, validated against the format and the body's length before any of the body
    is read; raises ``Refused("bad_header")``."""
    def refuse(detail: str) -> NoReturn:
        raise Refused("bad_header", detail)

    try:
        doc = json.loads(description.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        refuse("the description is not JSON")
    if not isinstance(doc, dict) or set(doc) != {"key", "type", "fields", "values"}:
        refuse("the description is not an object of key, type, fields and values")
    key, kind, fields, values = doc["key"], doc["type"], doc["fields"], doc["values"]
    if not isinstance(key, str) or len(key) > MAX_KEY_CHARS:
        refuse("the key is not a string of at most MAX_KEY_CHARS")
    if not isinstance(kind, str) or kind not in _CHUNK_TYPES:
        refuse(f"type {kind!r} is not one of {sorted(_CHUNK_TYPES)}")
    if not isinstance(fields, list) or not isinstance(values, dict):
        refuse("fields is not a list or values not an object")
    specs, scalars, bools = [], [], []
    for field in fields:
        if not isinstance(field, dict) or not _FIELD_KEYS <= set(field) <= {*_FIELD_KEYS, "scalar"}:
            refuse("a field is not an object of name, dtype, shape (and scalar)")
        name, dtype, shape = field["name"], field["dtype"], field["shape"]
        if not isinstance(name, str) or not isinstance(dtype, str) or not isinstance(shape, list):
            refuse("a field's name, dtype or shape has the wrong type")
        if dtype not in ARRAY_DTYPES:
            refuse(f"field {name!r}: dtype {dtype!r} is not allowed")
        if len(shape) > MAX_NDIM or not all(type(d) is int and d >= 0 for d in shape):
            refuse(f"field {name!r}: shape {shape!r} is not at most {MAX_NDIM} sizes >= 0")
        dtype = np.dtype(dtype)
        # bounded with zero sizes counted as one, so numpy can build the array (any size fits)
        if math.prod(max(d, 1) for d in shape) * dtype.itemsize > MAX_BODY_BYTES:
            refuse(f"field {name!r}: shape {shape!r} is larger than MAX_BODY_BYTES")
        if field.get("scalar", False) is not False:
            if field["scalar"] is not True or shape:
                refuse(f"field {name!r}: only a shape [] may be a scalar")
            scalars.append(name)
        if dtype.kind == "b":
            bools.append(name)
        specs.append((name, _FieldSpec(dtype, tuple(shape), math.prod(shape) * dtype.itemsize)))
    names = [name for name, _ in specs]
    if len(set(names)) != len(names) or set(names) & set(values):
        refuse("a field name appears twice")
    if not all(isinstance(v, _VALUE_TYPES) for v in values.values()):
        refuse("a value is not a JSON scalar")
    layout, size = array_layout(specs)
    if size != body_bytes:
        refuse(f"the body is {body_bytes} bytes, its fields {size}")
    return Plan(key, _CHUNK_TYPES[kind], layout, tuple(scalars), tuple(bools), values)


def assemble(plan: Plan, body: np.ndarray) -> dict:
    """The chunk ``plan`` describes, its arrays views into ``body``; raises
    ``Refused("malformed_body")`` for bytes that are not the arrays it names."""
    arrays = arrays_from(body, plan.layout)
    for name in plan.bools:  # a bool byte other than 0 or 1 is not a bool numpy computes with correctly
        if arrays[name].size and arrays[name].view(np.uint8).max() > 1:
            raise Refused("malformed_body", f"field {name!r}: bool bytes other than 0 and 1")
    for name in plan.scalars:
        arrays[name] = arrays[name][()]
    chunk = plan.cls(arrays)
    chunk.update(plan.values)
    return chunk
