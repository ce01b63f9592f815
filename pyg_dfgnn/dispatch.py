"""The SMMF / PMF rule: which fused strategy a graph gets.

SMMF keeps a block's rows of scores (and later exp values) in shared memory, so
it needs the longest row of the block to fit there. PMF writes the scores of an
edge-parallel SDDMM to global memory and is used when a super node's row does
not fit (DF-GNN §4.3).
"""
SMMF = 'smmf'
PMF = 'pmf'

# Shared memory one SMMF block may spend on scores: 48 KB is guaranteed on every
# architecture without opting in; the kernels size the real allocation from the
# block's actual rows.
SMMF_SCORE_BYTES = 48 * 1024
# Rows per SMMF block (one warp per row in the softmax phase).
SMMF_ROWS_PER_BLOCK = 8


def choose_strategy(max_in_degree: int, num_heads: int = 1) -> str:
    """Return :obj:`'smmf'` if a block of the longest rows fits its shared
    memory budget, else :obj:`'pmf'`."""
    if max_in_degree < 0 or num_heads < 1:
        raise ValueError(f"'max_in_degree' must be >= 0 and 'num_heads' >= 1 "
                         f"(got {max_in_degree} and {num_heads})")
    row_bytes = max_in_degree * num_heads * 4  # fp32 scores
    return SMMF if row_bytes * SMMF_ROWS_PER_BLOCK <= SMMF_SCORE_BYTES else PMF
