"""The empty-result guard: a chain stops at a step whose output carries nothing."""

from __future__ import annotations

# Envelope bookkeeping, not payload: a dict holding only these (plus empty values) is empty.
NOT_PAYLOAD = frozenset(
    {
        "ok",
        "success",
        "error_type",
        "action_note",
        "warning",
        "completed",
        "display_only",
        "offloaded",
        "_hint",
    }
)


def is_empty_output(out: object) -> bool:
    """True for ``None``, ``""``, ``[]``, ``{}`` and for a dict whose payload values are all
    empty (recursively). ``{"ok": True, "data": {"rows": []}}`` is empty;
    ``{"ok": True, "message": "no rows today"}`` is not; ``0`` and ``False`` are values."""
    if out is None:
        return True
    if isinstance(out, str):
        return out == ""
    if isinstance(out, (list, tuple)):
        return len(out) == 0
    if isinstance(out, dict):
        return all(is_empty_output(v) for k, v in out.items() if k not in NOT_PAYLOAD)
    return False
