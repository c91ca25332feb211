/* Attention on CPU, on the kernels' pool (pool.c): a decode step's one new query per sequence, or a
 * prompt chunk's T queries, against the cached keys and values. Compiled graphs ran it on torch's one
 * thread (threading: pool): Inductor's fused reductions in decode, SDPA in prefill.
 *
 * The work is cut into items of one sequence, one KV head, one tile of queries and one block of
 * ATTN_BLOCK positions; for each query row (a query and a query head sharing that KV head) an item
 * computes its block's scores, their max, the sum of exp(score - max) and the values weighted by it
 * (the partial softmax of flash decoding). Each row's blocks are then merged in block order. The block
 * size is fixed and a row's arithmetic is its own, so its bits are the same whatever the batch, the
 * context's other rows, the chunk it came in (prefilled or decoded) or the threads. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ATTN_BLOCK 256       /* positions per item */
#define ATTN_MAX_GROUP 32    /* query heads per KV head */
#define ATTN_MAX_DIM 512     /* head dimension */
#define ATTN_SOLO_WORK 2048  /* rows x positions below which the caller runs it alone (waking costs more) */
#define ATTN_TILE_ROWS 64    /* query rows (queries x query heads of a KV head) an item takes */
#define ATTN_SCRATCH (8 << 20)  /* partials' floats per pass (32 MB) */
#define ATTN_CHUNK 32        /* keys (scores) or value columns one register block holds per row */

/* Every sum below has one order whatever the vector width, the rows blocked together or the build
 * (AVX2, AVX-512, scalar): a score is q[0]k[0], then + q[d]k[d] for d in order, one fused
 * multiply-add each (a key per vector lane); a weighted value column is p[0]v[0], then + p[s]v[s] in
 * positions' order; a softmax sum runs in 8 lanes (positions s = lane mod 8) added in one tree. */
#if defined(__AVX2__) && defined(__FMA__)
#ifdef __AVX512F__
#define ATTN_ROWS 4          /* rows per register block: 16 sums of 8 lanes in AVX-512's 32 registers */
#else
#define ATTN_ROWS 2          /* 8 sums in AVX2's 16 registers */
#endif
typedef __m256 attn_vec;
#define ATTN_W 8
#define attn_load _mm256_loadu_ps
#define attn_store _mm256_storeu_ps
#define attn_set1 _mm256_set1_ps
#define attn_zero _mm256_setzero_ps
#define attn_fma _mm256_fmadd_ps

/* exp(x) of 8 lanes for x <= 0 (Cephes' expf: 2^n times a polynomial in the remainder, ~1 ulp);
 * below -87 (and -inf: a hidden position) it is 0. attn_exp1 is the same arithmetic on one lane. */
static inline __m256 attn_exp8(__m256 x) {
    const __m256 low = _mm256_set1_ps(-87.0f);
    const __m256 kept = _mm256_max_ps(x, low);
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(kept, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), kept);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i power = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(power)), _mm256_cmp_ps(x, low, _CMP_GE_OQ));
}
#else
#define ATTN_ROWS 1
typedef float attn_vec;
#define ATTN_W 1
#define attn_load(p) (*(p))
#define attn_store(p, x) (*(p) = (x))
#define attn_set1(x) (x)
#define attn_zero() 0.0f
#define attn_fma(a, b, c) fmaf(a, b, c)
#endif

