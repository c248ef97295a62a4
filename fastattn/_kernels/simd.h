/* Portable SIMD primitives for fastattn's kernels.
 *
 * Written with GCC/Clang vector extensions: the same source compiles to SSE2,
 * AVX2+FMA, AVX-512 or NEON, one module per kernel variant (setup.py's variant
 * table).  What differs between instruction sets -- partial loads, widening
 * loads of the storage types, lane masks, max -- comes from one target header
 * in isa/ (the ISA seam); the vector width, and with it the register blocking of
 * the micro-kernels, follows the target: FA_VBYTES is 16, 32 or 64.
 *
 * Everything here is IEEE-clean: no -ffast-math is needed or wanted.  The
 * vectorised exp returns exactly 0 for -inf (and anything below the smallest
 * normal result), +inf for large arguments and propagates NaN, which is what the
 * masked, max-stabilised softmax relies on.
 *
 * The float and double versions come from one body, simd_body.h, included twice.
 */
#ifndef FASTATTN_SIMD_H
#define FASTATTN_SIMD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* The instruction set: one target header of primitives (in isa/), named by
 * setup.py's variant table in FA_ISA_HEADER; it defines the vector width
 * FA_VBYTES, the register blocking below, the vector types and every primitive
 * that differs between instruction sets (isa/portable.h lists them).  Nothing
 * below names an instruction set. */
#ifdef FA_ISA_HEADER
#  include FA_ISA_HEADER
#else
#  include "isa/generic.h"
#endif
#ifndef FA_HAVE_STREAM
/* streaming (non-temporal) stores: a whole vector written to an aligned address
 * past the caches, without the read-for-ownership of its line; fa_stream_fence
 * after the last of them.  Targets without them (or where they are not worth
 * it) store normally. */
#  define FA_HAVE_STREAM 0
#  define fa_stream_f fa_store_f
#  define fa_stream_d fa_store_d
static inline void fa_stream_fence(void) {}
#endif
#ifdef FA_VARIANT
#  define FA_ISA FA_VARIANT
#else
#  define FA_ISA FA_TARGET
#endif

/* Register blocking of the two micro-kernels, in rows x vectors, set by the
 * target header:
 * QK: S[MR x NV*W] = Q[MR x D] . Kt[D x NV*W]   (FA_QK_MR * FA_QK_NV accumulators)
 * PV: O[MR x NV*W] += P[MR x K] . V[K x NV*W]    (FA_PV_MR * FA_PV_NV accumulators)
 * Chosen so that accumulators + operands fit the register file: 32 zmm on
 * AVX-512, 16 ymm on AVX2, 16 xmm on SSE2, 32 q registers on NEON. */

/* Query-vectorised kernels: lanes run over queries, so the per-query softmax
 * bookkeeping is vertical (no horizontal reductions), keys and values are read
 * in place as broadcast scalars (no packing, any strides).  A chunk is 1, 2 or
 * FA_QVEC_NV vectors of queries (a unit's rows are cut into the widest chunks that
 * fit, so 16 rows are one vector, not a quarter of a 4-vector chunk);
 * micro-blocks are MR keys (QK) or value columns (PV) by one chunk, MR * nv
 * accumulators, with MR = FA_QVEC_MR1 / FA_QVEC_MR2 / FA_QVEC_MR for 1 / 2 / FA_QVEC_NV
 * vectors: enough independent FMA chains to cover the latency, few enough
 * broadcast pointers to stay in registers (set by the target header). */
#define FA_QVEC_MRMAX 16

/* Few-rows (decode) loops, set by the target header where its FMA latency and
 * pipes want other numbers: FA_DOT_ACCS independent accumulators of a dot
 * product (fa_dot, a power of two), FA_ROW_NB vectors of an output row per pass
 * over the value rows (fa_pv_qk_row1, 8 or 16), FA_QK_PAIRS below. */
#ifndef FA_DOT_ACCS
#  define FA_DOT_ACCS 2
#endif
/* (row, key) accumulators of a few-rows score pass (fa_qk_pass), in vectors:
 * FA_QK_PAIRS_W * FA_W, more than FA_W on targets with few lanes */
