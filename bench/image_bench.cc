// Image preprocessing per image: decode (bytes in memory) + Pillow-exact
// bicubic resize to the smart-resize size + rescale/normalize (+ patchify),
// for 640x480 and 1920x1080 JPEG and PNG, against Pillow doing the same work
// (tools/pillow_image_bench.py: decode, convert("RGB"), resize, numpy
// normalize) on the same files in the same run. One thread on both sides.
// The C++ side is timed before and after Pillow; its figure is the mean of
// the two medians.
//
//   bazel run --config=opt //bench:image_bench -- [--reps=15] [--python=python3]
//
// The Python side needs Pillow and numpy (the tools venv, tools/README.md);
// when it cannot run, the bench says why and reports the C++ times alone.
// jpeglib.h needs FILE and size_t declared first.
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on
#include <stb/stb_image_write.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/image_tokens.h"

namespace mmserve {
namespace {

struct Args {
  int reps = 15;
  std::string python = "python3";
};

// Photo-like content: gradients, noise and edges (as the golden generator).
model::RgbImage Synth(int w, int h) {
  model::RgbImage img;
  img.width = w;
  img.height = h;
  img.pixels.resize(static_cast<size_t>(w) * h * 3);
  for (uint32_t y = 0; y < static_cast<uint32_t>(h); ++y) {
    for (uint32_t x = 0; x < static_cast<uint32_t>(w); ++x) {
      for (uint32_t c = 0; c < 3; ++c) {
        uint32_t n = (x * 73856093u) ^ (y * 19349663u) ^ (c * 83492791u);
        n = (n ^ (n >> 13)) * 1274126177u;
        n ^= n >> 16;
        const uint32_t grad = (x * 255u / (w - 1) * (c + 1) + y * 255u / (h - 1) * (3 - c)) / 4;
        const uint32_t edge = ((x / 23 + y / 17 + c) % 3) * 50;
        img.pixels[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((grad + edge + (n & 15)) % 256);
      }
    }
  }
  return img;
}

std::string EncodeJpeg(const model::RgbImage& img, int quality) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = img.width;
  cinfo.image_height = img.height;
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&img.pixels[cinfo.next_scanline * img.width * 3]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buf), size);
  std::free(buf);
  return out;
}

std::string EncodePng(const model::RgbImage& img) {
  std::string out;
  stbi_write_png_to_func(
      [](void* ctx, void* data, int size) {
        static_cast<std::string*>(ctx)->append(static_cast<char*>(data), size);
      },
      &out, img.width, img.height, 3, img.pixels.data(), img.width * 3);
  return out;
}

struct Case {
  std::string name;
  std::string ext;
  std::string bytes;
  model::MediaGrid grid;
};

