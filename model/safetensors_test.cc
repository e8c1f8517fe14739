#include "model/safetensors.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mmserve::model {
namespace {

std::string TempDir() {
  const char* env = std::getenv("TEST_TMPDIR");
  std::string base = env != nullptr ? env : "/tmp";
  static int counter = 0;
  std::string dir = base + "/st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  REQUIRE(std::system(("mkdir -p " + dir).c_str()) == 0);
  return dir;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Serializes a safetensors file from a JSON header and a data section.
std::string Encode(const nlohmann::json& header, const std::string& data) {
  std::string h = header.dump();
  uint64_t len = h.size();
  std::string out(reinterpret_cast<const char*>(&len), 8);
  return out + h + data;
}

std::string Floats(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Two tensors: a F32[2,3] and a BF16[2] {1.0, -2.0}, plus metadata.
std::string ValidFile() {
  nlohmann::json header = {
      {"__metadata__", {{"format", "pt"}}},
      {"w", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
      {"b", {{"dtype", "BF16"}, {"shape", {2}}, {"data_offsets", {24, 28}}}},
  };
  std::string data = Floats({0, 1, 2, 3, 4, 5});
  const uint16_t bf[2] = {0x3f80, 0xc000};
  data.append(reinterpret_cast<const char*>(bf), 4);
  return Encode(header, data);
}

absl::Status OpenBytes(const std::string& bytes) {
  std::string path = TempDir() + "/m.safetensors";
  WriteBytes(path, bytes);
  return SafetensorsFile::Open(path).status();
}

TEST_CASE("a valid file exposes dtype, shape, metadata and data in place", "[safetensors]") {
  std::string path = TempDir() + "/m.safetensors";
  WriteBytes(path, ValidFile());
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  const TensorView* w = (*file)->Find("w");
  REQUIRE(w != nullptr);
  CHECK(w->dtype == DType::kF32);
  CHECK(w->shape == std::vector<int64_t>{2, 3});
  CHECK(w->numel() == 6);
  CHECK(w->Describe() == "F32[2, 3]");
  CHECK(reinterpret_cast<const float*>(w->data)[5] == 5.0f);
  const TensorView* b = (*file)->Find("b");
  REQUIRE(b != nullptr);
  CHECK(Bf16ToF32(reinterpret_cast<const uint16_t*>(b->data)[1]) == -2.0f);
  CHECK((*file)->Find("missing") == nullptr);
  CHECK((*file)->metadata().at("format") == "pt");
  CHECK((*file)->tensors().size() == 2);
  CHECK((*file)->tensors()[0].name == "w");  // data order
}

TEST_CASE("a missing file is NOT_FOUND with its path", "[safetensors]") {
  auto s = SafetensorsFile::Open("/nonexistent/x.safetensors").status();
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(s.message().find("/nonexistent/x.safetensors") != absl::string_view::npos);
}

TEST_CASE("malformed files are rejected with a reason naming the tensor", "[safetensors]") {
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;
  };
  std::string valid = ValidFile();
  auto with_entry = [](nlohmann::json entry, size_t data_bytes) {
    return Encode({{"t", entry}}, std::string(data_bytes, '\0'));
  };
  std::vector<Case> cases = {
      {"empty file", "", "shorter than the 8-byte header"},
      {"header length past the end", std::string("\xff\xff\x00\x00\x00\x00\x00\x00", 8) + "{}",
       "runs past the file"},
      {"header not JSON", Encode(nullptr, "").replace(8, 4, "{{{{"), "not a JSON object"},
      {"unknown dtype",
       with_entry({{"dtype", "F8_E4M3"}, {"shape", {4}}, {"data_offsets", {0, 4}}}, 4),
       "tensor 't' has unknown dtype \"F8_E4M3\""},
      {"shape disagrees with byte range",
       with_entry({{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 8}}}, 8),
       "tensor 't' is F32[3] = 12 bytes but data_offsets span 8"},
      {"negative dimension",
       with_entry({{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}, 4), "bad shape"},
      {"missing field", with_entry({{"dtype", "F32"}, {"shape", {1}}}, 4), "needs"},
      {"truncated data", valid.substr(0, valid.size() - 3), "the file is truncated"},
      {"trailing bytes", valid + "xx", "2 trailing bytes"},
      {"hole between tensors",
       Encode({{"a", {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {0, 1}}}},
               {"b", {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {2, 3}}}}},
              "abc"),
       "tensor 'b' starts at byte 2, leaving a hole after byte 1"},
      {"overlapping tensors",
       Encode({{"a", {{"dtype", "U8"}, {"shape", {2}}, {"data_offsets", {0, 2}}}},
               {"b", {{"dtype", "U8"}, {"shape", {2}}, {"data_offsets", {1, 3}}}}},
              "abc"),
       "inside the previous tensor"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    absl::Status s = OpenBytes(c.bytes);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(c.expect) != absl::string_view::npos);
  }
}

TEST_CASE("tensors at unaligned offsets are handed out aligned, with their bytes",
          "[safetensors]") {
  // The format allows any header length, so data may start at any byte
  // (found by the ASan+UBSan run: misaligned float reads in this test).
  for (size_t pad = 0; pad < 8; ++pad) {
    INFO("header padded by " << pad);
    nlohmann::json header = {
        {"w", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 12}}}},
        {"b", {{"dtype", "BF16"}, {"shape", {1}}, {"data_offsets", {12, 14}}}},
        {"i", {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {14, 22}}}},
    };
    std::string h = header.dump() + std::string(pad, ' ');
    uint64_t len = h.size();
    std::string data = Floats({1.5f, -2.0f, 3.25f});
    const uint16_t bf = 0x3f80;
    const int64_t i64 = -7;
    data.append(reinterpret_cast<const char*>(&bf), 2);
    data.append(reinterpret_cast<const char*>(&i64), 8);
    const std::string dir = TempDir();
    WriteBytes(dir + "/model.safetensors",
               std::string(reinterpret_cast<const char*>(&len), 8) + h + data);
    auto ckpt = SafetensorsCheckpoint::Open(dir);
    REQUIRE(ckpt.ok());
    for (const char* name : {"w", "b", "i"}) {
      const TensorView* t = (*ckpt)->Find(name);
      REQUIRE(t != nullptr);
      CHECK(reinterpret_cast<uintptr_t>(t->data) % DTypeSize(t->dtype) == 0);
    }
    const TensorView* w = (*ckpt)->Find("w");
    CHECK(std::memcmp(w->data, data.data(), 12) == 0);
    CHECK(std::memcmp((*ckpt)->Find("i")->data, data.data() + 14, 8) == 0);
    // Releasing pages keeps the bytes, copied or mapped.
    (*ckpt)->ReleasePages(*w);
    CHECK(std::memcmp(w->data, data.data(), 12) == 0);
  }
}

