"""Reading reference files within limits (populace.analysis.reference_file): each limit refused in
one ReferenceError naming the file, the line (or row) and the limit; well-formed files read to the
same histograms as before, CSV and Parquet alike. The CLI's hostile files (300 MB field, 6,000,000
rows, a sparse 1 TiB file), with their peak memory, are in tests/e2e/test_hostile_files_cli.py."""

from __future__ import annotations

import os

import pytest

from populace.analysis import reference_file
from populace.analysis.reference_file import ReferenceError, load_reference

HEAD = "# synthetic: a test\nquestion,answer,count,round\n"


def csv_file(tmp_path, text: str, name: str = "ref.csv"):
    path = tmp_path / name
    path.write_text(text, newline="")
    return path


def refused(path, says: str) -> str:
    with pytest.raises(ReferenceError) as err:
        load_reference(path)
    assert says in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("count,says", [
    ("1e19", "line 3: count: '1e19' is over 1,000,000,000 (the limit of one row's count)"),
    ("1e300", "line 3: count: '1e300' is over 1,000,000,000"),
    ("1e400", "line 3: count: '1e400' is negative (or not finite)"),
    ("nan", "line 3: count: 'nan' is negative (or not finite)"),
    ("-1", "line 3: count: '-1' is negative"),
    ("many", "line 3: count: 'many' is not a number"),
])
def test_counts_are_finite_non_negative_and_bounded(tmp_path, count, says):
    refused(csv_file(tmp_path, f"{HEAD}q,1,{count},1\n"), says)


def test_a_count_at_the_limit_is_kept(tmp_path):
    ref = load_reference(csv_file(tmp_path, f"{HEAD}q,1,1e9,2\nq,1,0.5,2\nq,2,3,2\n"))
    assert ref.counts == {("question", "q", None, 2, (), ()): {"1": 1e9 + 0.5, "2": 3.0}}


@pytest.mark.parametrize("rnd", ["0", "10001", "2.5", "99999999999999999999", "two"])
def test_rounds_are_round_numbers(tmp_path, rnd):
    refused(csv_file(tmp_path, f"{HEAD}q,1,1,{rnd}\n"), f"line 3: round: '{rnd}' is not a round number (1 to 10,000)")


def test_a_value_longer_than_the_limit_is_refused_even_quoted_over_lines(tmp_path):
    ok = "x" * reference_file.MAX_FIELD_CHARS
    assert load_reference(csv_file(tmp_path, f"{HEAD}q,{ok},1,1\n")).counts
    refused(csv_file(tmp_path, f"{HEAD}q,{ok}x,1,1\n"), "line 3: a value longer than 4,096 characters (the limit)")
    # a quoted value may span lines, each short: csv's bound (set for the read) stops it
    spanning = '"' + ("y" * 1000 + "\n") * 100 + '"'
    refused(csv_file(tmp_path, f"{HEAD}q,{spanning},1,1\n"), "a value longer than 4,096 characters (the limit)")
    assert load_reference(csv_file(tmp_path, f'{HEAD}q,"a, b\nc",1,1\n')).counts == {
        ("question", "q", None, 1, (), ()): {"a, b\nc": 1.0}}


def test_a_line_longer_than_the_limit_is_refused_after_the_limit(tmp_path):
    refused(csv_file(tmp_path, f"{HEAD}q,1,1,1\n" + "z," * 40_000 + "\n"),
            "line 4: longer than 65,536 bytes (the limit)")
    refused(csv_file(tmp_path, "# citation: " + "c" * 70_000 + "\n"), "line 1: longer than 65,536 bytes")
    refused(csv_file(tmp_path, "# citation: " + "c" * 5_000 + "\nquestion,answer\nq,1\n"),
            "line 1: citation: longer than 4,096 characters (the limit of a value)")


