#include "transfer/transfer_engine.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "transfer/ucx_request.h"
#include "transfer/ucx_status.h"

namespace mmserve::transfer {

namespace {

v1::TensorDtype DtypeFor(uint32_t bytes) {
  return bytes == 4 ? v1::TENSOR_DTYPE_FLOAT32 : v1::TENSOR_DTYPE_BFLOAT16;
}

uint32_t DtypeBytes(v1::TensorDtype dtype) { return dtype == v1::TENSOR_DTYPE_FLOAT32 ? 4 : 2; }

}  // namespace

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    const TransferEngineOptions& options) {
  std::unique_ptr<TransferEngine> engine(new TransferEngine(options));
  RETURN_IF_ERROR(engine->Init());
  return engine;
}

TransferEngine::TransferEngine(const TransferEngineOptions& options)
    : options_(options),
      data_path_(options.data_path.value_or(
          options.profile == TransportProfile::kShm ? DataPath::kGet : DataPath::kTag)) {}

absl::Status TransferEngine::Init() {
  ASSIGN_OR_RETURN(context_, UcxContext::Create(options_.profile));
  allocator_ = std::make_unique<BlockAllocator>(BlockAllocatorOptions{
      options_.layout.block_size, options_.layout.num_blocks, options_.default_num_blocks});
  if (options_.buffer_memory != nullptr) {
    // Memory the caller shares with other processes (the receive
    // buffer that every tensor-parallel rank maps): registered, not ours.
    ASSIGN_OR_RETURN(region_, UcxMemoryRegion::Register(*context_, options_.buffer_memory,
                                                        options_.layout.total_bytes()));
  } else {
    // UCX allocates the buffer: on shm a shared segment peers map, so their
    // puts are one direct copy (see UcxMemoryRegion::Allocate).
    ASSIGN_OR_RETURN(region_, UcxMemoryRegion::Allocate(*context_, options_.layout.total_bytes()));
  }
  buffer_ =
      std::make_unique<EmbeddingBuffer>(options_.layout, static_cast<uint8_t*>(region_->address()));
  ASSIGN_OR_RETURN(std::string rkey, region_->PackRkey());
  UcxWorkerOptions worker_options = options_.worker;
  worker_options.name = options_.instance_id;
  ASSIGN_OR_RETURN(worker_, UcxWorker::Create(*context_, worker_options));
  if (data_path_ == DataPath::kGet) checksum_ = std::make_unique<ChecksumWorker>();
  sender_ =
      std::make_unique<EmbeddingSender>(static_cast<TransferLink&>(*this), *buffer_, *allocator_);
  receiver_ = std::make_unique<EmbeddingReceiver>(static_cast<TransferLink&>(*this), *buffer_,
                                                  *allocator_, options_.quarantine_limit);

  local_info_.set_instance_id(options_.instance_id);
  local_info_.mutable_ucx()->set_worker_address(worker_->address());
  local_info_.mutable_ucx()->set_transport_profile(TransportProfileName(options_.profile));
  local_info_.mutable_ucx()->set_host(HostIdentity());
  v1::EmbeddingBufferLayout* layout = local_info_.mutable_embedding_buffer();
  layout->set_block_size(options_.layout.block_size);
  layout->set_num_blocks(options_.layout.num_blocks);
  layout->set_hidden_size(options_.layout.hidden_size);
  layout->set_dtype(DtypeFor(options_.layout.dtype_bytes));
  for (int s = 0; s < kNumSections; ++s) {
    v1::RemoteRegion* region = layout->add_sections();
    region->set_base_address(reinterpret_cast<uint64_t>(buffer_->data()) +
                             options_.layout.SectionOffset(s));
    region->set_length(options_.layout.TokenBytes(s) * options_.layout.total_tokens());
    region->set_rkey(rkey);  // one registration covers all four sections
  }

  worker_->Start(
      [this] {
        sender_->Tick();
        receiver_->Tick();
      },
      [this] { return sender_->writing() || sender_->lending() || receiver_->expecting_data(); });
  for (AmId id : {kAmInit, kAmResume, kAmCancel, kAmNotice, kAmDone}) {
    RETURN_IF_ERROR(worker_->RunSync([this, id] { return RegisterAmHandler(id); }));
  }
  return absl::OkStatus();
}

