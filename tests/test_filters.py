"""Filters: parsing errors and mask semantics, with hand-computed expectations; metadata rules."""

from __future__ import annotations

import numpy as np
import pytest

from hybridret.errors import ConfigError
from hybridret.filters import FilterError, parse_filter
from hybridret.index.metadata import MetadataColumns, check_metadata

ROWS = [
    {"lang": "en", "year": 2019, "tags": ["a", "b"], "author": {"name": "Ada"}, "ok": True},   # 0
    {"lang": "de", "year": 2021, "tags": ["b"], "score": 0.5},                                 # 1
    {"lang": "en", "year": 2023.0, "ok": False, "date": "2023-05-01"},                        # 2
    {},                                                                                        # 3
    {"lang": None, "year": "2020", "tags": [1, True], "date": "2021-12-31"},                  # 4
]
COLS = MetadataColumns(ROWS, len(ROWS))


def rows(spec) -> list[int]:
    return np.flatnonzero(parse_filter(spec).mask(COLS)).tolist()


@pytest.mark.parametrize("spec,expected", [
    ({"lang": "en"}, [0, 2]),
    ({"lang": {"$eq": "en"}}, [0, 2]),
    ({"lang": {"$ne": "en"}}, [1, 3, 4]),                    # missing and null fields are "not equal"
    ({"lang": None}, [4]),
    ({"lang": {"$in": ["de", "fr"]}}, [1]),
    ({"lang": {"$nin": ["en"]}}, [1, 3, 4]),
    ({"year": 2023}, [2]),                                   # 2023 == 2023.0: numbers compare as numbers
    ({"year": {"$gte": 2020, "$lt": 2023}}, [1]),            # "2020" is a string: no numeric match
    ({"year": {"$gt": "2019"}}, [4]),                        # strings compare with strings only
    ({"date": {"$lte": "2022-01-01"}}, [4]),                 # ISO dates as strings
    ({"tags": "b"}, [0, 1]),                                 # list fields: membership
    ({"tags": 1}, [4]),                                      # 1 is not True, and not "1"
    ({"tags": True}, [4]),
    ({"tags": {"$in": ["a", 1]}}, [0, 4]),
    ({"ok": True}, [0]),
    ({"ok": 1}, []),                                         # booleans never equal numbers
    ({"author.name": "Ada"}, [0]),                           # nested objects by dotted path
    ({"score": {"$exists": True}}, [1]),
    ({"lang": {"$exists": False}}, [3]),
    ({"nothing": {"$exists": False}}, [0, 1, 2, 3, 4]),
    ({"nothing": "x"}, []),
    ({"$or": [{"lang": "de"}, {"ok": False}]}, [1, 2]),
    ({"$and": [{"lang": "en"}, {"year": {"$lt": 2020}}]}, [0]),
    ({"lang": "en", "ok": False}, [2]),                      # several keys: AND
    ({"$not": {"lang": "en"}}, [1, 3, 4]),
    ({"$or": [{"$and": [{"lang": "en"}, {"ok": True}]}, {"tags": {"$in": [1]}}]}, [0, 4]),
])
def test_filter_semantics(spec, expected):
    assert rows(spec) == expected


@pytest.mark.parametrize("spec,needle", [
    ({"year": {"$gtt": 1}}, "filter.year.$gtt: unknown operator"),
    ({"$and": {"a": 1}}, "filter.$and: expected a non-empty list"),
    ({"$or": []}, "filter.$or: expected a non-empty list"),
    ({"a": {"$in": "x"}}, "filter.a.$in: expected a list"),
    ({"a": {"$gt": True}}, "expected a number or a string"),
    ({"a": {"$gt": float("nan")}}, "expected a number or a string"),
    ({"a": [1, 2]}, "a list needs an operator"),
    ({"a": {"$exists": 1}}, "expected true or false"),
    ({"$foo": 1}, "unknown operator '$foo'"),
    ({}, "empty filter object"),
    ({"a": {"b": 1}}, "expected a string, number, boolean or null"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ({"$and": [{"a": 1}, 5]}, "filter.$and[1]: expected a JSON object"),
])
def test_filter_errors_say_where(spec, needle):
    with pytest.raises(FilterError, match=None) as err:
        parse_filter(spec)
    assert needle in str(err.value)
    assert isinstance(err.value, ConfigError)


def test_filter_from_json_string_and_none():
    assert parse_filter(None) is None
    f = parse_filter('{"lang": "en"}')
    assert np.flatnonzero(f.mask(COLS)).tolist() == [0, 2]
    assert parse_filter(f) is f


@pytest.mark.parametrize("meta,needle", [
    ("x", "must be a JSON object"),
    ({"$a": 1}, "may not start with '$'"),
    ({"a.b": 1}, "may not start with '$' or contain '.'"),
    ({"": 1}, "non-empty strings"),
    ({"a": float("inf")}, "only finite numbers"),
    ({"a": [[1]]}, "lists may hold only"),
    ({"a": {1, 2}}, "expected a JSON value"),
    ({"a": "x" * 70_000}, "the limit is 65536"),
    ({"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}, "nested deeper than 8"),
])
def test_metadata_rules(meta, needle):
    with pytest.raises(ConfigError) as err:
        check_metadata(meta)
    assert needle in str(err.value)


def test_metadata_normalised():
    assert check_metadata(None) == {}
    assert check_metadata({"t": (1, "a"), "n": {"x": None}}) == {"t": [1, "a"], "n": {"x": None}}
