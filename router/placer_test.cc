// Placement over real instance tables polling in-process language
// instances: bursts spread because the router counts what it placed since
// each report, charges leave as reports catch up or calls end.
#include "router/placer.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/event_loop.h"
#include "common/grpc_server.h"
#include "router/call_testing.h"
#include "scheduler/prompt_prefix.h"

namespace mmserve::router {
namespace {

// A language instance whose load report the test sets.
class Reporting final : public iv1::Language::Service {
 public:
  explicit Reporting(std::string id) : id_(std::move(id)) {}
  grpc::Status GetLoad(grpc::ServerContext*, const iv1::LoadRequest*,
                       iv1::LoadReport* load) override {
    absl::MutexLock lock(&mu_);
    *load = load_;
    load->set_instance_id(id_);
    load->set_accepting(true);
    return grpc::Status::OK;
  }
  void Set(const iv1::LoadReport& load) {
    absl::MutexLock lock(&mu_);
    load_ = load;
  }

 private:
  const std::string id_;
  absl::Mutex mu_;
  iv1::LoadReport load_ ABSL_GUARDED_BY(mu_);
};

iv1::LoadReport Free(uint32_t kv_blocks) {
  iv1::LoadReport load;
  load.set_kv_blocks_free(kv_blocks);
  load.set_kv_token_slots_free(uint64_t{kv_blocks} * 16);
  return load;
}

// Instances of the given roles (ids "<prefix><k>"), each polled by one table.
class Pool {
 public:
  Pool(const std::vector<std::pair<std::string, iv1::InstanceRole>>& instances,
       absl::Duration report_catch_up, const PrefixIndexOptions& prefix = {})
      : table_({.poll_interval = absl::Milliseconds(10),
                .report_catch_up = report_catch_up,
                .prefix = prefix}) {
    for (const auto& [id, role] : instances) {
      auto& service = services_.emplace_back(std::make_unique<Reporting>(id));
      service->Set(Free(1000));
      auto server = StartGrpcServer("127.0.0.1:0", {service.get()});
      REQUIRE(server.ok());
      iv1::InstanceInfo info;
      info.set_instance_id(id);
      info.set_role(role);
      info.set_grpc_address(absl::StrCat("127.0.0.1:", (*server)->port()));
      info.mutable_capacity()->set_kv_block_size(16);
      servers_.push_back(*std::move(server));
      table_.Upsert(info);
    }
    table_.Start(loop_);
    REQUIRE(WaitFor([&] {
      for (const auto& [id, role] : instances) {
        if (!table_.IsHealthy(id)) return false;
      }
      return true;
    }));
  }
  ~Pool() { table_.Stop(); }

  InstanceTable& table() { return table_; }
  Reporting& service(size_t k) { return *services_[k]; }

