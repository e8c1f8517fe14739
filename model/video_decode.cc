#include "model/video_decode.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/log.h>
#include <libswscale/swscale.h>
}

namespace mmserve::model {
namespace {

// File containers whose headers carry the frame size (no probing decode
// needed) and that never open other files.
constexpr char kDemuxers[] = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi";

bool SupportedCodec(AVCodecID id) {
  switch (id) {
    case AV_CODEC_ID_H264:
    case AV_CODEC_ID_HEVC:
    case AV_CODEC_ID_VP8:
    case AV_CODEC_ID_VP9:
    case AV_CODEC_ID_AV1:
    case AV_CODEC_ID_MPEG4:
    case AV_CODEC_ID_MPEG1VIDEO:
    case AV_CODEC_ID_MPEG2VIDEO:
    case AV_CODEC_ID_MJPEG:
      return true;
    default:
      return false;
  }
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("video: ", what));
}

struct MemoryReader {
  absl::string_view data;
  int64_t pos = 0;
};

int ReadPacket(void* opaque, uint8_t* buf, int size) {
  auto* r = static_cast<MemoryReader*>(opaque);
  const int64_t n = std::min<int64_t>(size, static_cast<int64_t>(r->data.size()) - r->pos);
  if (n <= 0) return AVERROR_EOF;
  std::copy_n(r->data.data() + r->pos, n, buf);
  r->pos += n;
  return static_cast<int>(n);
}

int64_t Seek(void* opaque, int64_t offset, int whence) {
  auto* r = static_cast<MemoryReader*>(opaque);
  const auto size = static_cast<int64_t>(r->data.size());
  if (whence & AVSEEK_SIZE) return size;
  int64_t base = 0;
  switch (whence & ~AVSEEK_FORCE) {
    case SEEK_SET:
      base = 0;
      break;
    case SEEK_CUR:
      base = r->pos;
      break;
    case SEEK_END:
      base = size;
      break;
    default:
      return AVERROR(EINVAL);
  }
  if (offset > size - base || offset < -base) return AVERROR(EINVAL);
  r->pos = base + offset;
  return r->pos;
}

// An opened container over bytes in memory, its video stream chosen.
class Demuxer {
 public:
  static absl::StatusOr<std::unique_ptr<Demuxer>> Open(absl::string_view bytes) {
    static std::once_flag quiet;
    std::call_once(quiet, [] { av_log_set_level(AV_LOG_QUIET); });
    if (bytes.empty()) return Invalid("empty");
    auto d = std::unique_ptr<Demuxer>(new Demuxer(bytes));
    constexpr int kBuffer = 1 << 14;
    auto* buffer = static_cast<uint8_t*>(av_malloc(kBuffer));
    d->io_ = avio_alloc_context(buffer, kBuffer, 0, &d->reader_, ReadPacket, nullptr, Seek);
    if (d->io_ == nullptr) {
      av_free(buffer);
      return absl::ResourceExhaustedError("video: out of memory");
    }
    AVFormatContext* fmt = avformat_alloc_context();
    if (fmt == nullptr) return absl::ResourceExhaustedError("video: out of memory");
    fmt->pb = d->io_;
    fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
    AVDictionary* opts = nullptr;
    av_dict_set(&opts, "format_whitelist", kDemuxers, 0);
    const int rc = avformat_open_input(&fmt, nullptr, nullptr, &opts);  // frees fmt on failure
    av_dict_free(&opts);
    if (rc < 0) return Invalid("unknown, truncated or corrupt container");
    d->fmt_ = fmt;
    // A file cut before its index (an MP4's moov) opens with no streams.
    if (fmt->nb_streams == 0) return Invalid("unknown, truncated or corrupt container");
    d->stream_ = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
    if (d->stream_ < 0) return Invalid("no video stream");
    return d;
  }

  ~Demuxer() {
    if (fmt_ != nullptr) avformat_close_input(&fmt_);
    if (io_ != nullptr) {
      av_freep(&io_->buffer);
      avio_context_free(&io_);
    }
  }
  Demuxer(const Demuxer&) = delete;
  Demuxer& operator=(const Demuxer&) = delete;

  AVFormatContext* fmt() const { return fmt_; }
  AVStream* stream() const { return fmt_->streams[stream_]; }
  int stream_index() const { return stream_; }

 private:
  explicit Demuxer(absl::string_view bytes) { reader_.data = bytes; }

