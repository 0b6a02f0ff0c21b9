"""The server's background-work gate (``server.jobs.Foreground``). The jobs table itself
(claims, leases, retries, given back) is tested on every store backend by
``tests/store/test_conformance_branches_jobs.py``."""

from __future__ import annotations


def test_background_work_waits_for_a_quiet_moment_but_not_forever() -> None:
    """``Foreground``: derived work waits while requests do their memory work (so it does not
    take the interpreter from them), and runs anyway once the wait limit has passed."""
    import threading
    import time

    from contextfold.server.jobs import Foreground

    foreground = Foreground()
    assert foreground.wait_quiet(0.0)  # nothing running: no wait
    waited: list[float] = []

    def background() -> None:
        start = time.monotonic()
        foreground.wait_quiet(5.0)
        waited.append(time.monotonic() - start)

    with foreground:
        thread = threading.Thread(target=background)
        thread.start()
        time.sleep(0.3)
        assert not waited  # still waiting while a request works
    thread.join(5)
    assert waited and 0.25 <= waited[0] < 4.0
    with foreground:
        start = time.monotonic()
        assert not foreground.wait_quiet(0.2)  # the limit passed: go on anyway
        assert time.monotonic() - start < 2.0