 private:
  EventLoop loop_{{.name = "router"}};
  std::vector<std::unique_ptr<Reporting>> services_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  InstanceTable table_;
};

mmserve::v1::GenerateRequest Chat(const std::string& text) {
  mmserve::v1::GenerateRequest r;
  auto* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->add_content()->set_text(text);
  return r;
}

// Places `request` (with `images`) as call `id` with a new placer (one per
// call, as ChoosePlacer makes them); the placement's instance ids, and its
// media_on_held_prefix in `held` when given.
template <typename P>
std::vector<std::string> PlaceOne(InstanceTable& table, std::unique_ptr<Placer>& placer,
                                  const std::string& id,
                                  const mmserve::v1::GenerateRequest& request,
                                  std::vector<PreparedMedia> images = {},
                                  uint32_t* held = nullptr) {
  placer = std::make_unique<P>(table);
  std::vector<std::string> ids;
  placer->Place({.id = id, .request = &request, .images = &images},
                [&](absl::StatusOr<Placement> p) {
                  REQUIRE(p.ok());
                  for (const auto& i : p->instances) ids.push_back(i->id);
                  if (held != nullptr) *held = p->media_on_held_prefix;
                });
  return ids;
}

constexpr absl::Duration kNeverCaughtUp = absl::Hours(1);

TEST_CASE("a burst on two role-both instances spreads though no report has counted it yet") {
  Pool pool({{"a", iv1::INSTANCE_ROLE_BOTH}, {"b", iv1::INSTANCE_ROLE_BOTH}}, kNeverCaughtUp);
  const mmserve::v1::GenerateRequest request = Chat("describe the picture in detail");
  std::vector<std::unique_ptr<Placer>> placers(8);
  std::map<std::string, int> per_instance;
  for (int k = 0; k < 8; ++k) {
    for (const std::string& id :
         PlaceOne<BothPlacer>(pool.table(), placers[k], absl::StrCat("r", k), request)) {
      ++per_instance[id];
    }
  }
  CHECK(per_instance["a"] == 4);
  CHECK(per_instance["b"] == 4);
  const std::vector<InstanceLoad> loads = pool.table().Loads(Role::kLanguage);
  REQUIRE(loads.size() == 2);
  CHECK(loads[0].unreported.requests == 4);
  CHECK(loads[0].unreported.tokens == 4 * EstimatePromptTokens({.request = &request}));
}

TEST_CASE("a concurrent burst on two role-both instances spreads") {
  Pool pool({{"a", iv1::INSTANCE_ROLE_BOTH}, {"b", iv1::INSTANCE_ROLE_BOTH}}, kNeverCaughtUp);
  const mmserve::v1::GenerateRequest request = Chat("what is in the image?");
  std::vector<std::unique_ptr<Placer>> placers(8);
  std::vector<std::vector<std::string>> placed(8);
  std::vector<std::thread> threads;
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&, k] {
      placed[k] = PlaceOne<BothPlacer>(pool.table(), placers[k], absl::StrCat("r", k), request);
    });
  }
  for (auto& t : threads) t.join();
  std::map<std::string, int> per_instance;
  for (const auto& ids : placed) ++per_instance[ids.at(0)];
  CHECK(per_instance["a"] == 4);
  CHECK(per_instance["b"] == 4);
}

TEST_CASE("a P/D burst spreads over the decode instances and every call is charged to both") {
  Pool pool({{"d0", iv1::INSTANCE_ROLE_DECODE},
             {"d1", iv1::INSTANCE_ROLE_DECODE},
             {"p0", iv1::INSTANCE_ROLE_PREFILL}},
            kNeverCaughtUp);
  const mmserve::v1::GenerateRequest request = Chat("hello");
  std::vector<std::unique_ptr<Placer>> placers(8);
  std::map<std::string, int> per_instance;
  for (int k = 0; k < 8; ++k) {
    const std::vector<std::string> ids =
        PlaceOne<PdPlacer>(pool.table(), placers[k], absl::StrCat("r", k), request);
    REQUIRE(ids.size() == 2);
    CHECK(ids[0] == "p0");
    ++per_instance[ids[1]];
  }
  CHECK(per_instance["d0"] == 4);
  CHECK(per_instance["d1"] == 4);
  CHECK(pool.table().Loads(Role::kPrefill).at(0).unreported.requests == 8);
}

TEST_CASE("a decode instance with much more free KV still takes the burst first") {
  Pool pool({{"d0", iv1::INSTANCE_ROLE_DECODE},
             {"d1", iv1::INSTANCE_ROLE_DECODE},
             {"p0", iv1::INSTANCE_ROLE_PREFILL}},
            kNeverCaughtUp);
  pool.service(1).Set(Free(2000));
  REQUIRE(WaitFor([&] { return pool.table().LastLoad("d1").kv_blocks_free() == 2000; }));
  const mmserve::v1::GenerateRequest request = Chat("hello");
  std::vector<std::unique_ptr<Placer>> placers(8);
  for (int k = 0; k < 8; ++k) {
    CHECK(PlaceOne<PdPlacer>(pool.table(), placers[k], absl::StrCat("r", k), request).at(1) ==
          "d1");
  }
}

