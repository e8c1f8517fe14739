#include "model/expert_weights.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/dtype.h"
#include "model/safetensors.h"

namespace mmserve::model {
namespace {

// Two experts of width 2 on a hidden size of 3.
constexpr int64_t kExperts = 2, kHidden = 3, kWidth = 2;

std::string TempDir() {
  const char* env = std::getenv("TEST_TMPDIR");
  static int counter = 0;
  const std::string dir = std::string(env != nullptr ? env : "/tmp") + "/experts_" +
                          std::to_string(::getpid()) + "_" + std::to_string(counter++);
  REQUIRE(std::system(("mkdir -p " + dir).c_str()) == 0);
  return dir;
}

// Test values: quarter steps in [-1.5, 1.5], exact in every dtype here.
float Value(int64_t i) { return static_cast<float>(i % 13 - 6) * 0.25f; }

// F16 bits of a value with at most 10 mantissa bits in the normal range.
uint16_t F16Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if (f == 0.0f) return static_cast<uint16_t>((b >> 16) & 0x8000);
  const uint32_t exponent = ((b >> 23) & 0xff) - 127 + 15;
  return static_cast<uint16_t>(((b >> 16) & 0x8000) | (exponent << 10) | ((b >> 13) & 0x3ff));
}

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t first_value;  // element i holds Value(first_value + i)
};

// A model directory whose model.safetensors holds `tensors` in `dtype`.
std::string WriteCheckpoint(const std::vector<Tensor>& tensors, DType dtype) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const Tensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const size_t begin = data.size();
    for (int64_t i = 0; i < n; ++i) {
      const float v = Value(t.first_value + i);
      if (dtype == DType::kF32) {
        data.append(reinterpret_cast<const char*>(&v), 4);
      } else {
        const uint16_t h = dtype == DType::kBF16 ? F32ToBf16(v) : F16Bits(v);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    header[t.name] = {
        {"dtype", DTypeName(dtype)}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t len = h.size();
  const std::string dir = TempDir();
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << h << data;
  return dir;
}

std::vector<Tensor> FusedTensors() {
  return {{"l.mlp.experts.gate_up_proj", {kExperts, kHidden, 2 * kWidth}, 0},
          {"l.mlp.experts.down_proj", {kExperts, kWidth, kHidden}, 100}};
}

TextConfig Config() {
  TextConfig cfg;
  cfg.num_experts = kExperts;
  cfg.hidden_size = kHidden;
  cfg.moe_intermediate_size = kWidth;
  return cfg;
}

float At(const cpu::WeightMatrix& m, int64_t r, int64_t c) {
  const int64_t i = r * m.cols + c;
  if (m.dtype == DType::kF32) return static_cast<const float*>(m.data)[i];
  REQUIRE(m.dtype == DType::kBF16);
  return Bf16ToF32(static_cast<const uint16_t*>(m.data)[i]);
}

struct Bound {
  std::unique_ptr<SafetensorsCheckpoint> ckpt;
  std::vector<std::unique_ptr<std::vector<float>>> f32;
  std::vector<std::unique_ptr<std::vector<uint16_t>>> bf16;
  std::vector<Qwen2LayerWeights::Expert> experts;
  absl::Status status;
};

std::unique_ptr<Bound> Bind(const std::string& dir) {
  auto b = std::make_unique<Bound>();
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  REQUIRE(ckpt.ok());
  b->ckpt = std::move(*ckpt);
  b->status = BindFusedExperts(*b->ckpt, "l.", Config(), {&b->f32, &b->bf16}, &b->experts);
  return b;
}

TEST_CASE("fused input-major experts become [out][in] matrices with the same values", "[experts]") {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    INFO(DTypeName(dtype));
    const std::string dir = WriteCheckpoint(FusedTensors(), dtype);
    auto b = Bind(dir);
    REQUIRE(b->status.ok());
    CHECK(HasFusedExperts(*b->ckpt, "l."));
    CHECK_FALSE(HasFusedExperts(*b->ckpt, "m."));
    REQUIRE(b->experts.size() == kExperts);
    // F16 is widened (the kernels take F32 and BF16); the others keep theirs.
    const DType want = dtype == DType::kF16 ? DType::kF32 : dtype;
    for (int64_t e = 0; e < kExperts; ++e) {
      const Qwen2LayerWeights::Expert& x = b->experts[e];
      for (const cpu::WeightMatrix* m : {&x.gate, &x.up, &x.down}) CHECK(m->dtype == want);
      REQUIRE(x.gate.rows == kWidth);
      REQUIRE(x.gate.cols == kHidden);
      REQUIRE(x.down.rows == kHidden);
      REQUIRE(x.down.cols == kWidth);
      for (int64_t j = 0; j < kWidth; ++j) {
        for (int64_t h = 0; h < kHidden; ++h) {
          // gate_up[e][h][j] is gate(j, h); gate_up[e][h][width + j] is up(j, h);
          // down_proj[e][j][h] is down(h, j).
          const int64_t gu = (e * kHidden + h) * 2 * kWidth;
          CHECK(At(x.gate, j, h) == Value(gu + j));
          CHECK(At(x.up, j, h) == Value(gu + kWidth + j));
          CHECK(At(x.down, h, j) == Value(100 + (e * kWidth + j) * kHidden + h));
        }
      }
    }
    // One owned allocation per projection, so each can be released alone.
    CHECK(b->f32.size() + b->bf16.size() == 3 * kExperts);
  }
}

TEST_CASE("a missing or misshapen fused expert tensor is refused naming it", "[experts]") {
  std::vector<Tensor> missing = FusedTensors();
  missing.pop_back();
  auto b = Bind(WriteCheckpoint(missing, DType::kBF16));
  CHECK(b->status.code() == absl::StatusCode::kNotFound);
  CHECK(b->status.message() ==
        "checkpoint has no tensor 'l.mlp.experts.down_proj' (expected shape [2, 2, 3])");

  std::vector<Tensor> transposed = FusedTensors();
  transposed[0].shape = {kExperts, 2 * kWidth, kHidden};  // [out][in], as nn.Linear saves
  b = Bind(WriteCheckpoint(transposed, DType::kBF16));
  CHECK(b->status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(b->status.message() ==
        "tensor 'l.mlp.experts.gate_up_proj' has shape [2, 4, 3], expected [2, 3, 4]");
}

}  // namespace
}  // namespace mmserve::model
