#include "model/cpu/weight_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace mmserve::model::cpu {

void* AllocateWeightMemory(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t rounded = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
  const size_t align = bytes >= kHugePage ? kHugePage : 4096;
  // posix_memalign, not aligned_alloc: the size need not be a multiple of
  // the alignment (the tail stays on small pages).
  void* p = nullptr;
  if (::posix_memalign(&p, align, rounded) != 0) return nullptr;
  // Huge pages only where whole ones fit: a huge page for the tail would be
  // resident in full however little of it the weights use. Advised before
  // the first write, so the pages are huge from the start.
  const size_t huge = bytes / kHugePage * kHugePage;
  if (huge > 0) ::madvise(p, huge, MADV_HUGEPAGE);
  return p;
}

}  // namespace mmserve::model::cpu
