// MediaGather over a real transfer engine (UCX within this machine) and no
// encoder: what it does for a prompt without images, an encoder nobody
// answers at, a retry that overtakes its request, a cancel, and images
// expected in the prefix cache (found, or lost to an encoder).
#include "language_service/media_gather.h"

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/event_loop.h"
#include "common/metrics.h"

namespace mmserve::language {
namespace {

// The gather on a loop of its own, with the requests the hooks find.
struct Fixture {
  Fixture() {
    transfer::TransferEngineOptions topts;
    topts.instance_id = "gather-test";
    topts.layout.block_size = 16;
    topts.layout.num_blocks = 8;
    topts.layout.hidden_size = 8;
    topts.layout.dtype_bytes = sizeof(float);
    auto t = transfer::TransferEngine::Create(topts);
    REQUIRE(t.ok());
    transfer = std::move(*t);
    images = std::make_unique<MediaGather>(
        MediaGatherOptions{.name = "gather-test",
                           .lost_image_timeout = absl::Seconds(5),
                           .connect_timeout = absl::Seconds(2)},
        *transfer, metrics,
        MediaGather::Hooks{
            .post = [this](absl::AnyInvocable<void()> task) { return loop.Post(std::move(task)); },
            .find = [this](const std::string& id) -> LiveRequest* {
              auto it = requests.find(id);
              return it == requests.end() ? nullptr : it->second.get();
            },
            .on_ready = [this](LiveRequest& r) { ready.push_back(r.id); }});
  }
  ~Fixture() {
    images->Stop();
    loop.Stop();
  }

