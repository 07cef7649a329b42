import os
import subprocess
import sys

# The pure-Python oracle lives beside the tests, not in the package.
sys.path.insert(0, os.path.dirname(__file__))

# The tests exercise the compiled kernels: no interpreting of small calls on
# a cold cache (pipecore.core.tier; tests/test_tier.py turns it back on).
# Subprocesses (the CLI's tests) keep the default, as a user gets it.
from pipecore.core import tier  # noqa: E402

tier.INTERPRET_MAX_OPS = 0

# Numba compiles each kernel the first time a test needs it (about 90 s of a
# run with an empty cache). A long run compiles them on the idle core in the
# meantime (pipecore.warm); a test that gets there first compiles as before,
# so the results are the same with or without it. PIPECORE_WARM=0 turns it off.
_WARM_MIN_TESTS = 100
_warm = None


def pytest_report_header(config):
    return ("tests marked heavy (minutes-long cases, real torch ranks, Ray) are left out "
            "unless asked for: pytest -m heavy (CI runs them)")


def pytest_collection_finish(session):
    global _warm
    # Under pytest-xdist the workers keep every core busy already.
    if (len(session.items) < _WARM_MIN_TESTS or os.environ.get("PIPECORE_WARM") == "0"
            or (os.cpu_count() or 1) < 2 or _warm is not None
            or "PYTEST_XDIST_WORKER" in os.environ):
        return
    _warm = subprocess.Popen([sys.executable, "-m", "pipecore.warm", "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_sessionfinish(session, exitstatus):
    if _warm is not None and _warm.poll() is None:
        _warm.terminate()
        _warm.wait(timeout=60)
