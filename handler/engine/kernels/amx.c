/* quantized.c's int4 and int8 products at several rows (decode batches, prefill chunks) on AMX-INT8
 * tiles, where the CPU has them and Linux granted this process their state (platform.py asks).
 *
 * Same numbers, other instructions: x rows are rounded by quantized.c's round_block, every block's
 * integer sums are exact either way, and the float steps (d * sx scaling, the fused multiply-add,
 * the Q4_1 minimum's term, the order of blocks) are quantized.c's, lane for lane; so a row's result
 * is bit for bit what the vector path gives it alone (tests/engine/quant hold them to that).
 *
 * One tile product covers 16 x rows by 16 weight rows (two of the layout's row groups) by a block of
 * 32 columns: A is x, int8 [16 rows, 32]; B holds the tiles' "4 bytes of K per column" form, which
 * is quantized.c's packed layout of a row group's block (byte 32 c + 4 r + i) with the two groups'
 * 32-byte rows side by side. int8 blocks are taken as they lie; int4 blocks are split into low and
 * high nibbles (B rows 0-3 and 4-7; Q4_0's less 8, so the sums are already sum (q - 8) xq), so x's
 * 4-column chunks go in the order 0, 2, 4, 6, 1, 3, 5, 7 (columns 8 c + i, then 8 c + 4 + i).
 *   C[m, n] = sum_k x[m, k] w[n, k]  ->  acc[m] (16 n lanes) += float(C[m]) * d[n] sx[m]
 * Tiles: 0-1 A, 2-3 B, 4-5 C (two blocks at a time, see tile_pair). */
#if defined(HAVE_TILES) /* quantized.c */

#define AMX_ROWS 16 /* x rows per tile */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* x rows rounded for the tiles, one tile of AMX_ROWS rows after another (rows past M are zero):
 * a int8 [tiles, K/32, 16, 32] (int4: chunks reordered, above); scale and sum float
 * [tiles, K/32, 16]. */
typedef struct {
    int8_t *a;
    float *scale;
    float *sum;
} TileRows;

static const int NIBBLE_CHUNKS[8] = {0, 2, 4, 6, 1, 3, 5, 7};

static TileRows round_for_tiles(int bits, const float *x, int64_t M, int64_t K) {
    const int64_t blocks = K / BLOCK, tiles = (M + AMX_ROWS - 1) / AMX_ROWS, slots = tiles * blocks * AMX_ROWS;
    const size_t size = slots * (BLOCK + 2 * sizeof(float));  /* a multiple of 64: slots is of 16 */
    char *mem = (char *)aligned_alloc(64, size);
    memset(mem, 0, size);
    const TileRows out = {(int8_t *)mem, (float *)(mem + slots * BLOCK), (float *)(mem + slots * BLOCK) + slots};
    for (int64_t row = 0; row < M; row++)
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t at = (row / AMX_ROWS * blocks + b) * AMX_ROWS + row % AMX_ROWS;
            int8_t q[BLOCK];
            int32_t qsum8, qhalf[2];  /* not needed: the tiles subtract Q4_0's 8 from the weights */
            round_block(x + row * K + b * BLOCK, q, out.scale + at, out.sum + at, &qsum8, qhalf);
            for (int c = 0; c < 8; c++)
                memcpy(out.a + at * BLOCK + 4 * c, q + 4 * (bits == 4 ? NIBBLE_CHUNKS[c] : c), 4);
        }
    return out;
}

/* One block of a row group as 4 vectors of two B rows each (32 bytes a row): int8 as it lies;
 * int4 split into low nibbles (rows 0-3) and high (rows 4-7), less 8 when centred (Q4_0: then the
 * tiles' sums are already sum (q - 8) xq). No group (an odd last one): zeros. */
static inline void group_rows_of_block(int bits, int centred, const uint8_t *w, __m512i v[4]) {
    if (!w) {
        for (int j = 0; j < 4; j++) v[j] = _mm512_setzero_si512();
    } else if (bits == 8) {
        for (int j = 0; j < 4; j++) v[j] = _mm512_loadu_si512(w + 64 * j);
    } else {
        const __m512i low = _mm512_set1_epi8(0x0F), z0 = _mm512_loadu_si512(w), z1 = _mm512_loadu_si512(w + 64);
        v[0] = _mm512_and_si512(z0, low), v[1] = _mm512_and_si512(z1, low);
        v[2] = _mm512_and_si512(_mm512_srli_epi16(z0, 4), low), v[3] = _mm512_and_si512(_mm512_srli_epi16(z1, 4), low);
        if (centred)
            for (int j = 0; j < 4; j++) v[j] = _mm512_sub_epi8(v[j], _mm512_set1_epi8(8));
    }
}

