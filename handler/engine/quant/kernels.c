/* Weight-only quantized linear layers on CPU: y[M, N] = x[M, K] . W[N, K]^T in float32, where W
 * is stored quantized and never materialized whole.
 *
 * Layouts (K a multiple of 32, group size G a multiple of 32 dividing K):
 *   int8: q int8 [N, K]; w = d * q; d float16 [N, K/G]
 *   int4: q uint8 [N, K/2], GGUF's block order: in each block of 32 weights byte j holds weight
 *         j (low nibble) and weight j + 16 (high nibble); w = d * q + m, q in 0..15;
 *         d, m float16 [N, K/G]. (GGUF Q4_1 is this with G = 32; Q4_0 has m = -8 d, exact in
 *         float16; GGUF Q8_0 is int8 with G = 32.)
 *
 * Written with GCC vector extensions, not intrinsics: the same source becomes AVX2 or AVX-512
 * code under Inductor's -march for x86 and NEON on aarch64.
 *
 * One row (decode at batch 1): the quantized bytes are streamed once, one output row at a
 * time, with x rounded to int8 per block of 32 so that each block's sum(q * x) is an
 * integer dot product, scaled once per block (and, for
 * int4, m * sum(x) added from precomputed group sums of x). Several rows reuse each weight: a
 * chunk of output rows is dequantized into a float32 buffer that stays in cache, then multiplied
 * with every x row by a 3 x 4 register-blocked kernel. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef float f8 __attribute__((vector_size(32)));

#define BLOCK 32
#ifndef PREFETCH
#define PREFETCH 8
#endif

static inline f8 load8(const float *p) { f8 v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, f8 v) { memcpy(p, &v, sizeof v); }
/* a * b + c, fused where the CPU has FMA (Inductor compiles with -ffp-contract=off: no implicit fusing) */
#if defined(__FMA__)
static inline f8 fma8(f8 a, f8 b, f8 c) { return _mm256_fmadd_ps(a, b, c); }
#else
static inline f8 fma8(f8 a, f8 b, f8 c) { return a * b + c; }
#endif
static inline float hsum(f8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

/* the 32 quantized values of one block as floats (q, before scale and minimum). GCC turns
 * __builtin_convertvector from bytes into scalar code, so x86 widens with intrinsics. */
#if defined(__AVX2__)

static inline void unpack_q8(const int8_t *q, f8 w[4]) {
    for (int j = 0; j < 4; j++)
        w[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * j))));
}

static inline void unpack_q4(const uint8_t *q, f8 w[4]) {
    const __m128i b = _mm_loadu_si128((const __m128i *)q), nibble = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, nibble), hi = _mm_and_si128(_mm_srli_epi16(b, 4), nibble);
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}
#else
static inline void unpack_q8(const int8_t *q, f8 w[4]) {
    float t[BLOCK];
    for (int k = 0; k < BLOCK; k++) t[k] = (float)q[k];
    for (int j = 0; j < 4; j++) w[j] = load8(t + 8 * j);
}

static inline void unpack_q4(const uint8_t *q, f8 w[4]) {
    float t[BLOCK];
    for (int k = 0; k < BLOCK / 2; k++) {
        t[k] = (float)(q[k] & 0x0F);
        t[k + BLOCK / 2] = (float)(q[k] >> 4);
    }
    for (int j = 0; j < 4; j++) w[j] = load8(t + 8 * j);
}
#endif

static inline void unpack(int bits, const uint8_t *row, int64_t block, f8 w[4]) {
    if (bits == 8) unpack_q8((const int8_t *)row + block * BLOCK, w);
    else unpack_q4(row + block * (BLOCK / 2), w);
}

/* a float16 (scales and minimums are stored as GGUF stores them) as a float */
#if defined(__F16C__)
static inline float half(uint16_t h) { return _cvtsh_ss(h); }
#elif defined(__aarch64__)
static inline float half(uint16_t h) { __fp16 v; memcpy(&v, &h, 2); return (float)v; }
#else
static inline float half(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    float v;
    if (exp == 0) v = ldexpf((float)mant, -24);  /* zero or subnormal */
    else if (exp == 31) { uint32_t bits = sign | 0x7F800000u | (mant << 13); memcpy(&v, &bits, 4); return v; }
    else v = ldexpf((float)(mant | 0x400), (int)exp - 25);
    return sign ? -v : v;
}
#endif

