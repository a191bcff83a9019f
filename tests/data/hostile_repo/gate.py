def check(x, y):
    ok = y == [v * 2 for v in x]
    return {"passed": ok, "checks": {"exact": ok}}
