/* The CPU kernels of ts_llm::quantized_linear and ts_llm::kquant_linear (schemas in quant/ops.py) and ts_llm::bf16_linear
 * (kernels/matvec.py) and ts_llm::attention (kernels/attention.py), registered with the dispatcher from C++: compiled graphs call them 121 times
 * a decode step (default model), and a Python kernel cost ~30 us a call there (dispatcher into
 * Python, argument boxing, ctypes) against ~3 us here.
 * Written against torch's stable ABI (torch/csrc/stable and the AOTI C shim), whose headers build
 * in ~1 s where ATen's took ~8 s of every new instance's start; the output is allocated through
 * the shim (no dispatcher round trip) and the bias added here, so a call makes no boxed op call.
 * Appended to quantized.c, kquant.c, matvec.c and attention.c and built with them (build.py). */
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <vector>

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

std::string shape_of(const Tensor &t) {
    std::string s = "[";
    for (int64_t i = 0; i < t.dim(); i++) s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "]";
}

/* y [..., N] float32, uninitialized, through the shim's empty_strided. */
Tensor empty_rows(const Tensor &x, int64_t N) {
    std::vector<int64_t> sizes(x.dim()), strides(x.dim());
    for (int64_t i = 0; i < x.dim(); i++) sizes[i] = x.size(i);
    sizes.back() = N;
    int64_t stride = 1;
    for (int64_t i = x.dim() - 1; i >= 0; i--) strides[i] = stride, stride *= sizes[i];
    AtenTensorHandle handle = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(x.dim(), sizes.data(), strides.data(), aoti_torch_dtype_float32(),
                                                           aoti_torch_device_type_cpu(), 0, &handle));
    return Tensor(handle);
}

/* The part both ops share: check the bias, make x's rows contiguous, allocate y [..., N], let
 * `kernel(rows, out, M)` fill it (not called for zero rows), add the bias. */
template <typename Kernel>
Tensor linear_rows(const char *op, const Tensor &x, int64_t N, const std::optional<Tensor> &bias, Kernel kernel) {
    STD_TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == ScalarType::Float && bias->is_contiguous()
                                          && bias->numel() == N),
                    op, ": bias must be contiguous float32 [N]");
    const int64_t K = x.size(-1);
    const Tensor rows = x.is_contiguous() ? x : torch::stable::contiguous(x);
    const int64_t M = K ? rows.numel() / K : 0;
    Tensor y = empty_rows(x, N);
    float *out = static_cast<float *>(y.mutable_data_ptr());
    if (M > 0) kernel(static_cast<const float *>(rows.const_data_ptr()), out, M);
    if (bias) {
        const float *b = static_cast<const float *>(bias->const_data_ptr());
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = 0; c < N; c++) out[r * N + c] += b[c];
    }
    return y;
}

int threads() { return static_cast<int>(torch::stable::get_num_threads()); }

