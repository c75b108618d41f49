"""The Parquet export gives each profile attribute its own typed column, so pandas and polars
users group by `education` without parsing JSON."""

from __future__ import annotations

import json

import duckdb
import pytest

from populace.analysis.export import profile_columns

PROFILES = [
    {"education": "high school", "age": 30, "weight": 1.5, "urban": True, "agent_id": 7, "odd key": "x"},
    {"education": "Ph.D.", "age": 41, "weight": 2, "urban": False},
    {"education": "bachelor's", "age": "unknown"},  # a mixed attribute stays text
    {},
]


@pytest.fixture
def con():
    c = duckdb.connect()
    c.execute("CREATE TABLE agent_profiles (run_id VARCHAR, agent_id BIGINT, persona_index BIGINT, "
              "profile JSON, persona JSON)")
    for i, p in enumerate(PROFILES):
        c.execute("INSERT INTO agent_profiles VALUES ('r1', ?, ?, ?, '{}')", [i, i, json.dumps(p)])
    c.execute("INSERT INTO agent_profiles VALUES ('other', 0, 0, '{\"secret\": 1}', '{}')")
    yield c
    c.close()


def test_each_profile_attribute_is_a_typed_column(con):
    select = profile_columns(con, "'r1'")
    rows = con.execute(f"SELECT {select} FROM agent_profiles WHERE run_id = 'r1' ORDER BY agent_id")
    names = [d[0] for d in rows.description]
    table = [dict(zip(names, r)) for r in rows.fetchall()]
    types = dict(con.execute(f"SELECT column_name, column_type FROM (DESCRIBE SELECT {select} "
                             "FROM agent_profiles)").fetchall())
    assert names[:3] == ["run_id", "agent_id", "persona_index"] and names[-2:] == ["profile", "persona"]
    assert "secret" not in names  # only the exported runs' attributes
    assert types["education"] == "VARCHAR" and types["urban"] == "BOOLEAN"
    assert types["weight"] == "DOUBLE"  # 1.5 and 2: numbers, one type
    assert types["age"] == "VARCHAR"  # 30, 41 and "unknown": text, nothing lost
    assert types["profile_agent_id"] == "BIGINT"  # an attribute named like a column is prefixed
    assert [r["education"] for r in table] == ["high school", "Ph.D.", "bachelor's", None]
    assert [r["weight"] for r in table] == [1.5, 2.0, None, None]
    assert [r["age"] for r in table] == ["30", "41", "unknown", None]
    assert table[0]["odd key"] == "x" and table[0]["agent_id"] == 0 and table[0]["profile_agent_id"] == 7
    assert json.loads(table[1]["profile"]) == PROFILES[1]  # the whole record is still there
