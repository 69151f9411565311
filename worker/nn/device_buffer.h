// DeviceBuffer<T>: an owned array of T in a ComputeBackend's memory (host memory for the CPU
// backend, device memory for a GPU backend).
//
//   DeviceBuffer<float> activations(backend);
//   RETURN_IF_ERROR(activations.Resize(batch * width));   // keeps capacity across batches
//   backend->ReluForward(activations.size(), x, activations.data());
//
// Resize never shrinks the allocation and does not preserve contents (buffers here are
// scratch, rewritten every batch). Move-only.
//
// Thread-safety: as the backend (one thread at a time).
#ifndef TESSERA_WORKER_NN_DEVICE_BUFFER_H_
#define TESSERA_WORKER_NN_DEVICE_BUFFER_H_

#include <cstddef>
#include <utility>

#include "common/base/status.h"
#include "worker/nn/compute_backend.h"

namespace tessera::worker {

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(ComputeBackend* backend) : backend_(backend) {}
  ~DeviceBuffer() { backend_->Free(data_); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : backend_(other.backend_),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(backend_, other.backend_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(capacity_, other.capacity_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Makes room for n elements (contents unspecified); ResourceExhausted from the backend.
  Status Resize(size_t n) {
    if (n > capacity_) {
      ASSIGN_OR_RETURN(void* fresh, backend_->Allocate(n * sizeof(T)));
      backend_->Free(data_);
      data_ = static_cast<T*>(fresh);
      capacity_ = n;
    }
    size_ = n;
    return OkStatus();
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  ComputeBackend* backend() const { return backend_; }

 private:
  ComputeBackend* backend_;
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_NN_DEVICE_BUFFER_H_