TEST_CASE("a call that ends takes its charge back") {
  Pool pool({{"a", iv1::INSTANCE_ROLE_BOTH}, {"b", iv1::INSTANCE_ROLE_BOTH}}, kNeverCaughtUp);
  const mmserve::v1::GenerateRequest request = Chat("hi");
  std::vector<std::unique_ptr<Placer>> placers(3);
  CHECK(PlaceOne<BothPlacer>(pool.table(), placers[0], "r0", request).at(0) == "a");
  CHECK(PlaceOne<BothPlacer>(pool.table(), placers[1], "r1", request).at(0) == "b");
  placers[0]->Released("r0");
  CHECK(pool.table().Loads(Role::kLanguage).at(0).unreported.requests == 0);
  CHECK(PlaceOne<BothPlacer>(pool.table(), placers[2], "r2", request).at(0) == "a");
}

TEST_CASE("a charge leaves once a report taken after it has come") {
  Pool pool({{"a", iv1::INSTANCE_ROLE_BOTH}}, absl::ZeroDuration());
  const mmserve::v1::GenerateRequest request = Chat("hi");
  std::unique_ptr<Placer> placer;
  REQUIRE(PlaceOne<BothPlacer>(pool.table(), placer, "r0", request).at(0) == "a");
  // The next report counts the request itself.
  iv1::LoadReport counted = Free(999);
  counted.set_waiting(1);
  pool.service(0).Set(counted);
  REQUIRE(
      WaitFor([&] { return pool.table().Loads(Role::kLanguage).at(0).unreported.requests == 0; }));
  const InstanceLoad load = pool.table().Loads(Role::kLanguage).at(0);
  CHECK(load.requests() == 1);
  CHECK(load.unreported.tokens == 0);
}

const ContentHash kCat{1, 2};
const ContentHash kDog{3, 4};

// A chat about one picture: the first turn, or the second (the first, the
// reply, a new question).
mmserve::v1::GenerateRequest Turn(int turn) {
  mmserve::v1::GenerateRequest r;
  auto* user = r.mutable_chat()->add_messages();
  user->set_role("user");
  user->add_content()->mutable_image()->set_data("the picture's bytes");
  user->add_content()->set_text("what is in this picture?");
  if (turn == 1) return r;
  auto* reply = r.mutable_chat()->add_messages();
  reply->set_role("assistant");
  reply->add_content()->set_text("a cat on a sofa");
  auto* next = r.mutable_chat()->add_messages();
  next->set_role("user");
  next->add_content()->set_text("what colour is the cat?");
  return r;
}

std::vector<PreparedMedia> Picture(const ContentHash& hash) {
  PreparedMedia m;
  m.hash = hash;
  m.grid = model::MediaGrid{.grid_h = 16, .grid_w = 16};  // 64 rows
  return {m};
}

// A report that lists the first turn about `hash` (`tokens` long) and
// `outstanding` tokens of work.
iv1::LoadReport Holding(const ContentHash& hash, uint32_t tokens, uint64_t outstanding) {
  iv1::LoadReport load = Free(1000);
  load.set_outstanding_tokens(outstanding);
  load.set_prefix_epoch(7);
  iv1::CachedPrefix* p = load.add_cached_prefixes();
  p->set_key(scheduler::ChatPrefixKeys(Turn(1).chat(), {hash}).keys.back());
  p->set_tokens(tokens);
  return load;
}

