#include "worker/cli_args.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace mmserve::worker {
namespace {

// argv built from strings, with the trailing null argv has.
struct Argv {
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (std::string& s : args) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
    argc = static_cast<int>(args.size());
  }
  std::vector<std::string> Rest() const { return {ptrs.begin(), ptrs.begin() + argc}; }
  std::vector<std::string> args;
  std::vector<char*> ptrs;
  int argc;
};

TEST_CASE("every occurrence of a repeated flag is kept, in order, commas included", "[cli]") {
  Argv a({"generate", "--image=a.png", "--prompt=hi", "--image", "b,c.png", "-image=d.png",
          "--images=x"});
  auto v = TakeRepeatedFlag(&a.argc, a.ptrs.data(), "image");
  REQUIRE(v.ok());
  CHECK(*v == std::vector<std::string>{"a.png", "b,c.png", "d.png"});
  CHECK(a.Rest() == std::vector<std::string>{"generate", "--prompt=hi", "--images=x"});
  CHECK(a.ptrs[a.argc] == nullptr);
}

TEST_CASE("arguments after -- are left alone", "[cli]") {
  Argv a({"generate", "--", "--image=a.png"});
  auto v = TakeRepeatedFlag(&a.argc, a.ptrs.data(), "image");
  REQUIRE(v.ok());
  CHECK(v->empty());
  CHECK(a.argc == 3);
}

TEST_CASE("a flag without a value is refused", "[cli]") {
  Argv a({"generate", "--image"});
  CHECK(TakeRepeatedFlag(&a.argc, a.ptrs.data(), "image").status().code() ==
        absl::StatusCode::kInvalidArgument);
  Argv b({"generate", "--image="});
  CHECK(TakeRepeatedFlag(&b.argc, b.ptrs.data(), "image").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::worker
