/* The CPU kernel of ts_llm::quantized_linear (schema in ops.py), registered with the dispatcher
 * from C++: compiled graphs call it 121 times a decode step (default model), and a Python kernel
 * cost ~30 us a call there (dispatcher into Python, argument boxing, ctypes) against ~3 us here.
 * Appended to kernels.c and built with it (kernel.py). */
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace {

at::Tensor quantized_linear_cpu(const at::Tensor &x, const at::Tensor &q, const at::Tensor &d,
                                const std::optional<at::Tensor> &m, const std::optional<at::Tensor> &bias) {
    // q, d, m in the kernels' layout (layout.py's pack()): q [N/8, K/32, 256 (int8) or 128 (int4)],
    // d and m float16 [N/8, K/G, 8]
    const int64_t K = x.size(-1);
    const int bits = q.scalar_type() == at::kChar ? 8 : 4;
    TORCH_CHECK(x.scalar_type() == at::kFloat, "quantized_linear: x must be float32, got ", x.scalar_type());
    TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && (bits == 8 || q.scalar_type() == at::kByte)
                    && q.size(2) == 32 * bits && q.size(1) * 32 == K,
                "quantized_linear: q ", q.sizes(), " is not a packed weight (QuantizedWeight.pack()) for x ", x.sizes());
    const int64_t N = q.size(0) * 8;
    TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.dim() == 3 && d.size(0) == q.size(0)
                    && d.size(2) == 8 && d.size(1) > 0 && K % d.size(1) == 0 && (K / d.size(1)) % 32 == 0,
                "quantized_linear: d must be contiguous float16 [N/8, groups, 8]");
    TORCH_CHECK(bits == 8 ? !m.has_value() : (m.has_value() && m->sizes() == d.sizes() && m->scalar_type() == at::kHalf
                                              && m->is_contiguous()),
                "quantized_linear: m (float16, shaped like d) is needed for int4 and only for int4");
    const at::Tensor rows = x.reshape({-1, K}).contiguous();
    const int64_t M = rows.size(0);
    at::Tensor y = at::empty({M, N}, x.options());
    if (M > 0)
        ts_llm_quantized_linear(bits, rows.data_ptr<float>(), static_cast<const uint8_t *>(q.data_ptr()),
                                static_cast<const uint16_t *>(d.data_ptr()),
                                m ? static_cast<const uint16_t *>(m->data_ptr()) : nullptr, y.data_ptr<float>(), M,
                                N, K, K / d.size(1), at::get_num_threads());
    if (bias)
        y.add_(*bias);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = N;
    return y.view(shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(ts_llm, CPU, lib) { lib.impl("quantized_linear", quantized_linear_cpu); }