Tensor quantized_linear_cpu(Tensor x, Tensor q, Tensor d, std::optional<Tensor> m, std::optional<Tensor> bias,
                            int64_t rounds) {
    // q, d, m in the kernels' layout (layout.py's pack()): q [N/8, K/32, 256 (int8) or 128 (int4)],
    // d and m float16 [N/8, K/G, 8]; int4 without m is d * (q - 8). rounds: how often x is rounded to
    // int8 (1; 2: its rounding error too, quantized.c)
    STD_TORCH_CHECK(rounds == 1 || rounds == 2, "quantized_linear: rounds must be 1 or 2, got ", rounds);
    STD_TORCH_CHECK(x.dim() > 0, "quantized_linear: x must have a feature dimension");
    const int64_t K = x.size(-1);
    const int bits = q.scalar_type() == ScalarType::Char ? 8 : 4;
    STD_TORCH_CHECK(x.scalar_type() == ScalarType::Float, "quantized_linear: x must be float32, got ", x.scalar_type());
    STD_TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && (bits == 8 || q.scalar_type() == ScalarType::Byte)
                        && q.size(2) == 32 * bits && q.size(1) * 32 == K,
                    "quantized_linear: q ", shape_of(q), " is not a packed weight (QuantizedWeight.pack()) for x ",
                    shape_of(x));
    const int64_t N = q.size(0) * 8;
    STD_TORCH_CHECK(d.scalar_type() == ScalarType::Half && d.is_contiguous() && d.dim() == 3
                        && d.size(0) == q.size(0) && d.size(2) == 8 && d.size(1) > 0 && K % d.size(1) == 0
                        && (K / d.size(1)) % 32 == 0,
                    "quantized_linear: d must be contiguous float16 [N/8, groups, 8]");
    STD_TORCH_CHECK(!m.has_value()
                        || (bits == 4 && m->dim() == 3 && m->size(0) == d.size(0) && m->size(1) == d.size(1)
                            && m->size(2) == 8 && m->scalar_type() == ScalarType::Half && m->is_contiguous()),
                    "quantized_linear: m must be float16 shaped like d, and only int4 has one");
    return linear_rows("quantized_linear", x, N, bias, [&](const float *rows, float *out, int64_t M) {
        ts_llm_quantized_linear(bits, rows, static_cast<const uint8_t *>(q.const_data_ptr()),
                                static_cast<const uint16_t *>(d.const_data_ptr()),
                                m ? static_cast<const uint16_t *>(m->const_data_ptr()) : nullptr, out, M, N, K,
                                K / d.size(1), static_cast<int>(rounds), threads());
    });
}

Tensor kquant_linear_cpu(Tensor x, Tensor q, std::optional<Tensor> h, std::optional<Tensor> sc,
                         std::optional<Tensor> mn, Tensor d, std::optional<Tensor> dmin, std::optional<Tensor> bias,
                         int64_t rounds) {
    STD_TORCH_CHECK(rounds == 1 || rounds == 2, "kquant_linear: rounds must be 1 or 2, got ", rounds);
    // kquant.c's layout (quant/kquant.py's pack()): q uint8 [N/8, K/32, 128], h uint8 [N/8, K/32, 32 or 64]
    // (5 or 6 bits), sc uint8 [N/8, K/32, 8] (int8 [N/8, K/32, 2, 8] for 6 bits), mn uint8 like sc (4 and 5
    // bits), d and dmin float16 [N/8, K/S, 8] (no dmin for 6 bits)
    STD_TORCH_CHECK(x.dim() > 0 && x.scalar_type() == ScalarType::Float, "kquant_linear: x must be float32, got ",
                    x.scalar_type());
    const int64_t K = x.size(-1);
    STD_TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == ScalarType::Byte && q.size(2) == 128
                        && q.size(1) * 32 == K,
                    "kquant_linear: q ", shape_of(q), " is not a packed weight (KQuantWeight.pack()) for x ", shape_of(x));
    const int64_t G = q.size(0), B = q.size(1), N = G * 8;
    const int bits = !h ? 4 : h->size(-1) == 32 ? 5 : 6;
    STD_TORCH_CHECK(!h || (h->dim() == 3 && h->is_contiguous() && h->scalar_type() == ScalarType::Byte && h->size(0) == G
                           && h->size(1) == B && (h->size(2) == 32 || h->size(2) == 64)),
                    "kquant_linear: h must be contiguous uint8 [N/8, K/32, 32 or 64]");
    STD_TORCH_CHECK(d.dim() == 3 && d.is_contiguous() && d.scalar_type() == ScalarType::Half && d.size(0) == G
                        && d.size(2) == 8 && d.size(1) > 0 && K % d.size(1) == 0 && (K / d.size(1)) % 32 == 0,
                    "kquant_linear: d must be contiguous float16 [N/8, K/S, 8]");
    auto like_d = [&](const Tensor &t) { return t.dim() == 3 && t.is_contiguous() && t.scalar_type() == ScalarType::Half
                                                && t.size(0) == G && t.size(1) == d.size(1) && t.size(2) == 8; };
    auto per_block = [&](const Tensor &t, ScalarType type, int64_t dims) {
        return t.dim() == dims && t.is_contiguous() && t.scalar_type() == type && t.size(0) == G && t.size(1) == B
               && t.size(-1) == 8 && (dims == 3 || t.size(2) == 2);
    };
    if (bits == 6) {
        STD_TORCH_CHECK(sc && per_block(*sc, ScalarType::Char, 4) && !mn && !dmin,
                        "kquant_linear: 6 bits take sc int8 [N/8, K/32, 2, 8] and no mn or dmin");
    } else {
        STD_TORCH_CHECK(dmin && like_d(*dmin), "kquant_linear: 4 and 5 bits take dmin float16 shaped like d");
        STD_TORCH_CHECK((!sc && !mn) || (sc && mn && per_block(*sc, ScalarType::Byte, 3) && per_block(*mn, ScalarType::Byte, 3)),
                        "kquant_linear: sc and mn are both uint8 [N/8, K/32, 8] or both absent");
    }
    auto bytes = [](const std::optional<Tensor> &t) { return t ? static_cast<const uint8_t *>(t->const_data_ptr()) : nullptr; };
    return linear_rows("kquant_linear", x, N, bias, [&](const float *rows, float *out, int64_t M) {
        ts_llm_kquant_linear(bits, rows, static_cast<const uint8_t *>(q.const_data_ptr()), bytes(h), bytes(sc), bytes(mn),
                             static_cast<const uint16_t *>(d.const_data_ptr()),
                             dmin ? static_cast<const uint16_t *>(dmin->const_data_ptr()) : nullptr, out, M, N, K,
                             K / d.size(1), static_cast<int>(rounds), threads());
    });
}

