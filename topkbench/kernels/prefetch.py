"""Software prefetch of array rows for the SDCA epoch kernels.

An SDCA epoch visits the examples in a random order, so the dual block ``A[i]`` of the next
example is not where the hardware prefetchers look (A is n x m: 16 MB on ``bench sdca``'s
problem, beyond L2).  The epoch loops know the permutation and ask for the next pair's rows an
iteration ahead (:func:`prefetch_row`).  Measured in an interleaved A/B of the dense epoch
kernel (24 epochs each, same states): 2-5 % off the lr_multi and svm_ova epochs.  Prefetching
the features' rows as well gained nothing more (the passes read each row as a sequential
stream, which the hardware prefetchers follow).

``prefetch_row`` emits LLVM's ``llvm.prefetch`` (``prefetcht0`` on x86): a hint, with no
effect on any result.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_LINE_BYTES = 64


@intrinsic
def _prefetch(typingctx, arr, i, j):
    """Prefetch (for reading, into every cache level) the line holding ``arr[i, j]``."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2):
        return None
    sig = types.void(arr, i, j)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        inds = [
            context.cast(builder, args[1], signature.args[1], types.intp),
            context.cast(builder, args[2], signature.args[2], types.intp),
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

    return sig, codegen


@njit(cache=True)
def prefetch_row(arr, i):
    """Ask for every cache line of row ``i`` of the 2-D C-contiguous ``arr``."""
    for j in range(0, arr.shape[1], max(1, _LINE_BYTES // arr.itemsize)):
        _prefetch(arr, i, j)
