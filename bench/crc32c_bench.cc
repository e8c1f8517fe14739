// crc32c_bench: CRC32C throughput of every implementation this CPU has
// (table, crc32 instruction, vpclmulqdq folding) and of the
// fused copy + checksum (Crc32cCopy), on one thread, for buffers that stay in
// L2 (256 KiB), in L3 (7 MiB, the 1024-token embedding transfer_bench moves)
// and that do not (28 MiB). Baselines in the same run: memcpy of the same
// buffer (the copy the receiver of a chunk does anyway) and a plain read
// (sum of 64-bit words). Best of --reps timings of --gib_per_rep each.
// Prints a table, then one JSON line.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/crc32c.h"

ABSL_FLAG(int, reps, 5, "timings per case; the best counts");
ABSL_FLAG(double, gib_per_rep, 1.0, "bytes processed per timing, GiB");

namespace mmserve {
namespace {

// Best GB/s of `fn` over `buffer_bytes`, repeated to ~gib_per_rep per timing.
double Measure(size_t buffer_bytes, const std::function<void()>& fn) {
  const size_t per_rep = static_cast<size_t>(absl::GetFlag(FLAGS_gib_per_rep) * (1 << 30));
  const int loops = static_cast<int>(std::max<size_t>(1, per_rep / buffer_bytes));
  fn();  // warm-up: pages faulted in, caches as in steady state
  double best = 0;
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    Stopwatch watch;
    for (int i = 0; i < loops; ++i) fn();
    best = std::max(best, double(buffer_bytes) * loops / watch.ElapsedSeconds() / 1e9);
  }
  return best;
}

const char* PathName(Crc32cPath path) {
  switch (path) {
    case Crc32cPath::kPortable:
      return "table";
    case Crc32cPath::kCrc32:
      return "crc32";
    case Crc32cPath::kFold256:
      return "fold256";
  }
  return "?";
}

int Main() {
  const std::vector<size_t> sizes = {size_t{256} << 10, size_t{7} << 20, size_t{28} << 20};
  std::vector<Crc32cPath> paths;
  for (Crc32cPath p : {Crc32cPath::kPortable, Crc32cPath::kCrc32, Crc32cPath::kFold256}) {
    if (Crc32cHasPath(p)) paths.push_back(p);
  }
  volatile uint64_t sink = 0;
  std::string json = absl::StrFormat("{\"bench\":\"crc32c\",\"best_path\":\"%s\",\"sizes\":[",
                                     PathName(Crc32cBestPath()));
  printf("%9s %8s %8s", "bytes", "read", "memcpy");
  for (Crc32cPath p : paths) printf(" %8s", PathName(p));
  printf(" %9s %11s %11s\n", "copy+crc", "best/read", "copy+crc/mc");
  for (size_t bytes : sizes) {
    std::vector<uint8_t> src(bytes), dst(bytes);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
    const double read = Measure(bytes, [&] {
      uint64_t sum = 0;
      for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v;
        std::memcpy(&v, src.data() + i, 8);
        sum += v;
      }
      sink = sink + sum;
    });
    const double copy = Measure(bytes, [&] { std::memcpy(dst.data(), src.data(), bytes); });
    printf("%9zu %8.2f %8.2f", bytes, read, copy);
    std::string per_path;
    double best = 0;
    for (Crc32cPath p : paths) {
      // The table runs at ~1 GB/s: a smaller share of the bytes suffices.
      const double gbps =
          Measure(bytes,
                  [&] {
                    sink = sink + Crc32cExtendWith(p, 0, src.data(),
                                                   p == Crc32cPath::kPortable ? bytes / 16 : bytes);
                  }) *
          (p == Crc32cPath::kPortable ? 1.0 / 16 : 1.0);
      if (p == Crc32cBestPath()) best = gbps;
      printf(" %8.2f", gbps);
      absl::StrAppendFormat(&per_path, ",\"%s_gbps\":%.3f", PathName(p), gbps);
    }
    const double fused =
        Measure(bytes, [&] { sink = sink + Crc32cCopy(dst.data(), src.data(), bytes); });
    printf(" %9.2f %11.2f %11.2f\n", fused, best / read, fused / copy);
    absl::StrAppendFormat(
        &json,
        "%s{\"bytes\":%zu,\"read_gbps\":%.3f,\"memcpy_gbps\":%.3f%s,"
        "\"copy_crc_gbps\":%.3f,\"best_vs_read\":%.3f,\"copy_crc_vs_memcpy\":%.3f}",
        bytes == sizes.front() ? "" : ",", bytes, read, copy, per_path, fused, best / read,
        fused / copy);
  }
  printf("%s]}\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::Main();
}
