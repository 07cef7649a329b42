import os
import statistics
import sys

# The pure-Python oracle lives in tests/; bench compares against it in the same run.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print, per group, each benchmark's median and its speed-up over the reference."""
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    groups = {}
    for bench in session.benchmarks:
        data = getattr(getattr(bench, "stats", None), "data", None)
        if not data:
            continue
        median = statistics.median(data)
        groups.setdefault(bench.group, []).append((bench.name, median))
    terminalreporter.section("pipecore: medians and ratios vs the pure-Python reference")
    for group, rows in sorted(groups.items(), key=lambda kv: str(kv[0])):
        ref = [m for name, m in rows if "reference" in name]
        terminalreporter.write_line(f"[{group}]")
        for name, median in sorted(rows, key=lambda r: r[1]):
            ratio = ""
            if ref and "reference" not in name:
                ratio = f"  {ref[0] / median:8.1f}x faster than reference"
            terminalreporter.write_line(f"  {name:<45} median {median * 1e6:12.1f} us{ratio}")
