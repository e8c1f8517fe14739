#include "common/file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace mmserve {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::stringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat(path, ": read failed"));
  return s.str();
}

std::string ModelIdFromDir(const std::string& dir) {
  size_t end = dir.size();
  while (end > 1 && dir[end - 1] == '/') --end;
  const size_t slash = dir.rfind('/', end - 1);
  const size_t begin = slash == std::string::npos ? 0 : slash + 1;
  return begin < end ? dir.substr(begin, end - begin) : dir;
}

}  // namespace mmserve
