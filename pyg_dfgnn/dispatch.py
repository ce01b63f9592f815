"""The SMMF / PMF rule: which fused strategy a graph gets.

SMMF walks each row with one warp in 32-edge chunks (online softmax), so any
degree fits its shared memory; but a super node's row would then serialise on
one warp while the rest of the GPU idles. PMF (DF-GNN §4.3) writes the scores
of an edge-parallel SDDMM to global memory and splits long rows over many
warps, so graphs with super nodes go there. The threshold is DF-GNN's shared
memory rule (8 rows of fp32 scores in 48 KB: degree x heads <= 1536), which
also marks where one warp per row stops paying.
"""
SMMF = 'smmf'
PMF = 'pmf'

# DF-GNN's SMMF budget: 8 rows of fp32 scores in the 48 KB of shared memory
# every architecture guarantees.
SMMF_SCORE_BYTES = 48 * 1024
SMMF_ROWS_PER_BLOCK = 8


def choose_strategy(max_in_degree: int, num_heads: int = 1) -> str:
    """Return :obj:`'smmf'` unless the longest row is a super node by DF-GNN's
    shared-memory rule (then :obj:`'pmf'`)."""
    if max_in_degree < 0 or num_heads < 1:
        raise ValueError(f"'max_in_degree' must be >= 0 and 'num_heads' >= 1 "
                         f"(got {max_in_degree} and {num_heads})")
    row_bytes = max_in_degree * num_heads * 4  # fp32 scores
    return SMMF if row_bytes * SMMF_ROWS_PER_BLOCK <= SMMF_SCORE_BYTES else PMF
