// Runs the generate binary as a user would (tiny golden model, test images)
// and checks what it prints and how it exits.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>

#include "common/file.h"

namespace mmserve {
namespace {

constexpr char kModel[] = "model/testdata/models/qwen2vl-tiny-mha-tied";
constexpr char kPng[] = "model/testdata/images/rgb.png";
constexpr char kJpg[] = "model/testdata/images/baseline.jpg";

struct Run {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Run Generate(const std::string& args) {
  const std::string cmd = std::string("cli/generate --model_dir=") + kModel +
                          " --prompt='What is it?' --max_tokens=2 " + args + " 2>&1";
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// "prompt N tokens" from the summary line.
int PromptTokens(const Run& r) {
  std::smatch m;
  INFO(r.output);
  REQUIRE(std::regex_search(r.output, m, std::regex("prompt (\\d+) tokens")));
  return std::stoi(m[1]);
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST_CASE("repeated --image passes every image", "[generate]") {
  const int none = PromptTokens(Generate(""));
  const int one = PromptTokens(Generate(std::string("--image=") + kPng));
  const int two = PromptTokens(Generate(std::string("--image=") + kPng + " --image " + kPng));
  CHECK(one > none);
  CHECK(two - none == 2 * (one - none));
  const int mixed = PromptTokens(Generate(std::string("--image=") + kPng + " --image=" + kJpg));
  CHECK(mixed > one);
}

TEST_CASE("a path with a comma is one image", "[generate]") {
  const std::string copy = TempPath("a,b.png");
  {
    auto bytes = ReadFileToString(kPng);
    REQUIRE(bytes.ok());
    std::ofstream(copy, std::ios::binary) << *bytes;
  }
  const Run r = Generate("'--image=" + copy + "'");
  CHECK(r.exit_code == 0);
  CHECK(PromptTokens(r) == PromptTokens(Generate(std::string("--image=") + kPng)));
  // Two paths joined by a comma are not split: the error says how to pass two.
  const Run joined = Generate(std::string("--image=") + kPng + "," + kJpg);
  INFO(joined.output);
  CHECK(joined.exit_code == 2);
  CHECK(joined.output.find("repeat --image") != std::string::npos);
}

TEST_CASE("negative --threads, --kv_cache_mb and --max_tokens are refused", "[generate]") {
  for (const char* flag : {"--threads=-3", "--kv_cache_mb=-1", "--max_tokens=0"}) {
    const Run r = Generate(flag);
    INFO(flag << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(flag) != std::string::npos);
  }
}

// A 202x1 24-bit BMP: aspect ratio 202, above the limit of 200.
void WriteWideBmp(const std::string& path) {
  const int w = 202, h = 1, row = (w * 3 + 3) / 4 * 4;
  std::string b = "BM";
  auto le32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  auto le16 = [&](uint16_t v) {
    b.push_back(static_cast<char>(v & 0xff));
    b.push_back(static_cast<char>(v >> 8));
  };
  le32(54 + row * h);
  le32(0);
  le32(54);
  le32(40);
  le32(w);
  le32(h);
  le16(1);
  le16(24);
  le32(0);
  le32(row * h);
  le32(2835);
  le32(2835);
  le32(0);
  le32(0);
  b.append(row * h, '\x80');
  std::ofstream(path, std::ios::binary) << b;
}

TEST_CASE("every image error names the file, the aspect-ratio one too", "[generate]") {
  const std::string wide = TempPath("wide202x1.bmp");
  WriteWideBmp(wide);
  const Run r = Generate("--image=" + wide);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find(wide + ": ") != std::string::npos);
  CHECK(r.output.find("aspect ratio") != std::string::npos);
  const std::string junk = TempPath("junk.png");
  std::ofstream(junk) << "not an image";
  const Run j = Generate("--image=" + junk);
  CHECK(j.exit_code == 2);
  CHECK(j.output.find(junk + ": ") != std::string::npos);
}

TEST_CASE("the KV cache is sized by what the engine can use, and the log says so", "[generate]") {
  const Run r = Generate("");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  // 32 sequences x max_model_len 8192 (the cap) / 16 = 16384 blocks of this
  // tiny model fit in 30% of any test machine's free memory.
  CHECK(r.output.find("KV cache 16384 blocks") != std::string::npos);
  CHECK(r.output.find("all the engine can use") != std::string::npos);
}

}  // namespace
}  // namespace mmserve