#ifndef FA_QK_PAIRS_W
#  define FA_QK_PAIRS_W 1
#endif
#ifndef FA_ROW_NB
#  define FA_ROW_NB 8
#endif
#if FA_ROW_NB != 8 && FA_ROW_NB != 16
#  error "FA_ROW_NB is 8 or 16"
#endif
#if FA_QVEC_NV > 4
#  error "QVEC_RUNS_MAX (_attn_body.pxi) bounds the key runs of chunks of at most 4 vectors"
#endif
#if FA_QVEC_MR > FA_QVEC_MRMAX || FA_QVEC_MR1 > FA_QVEC_MRMAX || FA_QVEC_MR2 > FA_QVEC_MRMAX
#  error "FA_QVEC_MRMAX must bound every query-vectorised MR"
#endif

#if FA_QK_NV * FA_VBYTES / 4 > 32
#  error "a QK panel holds at most 32 keys (PANEL_MAX in _attn_body.pxi)"
#endif

#define FA_ALIGN 64
#ifndef FA_PF_BYTES
/* software prefetch distance of the row-streaming loops: it must cover the
 * memory latency at one core's share of the bandwidth.  On a 2-vCPU Intel Xeon
 * (AVX-512), decode (B1 H32 Lk4096 D128, 2 threads) streamed 47-48 GB/s at
 * 3 KiB and 50-51 at 6 KiB (paired over 30 rounds: 1.03x, decode-1head 1.04x;
 * 12 KiB no better than 6; the other standard cases within +-1 %).  The AVX2
 * variant on the same CPU gained alike (42 -> 45 GB/s): the machine's latency,
 * not the ISA. */
#  define FA_PF_BYTES 6144
#endif
#ifndef FA_PF_L2_BYTES
/* distance of the L2 hints (prefetcht1) of the float32 / float64 streams of the
 * few-rows loops where fa_pf_wide is off (AMD): a GQA group's keys key by key,
 * and its value rows.  Zen 4, GQA decode Hq32 Hkv8 Lk8192 D128, 2 threads, one
 * build with the distance and hint kind switched at run time: none 2.12-2.58 ms,
 * prefetcht0 6 KiB ahead 2.09-2.31, L2 2 KiB 2.32-2.46, 4 KiB 1.93, 8 KiB
 * 1.68-1.85, 12 KiB 1.57-1.83, 24 KiB 1.57-1.64; one hint per 128 or 256 bytes
 * instead of per line: no gain (docs/performance.rst, "GQA decode: L2 hints") */
#  define FA_PF_L2_BYTES 12288
#endif
/* The prefetch offset of the few-rows streams (fa_qk_rows, fa_pv_rows: pfo): FA_PF_AUTO
 * requests the rows FA_PF_BYTES / FA_PF_L2_BYTES ahead of the ones read (rows
 * that follow in memory); any other value pfo requests, with each row r read,
 * row r + pfo (0: none).  A paged cache passes the distance from this block
 * of rows to the next one of the block table (paged_heads.pxi). */
#define FA_PF_AUTO INT64_MIN
#ifndef FA_RESCALE_SLACK
/* query-vectorised online softmax: the running reference max moves only when a
 * tile's max exceeds it by more than this, so probabilities stay <= e^4 ~ 55
 * (l and Ot grow by at most that factor) and most tiles skip the Ot rescale */
#  define FA_RESCALE_SLACK 4
#endif
#ifndef FA_IN_REG
#  define FA_IN_REG(v) ((void)0)    /* the target's register hint (isa/x86_avx2.h) */
#endif
#ifndef FA_PF_LOC
#  define FA_PF_LOC 3        /* __builtin_prefetch locality: 3 = prefetcht0 */
#endif