double MedianMs(const Case& c, const model::PreprocessorConfig& cfg, int reps) {
  std::vector<double> ms;
  for (int r = 0; r <= reps; ++r) {
    Stopwatch w;
    auto img = model::DecodeImage(c.bytes, model::DecodeLimits());
    auto p = model::PreprocessImage(*img, cfg);
    if (!img.ok() || !p.ok()) std::abort();
    if (r > 0) ms.push_back(w.ElapsedSeconds() * 1e3);  // the first is a warm-up
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Runs the Pillow script on the files in `dir`; "" and a reason on failure.
std::string RunPillow(const Args& args, const std::string& dir, std::string* why) {
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string script = std::string(ws != nullptr ? ws : ".") + "/tools/pillow_image_bench.py";
  if (access(script.c_str(), R_OK) != 0) {
    *why = "tools/pillow_image_bench.py not found (run with bazel run from the workspace)";
    return "";
  }
  const std::string cmd = absl::StrCat(args.python, " ", script, " ", dir, " ", args.reps, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *why = "popen failed";
    return "";
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) {
    *why = absl::StrCat(args.python,
                        " could not run it (needs Pillow and numpy; pass "
                        "--python=<tools venv>/bin/python): ",
                        out.substr(0, 300));
    return "";
  }
  return out;
}

// The value of "key": <number> in a flat JSON object (the script's output).
double JsonNumber(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  return std::atof(json.c_str() + at + key.size() + 3);
}

int Main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--reps=", 0) == 0) (void)absl::SimpleAtoi(s.substr(7), &args.reps);
    if (s.rfind("--python=", 0) == 0) args.python = s.substr(9);
  }
  model::PreprocessorConfig cfg;  // Qwen2-VL defaults: 56*56 .. 28*28*1280 pixels
  model::ImageGridParams gp;
  char tmpl[] = "/tmp/image_bench.XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::vector<Case> cases;
  std::string sizes_json = "{";
  for (auto [w, h] : {std::pair{640, 480}, std::pair{1920, 1080}}) {
    const model::RgbImage img = Synth(w, h);
    for (const char* ext : {"jpg", "png"}) {
      Case c;
      c.name = absl::StrCat(w, "x", h, "_", ext);
      c.ext = ext;
      c.bytes = c.ext == "jpg" ? EncodeJpeg(img, 90) : EncodePng(img);
      c.grid = *model::SmartResize(w, h, gp);
      std::ofstream(dir + "/" + c.name + "." + ext, std::ios::binary) << c.bytes;
      absl::StrAppend(&sizes_json, cases.empty() ? "" : ",", "\"", c.name, "\":[",
                      c.grid.resized_width, ",", c.grid.resized_height, "]");
      cases.push_back(std::move(c));
    }
  }
  std::ofstream(dir + "/sizes.json") << sizes_json << "}";

  std::vector<double> first, second;
  for (const Case& c : cases) first.push_back(MedianMs(c, cfg, args.reps));
  std::string why;
  const std::string pillow = RunPillow(args, dir, &why);
  for (const Case& c : cases) second.push_back(MedianMs(c, cfg, args.reps));

  std::printf("decode + resize + normalize, one image at a time, one thread, median of %d\n",
              args.reps);
  if (pillow.empty()) std::printf("Pillow not measured: %s\n", why.c_str());
  std::printf("%-16s %9s %10s %10s %10s %11s\n", "image", "bytes", "resized", "mmserve_ms",
              "pillow_ms", "speedup");
  std::vector<std::string> rows;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const double ours = (first[i] + second[i]) / 2;
    const double theirs = pillow.empty() ? -1 : JsonNumber(pillow, c.name);
    const std::string resized = absl::StrCat(c.grid.resized_width, "x", c.grid.resized_height);
    std::printf("%-16s %9zu %10s %10.2f %10.2f %11s\n", c.name.c_str(), c.bytes.size(),
                resized.c_str(), ours, theirs,
                theirs > 0 ? absl::StrFormat("%.2fx", theirs / ours).c_str() : "-");
    rows.push_back(absl::StrFormat(
        "{\"image\":\"%s\",\"bytes\":%d,\"resized\":\"%s\",\"mmserve_ms\":%.3f,"
        "\"mmserve_ms_runs\":[%.3f,%.3f],\"pillow_ms\":%s,\"speedup_vs_pillow\":%s}",
        c.name, c.bytes.size(), resized, ours, first[i], second[i],
        theirs > 0 ? absl::StrFormat("%.3f", theirs) : "null",
        theirs > 0 ? absl::StrFormat("%.3f", theirs / ours) : "null"));
  }
  for (const Case& c : cases) std::remove((dir + "/" + c.name + "." + c.ext).c_str());
  std::remove((dir + "/sizes.json").c_str());
  rmdir(dir.c_str());
  std::printf("{\"bench\":\"image\",\"reps\":%d,\"pillow_measured\":%s,\"cases\":[%s]}\n",
              args.reps, pillow.empty() ? "false" : "true", absl::StrJoin(rows, ",").c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) { return mmserve::Main(argc, argv); }
