/* GGUF's super-block formats (k-quants) and 5-bit blocks, taken as stored: y[M, N] = x[M, K] . W[N, K]^T.
 * Built after quantized.c (build.py), whose x rounding, tiles and 8-row dot products it shares.
 *
 * Weights are unsigned integers q of 4, 5 or 6 bits in a packed layout (kquant.py's pack()), per
 * row group of 8 and block of 32 columns:
 *   q  [N/8, K/32, 128]   the low 4 bits, as int4's (quantized.c): vector j of the 8 loaded is columns 4j..4j+3
 *   h  [N/8, K/32, 32]    5 bits: bit j of byte 4r + i is bit 4 of w[r, 4j + i]
 *      [N/8, K/32, 64]    6 bits: byte 32 (j / 4) + 4r + i holds bits 4-5 of w[r, 4j + i] at bits 2 (j % 4)
 * and the scales, per row (8 lanes side by side):
 *   minimum form (Q4_K, Q5_K; Q5_0 and Q5_1 with S = 32 and no sc/mn):
 *       w = d[S] * sc[32] * q - dmin[S] * mn[32]      sc, mn uint8 [N/8, K/32, 8] (absent: 1)
 *   centred form (Q6_K):  w = d[S] * sc[16] * (q - 32)   sc int8 [N/8, K/32, 2, 8]
 *   d, dmin float16 [N/8, K/S, 8], one per super-block of S columns (256, or 32 for Q5_0/Q5_1).
 *
 * Per block the integer sums are scaled by the integer sub-block scales (no overflow: 16 * 32 * 127
 * * 128 < 2^31), then once in float by d and x's block scale; the minimum's term uses the sum of the
 * rounded x, as int4's does (quantized.c's round_block says why). */

#define KQ_HIGH_BYTES(bits) ((bits) == 4 ? 0 : (bits) == 5 ? 32 : 64)

#if defined(__AVX2__)
typedef Block KBlock;

/* The 8 vectors of q (0..63) of one block: quantized.c's nibbles, then the high bits moved to bits 4-5. */
static inline KBlock kq_load(int bits, const uint8_t *q, const uint8_t *h) {
    KBlock w = load_block(4, q);
    if (bits == 5) {
        const __m256i hv = _mm256_loadu_si256((const __m256i *)h), bit4 = _mm256_set1_epi8(0x10);
        for (int j = 0; j < 8; j++) {
            const __m256i mask = _mm256_set1_epi8((char)(1 << j));
            w.v[j] = _mm256_or_si256(w.v[j], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, mask), mask), bit4));
        }
    } else if (bits == 6) {
        const __m256i two = _mm256_set1_epi8(0x30);
        for (int half = 0; half < 2; half++) {
            const __m256i hv = _mm256_loadu_si256((const __m256i *)(h + 32 * half));
            /* bits 2t..2t+1 to 4..5; 16-bit shifts move bits between bytes only below bit 4 or above bit 5 */
            const __m256i at[4] = {_mm256_slli_epi16(hv, 4), _mm256_slli_epi16(hv, 2), hv, _mm256_srli_epi16(hv, 2)};
            for (int t = 0; t < 4; t++) w.v[4 * half + t] = _mm256_or_si256(w.v[4 * half + t], _mm256_and_si256(at[t], two));
        }
    }
    return w;
}

/* The 8 rows' sums of q * xq over columns 0-15 (lo) and 16-31 (hi). */
static inline void kq_halves(const KBlock *w, const int8_t *xq, i8v *lo, i8v *hi) {
#if defined(HAVE_VNNI) /* quantized.c */
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < 8; j++) acc[j / 4 * 2 + j % 2] = dpbusd256(acc[j / 4 * 2 + j % 2], w->v[j], x4(xq + 4 * j));
    *lo = (i8v)_mm256_add_epi32(acc[0], acc[1]);
    *hi = (i8v)_mm256_add_epi32(acc[2], acc[3]);
#else
    /* int16 pair sums of two vectors at most (2 * 2 * 63 * 127 = 32004) before widening */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < 8; j += 2) {
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w->v[j], x4(xq + 4 * j)),
                                               _mm256_maddubs_epi16(w->v[j + 1], x4(xq + 4 * j + 4)));
        acc[j / 4] = _mm256_add_epi32(acc[j / 4], _mm256_madd_epi16(pairs, ones));
    }
    *lo = (i8v)acc[0];
    *hi = (i8v)acc[1];
#endif
}
#else
typedef struct { uint8_t v[ROWS][BLOCK]; } KBlock;  /* q of each row's 32 columns */

