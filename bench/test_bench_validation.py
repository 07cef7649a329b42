"""How long the validation check takes, and what it finds (issue 53).

``check_published("validation")`` estimates the ten runs of Megatron-LM SC21
Table 1 (arXiv 2104.04473), each with its own layout on up to 3,072 A100s,
and sets each prediction beside its measurement. The bench times one whole
check after a warm-up (Numba kernels compiled, schedules built) and records
in ``benchmark.extra_info`` what it found: each run's signed error
(predicted / measured TFLOP/s per GPU - 1, positive = predicted faster than
it ran), the median absolute and the worst error, and whether issue 53's bar
(8% median, 15% worst) is met. The docs page docs/validation.md shows the
same figures.

Run: pytest bench/test_bench_validation.py --benchmark-only
(``--benchmark-json FILE`` keeps the extra_info.)
"""

from sizes import pick

from pipecore.plan.validation import check_published, validation_summary


def test_check_published_validation(benchmark):
    benchmark.group = "check_published: Megatron-LM SC21 Table 1, ten runs"
    check_published("validation")  # warm-up: kernels and schedules
    table = benchmark.pedantic(check_published, args=("validation",), rounds=pick(5, 1), iterations=1)
    summary = validation_summary(table)
    benchmark.extra_info["configs"] = table.num_rows  # the summary prints the time per run
    benchmark.extra_info["error_by_run"] = dict(zip(table.column("id").to_pylist(),
                                                    table.column("error").to_pylist()))
    for key in ("median_abs_error", "worst_error", "worst_id", "optimistic", "pessimistic", "meets_bar"):
        benchmark.extra_info[key] = summary[key]
    print(f"\n[Table 1: median |error| {summary['median_abs_error']:.1%} (bar 8%), worst "
          f"{summary['worst_error']:+.1%} ({summary['worst_id']}; bar 15%), "
          f"{summary['optimistic']} of {summary['rows']} predicted faster than measured]")
    assert table.num_rows == 10
