"""What an HTTP server's Retry-After header asks for, for every client that retries (embedding endpoints,
alert webhooks)."""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime


def retry_after_seconds(value: str | None) -> float:
    """Seconds a Retry-After header asks for (a number of seconds or an HTTP date); 0 when absent or unreadable."""
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return 0.0
