"""``python -m fastdata.cli``: the same as the ``fastdata`` command."""

from fastdata.cli import main

main()
