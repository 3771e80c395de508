"""JSON text on the hot paths (job rows, queue records, live events, receipts) written by
orjson: the same values as ``json.dumps``, compact, several times faster (a dispatch writes
seven or eight small documents; the standard library spent ~20 µs of its CPU on them).

Only for writing text another parser reads back (PostgreSQL, Redis, a JSON client): the
value parses to what it was. Where orjson refuses a value the standard library takes
(an integer past 64 bits), the standard library writes it. Reading stays with ``json``:
orjson reads an integer past 64 bits as a float.
"""

from __future__ import annotations

import json
from typing import TypeAlias

import orjson

#: a JSON value: what the envelope, contexts, configuration values and JSON columns hold
JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None

# keys that are not strings become strings, as json.dumps makes them
_OPTIONS = orjson.OPT_NON_STR_KEYS


def dumpb(value: object) -> bytes:
    """``value`` as compact UTF-8 JSON (non-ASCII as is, ``NaN``/``Infinity`` as ``null``)."""
    try:
        return orjson.dumps(value, option=_OPTIONS)
    except (orjson.JSONEncodeError, TypeError):
        # integers past 64 bits; anything else json.dumps refuses as it always did
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def dumps(value: object) -> str:
    """:func:`dumpb` as ``str``."""
    return dumpb(value).decode()
