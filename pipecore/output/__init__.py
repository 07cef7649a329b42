"""Output: Parquet, Chrome trace, Gantt charts and static plots; results in, files out.

Importing the package registers the writers behind ``Result.write_parquet``,
``Result.write_trace`` and ``Result.write_gantt``.
"""

from .errors import MissingDependencyError  # noqa: F401  (pipecore.output's names, as before the layers)
from .gantt import write_gantt  # noqa: F401
from .parquet import write_parquet  # noqa: F401
from .trace import write_chrome_trace  # noqa: F401