static inline float attn_exp1(float x) {
    if (!(x >= -87.0f)) return 0.0f;
    const float n = floorf(fmaf(x, 1.44269504088896341f, 0.5f));
    float r = fmaf(-n, 0.693359375f, x);
    r = fmaf(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float power;
    memcpy(&power, &bits, 4);
    return p * power;
}

/* A bf16 or float32 vector of D as float32 into row[D]. */
static inline void attn_row(const char *at, int bf16, int64_t D, float *row) {
    if (!bf16) {
        memcpy(row, at, D * sizeof(float));
        return;
    }
    const uint16_t *bits = (const uint16_t *)at;
    int64_t d = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(row + d, bf16x8(bits + d));  /* matvec.c's, this translation unit's */
#endif
    for (; d < D; d++) row[d] = bf16_float(bits[d]);
}

/* scores[r][0, 32) (rows ATTN_BLOCK apart) = the R query rows q[r] (D apart) against 32 keys, keys
 * transposed: keys_t[d * ATTN_BLOCK + s]. One register block: R x 32 sums, each key's vector loaded
 * once per d for all R rows. */
static inline __attribute__((always_inline)) void attn_scores(int R, const float *q, const float *keys_t, int64_t D, float *scores) {
    attn_vec acc[ATTN_ROWS][ATTN_CHUNK / ATTN_W];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < ATTN_CHUNK / ATTN_W; j++) acc[r][j] = attn_zero();
    for (int64_t d = 0; d < D; d++) {
        attn_vec k[ATTN_CHUNK / ATTN_W];
        for (int j = 0; j < ATTN_CHUNK / ATTN_W; j++) k[j] = attn_load(keys_t + d * ATTN_BLOCK + j * ATTN_W);
        for (int r = 0; r < R; r++) {
            const attn_vec qd = attn_set1(q[r * D + d]);
            for (int j = 0; j < ATTN_CHUNK / ATTN_W; j++) acc[r][j] = attn_fma(qd, k[j], acc[r][j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < ATTN_CHUNK / ATTN_W; j++) attn_store(scores + r * ATTN_BLOCK + j * ATTN_W, acc[r][j]);
}

/* out[r][0, width) (rows D + 2 apart) = sum over s < n of p[r][s] * values[s][0, width) for R rows
 * of weights p (ATTN_BLOCK apart); values [n, D] float32, width <= 32 and a multiple of 8. */
static inline __attribute__((always_inline)) void attn_weighted(int R, const float *p, const float *values, int64_t n, int64_t D, int width, float *out) {
    attn_vec acc[ATTN_ROWS][ATTN_CHUNK / ATTN_W];
    const int vectors = width / ATTN_W;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < vectors; j++) acc[r][j] = attn_zero();
    for (int64_t s = 0; s < n; s++) {
        attn_vec v[ATTN_CHUNK / ATTN_W];
        for (int j = 0; j < vectors; j++) v[j] = attn_load(values + s * D + j * ATTN_W);
        for (int r = 0; r < R; r++) {
            const attn_vec w = attn_set1(p[r * ATTN_BLOCK + s]);
            for (int j = 0; j < vectors; j++) acc[r][j] = attn_fma(w, v[j], acc[r][j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < vectors; j++) attn_store(out + r * (D + 2) + j * ATTN_W, acc[r][j]);
}

/* row[0, padded) = exp(row - top) (0 where row is -inf); returns their sum, in 8 lanes (position s in
 * lane s mod 8) then hsum8's tree. padded is a multiple of 8, the entries past the block -inf. */
static inline float attn_softmax_terms(float *row, int64_t padded, float top) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 sum = _mm256_setzero_ps();
    const __m256 shift = _mm256_set1_ps(top);
    for (int64_t s = 0; s < padded; s += 8) {
        const __m256 e = attn_exp8(_mm256_sub_ps(_mm256_loadu_ps(row + s), shift));
        _mm256_storeu_ps(row + s, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum8(sum);
#else
    float lanes[8] = {0};
    for (int64_t s = 0; s < padded; s++) lanes[s % 8] += row[s] = attn_exp1(row[s] - top);
    const float a0 = lanes[0] + lanes[4], a1 = lanes[1] + lanes[5], a2 = lanes[2] + lanes[6], a3 = lanes[3] + lanes[7];
    return (a0 + a2) + (a1 + a3);
#endif
}

typedef struct {
    const float *q;          /* [B, H, T, D] contiguous */
    const void *k, *v;       /* [pages, KV, page_len, D] with strides (elements) below; bf16 bits or float32 */
    int64_t k_strides[3], v_strides[3];
    const int64_t *pages;    /* [B, page_cols]: the page holding sequence b's positions [j, j + 1) * page_len */
    int64_t page_len, page_cols;
    int bf16;
    const uint8_t *visible;  /* [B, T, S] bool: which positions query t of sequence b sees */
    float *partial;          /* [B, H, t1 - t0, blocks, D + 2]: each row's blocks' max, sum, weighted values */
    float *out;              /* [B, H, T, D], laid out as [B, T, H, D] */
    const int32_t *ends;     /* [B, tiles, blocks]: how far into the block the tile's queries see (0: nothing) */
    const int64_t *items;    /* the (b, KV head, tile, block) indices whose end is not 0, in that order */
    int64_t B, H, KV, T, S, D, blocks;
    int64_t t0, t1, tile;    /* this pass's queries [t0, t1), cut into tiles of `tile` queries */
    float scale;
} AttentionLoop;

/* Where row (b, h, t)'s partial for block 0 lies; its later blocks follow it. */
static inline float *attn_partial(const AttentionLoop *a, int64_t b, int64_t h, int64_t t) {
    return a->partial + (((b * a->H + h) * (a->t1 - a->t0) + t - a->t0) * a->blocks) * (a->D + 2);
}

/* tmp [8, D] (rows D apart) into keys_t's columns [0, 8) (keys_t [D, ATTN_BLOCK]). */
static inline void attn_transpose8(const float *tmp, int64_t D, float *keys_t) {
    int64_t d = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; d + 8 <= D; d += 8) {
        __m256 r[8], u[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(tmp + i * D + d);
        for (int i = 0; i < 8; i += 2) u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        for (int i = 0; i < 8; i += 4) {
            r[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44), r[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xEE);
            r[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44), r[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
        }
        for (int i = 0; i < 4; i++) {  /* r[0..3]: columns d+0, d+1, d+2, d+3 of rows 0-3 | 4-7 in r[4..7] */
            _mm256_storeu_ps(keys_t + (d + i) * ATTN_BLOCK, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
            _mm256_storeu_ps(keys_t + (d + i + 4) * ATTN_BLOCK, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
        }
    }
#endif
    for (; d < D; d++)
        for (int i = 0; i < 8; i++) keys_t[d * ATTN_BLOCK + i] = tmp[i * D + d];
}

/* Where position p of sequence b's KV head `head` lies in a cache of pages (`base`: k or v, with
 * their strides). */
static inline const char *attn_position(const AttentionLoop *a, const void *base, const int64_t *strides, int64_t b,
                                        int64_t head, int64_t p) {
    const int64_t page = a->pages[b * a->page_cols + p / a->page_len];
    return (const char *)base + (page * strides[0] + head * strides[1] + p % a->page_len * strides[2]) * (a->bf16 ? 2 : 4);
}

/* The block's keys transposed (keys_t [D, ATTN_BLOCK]) and values ([n, D]) as float32 for the
 * positions s0 + [0, n) of sequence b's KV head that some row of the item sees (used[s]); zeros for
 * the others and, in keys_t, up to the next multiple of ATTN_CHUNK. */
static void attn_load_block(const AttentionLoop *a, int64_t b, int64_t head, int64_t s0, const uint8_t *used,
                            int64_t n, float *keys_t, float *values) {
    const int64_t D = a->D, padded = (n + ATTN_CHUNK - 1) / ATTN_CHUNK * ATTN_CHUNK;
    float tmp[8 * ATTN_MAX_DIM];
    for (int64_t s8 = 0; s8 < padded; s8 += 8) {
        for (int64_t s = s8; s < s8 + 8; s++) {
            if (s < n && used[s]) {
                attn_row(attn_position(a, a->k, a->k_strides, b, head, s0 + s), a->bf16, D, tmp + (s - s8) * D);
                attn_row(attn_position(a, a->v, a->v_strides, b, head, s0 + s), a->bf16, D, values + s * D);
            } else {
                memset(tmp + (s - s8) * D, 0, D * sizeof(float));
                if (s < n) memset(values + s * D, 0, D * sizeof(float));
            }
        }
        attn_transpose8(tmp, D, keys_t + s8);
    }
}

/* A row's scores times scale where it sees the position (s < n and seen[s]), -inf elsewhere up to
 * padded (a multiple of 8); returns their max. */
static inline float attn_mask_scale(float *row, const uint8_t *seen, int64_t n, int64_t padded, float scale) {
    float top = -INFINITY;
    int64_t s = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 tops = _mm256_set1_ps(-INFINITY);
    const __m256 hidden = _mm256_set1_ps(-INFINITY), by = _mm256_set1_ps(scale);
    for (; s + 8 <= n; s += 8) {
        const __m128i bytes = _mm_loadl_epi64((const __m128i *)(seen + s));
        const __m256 shown = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_setzero_si256()));
        const __m256 x = _mm256_blendv_ps(hidden, _mm256_mul_ps(_mm256_loadu_ps(row + s), by), shown);
        _mm256_storeu_ps(row + s, x);
        tops = _mm256_max_ps(tops, x);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, tops);
    for (int i = 0; i < 8; i++) top = lanes[i] > top ? lanes[i] : top;
#endif
    for (; s < padded; s++) {
        row[s] = s < n && seen[s] ? row[s] * scale : -INFINITY;
        top = row[s] > top ? row[s] : top;
    }
    return top;
}

/* The R rows' (ATTN_ROWS or 1) partial softmax over the block's n positions: scores (rows ATTN_BLOCK apart), each row's
 * max, scale and mask, its terms and sum, then its weighted values, into parts[r] [D + 2]. */
static void attn_rows_block(const AttentionLoop *a, int R, const float *const *q, const float *keys_t,
                            const float *values, const uint8_t *const *seen, int64_t n, float *scores, float *const *parts) {
    const int64_t D = a->D, chunks = (n + ATTN_CHUNK - 1) / ATTN_CHUNK, padded = (n + 7) / 8 * 8;
    float packed[ATTN_ROWS * ATTN_MAX_DIM];
    for (int r = 0; r < R; r++) memcpy(packed + r * D, q[r], D * sizeof(float));
    /* R is ATTN_ROWS or 1: constants once inlined, so the sums live in registers */
    for (int64_t c = 0; c < chunks; c++)
        if (R == ATTN_ROWS)
            attn_scores(ATTN_ROWS, packed, keys_t + c * ATTN_CHUNK, D, scores + c * ATTN_CHUNK);
        else
            attn_scores(1, packed, keys_t + c * ATTN_CHUNK, D, scores + c * ATTN_CHUNK);
    int live = 0;
    for (int r = 0; r < R; r++) {
        float *row = scores + r * ATTN_BLOCK;
        const float top = attn_mask_scale(row, seen[r], n, padded, a->scale);
        parts[r][0] = top;  /* -inf: the block is hidden from this row, and the merge skips it */
        if (top != -INFINITY) parts[r][1] = attn_softmax_terms(row, padded, top), live = 1;
        else memset(row, 0, padded * sizeof(float));
    }
    if (!live) return;
    float out[ATTN_ROWS * (ATTN_MAX_DIM + 2)];
    for (int64_t d0 = 0; d0 < D; d0 += ATTN_CHUNK) {
        if (D - d0 >= ATTN_CHUNK && R == ATTN_ROWS)
            attn_weighted(ATTN_ROWS, scores, values + d0, n, D, ATTN_CHUNK, out + d0);
        else if (D - d0 >= ATTN_CHUNK)
            attn_weighted(1, scores, values + d0, n, D, ATTN_CHUNK, out + d0);
        else
            for (int r = 0; r < R; r++)  /* the last columns, 8 at a time */
                for (int64_t d = d0; d < D; d += 8)
                    attn_weighted(1, scores + r * ATTN_BLOCK, values + d, n, D, 8, out + r * (D + 2) + d);
    }
    for (int r = 0; r < R; r++)
        if (parts[r][0] != -INFINITY) memcpy(parts[r] + 2, out + r * (D + 2), D * sizeof(float));
}

/* used[0, n) = whether any of the queries sees each position (their masks `S` apart). */
static inline void attn_union(const uint8_t *seen, int64_t S, int64_t queries, int64_t n, uint8_t *used) {
    memset(used, 0, n);
    for (int64_t t = 0; t < queries; t++) {
        const uint8_t *mask = seen + t * S;
        int64_t s = 0;
#if defined(__AVX2__) && defined(__FMA__)
        for (; s + 32 <= n; s += 32)
            _mm256_storeu_si256((__m256i *)(used + s), _mm256_or_si256(_mm256_loadu_si256((const __m256i *)(used + s)),
                                                                       _mm256_loadu_si256((const __m256i *)(mask + s))));
#endif
        for (; s < n; s++) used[s] |= mask[s];
    }
}

/* An item: one sequence, one KV head, one tile of queries and one block of positions. Its keys and
 * values are made float32 once for the tile's rows (every query of the tile, times every query head
 * of the KV head), which are then taken ATTN_ROWS at a time. */
static void attn_items(const void *loop, int64_t i0, int64_t i1) {
    const AttentionLoop *a = (const AttentionLoop *)loop;
    const int64_t D = a->D, G = a->H / a->KV, S = a->S;
    const int64_t tiles = (a->t1 - a->t0 + a->tile - 1) / a->tile;
    static __thread float keys_t[ATTN_MAX_DIM * ATTN_BLOCK], values[ATTN_BLOCK * ATTN_MAX_DIM];
    static __thread float scores[ATTN_ROWS * ATTN_BLOCK];
    uint8_t used[ATTN_BLOCK];
    for (int64_t i = i0; i < i1; i++) {
        const int64_t item = a->items[i], block = item % a->blocks, tile = item / a->blocks % tiles;
        const int64_t head = item / a->blocks / tiles % a->KV, b = item / a->blocks / tiles / a->KV;
        const int64_t s0 = block * ATTN_BLOCK, q0 = a->t0 + tile * a->tile;
        const int64_t queries = (q0 + a->tile < a->t1 ? q0 + a->tile : a->t1) - q0;
        const uint8_t *seen = a->visible + (b * a->T + q0) * S + s0;  /* query q0 + t's mask at seen + t * S */
        const int64_t n = a->ends[(b * tiles + tile) * a->blocks + block];
        attn_union(seen, S, queries, n, used);
        attn_load_block(a, b, head, s0, used, n, keys_t, values);
        for (int64_t i0r = 0, R; i0r < queries * G; i0r += R) {
            R = queries * G - i0r < ATTN_ROWS ? 1 : ATTN_ROWS;  /* the last rows one at a time */
            const float *q[ATTN_ROWS];
            const uint8_t *masks[ATTN_ROWS];
            float *parts[ATTN_ROWS];
            for (int r = 0; r < R; r++) {
                const int64_t t = (i0r + r) / G, h = head * G + (i0r + r) % G;
                q[r] = a->q + ((b * a->H + h) * a->T + q0 + t) * D;
                masks[r] = seen + t * S;
                parts[r] = attn_partial(a, b, h, q0 + t) + block * (D + 2);
            }
            attn_rows_block(a, (int)R, q, keys_t, values, masks, n, scores, parts);
        }
    }
}

/* Rows [r0, r1) of the pass (row = (b, h, t)): their blocks merged in block order into out, divided
 * by the merged sum (a row that sees nothing gets zeros). */
static void attn_merge(const void *loop, int64_t r0, int64_t r1) {
    const AttentionLoop *a = (const AttentionLoop *)loop;
    const int64_t D = a->D, rows = a->t1 - a->t0, tiles = (rows + a->tile - 1) / a->tile;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = a->t0 + r % rows, h = r / rows % a->H, b = r / rows / a->H;
        const int32_t *ends = a->ends + (b * tiles + (t - a->t0) / a->tile) * a->blocks;  /* 0: no item, no partial */
        const float *first = attn_partial(a, b, h, t);
        float top = -INFINITY, sum = 0.0f, *y = a->out + ((b * a->T + t) * a->H + h) * D;
        for (int64_t i = 0; i < a->blocks; i++)
            if (ends[i]) top = first[i * (D + 2)] > top ? first[i * (D + 2)] : top;
        memset(y, 0, D * sizeof(float));
        if (top == -INFINITY) continue;
        for (int64_t i = 0; i < a->blocks; i++) {
            const float *part = first + i * (D + 2);
            if (!ends[i] || part[0] == -INFINITY) continue;
            const float w = expf(part[0] - top);
            sum += w * part[1];
            for (int64_t d = 0; d < D; d++) y[d] += w * part[2 + d];
        }
        for (int64_t d = 0; d < D; d++) y[d] /= sum;
    }
}

/* The pass's items: for each sequence, tile and block how far into the block the tile's queries see
 * (ends; a causal chunk's diagonal block is cut short there, and past it every score is -inf, so the
 * rows' sums are the same), and the items whose end is not 0 (items). Leaving out the blocks no query
 * sees keeps the items' costs alike, so the pool does not take a long item for a stalled thread.
 * Returns the number of items. */
static int64_t attn_plan(const AttentionLoop *a, int32_t *ends, int64_t *items) {
    const int64_t tiles = (a->t1 - a->t0 + a->tile - 1) / a->tile;
    uint8_t used[ATTN_BLOCK];
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t tile = 0; tile < tiles; tile++)
            for (int64_t block = 0; block < a->blocks; block++) {
                const int64_t s0 = block * ATTN_BLOCK, q0 = a->t0 + tile * a->tile;
                const int64_t queries = (q0 + a->tile < a->t1 ? q0 + a->tile : a->t1) - q0;
                int64_t n = (s0 + ATTN_BLOCK < a->S ? s0 + ATTN_BLOCK : a->S) - s0;
                attn_union(a->visible + (b * a->T + q0) * a->S + s0, a->S, queries, n, used);
                while (n > 0 && !used[n - 1]) n--;
                ends[(b * tiles + tile) * a->blocks + block] = (int32_t)n;
            }
    int64_t count = 0;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t head = 0; head < a->KV; head++)
            for (int64_t tile = 0; tile < tiles; tile++)
                for (int64_t block = 0; block < a->blocks; block++)
                    if (ends[(b * tiles + tile) * a->blocks + block])
                        items[count++] = ((b * a->KV + head) * tiles + tile) * a->blocks + block;
    return count;
}

/* out [B, H, T, D] float32, laid out as [B, T, H, D] (the heads of a query side by side): softmax(q k^T * scale, over each query's visible positions) v. q [B, H, T, D]
 * float32 (T new queries per sequence: 1 in a decode step, a prompt's chunk in prefill); k, v
 * [pages, KV, page_len, D] bfloat16 (bf16 = 1) or float32, strided, the KV cache's pages; pages
 * [B, page_cols] (page_cols * page_len >= S), which page holds each run of page_len positions of
 * sequence b, every one in range; visible [B, T, S] bool. A query's result does
 * not depend on T, the batch or the threads: a position decoded alone gets the bits prefill gives it.
 * Queries are taken in passes whose partials fit ATTN_SCRATCH floats. Returns 0, or -1 if H / KV
 * query heads exceed ATTN_MAX_GROUP, D exceeds ATTN_MAX_DIM or is not a multiple of 8, or the scratch
 * could not be allocated. */
#ifdef __cplusplus
extern "C"
#endif
int ts_llm_attention(const float *q, const void *k, const int64_t *k_strides, const void *v, const int64_t *v_strides,
                     int bf16, const int64_t *pages, int64_t page_len, int64_t page_cols, const uint8_t *visible, float *out, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S,
                     int64_t D, float scale, int threads) {
    if (KV <= 0 || H % KV || H / KV > ATTN_MAX_GROUP || D > ATTN_MAX_DIM || D % 8) return -1;
    const int64_t G = H / KV, blocks = (S + ATTN_BLOCK - 1) / ATTN_BLOCK, per_query = B * H * blocks * (D + 2);
    const int64_t tile = G < ATTN_TILE_ROWS ? ATTN_TILE_ROWS / G : 1;
    int64_t pass = ATTN_SCRATCH / per_query / tile * tile;
    pass = pass < tile ? tile : pass > T ? T : pass;
    const int64_t most_tiles = (pass + tile - 1) / tile, most_items = B * KV * most_tiles * blocks;
    const int64_t need = pass * per_query + most_items * 2 + B * most_tiles * blocks;  /* floats: partials, items, ends */
    static __thread float *scratch;  /* grown, never freed: a step's layers reuse it */
    static __thread int64_t held;
    if (need > held) {
        float *grown = (float *)realloc(scratch, need * sizeof(float));
        if (!grown) return -1;
        scratch = grown, held = need;
    }
    int64_t *items = (int64_t *)(scratch + pass * per_query);  /* 8-byte aligned: pass * per_query is even */
    int32_t *ends = (int32_t *)(items + most_items);
    const int solo = B * H * T * S < ATTN_SOLO_WORK;
    for (int64_t t0 = 0; t0 < T; t0 += pass) {
        AttentionLoop loop = {q, k, v, {k_strides[0], k_strides[1], k_strides[2]}, {v_strides[0], v_strides[1], v_strides[2]},
                              pages, page_len, page_cols, bf16, visible, scratch, out, ends, items, B, H, KV, T, S, D, blocks, t0,
                              t0 + pass < T ? t0 + pass : T, tile, scale};
        const int64_t count = attn_plan(&loop, ends, items), rows = B * H * (loop.t1 - t0);
        if (solo) {
            attn_items(&loop, 0, count);
            attn_merge(&loop, 0, rows);
        } else {
            pool_for(threads, count, attn_items, &loop);
            pool_for(threads, rows, attn_merge, &loop);
        }
    }
    return 0;
}