static inline int64_t row_bytes(int bits, int64_t K) { return bits == 8 ? K : K / 2; }

/* ---- one x row ---------------------------------------------------------------------------- */

/* One row is rounded to int8 per block of 32 (scale = the block's largest |x| / 127, an error of at
 * most 1/254 of that value per element: how llama.cpp rounds activations for its Q8 dot products)
 * and each block's sum(q * x) is taken in integers, 32 products per instruction pair on AVX2
 * (vpmaddubsw, then vpmaddwd to int32), then scaled once:
 *   y[n] = sum_b d[n, b] * sx[b] * sum_k q[n, k] xq[k]  (+ m[n, b] * sum_k x[k] for int4, exact)
 * No int16 saturation in vpmaddubsw's pair sums: int4 2 * 15 * 127, int8 2 * 128 * 127 < 32767. */
typedef struct {
    int8_t *q;      /* [K] */
    float *scale;   /* [K/32] */
    float *sum;     /* [K/32], sum of the unrounded x: the int4 minimum's term */
} RoundedRow;

static RoundedRow round_row(const float *x, int64_t K) {
    RoundedRow r = {(int8_t *)malloc(K), (float *)malloc(sizeof(float) * (K / BLOCK)),
                    (float *)malloc(sizeof(float) * (K / BLOCK))};
    for (int64_t b = 0; b < K / BLOCK; b++) {
        float amax = 0, sum = 0;
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) {
            amax = fmaxf(amax, fabsf(x[k]));
            sum += x[k];
        }
        const float scale = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) r.q[k] = (int8_t)lrintf(x[k] * inv);
        r.scale[b] = scale;
        r.sum[b] = sum;
    }
    return r;
}

static void free_row(RoundedRow r) { free(r.q); free(r.scale); free(r.sum); }

/* sum(q * xq) over one block of 32 weights, as 8 lanes of partial sums */
#if defined(__AVX2__)
static inline f8 block_isum(int bits, const uint8_t *row, int64_t block, const int8_t *xq) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)xq), ones = _mm256_set1_epi16(1);
    __m256i pairs;
    if (bits == 8) {  /* vpmaddubsw multiplies unsigned by signed: |w| by x with w's sign */
        const __m256i w = _mm256_loadu_si256((const __m256i *)((const int8_t *)row + block * BLOCK));
        pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    } else {  /* bytes hold weights j (low nibble) and j + 16 (high): lows then highs is x's order */
        const __m128i b = _mm_loadu_si128((const __m128i *)(row + block * (BLOCK / 2))), nibble = _mm_set1_epi8(0x0F);
        const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), nibble), _mm_and_si128(b, nibble));
        pairs = _mm256_maddubs_epi16(w, x);
    }
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
}
#else
static inline f8 block_isum(int bits, const uint8_t *row, int64_t block, const int8_t *xq) {
    int32_t lane[8] = {0};
    for (int k = 0; k < BLOCK; k++) {
        const int32_t w = bits == 8 ? ((const int8_t *)row)[block * BLOCK + k]
                                    : (row[block * (BLOCK / 2) + k % 16] >> (k < 16 ? 0 : 4)) & 0x0F;
        lane[k % 8] += w * xq[k];
    }
    f8 v;
    for (int j = 0; j < 8; j++) v[j] = (float)lane[j];
    return v;
}
#endif

