"""Progress bars (tqdm) that can be switched off without changing the caller."""

from __future__ import annotations

import sys

from fastdata.redaction import redact


class _NullBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def progress_bar(total: int | None, desc: str, *, enabled: bool | None = None, unit: str = "img"):
    """A tqdm bar on stderr with rate and ETA, or a no-op object.

    Args:
        total: number of steps, if known.
        desc: label at the left of the bar.
        enabled: True forces a bar, False disables it, None shows it only when
            stderr is a terminal (so logs and pipes stay clean).
        unit: the unit name shown with the rate.
    """
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return _NullBar()
    from tqdm import tqdm

    # SI prefixes (12.3k) only where counts are large; small ones read "40/40".
    return tqdm(total=total, desc=redact(desc), unit=unit,
                unit_scale=bool(total and total >= 10000),
                dynamic_ncols=True, file=sys.stderr, smoothing=0.1)
