/* Decode attention on CPU: one new query row per sequence against its cached keys and values,
 * on the kernels' pool (pool.c). Compiled graphs ran it as Inductor's fused reductions on torch's
 * one thread (threading: pool), so at long contexts it held a decode step on one core.
 *
 * The work is cut into items of one sequence, one KV head and one block of ATTN_BLOCK positions;
 * an item computes its block's scores for the query heads sharing that KV head, their max, the
 * sum of exp(score - max) and the values weighted by it (the partial softmax of flash decoding).
 * The caller then merges each row's blocks in block order. The block size is fixed, so a row's
 * sums are the same whatever the batch, the context's other rows or the threads. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ATTN_BLOCK 256       /* positions per item */
#define ATTN_MAX_GROUP 32    /* query heads per KV head */
#define ATTN_MAX_DIM 512    /* head dimension */
#define ATTN_SOLO_WORK 2048  /* rows x positions below which the caller runs it alone (waking costs more) */

#if defined(__AVX2__) && defined(__FMA__)
/* exp(x) of 8 lanes for x <= 0 (Cephes' expf: 2^n times a polynomial in the remainder, ~1 ulp);
 * below -87 (and -inf: a hidden position) it is 0. */
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
#endif

/* Row i (`stride` elements apart) of a bf16 or float32 matrix as float32 into row[D]. */
static inline void attn_row(const void *base, int bf16, int64_t i, int64_t stride, int64_t D, float *row) {
    if (!bf16) {
        memcpy(row, (const float *)base + i * stride, D * sizeof(float));
        return;
    }
    const uint16_t *bits = (const uint16_t *)base + i * stride;
    int64_t d = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(row + d, bf16x8(bits + d));  /* matvec.c's, this translation unit's */
#endif
    for (; d < D; d++) row[d] = bf16_float(bits[d]);
}

/* scores[s] = q . keys[s] for 8 rows of keys [8, D] (float32): each key's sum over D in 8 lanes,
 * then the 8 keys' lanes summed together in one tree; the same order on every call. */
static inline void attn_dot8(const float *q, const float *keys, int64_t D, float *scores) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[8];
    for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int k = 0; k < 8; k++) acc[k] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + k * D + d), acc[k]);
    }
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
    _mm256_storeu_ps(scores, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
#else
    for (int k = 0; k < 8; k++) {
        float total = 0.0f;
        for (int64_t d = 0; d < D; d++) total += q[d] * keys[k * D + d];
        scores[k] = total;
    }
#endif
}

/* out[0, D) = sum over s < n of p[s] * values[s] ([n, D] float32), in positions' order. */
static inline void attn_weighted(const float *p, const float *values, int64_t n, int64_t D, float *out) {
#if defined(__AVX2__) && defined(__FMA__)
    for (int64_t d0 = 0; d0 < D; d0 += 64) {  /* 8 vectors of sums held in registers */
        const int width = D - d0 < 64 ? (int)(D - d0) / 8 : 8;
        __m256 acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t s = 0; s < n; s++) {
            if (p[s] == 0.0f) continue;
            const __m256 w = _mm256_set1_ps(p[s]);
            for (int j = 0; j < width; j++) acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values + s * D + d0 + 8 * j), acc[j]);
        }
        for (int j = 0; j < width; j++) _mm256_storeu_ps(out + d0 + 8 * j, acc[j]);
    }
#else
    memset(out, 0, D * sizeof(float));
    for (int64_t s = 0; s < n; s++)
        for (int64_t d = 0; d < D; d++) out[d] += p[s] * values[s * D + d];
#endif
}

/* row[0, n) = exp(row - top), 0 where row is -inf; returns their sum. Whole vectors over `padded`
 * (n rounded up to 8, the entries past n already -inf), so no position takes a scalar tail. */
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
    float sum = 0.0f;
    for (int64_t s = 0; s < padded; s++) sum += row[s] = row[s] == -INFINITY ? 0.0f : expf(row[s] - top);
    return sum;
#endif
}

typedef struct {
    const float *q;          /* [B, H, D] contiguous */
    const void *k, *v;       /* [B, KV, S, D] with strides (elements) below; bf16 bits or float32 */
    int64_t k_strides[3], v_strides[3];
    int bf16;
    const uint8_t *visible;  /* [B, S] bool: which positions row b sees */
    float *partial;          /* [B, KV, blocks, G, D + 2]: max, sum, weighted values */
    int64_t B, H, KV, S, D, blocks;
    float scale;
} AttentionLoop;

/* An item's block, positions [s0, s1) of one sequence and KV head: for each of its G query rows the
 * partial softmax (max, sum, weighted values) into out [G, D + 2]. */
