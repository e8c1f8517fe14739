#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace mmserve::model {
namespace {

// The format caps the JSON header at 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status ParseTensor(const std::string& path, const std::string& name,
                         const nlohmann::json& entry, TensorView* out, uint64_t* begin,
                         uint64_t* end) {
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets")) {
    return Invalid(
        path, absl::StrCat("tensor '", name, "' needs \"dtype\", \"shape\" and \"data_offsets\""));
  }
  const auto& dtype = entry["dtype"];
  if (!dtype.is_string() || !ParseDType(dtype.get<std::string>(), &out->dtype)) {
    return Invalid(path, absl::StrCat("tensor '", name, "' has unknown dtype ", dtype.dump()));
  }
  const auto& shape = entry["shape"];
  if (!shape.is_array()) return Invalid(path, absl::StrCat("tensor '", name, "': bad shape"));
  for (const auto& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return Invalid(path, absl::StrCat("tensor '", name, "': bad shape ", shape.dump()));
    }
    out->shape.push_back(d.get<int64_t>());
  }
  const auto& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned() || offsets[0].get<uint64_t>() > offsets[1].get<uint64_t>()) {
    return Invalid(path, absl::StrCat("tensor '", name, "': bad data_offsets ", offsets.dump()));
  }
  *begin = offsets[0].get<uint64_t>();
  *end = offsets[1].get<uint64_t>();
  out->name = name;
  const uint64_t want = static_cast<uint64_t>(out->numel()) * DTypeSize(out->dtype);
  if (*end - *begin != want) {
    return Invalid(path, absl::StrCat("tensor '", name, "' is ", out->Describe(), " = ", want,
                                      " bytes but data_offsets span ", *end - *begin));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::Describe() const {
  return absl::StrCat(DTypeName(dtype), "[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": fstat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_size_ = static_cast<size_t>(st.st_size);
  if (file->map_size_ > 0) {
    void* map = ::mmap(nullptr, file->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap: ", std::strerror(errno)));
    }
    file->map_ = map;
  }
  ::close(fd);
  RETURN_IF_ERROR(file->Parse());
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

absl::Status SafetensorsFile::Parse() {
  const auto* bytes = static_cast<const uint8_t*>(map_);
  if (map_size_ < 8) return Invalid(path_, "shorter than the 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, bytes, 8);  // little-endian, as is x86
  if (header_len > kMaxHeaderBytes || header_len > map_size_ - 8) {
    return Invalid(path_, absl::StrCat("header length ", header_len, " runs past the file (",
                                       map_size_, " bytes): truncated or not safetensors"));
  }
  nlohmann::json header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len, nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Invalid(path_, "header is not a JSON object");
  }
  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_size = map_size_ - 8 - header_len;
  struct Range {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Invalid(path_, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TensorView view;
    uint64_t begin = 0, end = 0;
    RETURN_IF_ERROR(ParseTensor(path_, it.key(), *it, &view, &begin, &end));
    ranges.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(view));
  }
  // The ranges must tile the data section exactly: no overlap, no hole, no
  // byte past the end (which is what a truncated file looks like).
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  uint64_t cursor = 0;
  for (const Range& r : ranges) {
    const std::string& name = tensors_[r.tensor].name;
    if (r.begin < cursor) {
      return Invalid(path_, absl::StrCat("tensor '", name, "' starts at byte ", r.begin,
                                         ", inside the previous tensor"));
    }
    if (r.begin > cursor) {
      return Invalid(path_, absl::StrCat("tensor '", name, "' starts at byte ", r.begin,
                                         ", leaving a hole after byte ", cursor));
    }
    if (r.end > data_size) {
      return Invalid(path_, absl::StrCat("tensor '", name, "' ends at byte ", r.end,
                                         " but the data section has ", data_size,
                                         " bytes: the file is truncated"));
    }
    cursor = r.end;
  }
  if (cursor != data_size) {
    return Invalid(path_,
                   absl::StrCat(data_size - cursor, " trailing bytes after the last tensor"));
  }
  std::vector<TensorView> ordered;
  ordered.reserve(tensors_.size());
  for (const Range& r : ranges) {
    TensorView v = std::move(tensors_[r.tensor]);
    v.data = data + r.begin;
    v.nbytes = r.end - r.begin;
    if (reinterpret_cast<uintptr_t>(v.data) % DTypeSize(v.dtype) != 0) {
      // Readers cast `data` to the element type: give them aligned bytes.
      copies_.push_back(std::make_unique<uint64_t[]>((v.nbytes + 7) / 8));
      std::memcpy(copies_.back().get(), v.data, v.nbytes);
      v.data = reinterpret_cast<const uint8_t*>(copies_.back().get());
    }
    index_[v.name] = ordered.size();
    ordered.push_back(std::move(v));
  }
  tensors_ = std::move(ordered);
  return absl::OkStatus();
}

bool SafetensorsFile::IsMapped(const TensorView& tensor) const {
  const auto* begin = static_cast<const uint8_t*>(map_);
  return map_ != nullptr && tensor.data >= begin && tensor.data < begin + map_size_;
}

const TensorView* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  auto ckpt = std::make_unique<SafetensorsCheckpoint>();
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream index_file(index_path);
  if (!index_file.good()) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir + "/model.safetensors"));
    for (const TensorView& t : file->tensors()) {
      ckpt->index_[t.name] = &t;
      ckpt->file_of_[&t] = file.get();
    }
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }
  std::stringstream text;
  text << index_file.rdbuf();
  nlohmann::json index = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return Invalid(index_path, "not a JSON object with a \"weight_map\" object");
  }
  std::map<std::string, std::vector<std::string>> shards;  // shard -> tensor names
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it->is_string() || it->get<std::string>().find('/') != std::string::npos ||
        it->get<std::string>().empty() || it->get<std::string>() == "." ||
        it->get<std::string>() == "..") {
      return Invalid(index_path, absl::StrCat("bad shard name for tensor '", it.key(), "'"));
    }
    shards[it->get<std::string>()].push_back(it.key());
  }
  for (const auto& [shard, names] : shards) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir + "/" + shard));
    for (const std::string& name : names) {
      const TensorView* t = file->Find(name);
      if (t == nullptr) {
        return Invalid(index_path, absl::StrCat("tensor '", name, "' is assigned to ", shard,
                                                " which lacks it"));
      }
      ckpt->index_[name] = t;
      ckpt->file_of_[t] = file.get();
    }
    ckpt->files_.push_back(std::move(file));
  }
  return ckpt;
}

const TensorView* SafetensorsCheckpoint::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsCheckpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, view] : index_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

size_t SafetensorsCheckpoint::TotalBytes() const {
  size_t total = 0;
  for (const auto& f : files_) {
    for (const TensorView& t : f->tensors()) total += t.nbytes;
  }
  return total;
}

void SafetensorsCheckpoint::ReleasePages(const TensorView& tensor) const {
  auto file = file_of_.find(&tensor);
  // Only mapped file pages come back from the file; a copy's would read as zeros.
  if (file == file_of_.end() || !file->second->IsMapped(tensor)) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(tensor.data);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + tensor.nbytes) / page * page;
  if (last > first) {
    // Advice only: on failure the pages simply stay resident.
    ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

}  // namespace mmserve::model
