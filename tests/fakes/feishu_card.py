"""What Feishu checks of an interactive card before it sends it (card JSON 1.0 and 2.0):
an object with ``elements`` (1.0) or ``schema: "2.0"`` + ``body.elements``, each element a
known ``tag`` with its required fields, the whole request at most 30 KB."""

from __future__ import annotations

from typing import Any

CARD_BODY_LIMIT = 30 * 1024
TAGS = {"markdown", "div", "hr", "img", "note", "column_set", "action", "plain_text"}


def problem(card: Any, body_bytes: int) -> tuple[int, str] | None:
    """``(code, msg)`` of Feishu's refusal, or None when the card would be sent."""
    if body_bytes > CARD_BODY_LIMIT:
        return 230025, "The length of the message content reaches its limit."
    if not isinstance(card, dict):
        return 230099, "Failed to create card content: the card is not a JSON object"
    if card.get("schema") == "2.0":
        body = card.get("body")
        elements = body.get("elements") if isinstance(body, dict) else None
    elif "schema" in card:
        return 230099, f"Failed to create card content: unknown schema {card['schema']!r}"
    else:
        elements = card.get("elements")
    if not isinstance(elements, list) or not elements:
        return 230099, "Failed to create card content: the card has no elements"
    for i, element in enumerate(elements):
        tag = element.get("tag") if isinstance(element, dict) else None
        if tag not in TAGS:
            return 230099, f"Failed to create card content: element {i} has unknown tag {tag!r}"
        if tag == "markdown" and not (
            isinstance(element.get("content"), str) and element["content"].strip()
        ):
            return 230099, f"Failed to create card content: markdown element {i} has no content"
    return None


__all__ = ["CARD_BODY_LIMIT", "problem"]