def test_rows_columns_and_comments_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(reference_file, "MAX_ROWS", 3)
    assert load_reference(csv_file(tmp_path, f"{HEAD}q,1,1,1\nq,2,1,1\n\nq,3,1,1\n")).counts
    refused(csv_file(tmp_path, f"{HEAD}q,1,1,1\nq,2,1,1\nq,3,1,1\nq,4,1,1\n"),
            "more than 3 rows (the limit; for more people give a histogram: answer, count)")
    header = ",".join(["question", "answer"] + [f"g{i}" for i in range(63)])
    refused(csv_file(tmp_path, f"# synthetic: t\n# groups: {','.join(f'g{i}' for i in range(63))}\n{header}\n"),
            "line 3: 65 columns, over 64 (the limit)")
    refused(csv_file(tmp_path, "#\n" * 1001 + "question,answer\nq,1\n"), "more than 1,000 comment lines")


def test_distinct_answers_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(reference_file, "MAX_ANSWERS", 4)
    body = "".join(f"q,{i % 2},1,1\nr,{i % 2},1,1\n" for i in range(50))  # 4 distinct, 200 rows
    assert len(load_reference(csv_file(tmp_path, HEAD + body)).counts) == 2
    refused(csv_file(tmp_path, HEAD + body + "s,1,1,1\n"), "line 103: more than 4 distinct answers")


@pytest.mark.parametrize("text,says", [
    ("# synthetic: t\nquestion,answer\nq,1,2\n", "line 3: 3 fields, but the header names 2 columns"),
    ("# synthetic: t\nquestion,answer,answer\nq,1,2\n", "column 'answer' is named twice"),
    ("# synthetic: t\nquestion,answer\n", "no rows"),
    ("# synthetic: t\n", "give one of the columns `question`"),
])
def test_malformed_csv_is_refused_naming_the_line(tmp_path, text, says):
    refused(csv_file(tmp_path, text), says)


def test_bytes_that_are_not_utf8_are_refused_naming_the_line(tmp_path):
    path = tmp_path / "ref.csv"
    path.write_bytes(b"# synthetic: t\nquestion,answer\nq,\xff\n")
    refused(path, "line 3: not UTF-8 text (byte 3 of the line)")


def test_crlf_blank_lines_and_missing_trailing_fields_read_as_before(tmp_path):
    ref = load_reference(csv_file(tmp_path, "# synthetic: t\r\n# groups: edu\r\n\r\nquestion,edu,answer\r\n"
                                             "q,phd,1\r\n\r\nq,,1\r\nq,phd,2.0\r\n"))
    assert ref.groups == ["edu"] and ref.synthetic == "t"
    assert ref.counts == {("question", "q", None, None, ("phd",), ()): {"1": 1.0, "2.0": 1.0},
                          ("question", "q", None, None, ("(none)",), ()): {"1": 1.0}}


def test_what_is_not_a_regular_file_is_refused(tmp_path):
    refused(tmp_path, "not a regular file")
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    refused(fifo, "not a regular file")  # never opened: a FIFO would wait for a writer


# --- Parquet: the footer first, then batches --------------------------------------------------

def parquet(tmp_path, columns: dict, meta: dict | None = None, name: str = "ref.parquet", **kw):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / name
    pq.write_table(pa.table(columns).replace_schema_metadata(meta or {"synthetic": "a test"}), path, **kw)
    return path


def test_parquet_reads_as_the_same_histograms_as_csv(tmp_path):
    path = parquet(tmp_path, {"question": ["q", "q", "q"], "answer": [1.0, 2.0, 1.0], "count": [2, 3, 1],
                              "round": [2, 2, 2]})
    assert load_reference(path).counts == {("question", "q", None, 2, (), ()): {"1": 3.0, "2": 3.0}}


def test_parquet_rows_are_counted_from_its_metadata_before_its_data(tmp_path, monkeypatch):
    path = parquet(tmp_path, {"question": ["q"] * 5, "answer": list(range(5))})
    monkeypatch.setattr(reference_file, "MAX_ROWS", 4)
    refused(path, "ref.parquet: 5 rows, over 4 (the limit")
    monkeypatch.setattr(reference_file, "MAX_ROWS", 5)
    monkeypatch.setattr(reference_file, "MAX_ROW_GROUP_BYTES", 10)
    refused(path, "row group 0 is")


