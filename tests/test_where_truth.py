"""A truth table of every operator of ``--where`` (fastdata.ops.where),
pinned against Python's own semantics on plain values where the two agree,
and against the language's stated rules where they differ on purpose:

- a comparison whose sides cannot be compared (``"a" < 1``, ``1 in "ab"``,
  a missing field with a number, arithmetic that fails) is false, and so is
  its ``not in``; ``not`` of such a comparison is true;
- a field a record lacks is None;
- ``%`` is the remainder of numbers, never string formatting.

Every comparison operator, ``in``/``not in``, ``and``/``or``/``not``, the
arithmetic operators and unary minus, chained comparisons (each link
checked), fields inside fields, the ``class`` field.
"""

from __future__ import annotations

import itertools
import math
import operator

import pytest
from conftest import no_hang

from fastdata.ops.where import compile_where


@pytest.fixture(autouse=True)
def _time_limit():
    with no_hang(60):
        yield


#: Plain values a record's metadata holds (as JSON gives them, and floats past it).
VALUES = [None, False, True, 0, 1, 2, -1, 1.5, -0.5, float("inf"), float("nan"),
          "", "a", "b", "ab", "1", [], [1], [1, 2], ["a"], [None]]
COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
           ">": operator.gt, ">=": operator.ge,
           "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}


def python(op, a, b) -> bool:
    """Python's answer, a TypeError read as "cannot be compared": false."""
    try:
        return bool(op(a, b))
    except TypeError:
        return False


def mismatches(text: str, cases, expected) -> list:
    test = compile_where(text)
    return [(fields, got, want) for fields in cases
            if (got := test(fields)) != (want := expected(fields))]


# -- comparisons ---------------------------------------------------------------------------


@pytest.mark.parametrize("op", list(COMPARE))
def test_every_comparison_agrees_with_python_on_plain_values(op):
    cases = [{"a": a, "b": b} for a, b in itertools.product(VALUES, VALUES)]
    assert mismatches(f"a {op} b", cases, lambda f: python(COMPARE[op], f["a"], f["b"])) == []
    # A constant on either side gives the same answers as a field.
    for value in (1, "a", None, [1]):
        literal = repr(value)
        cases = [{"a": a} for a in VALUES]
        assert mismatches(f"a {op} {literal}", cases,
                          lambda f, v=value: python(COMPARE[op], f["a"], v)) == []
        assert mismatches(f"{literal} {op} a", cases,
                          lambda f, v=value: python(COMPARE[op], v, f["a"])) == []


@pytest.mark.parametrize("text, fields, expected", [
    # The edges where one operator is not its neighbour.
    ("x <= 3", {"x": 3}, True), ("x < 3", {"x": 3}, False),
    ("x >= 3", {"x": 3}, True), ("x > 3", {"x": 3}, False),
    ("x != 3", {"x": 3}, False), ("x == 3", {"x": 3.0}, True),
    ("x != 3", {"x": "3"}, True), ("x == 3", {"x": "3"}, False),
    ("x in [1, 2]", {"x": 2}, True), ("x not in [1, 2]", {"x": 2}, False),
    ("x not in [1, 2]", {"x": 3}, True), ('"b" not in s', {"s": "abc"}, False),
    # Cannot be compared: false, for "not in" too.
    ('x < "a"', {"x": 1}, False), ('x >= "a"', {"x": 1}, False),
    ('1 in s', {"s": "abc"}, False), ('1 not in s', {"s": "abc"}, False),
    ("x in 5", {"x": 5}, False), ("x not in 5", {"x": 5}, False),
    ("[1] < x", {"x": [2]}, True), ("[1, 2] < [1]", {}, False),
])
def test_comparison_edges(text, fields, expected):
    assert compile_where(text)(fields) is expected


def test_a_chained_comparison_is_every_link_as_python_has_it():
    ops = ["==", "!=", "<", "<=", ">", ">="]
    grid = [{"a": a, "b": b, "c": c} for a, b, c in itertools.product((-1, 0, 1, 2), repeat=3)]
    for op1, op2 in itertools.product(ops, ops):
        def chained(f, first=COMPARE[op1], second=COMPARE[op2]):
            return first(f["a"], f["b"]) and second(f["b"], f["c"])

        assert mismatches(f"a {op1} b {op2} c", grid, chained) == [], (op1, op2)
    # Four links: each one fails the whole.
    test = compile_where("0 <= a < b <= c != 5")
    assert test({"a": 0, "b": 1, "c": 4})
    for fields in ({"a": -1, "b": 1, "c": 4}, {"a": 1, "b": 1, "c": 4},
                   {"a": 0, "b": 5, "c": 4}, {"a": 0, "b": 1, "c": 5}):
        assert not test(fields), fields
    # A link that cannot be compared fails the chain, whatever the others.
    assert not compile_where('1 < x < "z"')({"x": 2})
    assert not compile_where("x in [1, 2] in [[1, 2]]")({"x": 3})
    assert compile_where("x in [1, 2] in [[1, 2]]")({"x": 1})


# -- and, or, not --------------------------------------------------------------------------


TRUTHY = [True, False, None, 0, 1, "", "x", [], [0]]


