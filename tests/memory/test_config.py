"""MemoryConfig refuses settings that would misbehave at run time, naming the key."""

from __future__ import annotations

import math

import pytest

from memory import MemoryConfig
from memory.config import RETRY_MAX_S


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, RETRY_MAX_S + 1])
def test_sync_retry_s_outside_zero_to_the_longest_wait_is_refused(value: float) -> None:
    """A negative, nan, infinite or too-long first wait is a config error (nan and inf passed
    before and would have scheduled a timer that never fires or raises in call_later)."""
    with pytest.raises(ValueError, match="sync_retry_s must be between 0"):
        MemoryConfig(sync_retry_s=value)


def test_sync_retry_s_bounds_are_accepted() -> None:
    """0 (no retry) and the longest wait itself are valid."""
    assert MemoryConfig(sync_retry_s=0).sync_retry_s == 0
    assert MemoryConfig(sync_retry_s=RETRY_MAX_S).sync_retry_s == RETRY_MAX_S
