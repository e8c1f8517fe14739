// Memory for repacked weights (bf16 panels, int8 panels).
//
// A decode step streams every weight once, hundreds of MiB, and with 4 KiB
// pages it walks a page table every 4 KiB: measured on Qwen2-0.5B dims with
// int8 weights, asking for 2 MiB pages (transparent huge pages; the kernel
// here grants them only on madvise) made the step 1.3x faster against the
// same bf16 run (int8_vs_bf16_tg 1.45 -> 1.85, medians of five alternating
// runs). The advice is best effort: without huge pages the memory works the
// same.
#ifndef MMSERVE_MODEL_CPU_WEIGHT_MEMORY_H_
#define MMSERVE_MODEL_CPU_WEIGHT_MEMORY_H_

#include <cstddef>

namespace mmserve::model::cpu {

// `bytes` (rounded up to 4 KiB), aligned to 2 MiB with huge pages requested
// for its whole 2 MiB pages when at least 2 MiB, else aligned to 4 KiB;
// nullptr when out of memory. Release with std::free.
void* AllocateWeightMemory(size_t bytes);

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_WEIGHT_MEMORY_H_
