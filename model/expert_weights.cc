#include "model/expert_weights.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/dtype.h"

namespace mmserve::model {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// out[c * rows + r] = in(r, c) of the rows x cols block at `in` whose rows
// are `stride` elements apart: the block transposed, widened to fp32 when
// `widen` (the source is F16), else in the source's 2-byte or 4-byte type.
cpu::WeightMatrix TransposeBlock(const TensorView& t, int64_t offset, int64_t rows, int64_t cols,
                                 int64_t stride, OwnedWeightStorage owned) {
  const int64_t n = rows * cols;
  if (t.dtype == DType::kF32) {
    const float* in = reinterpret_cast<const float*>(t.data) + offset;
    auto v = std::make_unique<std::vector<float>>(n);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) (*v)[c * rows + r] = in[r * stride + c];
    }
    owned.f32->push_back(std::move(v));
    return {DType::kF32, owned.f32->back()->data(), cols, rows};
  }
  const uint16_t* in = reinterpret_cast<const uint16_t*>(t.data) + offset;
  if (t.dtype == DType::kF16) {
    auto v = std::make_unique<std::vector<float>>(n);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) (*v)[c * rows + r] = F16ToF32(in[r * stride + c]);
    }
    owned.f32->push_back(std::move(v));
    return {DType::kF32, owned.f32->back()->data(), cols, rows};
  }
  auto v = std::make_unique<std::vector<uint16_t>>(n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) (*v)[c * rows + r] = in[r * stride + c];
  }
  owned.bf16->push_back(std::move(v));
  return {DType::kBF16, owned.bf16->back()->data(), cols, rows};
}

}  // namespace

absl::StatusOr<const TensorView*> FindWeightTensor(const SafetensorsCheckpoint& ckpt,
                                                   const std::string& name,
                                                   const std::vector<int64_t>& shape) {
  const TensorView* t = ckpt.Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint has no tensor '", name,
                                            "' (expected shape ", ShapeString(shape), ")"));
  }
  if (t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape ",
                                                   ShapeString(t->shape), ", expected ",
                                                   ShapeString(shape)));
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' has dtype ", DTypeName(t->dtype), ", expected F32, BF16 or F16"));
  }
  return t;
}

bool HasFusedExperts(const SafetensorsCheckpoint& ckpt, const std::string& prefix) {
  return ckpt.Find(prefix + "mlp.experts.gate_up_proj") != nullptr ||
         ckpt.Find(prefix + "mlp.experts.down_proj") != nullptr;
}

absl::Status BindFusedExperts(const SafetensorsCheckpoint& ckpt, const std::string& prefix,
                              const TextConfig& cfg, OwnedWeightStorage owned,
                              std::vector<Qwen2LayerWeights::Expert>* experts) {
  const int64_t n = cfg.num_experts, hidden = cfg.hidden_size, width = cfg.moe_intermediate_size;
  ASSIGN_OR_RETURN(
      const TensorView* gate_up,
      FindWeightTensor(ckpt, prefix + "mlp.experts.gate_up_proj", {n, hidden, 2 * width}));
  ASSIGN_OR_RETURN(const TensorView* down,
                   FindWeightTensor(ckpt, prefix + "mlp.experts.down_proj", {n, width, hidden}));
  experts->resize(n);
  for (int64_t e = 0; e < n; ++e) {
    Qwen2LayerWeights::Expert& x = (*experts)[e];
    const int64_t gu = e * hidden * 2 * width;
    // gate_up[e] is [hidden][2 x width]: gate's input-major block is its
    // first `width` columns, up's the next.
    x.gate = TransposeBlock(*gate_up, gu, hidden, width, 2 * width, owned);
    x.up = TransposeBlock(*gate_up, gu + width, hidden, width, 2 * width, owned);
    x.down = TransposeBlock(*down, e * width * hidden, width, hidden, hidden, owned);
  }
  ckpt.ReleasePages(*gate_up);
  ckpt.ReleasePages(*down);
  return absl::OkStatus();
}

}  // namespace mmserve::model
