/* Weight-only quantized linear layers on CPU: y[M, N] = x[M, K] . W[N, K]^T in float32, where W
 * is stored quantized and never materialized whole.
 *
 * The kernels read the weights in a layout of their own (layout.py's pack(), N a multiple of 8, K
 * of 32): the rows go in groups of 8, and each group's block of 32 columns is one run of bytes in
 * which the 8 rows alternate every 4 columns, so that one vector instruction multiplies the same 4
 * columns of all 8 rows and its lanes are the 8 rows' sums (no horizontal sums, 8 independent rows
 * per accumulator):
 *   int8: q [N/8, K/32, 256]: byte 32 c + 4 r + i of block b is w[8 g + r, 32 b + 4 c + i], c < 8
 *   int4: q [N/8, K/32, 128]: byte 32 c + 4 r + i holds w[8 g + r, 32 b + 8 c + i] in its low
 *         nibble and w[8 g + r, 32 b + 8 c + 4 + i] in its high nibble, c < 4; q in 0..15
 *   d (and m for int4): float16 [N/8, K/G, 8], the 8 rows' scale (minimum) of one group of G
 *         columns side by side; w = d * q (+ m), or w = d * (q - 8) for int4 without m.
 * (GGUF's Q8_0 is int8 with G = 32, Q4_1 int4 with G = 32, Q4_0 int4 without m: its 4.5 bits a
 * weight are all the kernel reads.)
 *
 * Written with GCC vector extensions where they suffice and with AVX2 intrinsics where they do
 * not: the same source becomes AVX2 or AVX-512 code under Inductor's -march and portable code on
 * aarch64.
 *
 * Each x row is rounded to int8 per block of 32 so that each block's sums are integer dot products,
 * scaled once per block (and, for int4, m * sum(x) added from precomputed block sums of the rounded x).
 * With rounds = 2 its rounding error is rounded the same way and multiplied too: x to ~15 bits, not
 * 8, for twice the integer products (the `activations: fine` setting; docs/benchmarks.md). A row
 * is computed the same way whatever the rows beside it, so a sequence's logits do not depend on
 * the batch it is in. The quantized bytes are read from memory once per call: with several rows a
 * chunk of row groups meets every row while it is in cache. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* The instructions build.py targets beyond -march, as macros it defines (g++ defines no feature
 * macro for a target pragma): VNNI dot products, and AMX-INT8 tiles (amx.c). kquant.c and amx.c,
 * appended to this file, test these too. */
#if defined(TS_LLM_TARGET_AVX512VNNI) && defined(__AVX512VL__)
#define HAVE_VNNI 1
#define dpbusd256 _mm256_dpbusd_epi32
#elif defined(TS_LLM_TARGET_AVXVNNI) && defined(__AVX2__)
#define HAVE_VNNI 1 /* AVX-VNNI: the same instruction, VEX-encoded, on CPUs without AVX-512 */
#define dpbusd256 _mm256_dpbusd_avx_epi32
#endif
#if defined(TS_LLM_TARGET_AMX_INT8) && defined(TS_LLM_TARGET_AMX_TILE) && defined(__AVX512F__)
#define HAVE_TILES 1
#endif

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8v __attribute__((vector_size(32)));

#define BLOCK 32
#define ROWS 8 /* rows per group */

static inline void store8(float *p, f8 v) { memcpy(p, &v, sizeof v); }
/* a * b + c, fused where the CPU has FMA (Inductor compiles with -ffp-contract=off: no implicit fusing) */
#if defined(__FMA__)
static inline f8 fma8(f8 a, f8 b, f8 c) { return _mm256_fmadd_ps(a, b, c); }
#else
static inline f8 fma8(f8 a, f8 b, f8 c) { return a * b + c; }
#endif

static inline int64_t block_bytes(int bits) { return bits == 8 ? ROWS * BLOCK : ROWS * BLOCK / 2; }

