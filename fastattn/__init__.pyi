"""Type stubs for fastattn's public API."""
from contextlib import AbstractContextManager
from typing import Any, Literal, Sequence, TextIO, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import reference as reference

__version__: str

_Float = np.floating[Any]
_Causal = bool | Literal["top_left", "bottom_right"]
_Window = None | int | tuple[int | None, int | None]


# return_weights=False, return_lse=False -> out
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike | QuantizedKV,
    v: ArrayLike | QuantizedKV,
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> NDArray[_Float]: ...
# return_weights=True, return_lse=False -> (out, weights)
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike | QuantizedKV,
    v: ArrayLike | QuantizedKV,
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> tuple[NDArray[_Float], NDArray[_Float]]: ...
# return_weights=False, return_lse=True -> (out, lse)
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike | QuantizedKV,
    v: ArrayLike | QuantizedKV,
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> tuple[NDArray[_Float], NDArray[_Float]]: ...
# return_weights=True, return_lse=True -> (out, weights, lse)
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike | QuantizedKV,
    v: ArrayLike | QuantizedKV,
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> tuple[NDArray[_Float], NDArray[_Float], NDArray[_Float]]: ...
# flags only known at run time
@overload
def attention(
    q: ArrayLike,
    k: ArrayLike | QuantizedKV,
    v: ArrayLike | QuantizedKV,
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> NDArray[_Float] | tuple[NDArray[_Float], ...]: ...

# packed variable-length batches and paged caches: out, or (out, lse)
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> NDArray[_Float]: ...
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> tuple[NDArray[_Float], NDArray[_Float]]: ...
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> NDArray[_Float] | tuple[NDArray[_Float], NDArray[_Float]]: ...
@overload
def attention_paged(
    q: ArrayLike,
    k_cache: ArrayLike | QuantizedKV,
    v_cache: ArrayLike | QuantizedKV,
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> NDArray[_Float]: ...
@overload
def attention_paged(
    q: ArrayLike,
    k_cache: ArrayLike | QuantizedKV,
    v_cache: ArrayLike | QuantizedKV,
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> tuple[NDArray[_Float], NDArray[_Float]]: ...
@overload
def attention_paged(
    q: ArrayLike,
    k_cache: ArrayLike | QuantizedKV,
    v_cache: ArrayLike | QuantizedKV,
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
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> NDArray[_Float] | tuple[NDArray[_Float], NDArray[_Float]]: ...

# NumPy arrays in: NumPy out; torch tensors in: tensors out
@overload
def scaled_dot_product_attention(
    query: NDArray[Any],
    key: NDArray[Any],
    value: NDArray[Any],
    attn_mask: NDArray[Any] | None = ...,
    dropout_p: float = ...,
    is_causal: bool = ...,
    *,
    scale: float | None = ...,
    enable_gqa: bool = ...,
) -> NDArray[_Float]: ...
@overload
def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = ...,
    dropout_p: float = ...,
    is_causal: bool = ...,
    *,
    scale: float | None = ...,
    enable_gqa: bool = ...,
) -> Any: ...

@overload
def attention_backward(
    grad_out: ArrayLike,
    q: ArrayLike,
    k: ArrayLike | QuantizedKV,
    v: ArrayLike | QuantizedKV,
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
    num_threads: int | None = ...,
) -> tuple[NDArray[_Float], NDArray[_Float], NDArray[_Float]]: ...
@overload
def attention_backward(
    grad_out: ArrayLike,
    q: ArrayLike,
    k: ArrayLike | QuantizedKV,
    v: ArrayLike | QuantizedKV,
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
    num_threads: int | None = ...,
) -> tuple[NDArray[_Float], NDArray[_Float], NDArray[_Float], NDArray[_Float]]: ...
@overload
def attention_backward(
    grad_out: ArrayLike,
    q: ArrayLike,
    k: ArrayLike | QuantizedKV,
    v: ArrayLike | QuantizedKV,
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
    return_dbias: bool = ...,
    return_dsinks: bool = ...,
    num_threads: int | None = ...,
) -> tuple[NDArray[_Float], ...]: ...

def softmax(
    x: ArrayLike,
    axis: int | None = ...,
    *,
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> NDArray[_Float]: ...
def log_softmax(
    x: ArrayLike,
    axis: int | None = ...,
    *,
    out: NDArray[Any] | None = ...,
    num_threads: int | None = ...,
) -> NDArray[_Float]: ...
def merge_attention(
    outs: Sequence[ArrayLike], lses: Sequence[ArrayLike], sinks: ArrayLike | None = ...
) -> tuple[NDArray[_Float], NDArray[_Float]]: ...
def set_num_threads(n: int | None) -> None: ...
def get_num_threads() -> int: ...
def threads(n: int | None) -> AbstractContextManager[int]: ...
def show_config(file: TextIO | None = ...) -> str: ...


class QuantizedKV:
    data: NDArray[np.uint8]
    scale: NDArray[np.float32]
    zero: NDArray[np.float32]
    bits: int
    group_size: int
    shape: tuple[int, ...]
    def __init__(
        self, data: NDArray[np.uint8], scale: ArrayLike, zero: ArrayLike, bits: Literal[4, 8] = ...,
        group_size: int | None = ...,
    ) -> None: ...
    @property
    def dtype(self) -> np.dtype[np.float32]: ...
    @property
    def ndim(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def codes(self) -> NDArray[np.uint8]: ...
    def dequantize(self, dtype: Any = ...) -> NDArray[Any]: ...


def quantize_kv(x: ArrayLike, bits: Literal[4, 8] = ..., group_size: int | None = ...) -> QuantizedKV: ...