  MemoryReader reader_;
  AVIOContext* io_ = nullptr;
  AVFormatContext* fmt_ = nullptr;
  int stream_ = -1;
};

struct PacketDeleter {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct FrameDeleter {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct CodecDeleter {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct SwsDeleter {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
using PacketPtr = std::unique_ptr<AVPacket, PacketDeleter>;
using FramePtr = std::unique_ptr<AVFrame, FrameDeleter>;

// Video packets to the end, stopping past `limit`.
absl::StatusOr<int64_t> CountPackets(Demuxer& d, int64_t limit) {
  PacketPtr pkt(av_packet_alloc());
  int64_t n = 0;
  while (n <= limit) {
    const int rc = av_read_frame(d.fmt(), pkt.get());
    if (rc == AVERROR_EOF) break;
    if (rc < 0) return Invalid("truncated or corrupt container");
    if (pkt->stream_index == d.stream_index()) ++n;
    av_packet_unref(pkt.get());
  }
  return n;
}

absl::Status CheckLimits(const VideoHeader& h, const VideoLimits& limits) {
  if (h.width <= 0 || h.height <= 0) return Invalid("no frame size in the header");
  if (static_cast<int64_t>(h.width) * h.height > limits.max_frame_pixels) {
    return Invalid(absl::StrCat("frames of ", h.width, "x", h.height, " exceed the limit of ",
                                limits.max_frame_pixels, " pixels"));
  }
  if (h.frame_count <= 0) return Invalid("no frames");
  if (h.frame_count > limits.max_frames) {
    return Invalid(absl::StrCat("more than ", limits.max_frames, " frames"));
  }
  if (!(h.fps > 0)) return Invalid("no frame rate");
  if (h.duration_s > limits.max_duration_s) {
    return Invalid(absl::StrCat("duration ", h.duration_s, " s exceeds the limit of ",
                                limits.max_duration_s, " s"));
  }
  return absl::OkStatus();
}

absl::StatusOr<VideoHeader> ReadHeader(Demuxer& d, const VideoLimits& limits) {
  const AVCodecParameters* par = d.stream()->codecpar;
  VideoHeader h;
  h.container = d.fmt()->iformat->name;
  h.codec = avcodec_get_name(par->codec_id);
  if (!SupportedCodec(par->codec_id)) return Invalid(absl::StrCat("unsupported codec ", h.codec));
  h.width = par->width;
  h.height = par->height;
  h.fps = av_q2d(d.stream()->avg_frame_rate);
  h.frame_count = d.stream()->nb_frames;
  if (h.frame_count <= 0) {
    ASSIGN_OR_RETURN(h.frame_count, CountPackets(d, limits.max_frames));
    if (!(h.fps > 0) && d.fmt()->duration > 0) {
      h.fps = static_cast<double>(h.frame_count) * AV_TIME_BASE / d.fmt()->duration;
    }
  }
  if (h.fps > 0) h.duration_s = static_cast<double>(h.frame_count) / h.fps;
  RETURN_IF_ERROR(CheckLimits(h, limits));
  return h;
}

// Collects the frames at the wanted indices as the decoder outputs them.
class FrameCollector {
 public:
  FrameCollector(const VideoHeader& h, const std::vector<int64_t>& indices)
      : header_(h), indices_(indices) {}

  bool done() const { return next_ == indices_.size(); }
  std::vector<RgbImage>& frames() { return frames_; }

  absl::Status Take(const AVFrame* f) {
    const int64_t i = seen_++;
    if (done() || indices_[next_] != i) return absl::OkStatus();
    ++next_;
    if (f->width != header_.width || f->height != header_.height) {
      return Invalid(absl::StrCat("frame ", i, " is ", f->width, "x", f->height, ", not ",
                                  header_.width, "x", header_.height));
    }
    sws_.reset(sws_getCachedContext(sws_.release(), f->width, f->height,
                                    static_cast<AVPixelFormat>(f->format), f->width, f->height,
                                    AV_PIX_FMT_RGB24, SWS_BILINEAR, nullptr, nullptr, nullptr));
    if (sws_ == nullptr) return Invalid("unsupported pixel format");
    // Into a 32-byte aligned buffer as PyAV's frames are: swscale's SIMD
    // paths (taken only for aligned rows) round differently from its C path.
    const int stride = (f->width * 3 + 31) / 32 * 32;
    buffer_.resize(static_cast<size_t>(stride) * f->height + 32);
    auto* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buffer_.data()) + 31) &
                                            ~static_cast<uintptr_t>(31));
    uint8_t* dst[4] = {base, nullptr, nullptr, nullptr};
    int dst_stride[4] = {stride, 0, 0, 0};
    sws_scale(sws_.get(), f->data, f->linesize, 0, f->height, dst, dst_stride);
    RgbImage img;
    img.width = f->width;
    img.height = f->height;
    img.pixels.resize(static_cast<size_t>(f->width) * f->height * 3);
    for (int y = 0; y < f->height; ++y) {
      std::copy_n(base + static_cast<size_t>(y) * stride, f->width * 3,
                  &img.pixels[static_cast<size_t>(y) * f->width * 3]);
    }
    frames_.push_back(std::move(img));
    return absl::OkStatus();
  }

