#include "server/ps/worker_regions.h"

#include <cstring>
#include <unordered_set>

namespace tessera::server {

WorkerRegions::WorkerRegions(const std::vector<DenseChunk>& chunks) {
  const std::vector<uint64_t> offsets = PsRegionOffsets(chunks, &floats_);
  auto places = std::make_shared<std::unordered_map<uint64_t, Place>>();
  for (size_t i = 0; i < chunks.size(); ++i) {
    (*places)[chunks[i].key] = Place{offsets[i], chunks[i].size};
  }
  places_ = std::move(places);
}

Status WorkerRegions::Map(int rank, const PsPushPullRequest& offer) {
  const int writers = offer.region_writers;
  if (writers < 1 || writers > kMaxWriters || offer.region_writer < 0 ||
      offer.region_writer >= writers) {
    return InvalidArgumentError("worker " + std::to_string(rank) + "'s shared region offer "
                                "names values half " + std::to_string(offer.region_writer) +
                                " of " + std::to_string(writers) + " (1 to " +
                                std::to_string(kMaxWriters) + " halves, the writer one of them)");
  }
  const size_t bytes = (1 + static_cast<size_t>(writers)) * floats_ * sizeof(float);
  ASSIGN_OR_RETURN(std::shared_ptr<SharedRegion> region,
                   SharedRegion::Open(offer.region_pid, offer.region_fd, bytes,
                                      SharedRegionToken{offer.region_token_high,
                                                        offer.region_token_low}));
  std::lock_guard<std::mutex> lock(mu_);
  regions_[rank] = Mapped{std::move(region), 1 + offer.region_writer};
  return OkStatus();
}

WorkerRegions::Mapped WorkerRegions::MappedOf(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(rank);
  return it == regions_.end() ? Mapped{} : it->second;
}

StatusOr<std::vector<TensorData>> WorkerRegions::Tensors(int rank,
                                                         const std::vector<TensorData>& tensors,
                                                         bool push) const {
  std::shared_ptr<SharedRegion> region = RegionOf(rank);
  if (region == nullptr) {
    return FailedPreconditionError("worker " + std::to_string(rank) +
                                   " sent chunks in a shared region this server has not mapped");
  }
  const float* gradients = reinterpret_cast<const float*>(region->data());
  std::vector<TensorData> views;
  views.reserve(tensors.size());
  std::unordered_set<uint64_t> named;
  for (const TensorData& tensor : tensors) {
    auto it = places_->find(tensor.key);
    if (it == places_->end()) {
      return InvalidArgumentError("key " + std::to_string(tensor.key) + " (" + tensor.name +
                                  ") is not a chunk of this job on this server");
    }
    if (!named.insert(tensor.key).second) {
      return InvalidArgumentError("key " + std::to_string(tensor.key) + " (" + tensor.name +
                                  ") is named twice in one request");
    }
    const Place& place = it->second;
    // A chunk of another type or shape goes as named, without bytes, for the shard to refuse
    // in its own words.
    const bool fits = tensor.dtype == DataType::kFloat32 && tensor.shape.size() == 1 &&
                      tensor.shape[0] == static_cast<int64_t>(place.size);
    TensorData view = push && fits ? TensorData::Floats(tensor.name, tensor.key,
                                                        gradients + place.offset, place.size,
                                                        region)
                                   : tensor;
    views.push_back(std::move(view));
  }
  return views;
}

WorkerRegions::ReplyCallback WorkerRegions::ReplyInto(int rank, ReplyCallback send) const {
  Mapped mapped = MappedOf(rank);
  return [region = std::move(mapped.region), half = mapped.values_half, places = places_,
          floats = floats_, send = std::move(send)](PsPushPullReply reply) {
    float* values = reinterpret_cast<float*>(region->data()) + half * floats;
    for (TensorData& tensor : reply.tensors) {
      // Values that do not fit their place (none should) stay in the reply's frames.
      auto it = places->find(tensor.key);
      if (it == places->end() || tensor.bytes.size() != it->second.size * sizeof(float)) {
        continue;
      }
      std::memcpy(values + it->second.offset, tensor.bytes.data(), tensor.bytes.size());
      tensor.bytes = Payload();
    }
    send(std::move(reply));
  };
}

}  // namespace tessera::server
