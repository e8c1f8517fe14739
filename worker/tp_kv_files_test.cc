#include "worker/tp_kv_files.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

namespace mmserve::worker {
namespace {

model::KvCacheShape Shape(int64_t blocks) {
  return {.num_layers = 2, .num_blocks = blocks, .block_size = 4, .num_kv_heads = 1, .head_dim = 8};
}

TEST_CASE("rank 0 reads what a shard rank process writes into its KV cache file") {
  auto files = TpKvFiles::Create(3);
  REQUIRE(files.ok());
  REQUIRE((*files)->fds().size() == 2);
  // Rank 0 maps rank 2's cache before any forward (as the prefill role
  // does once the engine is sized; mapping zeroes the cache).
  auto view = (*files)->Map(2, Shape(6));
  REQUIRE(view.ok());
  // The shard: a child process that maps the file as a rank does on
  // kAllocateKv and writes its last layer's values.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ShardKvFile hooks(dup((*files)->fds()[1]));
    absl::StatusOr<model::KvCache*> kv = hooks.Allocate(Shape(6));
    if (!kv.ok()) _exit(2);
    for (int64_t i = 0; i < Shape(6).LayerPlaneFloats(); ++i) (*kv)->Value(1)[i] = 0.5f * i;
    _exit(hooks.Register(**kv).code() == absl::StatusCode::kFailedPrecondition ? 0 : 3);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const model::KvCache& kv = (*view)->cache();
  for (int64_t i = 0; i < Shape(6).LayerPlaneFloats(); ++i) {
    REQUIRE(kv.Value(1)[i] == 0.5f * i);
    REQUIRE(kv.Key(0)[i] == 0.0f);
  }
}

TEST_CASE("a file grows to the larger cache and is never shrunk under a mapping") {
  auto files = TpKvFiles::Create(2);
  REQUIRE(files.ok());
  auto small = (*files)->Map(1, Shape(2));
  REQUIRE(small.ok());
  ShardKvFile hooks(dup((*files)->fds()[0]));
  auto big = hooks.Allocate(Shape(8));
  REQUIRE(big.ok());
  (*big)->Key(0)[1] = 3.0f;
  CHECK((*small)->cache().Key(0)[1] == 3.0f);
  // Mapping the small shape again does not shrink the file under the big
  // mapping.
  auto again = (*files)->Map(1, Shape(2));
  REQUIRE(again.ok());
  (*big)->Value(1)[Shape(8).LayerPlaneFloats() - 1] = 1.0f;
  CHECK((*big)->Value(1)[Shape(8).LayerPlaneFloats() - 1] == 1.0f);
  std::vector<int32_t> none;
  CHECK(hooks.Check(**big, none).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("ranks without a file are refused") {
  auto files = TpKvFiles::Create(2);
  REQUIRE(files.ok());
  CHECK((*files)->Map(0, Shape(2)).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK((*files)->Map(2, Shape(2)).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::worker
