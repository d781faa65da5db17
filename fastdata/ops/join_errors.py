"""A join's refusals of its table, raised as a read of the whole table in
row order would meet them first, whichever piece found them (no torch;
see fastdata.ops.join_match).

The pieces read the table's parts at once; each notes where it stopped (a
row without the key field, a row that cannot be read), the merge notes the
first key given twice and the first label cell that is no class name. Of
these, the one at the smallest row position is raised, its row read again
with the row and line numbers of the whole table. What grows: nothing
(the parts' results, already in memory).
"""

from __future__ import annotations

from fastdata.dataset.table_parts import TablePart
from fastdata.errors import FastDataError
from fastdata.ops.join_pieces import LOCAL_BITS, class_cell
from fastdata.ops.join_stores import NOT_A_NAME


def check_columns(names: list[str], options: dict, table: str) -> None:
    """Refuse a join whose key, columns, label column or typed columns are
    not among the table's column ``names``, naming them and the table's."""
    wanted = [options["key"]] + list(options["columns"] or []) + \
        ([options["label_column"]] if options["label_column"] else []) + \
        list(options["types"] or [])
    absent = list(dict.fromkeys(c for c in wanted if c not in names))
    if absent:
        raise FastDataError(f"the table has no column {', '.join(map(repr, absent))}; its "
                            f"columns: {', '.join(names[:20])}", path=table)


def raise_first_error(plan: dict, parts: list[dict], options: dict, table: str, *,
                      duplicate: int | None, label_error: int | None) -> None:
    """Raise the first of the errors the pieces and the merge found (row
    positions: ``piece << LOCAL_BITS | row``), if any.

    Args:
        plan: the table's plan (fastdata.dataset.table_parts.plan_table).
        parts: the table pieces' results, in piece order.
        options: the join's key, columns, label column and types.
        duplicate: the second row of the first key given twice.
        label_error: the first matched row whose label is no class name.

    Raises:
        FastDataError: naming the row (and line), the column and what to do.
    """
    found = []
    for part, r in enumerate(parts):
        if r["stop"] is not None:
            found.append(((part << LOCAL_BITS) + r["stop"]["at"], "stop"))
            break
    if duplicate is not None:
        found.append((duplicate, "duplicate"))
    if label_error is not None:
        found.append((label_error, "label"))
    if not found:
        return
    pos, what = min(found)
    part, local = pos >> LOCAL_BITS, pos & ((1 << LOCAL_BITS) - 1)
    # The parts before it were read whole: its first line and row follow theirs.
    line = plan["first_line"] + sum(r["lines"] for r in parts[:part])
    first = 1 + sum(r["rows"] for r in parts[:part])
    number = first + local
    if what == "stop" and parts[part]["stop"]["what"] == "no key":
        names = list(dict.fromkeys([c for r in parts[:part] for c in r["names"]] +
                                   parts[part]["stop"]["names"]))
        check_columns(names, options, table)
        raise FastDataError(f"row {number} has no {options['key']!r} field; give every "
                            f"row its key", path=table)
    row = _row(plan, part, local, options["types"], line, first)  # a table error raises
    if what == "duplicate":
        raise FastDataError(f"key {row.get(options['key'])!r} has two rows (row "
                            f"{number} is the second); give each record one row", path=table)
    label = options["label_column"]
    if what == "label" and class_cell(row.get(label))[0] == NOT_A_NAME:
        raise FastDataError(f"row {number}, column {label!r}: {row.get(label)!r} is not a "
                            f"class name; give class names as text", path=table)
    raise FastDataError("the table changed while it was joined; join again", path=table)


def _row(plan: dict, part: int, local: int, types: dict, line: int, first: int) -> dict:
    """Row ``local`` of ``part``, read again (with the numbers its messages
    use: reading it raises the error a piece met)."""
    reader = TablePart(plan, part, types, first_line=line, first_row=first)
    for k, row in enumerate(reader.rows()):
        if k == local:
            return row
    return {}
