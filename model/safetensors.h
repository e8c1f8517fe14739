// Reads .safetensors files by mmap, without copying tensor data, and whole
// Hugging Face checkpoints (one file, or shards listed by
// model.safetensors.index.json).
//
//   ASSIGN_OR_RETURN(auto ckpt, SafetensorsCheckpoint::Open("/models/qwen2-vl"));
//   const TensorView* w = ckpt->Find("model.embed_tokens.weight");
//   if (w == nullptr) return absl::NotFoundError(...);
//   // w->data points into the mapped file for as long as `ckpt` lives.
//
// Every malformed input is an InvalidArgumentError naming the file and the
// tensor: a header that is not JSON or runs past the file, an unknown dtype,
// a byte range that disagrees with the shape, ranges that overlap, leave
// holes or run past the file (a truncated download). The mapped data is
// read-only and immutable, so readers may share a file across threads.
#ifndef MMSERVE_MODEL_SAFETENSORS_H_
#define MMSERVE_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/dtype.h"

namespace mmserve::model {

// A tensor inside a mapped file: borrowed, valid while its file is open.
// `data` is aligned to the dtype's size: a tensor the file stores at an
// unaligned offset (the format allows any header length) is copied once,
// at open, into memory the file object owns.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
  // "BF16[151936, 896]", for error messages.
  std::string Describe() const;
};

// One .safetensors file, mapped read-only.
class SafetensorsFile {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // nullptr when the file has no tensor of that name.
  const TensorView* Find(absl::string_view name) const;
  // Every tensor, in data order.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // The header's "__metadata__" strings (e.g. {"format": "pt"}).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  // Whether `tensor`'s bytes are the mapped file's (not an aligned copy).
  bool IsMapped(const TensorView& tensor) const;

 private:
  SafetensorsFile() = default;
  absl::Status Parse();

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  // Aligned copies of the tensors stored at unaligned offsets.
  std::vector<std::unique_ptr<uint64_t[]>> copies_;
};

// A checkpoint directory: model.safetensors, or the shards listed in
// model.safetensors.index.json (every listed shard must exist and hold the
// tensors the index assigns to it).
class SafetensorsCheckpoint {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(
      const std::string& dir);

  // nullptr when no shard has the tensor.
  const TensorView* Find(absl::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> Names() const;
  // Bytes of tensor data over all shards.
  size_t TotalBytes() const;

  // Drops the resident pages wholly inside the tensor's bytes (a consumer
  // that copied or repacked the tensor no longer needs them in memory). The
  // mapping stays valid: touching the bytes again reads them from the file.
  // Aligned copies (see TensorView) are left alone.
  void ReleasePages(const TensorView& tensor) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, const TensorView*> index_;
  absl::flat_hash_map<const TensorView*, const SafetensorsFile*> file_of_;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_SAFETENSORS_H_
