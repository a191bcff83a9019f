"""The kernel: doubles every input."""

SPEED = 100


def compute(x):
    return [v * 2 for v in x]
