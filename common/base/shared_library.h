// SharedLibrary: a library loaded at run time (dlopen) and its symbols bound by name.
//
// Tessera loads cuBLAS, NCCL and OpenBLAS this way instead of linking them: a linked library's
// static TLS is reserved on every thread's stack (libcublasLt ~92 KiB, libopenblas 60 KiB) and
// threads with small fixed stacks (civetweb's 100 KiB) then fail to start or overflow; a
// dlopen'ed library's TLS is allocated on demand. It also keeps CPU-only runs from loading GPU
// libraries at all.
//
//   ASSIGN_OR_RETURN(SharedLibrary blas, SharedLibrary::Open("libopenblas.so.0", "OpenBLAS"));
//   decltype(&cblas_sgemm) sgemm = nullptr;
//   RETURN_IF_ERROR(blas.Bind(&sgemm, "cblas_sgemm"));
//
// Libraries are never unloaded (their functions stay callable for the process's lifetime).
// Thread-safety: Open and Bind are thread-safe (dlopen/dlsym are).
#ifndef TESSERA_COMMON_BASE_SHARED_LIBRARY_H_
#define TESSERA_COMMON_BASE_SHARED_LIBRARY_H_

#include <string>

#include "common/base/status.h"

namespace tessera {

class SharedLibrary {
 public:
  // Unavailable naming the file, what it is, and dlerror()'s reason when it cannot be loaded.
  static StatusOr<SharedLibrary> Open(const std::string& file, const std::string& what);

  // *slot = the symbol's address; Unavailable naming the library and the symbol if it is
  // missing (the slot is then null).
  template <typename Function>
  Status Bind(Function* slot, const char* symbol) const {
    *slot = reinterpret_cast<Function>(Find(symbol));
    if (*slot == nullptr) return UnavailableError(file_ + " has no symbol " + symbol);
    return OkStatus();
  }

  const std::string& file() const { return file_; }

 private:
  SharedLibrary(void* handle, std::string file) : handle_(handle), file_(std::move(file)) {}
  void* Find(const char* symbol) const;

  void* handle_;
  std::string file_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_SHARED_LIBRARY_H_
