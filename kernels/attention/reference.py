"""PyTorch attention: the textbook chain (`naive`) and the chunked reference the harness checks
every implementation against.

All functions take q, k, v of shape (B, H, N, D) and return o of shape (B, H, N, D), with
softmax scale 1/sqrt(D) and, when `causal`, query i attending to keys j <= i.

`naive_attention` materialises the (B, H, N, N) scores and probabilities: 2 matmuls, scale, mask
and softmax each read and write N^2 elements per head. Backward is autograd's.

`reference_forward` / `reference_backward` compute the same numbers one block of query rows at a
time (exact softmax per query block, no online rescaling), so the largest temporary is
(B, H, block_q, N) and B=1, H=16, N=16384, D=128 fits easily in fp32. Every matmul and softmax
runs in the inputs' dtype (that is "torch's own error" for the correctness rule); only the dK/dV
sums over query blocks are accumulated in fp32 (fp64 for fp64 inputs), so that chunking adds no rounding of its own.
"""
from __future__ import annotations

import math

import torch

# elements of the largest per-block temporary (B*H*block_q*N): 2^27 -> 512 MiB in fp32
_CHUNK_ELEMENTS = 1 << 27


def _block_q(B: int, H: int, N: int, block_q: int | None) -> int:
    if block_q is not None:
        return max(1, int(block_q))
    return max(16, min(N, _CHUNK_ELEMENTS // max(1, B * H * N)))


_MASKS: dict = {}


def causal_mask(n: int, device) -> torch.Tensor:
    """(n, n) bool, True above the diagonal (the entries a causal query must not see).

    The last mask is kept (like a registered buffer in a model), so building it is not part of
    every call.
    """
    key = (n, str(device))
    if key not in _MASKS:
        _MASKS.clear()
        _MASKS[key] = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    return _MASKS[key]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    causal: bool = False) -> torch.Tensor:
    """Textbook attention, (B, H, N, D) -> (B, H, N, D); materialises (B, H, N, N) twice."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale       # write N^2 (matmul), r+w N^2 (scale)
    if causal:
        n = q.shape[-2]
        # under torch.compile the mask is built in the graph (inductor fuses it into the fill)
        mask = (torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
                if torch.compiler.is_compiling() else causal_mask(n, q.device))
        s = s.masked_fill(mask, float("-inf"))                # r+w N^2
    p = torch.softmax(s, dim=-1)                              # r+w N^2
    return torch.matmul(p, v)                                 # read N^2


def _block_probs(q_blk, k, i0: int, causal: bool, scale: float) -> torch.Tensor:
    """P for query rows [i0, i0 + bq): (B, H, bq, n_keys), keys limited to j < i0 + bq when
    causal (the rest are masked anyway)."""
    bq = q_blk.shape[-2]
    s = torch.matmul(q_blk, k.transpose(-2, -1)) * scale
    if causal:
        rows = torch.arange(i0, i0 + bq, device=q_blk.device)[:, None]
        cols = torch.arange(k.shape[-2], device=q_blk.device)[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
    return torch.softmax(s, dim=-1)


@torch.no_grad()
def reference_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      block_q: int | None = None) -> torch.Tensor:
    """Attention output o (B, H, N, D), one block of query rows at a time, in q's dtype."""
    B, H, N, D = q.shape
    scale = 1.0 / math.sqrt(D)
    bq = _block_q(B, H, N, block_q)
    o = torch.empty_like(q)
    for i0 in range(0, N, bq):
        i1 = min(N, i0 + bq)
        kv_end = i1 if causal else N
        p = _block_probs(q[:, :, i0:i1], k[:, :, :kv_end], i0, causal, scale)
        o[:, :, i0:i1] = torch.matmul(p, v[:, :, :kv_end])
    return o


@torch.no_grad()
def reference_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       do: torch.Tensor, *, causal: bool = False, block_q: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each (B, H, N, D), recomputing P per query block from q and k.

    Per query block:  dV += P^T dO ; dP = dO V^T ; dS = P * (dP - rowsum(dO * O)) ;
    dQ = dS K * scale ; dK += dS^T Q * scale.
    """
    B, H, N, D = q.shape
    scale = 1.0 / math.sqrt(D)
    bq = _block_q(B, H, N, block_q)
    delta = (do * o).sum(dim=-1, keepdim=True)               # (B, H, N, 1)
    dq = torch.empty_like(q)
    acc = torch.promote_types(q.dtype, torch.float32)          # fp32, or fp64 for fp64 inputs
    dk = torch.zeros(q.shape, dtype=acc, device=q.device)
    dv = torch.zeros(q.shape, dtype=acc, device=q.device)
    for i0 in range(0, N, bq):
        i1 = min(N, i0 + bq)
        kv_end = i1 if causal else N
        q_blk, do_blk = q[:, :, i0:i1], do[:, :, i0:i1]
        k_vis, v_vis = k[:, :, :kv_end], v[:, :, :kv_end]
        p = _block_probs(q_blk, k_vis, i0, causal, scale)    # (B, H, bq, kv_end)
        dv[:, :, :kv_end] += torch.matmul(p.transpose(-2, -1), do_blk)
        dp = torch.matmul(do_blk, v_vis.transpose(-2, -1))
        ds = p * (dp - delta[:, :, i0:i1])
        dq[:, :, i0:i1] = torch.matmul(ds, k_vis) * scale
        dk[:, :, :kv_end] += torch.matmul(ds.transpose(-2, -1), q_blk) * scale
    return dq, dk.to(q.dtype), dv.to(q.dtype)