TransferEngine::~TransferEngine() {
  if (worker_ != nullptr) {
    (void)worker_->RunSync([this] {
      absl::Status shutdown = absl::CancelledError("transfer engine shut down");
      sender_->Shutdown(shutdown);
      receiver_->Shutdown(shutdown);
      for (auto& [name, peer] : peers_) {
        peer->rkey.reset();
        if (peer->ep) peer->ep->Close(Deadline::After(absl::Milliseconds(200)));
      }
      for (auto& [id, requests] : expects_) {
        for (auto& [section, request] : requests) ucp_request_cancel(worker_->get(), request);
      }
      while (!expects_.empty() && worker_->Progress() != 0) {
      }
      peers_.clear();
      return absl::OkStatus();
    });
    // ReadChunk waits for its pieces, so the checksum thread is idle. Tasks
    // the cancelled receives posted (piece completions) run before the
    // progress thread stops.
    checksum_.reset();
    (void)worker_->RunSync([] { return absl::OkStatus(); });
    worker_->Stop();  // no more callbacks into this engine
    worker_.reset();
  }
  receiver_.reset();
  sender_.reset();
  buffer_.reset();
  region_.reset();
}

absl::Status TransferEngine::RegisterAmHandler(AmId id) {
  am_args_[id - 1] = AmArg{this, id};
  return SetUcxAmHandler(worker_->get(), id, &TransferEngine::OnAm, &am_args_[id - 1]);
}

ucs_status_t TransferEngine::OnAm(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  auto* am = static_cast<AmArg*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    LOG(ERROR) << "control message " << am->id << " arrived as rendezvous; dropped";
    return UCS_OK;
  }
  std::string peer(static_cast<const char*>(header), header_length);
  std::string payload(static_cast<const char*>(data), length);
  // Dispatch outside the UCX callback: handlers may start UCX operations.
  TransferEngine* engine = am->engine;
  AmId id = am->id;
  engine->worker_->Post([engine, id, peer = std::move(peer), payload = std::move(payload)] {
    engine->Dispatch(id, peer, payload);
  });
  return UCS_OK;
}

void TransferEngine::Dispatch(AmId id, const std::string& peer, const std::string& payload) {
  // Only from peers that connected through Connect, i.e. through the
  // internal plane's gRPC Connect (cluster token, mutual TLS when set).
  if (peers_.find(peer) == peers_.end()) {
    LOG(WARNING) << "control message " << id << " from a peer that never connected; dropped";
    return;
  }
  bool parsed = false;
  switch (id) {
    case kAmInit: {
      v1::EmbeddingTransferInit m;
      if ((parsed = m.ParseFromString(payload))) sender_->OnInit(peer, m);
      break;
    }
    case kAmResume: {
      v1::EmbeddingTransferResume m;
      if ((parsed = m.ParseFromString(payload))) sender_->OnResume(peer, m);
      break;
    }
    case kAmCancel: {
      v1::EmbeddingTransferCancel m;
      if ((parsed = m.ParseFromString(payload))) sender_->OnCancel(peer, m);
      break;
    }
    case kAmNotice: {
      v1::EmbeddingChunkNotice m;
      if ((parsed = m.ParseFromString(payload))) receiver_->OnNotice(peer, m);
      break;
    }
    case kAmDone: {
      v1::EmbeddingTransferDone m;
      if ((parsed = m.ParseFromString(payload))) sender_->OnDone(peer, m);
      break;
    }
  }
  if (!parsed) LOG(ERROR) << "unparsable control message " << id << " from " << peer;
}

