"""The pauses of a send waited out in the outbox, the settings that shape them, and what an
operator is told to do about an open delivery (pure logic)."""

from __future__ import annotations

from delivery.ledger import RetryWindow, action_for
from jobs.settings import Settings


def test_pauses_double_up_to_the_cap_with_jitter() -> None:
    retry = RetryWindow(window=900, base=1.0, cap=15.0)
    for tries, step in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 15.0), (60, 15.0)):
        pauses = [retry.pause(tries) for _ in range(200)]
        assert all(0.75 * step <= p <= 1.25 * step for p in pauses), (tries, step)
        assert len({round(p, 6) for p in pauses}) > 1  # jittered: not all in step


def test_window_is_per_channel_with_a_default_of_at_least_15_minutes() -> None:
    st = Settings(_env_file=None, delivery_retry_windows='{"telegram": 60}')  # type: ignore[call-arg]
    assert st.delivery_retry_window_sec >= 900
    assert st.delivery_retry_window("telegram") == 60
    assert st.delivery_retry_window("feishu") == st.delivery_retry_window_sec


def test_open_deliveries_say_what_to_do() -> None:
    assert "may have arrived" in (action_for("unknown", True) or "")
    assert "resend" in (action_for("unknown", True) or "")
    assert "resend" not in (action_for("failed", False) or "")
    assert "retried by itself" in (action_for("pending", True) or "")
    assert action_for("sent", True) is None
