"""The terminal of the ``mage`` commands: text is printed as it is written.

Messages carry user text (paths, config values, opponent specs, tracebacks) in which
rich would read ``[...]`` as markup and ``:name:`` as an emoji, so the console has both
off; colour is given as a style (:func:`error`, :func:`notice`), never inline.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

console = Console(markup=False, emoji=False, highlight=False)


def error(message: object) -> None:
    """``error: MESSAGE``, the prefix in red."""
    console.print(Text.assemble(("error:", "red"), " ", str(message)))


def notice(label: str, message: object, style: str = "yellow") -> None:
    """``LABEL; MESSAGE`` with the label styled (``interrupted; resume with ...``)."""
    console.print(Text.assemble((label, style), str(message)))


def heading(text: str) -> None:
    """A bold line."""
    console.print(Text(text, style="bold"))
