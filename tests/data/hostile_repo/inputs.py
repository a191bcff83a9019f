import os


def load():
    with open(os.path.join(os.path.dirname(__file__), "data", "points.txt")) as f:
        return [int(v) for v in f.read().split()]
