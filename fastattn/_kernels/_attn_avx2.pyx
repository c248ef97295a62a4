# cython: language_level=3
"""fastattn kernels compiled for the avx2 instruction set (see setup.py)."""
include "_attn_body.pxi"