/* 8 float16s (scales and minimums are stored as GGUF stores them) as floats */
#if defined(__F16C__)
static inline f8 half8(const uint16_t *p) { return (f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#else
#if defined(__aarch64__)
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
static inline f8 half8(const uint16_t *p) {
    f8 v;
    for (int j = 0; j < 8; j++) v[j] = half(p[j]);
    return v;
}
#endif

/* ---- rounding x ---------------------------------------------------------------------------- */

/* One row is rounded to int8 per block of 32 (scale = the block's largest |x| / 127, an error of at
 * most 1/254 of that value per element: how llama.cpp rounds activations for its Q8 dot products)
 * and each block's sums are taken in integers, then scaled once:
 *   y[n] = sum_b d[n, b] * sx[b] * sum_k q[n, k] xq[k]  (+ m[n, b] * sum_k x[k] for int4, exact) */
#define TILE 4 /* x rows sharing each loaded block */

/* The rounded x rows of one tile (the R <= TILE rows multiplied together), interleaved block by
 * block so that one pointer of each kind reaches every row (a pointer per row ran out of registers):
 *   q [K/32, R, 32]; scale, sum (of the rounded x, scale * sum q: the int4 minimum's term) and qsum8 (8 * sum
 *   of q: the term of int4 without m, sum (q - 8) xq = sum q xq - 8 sum xq) [K/32, R]; qhalf, the
 *   sums of q over columns 0-15 and 16-31 (kquant.c's centred form) [K/32, R, 2] */
typedef struct {
    int8_t *q;
    float *scale;
    float *sum;
    int32_t *qsum8;
    int32_t *qhalf;
} RoundedTile;

/* One block of 32: q = round(x / scale) (to nearest even, as lrintf), its scale, the rounded block's
 * sum, 8 x q's sum and q's sums over each half. The minimum's term takes the rounded sum, not the
 * exact one: then a weight's rounding error is (d q + m) e, its value's, not d q e, which is
 * larger wherever m offsets it (measured: the default model's Q4_K_M file, perplexity 17.17 against
 * 16.69 unrounded with the exact sum; docs/benchmarks.md). */
#if defined(__AVX2__)
static inline void round_block(const float *x, int8_t *q, float *scale, float *sum, int32_t *qsum8, int32_t *qhalf) {
    const __m256 v[4] = {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)};
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 amax8 = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                       _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    const f8 a = (f8)amax8;
    float amax = 0;
    for (int j = 0; j < 8; j++) amax = a[j] > amax ? a[j] : amax;
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    __m256i i[4];
    for (int j = 0; j < 4; j++) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));  /* MXCSR: to nearest even */
    const i8v lo = (i8v)_mm256_add_epi32(i[0], i[1]), hi = (i8v)_mm256_add_epi32(i[2], i[3]);
    qhalf[0] = qhalf[1] = 0;
    for (int j = 0; j < 8; j++) qhalf[0] += lo[j], qhalf[1] += hi[j];
    const int32_t qtotal = qhalf[0] + qhalf[1];
    /* the packs work per 128-bit half: dwords come out as 0 lo, 1 lo, 2 lo, 3 lo | 0 hi, ..., put back in order */
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    *scale = amax / 127.0f;
    *sum = *scale * (float)qtotal;
    *qsum8 = 8 * qtotal;
}
#else
static inline void round_block(const float *x, int8_t *q, float *scale, float *sum, int32_t *qsum8, int32_t *qhalf) {
    float amax = 0;
    for (int k = 0; k < BLOCK; k++) amax = fmaxf(amax, fabsf(x[k]));
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    qhalf[0] = qhalf[1] = 0;
    for (int k = 0; k < BLOCK; k++) q[k] = (int8_t)lrintf(x[k] * inv), qhalf[k / 16] += q[k];
    const int32_t qtotal = qhalf[0] + qhalf[1];
    *scale = amax / 127.0f;
    *sum = *scale * (float)qtotal;
    *qsum8 = 8 * qtotal;
}
#endif

/* The M rows of x rounded, tile by tile, in one allocation: free() it. With rounds = 2 the tiles
 * [tiles, 2 tiles) hold each block's rounding error (x - scale q), rounded the same way. */
