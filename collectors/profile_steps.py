"""Which steps a run profiles: ``--profile-steps FIRST-LAST`` and the default window. No
torch here: the command checks the range before anything imports it."""
from __future__ import annotations


def parse_step_range(text: str) -> tuple[int, int]:
    """``"3-5"`` → (3, 5); ``"4"`` → (4, 4)."""
    first, _, last = text.partition("-")
    a, b = int(first), int(last or first)
    if a < 0 or b < a:
        raise ValueError(f"step range {text!r}: expected FIRST-LAST with 0 <= FIRST <= LAST")
    return a, b


def default_profile_steps(steps: int) -> tuple[int, int]:
    """A window after warm-up: the last three steps, or every step after the first two."""
    if steps <= 2:
        return 0, steps - 1
    return max(2, steps - 3), steps - 1
