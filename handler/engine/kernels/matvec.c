/* bf16 weights times float32 rows on CPU: y[M, N] = x[M, K] . W[N, K]^T in float32, W bfloat16
 * in its plain row-major layout (as loaded; no copy). */
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define MATVEC_PREFETCH 2048 /* bytes ahead of the row being read: measured best from 512 to 4096 */

static inline float bf16_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* R rows of x (ldx apart) against one weight row into y[0], y[ldy], ...: each 8 weights are
 * loaded and widened once for all R rows. Four independent sums for one row (one would wait on
 * the add latency every 8 columns), two per row for more (8 for R = 4: what 16 registers hold). */
static inline __attribute__((always_inline)) void dot_rows(int R, const float *x, int64_t ldx, const uint16_t *w,
                                                           int64_t K, float *y, int64_t ldy) {
    enum { MAXR = 4 };
    const int A = R == 1 ? 4 : 2;
    __m256 acc[MAXR][4];
    for (int r = 0; r < R; r++)
        for (int a = 0; a < A; a++) acc[r][a] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 * A <= K; k += 8 * A) {
        _mm_prefetch((const char *)(w + k) + MATVEC_PREFETCH, _MM_HINT_T0);
        for (int a = 0; a < A; a++) {
            const __m256 wv = bf16x8(w + k + 8 * a);
            for (int r = 0; r < R; r++) acc[r][a] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * ldx + k + 8 * a), acc[r][a]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        const __m256 wv = bf16x8(w + k);
        for (int r = 0; r < R; r++) acc[r][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * ldx + k), acc[r][0]);
    }
    for (int r = 0; r < R; r++) {
        __m256 s = A == 4 ? _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]))
                          : _mm256_add_ps(acc[r][0], acc[r][1]);
        float sum = hsum8(s);
        for (int64_t j = k; j < K; j++) sum += x[r * ldx + j] * bf16_float(w[j]);
        y[r * ldy] = sum;
    }
}
#else
static inline void dot_rows(int R, const float *x, int64_t ldx, const uint16_t *w, int64_t K, float *y, int64_t ldy) {
    for (int r = 0; r < R; r++) {
        float sum[8] = {0};
        int64_t k = 0;
        for (; k + 8 <= K; k += 8)
            for (int j = 0; j < 8; j++) sum[j] += x[r * ldx + k + j] * bf16_float(w[k + j]);
        float total = 0;
        for (int j = 0; j < 8; j++) total += sum[j];
        for (; k < K; k++) total += x[r * ldx + k] * bf16_float(w[k]);
        y[r * ldy] = total;
    }
}
#endif

/* One loop over blocks of NB weight rows: what ts_llm_bf16_linear hands the pool (pool.c). */
#define NB 8
typedef struct {
    const float *x;
    const uint16_t *w;
    float *y;
    int64_t M, N, K;
} MatvecLoop;

static void bf16_blocks(const void *loop, int64_t b0, int64_t b1) {
    const MatvecLoop *a = (const MatvecLoop *)loop;
    const float *x = a->x;
    const uint16_t *w = a->w;
    float *y = a->y;
    const int64_t M = a->M, N = a->N, K = a->K;
    for (int64_t n0 = b0 * NB; n0 < b1 * NB && n0 < N; n0 += NB) {
        const int64_t n1 = n0 + NB < N ? n0 + NB : N;
        int64_t r = 0;
        for (; r + 4 <= M; r += 4)
            for (int64_t n = n0; n < n1; n++) dot_rows(4, x + r * K, K, w + n * K, K, y + r * N + n, N);
        for (int64_t n = n0; n < n1; n++) {
            switch (M - r) {
                case 3: dot_rows(3, x + r * K, K, w + n * K, K, y + r * N + n, N); break;
                case 2: dot_rows(2, x + r * K, K, w + n * K, K, y + r * N + n, N); break;
                case 1: dot_rows(1, x + r * K, K, w + n * K, K, y + r * N + n, N); break;
            }
        }
    }
}

/* x [M, K] and y [M, N] float32, w [N, K] bfloat16 bits, all contiguous. Each weight row is read
 * from memory once, for all M rows of x, four at a time: blocks of NB weight rows meet each tile
 * of 4 x rows while both are in cache. */
#ifdef __cplusplus
extern "C"
#endif
void ts_llm_bf16_linear(const float *x, const uint16_t *w, float *y, int64_t M, int64_t N, int64_t K, int threads) {
    const MatvecLoop loop = {x, w, y, M, N, K};
    pool_for(threads, (N + NB - 1) / NB, bf16_blocks, &loop);
}
