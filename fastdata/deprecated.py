"""The read options' old keyword names, accepted for one release.

Datasets, ``fastdata.loader`` and DALI took the decoding and order options as
loose keywords (``size=``, ``shuffle=``, ``shard_id=``, ...). They are now two
values, :class:`fastdata.Decode` and :class:`fastdata.Order`; the old names
still work, each with a ``DeprecationWarning`` that names the new spelling.
No torch here.
"""

from __future__ import annotations

import warnings

from fastdata.decoding.options import DECODE_NAMES, Decode
from fastdata.order.options import Order

#: Old keyword -> the Order field it sets.
ORDER_RENAMES = {"shuffle": "shuffle", "seed": "seed", "batch_size": "batch_size",
                 "drop_last": "drop_last", "rank": "rank", "world_size": "world_size",
                 "shuffle_block": "block", "shuffle_window": "window",
                 "shuffle_buffer": "window", "shard_id": "rank", "num_shards": "world_size"}


def take_read_options(where: str, options: dict, decode: Decode | None,
                      order: Order | None, *, order_names: dict | None = None,
                      stacklevel: int = 3) -> tuple[Decode | None, Order | None]:
    """Pop the old decode and order keywords out of ``options`` into ``decode``
    and ``order`` (each None when neither it nor an old name was given).

    Raises:
        TypeError: ``decode`` or ``order`` given as something else (every
            way of reading checks them here).
        ValueError: an old name given together with the value that holds it.
    """
    if decode is not None and not isinstance(decode, Decode):
        raise TypeError(f"decode must be a fastdata.Decode, not {decode!r}")
    if order is not None and not isinstance(order, Order):
        raise TypeError(f"order must be a fastdata.Order, not {order!r}")
    order_names = ORDER_RENAMES if order_names is None else order_names
    old_decode = {name: options.pop(name) for name in DECODE_NAMES if name in options}
    old_order, passed = {}, []
    for name, field in order_names.items():
        if name in options:
            value = options.pop(name)
            passed.append(name)
            if field in old_order and old_order[field] != value:
                raise ValueError(f"{where}: two names give the order's {field}; give "
                                 f"order=fastdata.Order({field}=...) only")
            old_order[field] = value
    if old_decode and decode is not None:
        raise ValueError(f"{where}: {', '.join(old_decode)} given beside decode=; "
                         f"put them in the fastdata.Decode")
    if old_order and order is not None:
        raise ValueError(f"{where}: {', '.join(old_order)} given beside order=; "
                         f"put them in the fastdata.Order")
    if old_decode:
        decode = Decode(**old_decode)
        moved(where, old_decode, "decode=fastdata.Decode", stacklevel + 1)
    if old_order:
        order = Order(**old_order)
        moved(where, old_order, "order=fastdata.Order", stacklevel + 1, names=passed)
    return decode, order


def moved(where: str, values: dict, new: str, stacklevel: int = 3, names=None) -> None:
    """Warn that keywords ``names`` (default: ``values``' keys) of ``where``
    now go inside ``new(**values)``."""
    old = "=, ".join(values if names is None else names)
    inside = ", ".join(f"{k}={v!r}" for k, v in values.items())
    warnings.warn(f"{where}({old}=) is deprecated and goes in the next release: "
                  f"pass {new}({inside})", DeprecationWarning, stacklevel=stacklevel)


def renamed(where: str, old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that keyword ``old`` of ``where`` is now ``new``."""
    warnings.warn(f"{where}({old}=) is deprecated and goes in the next release: "
                  f"pass {new}", DeprecationWarning, stacklevel=stacklevel)
