#include "worker/step_message.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace mmserve::worker {
namespace {

constexpr uint32_t kStepMagic = 0x50455453;  // "STEP"
constexpr uint64_t kMaxCount = uint64_t{1} << 32;

struct Counts {
  uint32_t magic;
  uint32_t kind;
  uint64_t tokens, sequences, block_entries, logits_rows, embeddings, inline_floats;
  int64_t kv_blocks, kv_block_size;
};

struct WireSequence {
  int64_t query_start, query_len, context_len, table_len;
};

struct WireEmbedding {
  int64_t row;
  uint64_t content_hash;
  uint32_t placement, deepstack_layers;
  uint64_t offset, length;
};

class Writer {
 public:
  explicit Writer(absl::Span<uint8_t> out) : out_(out) {}
  template <typename T>
  void Put(const T* p, size_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > 0) std::memcpy(out_.data() + at_, p, n * sizeof(T));
    at_ += n * sizeof(T);
  }
  template <typename T>
  void Put(const T& v) {
    Put(&v, 1);
  }
  size_t size() const { return at_; }

 private:
  absl::Span<uint8_t> out_;
  size_t at_ = 0;
};

class Reader {
 public:
  explicit Reader(absl::Span<const uint8_t> in) : in_(in) {}
  template <typename T>
  bool Get(T* p, uint64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > (in_.size() - at_) / sizeof(T)) return false;
    if (n > 0) std::memcpy(p, in_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return true;
  }
  template <typename T>
  bool Get(std::vector<T>* v, uint64_t n) {
    if (n > (in_.size() - at_) / sizeof(T)) return false;
    v->resize(n);
    return Get(v->data(), n);
  }
  size_t left() const { return in_.size() - at_; }

 private:
  absl::Span<const uint8_t> in_;
  size_t at_ = 0;
};

uint64_t BlockEntries(const model::ForwardBatch& b) {
  uint64_t n = 0;
  for (const auto& s : b.sequences) n += s.block_table.size();
  return n;
}

absl::Status Malformed(const std::string& what) {
  return absl::DataLossError(absl::StrCat("malformed step message: ", what));
}

}  // namespace

absl::StatusOr<StepMessage> StepMessageFromBatch(const model::ForwardBatch& batch,
                                                 int64_t hidden_size, EmbeddingPlacement placement,
                                                 absl::Span<const uint8_t> shared_buffer) {
  StepMessage m;
  m.batch = batch;
  m.batch.embedding_overrides.clear();
  for (const model::EmbeddingOverride& o : batch.embedding_overrides) {
    EmbeddingRef ref;
    ref.row = o.row;
    ref.placement = placement;
    ref.deepstack_layers = static_cast<uint32_t>(std::max(o.deepstack_layers, 0));
    ref.length = static_cast<uint64_t>(hidden_size) * (1 + ref.deepstack_layers);
    if (placement == EmbeddingPlacement::kInline) {
      ref.offset = m.inline_floats.size();
      m.inline_floats.insert(m.inline_floats.end(), o.values, o.values + hidden_size);
      if (ref.deepstack_layers > 0) {
        m.inline_floats.insert(m.inline_floats.end(), o.deepstack,
                               o.deepstack + hidden_size * ref.deepstack_layers);
      }
    } else {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(o.values);
      const size_t bytes = ref.length * sizeof(float);
      if (ref.deepstack_layers > 0 && o.deepstack != o.values + hidden_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DeepStack features of row ", o.row, " do not follow its embedding in the buffer"));
      }
      if (p < shared_buffer.data() || bytes > shared_buffer.size() ||
          p > shared_buffer.data() + shared_buffer.size() - bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("embedding of row ", o.row, " is not in the shared receive buffer"));
      }
      ref.offset = static_cast<uint64_t>(p - shared_buffer.data());
    }
    m.embeddings.push_back(ref);
  }
  return m;
}

size_t EncodedStepBytes(const StepMessage& m) {
  const model::ForwardBatch& b = m.batch;
  return sizeof(Counts) + b.token_ids.size() * sizeof(int32_t) +
         b.positions.size() * sizeof(int64_t) + b.slot_mapping.size() * sizeof(int64_t) +
         b.sequences.size() * sizeof(WireSequence) + BlockEntries(b) * sizeof(int32_t) +
         b.logits_rows.size() * sizeof(int64_t) + m.embeddings.size() * sizeof(WireEmbedding) +
         m.inline_floats.size() * sizeof(float);
}

absl::StatusOr<size_t> EncodeStep(const StepMessage& m, absl::Span<uint8_t> out) {
  const size_t need = EncodedStepBytes(m);
  if (need > out.size()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "step message of ", need, " bytes does not fit a ring slot of ", out.size(), " bytes"));
  }
  const model::ForwardBatch& b = m.batch;
  if (b.positions.size() != 3 * b.token_ids.size() || b.slot_mapping.size() != b.token_ids.size()) {
    return absl::InvalidArgumentError("batch arrays disagree with its token count");
  }
  Writer w(out);
  w.Put(Counts{kStepMagic, static_cast<uint32_t>(m.kind), b.token_ids.size(), b.sequences.size(),
               BlockEntries(b), b.logits_rows.size(), m.embeddings.size(), m.inline_floats.size(),
               m.kv_blocks, m.kv_block_size});
  w.Put(b.token_ids.data(), b.token_ids.size());
  w.Put(b.positions.data(), b.positions.size());
  w.Put(b.slot_mapping.data(), b.slot_mapping.size());
  for (const auto& s : b.sequences) {
    w.Put(WireSequence{s.query_start, s.query_len, s.context_len,
                       static_cast<int64_t>(s.block_table.size())});
  }
  for (const auto& s : b.sequences) w.Put(s.block_table.data(), s.block_table.size());
  w.Put(b.logits_rows.data(), b.logits_rows.size());
  for (const EmbeddingRef& e : m.embeddings) {
    w.Put(WireEmbedding{e.row, e.content_hash, static_cast<uint32_t>(e.placement),
                        e.deepstack_layers, e.offset, e.length});
  }
  w.Put(m.inline_floats.data(), m.inline_floats.size());
  return w.size();
}