/* Where the hints of the query-vectorised Q.K^T kernel (next key rows,
 * fa_qvec_qk_micro), the one-row decode loops (fa_qk_rows' single row,
 * fa_pv1_qk_pass), the few-rows loops over float16, bfloat16 and int8 keys and
 * values (fa_qk_rows' blocks, fa_pv_rows: FA_PF_L2_BYTES ahead) and the
 * QuantizedKV readers put their lines: 0 into L1
 * (FA_PF_LOC: prefetcht0), 1 into L2 (prefetcht1).  Set once at import from
 * fastattn._memory.prefetch_l2 (on for AMD CPUs, off elsewhere;
 * FASTATTN_PREFETCH_L2 overrides).  Zen 4 (docs/performance.rst, "GQA decode: L2
 * hints"): 16 query rows against 8192 keys from memory 1.14-1.18x faster, the
 * one-row decode of QuantizedKV / int8 / float16 caches faster, the GQA decode
 * of bfloat16 / float16 caches 1.16-1.43x / 1.23-1.39x, prefill level.
 * The level is a constant of each instantiation (fa_qvec_qk_chunk,
 * fa_pv_qk_row1, fa_qk_rows_pad, fa_pv_rows, fa_qk_rows_qz, fa_pv_rows_qz): a
 * branch per hint cost the prefill 1 % and the one-row QuantizedKV decode
 * 1.6x.  Never changes a result. */
static int fa_pf_l2 __attribute__((unused)) = 0;

/* One hint for the line at p: into L2 where l2 (a constant) != 0, else into L1. */
static inline __attribute__((always_inline)) void fa_prefetch_at(const void *p, const int l2)
{
    if (l2) __builtin_prefetch(p, 0, 2);
    else __builtin_prefetch(p, 0, FA_PF_LOC);
}

/* Prefetch hints for nbytes from p (one per cache line), and how many rows of
 * row_bytes the prefetch distance FA_PF_BYTES covers (at least one).  The loops
 * that stream keys and values from memory use these, by element type through
 * fa_prefetch / fa_pf_rows (vec_core.h) and by storage type (widen.h); into L2
 * where l2 (a constant) != 0. */
static inline __attribute__((always_inline)) void fa_prefetch_bytes_at(const void *p, int64_t nbytes, const int l2)
{
    /* every line the bytes touch: a row that does not start a line (NumPy's
     * buffers start 16 bytes into one) touches one more than nbytes / 64, and
     * where rows are not contiguous (a paged cache's blocks) nothing else
     * requests that line */
    if (nbytes <= 0) return;
    const uintptr_t e = (uintptr_t)p + (uintptr_t)nbytes;
    for (uintptr_t x = (uintptr_t)p & ~(uintptr_t)63; x < e; x += 64) fa_prefetch_at((const void *)x, l2);
}

static inline void fa_prefetch_bytes(const void *p, int64_t nbytes)
{
    fa_prefetch_bytes_at(p, nbytes, 0);
}

/* fa_prefetch_bytes into L2 only (prefetcht1 on x86): data wanted a little
 * later, which should not push the current rows out of L1 */
static inline void fa_prefetch_l2_bytes(const void *p, int64_t nbytes)
{
    fa_prefetch_bytes_at(p, nbytes, 1);
}

/* Software prefetch of the key and value rows of 4- and 8-byte elements (float32,
 * float64) that the decode loops read in place: 1 on, 0 off (fa_prefetch_row1_s,
 * widen.h; the few-rows loops fa_qk_rows_r and fa_pv_rows, stored_reads.h, which
 * with it off also read a group's keys key by key).  Set once at import from
 * fastattn._memory.prefetch_wide (off on AMD CPUs, on elsewhere;
 * FASTATTN_PREFETCH_WIDE overrides).  On a 2-vCPU Zen 3 the hardware prefetchers
 * stream such rows alone and the float32 decode ran ~1.2x faster on one thread
 * without the hints; narrower types keep theirs (figures: docs/performance.rst,
 * "Software prefetch of float32 rows on AMD" and "GQA decode: keys in order").
 * Never changes a result. */
static int fa_pf_wide __attribute__((unused)) = 1;

static inline int64_t fa_pf_rows_bytes(int64_t bytes)
{
    int64_t r = bytes > 0 ? (FA_PF_BYTES + bytes - 1) / bytes : 1;
    return r < 1 ? 1 : r;
}

