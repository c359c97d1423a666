"""Software prefetch for the SDCA epoch kernels.

An SDCA epoch visits the examples in a random order, so the dual block ``A[i]`` of the next
example is not where the hardware prefetchers look (A is n x m: 16 MB on ``bench sdca``'s
problem, beyond L2), and neither are its per-example scalars (warm-start root, squared norm,
label): their arrays fit in L2 but the features and dual blocks streaming through evict them
between visits.  The epoch loops know the permutation and ask for the next pair's data an
iteration ahead (:func:`prefetch_row`, :func:`prefetch_at`): both shorten the dense epochs
(docs/performance.md).  Prefetching the features' rows as well gained nothing (the passes
read each row as a sequential stream, which the hardware prefetchers follow).

``prefetch_row`` emits LLVM's ``llvm.prefetch`` (``prefetcht0`` on x86): a hint, with no
effect on any result.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_LINE_BYTES = 64


def _prefetch_codegen(context, builder, signature, args):
    """``llvm.prefetch`` of the element of ``args[0]`` at the indices ``args[1:]``."""
    aryty = signature.args[0]
    ary = context.make_array(aryty)(context, builder, args[0])
    inds = [
        context.cast(builder, v, t, types.intp)
        for v, t in zip(args[1:], signature.args[1:], strict=True)
    ]
    ptr = cgutils.get_item_pointer(context, builder, aryty, ary, inds)
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fn = builder.module.declare_intrinsic(
        "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    )
    # (address, rw = 0 read, locality = 3 keep in all levels, cache type = 1 data)
    builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
    return context.get_dummy_value()


@intrinsic
def _prefetch(typingctx, arr, i, j):
    """Prefetch (for reading, into every cache level) the line holding ``arr[i, j]``."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2):
        return None
    return types.void(arr, i, j), _prefetch_codegen


@intrinsic
def prefetch_at(typingctx, arr, i):
    """Prefetch the line holding ``arr[i]`` of a 1-D array."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1):
        return None
    return types.void(arr, i), _prefetch_codegen


@njit(cache=True)
def prefetch_row(arr, i):
    """Ask for every cache line of row ``i`` of the 2-D C-contiguous ``arr``."""
    for j in range(0, arr.shape[1], max(1, _LINE_BYTES // arr.itemsize)):
        _prefetch(arr, i, j)
