#!/usr/bin/env python3
"""The largest batch that fits, found by trying (issue 48's PyTorch side of "the largest batch
that fits 80 GiB"): `largest_fitting(fits, start, tolerance)` doubles the batch from `start`
until a trial fails, then bisects between the last batch that fit and the first that did not
until they are within `tolerance` of each other (0.05: the answer is within 5% of the true
limit). `fits(batch)` runs the trial and returns True or False; every trial is recorded.

Run as a script, it checks itself against limits it knows (no GPU, no torch):
    python3 scripts/batch_search.py
"""


def largest_fitting(fits, start=256, tolerance=0.05, most=1 << 20):
    """(largest batch that fit or 0, first batch that failed or None, [(batch, fit)...])."""
    if start < 1:
        raise ValueError(f"the search starts at a batch of at least 1, not {start}")
    trials = []

    def trial(b):
        ok = bool(fits(b))
        trials.append((b, ok))
        return ok

    lo, hi, b = 0, None, start
    while b <= most:
        if not trial(b):
            hi = b
            break
        lo, b = b, b * 2
    if hi is None:  # fit up to `most`: the search stops there
        return lo, None, trials
    if lo == 0:  # `start` did not fit: bisect down from it
        lo_b = 0
        while hi - lo_b > 1 and (lo_b == 0 or (hi - lo_b) / lo_b > tolerance):
            mid = (lo_b + hi) // 2
            if trial(mid):
                lo_b = mid
            else:
                hi = mid
        return lo_b, hi, trials
    while hi - lo > 1 and (hi - lo) / lo > tolerance:
        mid = (lo + hi) // 2
        if trial(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi, trials


def _check():
    for limit in (1, 2, 7, 255, 256, 300, 1000, 1950, 2048, 2049, 5661, 100000):
        lo, hi, trials = largest_fitting(lambda b: b <= limit, start=256, tolerance=0.05)
        assert lo <= limit, (limit, lo)
        assert hi is not None and hi > limit, (limit, hi)
        assert (hi - lo) / max(lo, 1) <= 0.05 or hi - lo <= 1, (limit, lo, hi)
        assert lo >= limit * 0.95 or limit - lo <= 1, (limit, lo)
        assert all(ok == (b <= limit) for b, ok in trials), trials
        assert len(trials) <= 30, (limit, len(trials))
    lo, hi, _ = largest_fitting(lambda b: True, start=4, most=64)
    assert (lo, hi) == (64, None), (lo, hi)
    lo, hi, _ = largest_fitting(lambda b: False, start=8)
    assert (lo, hi) == (0, 1), (lo, hi)
    try:
        largest_fitting(lambda b: True, start=0)
        raise AssertionError("a start of 0 was accepted")
    except ValueError:
        pass
    print("batch_search: every check passed")


if __name__ == "__main__":
    _check()