absl::Status TransferEngine::Connect(const v1::ConnectRequest& info) {
  RETURN_IF_ERROR(CheckSameHost(options_.profile, info.ucx().host(), info.instance_id()));
  if (info.ucx().transport_profile() != TransportProfileName(options_.profile)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer ", info.instance_id(), " runs transport profile '", info.ucx().transport_profile(),
        "', this engine '", TransportProfileName(options_.profile), "'"));
  }
  const v1::EmbeddingBufferLayout& layout = info.embedding_buffer();
  if (layout.hidden_size() != options_.layout.hidden_size ||
      DtypeBytes(layout.dtype()) != options_.layout.dtype_bytes ||
      layout.sections_size() != kNumSections) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", info.instance_id(), " has an incompatible embedding layout"));
  }
  return worker_->RunSync([this, info]() -> absl::Status {
    const std::string name = info.instance_id();
    auto peer = std::make_unique<Peer>();
    ASSIGN_OR_RETURN(
        peer->ep,
        UcxEndpoint::Create(*worker_, info.ucx().worker_address(), [this, name](absl::Status s) {
          worker_->Post([this, name, s] { FailPeer(name, s); });
        }));
    const v1::EmbeddingBufferLayout& layout = info.embedding_buffer();
    peer->layout = EmbeddingLayout{layout.block_size(), layout.num_blocks(), layout.hidden_size(),
                                   DtypeBytes(layout.dtype())};
    for (int s = 0; s < kNumSections; ++s) {
      peer->section_base[s] = layout.sections(s).base_address();
    }
    if (data_path_ != DataPath::kTag) {
      ASSIGN_OR_RETURN(peer->rkey,
                       UcxRemoteKey::Unpack(peer->ep->get(), layout.sections(0).rkey()));
      // Mapped means each put is one memcpy into the peer's segment; else
      // UCX emulates puts with active messages (tcp, or shm peers that cannot
      // attach each other's segments, e.g. containers in separate IPC
      // namespaces).
      void* mapped = nullptr;
      peer->direct_puts = ucp_rkey_ptr(peer->rkey->get(), peer->section_base[0], &mapped) == UCS_OK;
      if (peer->direct_puts) {
        // One registration covers the four sections, in one mapping.
        peer->mapped = static_cast<const uint8_t*>(mapped) - peer->layout.SectionOffset(0);
      } else if (options_.profile == TransportProfile::kShm) {
        LOG(WARNING) << "puts to " << name
                     << " are emulated by UCX and chunks from it cannot be read here (its "
                        "buffer cannot be mapped: same IPC namespace?); expect a fraction of shm "
                        "bandwidth";
      }
    }
    auto old = peers_.find(name);
    if (old != peers_.end()) {
      old->second->rkey.reset();
      old->second->ep->Close(Deadline::After(absl::Milliseconds(100)));
    }
    peers_[name] = std::move(peer);
    return absl::OkStatus();
  });
}

absl::StatusOr<bool> TransferEngine::DirectPuts(const std::string& peer) {
  bool direct = false;
  RETURN_IF_ERROR(worker_->RunSync([&]() -> absl::Status {
    ASSIGN_OR_RETURN(Peer * p, LivePeer(peer));
    direct = p->direct_puts;
    return absl::OkStatus();
  }));
  return direct;
}

void TransferEngine::Publish(PublishedMedia image, EmbeddingSender::Done done,
                             std::optional<MediaCrc> crc) {
  // The checksum pass reads the whole image: do it on the caller's thread
  // (which just wrote the bytes), not on the progress thread's send path.
  if (!crc || !(crc->image() == image.blocks)) crc = MediaCrc::Compute(*buffer_, image.blocks);
  worker_->Post(
      [this, image = std::move(image), done = std::move(done), crc = std::move(crc)]() mutable {
        sender_->Publish(image, std::move(done), std::move(crc));
      });
}

void TransferEngine::Receive(ReceiveRequest request, EmbeddingReceiver::Done done) {
  worker_->Post([this, request = std::move(request), done = std::move(done)]() mutable {
    receiver_->Receive(std::move(request), std::move(done));
  });
}

void TransferEngine::Cancel(const std::string& request_id, const std::string& reason) {
  worker_->Post([this, request_id, reason] { receiver_->Cancel(request_id, reason); });
}

TransferEngine::Counts TransferEngine::counts() {
  Counts c;
  (void)worker_->RunSync([&] {
    c.sending = sender_->num_transfers();
    c.receiving = receiver_->num_transfers();
    c.waiting_for_blocks = receiver_->num_waiting_for_blocks();
    c.quarantined = receiver_->num_quarantined();
    c.chunks_read = receiver_->num_chunks_read();
    return absl::OkStatus();
  });
  return c;
}

absl::StatusOr<TransferEngine::Peer*> TransferEngine::LivePeer(const std::string& name) {
  auto it = peers_.find(name);
  if (it == peers_.end()) return absl::UnavailableError(absl::StrCat("no peer '", name, "'"));
  if (it->second->failure) return *it->second->failure;
  return it->second.get();
}

void TransferEngine::FailPeer(const std::string& name, const absl::Status& status) {
  auto it = peers_.find(name);
  if (it == peers_.end() || it->second->failure) return;
  absl::Status failure =
      absl::UnavailableError(absl::StrCat("peer ", name, ": ", status.message()));
  LOG(WARNING) << failure;
  Peer& peer = *it->second;
  peer.failure = failure;
  peer.rkey.reset();
  peer.ep->Close(Deadline::After(absl::ZeroDuration()));
  sender_->OnPeerFailed(name, failure);
  receiver_->OnPeerFailed(name, failure);
}

void TransferEngine::AbortPeer(const std::string& peer, const absl::Status& why) {
  worker_->Post([this, peer, why] { FailPeer(peer, why); });
}

}  // namespace mmserve::transfer