/* 64-byte aligned allocation (not zeroed); NULL on failure.  The original
 * pointer is stored just before the aligned block so fa_free can release it. */
static inline void *fa_alloc(size_t nbytes)
{
    void *raw = malloc(nbytes + FA_ALIGN + sizeof(void *));
    if (!raw) return NULL;
    uintptr_t p = ((uintptr_t)raw + sizeof(void *) + FA_ALIGN - 1) & ~(uintptr_t)(FA_ALIGN - 1);
    ((void **)p)[-1] = raw;
    return (void *)p;
}

static inline void fa_free(void *p)
{
    if (p) free(((void **)p)[-1]);
}

/* Per-thread reuse of workspace arenas: the arenas a thread gives back (each up
 * to FA_ARENA_KEEP bytes, FA_ARENA_SLOTS of them, FA_ARENA_KEEP_TOTAL bytes in
 * all) are kept for its next calls instead of being freed, so a call costs no
 * malloc / free pairs (two of them were a tenth of a 3 x 3 attention call).
 * Several slots because a paged decode runs HEADS_LOCKSTEP workspaces per
 * thread beside a work list's row and query-vectorised ones: with one slot, all
 * but one of them were allocated and freed per call, and glibc gave those
 * (~170 KiB each, above its mmap threshold) back to the kernel, so every call
 * page-faulted them in again: 78 us for a 16-key paged decode (S1 Hq32 Hkv8
 * D128, one thread, Intel Xeon) against 26 us with glibc told to keep memory
 * (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_).  take removes the smallest
 * arena that is large enough from the thread's slots while it is used (a nested
 * or concurrent use on the thread gets its own); give puts it back -- into a
 * free slot, or in place of a smaller kept one -- or frees it.  The slots are
 * freed when the thread exits (a POSIX key destructor); without POSIX threads
 * every arena is simply allocated and freed. */
#ifndef FA_ARENA_KEEP
#  define FA_ARENA_KEEP ((size_t)1 << 20)
#endif
#ifndef FA_ARENA_SLOTS
#  define FA_ARENA_SLOTS 12
#endif
#ifndef FA_ARENA_KEEP_TOTAL
#  define FA_ARENA_KEEP_TOTAL ((size_t)4 << 20)
#endif
#if defined(_WIN32) || !defined(__unix__) && !defined(__APPLE__)
static inline void *fa_arena_take(size_t n) { return fa_alloc(n); }
static inline void fa_arena_give(void *p, size_t n) { (void)n; fa_free(p); }
#else
#include <pthread.h>
struct fa_arena_slot { void *p[FA_ARENA_SLOTS]; size_t n[FA_ARENA_SLOTS]; size_t total; };
static pthread_key_t fa_arena_key;
static pthread_once_t fa_arena_once = PTHREAD_ONCE_INIT;
static int fa_arena_key_ok = 0;

static void fa_arena_slot_free(void *slot)
{
    struct fa_arena_slot *a = (struct fa_arena_slot *)slot;
    for (int i = 0; i < FA_ARENA_SLOTS; i++) fa_free(a->p[i]);
    free(a);
}

static void fa_arena_key_init(void)
{
    fa_arena_key_ok = pthread_key_create(&fa_arena_key, fa_arena_slot_free) == 0;
}

static inline struct fa_arena_slot *fa_arena_slot_get(void)
{
    pthread_once(&fa_arena_once, fa_arena_key_init);
    if (!fa_arena_key_ok) return NULL;
    struct fa_arena_slot *a = (struct fa_arena_slot *)pthread_getspecific(fa_arena_key);
    if (!a) {
        a = (struct fa_arena_slot *)calloc(1, sizeof *a);
        if (a && pthread_setspecific(fa_arena_key, a) != 0) {
            free(a);
            a = NULL;
        }
    }
    return a;
}

