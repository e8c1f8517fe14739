#include "model/cpu/weight_memory.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace mmserve::model::cpu {
namespace {

TEST_CASE("weight memory is aligned for huge pages from 2 MiB, and usable", "[weights]") {
  for (size_t bytes : {size_t{1}, size_t{4095}, size_t{100000}, (size_t{2} << 20) - 1,
                       size_t{2} << 20, (size_t{5} << 20) + 77}) {
    INFO("bytes=" << bytes);
    auto* p = static_cast<uint8_t*>(AllocateWeightMemory(bytes));
    REQUIRE(p != nullptr);
    const size_t align = bytes >= (size_t{2} << 20) ? (size_t{2} << 20) : 4096;
    CHECK(reinterpret_cast<uintptr_t>(p) % align == 0);
    std::memset(p, 0xA5, bytes);  // every byte asked for is writable
    CHECK(p[bytes - 1] == 0xA5);
    std::free(p);
  }
}

}  // namespace
}  // namespace mmserve::model::cpu
