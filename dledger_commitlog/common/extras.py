"""Optional parts of the install: what a part needs beyond the base, and the one line
that says so when it is missing.

The base install (`pip install dledger-py`) is what a node and a client need. A part
above it that needs more raises `MissingExtra` when it is imported without its extra
(`analytics/__init__.py`); the CLI registers that part's commands as ones that print
the same line and exit 2, so the rest of `dledger` works as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib.util import find_spec


class MissingExtra(ImportError):
    """A part of the project imported without the extra that installs what it needs."""

    def __init__(self, extra: str, missing: Sequence[str], commands: Iterable[str] = ()) -> None:
        self.extra = extra
        self.commands = tuple(commands)
        super().__init__(
            f"this needs the [{extra}] extra: pip install 'dledger-py[{extra}]' "
            f"({', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed)"
        )


def require(extra: str, modules: Iterable[str], commands: Iterable[str] = ()) -> None:
    """Raise MissingExtra naming `extra` unless every module of `modules` is installed."""
    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        raise MissingExtra(extra, missing, commands)
