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

/* four independent sums (one would wait on the add latency every 8 columns) */
static float dot_bf16(const float *x, const uint16_t *w, int64_t K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        _mm_prefetch((const char *)(w + k) + MATVEC_PREFETCH, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(bf16x8(w + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(bf16x8(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(bf16x8(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(bf16x8(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(bf16x8(w + k), _mm256_loadu_ps(x + k), a0);
    float sum = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < K; k++) sum += x[k] * bf16_float(w[k]);
    return sum;
}
#else
static float dot_bf16(const float *x, const uint16_t *w, int64_t K) {
    float sum[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++) sum[j] += x[k + j] * bf16_float(w[k + j]);
    float total = 0;
    for (int j = 0; j < 8; j++) total += sum[j];
    for (; k < K; k++) total += x[k] * bf16_float(w[k]);
    return total;
}
#endif

/* x [M, K] and y [M, N] float32, w [N, K] bfloat16 bits, all contiguous. Each weight row is read
 * from memory once, for all M rows of x (it stays in cache between them). */
#ifdef __cplusplus
extern "C"
#endif
void ts_llm_bf16_linear(const float *x, const uint16_t *w, float *y, int64_t M, int64_t N, int64_t K, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++)
        for (int64_t r = 0; r < M; r++) y[r * N + n] = dot_bf16(x + r * K, w + n * K, K);
}