/* B for one block of two row groups: 8 rows of 64 bytes, row k = group 0's row k, then group 1's */
static inline void pair_block(int bits, int centred, const uint8_t *w0, const uint8_t *w1, uint8_t *b) {
    __m512i g0[4], g1[4];
    group_rows_of_block(bits, centred, w0, g0);
    group_rows_of_block(bits, centred, w1, g1);
    for (int j = 0; j < 4; j++) {  /* 128-bit lanes: rows 2j (lanes 0-1 of each) and 2j + 1 (lanes 2-3) */
        _mm512_store_si512(b + 128 * j, _mm512_shuffle_i64x2(g0[j], g1[j], 0x44));
        _mm512_store_si512(b + 128 * j + 64, _mm512_shuffle_i64x2(g0[j], g1[j], 0xEE));
    }
}

/* 16 float16s, 8 from each group (the second may be absent: zeros) */
static inline __m512 half16(const uint16_t *p0, const uint16_t *p1) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)p0), hi = p1 ? _mm_loadu_si128((const __m128i *)p1) : _mm_setzero_si128();
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* One block's C tile -> acc for the first R rows of the tile (inlined with a constant R); g: its group */
static inline __attribute__((always_inline)) void scale_sums(int R, const int32_t (*c)[16], int minimum,
                                                             const uint16_t *d0, const uint16_t *d1, const uint16_t *m0,
                                                             const uint16_t *m1, int64_t g, const TileRows *x,
                                                             int64_t at, __m512 *acc, __m512 *offset) {
    const __m512 scale = half16(d0 + ROWS * g, d1 ? d1 + ROWS * g : NULL);
    const __m512 min = minimum ? half16(m0 + ROWS * g, m1 ? m1 + ROWS * g : NULL) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        const __m512i isum = _mm512_load_si512(c[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(scale, _mm512_set1_ps(x->scale[at + r])), acc[r]);
        if (minimum) offset[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(x->sum[at + r]), offset[r]);
    }
}

/* int8 x int8 (int8 weights, centred int4), or int8 x uint8 (int4 with a minimum: nibbles 0-15) */
#define TILE_PRODUCT(minimum, c, a, b) do { if (minimum) _tile_dpbsud(c, a, b); else _tile_dpbssd(c, a, b); } while (0)

/* B for blocks k and k + 1 (if any) of the two groups */
static inline void pair_blocks(int bits, int centred, const uint8_t *q0, const uint8_t *q1, int64_t k, int64_t blocks,
                               uint8_t (*b)[8 * 64]) {
    const int64_t bytes = block_bytes(bits);
    for (int64_t i = k; i < k + 2 && i < blocks; i++) {
        prefetch_block(bits, q0 + i * bytes);
        if (q1) prefetch_block(bits, q1 + i * bytes);
        pair_block(bits, centred, q0 + i * bytes, q1 ? q1 + i * bytes : NULL, b[i - k]);
    }
}

/* y[0..stored)[0..16) (8 when q1 is NULL: an odd last group) for one tile of x rows and two row
 * groups, computing R >= stored rows. Blocks go two at a time on their own tiles (A 0-1, B 2-3, C
 * 4-5), in a pipeline of three stages a pair of blocks apart: B is split out of the weights one
 * step ahead (a tile load waits for vector stores to reach the cache), and a step's sums are
 * scaled after the next step's products are issued (they wait for their tile stores): tiles are
 * not renamed, so in one straight line every block waited for the last one's. */
static inline __attribute__((always_inline)) void tile_pair(int bits, int R, int64_t stored, const TileRows *x, int64_t tile,
                                                            const uint8_t *q0, const uint8_t *q1, const uint16_t *d0,
                                                            const uint16_t *d1, const uint16_t *m0, const uint16_t *m1,
                                                            float *y, int64_t ldy, int64_t K, int64_t G) {
    const int minimum = bits == 4 && m0 != NULL, centred = bits == 4 && m0 == NULL;
    const int64_t blocks = K / BLOCK, per_group = G / BLOCK, first = tile * blocks * AMX_ROWS;
    int32_t c[2][2][AMX_ROWS][16] __attribute__((aligned(64)));  /* [step parity][block of the step] */
    uint8_t b[2][2][8 * 64] __attribute__((aligned(64)));
    __m512 acc[AMX_ROWS], offset[AMX_ROWS];
    for (int r = 0; r < R; r++) acc[r] = offset[r] = _mm512_setzero_ps();
    pair_blocks(bits, centred, q0, q1, 0, blocks, b[0]);
    for (int64_t k = 0; k < blocks + 2; k += 2) {
        const int s = (k / 2) & 1;
        if (k < blocks) {
            if (k + 2 < blocks) pair_blocks(bits, centred, q0, q1, k + 2, blocks, b[!s]);
            _tile_loadd(0, x->a + (first + k * AMX_ROWS) * BLOCK, BLOCK);
            _tile_loadd(2, b[s][0], 64);
            _tile_zero(4);
            TILE_PRODUCT(minimum, 4, 0, 2);
            if (k + 1 < blocks) {
                _tile_loadd(1, x->a + (first + (k + 1) * AMX_ROWS) * BLOCK, BLOCK);
                _tile_loadd(3, b[s][1], 64);
                _tile_zero(5);
                TILE_PRODUCT(minimum, 5, 1, 3);
            }
            _tile_stored(4, c[s][0], 64);
            if (k + 1 < blocks) _tile_stored(5, c[s][1], 64);
        }
        for (int64_t i = k - 2; k > 0 && i < k && i < blocks; i++) {  /* the previous step's blocks */
            const int64_t g = per_group == 1 ? i : i / per_group;
            scale_sums(R, c[!s][i - (k - 2)], minimum, d0, d1, m0, m1, g, x, first + i * AMX_ROWS, acc, offset);
        }
    }
    const __mmask16 lanes = q1 ? 0xFFFF : 0x00FF;
    for (int r = 0; r < R && r < stored; r++) _mm512_mask_storeu_ps(y + r * ldy, lanes, _mm512_add_ps(acc[r], offset[r]));
}