absl::Status DecodeStep(absl::Span<const uint8_t> in, StepMessage* m) {
  Reader r(in);
  Counts c;
  if (!r.Get(&c, 1)) return Malformed("shorter than its header");
  if (c.magic != kStepMagic) return Malformed("bad magic");
  if (c.kind != static_cast<uint32_t>(StepKind::kForward) &&
      c.kind != static_cast<uint32_t>(StepKind::kStop) &&
      c.kind != static_cast<uint32_t>(StepKind::kAllocateKv) &&
      c.kind != static_cast<uint32_t>(StepKind::kKvRegister) &&
      c.kind != static_cast<uint32_t>(StepKind::kKvCheck)) {
    return Malformed(absl::StrCat("unknown kind ", c.kind));
  }
  for (uint64_t n :
       {c.tokens, c.sequences, c.block_entries, c.logits_rows, c.embeddings, c.inline_floats}) {
    if (n >= kMaxCount) return Malformed("count out of range");
  }
  m->kind = static_cast<StepKind>(c.kind);
  m->kv_blocks = c.kv_blocks;
  m->kv_block_size = c.kv_block_size;
  model::ForwardBatch& b = m->batch;
  b = model::ForwardBatch();
  std::vector<WireSequence> seqs;
  std::vector<int32_t> blocks;
  std::vector<WireEmbedding> embeddings;
  if (!r.Get(&b.token_ids, c.tokens) || !r.Get(&b.positions, 3 * c.tokens) ||
      !r.Get(&b.slot_mapping, c.tokens) || !r.Get(&seqs, c.sequences) ||
      !r.Get(&blocks, c.block_entries) || !r.Get(&b.logits_rows, c.logits_rows) ||
      !r.Get(&embeddings, c.embeddings) || !r.Get(&m->inline_floats, c.inline_floats)) {
    return Malformed("truncated");
  }
  if (r.left() != 0) return Malformed(absl::StrCat(r.left(), " trailing bytes"));
  uint64_t used = 0;
  for (const WireSequence& s : seqs) {
    if (s.table_len < 0 || static_cast<uint64_t>(s.table_len) > c.block_entries - used) {
      return Malformed("block tables overrun");
    }
    b.sequences.push_back(
        {s.query_start, s.query_len, s.context_len,
         std::vector<int32_t>(blocks.begin() + used, blocks.begin() + used + s.table_len)});
    used += s.table_len;
  }
  if (used != c.block_entries) return Malformed("block tables underrun");
  m->embeddings.clear();
  for (const WireEmbedding& e : embeddings) {
    if (e.placement > static_cast<uint32_t>(EmbeddingPlacement::kSharedBuffer)) {
      return Malformed(absl::StrCat("unknown embedding placement ", e.placement));
    }
    m->embeddings.push_back({e.row, e.content_hash, static_cast<EmbeddingPlacement>(e.placement),
                             e.offset, e.length, e.deepstack_layers});
  }
  return absl::OkStatus();
}

absl::Status ResolveEmbeddings(absl::Span<const uint8_t> shared_buffer, int64_t hidden_size,
                               StepMessage* m) {
  m->batch.embedding_overrides.clear();
  for (const EmbeddingRef& e : m->embeddings) {
    if (e.deepstack_layers > 0xffff ||
        e.length != static_cast<uint64_t>(hidden_size) * (1 + e.deepstack_layers)) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding of row ", e.row, " has ", e.length, " floats; hidden size is ",
                       hidden_size, " with ", e.deepstack_layers, " DeepStack features"));
    }
    const float* values = nullptr;
    if (e.placement == EmbeddingPlacement::kInline) {
      if (e.offset > m->inline_floats.size() || e.length > m->inline_floats.size() - e.offset) {
        return absl::InvalidArgumentError(
            absl::StrCat("inline embedding of row ", e.row, " lies outside the message"));
      }
      values = m->inline_floats.data() + e.offset;
    } else {
      const uint64_t bytes = e.length * sizeof(float);
      if (e.offset % alignof(float) != 0 || e.offset > shared_buffer.size() ||
          bytes > shared_buffer.size() - e.offset) {
        return absl::InvalidArgumentError(
            absl::StrCat("embedding of row ", e.row, " lies outside the shared receive buffer"));
      }
      values = reinterpret_cast<const float*>(shared_buffer.data() + e.offset);
    }
    const int levels = static_cast<int>(e.deepstack_layers);
    m->batch.embedding_overrides.push_back(
        {e.row, values, levels > 0 ? values + hidden_size : nullptr, levels});
  }
  return absl::OkStatus();
}

}  // namespace mmserve::worker
