"""Reading a reference file (CSV or Parquet) into histograms, streamed and within limits.

A reference file is anyone's file, so it is never read whole: a CSV is read line by line (each
line and each field bounded), a Parquet file's row count, columns and row-group sizes are read
from its footer before any of its data, and then its rows come in batches. Every row is checked
as it comes and folded at once into the histograms the comparison needs (answer -> count per
question or measure, survey, round and group), so what stays in memory is bounded by the number
of distinct answers, not by the file. Whatever the file, a refusal is one ReferenceError naming
the file, the line (or row) and the limit; the limits are below, and in
docs/populations-and-reports.md.

A file holds one kind of row, told by its header: *answers* (`answer`, optionally `count`: one
row per person, or a histogram) or *summaries* (`n` and at least one of `mean`, `median`, and
optionally `sd`: a published table's figures, e.g. Nagel 1995's first period). Either kind may
name the run parameters a row is about in `param.<path>` columns (`param.game.ratio`: 2/3), so
one file holds a study's several treatments and a run meets the rows of its own.

The reader is in three parts, so another kind of row adds a column check and a fold, not a
reader: a source (`_csv_table`, `_parquet_table`) yields a Table — metadata, column names, rows as
(line or row number, values in column order); `_columns` checks the header; `_fold` checks and
counts (or keeps) each row."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

from populace.analysis.queries.attribute_groups import NONE_GROUP
from populace.analysis.stats import AnalysisError

KNOWN = ("question", "measure", "survey", "round", "answer", "count", "n", "mean", "median", "sd")
STATISTICS = ("mean", "median", "sd")  # a summary row's figures, besides its `n`
PARAM = "param."  # a column naming a run parameter the row is about: param.<path>, e.g. param.game.ratio

# The limits (docs/populations-and-reports.md, "Reference files: limits")
MAX_FIELD_CHARS = 4_096  # a value: a question's id, an answer, a group's value, a metadata value
MAX_LINE_BYTES = 65_536  # a CSV line
MAX_COMMENT_LINES = 1_000  # the `# key: value` lines before a CSV's header
MAX_COLUMNS = 64
MAX_ROWS = 1_000_000  # one row per person; more people: a histogram (answer, count)
MAX_COUNT = 1e9  # one row's count: finite, >= 0, at most this
MAX_ANSWERS = 100_000  # distinct answers, summed over every question, round and group
MAX_ROUND = 10_000  # a run's last possible round (populace.core.contracts.RoundNo)
MAX_STATISTIC = 1e12  # a summary's mean, median or sd: finite, at most this far from 0
MAX_PARAMS = 8  # param.<path> columns
MAX_SUMMARIES = 100_000  # summary rows (each kept: a published table's, not a person's)
MAX_PARQUET_FOOTER_BYTES = 16 * 1024 * 1024  # a Parquet file's metadata
MAX_ROW_GROUP_BYTES = 64 * 1024 * 1024  # a Parquet row group, uncompressed
PARQUET_BATCH_ROWS = 16_384


class ReferenceError(AnalysisError):
    """A reference file that cannot be used; the message names the file and the column or key."""


@dataclass
class Reference:
    path: str
    citation: str | None
    synthetic: str | None  # why a fixture is synthetic (None: real data, cited)
    groups: list[str]
    # (target kind "question"/"measure", target, survey or None, round or None, group values, params)
    # -> answer -> count; params: ((path, value as written), …) the row is about, () for any run
    counts: dict[tuple, dict[str, float]] = field(default_factory=dict)
    # the same keys -> {"n": …, "mean": …, "median": …, "sd": …} (a summaries file; absent figures None)
    summaries: dict[tuple, dict[str, float | None]] = field(default_factory=dict)
    params: list[str] = field(default_factory=list)  # the param.<path> columns' paths

    @property
    def kind(self) -> str:
        return "summaries" if self.summaries else "answers"

    @property
    def label(self) -> str:
        return f"SYNTHETIC ({self.synthetic})" if self.synthetic else (self.citation or "")


@dataclass
class Table:
    """A reference file as a source gives it: its metadata (`citation`, `groups`, `synthetic`,
    keys lower-case), its column names, and its rows streamed as (number, values in column
    order). A source has already bounded every value's length."""

    meta: dict[str, str]
    columns: list[str]
    rows: Iterator[tuple[int, Sequence[object]]]
    unit: str  # what a row's number counts: "line" (CSV) or "row" (Parquet)


