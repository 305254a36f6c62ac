"""The grammars of text values, written once for Python's ``re`` (the reference path) and RE2
(pyarrow.compute), and the bounds of the values they read (dates, instants, int64). No I/O.
"""

from __future__ import annotations

import re
from datetime import date
from decimal import Context
from typing import Final


# Each grammar is written once: Python's ``re`` (per-record path) and RE2 (pyarrow.compute)
# read the same text.
#: JSON numbers and the numeric strings numeric columns accept ("42", "-3.5", "1e3", ".5").
_PLAIN_NUM_TEXT: Final = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_NUM_TEXT: Final = _PLAIN_NUM_TEXT + r"(?:[eE][+-]?[0-9]+)?"


_OFFSET_TEXT: Final = r"(Z|[+-][0-9]{2}(?::?[0-9]{2})?)"


#: ISO-8601 timestamps: "T" or space, optional fraction (up to ns), optional offset.
_TS_BASE: Final = (
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
)


_TS_TEXT: Final = _TS_BASE + _OFFSET_TEXT + "?"


_DATE_TEXT: Final = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"


_TIME_TEXT: Final = r"(?P<h>[0-9]{2}):(?P<m>[0-9]{2}):(?P<s>[0-9]{2})(?:\.(?P<f>[0-9]{1,9}))?"


#: Standard base64 with padding (what Kafka Connect's JsonConverter writes for bytes).
_B64_TEXT: Final = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"


_UUID_TEXT: Final = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"


NUM_RE: Final = re.compile(_NUM_TEXT, re.ASCII)


TS_RE: Final = re.compile(_TS_TEXT, re.ASCII)


DATE_RE: Final = re.compile(_DATE_TEXT, re.ASCII)


TIME_RE: Final = re.compile(_TIME_TEXT, re.ASCII)


B64_RE: Final = re.compile(_B64_TEXT, re.ASCII)


UUID_RE: Final = re.compile(_UUID_TEXT, re.ASCII)


NUM_PATTERN: Final = f"^{_NUM_TEXT}$"


TS_PATTERN: Final = f"^{_TS_TEXT}$"


TS_OFFSET_PATTERN: Final = f"^{_TS_BASE}{_OFFSET_TEXT}$"


DATE_PATTERN: Final = f"^{_DATE_TEXT}$"


TIME_PATTERN: Final = f"^{_TIME_TEXT}$"


B64_PATTERN: Final = f"^{_B64_TEXT}$"


UUID_PATTERN: Final = f"^{_UUID_TEXT}$"


OFFSET_PATTERN: Final = f"{_OFFSET_TEXT}$"


#: Epoch counts the bulk path reads as int64 (the strict cast flags those beyond int64).
COUNT_PATTERN: Final = r"^-?[0-9]{1,19}$"


#: Integers written one way only (map keys in bulk cannot then collide: "1" and "01" can).
CANONICAL_INT_PATTERN: Final = r"^(?:0|-?[1-9][0-9]*)$"


#: Integers that always fit int64 and that Arrow's string->int cast reads exactly.
INT_PATTERN: Final = r"^-?[0-9]{1,18}$"


#: Numeric strings Arrow's decimal parse reads exactly, given at most 38 digits: no exponent.
#: It returns a wrong value, without an error, for some others (apache/arrow#49817: more than
#: 38 digits wrap; an exponent far from the scale wraps, or gives 0 for 2.0342086067022478e-231).
PLAIN_NUM_PATTERN: Final = f"^{_PLAIN_NUM_TEXT}$"


#: The digits of a decimal128: more, and Arrow's parse wraps (see PLAIN_NUM_PATTERN).
DECIMAL_DIGITS: Final = 38


#: A JSON number, or a numeric string (the reader parses both into a decimal column), that
#: Arrow's decimal parse may misread (see PLAIN_NUM_PATTERN): with an exponent, or of 38
#: digits and more. What comes before it (a key, a list's start) is the plan's (agents/convert/plan.py).
UNSURE_NUMBER: Final = (
    rf'(?:-?(?:[0-9][0-9.]{{{DECIMAL_DIGITS - 1}}}|[0-9.]+[eE])'
    rf'|"[+-]?(?:[0-9.]{{{DECIMAL_DIGITS}}}|[0-9.]*[eE][+-]?[0-9]+"))'
)


TS_FORMAT: Final = (
    "an ISO-8601 timestamp 'YYYY-MM-DD[T ]HH:MM:SS[.fffffffff][Z|+HH:MM]' or a count since the epoch"
)


TIME_FORMAT: Final = "'HH:MM:SS[.fffffffff]' or a count since midnight"


UNIT_DIGITS: Final = {"s": 0, "ms": 3, "us": 6, "ns": 9}


CONSTANTS: Final = frozenset({"NaN", "Infinity", "-Infinity"})


EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()


MIN_DAYS: Final = date(1, 1, 1).toordinal() - EPOCH_ORDINAL


MIN_SECONDS: Final = MIN_DAYS * 86_400


MAX_DAYS: Final = date(9999, 12, 31).toordinal() - EPOCH_ORDINAL


MAX_SECONDS: Final = (MAX_DAYS + 1) * 86_400 - 1


DAY_SECONDS: Final = 86_400


#: Decimal arithmetic that never rounds the values this module handles (at most ~80 digits).
EXACT: Final = Context(prec=100)


INT64: Final = (-(2**63), 2**63 - 1)


def ts_bounds(digits: int) -> tuple[int, int]:
    """Counts of ``10**-digits`` s that are instants in 0001-01-01..9999-12-31 and fit int64."""
    scale = 10**digits
    return max(MIN_SECONDS * scale, INT64[0]), min((MAX_SECONDS + 1) * scale - 1, INT64[1])
