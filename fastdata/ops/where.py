"""``--where``: a small expression language over a record's metadata, for
``fastdata subset`` (no ``eval``, no torch).

    width >= 256 and source == "web"
    split in ["a", "b"] and not flagged
    score * 2 > 1.5 or key == "cats/001.jpg"

Names are the record's metadata fields, and ``key``, ``label`` (the class
index) and ``class`` (its name). Allowed: numbers, strings, ``True``,
``False``, ``None``, lists of them; ``== != < <= > >= in not in``;
``and or not``; ``+ - * / %``; ``a.b`` for a field inside a field. Anything
else (calls, attributes of objects, comprehensions) is refused when the
expression is read. A field a record lacks is ``None``, and a comparison
whose sides cannot be compared (a missing field with a number) is false.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from fastdata.errors import FastDataError

_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
            ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.Mod: operator.mod}
_MISSING = None


class _Incomparable(Exception):
    pass


def compile_where(text: str) -> Callable[[dict], bool]:
    """The test ``text`` describes: ``test(fields) -> bool``, ``fields`` the
    record's metadata with ``key``, ``label`` and ``class`` added.

    Raises:
        FastDataError: the text is not an expression of the language, naming
            the part refused.
    """
    try:
        tree = ast.parse(_keywords_as_names(text.strip()), mode="eval")
    except SyntaxError as exc:
        raise FastDataError(f"--where {text!r} is not an expression ({exc.msg} at column "
                            f"{exc.offset})") from None
    node = _build(tree.body, text)

    def test(fields: dict) -> bool:
        try:
            return bool(node(fields))
        except _Incomparable:
            return False

    return test


#: Field names that are Python keywords, read as names of the same length
#: (``class``), so every part of the expression keeps its column.
FIELD_KEYWORDS = {"class": "_clas"}


def _keywords_as_names(text: str) -> str:
    """``text`` with the keyword ``class`` (outside strings) renamed, so the
    field of that name parses as a name."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text  # the parser reports it
    lines = text.splitlines(keepends=True) or [""]
    for t in reversed(tokens):
        if t.type == tokenize.NAME and t.string in FIELD_KEYWORDS:
            row, col = t.start
            line = lines[row - 1]
            lines[row - 1] = line[:col] + FIELD_KEYWORDS[t.string] + line[col + len(t.string):]
    return "".join(lines)


def _refuse(node: ast.AST, text: str) -> FastDataError:
    part = ast.get_source_segment(text.strip(), node) or type(node).__name__
    return FastDataError(f"--where {text!r}: {part!r} is not allowed; use field names, "
                         f"constants, comparisons (== != < <= > >= in), and/or/not and "
                         f"+ - * / %")


def _build(node: ast.AST, text: str) -> Callable[[dict], Any]:
    if isinstance(node, ast.Constant) and (node.value is None or
                                           isinstance(node.value, (bool, int, float, str))):
        value = node.value
        return lambda fields: value
    if isinstance(node, (ast.List, ast.Tuple)):
        parts = [_build(e, text) for e in node.elts]
        return lambda fields: [p(fields) for p in parts]
    if isinstance(node, ast.Name):
        name = next((k for k, v in FIELD_KEYWORDS.items() if v == node.id), node.id)
        return lambda fields: fields.get(name, _MISSING)
    if isinstance(node, ast.Attribute):
        inner, name = _build(node.value, text), node.attr
        return lambda fields: (lambda v: v.get(name, _MISSING) if isinstance(v, dict)
                               else _MISSING)(inner(fields))
    if isinstance(node, ast.BoolOp):
        parts = [_build(v, text) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda fields: all(_truth(p, fields) for p in parts)
        return lambda fields: any(_truth(p, fields) for p in parts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        inner = _build(node.operand, text)
        if isinstance(node.op, ast.Not):
            return lambda fields: not _truth(inner, fields)
        return lambda fields: _apply(operator.neg, inner(fields))
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        left, right, op = _build(node.left, text), _build(node.right, text), _ARITH[type(node.op)]
        return lambda fields: _apply(op, left(fields), right(fields))
    if isinstance(node, ast.Compare):
        ops = [_COMPARE.get(type(op)) for op in node.ops]
        if None in ops:
            raise _refuse(node, text)
        sides = [_build(node.left, text)] + [_build(c, text) for c in node.comparators]

        def compare(fields):
            values = [side(fields) for side in sides]
            return all(_apply(op, a, b) for op, a, b in zip(ops, values, values[1:]))

        return compare
    raise _refuse(node, text)


def _truth(part, fields) -> bool:
    try:
        return bool(part(fields))
    except _Incomparable:
        return False


def _apply(op, *values):
    try:
        return op(*values)
    except (TypeError, ZeroDivisionError, ValueError):
        raise _Incomparable() from None
