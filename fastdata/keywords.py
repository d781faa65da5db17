"""Python's TypeError for an unknown keyword, with one more line where the
keyword names a read option that lives elsewhere (a :class:`fastdata.Decode`,
:class:`fastdata.Order` or :class:`fastdata.DatasetRef` field, ``run_ahead``).

Only the error grows a line: no keyword outside a callable's signature is
ever taken. No torch here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping

from fastdata.decoding.options import DECODE_NAMES, Decode
from fastdata.order.options import Order

#: An order field's other spellings -> the field.
_ORDER_SPELLINGS = {"shuffle": "shuffle", "seed": "seed", "batch_size": "batch_size",
                    "drop_last": "drop_last", "rank": "rank", "world_size": "world_size",
                    "block": "block", "window": "window", "shuffle_block": "block",
                    "shuffle_window": "window", "shuffle_buffer": "window",
                    "shard_id": "rank", "num_shards": "world_size"}

#: keyword -> where it goes, for every way of reading.
READ_OPTION_HOMES: dict[str, str] = {
    **{name: f"decode=fastdata.Decode({name}=...)" for name in DECODE_NAMES},
    **{name: f"order=fastdata.Order({field}=...)" for name, field in _ORDER_SPELLINGS.items()},
    "background": "run_ahead=", "prefetch": "run_ahead=",
    **{name: f"path=fastdata.DatasetRef(path, {name}=...)"
       for name in ("version", "verify", "allow_outside", "reader_settings")},
}


def unknown_keyword_error(where: str, name: str, home: str) -> TypeError:
    """Python's own wording, and the line naming where ``name`` goes."""
    return TypeError(f"{where}() got an unexpected keyword argument {name!r}\n"
                     f"  pass {home} instead")


def explain_keywords(homes: Mapping[str, str] = READ_OPTION_HOMES) -> Callable:
    """Decorate a function (or a class's ``__init__``) so that a keyword in
    ``homes`` it does not take raises :func:`unknown_keyword_error`; every
    other call goes straight through. The signature stays the function's own
    (``inspect.signature`` and the docs see it)."""

    def decorate(func: Callable) -> Callable:
        params = inspect.signature(func).parameters
        explained = {name: home for name, home in homes.items() if name not in params}
        where = func.__qualname__.removesuffix(".__init__")

        @functools.wraps(func)
        def call(*args, **kwargs):
            for name in kwargs.keys() & explained.keys():
                raise unknown_keyword_error(where, name, explained[name])
            return func(*args, **kwargs)

        return call

    return decorate


def check_read_values(decode, order) -> None:
    """Refuse ``decode=`` / ``order=`` given as anything but the option values
    (every way of reading checks them here).

    Raises:
        TypeError: naming the value given.
    """
    if decode is not None and not isinstance(decode, Decode):
        raise TypeError(f"decode must be a fastdata.Decode, not {decode!r}")
    if order is not None and not isinstance(order, Order):
        raise TypeError(f"order must be a fastdata.Order, not {order!r}")