TEST_CASE("a chat's second turn goes where its first was computed, though that is busier") {
  Pool pool({{"a", iv1::INSTANCE_ROLE_BOTH}, {"b", iv1::INSTANCE_ROLE_BOTH}}, kNeverCaughtUp);
  // "b" computed the first turn (90 tokens) and has 60 tokens more work.
  pool.service(1).Set(Holding(kCat, 90, 60));
  REQUIRE(WaitFor([&] { return pool.table().LastLoad("b").prefix_epoch() == 7; }));
  std::vector<std::unique_ptr<Placer>> placers(3);
  uint32_t held = 9;
  CHECK(PlaceOne<BothPlacer>(pool.table(), placers[0], "r0", Turn(2), Picture(kCat), &held).at(0) ==
        "b");
  CHECK(held == 1);  // the picture is in the first message, whose KV "b" holds
  // The same chat about another picture shares nothing cached: by load.
  CHECK(PlaceOne<BothPlacer>(pool.table(), placers[1], "r1", Turn(2), Picture(kDog), &held).at(0) ==
        "a");
  CHECK(held == 0);
  // Much busier, the holder loses the next one.
  pool.service(1).Set(Holding(kCat, 90, 5000));
  REQUIRE(WaitFor([&] { return pool.table().LastLoad("b").outstanding_tokens() == 5000; }));
  CHECK(PlaceOne<BothPlacer>(pool.table(), placers[2], "r2", Turn(2), Picture(kCat)).at(0) == "a");
}

TEST_CASE("with --prefix_weight=0 the second turn goes by load") {
  Pool pool({{"a", iv1::INSTANCE_ROLE_BOTH}, {"b", iv1::INSTANCE_ROLE_BOTH}}, kNeverCaughtUp,
            {.weight = 0});
  pool.service(1).Set(Holding(kCat, 90, 60));
  REQUIRE(WaitFor([&] { return pool.table().LastLoad("b").prefix_epoch() == 7; }));
  std::unique_ptr<Placer> placer;
  uint32_t held = 9;
  CHECK(PlaceOne<BothPlacer>(pool.table(), placer, "r0", Turn(2), Picture(kCat), &held).at(0) ==
        "a");
  CHECK(held == 0);
}

TEST_CASE("a second turn sent before any report lists the first follows the router's placement") {
  Pool pool({{"a", iv1::INSTANCE_ROLE_PREFILL},
             {"b", iv1::INSTANCE_ROLE_PREFILL},
             {"d", iv1::INSTANCE_ROLE_DECODE}},
            kNeverCaughtUp);
  std::vector<std::unique_ptr<Placer>> placers(3);
  CHECK(PlaceOne<PdPlacer>(pool.table(), placers[0], "r0", Turn(1), Picture(kCat)).at(0) == "a");
  placers[0]->Released("r0");
  // "a" is busier now, but holds the first turn.
  pool.service(0).Set([] {
    iv1::LoadReport l = Free(1000);
    l.set_outstanding_tokens(40);
    return l;
  }());
  REQUIRE(WaitFor([&] { return pool.table().LastLoad("a").outstanding_tokens() == 40; }));
  uint32_t held = 9;
  CHECK(PlaceOne<PdPlacer>(pool.table(), placers[1], "r1", Turn(2), Picture(kCat), &held).at(0) ==
        "a");
  CHECK(held == 1);  // by the router's own placement of the first turn
  CHECK(PlaceOne<PdPlacer>(pool.table(), placers[2], "r2", Turn(2), Picture(kDog), &held).at(0) ==
        "b");
  CHECK(held == 0);
}

TEST_CASE("an estimate counts text by bytes and images by their rows") {
  mmserve::v1::GenerateRequest request = Chat(std::string(40, 'x'));
  std::vector<PreparedMedia> images(2);
  images[1].grid = model::MediaGrid{.grid_h = 4, .grid_w = 4};
  const uint64_t tokens = EstimatePromptTokens({.request = &request, .images = &images});
  CHECK(tokens == 10 + kUnsizedMediaTokens + images[1].grid->num_tokens());
}

}  // namespace
}  // namespace mmserve::router