def load_reference(path: str | Path) -> Reference:
    """Read and check a reference file (see populace.analysis.reference). ReferenceError naming
    what is wrong."""
    p = Path(path)
    where = f"--reference {p}"
    if not p.exists():
        raise ReferenceError(f"{where}: no such file")
    if not p.is_file():  # a FIFO would wait for ever, a device never end
        raise ReferenceError(f"{where}: not a regular file")
    suffix = p.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise ReferenceError(f"{where}: a reference is a .csv or .parquet file")
    with (_parquet_table if suffix == ".parquet" else _csv_table)(p, where) as table:
        ref, cols = _columns(table, str(p), where)
        _fold(ref, table, cols, where)
    if not ref.counts and not ref.summaries:
        raise ReferenceError(f"{where}: no rows")
    return ref


# --- checking the header --------------------------------------------------------------------

@dataclass(frozen=True)
class Columns:
    """Where each known column is in a row (None: the file has none)."""

    target: str  # "question" or "measure"
    name: int
    answer: int | None  # an answers file's
    count: int | None
    survey: int | None
    round: int | None
    groups: tuple[int, ...]
    params: tuple[tuple[str, int], ...] = ()  # (path, index) of each param.<path> column
    statistics: tuple[tuple[str, int], ...] = ()  # a summaries file's: ("n" | "mean" | "median" | "sd", index)


def _columns(table: Table, path: str, where: str) -> tuple[Reference, Columns]:
    meta, columns = table.meta, table.columns
    citation, synthetic = meta.get("citation") or None, meta.get("synthetic") or None
    if citation is None and synthetic is None:
        raise ReferenceError(f"{where}: citation: the file names no source of its data (a first line "
                             "`# citation: …`, or Parquet metadata `citation`); a made-up fixture says "
                             "`# synthetic: why` instead")
    groups = [g.strip() for g in (meta.get("groups") or "").split(",") if g.strip()]
    dup = next((c for c in columns if columns.count(c) > 1), None)
    if dup is not None:
        raise ReferenceError(f"{where}: column {dup!r} is named twice")
    params = [c for c in columns if c.startswith(PARAM)]
    for c in params:
        path = c[len(PARAM):]
        if not path or not all(part.isidentifier() for part in path.split(".")):
            raise ReferenceError(f"{where}: column {c!r}: a parameter column is param.<path>, e.g. param.game.ratio")
    if len(params) > MAX_PARAMS:
        raise ReferenceError(f"{where}: {len(params)} param.<path> columns, over {MAX_PARAMS} (the limit)")
    unknown = [c for c in columns if c not in KNOWN and c not in groups and c not in params]
    if unknown:
        raise ReferenceError(f"{where}: column {unknown[0]!r} is not one of {', '.join(KNOWN)}, a param.<path> nor a "
                             f"group the file lists (`# groups: {unknown[0]}`)")
    missing = [g for g in groups if g not in columns]
    if missing:
        raise ReferenceError(f"{where}: groups: {missing[0]!r} is listed but is not a column")
    if ("question" in columns) == ("measure" in columns):
        raise ReferenceError(f"{where}: give one of the columns `question` (an interview's) or `measure` (the "
                             "run's outcome measure)")
    summaries = [c for c in ("n", *STATISTICS) if c in columns]
    if "answer" in columns and summaries:
        raise ReferenceError(f"{where}: column {summaries[0]!r} belongs to a file of summaries (n, mean, median, sd), "
                             "column `answer` to a file of answers: one kind of row per file")
    if summaries:
        if "n" not in columns or not ({"mean", "median"} & set(columns)):
            raise ReferenceError(f"{where}: a file of summaries has the columns `n` and `mean` or `median` (or both; "
                                 "`sd` optional)")
        if "count" in columns:
            raise ReferenceError(f"{where}: column `count` belongs to a file of answers (a histogram); a summary "
                                 "row's size is its `n`")
    elif "answer" not in columns:
        raise ReferenceError(f"{where}: column `answer` is missing (each person's answer, or a histogram's value), "
                             "or give summaries: `n` with `mean` and/or `median`")
    target = "question" if "question" in columns else "measure"

    def at(name: str) -> int | None:
        return columns.index(name) if name in columns else None

    cols = Columns(target, columns.index(target), at("answer"), at("count"), at("survey"), at("round"),
                   tuple(columns.index(g) for g in groups),
                   params=tuple((c[len(PARAM):], columns.index(c)) for c in params),
                   statistics=tuple((c, columns.index(c)) for c in summaries))
    return Reference(path, citation, synthetic, groups, params=[p for p, _ in cols.params]), cols


