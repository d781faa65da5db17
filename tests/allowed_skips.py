"""The skips CI accepts, and the hooks' logic that fails every other one.

Under ``.ci/run`` (``FASTDATA_CI=1``) every component the tests use is
installed, so a skip means a broken install quietly removing tests: a skipped
test, a skipped module (``optional.require`` at its top, tests/optional.py) or
a skipped fixture fails the run instead, unless its reason matches an entry of
``ALLOWED``: what no CI machine can provide. By hand, skips stay skips.
conftest.py's hooks call :func:`enforce` on each report and
:func:`summary_lines` at the end of the run.

To allow another skip, add an entry with a comment saying why no CI machine
can have what it needs; a pattern matches the whole reason (``re.fullmatch``).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass

from ci_needs import in_ci


@dataclass(frozen=True)
class Allowed:
    """A skip CI accepts.

    Attributes:
        name: what the skipped tests need, as the run's summary names it.
        pattern: a regular expression that the whole skip reason matches.
    """

    name: str
    pattern: str

    def matches(self, reason: str) -> bool:
        return re.fullmatch(self.pattern, reason, re.IGNORECASE) is not None


ALLOWED: tuple[Allowed, ...] = (
    # CI's machines have no GPU: the CUDA tests skip there ("needs CUDA"), and on
    # a machine with one, the checks of a machine without CUDA skip instead.
    Allowed("no CUDA", r"needs CUDA\b.*|checks (the|a) .*\bwithout CUDA"),
    # No registry offers a TurboJPEG library as new as libjpeg-turbo 3.1; the
    # refusal that 3.0 gives is tested instead (and the other way round on 3.1).
    Allowed("libjpeg-turbo 3.1 lossless restart markers",
            r"needs libjpeg-turbo 3\.1\+? for lossless restart markers"
            r"|this libjpeg-turbo adds restart markers losslessly"),
)

_PREFIX = "Skipped: "    # what pytest puts before a skip exception's message


def skip_reason(report) -> str | None:
    """The reason of a skipped test or collection report, or None: for any
    other outcome, and for an xfail (pytest reports that as skipped too)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix(_PREFIX).strip()


def allowed(reason: str) -> Allowed | None:
    """The entry of ``ALLOWED`` that accepts ``reason``, or None."""
    return next((entry for entry in ALLOWED if entry.matches(reason)), None)


def enforce(report) -> None:
    """Under ``FASTDATA_CI=1``, turn a skip that ``ALLOWED`` does not accept
    into a failure naming the test and the reason; otherwise leave ``report``."""
    reason = skip_reason(report)
    if reason is None or not in_ci() or allowed(reason) is not None:
        return
    where = ""
    if isinstance(report.longrepr, tuple):      # where the skip was raised
        where = f" at {os.path.relpath(report.longrepr[0])}:{report.longrepr[1]}"
    report.outcome = "failed"
    report.longrepr = (f"skipped: {reason} ({report.nodeid or 'the session'} skipped{where}; "
                       "FASTDATA_CI=1 fails every skip that tests/allowed_skips.py does not "
                       "allow: install what it needs)")


def summary_lines(reports) -> list[str]:
    """The closing summary of the skipped ``reports``: in CI, each allowed entry
    and how many tests it covered; by hand, each reason with its count, marked
    with the entry that allows it or as failing in CI."""
    reasons = Counter(r for r in map(skip_reason, reports) if r is not None)
    if in_ci():
        lines = []
        for entry in ALLOWED:
            seen = {r: n for r, n in reasons.items() if entry.matches(r)}
            said = f" ({'; '.join(seen)})" if seen else ""
            lines.append(f"{entry.name}: {sum(seen.values())} skipped{said}")
        return lines
    lines = []
    for reason, n in reasons.most_common():
        entry = allowed(reason)
        verdict = f"allowed in CI: {entry.name}" if entry else "fails under FASTDATA_CI=1"
        lines.append(f"{n} skipped: {reason} [{verdict}]")
    return lines
