"""Type stubs for fastattn.reference (pure-NumPy float64 specification)."""
from typing import Any, Literal, Sequence, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

_F64 = NDArray[np.float64]
_Causal = bool | Literal["top_left", "bottom_right"] | None
_Window = None | int | tuple[int | None, int | None]

__all__ = ["softmax", "log_softmax", "attention", "merge_attention", "attention_backward", "attention_varlen",
           "attention_paged"]

def softmax(x: ArrayLike, axis: int | None = ...) -> _F64: ...
def log_softmax(x: ArrayLike, axis: int | None = ...) -> _F64: ...
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    mask: ArrayLike | None = ...,
    bias: ArrayLike | None = ...,
    window: _Window = ...,
    kv_lengths: ArrayLike | None = ...,
    kv_start: ArrayLike | None = ...,
    align: Literal["top_left", "bottom_right"] = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_weights: Literal[False] = ...,
    return_lse: Literal[False] = ...,
) -> _F64: ...
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    mask: ArrayLike | None = ...,
    bias: ArrayLike | None = ...,
    window: _Window = ...,
    kv_lengths: ArrayLike | None = ...,
    kv_start: ArrayLike | None = ...,
    align: Literal["top_left", "bottom_right"] = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_weights: Literal[True],
    return_lse: Literal[False] = ...,
) -> tuple[_F64, _F64]: ...
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    mask: ArrayLike | None = ...,
    bias: ArrayLike | None = ...,
    window: _Window = ...,
    kv_lengths: ArrayLike | None = ...,
    kv_start: ArrayLike | None = ...,
    align: Literal["top_left", "bottom_right"] = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_weights: Literal[False] = ...,
    return_lse: Literal[True],
) -> tuple[_F64, _F64]: ...
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    mask: ArrayLike | None = ...,
    bias: ArrayLike | None = ...,
    window: _Window = ...,
    kv_lengths: ArrayLike | None = ...,
    kv_start: ArrayLike | None = ...,
    align: Literal["top_left", "bottom_right"] = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_weights: Literal[True],
    return_lse: Literal[True],
) -> tuple[_F64, _F64, _F64]: ...
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    mask: ArrayLike | None = ...,
    bias: ArrayLike | None = ...,
    window: _Window = ...,
    kv_lengths: ArrayLike | None = ...,
    kv_start: ArrayLike | None = ...,
    align: Literal["top_left", "bottom_right"] = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_weights: bool = ...,
    return_lse: bool = ...,
) -> _F64 | tuple[_F64, ...]: ...
def merge_attention(
    outs: Sequence[ArrayLike], lses: Sequence[ArrayLike], sinks: ArrayLike | None = ...
) -> tuple[_F64, _F64]: ...
@overload
def attention_backward(
    grad_out: ArrayLike,
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    out: ArrayLike,
    lse: ArrayLike,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    mask: ArrayLike | None = ...,
    bias: ArrayLike | None = ...,
    window: _Window = ...,
    kv_lengths: ArrayLike | None = ...,
    kv_start: ArrayLike | None = ...,
    align: Literal["top_left", "bottom_right"] = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_dbias: Literal[False] = ...,
    return_dsinks: Literal[False] = ...,
) -> tuple[_F64, _F64, _F64]: ...
@overload
def attention_backward(
    grad_out: ArrayLike,
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    out: ArrayLike,
    lse: ArrayLike,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    mask: ArrayLike | None = ...,
    bias: ArrayLike | None = ...,
    window: _Window = ...,
    kv_lengths: ArrayLike | None = ...,
    kv_start: ArrayLike | None = ...,
    align: Literal["top_left", "bottom_right"] = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_dbias: Literal[True],
    return_dsinks: Literal[False] = ...,
) -> tuple[_F64, _F64, _F64, _F64]: ...
@overload
def attention_varlen(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    cu_seqlens_q: ArrayLike,
    cu_seqlens_k: ArrayLike | None = ...,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    window: _Window = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_lse: Literal[False] = ...,
) -> _F64: ...
@overload
def attention_varlen(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    cu_seqlens_q: ArrayLike,
    cu_seqlens_k: ArrayLike | None = ...,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    window: _Window = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_lse: Literal[True],
) -> tuple[_F64, _F64]: ...
@overload
def attention_varlen(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    cu_seqlens_q: ArrayLike,
    cu_seqlens_k: ArrayLike | None = ...,
    *,
    scale: float | None = ...,
    causal: _Causal = ...,
    window: _Window = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_lse: bool = ...,
) -> _F64 | tuple[_F64, _F64]: ...
@overload
def attention_paged(
    q: ArrayLike,
    k_cache: ArrayLike,
    v_cache: ArrayLike,
    block_table: ArrayLike,
    seq_lens: ArrayLike,
    *,
    cu_seqlens_q: ArrayLike | None = ...,
    scale: float | None = ...,
    causal: _Causal = ...,
    window: _Window = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_lse: Literal[False] = ...,
) -> _F64: ...
@overload
def attention_paged(
    q: ArrayLike,
    k_cache: ArrayLike,
    v_cache: ArrayLike,
    block_table: ArrayLike,
    seq_lens: ArrayLike,
    *,
    cu_seqlens_q: ArrayLike | None = ...,
    scale: float | None = ...,
    causal: _Causal = ...,
    window: _Window = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_lse: Literal[True],
) -> tuple[_F64, _F64]: ...
@overload
def attention_paged(
    q: ArrayLike,
    k_cache: ArrayLike,
    v_cache: ArrayLike,
    block_table: ArrayLike,
    seq_lens: ArrayLike,
    *,
    cu_seqlens_q: ArrayLike | None = ...,
    scale: float | None = ...,
    causal: _Causal = ...,
    window: _Window = ...,
    softcap: float | None = ...,
    alibi_slopes: ArrayLike | None = ...,
    k_scale: ArrayLike | None = ...,
    v_scale: ArrayLike | None = ...,
    sinks: ArrayLike | None = ...,
    return_lse: bool = ...,
) -> _F64 | tuple[_F64, _F64]: ...
