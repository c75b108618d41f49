"""Moved to `populace.store.sql_parts` (the SQL parts the store's plain reads and the analysis'
tables share); kept so that code importing the old name goes on working."""

from populace.store.sql_parts import (  # noqa: F401
    MAX_OPTIONS,
    OTHER,
    _answers,
    _leader,
    _measure_expr,
    _need_measure,
    _num,
    _option_expr,
    _options,
    _rows,
    _run,
    _value,
)