static inline void *fa_arena_take(size_t n)
{
    struct fa_arena_slot *a = n <= FA_ARENA_KEEP ? fa_arena_slot_get() : NULL;
    if (a) {
        int best = -1;
        for (int i = 0; i < FA_ARENA_SLOTS; i++)
            if (a->p[i] && a->n[i] >= n && (best < 0 || a->n[i] < a->n[best])) best = i;
        if (best >= 0) {
            void *p = a->p[best];
            a->total -= a->n[best];
            a->p[best] = NULL;
            a->n[best] = 0;
            return p;
        }
    }
    return fa_alloc(n);
}

static inline void fa_arena_give(void *p, size_t n)
{
    struct fa_arena_slot *a = p && n <= FA_ARENA_KEEP ? fa_arena_slot_get() : NULL;
    if (!a) {
        fa_free(p);
        return;
    }
    int slot = -1;      /* a free slot, else the smallest kept arena (if smaller than p) */
    for (int i = 0; i < FA_ARENA_SLOTS; i++)
        if (!a->p[i]) {
            slot = i;
            break;
        }
    if (slot < 0)
        for (int i = 0; i < FA_ARENA_SLOTS; i++)
            if (a->n[i] < n && (slot < 0 || a->n[i] < a->n[slot])) slot = i;
    if (slot < 0 || a->total - a->n[slot] + n > FA_ARENA_KEEP_TOTAL) {
        fa_free(p);
        return;
    }
    fa_free(a->p[slot]);
    a->total = a->total - a->n[slot] + n;
    a->p[slot] = p;
    a->n[slot] = n;
}
#endif

/* ---- float ---- */
#define FA_T float
#define FA_SFX(name) name##_f
#define FA_V fa_v_f
#define FA_VI fa_vi_f
#define FA_IT int32_t
#define FA_EXP_LO (-87.3f)            /* below: result < smallest normal, returned as 0 */
#define FA_EXP_HI (88.37f)            /* above: returned as +inf (true overflow from 88.72) */
#define FA_EXP_ZERO (-88.0f)          /* rounds to n = -127: 2^n built as +0 */
#define FA_P_ZERO (-44.0f)            /* fa_vexp_p: rounds to n = -63, built as +0 with ... */
#define FA_P_BIAS 63.0f               /* ... this bias, */
#define FA_P_SCALE 0x1p64f            /* the polynomial scaled by 2^(127 - 63) */
#define FA_MAGIC 12582912.0f          /* 1.5 * 2^23: adding it rounds to an integer */
#define FA_MANT_BITS 23
#define FA_EXP_BIAS 127
#include "simd_body.h"
#undef FA_T
#undef FA_SFX
#undef FA_V
#undef FA_VI
#undef FA_IT
#undef FA_EXP_LO
#undef FA_EXP_HI
#undef FA_EXP_ZERO
#undef FA_P_ZERO
#undef FA_P_BIAS
#undef FA_P_SCALE
#undef FA_MAGIC
#undef FA_MANT_BITS
#undef FA_EXP_BIAS

#include "bf16_dot.h"

/* ---- double ---- */
#define FA_T double
#define FA_SFX(name) name##_d
#define FA_V fa_v_d
#define FA_VI fa_vi_d
#define FA_IT int64_t
#define FA_EXP_LO (-708.0)
#define FA_EXP_HI (709.0)
#define FA_EXP_ZERO (-709.0)          /* rounds to n = -1023: 2^n built as +0 */
#define FA_P_ZERO (-400.0)            /* rounds to n = -577 */
#define FA_P_BIAS 577.0
#define FA_P_SCALE 0x1p446            /* 2^(1023 - 577) */
#define FA_MAGIC 6755399441055744.0   /* 1.5 * 2^52 */
#define FA_MANT_BITS 52
#define FA_EXP_BIAS 1023
#define FA_DOUBLE 1
#include "simd_body.h"
#undef FA_DOUBLE
#undef FA_T
#undef FA_SFX
#undef FA_V
#undef FA_VI
#undef FA_IT
#undef FA_EXP_LO
#undef FA_EXP_HI
#undef FA_EXP_ZERO
#undef FA_P_ZERO
#undef FA_P_BIAS
#undef FA_P_SCALE
#undef FA_MAGIC
#undef FA_MANT_BITS
#undef FA_EXP_BIAS

#endif /* FASTATTN_SIMD_H */
