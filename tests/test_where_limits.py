"""``--where`` (fastdata.ops.where): what an expression may cost.

An expression is data from the command line or a script: its size, its
nesting and what its operators may build are bounded, each refusal a
FastDataError naming the limit; ordinary expressions work as before.
"""

from __future__ import annotations

import pytest
from conftest import no_hang

from fastdata.errors import FastDataError
from fastdata.ops.where import (
    MAX_DEPTH,
    MAX_INT_BITS,
    MAX_NODES,
    MAX_SEQUENCE,
    MAX_TEXT,
    compile_where,
)


@pytest.fixture(autouse=True)
def _time_limit():
    with no_hang(60):
        yield


def where(text: str, **fields) -> bool:
    return compile_where(text)(fields)


# -- ordinary expressions ---------------------------------------------------------------


def test_ordinary_expressions_still_work():
    record = {"width": 300, "source": "web", "split": "a", "flagged": False, "score": 0.9,
              "key": "cats/001.jpg", "label": 1, "class": "cat", "meta": {"depth": 3}}
    assert compile_where('width >= 256 and source == "web"')(record)
    assert compile_where('split in ["a", "b"] and not flagged')(record)
    assert compile_where('score * 2 > 1.5 or key == "cats/001.jpg"')(record)
    assert compile_where('class == "cat" and label == 1')(record)
    assert compile_where("meta.depth == 3 and meta.missing == None")(record)
    assert compile_where("(width - 44) / 2 % 7 == 2 and -width < 0")(record)
    assert compile_where('key + "!" == "cats/001.jpg!" and "ab" * 3 == "ababab"')(record)
    assert compile_where("[1, 2] * 2 == [1, 2, 1, 2]")(record)
    assert not compile_where("width < 256")(record)
    assert not compile_where("missing > 3")(record)  # a missing field is None: not comparable


def test_less_or_equal_is_not_less():
    assert where("x <= 3", x=3) and not where("x < 3", x=3)
    assert where("x >= 3", x=3) and not where("x > 3", x=3)
    assert where("x < 3", x=2) and where("x <= 3", x=2)
    assert not where("x <= 3", x=4)


def test_not_in_is_not_in():
    assert where("x in [1, 2]", x=1) and not where("x not in [1, 2]", x=1)
    assert where("x not in [1, 2]", x=3) and not where("x in [1, 2]", x=3)
    assert where('"b" in s', s="abc") and not where('"b" not in s', s="abc")


def test_a_chained_comparison_checks_every_link():
    assert where("1 < x < 3", x=2)
    assert not where("1 < x < 3", x=0)  # the first link fails
    assert not where("1 < x < 3", x=5)  # the second link fails
    assert not where("1 < x < 3", x=3)
    assert where("0 <= x < y <= 9", x=0, y=9)
    assert not where("0 <= x < y <= 9", x=4, y=4)  # the middle link
    assert not where("0 <= x < y <= 9", x=4, y=10)  # the last link


# -- the expression's size and nesting -----------------------------------------------


def test_a_text_longer_than_the_limit_is_refused():
    text = " or ".join(["x == 1"] * (MAX_TEXT // 10 + 2))
    assert len(text) > MAX_TEXT
    with pytest.raises(FastDataError, match=f"{MAX_TEXT:,} characters"):
        compile_where(text)


def test_more_parts_than_the_limit_are_refused():
    text = "x in [" + ", ".join(["1"] * (MAX_NODES + 1)) + "]"
    assert len(text) <= MAX_TEXT
    with pytest.raises(FastDataError, match=f"{MAX_NODES:,} parts"):
        compile_where(text)
    ok = "x in [" + ", ".join(["1"] * (MAX_NODES // 2)) + "]"
    assert where(ok, x=1)


@pytest.mark.parametrize("text", [
    "not " * (MAX_DEPTH + 5) + "x",
    "- " * (MAX_DEPTH + 5) + "x",
    "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5),
    " + ".join(["x"] * (MAX_DEPTH + 5)),
    "-" * 5000 + "x",                     # past what Python's own parser can nest
    "1 + " * 8000 + "1",
    "(" * 300 + "1" + ")" * 300,
], ids=["not", "minus", "lists", "sum", "parser-minus", "parser-sum", "parentheses"])
def test_deep_nesting_is_refused_with_the_limit(text):
    with pytest.raises(FastDataError) as err:
        compile_where(text)
    message = str(err.value)
    assert f"{MAX_DEPTH} levels" in message or "parenthes" in message, message


def test_nesting_up_to_the_limit_works():
    assert where("not " * (MAX_DEPTH - 2) + "x", x=True) == ((MAX_DEPTH - 2) % 2 == 0)
    assert where(" + ".join(["x"] * (MAX_DEPTH - 2)) + " == 0", x=0)


# -- what the operators may build -----------------------------------------------------


def test_power_is_not_part_of_the_language():
    for text in ("2 ** 10", "2 ** 10 ** 9", "x ** 2 > 1"):
        with pytest.raises(FastDataError, match="not allowed"):
            compile_where(text)


def test_a_constant_repetition_past_the_limit_is_refused_when_read():
    for text in (f"'a' * {MAX_SEQUENCE + 1} == ''", "'a' * 1000000000 == ''",
                 "[1] * 1000000000 == []", "'ab' * 1000 * 1000 * 1000 == ''"):
        with pytest.raises(FastDataError, match=f"{MAX_SEQUENCE:,}"):
            compile_where(text)


def test_a_repetition_of_a_field_past_the_limit_is_refused_when_evaluated():
    test = compile_where(f"key * {MAX_SEQUENCE // 2 + 1} == ''")
    assert not test({"key": "a"})
    with pytest.raises(FastDataError, match=f"{MAX_SEQUENCE:,}"):
        test({"key": "ab"})


def test_concatenation_past_the_limit_is_refused():
    half = MAX_SEQUENCE // 2
    assert where(f"key * {half} + key * {half} == key * {2 * half}", key="a")
    with pytest.raises(FastDataError, match=f"{MAX_SEQUENCE:,}"):
        where(f"key * {half} + key * {half} + key == ''", key="a")


def test_nested_lists_count_their_items():
    """A list of long lists repeated: what it holds counts, not its length."""
    with pytest.raises(FastDataError, match=f"{MAX_SEQUENCE:,}"):
        compile_where(f"[[0] * {MAX_SEQUENCE // 4}] * 8 == []")


def test_whole_numbers_past_the_limit_are_refused():
    big = 1 << (MAX_INT_BITS // 2 + 8)
    assert where("x > 0", x=big)  # comparing a large number is fine
    with pytest.raises(FastDataError, match=f"{MAX_INT_BITS:,} bits"):
        where("x * x > 0", x=big)


def test_percent_formats_no_strings():
    """``%`` is the remainder of numbers; on a string it formats nothing
    (``'%0999999999d' % 1`` would build a gigabyte)."""
    assert where("x % 7 == 3", x=10)
    assert not where("'%d' % 5 == '5'")
    assert not where("'%0999999999d' % 1 == ''")


def test_arithmetic_that_overflows_a_float_is_not_comparable():
    assert not where("x / 3 > 1", x=10 ** 400)
    assert not where("x * 1.5 > 1", x=10 ** 400)