static inline KBlock kq_load(int bits, const uint8_t *q, const uint8_t *h) {
    KBlock w;
    for (int j = 0; j < 8; j++)
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < 4; i++) {
                const int lane = 4 * r + i, c = j / 2;
                const uint8_t byte = q[32 * c + lane];
                uint8_t v = j % 2 ? byte >> 4 : byte & 0x0F;
                if (bits == 5) v |= ((h[lane] >> j) & 1) << 4;
                if (bits == 6) v |= ((h[32 * (j / 4) + lane] >> (2 * (j % 4))) & 3) << 4;
                w.v[r][4 * j + i] = v;
            }
    return w;
}

static inline void kq_halves(const KBlock *w, const int8_t *xq, i8v *lo, i8v *hi) {
    for (int r = 0; r < ROWS; r++) {
        int32_t a = 0, b = 0;
        for (int k = 0; k < 16; k++) a += w->v[r][k] * xq[k], b += w->v[r][16 + k] * xq[16 + k];
        (*lo)[r] = a, (*hi)[r] = b;
    }
}
#endif

static inline i8v widen_u8(const uint8_t *p) { i8v v; for (int j = 0; j < 8; j++) v[j] = p[j]; return v; }
static inline i8v widen_i8(const int8_t *p) { i8v v; for (int j = 0; j < 8; j++) v[j] = p[j]; return v; }

/* One x row's scaled integer sums over one block (lane r: weight row r), from the row's rounded
 * block at `at` of tile x. */
static inline __attribute__((always_inline)) i8v kq_isum(int centred, int scaled, const KBlock *w, const RoundedTile *x,
                                                          int64_t at, i8v sc_lo, i8v sc_hi) {
    i8v lo, hi;
    kq_halves(w, x->q + at * BLOCK, &lo, &hi);
    if (centred) return (lo - 32 * x->qhalf[2 * at]) * sc_lo + (hi - 32 * x->qhalf[2 * at + 1]) * sc_hi;
    return scaled ? (lo + hi) * sc_lo : lo + hi;
}

/* y[r][0..8) for one row group and R x rows, e: their rounding errors' tile or NULL; inlined with
 * constant bits, R, scaled (sc and mn present) and e or a literal NULL, so each form is its own loop. */
