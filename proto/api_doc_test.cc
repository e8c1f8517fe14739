// The API is the contract between processes and with users: every service,
// method, message, field, enum and enum value must say what it means. This
// test reads the descriptor set (with source comments) that protoc wrote and
// lists everything undocumented.
#include <google/protobuf/descriptor.pb.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using google::protobuf::FileDescriptorProto;
using google::protobuf::FileDescriptorSet;

// Paths into FileDescriptorProto / DescriptorProto (descriptor.proto field
// numbers), as SourceCodeInfo.Location.path uses them.
constexpr int kFileMessage = 4, kFileEnum = 5, kFileService = 6;
constexpr int kMessageField = 2, kMessageNested = 3, kMessageEnum = 4, kMessageOneof = 8;
constexpr int kEnumValue = 2, kServiceMethod = 2;

FileDescriptorSet LoadSet() {
  std::ifstream in("proto/api_descriptor_set.pb", std::ios::binary);
  REQUIRE(in.good());
  std::stringstream bytes;
  bytes << in.rdbuf();
  FileDescriptorSet set;
  REQUIRE(set.ParseFromString(bytes.str()));
  return set;
}

struct Checker {
  const FileDescriptorProto& file;
  std::vector<std::string>* missing;

  bool Documented(const std::vector<int>& path) const {
    for (const auto& loc : file.source_code_info().location()) {
      if (loc.path_size() != static_cast<int>(path.size())) continue;
      if (!std::equal(path.begin(), path.end(), loc.path().begin())) continue;
      return !loc.leading_comments().empty() || !loc.trailing_comments().empty();
    }
    return false;
  }

  void Require(const std::vector<int>& path, const std::string& what) const {
    if (!Documented(path)) missing->push_back(file.name() + ": " + what);
  }

  void Enum(const google::protobuf::EnumDescriptorProto& e, std::vector<int> path,
            const std::string& scope) const {
    Require(path, "enum " + scope + e.name());
    for (int v = 0; v < e.value_size(); ++v) {
      auto p = path;
      p.insert(p.end(), {kEnumValue, v});
      Require(p, "enum value " + scope + e.name() + "." + e.value(v).name());
    }
  }

  void Message(const google::protobuf::DescriptorProto& m, std::vector<int> path,
               const std::string& scope) const {
    const std::string name = scope + m.name();
    // A method's request/response message is described by the method.
    const bool rpc_message = name.size() > 7 && (name.rfind("Request") == name.size() - 7 ||
                                                 name.rfind("Response") == name.size() - 8);
    if (!rpc_message) Require(path, "message " + name);
    for (int f = 0; f < m.field_size(); ++f) {
      auto p = path;
      p.insert(p.end(), {kMessageField, f});
      Require(p, "field " + name + "." + m.field(f).name());
    }
    for (int o = 0; o < m.oneof_decl_size(); ++o) {
      if (m.oneof_decl(o).name().rfind("_", 0) == 0) continue;  // proto3 optional
      auto p = path;
      p.insert(p.end(), {kMessageOneof, o});
      Require(p, "oneof " + name + "." + m.oneof_decl(o).name());
    }
    for (int n = 0; n < m.nested_type_size(); ++n) {
      auto p = path;
      p.insert(p.end(), {kMessageNested, n});
      Message(m.nested_type(n), p, name + ".");
    }
    for (int e = 0; e < m.enum_type_size(); ++e) {
      auto p = path;
      p.insert(p.end(), {kMessageEnum, e});
      Enum(m.enum_type(e), p, name + ".");
    }
  }
};

TEST_CASE("every service, method, message, field and enum value in proto/ is documented",
          "[proto]") {
  FileDescriptorSet set = LoadSet();
  std::vector<std::string> missing;
  int files = 0;
  for (const FileDescriptorProto& file : set.file()) {
    if (file.name().rfind("proto/", 0) != 0) continue;  // skip imports outside ours
    ++files;
    Checker c{file, &missing};
    for (int i = 0; i < file.message_type_size(); ++i)
      c.Message(file.message_type(i), {kFileMessage, i}, "");
    for (int i = 0; i < file.enum_type_size(); ++i) c.Enum(file.enum_type(i), {kFileEnum, i}, "");
    for (int s = 0; s < file.service_size(); ++s) {
      for (int m = 0; m < file.service(s).method_size(); ++m) {
        c.Require({kFileService, s, kServiceMethod, m},
                  "method " + file.service(s).name() + "." + file.service(s).method(m).name());
      }
    }
  }
  CHECK(files >= 6);
  std::string all;
  for (const auto& m : missing) all += "\n  " + m;
  INFO("undocumented:" << all);
  CHECK(missing.empty());
}

TEST_CASE("the documentation check notices a missing comment", "[proto]") {
  FileDescriptorProto file;
  file.set_name("proto/fake.proto");
  auto* msg = file.add_message_type();
  msg->set_name("Thing");
  msg->add_field()->set_name("undocumented_field");
  auto* loc = file.mutable_source_code_info()->add_location();
  loc->add_path(kFileMessage);
  loc->add_path(0);
  loc->set_leading_comments(" A thing.");
  std::vector<std::string> missing;
  Checker{file, &missing}.Message(file.message_type(0), {kFileMessage, 0}, "");
  REQUIRE(missing.size() == 1);
  CHECK(missing[0] == "proto/fake.proto: field Thing.undocumented_field");
}

}  // namespace
