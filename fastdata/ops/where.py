"""``--where``: a small expression language over a record's metadata, for
``fastdata subset`` (no ``eval``, no torch).

    width >= 256 and source == "web"
    split in ["a", "b"] and not flagged
    score * 2 > 1.5 or key == "cats/001.jpg"

Names are the record's metadata fields, and ``key``, ``label`` (the class
index) and ``class`` (its name). Allowed: numbers, strings, ``True``,
``False``, ``None``, lists of them; ``== != < <= > >= in not in``;
``and or not``; ``+ - * / %``; ``a.b`` for a field inside a field. Anything
else (calls, attributes of objects, comprehensions, ``**``) is refused when
the expression is read. A field a record lacks is ``None``, and a comparison
whose sides cannot be compared (a missing field with a number, a string
with ``%``, arithmetic past a float's range) is false.

An expression is bounded before it runs: its text (:data:`MAX_TEXT`), its
parts (:data:`MAX_NODES`) and its nesting (:data:`MAX_DEPTH`, well inside
Python's recursion limit, which the parser and the evaluator both use).
What it builds is bounded as it runs: a string or list made by ``*`` or
``+`` holds at most :data:`MAX_SEQUENCE` characters or items (the items of
lists inside counted too), and a whole number made by arithmetic at most
:data:`MAX_INT_BITS` bits. Each refusal is a FastDataError naming its limit;
the parts made of constants alone are tried when the expression is read.
So a record costs at most the parts times what one part may build, whatever
the dataset.
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
_MISSING = None

#: The longest expression text read (a list of a few thousand keys fits).
MAX_TEXT = 65_536
#: The most parts (names, constants, operators' results) an expression has.
MAX_NODES = 10_000
#: The deepest nesting of parts (``not not x`` is 3; ordinary ones are below 10).
MAX_DEPTH = 50
#: The most characters or items a string or list built by ``*`` or ``+`` holds.
MAX_SEQUENCE = 1 << 20
#: The most bits of a whole number built by arithmetic.
MAX_INT_BITS = 1 << 16


class _Incomparable(Exception):
    pass


def compile_where(text: str) -> Callable[[dict], bool]:
    """The test ``text`` describes: ``test(fields) -> bool``, ``fields`` the
    record's metadata with ``key``, ``label`` and ``class`` added.

    Raises:
        FastDataError: the text is not an expression of the language (naming
            the part refused), or is larger or deeper than the limits (naming
            the limit); the test raises it for a record whose values would
            build more than the limits allow.
    """
    if len(text) > MAX_TEXT:
        raise FastDataError(f"--where is {len(text):,} characters long; an expression takes "
                            f"at most {MAX_TEXT:,} characters")
    try:
        tree = ast.parse(_keywords_as_names(text.strip()), mode="eval")
    except SyntaxError as exc:
        raise FastDataError(f"--where {_short(text)} is not an expression ({exc.msg} at "
                            f"column {exc.offset})") from None
    except (RecursionError, MemoryError):  # the parser's own nesting limit
        raise _too_deep(text) from None
    _check_shape(tree.body, text)
    node = _build(tree.body, text)

    def test(fields: dict) -> bool:
        try:
            return bool(node(fields))
        except _Incomparable:
            return False

    test({})  # the constant parts' limits show now, not at the first record
    return test


def _short(text: str) -> str:
    """``text`` quoted for a message, cut to a readable length."""
    return repr(text) if len(text) <= 200 else repr(text[:200]) + "..."


def _too_deep(text: str) -> FastDataError:
    return FastDataError(f"--where {_short(text)} nests its parts more than {MAX_DEPTH} "
                         f"levels deep; write it flatter (e.g. x in [...] for many ==)")


def _check_shape(root: ast.AST, text: str) -> None:
    """Refuse an expression of more than MAX_NODES parts or MAX_DEPTH levels
    (walked without recursion: the tree may be deeper than Python's stack)."""
    count = 0
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep(text)
        count += 1
        if count > MAX_NODES:
            raise FastDataError(f"--where {_short(text)} has more than {MAX_NODES:,} parts; "
                                f"select with fewer names and constants")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node)
                     if isinstance(child, ast.expr))


#: Field names that are Python keywords, read as names of the same length
#: (``class``), so every part of the expression keeps its column.
FIELD_KEYWORDS = {"class": "_clas"}


def reads_field(text: str, name: str) -> bool:
    """Whether the expression ``text`` (one :func:`compile_where` accepts)
    names the field ``name``, so that a job reads only the fields its test
    needs (a record's key, for one)."""
    tree = ast.parse(_keywords_as_names(text.strip()), mode="eval")
    alias = FIELD_KEYWORDS.get(name, name)
    return any(isinstance(n, ast.Name) and n.id == alias for n in ast.walk(tree))


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
    return FastDataError(f"--where {_short(text)}: {_short(part)} is not allowed; use field "
                         f"names, constants, comparisons (== != < <= > >= in), and/or/not "
                         f"and + - * / %")


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
    except (TypeError, ZeroDivisionError, ValueError, OverflowError, RecursionError):
        raise _Incomparable() from None


def _weight(value) -> int:
    """What ``value`` holds: a string's characters, a list's items and the
    weight of each item (lists inside lists), 1 for anything else; counted
    without recursion, stopping once past MAX_SEQUENCE."""
    total, stack = 0, [value]
    while stack and total <= MAX_SEQUENCE:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, list):
            total += len(v)
            stack.extend(v)
        else:
            total += 1
    return total


def _too_large(what: str) -> FastDataError:
    return FastDataError(f"--where builds {what}; an expression builds at most "
                         f"{MAX_SEQUENCE:,} characters or items")


def _mul(a, b):
    """``a * b``, a repetition refused before it is built when it would hold
    more than MAX_SEQUENCE, a product of more than MAX_INT_BITS bits after."""
    seq, times = (a, b) if isinstance(a, (str, list)) else (b, a)
    if isinstance(seq, (str, list)) and isinstance(times, int):
        if times > 0 and _weight(seq) * times > MAX_SEQUENCE:
            raise _too_large(f"a {type(seq).__name__} repeated {times:,} times")
        return seq * times
    return _whole(a * b)


def _add(a, b):
    """``a + b``, a joined string or list refused when past MAX_SEQUENCE."""
    if isinstance(a, (str, list)) and isinstance(b, type(a)):
        if _weight(a) + _weight(b) > MAX_SEQUENCE:
            raise _too_large(f"a {type(a).__name__} of more than {MAX_SEQUENCE:,} "
                             f"characters or items by +")
        return a + b
    return _whole(a + b)


def _mod(a, b):
    """The remainder of numbers (on a string, ``%`` would format one)."""
    if isinstance(a, (str, bytes)):
        raise TypeError("% formats strings; here it is the remainder of numbers")
    return _whole(a % b)


def _whole(value):
    """``value``, unless a whole number of more than MAX_INT_BITS bits."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise FastDataError(f"--where builds a whole number of {value.bit_length():,} bits; "
                            f"arithmetic here makes at most {MAX_INT_BITS:,} bits")
    return value


_ARITH = {ast.Add: _add, ast.Sub: lambda a, b: _whole(a - b), ast.Mult: _mul,
          ast.Div: operator.truediv, ast.Mod: _mod}