static RoundedTile *round_tiles(const float *x, int64_t M, int64_t K, int rounds) {
    const int64_t blocks = K / BLOCK, tiles = (M + TILE - 1) / TILE, rows = rounds * M;
    char *mem = (char *)malloc(rounds * tiles * sizeof(RoundedTile) + rows * (K + 5 * sizeof(float) * blocks));
    RoundedTile *out = (RoundedTile *)mem;
    float *scales = (float *)(mem + rounds * tiles * sizeof(RoundedTile)), *sums = scales + rows * blocks;
    int32_t *qsums = (int32_t *)(sums + rows * blocks), *halves = qsums + rows * blocks;
    int8_t *bytes = (int8_t *)(halves + 2 * rows * blocks);
    for (int64_t t = 0; t < rounds * tiles; t++) {
        /* x's rows row0.. of this tile; first: where its rounded rows start (error tiles: after all M) */
        const int64_t row0 = t % tiles * TILE, first = t / tiles * M + row0, R = M - row0 < TILE ? M - row0 : TILE;
        RoundedTile tile = {bytes + first * K, scales + first * blocks, sums + first * blocks, qsums + first * blocks,
                            halves + 2 * first * blocks};
        for (int64_t i = 0; i < R; i++)
            for (int64_t b = 0; b < blocks; b++) {
                const int64_t at = b * R + i;
                const float *xb = x + (row0 + i) * K + b * BLOCK;
                float error[BLOCK];
                if (t >= tiles) {  /* the first round's tile of this row: the same index, tiles earlier */
                    const RoundedTile *done = out + t - tiles;
                    for (int k = 0; k < BLOCK; k++) error[k] = xb[k] - done->scale[at] * (float)done->q[at * BLOCK + k];
                    xb = error;
                }
                round_block(xb, tile.q + at * BLOCK, tile.scale + at, tile.sum + at, tile.qsum8 + at, tile.qhalf + 2 * at);
            }
        out[t] = tile;
    }
    return out;
}

/* The 8 rows' sum(q * xq) over one block of 32 columns: lane r is row r. A block's weights are
 * loaded (and, int4, split into nibbles) once as a Block and multiplied with each x row's block.
 * AVX2: vpmaddubsw multiplies unsigned bytes by signed ones and adds pairs to int16, vpmaddwd adds
 * pairs to int32, so 4 columns of 8 rows against x's 4 (broadcast) land in one int32 per row. No
 * int16 overflow: int4 sums 8 pair sums (8 * 2 * 15 * 127 = 30480) before widening; int8 pairs
 * (2 * 128 * 127 = 32512) are widened one at a time. */
#if defined(__AVX2__)
typedef struct { __m256i v[8]; } Block;  /* int4: chunk c's low nibbles in v[2c], high in v[2c+1]; int8: chunks */

static inline __m256i x4(const int8_t *xq) { int32_t v; memcpy(&v, xq, 4); return _mm256_set1_epi32(v); }

static inline Block load_block(int bits, const uint8_t *blk) {
    Block w;
    if (bits == 8) {
        for (int c = 0; c < 8; c++) w.v[c] = _mm256_loadu_si256((const __m256i *)(blk + 32 * c));
    } else {
        const __m256i nibble = _mm256_set1_epi8(0x0F);
        for (int c = 0; c < 4; c++) {
            const __m256i b = _mm256_loadu_si256((const __m256i *)(blk + 32 * c));
            w.v[2 * c] = _mm256_and_si256(b, nibble);
            w.v[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble);
        }
    }
    return w;
}

#if defined(HAVE_VNNI)
/* VNNI (build.py adds it where the CPU has it): vpdpbusd does the same unsigned x signed byte
 * products and adds each lane's 4 into its int32 in one instruction. Four sums, added at the end:
 * one accumulator would chain 8 of them (latency ~4 cycles each) and halve their throughput. */
