"""The quality gate: checks the kernel's outputs against an independent
reference on a sample of rows, with declared tolerances."""

import numpy as np

RTOL = 1e-9
ATOL = 1e-9
SAMPLE_ROWS = 48


def check(x, d, nb, k, seed):
    n = x.shape[0]
    rows = np.random.default_rng(seed + 1).choice(n, size=min(SAMPLE_ROWS, n), replace=False)
    checks = {"shape_d": list(np.shape(d)) == [n, n], "shape_nb": list(np.shape(nb)) == [n, k]}
    max_err = float("inf")
    mismatched_rows = n
    if checks["shape_d"] and checks["shape_nb"]:
        ref_d = np.array([np.linalg.norm(x - x[i], axis=1) for i in rows])
        err = np.abs(np.asarray(d)[rows] - ref_d)
        max_err = float(err.max())
        checks["distances_close"] = bool(np.all(err <= ATOL + RTOL * np.abs(ref_d)))
        ref_nb = np.argsort(ref_d, axis=1, kind="stable")[:, 1:k + 1]
        mismatched_rows = int((np.asarray(nb)[rows] != ref_nb).any(axis=1).sum())
        checks["neighbours_exact"] = mismatched_rows == 0
    return {"passed": all(checks.values()), "checks": checks, "max_abs_error": max_err,
            "mismatched_rows": mismatched_rows, "rows_checked": int(len(rows)), "rtol": RTOL, "atol": ATOL}