Tensor bf16_linear_cpu(Tensor x, Tensor w, std::optional<Tensor> bias) {
    // x [..., K] float32, w [N, K] bfloat16 (row-major), bias float32 [N]
    STD_TORCH_CHECK(x.dim() > 0 && x.scalar_type() == ScalarType::Float,
                    "bf16_linear: x must be float32 with a feature dimension, got ", x.scalar_type(), " ", shape_of(x));
    STD_TORCH_CHECK(w.dim() == 2 && w.scalar_type() == ScalarType::BFloat16 && w.is_contiguous()
                        && w.size(1) == x.size(-1),
                    "bf16_linear: w must be contiguous bfloat16 [N, ", x.size(-1), "], got ", w.scalar_type(), " ",
                    shape_of(w));
    const int64_t K = w.size(1), N = w.size(0);
    return linear_rows("bf16_linear", x, N, bias, [&](const float *rows, float *out, int64_t M) {
        ts_llm_bf16_linear(rows, static_cast<const uint16_t *>(w.const_data_ptr()), out, M, N, K, threads());
    });
}

Tensor attention_cpu(Tensor q, Tensor k, Tensor v, Tensor pages, Tensor visible, double scale) {
    // q [B, H, T, D] float32; k, v [P, KV, L, D] bfloat16 or float32, any strides but a unit last one (the
    // KV cache's pages of L positions); pages [B, N] int64, the page of each run of L positions of sequence b
    // (N * L >= S); visible [B, T, S] bool. Returns [B, H, T, D] float32 (attention.c), strided as [B, T, H, D].
    STD_TORCH_CHECK(q.dim() == 4 && q.scalar_type() == ScalarType::Float, "attention: q must be float32 [B, H, T, D], got ",
                    q.scalar_type(), " ", shape_of(q));
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
    auto cached = [&](const Tensor &t) {
        return t.dim() == 4 && t.size(3) == D && t.stride(3) == 1 && t.size(1) > 0 && H % t.size(1) == 0
               && (t.scalar_type() == ScalarType::BFloat16 || t.scalar_type() == ScalarType::Float);
    };
    STD_TORCH_CHECK(cached(k) && cached(v) && k.scalar_type() == v.scalar_type() && k.size(0) == v.size(0)
                        && k.size(1) == v.size(1) && k.size(2) == v.size(2),
                    "attention: k ", shape_of(k), " and v ", shape_of(v), " must be bfloat16 or float32 [P, KV, L, D] ",
                    "alike, D's stride 1, for q ", shape_of(q));
    const int64_t P = k.size(0), KV = k.size(1), L = k.size(2);
    STD_TORCH_CHECK(visible.dim() == 3 && visible.scalar_type() == ScalarType::Bool && visible.size(0) == B
                        && visible.size(1) == T,
                    "attention: visible must be bool [B, T, S] = [", B, ", ", T, ", S], got ", shape_of(visible));
    const int64_t S = visible.size(2);
    STD_TORCH_CHECK(pages.dim() == 2 && pages.scalar_type() == ScalarType::Long && pages.size(0) == B
                        && pages.size(1) * L >= S,
                    "attention: pages must be int64 [B, N] with N * ", L, " >= ", S, ", got ", shape_of(pages));
    const Tensor table = pages.is_contiguous() ? pages : torch::stable::contiguous(pages);
    const int64_t *page = static_cast<const int64_t *>(table.const_data_ptr()), N = table.size(1), used = (S + L - 1) / L;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < used; j++)  // a page out of range would read outside the cache
            STD_TORCH_CHECK(page[b * N + j] >= 0 && page[b * N + j] < P, "attention: sequence ", b, "'s page ", j, " is ",
                            page[b * N + j], ", outside the cache's ", P, " pages");
    const Tensor rows = q.is_contiguous() ? q : torch::stable::contiguous(q);
    const Tensor seen = visible.is_contiguous() ? visible : torch::stable::contiguous(visible);
    // laid out as [B, T, H, D], as SDPA returns it: the model's transpose(1, 2) is then contiguous and its
    // reshape a view, with no guard on an unbacked batch
    std::vector<int64_t> sizes{B, H, T, D}, strides{T * H * D, D, H * D, 1};
    AtenTensorHandle handle = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(4, sizes.data(), strides.data(), aoti_torch_dtype_float32(),
                                                           aoti_torch_device_type_cpu(), 0, &handle));
    Tensor out(handle);
    const int64_t k_strides[3] = {k.stride(0), k.stride(1), k.stride(2)}, v_strides[3] = {v.stride(0), v.stride(1), v.stride(2)};
    const int failed = ts_llm_attention(static_cast<const float *>(rows.const_data_ptr()), k.const_data_ptr(), k_strides,
                                        v.const_data_ptr(), v_strides, k.scalar_type() == ScalarType::BFloat16, page, L, N,
                                        static_cast<const uint8_t *>(seen.const_data_ptr()),
                                        static_cast<float *>(out.mutable_data_ptr()), B, H, KV, T, S, D,
                                        static_cast<float>(scale), threads());
    STD_TORCH_CHECK(!failed, "attention: ", H / KV, " query heads per KV head (at most 32) and head dimension ", D,
                    " (at most 512, a multiple of 8) are supported, and the kernel's scratch must be allocatable");
    return out;
}

/* What the kernels in force were built for (ts_llm_built_features): asked through the dispatcher, so the
 * answer comes from whichever library registered the ops last. `anchor` only selects the CPU kernel. */
int64_t built_features_cpu(Tensor anchor) {
    (void)anchor;
    return ts_llm_built_features();
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(ts_llm, CPU, lib) {
    lib.impl("quantized_linear", TORCH_BOX(&quantized_linear_cpu));
    lib.impl("kquant_linear", TORCH_BOX(&kquant_linear_cpu));
    lib.impl("bf16_linear", TORCH_BOX(&bf16_linear_cpu));
    lib.impl("attention", TORCH_BOX(&attention_cpu));
    lib.impl("built_features", TORCH_BOX(&built_features_cpu));
}
