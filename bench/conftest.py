import os
import statistics
import sys

# The pure-Python oracle lives in tests/; bench compares against it in the same run.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))  # bench/limit.py


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
        # A benchmark that evaluates many configurations per call says how many
        # in extra_info["configs"]; its median is reported per configuration.
        extra = getattr(bench, "extra_info", None) or {}
        configs = extra.get("configs", 1)
        median = statistics.median(data) / configs
        groups.setdefault(bench.group, []).append((bench.name, median, configs,
                                                   bool(extra.get("baseline"))))
    terminalreporter.section("pipecore: medians, ratios vs the pure-Python reference and "
                             "fractions of the limit kernel")
    for group, rows in sorted(groups.items(), key=lambda kv: str(kv[0])):
        ref = [m for name, m, *_ in rows if "reference" in name]
        lim = [m for name, m, *_ in rows if name.startswith("limit kernel")]
        # A benchmark with extra_info["baseline"] set: the others' medians over its.
        base = [(name, m) for name, m, _, is_base in rows if is_base]
        terminalreporter.write_line(f"[{group}]")
        for name, median, configs, is_base in sorted(rows, key=lambda r: r[1]):
            ratio = ""
            if ref and "reference" not in name:
                ratio = f"  {ref[0] / median:8.1f}x faster than reference"
            if lim and not name.startswith("limit kernel") and "reference" not in name:
                # The tracked figure: this rate over the limit kernel's, same run.
                ratio += f"  {lim[0] / median:6.3f} of the limit kernel"
            if base and not is_base:
                ratio += f"  {median / base[0][1]:6.2f}x the median of {base[0][0]}"
            rate = f"  {1 / median:12,.0f} configs/s" if configs > 1 else ""
            per = "/config" if configs > 1 else "       "
            terminalreporter.write_line(
                f"  {name:<52} median {median * 1e6:12.3f} us{per}{rate}{ratio}")