def test_parquet_values_counts_and_columns_are_checked(tmp_path):
    refused(parquet(tmp_path, {"question": ["q", "x" * 5000], "answer": [1, 2]}),
            "rows 1-2: column 'question' has a value longer than 4,096 characters")
    refused(parquet(tmp_path, {"question": ["q"], "answer": [1], "count": [1e19]}),
            "row 1: count: 1e+19 is over 1,000,000,000")
    refused(parquet(tmp_path, {"question": ["q"], "answer": [[1, 2]]}), "column 'answer' is a list<")
    refused(parquet(tmp_path, {"question": ["q"], "answer": [1]}, {"citation": "c" * 5000}),
            "metadata citation: longer than 4,096 characters")


def test_a_file_that_is_not_parquet_or_claims_a_huge_footer_is_refused_unread(tmp_path):
    path = tmp_path / "ref.parquet"
    path.write_bytes(b"question,answer\nq,1\n")
    refused(path, "not a Parquet file (no PAR1 marks at its ends)")
    path.write_bytes(b"PAR1" + b"\0" * 100 + (1 << 31).to_bytes(4, "little") + b"PAR1")
    refused(path, "its metadata is 2,147,483,648 bytes, over 16,777,216 (the limit)")
    path.write_bytes(b"PAR1" + b"\1" * 100 + (50).to_bytes(4, "little") + b"PAR1")
    refused(path, "not a Parquet file (")


SUMMARY = "# synthetic: a test\nmeasure,round,param.game.ratio,n,mean,median,sd\n"


def test_a_file_of_summaries_reads_each_rows_figures_and_parameters(tmp_path):
    ref = load_reference(csv_file(tmp_path, SUMMARY + "value,1,2/3,67,36.73,33,\nvalue,1,1/2,48,27.05,,20.5\n"))
    assert ref.kind == "summaries" and ref.params == ["game.ratio"] and not ref.counts
    assert ref.summaries == {
        ("measure", "value", None, 1, (), (("game.ratio", "2/3"),)): {"n": 67, "mean": 36.73, "median": 33, "sd": None},
        ("measure", "value", None, 1, (), (("game.ratio", "1/2"),)): {"n": 48, "mean": 27.05, "median": None,
                                                                         "sd": 20.5}}


@pytest.mark.parametrize("row,says", [
    ("value,1,2/3,67,1e13,33,", "line 3: mean: '1e13' is not finite or is over 1,000,000,000,000"),
    ("value,1,2/3,67,36,-1e300,", "line 3: median: '-1e300' is not finite or is over"),
    ("value,1,2/3,67,36,inf,", "line 3: median: 'inf' is not finite"),
    ("value,1,2/3,67,36,33,-2", "line 3: sd: '-2' is negative"),
    ("value,1,2/3,0,36,33,", "line 3: n: '0' is not a whole number of people from 1 to 1,000,000,000"),
    ("value,1,2/3,1e10,36,33,", "line 3: n: '1e10' is not a whole number"),
    ("value,1,2/3,,36,33,", "line 3: n: empty"),
    ("value,1,2/3,67,,,", "line 3: neither mean nor median is given"),
    ("value,1,,67,36,33,", "line 3: param.game.ratio: empty"),
    ("value,1,2/3,67,36,33,\nvalue,1,2/3,60,30,30,", "line 4: a second summary of measure 'value' for the same round"),
])
def test_a_summarys_figures_are_bounded_and_each_row_is_one_treatment(tmp_path, row, says):
    refused(csv_file(tmp_path, SUMMARY + row + "\n"), says)


@pytest.mark.parametrize("header,says", [
    ("measure,n,mean,answer", "one kind of row per file"),
    ("measure,n,count,mean", "column `count` belongs to a file of answers"),
    ("measure,n,sd", "a file of summaries has the columns `n` and `mean` or `median`"),
    ("measure,mean", "a file of summaries has the columns `n`"),
    ("measure,param.,n,mean", "column 'param.': a parameter column is param.<path>"),
    ("measure,param.game ratio,n,mean", "column 'param.game ratio': a parameter column is param.<path>"),
    ("measure," + ",".join(f"param.p{i}" for i in range(9)) + ",n,mean", "9 param.<path> columns, over 8"),
])
def test_a_summary_files_header_says_one_kind(tmp_path, header, says):
    refused(csv_file(tmp_path, f"# synthetic: a test\n{header}\n"), says)