# --- checking and counting each row ---------------------------------------------------------

def _fold(ref: Reference, table: Table, cols: Columns, where: str) -> None:
    """Every row checked and added to `ref.counts` as it comes: rows, counts, rounds and distinct
    answers bounded."""
    counts, answers = ref.counts, 0
    for rows, (number, row) in enumerate(table.rows, start=1):
        if rows > MAX_ROWS:
            raise ReferenceError(f"{where}: more than {MAX_ROWS:,} rows (the limit; for more people give a "
                                 "histogram: answer, count)")
        at = f"{where}, {table.unit} {number}"
        name = row[cols.name]
        if name in (None, ""):
            raise ReferenceError(f"{at}: `{cols.target}` must not be empty")
        rnd = None if cols.round is None else _round(row[cols.round], at)
        survey = None if cols.survey is None else (row[cols.survey] or None)
        group = tuple(str(row[g]) if row[g] not in (None, "") else NONE_GROUP for g in cols.groups)
        params = tuple((path, _param(row[i], path, at)) for path, i in cols.params)
        key = (cols.target, str(name), survey, rnd, group, params)
        if cols.answer is None:
            if key in ref.summaries:
                raise ReferenceError(f"{at}: a second summary of {cols.target} {name!r} for the same round, group and "
                                     "parameters")
            if len(ref.summaries) >= MAX_SUMMARIES:
                raise ReferenceError(f"{at}: more than {MAX_SUMMARIES:,} summary rows (the limit)")
            ref.summaries[key] = _summary(row, cols.statistics, at)
            continue
        answer = row[cols.answer]
        if answer in (None, ""):
            raise ReferenceError(f"{at}: `{cols.target}` and `answer` must not be empty")
        count = 1.0 if cols.count is None else _count(row[cols.count], at)
        cell = counts.setdefault(key, {})
        text = answer_text(answer)
        if text not in cell:
            answers += 1
            if answers > MAX_ANSWERS:
                raise ReferenceError(f"{at}: more than {MAX_ANSWERS:,} distinct answers over every question and "
                                     "group (the limit; round the answers, or group them into bins)")
            cell[text] = count
        else:
            cell[text] += count


def _count(raw: object, at: str) -> float:
    try:
        count = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ReferenceError(f"{at}: count: {raw!r} is not a number") from None
    if not math.isfinite(count) or count < 0:
        raise ReferenceError(f"{at}: count: {raw!r} is negative (or not finite); counts are >= 0")
    if count > MAX_COUNT:
        raise ReferenceError(f"{at}: count: {raw!r} is over {MAX_COUNT:,.0f} (the limit of one row's count)")
    return count


def _summary(row: Sequence[object], statistics: tuple[tuple[str, int], ...], at: str) -> dict[str, float | None]:
    """A summary row's figures: `n` a whole number from 1 to MAX_COUNT, the others finite and
    within MAX_STATISTIC of 0 (`sd` not negative); an empty figure is None, but not all of them."""
    out: dict[str, float | None] = dict.fromkeys(("n", *STATISTICS))
    for name, i in statistics:
        raw = row[i]
        if raw in (None, ""):
            if name == "n":
                raise ReferenceError(f"{at}: n: empty; a summary says how many people it summarises")
            continue
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            raise ReferenceError(f"{at}: {name}: {raw!r} is not a number") from None
        if name == "n":
            if not (math.isfinite(value) and value.is_integer() and 1 <= value <= MAX_COUNT):
                raise ReferenceError(f"{at}: n: {raw!r} is not a whole number of people from 1 to {MAX_COUNT:,.0f}")
        elif not math.isfinite(value) or abs(value) > MAX_STATISTIC:
            raise ReferenceError(f"{at}: {name}: {raw!r} is not finite or is over {MAX_STATISTIC:,.0f} in size (the "
                                 "limit of a summary's figure)")
        elif name == "sd" and value < 0:
            raise ReferenceError(f"{at}: sd: {raw!r} is negative")
        out[name] = value
    if out["mean"] is None and out["median"] is None:
        raise ReferenceError(f"{at}: neither mean nor median is given")
    return out


