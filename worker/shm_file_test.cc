#include "worker/shm_file.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"

namespace mmserve::worker {
namespace {

TEST_CASE("a ShmFile is shared with a child through its descriptor and has no /dev/shm name") {
  const std::string name = absl::StrCat("shm-file-test-", getpid());
  auto f = ShmFile::Create(name, 1 << 20);
  REQUIRE(f.ok());
  for (size_t i = 0; i < (*f)->size(); ++i) CHECK((*f)->data()[i] == 0);
  for (size_t i = 0; i < (*f)->size(); ++i) (*f)->data()[i] = static_cast<uint8_t>(i * 7);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    CHECK(e.path().filename().string().find(name) == std::string::npos);
  }
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto child = ShmFile::MapInherited(dup((*f)->fd()), 1 << 20);
    if (!child.ok()) _exit(2);
    for (size_t i = 0; i < (*child)->size(); ++i) {
      if ((*child)->data()[i] != static_cast<uint8_t>(i * 7)) _exit(3);
    }
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("ShmFile refuses a closed descriptor, a short file and zero bytes") {
  CHECK(absl::IsInvalidArgument(ShmFile::MapInherited(-1, 4096).status()));
  CHECK(absl::IsInvalidArgument(ShmFile::Create("zero", 0).status()));
  auto f = ShmFile::Create("short", 4096);
  REQUIRE(f.ok());
  CHECK(absl::IsInvalidArgument(ShmFile::MapInherited(dup((*f)->fd()), 8192).status()));
}

}  // namespace
}  // namespace mmserve::worker