static inline __attribute__((always_inline)) void kq_group_rows(int bits, int scaled, int R, const RoundedTile *x,
                                                                const RoundedTile *e,
                                                                const uint8_t *q, const uint8_t *h, const void *sc,
                                                                const uint8_t *mn, const uint16_t *d,
                                                                const uint16_t *dmin, float *y, int64_t ldy,
                                                                int64_t K, int64_t S) {
    const int centred = bits == 6, hb = KQ_HIGH_BYTES(bits);
    f8 acc[4] = {{0}}, offset[4] = {{0}};
    for (int64_t s = 0, b = 0; s < K / S; s++) {
        const f8 scale = half8(d + ROWS * s), min = centred ? (f8){0} : half8(dmin + ROWS * s);
        for (const int64_t end = b + S / BLOCK; b < end; b++) {
            prefetch_block(4, q + b * 128);
            const KBlock w = kq_load(bits, q + b * 128, h + b * hb);
            i8v sc_lo = {0}, sc_hi = {0};
            f8 block_min = min;
            if (centred) {
                sc_lo = widen_i8((const int8_t *)sc + 16 * b), sc_hi = widen_i8((const int8_t *)sc + 16 * b + 8);
            } else if (scaled) {
                sc_lo = widen_u8((const uint8_t *)sc + 8 * b);
                block_min = min * __builtin_convertvector(widen_u8(mn + 8 * b), f8);
            }
            for (int r = 0; r < R; r++) {
                const int64_t at = b * R + r;
                const i8v isum = kq_isum(centred, scaled, &w, x, at, sc_lo, sc_hi);
                acc[r] = fma8(__builtin_convertvector(isum, f8), scale * x->scale[at], acc[r]);
                if (e) {  /* the rounding error's own product (rounds = 2) */
                    const i8v esum = kq_isum(centred, scaled, &w, e, at, sc_lo, sc_hi);
                    acc[r] = fma8(__builtin_convertvector(esum, f8), scale * e->scale[at], acc[r]);
                }
                if (!centred) offset[r] = fma8(block_min, (f8){0} + (e ? x->sum[at] + e->sum[at] : x->sum[at]), offset[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) store8(y + r * ldy, acc[r] - offset[r]);
}

static inline __attribute__((always_inline)) void kq_group(int bits, int scaled, const RoundedTile *x,
                                                           const RoundedTile *e, int64_t M, const uint8_t *q, const uint8_t *h, const void *sc,
                                                           const uint8_t *mn, const uint16_t *d, const uint16_t *dmin,
                                                           float *y, int64_t N, int64_t K, int64_t S) {
#define KQ_GROUP_TILE(R, t) kq_group_rows(bits, scaled, R, x + t, e ? e + t : NULL, q, h, sc, mn, d, dmin, y + t * TILE * N, N, K, S)
    FOR_TILES(M, KQ_GROUP_TILE);  /* quantized.c */
#undef KQ_GROUP_TILE
}

#if defined(HAVE_PAIRS) /* quantized.c */
/* Two row groups at once in 512-bit vectors, as quantized.c's pair16(): group g's rows in lanes 0-7,
 * g + 1's in lanes 8-15, each lane computed as kq_group_rows computes its row (the same bits). */
static inline __attribute__((always_inline)) i16v kq_pair_isum(int centred, int scaled, const __m512i v[8],
                                                                const RoundedTile *x, int64_t at, i16v sc_lo, i16v sc_hi) {
    i16v lo, hi;
    pair16_halves(v, x->q + at * BLOCK, &lo, &hi);
    if (centred) return (lo - 32 * x->qhalf[2 * at]) * sc_lo + (hi - 32 * x->qhalf[2 * at + 1]) * sc_hi;
    return scaled ? (lo + hi) * sc_lo : lo + hi;
}

/* y[r][0..16) of the row group at q, h, sc, mn, d, dmin and the next one for R x rows: kq_group_rows
 * for two groups, which lie one group's K columns apart in every array. */
static inline __attribute__((always_inline)) void kq_pair_rows(int bits, int scaled, int R, const RoundedTile *x,
                                                               const RoundedTile *e, const uint8_t *q, const uint8_t *h,
                                                               const void *sc, const uint8_t *mn, const uint16_t *d,
                                                               const uint16_t *dmin, float *y, int64_t ldy, int64_t K,
                                                               int64_t S) {
    const int centred = bits == 6, hb = KQ_HIGH_BYTES(bits);
    const int64_t blocks = K / BLOCK, sc_next = blocks * (centred ? 16 : 8), d_next = K / S * ROWS;
    f16v acc[4] = {{0}}, offset[4] = {{0}};
    for (int64_t s = 0, b = 0; s < K / S; s++) {
        const f16v scale = pair16_half(d + ROWS * s, d + d_next + ROWS * s);
        const f16v min = centred ? (f16v){0} : pair16_half(dmin + ROWS * s, dmin + d_next + ROWS * s);
        for (const int64_t end = b + S / BLOCK; b < end; b++) {
            prefetch_block(4, q + b * 128);
            prefetch_block(4, q + (blocks + b) * 128);
            const KBlock w0 = kq_load(bits, q + b * 128, h + b * hb);
            const KBlock w1 = kq_load(bits, q + (blocks + b) * 128, h + (blocks + b) * hb);
            __m512i v[8];
            for (int j = 0; j < 8; j++) v[j] = pair16_join(w0.v[j], w1.v[j]);
            i16v sc_lo = {0}, sc_hi = {0};
            f16v block_min = min;
            if (centred) {
                const int8_t *sc0 = (const int8_t *)sc + 16 * b, *sc1 = sc0 + sc_next;
                sc_lo = (i16v)pair16_join((__m256i)widen_i8(sc0), (__m256i)widen_i8(sc1));
                sc_hi = (i16v)pair16_join((__m256i)widen_i8(sc0 + 8), (__m256i)widen_i8(sc1 + 8));
            } else if (scaled) {
                const uint8_t *sc0 = (const uint8_t *)sc + 8 * b;
                sc_lo = (i16v)pair16_join((__m256i)widen_u8(sc0), (__m256i)widen_u8(sc0 + sc_next));
                const i16v mins = (i16v)pair16_join((__m256i)widen_u8(mn + 8 * b), (__m256i)widen_u8(mn + ROWS * blocks + 8 * b));
                block_min = min * __builtin_convertvector(mins, f16v);
            }
            for (int r = 0; r < R; r++) {
                const int64_t at = b * R + r;
                const i16v isum = kq_pair_isum(centred, scaled, v, x, at, sc_lo, sc_hi);
                acc[r] = (f16v)_mm512_fmadd_ps((__m512)__builtin_convertvector(isum, f16v), (__m512)(scale * x->scale[at]),
                                               (__m512)acc[r]);
                if (e) {
                    const i16v esum = kq_pair_isum(centred, scaled, v, e, at, sc_lo, sc_hi);
                    acc[r] = (f16v)_mm512_fmadd_ps((__m512)__builtin_convertvector(esum, f16v),
                                                   (__m512)(scale * e->scale[at]), (__m512)acc[r]);
                }
                if (!centred)
                    offset[r] = (f16v)_mm512_fmadd_ps((__m512)block_min,
                                                      (__m512)((f16v){0} + (e ? x->sum[at] + e->sum[at] : x->sum[at])),
                                                      (__m512)offset[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const f16v out = acc[r] - offset[r];
        memcpy(y + r * ldy, &out, sizeof out);
    }
}

static inline __attribute__((always_inline)) void kq_pair(int bits, int scaled, const RoundedTile *x,
                                                          const RoundedTile *e, int64_t M, const uint8_t *q,
                                                          const uint8_t *h, const void *sc, const uint8_t *mn,
                                                          const uint16_t *d, const uint16_t *dmin, float *y, int64_t N,
                                                          int64_t K, int64_t S) {
#define KQ_PAIR_TILE(R, t) kq_pair_rows(bits, scaled, R, x + t, e ? e + t : NULL, q, h, sc, mn, d, dmin, y + t * TILE * N, N, K, S)
    FOR_TILES(M, KQ_PAIR_TILE);
#undef KQ_PAIR_TILE
}
#define KQ_PAIRS(E, AT)                                                                                                 \
    if (a->M * (E ? 2 : 1) >= PAIR_MIN_PRODUCTS)                                                                      \
        for (; g + 1 < g1; g += 2) kq_pair AT;
#else
#define KQ_PAIRS(E, AT)
#endif

/* One loop over the row groups: what ts_llm_kquant_linear hands the pool (pool.c). */
typedef struct {
    const RoundedTile *x, *e;
    const uint8_t *q, *h, *sc, *mn;
    const uint16_t *d, *dmin;
    float *y;
    int64_t M, N, K, S, sc_bytes;
} KQuantLoop;

/* kq_group's (and kq_pair's) arguments for row group g */
#define KQ_GROUP_AT(BITS, SCALED, E)                                                                                   \
    (BITS, SCALED, a->x, E, a->M, a->q + g * K / BLOCK * 128, a->h + g * K / BLOCK * KQ_HIGH_BYTES(BITS),              \
     SCALED ? a->sc + g * K / BLOCK * a->sc_bytes : NULL, SCALED && BITS != 6 ? a->mn + g * K / BLOCK * ROWS : NULL,   \
     a->d + g * K / S * ROWS, BITS == 6 ? NULL : a->dmin + g * K / S * ROWS, a->y + g * ROWS, a->N, K, S)

/* A task per form (bits, scaled, error tiles or none), so each is specialized: row groups [g0, g1). */
#define KQ_TASK(NAME, BITS, SCALED, E)                                                                                 \
    static void NAME(const void *loop, int64_t g0, int64_t g1) {                                                       \
        const KQuantLoop *a = (const KQuantLoop *)loop;                                                                \
        const int64_t K = a->K, S = a->S;                                                                              \
        int64_t g = g0;                                                                                                \
        KQ_PAIRS(E, KQ_GROUP_AT(BITS, SCALED, E))                                                                      \
        for (; g < g1; g++) kq_group KQ_GROUP_AT(BITS, SCALED, E);                                                     \
    }
#define KQ_TASKS(SUFFIX, E)                                                                                            \
    KQ_TASK(kq6##SUFFIX, 6, 1, E)                                                                                      \
    KQ_TASK(kq5_scaled##SUFFIX, 5, 1, E)                                                                               \
    KQ_TASK(kq5##SUFFIX, 5, 0, E)                                                                                      \
    KQ_TASK(kq4_scaled##SUFFIX, 4, 1, E)                                                                               \
    KQ_TASK(kq4##SUFFIX, 4, 0, E)
KQ_TASKS(, NULL)
KQ_TASKS(_fine, a->e)

static PoolTask kq_task(int bits, int scaled, int fine) {
    if (bits == 6) return fine ? kq6_fine : kq6;
    if (bits == 5) return scaled ? (fine ? kq5_scaled_fine : kq5_scaled) : (fine ? kq5_fine : kq5);
    return scaled ? (fine ? kq4_scaled_fine : kq4_scaled) : (fine ? kq4_fine : kq4);
}

/* bits 4, 5 (minimum form; sc and mn both given or both NULL) or 6 (centred, sc given, dmin NULL).
 * x [M, K], y [M, N] float32 and contiguous; N % 8 == 0, K % S == 0, S % 32 == 0. rounds: as
 * ts_llm_quantized_linear's (1: x rounded to int8 per block; 2: its rounding error too). */
#ifdef __cplusplus
extern "C"
#endif
void ts_llm_kquant_linear(int bits, const float *x_rows, const uint8_t *q, const uint8_t *h, const void *sc,
                          const uint8_t *mn, const uint16_t *d, const uint16_t *dmin, float *y, int64_t M, int64_t N,
                          int64_t K, int64_t S, int rounds, int threads) {
    RoundedTile *x = round_tiles(x_rows, M, K, rounds);
    const KQuantLoop loop = {x, rounds == 2 ? x + (M + TILE - 1) / TILE : NULL, q, h, (const uint8_t *)sc, mn, d, dmin,
                             y, M, N, K, S, bits == 6 ? 2 * ROWS : ROWS};
    pool_for(threads, N / ROWS, kq_task(bits, sc != NULL, rounds == 2), &loop);
    free(x);
}
