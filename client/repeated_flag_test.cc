#include "client/repeated_flag.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace mmserve::client {
namespace {

// argv as the program would get it, with storage that outlives the call.
struct Argv {
  explicit Argv(std::vector<std::string> a) : storage(std::move(a)) {
    for (std::string& s : storage) args.push_back(s.data());
  }
  std::vector<std::string> Remaining() const { return {args.begin(), args.end()}; }
  std::vector<std::string> storage;
  std::vector<char*> args;
};

TEST_CASE("repeated --image values are collected in order, commas kept", "[repeated_flag]") {
  Argv argv({"cli", "--image=shots/a,b.png", "--prompt=x,y", "--image", "c.png", "-image=d.png",
             "-image", "e.png", "--images_dir=q", "--", "--image=after.png"});
  absl::StatusOr<std::vector<std::string>> images = ExtractRepeatedFlag(&argv.args, "image");
  REQUIRE(images.ok());
  CHECK(*images == std::vector<std::string>{"shots/a,b.png", "c.png", "d.png", "e.png"});
  // Everything else stays for absl, in order; nothing after "--" is touched.
  CHECK(argv.Remaining() == std::vector<std::string>{"cli", "--prompt=x,y", "--images_dir=q", "--",
                                                     "--image=after.png"});
}

TEST_CASE("an empty value is kept and a missing value is an error", "[repeated_flag]") {
  Argv with_empty({"cli", "--stop=", "--stop=\n\n"});
  absl::StatusOr<std::vector<std::string>> stops = ExtractRepeatedFlag(&with_empty.args, "stop");
  REQUIRE(stops.ok());
  CHECK(*stops == std::vector<std::string>{"", "\n\n"});

  Argv missing({"cli", "--prompt=hi", "--image"});
  absl::StatusOr<std::vector<std::string>> r = ExtractRepeatedFlag(&missing.args, "image");
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message() == "--image needs a value");
}

TEST_CASE("no occurrence leaves argv as it was", "[repeated_flag]") {
  Argv argv({"cli", "--prompt=hi", "image", "--max_tokens=3"});
  absl::StatusOr<std::vector<std::string>> images = ExtractRepeatedFlag(&argv.args, "image");
  REQUIRE(images.ok());
  CHECK(images->empty());
  CHECK(argv.Remaining() ==
        std::vector<std::string>{"cli", "--prompt=hi", "image", "--max_tokens=3"});
}

}  // namespace
}  // namespace mmserve::client
