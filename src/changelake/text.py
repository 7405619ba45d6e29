"""Text for error messages: a value or a name from the input, cut so that the message stays
one readable line however large what it quotes."""

from __future__ import annotations


def short(value: object, width: int = 60) -> str:
    """`repr(value)`, cut to `width` characters with "..." where longer: a value named in an
    error message, which must stay one readable line however large the value."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def clip(text: str, width: int = 60) -> str:
    """`text` cut to `width` characters with "..." where longer: a name taken from the input
    (a table's, say) in an error message, which must stay a readable line."""
    return text if len(text) <= width else text[:width - 3] + "..."