def _param(raw: object, path: str, at: str) -> str:
    if raw in (None, ""):
        raise ReferenceError(f"{at}: param.{path}: empty; the run parameter's value this row is about")
    return answer_text(raw)


def _round(raw: object, at: str) -> int | None:
    if raw in (None, ""):
        return None
    try:
        rnd = int(raw) if not isinstance(raw, float) or raw.is_integer() else None  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        rnd = None
    if rnd is None or not 1 <= rnd <= MAX_ROUND:
        raise ReferenceError(f"{at}: round: {raw!r} is not a round number (1 to {MAX_ROUND:,})")
    return rnd


def answer_text(x: object) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x).strip()


# --- sources --------------------------------------------------------------------------------

def _lines(f, where: str) -> Iterator[tuple[int, str]]:
    """A binary file's lines, numbered from 1 and decoded one by one, none longer than
    MAX_LINE_BYTES: a longer one is refused after that many bytes are read, never read whole."""
    number = 0
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise ReferenceError(f"{where}, line {number}: longer than {MAX_LINE_BYTES:,} bytes (the limit)")
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ReferenceError(f"{where}, line {number}: not UTF-8 text (byte {err.start + 1} of the line)") from None


def _comments(lines: Iterator[tuple[int, str]], where: str) -> tuple[dict[str, str], tuple[int, str] | None]:
    """The `# key: value` lines before the header (and blank ones), and the header line."""
    meta: dict[str, str] = {}
    for number, line in lines:
        if line.strip() and not line.startswith("#"):
            return meta, (number, line)
        if number > MAX_COMMENT_LINES:
            raise ReferenceError(f"{where}: more than {MAX_COMMENT_LINES:,} comment lines before the header")
        text = line.lstrip("#").strip()
        if ":" in text:
            key, _, value = text.partition(":")
            if len(value.strip()) > MAX_FIELD_CHARS:
                raise ReferenceError(f"{where}, line {number}: {key.strip()[:40]}: longer than {MAX_FIELD_CHARS:,} "
                                     "characters (the limit of a value)")
            meta[key.strip().lower()] = value.strip()
    return meta, None


@contextmanager
def _csv_table(p: Path, where: str) -> Iterator[Table]:
    with p.open("rb") as f:
        lines = _lines(f, where)
        meta, header = _comments(lines, where)
        if header is None:
            yield Table(meta, [], iter(()), "line")
            return
        first, line = header
        # csv's own bound on a field (a quoted one may span lines, each short) is process-wide: set
        # for this read, then put back
        previous = csv.field_size_limit(MAX_FIELD_CHARS)
        try:
            reader = csv.reader(chain([line], (text for _, text in lines)))
            columns = [c.strip() for c in _record(reader, first, where)]
            if len(columns) > MAX_COLUMNS:
                raise ReferenceError(f"{where}, line {first}: {len(columns)} columns, over {MAX_COLUMNS} (the limit)")

            def rows() -> Iterator[tuple[int, Sequence[object]]]:
                width = len(columns)
                while True:
                    try:
                        row = _record(reader, first, where)
                    except StopIteration:
                        return
                    if not row:
                        continue  # a blank line
                    number = first + reader.line_num - 1  # the record's last line
                    if len(row) > width:
                        raise ReferenceError(f"{where}, line {number}: {len(row)} fields, but the header names "
                                             f"{width} columns")
                    yield number, row if len(row) == width else [*row, *[""] * (width - len(row))]

            yield Table(meta, columns, rows(), "line")
        finally:
            csv.field_size_limit(previous)


def _record(reader, first: int, where: str) -> list[str]:
    """The reader's next record, each field bounded by csv itself (StopIteration at the end).
    `first`: the file's line of the reader's first line."""
    try:
        row = next(reader)
    except csv.Error as err:  # a value past csv's bound (set to ours), or what csv cannot parse
        number = first + reader.line_num - 1
        if "field limit" in str(err):
            raise ReferenceError(f"{where}, line {number}: a value longer than {MAX_FIELD_CHARS:,} characters (the "
                                 "limit)") from None
        raise ReferenceError(f"{where}, line {number}: not CSV ({err})") from None
    return row


