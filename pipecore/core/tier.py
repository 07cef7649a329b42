"""Run a kernel as plain Python when compiling it would cost more than the call.

The first time a machine runs the list scheduler, Numba compiles its kernels
(seconds); later processes load them from Numba's cache (a fraction of a
second). Interpreted, the same kernels cost microseconds per op, so a small
call is done before a compile would be. So a
call with at most :data:`INTERPRET_MAX_OPS` ops whose kernel is not yet
compiled in this process runs the kernel's plain-Python form (``py_func``,
with the kernels it calls interpreted too) while this process has spent less
than a budget in interpreted kernels: :data:`INTERPRET_BUDGET` seconds when
the kernel would compile, :data:`INTERPRET_BUDGET_CACHED` when Numba's cache
holds it. Past the budget the kernel compiles (or loads): a rent-or-buy
choice, which costs at most about twice the cheaper of the two. Same source,
same floating-point operations: the answers are bit-identical
(tests/test_tier.py checks them against tests/reference.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import types

from .ops import InputError

__all__ = ["kernel", "interpreted", "compiled", "ready", "INTERPRET_MAX_OPS", "INTERPRET_BUDGET",
           "INTERPRET_BUDGET_CACHED"]


def _max_ops_from_env() -> int:
    raw = os.environ.get("PIPECORE_INTERPRET_MAX_OPS", "32768")
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(f"PIPECORE_INTERPRET_MAX_OPS={raw!r}: expected a whole number of ops "
                         "(0 turns interpreting off)")
    return value


# Calls above this many ops always compile (interpreting them would cost
# about what loading the kernels does).
INTERPRET_MAX_OPS = _max_ops_from_env()
# Seconds of interpreted kernels per process before compiling instead
# (about half of what a first compile costs), and before loading a kernel
# Numba's cache holds (about what loading costs): rent-or-buy.
INTERPRET_BUDGET = 3.0
INTERPRET_BUDGET_CACHED = 0.3

_spent = 0.0
_held = 0  # open compiled() blocks
_lock = threading.Lock()
_plain: dict = {}  # dispatcher -> interpreted function
_timed: dict = {}  # dispatcher -> interpreted function that counts its seconds
_cached: set = set()  # dispatchers with an index in Numba's cache


def _budget(dispatcher) -> float:
    """Interpreted seconds this process may spend before calling the
    dispatcher: none once it is compiled here, :data:`INTERPRET_BUDGET_CACHED`
    when Numba's cache has an index for it (for some signature),
    :data:`INTERPRET_BUDGET` when it would compile."""
    if getattr(dispatcher, "signatures", None):
        return 0.0
    if dispatcher not in _cached:
        try:
            if os.path.exists(dispatcher._cache._cache_file._index_path):
                _cached.add(dispatcher)
        except AttributeError:  # no cache (cache=False) or another Numba layout
            pass
    return INTERPRET_BUDGET_CACHED if dispatcher in _cached else INTERPRET_BUDGET


def ready(dispatcher) -> bool:
    """Whether calling a kernel now costs no compile: it is compiled in this
    process, or Numba's cache has an index for it (for some signature).

    Parameters
    ----------
    dispatcher : numba dispatcher

    Returns
    -------
    bool
    """
    return _budget(dispatcher) < INTERPRET_BUDGET


def _code_names(code) -> set:
    """Global names a code object and the code nested in it may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def interpreted(dispatcher):
    """The plain-Python form of a Numba kernel, calling the plain-Python
    forms of the kernels it calls (so none of them compiles).

    Parameters
    ----------
    dispatcher : numba dispatcher
        A kernel made with ``numba.njit``.

    Returns
    -------
    callable
        A function with the kernel's signature, run by the interpreter.

    Raises
    ------
    ValueError
        If ``dispatcher`` is not a Numba dispatcher (it has no ``py_func``).
    """
    plain = _plain.get(dispatcher)
    if plain is not None:
        return plain
    py = getattr(dispatcher, "py_func", None)
    if py is None:
        raise InputError(f"{dispatcher!r} is not a Numba dispatcher (no py_func)")
    scope = dict(py.__globals__)
    plain = types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__, py.__closure__)
    _plain[dispatcher] = plain  # before recursing: kernels that call each other
    for name in _code_names(py.__code__):
        value = scope.get(name)
        if value is not dispatcher and hasattr(value, "py_func") and hasattr(value, "signatures"):
            scope[name] = interpreted(value)
    return plain


def _counting(dispatcher):
    fn = _timed.get(dispatcher)
    if fn is None:
        plain = interpreted(dispatcher)

        def fn(*args):
            global _spent
            t0 = time.perf_counter()
            try:
                return plain(*args)
            finally:
                with _lock:
                    _spent += time.perf_counter() - t0

        _timed[dispatcher] = fn
    return fn


@contextlib.contextmanager
def compiled():
    """Within this block, kernels compile (or load) however small the call:
    for callers that know they will simulate many schedules (tune, local
    search, study), where the budget would only delay the compile.

    Returns
    -------
    context manager
        Usable with ``with`` or as a decorator.
    """
    global _held
    with _lock:
        _held += 1
    try:
        yield
    finally:
        with _lock:
            _held -= 1


def kernel(dispatcher, ops: int):
    """The kernel to call for a call of ``ops`` ops: the dispatcher itself, or
    its interpreted form when compiling it would cost more (see the module).

    Parameters
    ----------
    dispatcher : numba dispatcher
        The compiled kernel.
    ops : int
        Size of the call (ops of the schedule).

    Returns
    -------
    callable
        ``dispatcher``, or a plain-Python function with its signature.
    """
    if (_held or ops > INTERPRET_MAX_OPS or not hasattr(dispatcher, "py_func")
            or _spent >= _budget(dispatcher)):
        return dispatcher
    return _counting(dispatcher)