@pytest.mark.parametrize("text, expected", [
    ("a and b", lambda a, b: bool(a and b)),
    ("a or b", lambda a, b: bool(a or b)),
    ("not a", lambda a, b: not a),
    ("not a or b", lambda a, b: bool(not a or b)),
    ("not (a and b)", lambda a, b: not (a and b)),
    ("a and not b or not a and b", lambda a, b: bool(a and not b or not a and b)),
])
def test_boolean_operators_are_pythons_truth(text, expected):
    cases = [{"a": a, "b": b} for a, b in itertools.product(TRUTHY, TRUTHY)]
    assert mismatches(text, cases, lambda f: expected(f["a"], f["b"])) == []


def test_an_incomparable_part_is_false_inside_and_or_not():
    fields = {"x": "text", "n": 3}
    assert compile_where("not (x < 1)")(fields) is True
    assert compile_where("not (x / 2 > 0)")(fields) is True
    assert compile_where("x < 1 or n == 3")(fields) is True
    assert compile_where("n == 3 or x < 1")(fields) is True
    assert compile_where("x < 1 and n == 3")(fields) is False
    assert compile_where("not (x < 1) and n == 3")(fields) is True
    assert compile_where("not not (x < 1)")(fields) is False


# -- arithmetic ---------------------------------------------------------------------------


NUMBERS = [0, 1, 2, -3, 7, 0.5, -2.25, True]
ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
         "%": operator.mod}


@pytest.mark.parametrize("op", list(ARITH))
def test_arithmetic_on_numbers_is_pythons(op):
    for a, b in itertools.product(NUMBERS, NUMBERS):
        test = compile_where(f"a {op} b == c")
        try:
            want = ARITH[op](a, b)
        except ZeroDivisionError:  # not comparable: false whatever it is compared with
            assert not test({"a": a, "b": b, "c": 0}), (a, op, b)
            assert compile_where(f"not (a {op} b == c)")({"a": a, "b": b, "c": 0})
            continue
        assert test({"a": a, "b": b, "c": want}), (a, op, b, want)
        assert not test({"a": a, "b": b, "c": want + 1}), (a, op, b, want)


@pytest.mark.parametrize("text, fields, expected", [
    ("7 / 2 == 3.5", {}, True), ("-7 / 2 == -3.5", {}, True), ("1 / 3 < 0.34", {}, True),
    ("-7 % 3 == 2", {}, True), ("7.5 % 2 == 1.5", {}, True), ("2 - 5 == -3", {}, True),
    ("-x == 4", {"x": -4}, True), ("-x < 0", {"x": 2}, True), ("-x > 0", {"x": 2}, False),
    ("- -x == x", {"x": 5}, True), ("-x == -1.5", {"x": 1.5}, True),
    ('s + "!" == "ab!"', {"s": "ab"}, True), ('s * 2 == "abab"', {"s": "ab"}, True),
    ("2 * s == [1, 1]", {"s": [1]}, True), ("s + [2] == [1, 2]", {"s": [1]}, True),
    # Fails, so not comparable: false, and its negation true.
    ('s + 1 == "a1"', {"s": "a"}, False), ("x / 0 > 0", {"x": 1}, False),
    ("x % 0 == 0", {"x": 1}, False), ("not (x / 0 > 0)", {"x": 1}, True),
    ("-s == 1", {"s": "a"}, False), ("m + 1 > 0", {}, False), ("-m == None", {}, False),
    # % is never string formatting (Python gives "a1" here).
    ('s % 1 == "a1"', {"s": "a%s"}, False), ('s % x == "a1"', {"s": "a%s", "x": 1}, False),
])
def test_arithmetic_edges(text, fields, expected):
    assert compile_where(text)(fields) is expected


# -- fields -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("missing == None", True), ("missing != None", False), ("missing == 0", False),
    ("missing == False", False), ('missing == ""', False), ("missing in [None]", True),
    ("missing not in [None]", False), ("missing in [0, False]", False),
    ("missing < 1", False), ("missing >= 0", False), ("not (missing < 1)", True),
    ("not missing", True), ("missing", False), ("missing or present", True),
    ("present and not missing", True), ("meta.missing == None", True),
    ("present.inner == None", True), ("meta.depth == 3", True), ("meta.deep.x == 1", True),
    ("meta.deep.y == None", True), ("meta.depth.x == None", True),
    ('class == "cat"', True), ('class != "cat"', False), ('"class" == "class"', True),
])
def test_missing_and_nested_fields(text, expected):
    fields = {"present": 1, "meta": {"depth": 3, "deep": {"x": 1}}, "class": "cat"}
    assert compile_where(text)(fields) is expected


def test_type_mismatches_are_false_both_ways():
    pairs = [(1, "1"), ("a", 1), (None, 0), ([1], 1), (True, "True"), ({"k": 1}, 1)]
    for a, b in pairs:
        fields = {"a": a, "b": b}
        assert not compile_where("a == b")(fields) and compile_where("a != b")(fields)
        for op in ("<", "<=", ">", ">="):
            got = compile_where(f"a {op} b")(fields)
            assert got is python(COMPARE[op], a, b) is False, (a, op, b)
            assert compile_where(f"not (a {op} b)")(fields) is True


def test_nan_and_infinity_compare_as_python_has_them():
    nan, inf = math.nan, math.inf
    assert not compile_where("x == x")({"x": nan}) and compile_where("x != x")({"x": nan})
    assert not compile_where("x < 1 or x >= 1")({"x": nan})
    assert compile_where("x > 1e308 and -x < -1e308")({"x": inf})
    assert compile_where("x - x != 0")({"x": inf})  # inf - inf is NaN