  // A request with `n` images, each from an encoder at `address`, started on
  // the loop.
  LiveRequest& Start(const std::string& id, int n, const std::string& address) {
    auto r = std::make_unique<LiveRequest>();
    r->id = id;
    r->sink.on_batch = [this](v1::TokenBatch b) { batches.push_back(std::move(b)); };
    for (int k = 0; k < n; ++k) {
      LiveRequest::Image im;
      im.meta.set_image_index(static_cast<uint32_t>(k));
      im.meta.set_encoder_id("encoder-0");
      im.meta.set_encoder_address(address);
      r->images.push_back(std::move(im));
    }
    LiveRequest& ref = *r;
    REQUIRE(loop.RunAndWait([&] {
                  requests[id] = std::move(r);
                  images->Start(ref);
                  return absl::OkStatus();
                })
                .ok());
    return ref;
  }
  // Waits (on the loop's side) until `done` holds.
  bool WaitFor(const std::function<bool()>& done) {
    const Deadline d = Deadline::After(absl::Seconds(10));
    while (!d.Expired()) {
      bool ok = false;
      REQUIRE(loop.RunAndWait([&] {
                    ok = done();
                    return absl::OkStatus();
                  })
                  .ok());
      if (ok) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  metrics::Registry registry;
  LanguageMetrics metrics{registry};
  std::unique_ptr<transfer::TransferEngine> transfer;
  EventLoop loop{EventLoopOptions{.name = "gather-test-loop"}};
  // Loop thread only.
  std::map<std::string, std::unique_ptr<LiveRequest>> requests;
  std::vector<std::string> ready;
  std::vector<v1::TokenBatch> batches;
  std::unique_ptr<MediaGather> images;  // last: stopped before the rest goes
};

TEST_CASE("a prompt without images is ready at once", "[media_gather]") {
  Fixture f;
  LiveRequest& r = f.Start("text", 0, "");
  CHECK(f.WaitFor([&] { return f.ready == std::vector<std::string>{"text"}; }));
  CHECK(r.multimodal_ms == 0);
  CHECK(f.batches.empty());
}

TEST_CASE("images whose encoder does not answer are reported lost, once each", "[media_gather]") {
  Fixture f;
  // Port 1 on this machine: nothing listens, the Connect call fails.
  LiveRequest& r = f.Start("lost", 2, "127.0.0.1:1");
  REQUIRE(f.WaitFor([&] { return !f.batches.empty(); }));
  CHECK(f.WaitFor([&] { return r.lost_deadline.has_value(); }));
  const v1::TokenBatch& b = f.batches[0];
  CHECK(b.request_id() == "lost");
  CHECK(b.lost_images_size() == 2);
  CHECK(!b.lost_reason().empty());
  CHECK(f.metrics.lost_images->value() == 2);
  CHECK(f.ready.empty());
  for (const LiveRequest::Image& im : r.images) {
    CHECK(im.state == LiveRequest::MediaState::kLost);
  }
}

TEST_CASE("a retry that overtakes its request is applied when the request starts",
          "[media_gather]") {
  Fixture f;
  v1::ImageRetry retry;
  retry.set_request_id("early");
  v1::PromptImage* moved = retry.add_images();
  moved->set_image_index(0);
  moved->set_encoder_id("encoder-1");
  moved->set_encoder_address("127.0.0.1:2");
  f.images->KeepEarly(retry);
  LiveRequest& r = f.Start("early", 1, "127.0.0.1:1");
  // The image now comes from the retry's encoder (which fails in turn).
  CHECK(f.WaitFor([&] { return r.images[0].meta.encoder_id() == "encoder-1"; }));
  CHECK(f.WaitFor([&] { return r.images[0].state == LiveRequest::MediaState::kLost; }));
  CHECK(f.ready.empty());
}

TEST_CASE("images expected cached are ready at once, rowless, and lost when not found",
          "[media_gather]") {
  Fixture f;
  auto r = std::make_unique<LiveRequest>();
  r->id = "cached";
  r->sink.on_batch = [&f](v1::TokenBatch b) { f.batches.push_back(std::move(b)); };
  for (uint32_t k = 0; k < 2; ++k) {
    LiveRequest::Image im;
    im.meta.set_image_index(k);
    im.meta.set_expect_cached(true);
    im.meta.set_transfer_id("cached@kv");
    im.meta.mutable_content_hash()->set_low(10 + k);
    im.meta.set_grid_t(1);
    im.meta.set_grid_h(4);
    im.meta.set_grid_w(6);
    r->images.push_back(std::move(im));
  }
  LiveRequest& ref = *r;
  REQUIRE(f.loop
              .RunAndWait([&] {
                f.requests["cached"] = std::move(r);
                f.images->Start(ref);
                return absl::OkStatus();
              })
              .ok());
  REQUIRE(f.WaitFor([&] { return f.ready == std::vector<std::string>{"cached"}; }));
  REQUIRE(ref.engine_request.image_embeddings.size() == 2);
  for (const worker::MediaEmbedding& e : ref.engine_request.image_embeddings) {
    CHECK(e.cached);
    CHECK(e.values.empty());
    CHECK(e.shared_values == nullptr);
    CHECK(e.grid.num_tokens() == 6);  // 4 x 6 patches, merged 2 x 2
  }
  CHECK(ref.engine_request.image_embeddings[1].key == ContentHash{0, 11});
  CHECK(ref.image_tokens == 12);
  CHECK(f.batches.empty());
  // The engine did not find their KV: both are reported lost under their
  // transfer id, and the request waits for them again.
  int lost = 0;
  REQUIRE(f.loop
              .RunAndWait([&] {
                lost = f.images->LoseCached(ref, absl::FailedPreconditionError("evicted"));
                return absl::OkStatus();
              })
              .ok());
  CHECK(lost == 2);
  REQUIRE(f.WaitFor([&] { return f.batches.size() == 1; }));
  CHECK(f.batches[0].lost_images_size() == 2);
  CHECK(f.batches[0].lost_transfer_id() == "cached@kv");
  CHECK(f.batches[0].lost_reason() == "evicted");
  CHECK(f.WaitFor([&] { return ref.lost_deadline.has_value(); }));
  CHECK(ref.engine_request.image_embeddings.empty());
  CHECK(ref.image_tokens == 0);
  for (const LiveRequest::Image& im : ref.images) {
    CHECK(im.state == LiveRequest::MediaState::kLost);
  }
}

}  // namespace
}  // namespace mmserve::language
