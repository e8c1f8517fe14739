// Hostile .safetensors files and model.safetensors.index.json files.
// First input byte even: the rest is one .safetensors file. Properties of an
// accepted file: its tensors tile the data section exactly, in order; each
// holds numel * dtype size bytes, equal to its bytes of the file, at an
// address aligned to its dtype; Find returns each.
// Odd: the rest is an index over two fixed, valid shards. Properties of an
// accepted index: every tensor it assigns is found, in the shard it names,
// and Names() lists exactly the index's tensors. Everything rejected is
// InvalidArgument (NotFound for a shard file that does not exist).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "fuzz/fuzz_check.h"
#include "model/dtype.h"
#include "model/safetensors.h"

namespace mmserve::model {
namespace {

// One in-memory file reused for every input, reached by path.
const std::string& MemFile() {
  static const std::string path = [] {
    const int fd = memfd_create("safetensors_fuzz", 0);
    FUZZ_CHECK(fd >= 0);
    return "/proc/self/fd/" + std::to_string(fd);
  }();
  return path;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  FUZZ_CHECK(out.good()) << path;
}

// A valid file of F32 tensors named `names`, two floats each.
std::string ValidFile(const std::set<std::string>& names) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const std::string& n : names) {
    header[n] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {offset, offset + 8}}};
    offset += 8;
  }
  const std::string text = header.dump();
  std::string bytes(8, '\0');
  const uint64_t len = text.size();
  std::memcpy(bytes.data(), &len, 8);
  return bytes + text + std::string(offset, '\x01');
}

// A checkpoint folder with shards a.safetensors {x, y} and b.safetensors {z}.
const std::string& CheckpointDir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/safetensors_fuzz_XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl) != nullptr);
    const std::string d = tmpl;
    WriteFile(d + "/a.safetensors", ValidFile({"x", "y"}));
    WriteFile(d + "/b.safetensors", ValidFile({"z"}));
    return d;
  }();
  return dir;
}

void CheckFile(const std::string& bytes) {
  const std::string& path = MemFile();
  FILE* f = std::fopen(path.c_str(), "wb");  // truncates the memfd
  FUZZ_CHECK(f != nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(file.status())) << file.status();
    return;
  }
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  uint64_t cursor = 8 + header_len;
  for (const TensorView& t : (*file)->tensors()) {
    const uint64_t size = DTypeSize(t.dtype);
    FUZZ_CHECK(t.numel() >= 0) << t.name;
    FUZZ_CHECK(t.nbytes == static_cast<uint64_t>(t.numel()) * size) << t.name << " " << t.nbytes;
    FUZZ_CHECK(reinterpret_cast<uintptr_t>(t.data) % size == 0) << t.name << " is not aligned";
    FUZZ_CHECK(cursor + t.nbytes <= bytes.size()) << t.name << " runs past the file";
    FUZZ_CHECK(std::memcmp(t.data, bytes.data() + cursor, t.nbytes) == 0)
        << t.name << " does not hold its bytes of the file";
    cursor += t.nbytes;
    FUZZ_CHECK((*file)->Find(t.name) == &t) << t.name;
  }
  FUZZ_CHECK(cursor == bytes.size())
      << "data section not covered: " << cursor << " of " << bytes.size();
}

void CheckIndex(const std::string& text) {
  const std::string& dir = CheckpointDir();
  WriteFile(dir + "/model.safetensors.index.json", text);
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> ckpt = SafetensorsCheckpoint::Open(dir);
  if (!ckpt.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(ckpt.status()) || absl::IsNotFound(ckpt.status()))
        << ckpt.status();
    return;
  }
  // Accepted: the text is a JSON object whose weight_map assigns each tensor
  // to a shard that holds it.
  const nlohmann::json index = nlohmann::json::parse(text);
  std::set<std::string> want;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    want.insert(it.key());
    const TensorView* t = (*ckpt)->Find(it.key());
    FUZZ_CHECK(t != nullptr) << it.key();
    FUZZ_CHECK(t->name == it.key());
    const std::string shard = it->get<std::string>();
    FUZZ_CHECK((shard == "a.safetensors" && (it.key() == "x" || it.key() == "y")) ||
               (shard == "b.safetensors" && it.key() == "z"))
        << it.key() << " in " << shard;
  }
  const std::vector<std::string> names = (*ckpt)->Names();
  FUZZ_CHECK(std::set<std::string>(names.begin(), names.end()) == want);
}

}  // namespace
}  // namespace mmserve::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    mmserve::model::CheckFile(rest);
  } else {
    mmserve::model::CheckIndex(rest);
  }
  return 0;
}