static inline i8v block_isum(int bits, const Block *w, const int8_t *xq) {
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < 8; j++) {
        const __m256i x = x4(xq + 4 * j);
        acc[j % 4] = bits == 4 ? dpbusd256(acc[j % 4], w->v[j], x)
                               : dpbusd256(acc[j % 4], _mm256_sign_epi8(w->v[j], w->v[j]), _mm256_sign_epi8(x, w->v[j]));
    }
    return (i8v)_mm256_add_epi32(_mm256_add_epi32(acc[0], acc[1]), _mm256_add_epi32(acc[2], acc[3]));
}
#else
static inline i8v block_isum(int bits, const Block *w, const int8_t *xq) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (bits == 4) {  /* nibble vector j covers columns 4j..4j+3 */
        __m256i pairs = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w->v[j], x4(xq + 4 * j)));
        return (i8v)_mm256_madd_epi16(pairs, ones);
    }
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {  /* |w| times x with w's sign */
        const __m256i x = x4(xq + 4 * c);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w->v[c], w->v[c]),
                                                                           _mm256_sign_epi8(x, w->v[c])), ones));
    }
    return (i8v)acc;
}
#endif
#else
typedef struct { const uint8_t *blk; } Block;

static inline Block load_block(int bits, const uint8_t *blk) { (void)bits; return (Block){blk}; }

static inline i8v block_isum(int bits, const Block *w, const int8_t *xq) {
    i8v acc = {0};
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < 8; c++)
            for (int i = 0; i < 4; i++) {
                if (bits == 8) {
                    acc[r] += ((const int8_t *)w->blk)[32 * c + 4 * r + i] * xq[4 * c + i];
                } else if (c < 4) {
                    const uint8_t b = w->blk[32 * c + 4 * r + i];
                    acc[r] += (b & 0x0F) * xq[8 * c + i] + (b >> 4) * xq[8 * c + 4 + i];
                }
            }
    return acc;
}
#endif

/* Each thread streams its row groups' blocks in order; prefetching 4 KB ahead took a default-model
 * int8 decode step from 8.5 to 7.2 ms (avx512_amx; 7.6 to 7.2 forced avx2) and int4's from 4.4
 * to 3.9 ms forced avx2 (4.2 either way on avx512_amx); 1 KB gained less, 8 KB the same. */
#define QUANT_PREFETCH 4096
static inline void prefetch_block(int bits, const uint8_t *blk) {
#if defined(__x86_64__)
    for (int64_t line = 0; line < block_bytes(bits); line += 64) _mm_prefetch((const char *)blk + line + QUANT_PREFETCH, _MM_HINT_T0);
#else
    (void)bits, (void)blk;
#endif
}

/* TILE_CALL(R, t) for each tile t of the M x rows: the full tiles, then the rest, with R a constant
 * in each call, so that each row count inlines into a loop of its own (its accumulators in registers). */
#define FOR_TILES(M, TILE_CALL)                                                                                        \
    do {                                                                                                               \
        int64_t t_ = 0;                                                                                                \
        for (; (t_ + 1) * TILE <= (M); t_++) TILE_CALL(TILE, t_);                                                      \
        switch ((M) - t_ * TILE) {                                                                                     \
            case 3: TILE_CALL(3, t_); break;                                                                           \
            case 2: TILE_CALL(2, t_); break;                                                                           \
            case 1: TILE_CALL(1, t_); break;                                                                           \
        }                                                                                                              \
    } while (0)

/* y[r][0..8) for one row group and R x rows (y rows ldy apart), e: their rounding errors' tile or
 * NULL; inlined with constant bits, R, e or a literal NULL and (for int4) m or a literal NULL, so
 * the accumulators stay in registers and each form is its own loop. Each x row's arithmetic is the
 * same whatever R is. */