/* one pair of row groups against every tile of x rows; a tile's rows rounded up to 4, 8 or 16 for
 * the scaling (the tiles always hold 16, zeros past M), so each form keeps its accumulators in
 * registers */
static inline __attribute__((always_inline)) void pair_rows(int bits, const TileRows *x, int64_t M, const uint8_t *q0,
                                                            const uint8_t *q1, const uint16_t *d0, const uint16_t *d1,
                                                            const uint16_t *m0, const uint16_t *m1, float *y, int64_t N,
                                                            int64_t K, int64_t G) {
    for (int64_t t = 0; t * AMX_ROWS < M; t++) {
        const int64_t R = M - t * AMX_ROWS < AMX_ROWS ? M - t * AMX_ROWS : AMX_ROWS;
        float *yt = y + t * AMX_ROWS * N;
        if (R > 8) tile_pair(bits, 16, R, x, t, q0, q1, d0, d1, m0, m1, yt, N, K, G);
        else if (R > 4) tile_pair(bits, 8, R, x, t, q0, q1, d0, d1, m0, m1, yt, N, K, G);
        else tile_pair(bits, 4, R, x, t, q0, q1, d0, d1, m0, m1, yt, N, K, G);
    }
}

/* One loop over pairs of row groups: what tiles_linear hands the pool (pool.c). */
typedef struct {
    const TileRows *rows;
    const TileConfig *config;
    const uint8_t *q;
    const uint16_t *d, *m;
    float *y;
    int64_t M, N, K, G, groups, stride;
    int bits;
} TilesLoop;

/* pairs [p0, p1); the tile configuration is per thread, loaded for each chunk and released after it */
static void tile_pairs(const void *loop, int64_t p0, int64_t p1) {
    const TilesLoop *a = (const TilesLoop *)loop;
    const int64_t N = a->N, groups = a->groups, stride = a->stride;
    const uint8_t *q = a->q;
    const uint16_t *d = a->d, *m = a->m;
    _tile_loadconfig(a->config);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t g0 = 2 * p, g1 = g0 + 1 < N / ROWS ? g0 + 1 : -1;
        const uint8_t *q1 = g1 < 0 ? NULL : q + g1 * stride;
        const uint16_t *d1 = g1 < 0 ? NULL : d + g1 * groups * ROWS, *m1 = g1 < 0 || !m ? NULL : m + g1 * groups * ROWS;
        const uint16_t *d0 = d + g0 * groups * ROWS, *m0 = m ? m + g0 * groups * ROWS : NULL;
        if (a->bits == 8) pair_rows(8, a->rows, a->M, q + g0 * stride, q1, d0, d1, NULL, NULL, a->y + g0 * ROWS, N, a->K, a->G);
        else if (!m) pair_rows(4, a->rows, a->M, q + g0 * stride, q1, d0, d1, NULL, NULL, a->y + g0 * ROWS, N, a->K, a->G);
        else pair_rows(4, a->rows, a->M, q + g0 * stride, q1, d0, d1, m0, m1, a->y + g0 * ROWS, N, a->K, a->G);
    }
    _tile_release();
}

static void tiles_linear(int bits, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m, float *y,
                         int64_t M, int64_t N, int64_t K, int64_t G, int threads) {
    const TileRows rows = round_for_tiles(bits, x, M, K);
    TileConfig config = {1, 0, {0}, {0}, {0}};
    for (int t = 0; t < 2; t++) {
        config.rows[t] = AMX_ROWS, config.colsb[t] = BLOCK;  /* A: 16 x rows of one block */
        config.rows[t + 2] = BLOCK / 4, config.colsb[t + 2] = 64;  /* B: 8 rows of 4 columns of 16 weight rows */
        config.rows[t + 4] = AMX_ROWS, config.colsb[t + 4] = 64;  /* C: 16 x 16 int32 */
    }
    const TilesLoop loop = {&rows, &config, q, d, m, y, M, N, K, G, K / G, K / BLOCK * block_bytes(bits), bits};
    pool_for(threads, (N / ROWS + 1) / 2, tile_pairs, &loop);
    free(rows.a);
}

#endif