@contextmanager
def _parquet_table(p: Path, where: str) -> Iterator[Table]:
    """A Parquet file's footer read and checked (its size first, from the file's last 8 bytes),
    then its rows in batches of one row group's pages; no value is turned into Python before its
    length is checked."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    size = p.stat().st_size
    with p.open("rb") as f:
        head = f.read(4)
        f.seek(max(0, size - 8))
        tail = f.read(8)
    if size < 12 or head != b"PAR1" or tail[4:] != b"PAR1":
        raise ReferenceError(f"{where}: not a Parquet file (no PAR1 marks at its ends)")
    footer = int.from_bytes(tail[:4], "little")
    if footer > MAX_PARQUET_FOOTER_BYTES:
        raise ReferenceError(f"{where}: its metadata is {footer:,} bytes, over {MAX_PARQUET_FOOTER_BYTES:,} (the "
                             "limit)")
    try:
        pf = pq.ParquetFile(p, pre_buffer=False, buffer_size=1 << 20, thrift_string_size_limit=footer + 1,
                            thrift_container_size_limit=1_000_000)
        schema = pf.schema_arrow
    except Exception as err:
        raise ReferenceError(f"{where}: not a Parquet file ({_one_line(err)})") from None
    md = pf.metadata
    if md.num_columns > MAX_COLUMNS:
        raise ReferenceError(f"{where}: {md.num_columns} columns, over {MAX_COLUMNS} (the limit)")
    if md.num_rows > MAX_ROWS:
        raise ReferenceError(f"{where}: {md.num_rows:,} rows, over {MAX_ROWS:,} (the limit; for more people give a "
                             "histogram: answer, count)")
    for i in range(md.num_row_groups):
        if md.row_group(i).total_byte_size > MAX_ROW_GROUP_BYTES:
            raise ReferenceError(f"{where}: row group {i} is {md.row_group(i).total_byte_size:,} bytes uncompressed, "
                                 f"over {MAX_ROW_GROUP_BYTES:,} (the limit; write it with smaller row groups)")
    meta: dict[str, str] = {}
    for k, v in (schema.metadata or {}).items():
        if k.startswith((b"ARROW", b"pandas")):
            continue
        key = k.decode("utf-8", "replace").lower()
        if len(v) > MAX_FIELD_CHARS:
            raise ReferenceError(f"{where}: metadata {key}: longer than {MAX_FIELD_CHARS:,} characters (the limit of "
                                 "a value)")
        meta[key] = v.decode("utf-8", "replace")
    for f_ in schema:
        if pa.types.is_nested(f_.type):
            raise ReferenceError(f"{where}: column {f_.name!r} is a {f_.type}; a reference's columns are text or "
                                 "numbers")

    def longest(col) -> int:
        if pa.types.is_dictionary(col.type):
            col = col.dictionary
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_binary(col.type)
                or pa.types.is_large_binary(col.type) or pa.types.is_string_view(col.type)
                or pa.types.is_binary_view(col.type)):
            return 0
        return pc.max(pc.binary_length(col)).as_py() or 0 if len(col) else 0

    def rows() -> Iterator[tuple[int, Sequence[object]]]:
        number = 0
        try:
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, use_threads=False):
                for name, col in zip(batch.schema.names, batch.columns, strict=True):
                    if longest(col) > MAX_FIELD_CHARS:
                        raise ReferenceError(f"{where}, rows {number + 1}-{number + batch.num_rows}: column "
                                             f"{name!r} has a value longer than {MAX_FIELD_CHARS:,} characters "
                                             "(the limit)")
                values = [col.to_pylist() for col in batch.columns]
                for row in zip(*values, strict=True):
                    number += 1
                    yield number, row
        except ReferenceError:
            raise
        except Exception as err:  # a damaged page: pyarrow says what
            raise ReferenceError(f"{where}, after row {number}: not a readable Parquet file ({_one_line(err)})"
                                 ) from None

    yield Table(meta, list(schema.names), rows(), "row")


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:300]
