"""Output: Parquet, Chrome trace, Gantt charts and static plots; results in, files out."""

from .writers import (  # noqa: F401  (pipecore.output's names, as before the layers)
    MissingDependencyError,
    write_chrome_trace,
    write_gantt,
    write_parquet,
)
