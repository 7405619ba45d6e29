"""Seeded randomness: every random test says its seed."""

from __future__ import annotations

import random


def seeded(seed: int) -> random.Random:
    """A `random.Random` on `seed`, printed (pytest shows it with a failure) to reproduce it."""
    print(f"random seed: {seed}")
    return random.Random(seed)