/* blocks `from` .. K/32 of row n, one at a time (what the 8-block loop leaves) */
static inline float gemv_tail(int bits, RoundedRow x, const uint8_t *q, const uint16_t *d, const uint16_t *m,
                              int64_t n, int64_t from, int64_t K, int64_t G) {
    const int64_t groups = K / G;
    f8 acc = {0};
    float offset = 0;
    for (int64_t b = from; b < K / BLOCK; b++) {
        const int64_t i = n * groups + b * BLOCK / G;
        acc = fma8(block_isum(bits, q + n * row_bytes(bits, K), b, x.q + b * BLOCK), (f8){0} + half(d[i]) * x.scale[b], acc);
        if (m) offset += half(m[i]) * x.sum[b];
    }
    return hsum(acc) + offset;
}

/* scale[j] = d * sx and (int4) the m * sum(x) terms, for blocks b0 .. b0+8 of one weight row: on
 * 8 blocks at a time, since done one block at a time this bookkeeping cost as much as the dot
 * products themselves. */
static inline void block_scales(const uint16_t *d, const uint16_t *m, RoundedRow x, int64_t b0, int64_t G,
                                float scale[8], f8 *offset) {
#if defined(__F16C__)
    if (G == BLOCK) {
        store8(scale, (f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b0))) * load8(x.scale + b0));
        if (m) *offset = fma8((f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + b0))), load8(x.sum + b0), *offset);
        return;
    }
#endif
    f8 mv;
    for (int j = 0; j < 8; j++) {
        const int64_t g = (b0 + j) * BLOCK / G;
        scale[j] = half(d[g]) * x.scale[b0 + j];
        mv[j] = m ? half(m[g]) : 0.0f;
    }
    if (m) *offset = fma8(mv, load8(x.sum + b0), *offset);
}

/* y[n] for one x row (K a multiple of 256 here; gemv_tail does the rest); inlined with constant bits
 * so the accumulator stays in a register. One weight row at a time, a single stream for the
 * hardware prefetcher: measured on AVX2 (2 threads, the default model's shapes streamed from
 * memory) 20-25% faster than four rows sharing each x block (four streams). */
#define GEMV(BITS)                                                                                      \
    static inline __attribute__((always_inline)) void gemv##BITS##_row(                                 \
        RoundedRow x, const uint8_t *q, const uint16_t *d, const uint16_t *m, float *y, int64_t n,      \
        int64_t K, int64_t G) {                                                                         \
        const int64_t groups = K / G, full = (K / BLOCK) & ~(int64_t)7;                                 \
        const uint8_t *row = q + n * row_bytes(BITS, K);                                                \
        f8 acc = {0}, offset = {0};                                                                     \
        for (int64_t b0 = 0; b0 < full; b0 += 8) {                                                      \
            float scale[8];                                                                             \
            block_scales(d + n * groups, BITS == 4 ? m + n * groups : NULL, x, b0, G, scale, &offset);  \
            for (int j = 0; j < 8; j++) {                                                               \
                __builtin_prefetch(row + (b0 + j + PREFETCH) * BLOCK * BITS / 8);                       \
                acc = fma8(block_isum(BITS, row, b0 + j, x.q + (b0 + j) * BLOCK), (f8){0} + scale[j], acc); \
            }                                                                                           \
        }                                                                                               \
        y[n] = hsum(acc) + hsum(offset) + gemv_tail(BITS, x, q, d, m, n, full, K, G);                   \
    }                                                                                                   \
    static void gemv##BITS(RoundedRow x, const uint8_t *q, const uint16_t *d, const uint16_t *m, float *y, \
                           int64_t N, int64_t K, int64_t G, int threads) {                              \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                               \
        for (int64_t n = 0; n < N; n++) gemv##BITS##_row(x, q, d, m, y, n, K, G);                       \
    }
GEMV(8)
GEMV(4)

/* ---- several x rows ----------------------------------------------------------------------- */

static void dequantize_rows(int bits, const uint8_t *q, const uint16_t *d, const uint16_t *m, float *out,
                            int64_t n0, int64_t rows, int64_t K, int64_t G) {
    const int64_t groups = K / G, rb = row_bytes(bits, K);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = q + (n0 + r) * rb;
        for (int64_t b = 0; b < K / BLOCK; b++) {
            const int64_t i = (n0 + r) * groups + b * BLOCK / G;
            f8 w[4];
            unpack(bits, row, b, w);
            const float scale = half(d[i]), min = m ? half(m[i]) : 0.0f;
            for (int j = 0; j < 4; j++) store8(out + r * K + b * BLOCK + 8 * j, fma8(w[j], (f8){0} + scale, (f8){0} + min));
        }
    }
}

