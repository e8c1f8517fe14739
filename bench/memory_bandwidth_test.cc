// bench:memory_bandwidth: the read reference is the best of its methods and
// says which; footprints are placed in the cache level they fit.
#include "bench/memory_bandwidth.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "model/cpu/thread_pool.h"

namespace mmserve::bench {
namespace {

TEST_CASE("the read reference is the largest method and names it", "[memory_bandwidth]") {
  MemoryBandwidth b;
  b.read_sum_bytes_per_s = 10;
  b.read_streams_bytes_per_s = 30;
  b.read_nt_bytes_per_s = 20;
  b.read_cpu_time_bytes_per_s = 5;
  CHECK(b.best_read() == 30);
  CHECK(std::string(b.best_read_method()) == "streams");
  b.read_cpu_time_bytes_per_s = 40;
  CHECK(b.best_read() == 40);
  CHECK(std::string(b.best_read_method()) == "streams_cpu_time");
  b.read_nt_bytes_per_s = 50;
  CHECK(std::string(b.best_read_method()) == "nt");
}

TEST_CASE("a footprint is placed in the cache level it fits", "[memory_bandwidth]") {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE), l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  CHECK(FootprintLevel(size_t{1} << 40, 2) == "dram");
  if (l2 > 0) CHECK(FootprintLevel(4096, 1) == "l2");
  if (l2 > 0 && l3 > 2 * l2) CHECK(FootprintLevel(2 * static_cast<size_t>(l2), 1) == "l3");
}

TEST_CASE("every method measures a rate on every thread", "[memory_bandwidth]") {
  model::cpu::ThreadPool pool(2);
  const MemoryBandwidth b = MeasureMemoryBandwidth(pool, size_t{16} << 20, 1);
  CHECK(b.copy_bytes_per_s > 0);
  CHECK(b.read_sum_bytes_per_s > 0);
  CHECK(b.read_streams_bytes_per_s > 0);
  CHECK(b.read_nt_bytes_per_s > 0);
  CHECK(b.read_cpu_time_bytes_per_s > 0);
  CHECK(b.best_read() >= b.read_sum_bytes_per_s);
}

}  // namespace
}  // namespace mmserve::bench