 private:
  const VideoHeader& header_;
  const std::vector<int64_t>& indices_;
  size_t next_ = 0;
  int64_t seen_ = 0;
  std::vector<RgbImage> frames_;
  std::vector<uint8_t> buffer_;
  std::unique_ptr<SwsContext, SwsDeleter> sws_;
};

absl::StatusOr<std::unique_ptr<AVCodecContext, CodecDeleter>> OpenDecoder(const Demuxer& d) {
  const AVCodec* codec = avcodec_find_decoder(d.stream()->codecpar->codec_id);
  if (codec == nullptr) return Invalid("no decoder for the codec");
  std::unique_ptr<AVCodecContext, CodecDeleter> ctx(avcodec_alloc_context3(codec));
  if (ctx == nullptr) return absl::ResourceExhaustedError("video: out of memory");
  if (avcodec_parameters_to_context(ctx.get(), d.stream()->codecpar) < 0) {
    return Invalid("bad codec parameters");
  }
  ctx->thread_count = 1;
  if (avcodec_open2(ctx.get(), codec, nullptr) < 0)
    return Invalid("the decoder refused the stream");
  return ctx;
}

// Receives every frame the decoder has ready.
absl::Status Drain(AVCodecContext* ctx, AVFrame* frame, FrameCollector& out) {
  while (!out.done()) {
    const int rc = avcodec_receive_frame(ctx, frame);
    if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return absl::OkStatus();
    if (rc < 0) return Invalid("corrupt frame data");
    const absl::Status s = out.Take(frame);
    av_frame_unref(frame);
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VideoHeader> ProbeVideo(absl::string_view bytes, const VideoLimits& limits) {
  if (static_cast<int64_t>(bytes.size()) > limits.max_bytes) {
    return Invalid(absl::StrCat(bytes.size(), " bytes exceed the limit of ", limits.max_bytes));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Demuxer> d, Demuxer::Open(bytes));
  return ReadHeader(*d, limits);
}

absl::StatusOr<std::vector<RgbImage>> DecodeVideoFrames(absl::string_view bytes,
                                                        const std::vector<int64_t>& indices,
                                                        const VideoLimits& limits) {
  ASSIGN_OR_RETURN(const VideoHeader h, ProbeVideo(bytes, limits));
  if (indices.empty()) return Invalid("no frames selected");
  if (static_cast<int64_t>(indices.size()) * h.width * h.height * 3 > limits.max_decoded_bytes) {
    return Invalid(absl::StrCat(indices.size(), " frames of ", h.width, "x", h.height,
                                " exceed the decoded-size limit"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Demuxer> d, Demuxer::Open(bytes));
  ASSIGN_OR_RETURN(auto ctx, OpenDecoder(*d));
  PacketPtr pkt(av_packet_alloc());
  FramePtr frame(av_frame_alloc());
  FrameCollector out(h, indices);
  while (!out.done()) {
    const int rc = av_read_frame(d->fmt(), pkt.get());
    if (rc == AVERROR_EOF) break;
    if (rc < 0) return Invalid("truncated or corrupt container");
    if (pkt->stream_index == d->stream_index()) {
      const int sent = avcodec_send_packet(ctx.get(), pkt.get());
      av_packet_unref(pkt.get());
      if (sent < 0 && sent != AVERROR(EAGAIN)) return Invalid("corrupt frame data");
      RETURN_IF_ERROR(Drain(ctx.get(), frame.get(), out));
    } else {
      av_packet_unref(pkt.get());
    }
  }
  if (!out.done()) {  // flush the decoder's delayed frames
    avcodec_send_packet(ctx.get(), nullptr);
    RETURN_IF_ERROR(Drain(ctx.get(), frame.get(), out));
  }
  if (!out.done()) {
    return Invalid(absl::StrCat("the clip ends before frame ", indices.back()));
  }
  return std::move(out.frames());
}

}  // namespace mmserve::model