/* y[MB rows, 4 columns] = x[MB, K] . w[4, K]^T, w rows contiguous with stride K */
#define MICRO(MB)                                                                                      \
    static void micro_##MB(const float *x, const float *w, float *y, int64_t K, int64_t ldy) {        \
        f8 acc[MB][4] = {{{0}}};                                                                       \
        for (int64_t k = 0; k < K; k += 8) {                                                          \
            f8 w0 = load8(w + k), w1 = load8(w + K + k), w2 = load8(w + 2 * K + k), w3 = load8(w + 3 * K + k); \
            for (int i = 0; i < MB; i++) {                                                             \
                f8 xi = load8(x + i * K + k);                                                          \
                acc[i][0] = fma8(xi, w0, acc[i][0]); acc[i][1] = fma8(xi, w1, acc[i][1]);                  \
                acc[i][2] = fma8(xi, w2, acc[i][2]); acc[i][3] = fma8(xi, w3, acc[i][3]); \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < MB; i++)                                                                   \
            for (int c = 0; c < 4; c++) y[i * ldy + c] = hsum(acc[i][c]);                              \
    }
MICRO(1)
MICRO(2)
MICRO(3)

static void dot_rows(const float *x, const float *w, float *y, int64_t rows, int64_t K) {
    for (int64_t r = 0; r < rows; r++) {
        f8 acc = {0};
        for (int64_t k = 0; k < K; k += 8) acc = fma8(load8(x + k), load8(w + r * K + k), acc);
        y[r] = hsum(acc);
    }
}

static void gemm(int bits, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m, float *y,
                 int64_t M, int64_t N, int64_t K, int64_t G, int threads) {
    /* a chunk of dequantized rows: ~64 KiB, so it stays in L2 while all of x passes by */
    int64_t chunk = (16384 / K) & ~(int64_t)3;
    if (chunk < 4) chunk = 4;
    const int64_t chunks = (N + chunk - 1) / chunk;
#pragma omp parallel num_threads(threads)
    {
        float *buf = (float *)malloc(sizeof(float) * chunk * K);
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t n0 = c * chunk, rows = N - n0 < chunk ? N - n0 : chunk;
            dequantize_rows(bits, q, d, m, buf, n0, rows, K, G);
            for (int64_t i = 0; i < M; i += 3) {
                const int64_t mb = M - i < 3 ? M - i : 3;
                const float *xi = x + i * K;
                float *yi = y + i * N + n0;
                int64_t r = 0;
                for (; r + 4 <= rows; r += 4) {
                    if (mb == 3) micro_3(xi, buf + r * K, yi + r, K, N);
                    else if (mb == 2) micro_2(xi, buf + r * K, yi + r, K, N);
                    else micro_1(xi, buf + r * K, yi + r, K, N);
                }
                for (int64_t j = 0; j < mb; j++) dot_rows(xi + j * K, buf + r * K, yi + j * N + r, rows - r, K);
            }
        }
        free(buf);
    }
}

/* ---- entry point -------------------------------------------------------------------------- */

/* bits 8 or 4; m NULL for int8. x [M, K], y [M, N], both float32 and contiguous. */
#ifdef __cplusplus
extern "C"
#endif
void ts_llm_quantized_linear(int bits, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m,
                             float *y, int64_t M, int64_t N, int64_t K, int64_t G, int threads) {
    if (M == 1) {
        const RoundedRow row = round_row(x, K);
        if (bits == 8) gemv8(row, q, d, m, y, N, K, G, threads);
        else gemv4(row, q, d, m, y, N, K, G, threads);
        free_row(row);
    } else {
        gemm(bits, x, q, d, m, y, M, N, K, G, threads);
    }
}
