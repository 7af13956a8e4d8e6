"""Run one callable from several threads at once (callers racing for the same cache)."""

import threading


def run_concurrently(fn, n: int) -> list:
    """Call ``fn()`` from ``n`` threads started together; return the results (in finishing order),
    or raise the first exception any call raised."""
    results, errors = [], []
    start = threading.Barrier(n)

    def call():
        start.wait()  # all threads enter fn together: the race the caller wants to provoke
        try:
            results.append(fn())
        except Exception as e:  # noqa: BLE001  (re-raised below, in the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