TEST_CASE("a sharded checkpoint resolves tensors through its index", "[safetensors]") {
  std::string dir = TempDir();
  WriteBytes(dir + "/model-00001-of-00002.safetensors", ValidFile());
  WriteBytes(
      dir + "/model-00002-of-00002.safetensors",
      Encode({{"c", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}, Floats({7})));
  nlohmann::json index = {{"metadata", {{"total_size", 32}}},
                          {"weight_map",
                           {{"w", "model-00001-of-00002.safetensors"},
                            {"b", "model-00001-of-00002.safetensors"},
                            {"c", "model-00002-of-00002.safetensors"}}}};
  WriteBytes(dir + "/model.safetensors.index.json", index.dump());
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  REQUIRE(ckpt.ok());
  REQUIRE((*ckpt)->Find("c") != nullptr);
  CHECK(reinterpret_cast<const float*>((*ckpt)->Find("c")->data)[0] == 7.0f);
  CHECK((*ckpt)->Names() == std::vector<std::string>{"b", "c", "w"});
  CHECK((*ckpt)->TotalBytes() == 32);

  SECTION("an index naming a tensor its shard lacks is an error") {
    index["weight_map"]["ghost"] = "model-00002-of-00002.safetensors";
    WriteBytes(dir + "/model.safetensors.index.json", index.dump());
    auto s = SafetensorsCheckpoint::Open(dir).status();
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("tensor 'ghost'") != absl::string_view::npos);
  }
  SECTION("an empty, '.' or '..' shard name is INVALID_ARGUMENT (not the directory mapped)") {
    for (const char* bad : {"", ".", ".."}) {
      index["weight_map"]["c"] = bad;
      WriteBytes(dir + "/model.safetensors.index.json", index.dump());
      CHECK(SafetensorsCheckpoint::Open(dir).status().code() == absl::StatusCode::kInvalidArgument);
    }
  }
  SECTION("a shard that is a directory is INVALID_ARGUMENT") {
    std::filesystem::create_directory(dir + "/sub.safetensors");
    index["weight_map"]["c"] = "sub.safetensors";
    WriteBytes(dir + "/model.safetensors.index.json", index.dump());
    CHECK(SafetensorsCheckpoint::Open(dir).status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a missing shard is NOT_FOUND") {
    index["weight_map"]["c"] = "model-00003-of-00002.safetensors";
    WriteBytes(dir + "/model.safetensors.index.json", index.dump());
    CHECK(SafetensorsCheckpoint::Open(dir).status().code() == absl::StatusCode::kNotFound);
  }
}

TEST_CASE("a single-file checkpoint opens model.safetensors", "[safetensors]") {
  std::string dir = TempDir();
  CHECK(SafetensorsCheckpoint::Open(dir).status().code() == absl::StatusCode::kNotFound);
  WriteBytes(dir + "/model.safetensors", ValidFile());
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  REQUIRE(ckpt.ok());
  CHECK((*ckpt)->Find("w") != nullptr);
}

}  // namespace
}  // namespace mmserve::model
