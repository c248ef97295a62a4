# cython: language_level=3
"""fastattn kernels compiled for the avx512_bf16 instruction set (AVX512_BF16 dot products) (see setup.py)."""
include "_attn_body.pxi"