static void attn_block(const AttentionLoop *a, const float *q, const void *keys, const void *values,
                       const uint8_t *seen, int64_t G, int64_t s0, int64_t s1, float *out) {
    const int64_t D = a->D, n = s1 - s0, padded = (n + 7) / 8 * 8;
    static __thread float rows[ATTN_BLOCK * ATTN_MAX_DIM], scores[ATTN_MAX_GROUP * ATTN_BLOCK];
    /* the keys as float32 (hidden ones and those past s1 as zeros), 8 at a time against each query row */
    for (int64_t s = 0; s < padded; s++) {
        if (s < n && seen[s0 + s])
            attn_row(keys, a->bf16, s0 + s, a->k_strides[2], D, rows + s * D);
        else
            memset(rows + s * D, 0, D * sizeof(float));
    }
    for (int64_t g = 0; g < G; g++) {
        float *row = scores + g * ATTN_BLOCK, top = -INFINITY;
        for (int64_t s = 0; s < padded; s += 8) attn_dot8(q + g * D, rows + s * D, D, row + s);
        for (int64_t s = 0; s < padded; s++) {
            row[s] = s < n && seen[s0 + s] ? row[s] * a->scale : -INFINITY;
            top = row[s] > top ? row[s] : top;
        }
        out[g * (D + 2)] = top;  /* -inf: the block is hidden from this row, and the merge skips it */
        out[g * (D + 2) + 1] = top == -INFINITY ? 0.0f : attn_softmax_terms(row, padded, top);
    }
    /* the values as float32, each read once for the G rows */
    for (int64_t s = 0; s < n; s++)
        if (seen[s0 + s]) attn_row(values, a->bf16, s0 + s, a->v_strides[2], D, rows + s * D);
    for (int64_t g = 0; g < G; g++) {
        if (out[g * (D + 2)] == -INFINITY)
            memset(out + g * (D + 2) + 2, 0, D * sizeof(float));
        else
            attn_weighted(scores + g * ATTN_BLOCK, rows, n, D, out + g * (D + 2) + 2);
    }
}

static void attn_items(const void *loop, int64_t i0, int64_t i1) {
    const AttentionLoop *a = (const AttentionLoop *)loop;
    const int64_t D = a->D, G = a->H / a->KV, elem = a->bf16 ? 2 : 4;
    for (int64_t item = i0; item < i1; item++) {
        const int64_t block = item % a->blocks, head = item / a->blocks % a->KV, b = item / a->blocks / a->KV;
        const int64_t s0 = block * ATTN_BLOCK, s1 = s0 + ATTN_BLOCK < a->S ? s0 + ATTN_BLOCK : a->S;
        attn_block(a, a->q + (b * a->H + head * G) * D,
                   (const char *)a->k + (b * a->k_strides[0] + head * a->k_strides[1]) * elem,
                   (const char *)a->v + (b * a->v_strides[0] + head * a->v_strides[1]) * elem, a->visible + b * a->S, G,
                   s0, s1, a->partial + item * G * (D + 2));
    }
}

/* out [B, H, D] float32: softmax(q k^T * scale, over the visible positions) v, each row's blocks
 * merged in order (a row that sees nothing gets zeros). q [B, H, D] float32; k, v [B, KV, S, D]
 * bfloat16 (bf16 = 1) or float32, strided; visible [B, S] bool. Returns 0, or -1 if H / KV query
 * heads exceed ATTN_MAX_GROUP, D exceeds ATTN_MAX_DIM or is not a multiple of 8, or the scratch could not be allocated. */
#ifdef __cplusplus
extern "C"
#endif
int ts_llm_decode_attention(const float *q, const void *k, const int64_t *k_strides, const void *v,
                            const int64_t *v_strides, int bf16, const uint8_t *visible, float *out, int64_t B,
                            int64_t H, int64_t KV, int64_t S, int64_t D, float scale, int threads) {
    if (KV <= 0 || H % KV || H / KV > ATTN_MAX_GROUP || D > ATTN_MAX_DIM || D % 8) return -1;
    const int64_t G = H / KV, blocks = (S + ATTN_BLOCK - 1) / ATTN_BLOCK, need = B * H * blocks * (D + 2);
    static __thread float *scratch;  /* grown, never freed: a step's layers reuse it */
    static __thread int64_t held;
    if (need > held) {
        float *grown = (float *)realloc(scratch, need * sizeof(float));
        if (!grown) return -1;
        scratch = grown, held = need;
    }
    AttentionLoop loop = {q, k, v, {k_strides[0], k_strides[1], k_strides[2]}, {v_strides[0], v_strides[1], v_strides[2]},
                          bf16, visible, scratch, B, H, KV, S, D, blocks, scale};
    if (B * H * S < ATTN_SOLO_WORK)
        attn_items(&loop, 0, B * KV * blocks);
    else
        pool_for(threads, B * KV * blocks, attn_items, &loop);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *first = scratch + ((b * KV + h / G) * blocks * G + h % G) * (D + 2);
            const int64_t step = G * (D + 2);  /* from one block's partial of row (b, h) to the next's */
            float top = -INFINITY, sum = 0.0f, *y = out + (b * H + h) * D;
            for (int64_t i = 0; i < blocks; i++) top = first[i * step] > top ? first[i * step] : top;
            memset(y, 0, D * sizeof(float));
            if (top == -INFINITY) continue;
            for (int64_t i = 0; i < blocks; i++) {
                const float *part = first + i * step;
                if (part[0] == -INFINITY) continue;
                const float w = expf(part[0] - top);
                sum += w * part[1];
                for (int64_t d = 0; d < D; d++) y[d] += w * part[2 + d];
            }
            for (int64_t d = 0; d < D; d++) y[d] /= sum;
        }
    return 0;
}
