"""A cache prefetch hint for kernels that walk many arrays in many places at once.

The list scheduler visits the devices in turn and reads each device's ops
in order, so every array it reads is a few hundred or thousand interleaved
sequential streams: more than the processor's own prefetchers follow. At
every visit it asks for the lines a few ops ahead of where the device
stands, so they have arrived by the device's next visit.

``prefetch(array, index)`` is a hint only: it never reads into a variable,
never faults (an index past the end is allowed) and changes no result. In
plain Python (the interpreted tier, :mod:`pipecore.core.tier`) it does
nothing.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

__all__ = ["prefetch"]


def prefetch(array, index):
    """Ask for the cache line holding element ``index`` of ``array``.

    Parameters
    ----------
    array : numpy.ndarray
        A C-contiguous array; ``index`` counts its elements in memory order
        (for a 2-D array, ``row * columns + column``).
    index : int
        May lie past the end of the array (the hint is then dropped or
        fetches a line that is never read).

    Returns
    -------
    None
    """
    return None


@intrinsic
def _prefetch_line(typingctx, array, index):
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        array_type, index_type = signature.args
        ary = context.make_array(array_type)(context, builder, args[0])
        i = context.cast(builder, args[1], index_type, types.intp)
        # A plain (not inbounds) getelementptr: the address may lie past the end.
        address = builder.bitcast(builder.gep(ary.data, [i]), cgutils.voidptr_t)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32])
        # Named by the pointer type ("llvm.prefetch.p0", or ".p0i8" on older LLVMs).
        fn = builder.module.declare_intrinsic("llvm.prefetch", [cgutils.voidptr_t], fnty)
        # A read (0), kept in every cache level (locality 3), of data (1).
        builder.call(fn, [address, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen


@overload(prefetch)
def _prefetch_compiled(array, index):
    def impl(array, index):
        _prefetch_line(array, index)

    return impl