static inline __attribute__((always_inline)) void group_rows(int bits, int R, const RoundedTile *x, const RoundedTile *e,
                                                             const uint8_t *q, const uint16_t *d, const uint16_t *m,
                                                             float *y, int64_t ldy, int64_t K, int64_t G) {
    const int minimum = bits == 4 && m != NULL, centred = bits == 4 && m == NULL;  /* Q4_1-like, Q4_0-like */
    f8 acc[4] = {{0}}, offset[4] = {{0}};
    /* groups outside, their blocks inside: no division per block (an idiv cost more than a block's dot products) */
    for (int64_t g = 0, b = 0; g < K / G; g++) {
        const f8 scale = half8(d + ROWS * g), min = minimum ? half8(m + ROWS * g) : (f8){0};
        for (const int64_t end = b + G / BLOCK; b < end; b++) {
            prefetch_block(bits, q + b * block_bytes(bits));
            const Block w = load_block(bits, q + b * block_bytes(bits));
            for (int r = 0; r < R; r++) {
                const int64_t at = b * R + r;
                i8v isum = block_isum(bits, &w, x->q + at * BLOCK);
                if (centred) isum -= x->qsum8[at];
                acc[r] = fma8(__builtin_convertvector(isum, f8), scale * x->scale[at], acc[r]);
                if (e) {  /* the rounding error's own product (rounds = 2) */
                    i8v esum = block_isum(bits, &w, e->q + at * BLOCK);
                    if (centred) esum -= e->qsum8[at];
                    acc[r] = fma8(__builtin_convertvector(esum, f8), scale * e->scale[at], acc[r]);
                }
                if (minimum) offset[r] = fma8(min, (f8){0} + (e ? x->sum[at] + e->sum[at] : x->sum[at]), offset[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) store8(y + r * ldy, acc[r] + offset[r]);
}

#if defined(HAVE_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define HAVE_PAIRS 1
/* Two int4 row groups at once in 512-bit vectors (where the CPU has AVX-512 VNNI): group g's 8
 * rows in lanes 0-7, group g + 1's in lanes 8-15, so one broadcast of x's 4 columns and one
 * vpdpbusd serve 16 rows. Each lane does what group_rows does for its row, in the same order, so
 * the bits are the same as the 256-bit path's (bench.kernels checks). */
typedef float f16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));

/* a in lanes 0-7 (bytes 0-31), b in lanes 8-15 */
static inline __m512i pair16_join(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

static inline __m512i pair16_load(const uint8_t *a, const uint8_t *b) {
    return pair16_join(_mm256_loadu_si256((const __m256i *)a), _mm256_loadu_si256((const __m256i *)b));
}

static inline f16v pair16_half(const uint16_t *a, const uint16_t *b) {
    return (f16v)_mm512_insertf32x8(_mm512_castps256_ps512((__m256)half8(a)), (__m256)half8(b), 1);
}

/* The 16 rows' sums of q * xq over one block's vectors 0-3 (lo) and 4-7 (hi): vector j multiplies
 * x's columns 4j..4j+3. Four accumulators: one would chain 8 dot products (latency ~4 cycles each). */
static inline void pair16_halves(const __m512i v[8], const int8_t *xq, i16v *lo, i16v *hi) {
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int j = 0; j < 8; j++) {
        int32_t x4; memcpy(&x4, xq + 4 * j, 4);
        acc[j / 4 * 2 + j % 2] = _mm512_dpbusd_epi32(acc[j / 4 * 2 + j % 2], v[j], _mm512_set1_epi32(x4));
    }
    *lo = (i16v)_mm512_add_epi32(acc[0], acc[1]);
    *hi = (i16v)_mm512_add_epi32(acc[2], acc[3]);
}

/* The 16 rows' sum(q * xq) over one block: chunk c's low nibbles in v[2c], high in v[2c+1]. */
static inline i16v pair16_isum(const __m512i v[8], const int8_t *xq) {
    i16v lo, hi;
    pair16_halves(v, xq, &lo, &hi);
    return lo + hi;  /* integers: the same sum in any order */
}

/* y[r][0..16) of row groups q0 and q1 = q0 + stride (d and m likewise, dstride apart) for R x
 * rows: group_rows for two groups, with bits = 4. */
static inline __attribute__((always_inline)) void pair16_rows(int R, const RoundedTile *x, const RoundedTile *e,
                                                              const uint8_t *q0, int64_t stride, const uint16_t *d0,
                                                              const uint16_t *m0, int64_t dstride, float *y, int64_t ldy,
                                                              int64_t K, int64_t G) {
    const uint8_t *q1 = q0 + stride;
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    f16v acc[4] = {{0}}, offset[4] = {{0}};
    for (int64_t g = 0, b = 0; g < K / G; g++) {
        const f16v scale = pair16_half(d0 + ROWS * g, d0 + dstride + ROWS * g);
        const f16v min = m0 ? pair16_half(m0 + ROWS * g, m0 + dstride + ROWS * g) : (f16v){0};
        for (const int64_t end = b + G / BLOCK; b < end; b++) {
            const int64_t at0 = b * block_bytes(4);
            prefetch_block(4, q0 + at0);
            prefetch_block(4, q1 + at0);
            __m512i v[8];
            for (int c = 0; c < 4; c++) {
                const __m512i w = pair16_load(q0 + at0 + 32 * c, q1 + at0 + 32 * c);
                v[2 * c] = _mm512_and_si512(w, nibble);
                v[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble);
            }
            for (int r = 0; r < R; r++) {
                const int64_t at = b * R + r;
                i16v isum = pair16_isum(v, x->q + at * BLOCK);
                if (!m0) isum -= x->qsum8[at];
                acc[r] = (f16v)_mm512_fmadd_ps((__m512)__builtin_convertvector(isum, f16v), (__m512)(scale * x->scale[at]),
                                               (__m512)acc[r]);
                if (e) {
                    i16v esum = pair16_isum(v, e->q + at * BLOCK);
                    if (!m0) esum -= e->qsum8[at];
                    acc[r] = (f16v)_mm512_fmadd_ps((__m512)__builtin_convertvector(esum, f16v),
                                                   (__m512)(scale * e->scale[at]), (__m512)acc[r]);
                }
                if (m0) offset[r] = (f16v)_mm512_fmadd_ps((__m512)min, (__m512)((f16v){0} + (e ? x->sum[at] + e->sum[at] : x->sum[at])),
                                                          (__m512)offset[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const f16v out = acc[r] + offset[r];
        memcpy(y + r * ldy, &out, sizeof out);
    }
}

/* two int4 row groups against the M x rows, a tile at a time */
static inline __attribute__((always_inline)) void pair16(const RoundedTile *x, const RoundedTile *e, int64_t M,
                                                         const uint8_t *q, int64_t stride, const uint16_t *d,
                                                         const uint16_t *m, int64_t dstride, float *y, int64_t N,
                                                         int64_t K, int64_t G) {
#define PAIR16_TILE(R, t) pair16_rows(R, x + t, e ? e + t : NULL, q, stride, d, m, dstride, y + t * TILE * N, N, K, G)
    FOR_TILES(M, PAIR16_TILE);
#undef PAIR16_TILE
}
#endif

/* one row group against the M x rows, a tile at a time (e: the error tiles, or NULL) */
static inline __attribute__((always_inline)) void group(int bits, const RoundedTile *x, const RoundedTile *e, int64_t M,
                                                        const uint8_t *q, const uint16_t *d, const uint16_t *m, float *y,
                                                        int64_t N, int64_t K, int64_t G) {
#define GROUP_TILE(R, t) group_rows(bits, R, x + t, e ? e + t : NULL, q, d, m, y + t * TILE * N, N, K, G)
    FOR_TILES(M, GROUP_TILE);
#undef GROUP_TILE
}

/* ---- the linear layer ---------------------------------------------------------------------- */

/* One loop over the row groups: what linear() hands the pool (pool.c). */
typedef struct {
    const RoundedTile *x, *e;
    const uint8_t *q;
    const uint16_t *d, *m;
    float *y;
    int64_t M, N, K, G, groups, stride;
} LinearLoop;

/* int4's row groups two at a time where the CPU has 512-bit VNNI (pair16()) and the call has enough
 * products per weight (x rows, times 2 with the rounding error's) to be bound by arithmetic. 1B
 * layer on a Zen 5, 2 threads, ms: 5 products 1.74 against 2.31, 16 3.25 against 4.89, 128 17.3
 * against 29.5. Up to 4, memory bounds it and the two groups' streams read slower (1 row 1.25
 * against 1.08; 4 rows 1.65 against 1.45). The rest go one group at a time. */
#define PAIR_MIN_PRODUCTS 5
#if defined(HAVE_PAIRS)
#define PAIRS(BITS, MIN, E)                                                                                            \
    if (BITS == 4 && a->M * (E ? 2 : 1) >= PAIR_MIN_PRODUCTS)                                                          \
        for (; g + 1 < g1; g += 2)                                                                                     \
            pair16(a->x, E, a->M, a->q + g * a->stride, a->stride, a->d + g * a->groups * ROWS,                          \
                 MIN ? a->m + g * a->groups * ROWS : NULL, a->groups * ROWS, a->y + g * ROWS, a->N, a->K, a->G);
#else
#define PAIRS(BITS, MIN, E)
#endif

/* A task per form (bits, m or none, error tiles or none), so each is specialized: row groups [g0, g1). */
#define LINEAR_TASK(NAME, BITS, MIN, E)                                                                                \
    static void NAME(const void *loop, int64_t g0, int64_t g1) {                                                       \
        const LinearLoop *a = (const LinearLoop *)loop;                                                                \
        int64_t g = g0;                                                                                                \
        PAIRS(BITS, MIN, E)                                                                                            \
        for (; g < g1; g++)                                                                                            \
            group(BITS, a->x, E, a->M, a->q + g * a->stride, a->d + g * a->groups * ROWS,                              \
                  MIN ? a->m + g * a->groups * ROWS : NULL, a->y + g * ROWS, a->N, a->K, a->G);                        \
    }
LINEAR_TASK(linear_q8, 8, 0, NULL)
LINEAR_TASK(linear_q8_fine, 8, 0, a->e)
LINEAR_TASK(linear_q4, 4, 0, NULL)
LINEAR_TASK(linear_q4_fine, 4, 0, a->e)
LINEAR_TASK(linear_q4_min, 4, 1, NULL)
LINEAR_TASK(linear_q4_min_fine, 4, 1, a->e)

/* Every x row is rounded and multiplied as a lone row would be, so a row's result does not
 * depend on the rows beside it. The weights are read from memory once per call: one row group at
 * a time, each loaded block shared by TILE x rows. e: x's rounding errors, rounded (round_tiles'
 * second round), or NULL. */
static void linear(int bits, const RoundedTile *x, const RoundedTile *e, const uint8_t *q, const uint16_t *d,
                   const uint16_t *m, float *y, int64_t M, int64_t N, int64_t K, int64_t G, int threads) {
    const LinearLoop loop = {x, e, q, d, m, y, M, N, K, G, K / G, K / BLOCK * block_bytes(bits)};
    const PoolTask task = bits == 8 ? (e ? linear_q8_fine : linear_q8)
                          : m == NULL ? (e ? linear_q4_fine : linear_q4)
                                      : (e ? linear_q4_min_fine : linear_q4_min);
    pool_for(threads, N / ROWS, task, &loop);
}

/* ---- entry point -------------------------------------------------------------------------- */

#if defined(HAVE_TILES)
/* amx.c (build.py appends it to this file): the same products on AMX tiles, from this many x rows
 * (fewer: a tile would hold mostly zeros; measured in docs/benchmarks.md) */
#define AMX_MIN_ROWS 8
static void tiles_linear(int bits, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m, float *y,
                         int64_t M, int64_t N, int64_t K, int64_t G, int threads);
#endif

/* The paths this build has (bits: 1 VNNI dot products, 2 AMX tiles), for build.py to report and
 * the tests to hold to the platform's targets. */
#ifdef __cplusplus
extern "C"
#endif
int ts_llm_quantized_paths(void) {
    int paths = 0;
#if defined(HAVE_VNNI)
    paths |= 1;
#endif
#if defined(HAVE_TILES)
    paths |= 2;
#endif
    return paths;
}

/* The instructions this build may execute beyond the architecture's baseline, one bit each in
 * build.py's BUILT_FEATURES order: -march's and Inductor's (the compiler's own macros) and the targets
 * build.py adds (its macros). The worker holds them to the platform's profile before it runs a product
 * (build.check_in_force), since the last kernel library loaded into a process is the one its ops run. */
#ifdef __cplusplus
extern "C"
#endif
int64_t ts_llm_built_features(void) {
    int64_t f = 0;
#if defined(__AVX2__)
    f |= 1 << 0;
#endif
#if defined(__FMA__)
    f |= 1 << 1;
#endif
#if defined(__F16C__)
    f |= 1 << 2;
#endif
#if defined(__AVX512F__)
    f |= 1 << 3;
#endif
#if defined(__AVX512BW__)
    f |= 1 << 4;
#endif
#if defined(__AVX512VL__)
    f |= 1 << 5;
#endif
#if defined(__AVX512DQ__)
    f |= 1 << 6;
#endif
#if defined(__AVX512BF16__)
    f |= 1 << 7;
#endif
#if defined(__AVX512VNNI__) || defined(TS_LLM_TARGET_AVX512VNNI)
    f |= 1 << 8;
#endif
#if defined(__AVXVNNI__) || defined(TS_LLM_TARGET_AVXVNNI)
    f |= 1 << 9;
#endif
#if defined(__AMX_TILE__) || defined(TS_LLM_TARGET_AMX_TILE)
    f |= 1 << 10;
#endif
#if defined(__AMX_INT8__) || defined(TS_LLM_TARGET_AMX_INT8)
    f |= 1 << 11;
#endif
#if defined(__ARM_FEATURE_SVE)
    f |= 1 << 12;
#endif
#if defined(__ARM_FEATURE_BF16)
    f |= 1 << 13;
#endif
    return f;
}

/* bits 8 or 4; m NULL for int8 and for int4 stored as d * (q - 8). x [M, K], y [M, N], both float32 and contiguous;
 * N % 8 == 0. rounds: 1 (x rounded to int8 per block) or 2 (its rounding error too; no AMX tiles). */
#ifdef __cplusplus
extern "C"
#endif
void ts_llm_quantized_linear(int bits, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m,
                             float *y, int64_t M, int64_t N, int64_t K, int64_t G, int rounds, int threads) {
#if defined(HAVE_TILES)
    if (M >= AMX_MIN_ROWS && rounds == 1) {
        tiles_linear(bits, x, q, d, m, y, M, N, K, G, threads);
        return;
    }
#endif
    RoundedTile *tiles = round_tiles(x, M, K, rounds);
    linear(bits, tiles, rounds == 2 ? tiles + (M + TILE - 1) / TILE : NULL, q, d, m, y, M, N, K, G, threads);
    free(tiles);
}

/* GGUF's int4 bytes [N, K/2] (byte j of each 32-weight block: weight j in the low nibble, j + 16
 * in the high) into the layout above, [N/8, K/32, 128] (byte 32 c + 4 r + i of a block: column
 * 8 c + i of row r low, 8 c + 4 + i high), at load: a byte of column group c < 2 joins the low
 * nibbles of source bytes 8 c + i and 8 c + 4 + i, one of c >= 2 their high nibbles. The same
 * reordering in torch's permutes took most of an 8B model's load (docs/benchmarks.md, "Engine
 * choices"). */
#ifdef __cplusplus
extern "C"
#endif
void ts_llm_pack_int4(const uint8_t *src, uint8_t *dst, int64_t N, int64_t K) {
    const int64_t blocks = K / 32, row_bytes = K / 2;
    for (int64_t g = 0; g < N / 8; g++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *out = dst + (g * blocks + b) * 128;
            for (int r = 0; r < 8; r++) {
                const uint8_t *s = src + (g * 8 + r) * row_bytes + b * 16;
                for (int c = 0; c < 2; c++)
                    for (int i = 0; i < 4; i++) {
                        const uint8_t first = s[8 * c + i], second = s[8 * c + 4 + i];
                        out[32 * c + 4 * r + i] = (uint8_t)((first & 0x0F) | (second << 4));
                        out[32 * (c + 2) + 4 * r + i] = (uint8_t)((first >> 4) | (second & 0xF0));
                    }
            }
        }
}
