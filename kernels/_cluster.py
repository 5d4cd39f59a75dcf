"""Launch a Triton kernel as thread-block clusters (sm_90+), keeping one program per CTA.

Triton's `num_ctas` option launches clusters but also compiles the kernel for them (a block
split across the cluster's CTAs), and triton 3.6's planner rejects reductions there. This
launches the kernel as compiled for one CTA per program, with the launch's cluster dimension
set to `cluster`: programs pid0 // cluster are one cluster (resident together, one GPC; a
hardware barrier, `barrier.cluster`, synchronises them). It goes through triton's own
launcher (the compiled kernel's `run`, with the packed launch metadata's CTA count replaced:
the launcher sets the cluster attribute and multiplies grid x by it).
"""
from __future__ import annotations

import ctypes

MAX_PORTABLE = 8  # cluster sizes every sm_90 part launches
MAX_CLUSTER = 16  # with the non-portable attribute (H100, H200)
_CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # cuda.h
_non_portable: set = set()


def _allow_non_portable(function: int) -> None:
    if function in _non_portable:
        return
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuFuncSetAttribute(ctypes.c_void_p(function),
                                 _CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) failed: {rc}")
    _non_portable.add(function)


def launch_clusters(fn, clusters: int, cluster: int, *args, **kwargs):
    """Launch the @triton.jit `fn` as `clusters` clusters of `cluster` programs (grid x =
    clusters * cluster); `args`/`kwargs` as for fn[grid](...). Returns the compiled kernel."""
    import torch
    from triton import knobs

    if not 1 <= cluster <= MAX_CLUSTER:
        raise ValueError(f"cluster of {cluster} programs: 1 to {MAX_CLUSTER}")
    k = fn.warmup(*args, grid=(clusters * cluster,), **kwargs)
    run = k.run  # loads the module: k.function is set from here on
    if cluster > MAX_PORTABLE:
        _allow_non_portable(k.function)
    bound = dict(zip(fn.arg_names, args))
    bound.update({a: v for a, v in kwargs.items() if a in fn.arg_names})
    values = [bound[a] for a in fn.arg_names]
    stream = torch.cuda.current_stream().cuda_stream
    num_warps, _, shared = k.packed_metadata
    run(clusters, 1, 1, stream, k.function, (num_warps, cluster, shared),
        k.launch_metadata((clusters * cluster, 1, 1), stream, *values),
        knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *values)
    return k
