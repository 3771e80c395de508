"""The delivery errors: what every adapter, the ledger and the router raise and catch."""

from __future__ import annotations


class DeliveryError(Exception):
    """A send did not happen."""


class DeliveryTransientError(DeliveryError):
    """Worth trying again later (timeouts, connection errors, 429, 5xx)."""

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class DeliveryOutcomeUnknown(DeliveryTransientError):
    """The request may have reached the platform but no answer came back (a read timeout, a
    connection dropped after the body was sent): it may or may not have been delivered."""


class DeliveryPermanentError(DeliveryError):
    """The channel refused the message; sending it again will not help."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


__all__ = [
    "DeliveryError",
    "DeliveryOutcomeUnknown",
    "DeliveryPermanentError",
    "DeliveryTransientError",
]
