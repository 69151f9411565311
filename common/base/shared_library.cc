#include "common/base/shared_library.h"

#include <dlfcn.h>

namespace tessera {

StatusOr<SharedLibrary> SharedLibrary::Open(const std::string& file, const std::string& what) {
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return UnavailableError("cannot load " + file + " (" + what +
                            "): " + (why != nullptr ? why : "unknown error"));
  }
  return SharedLibrary(handle, file);
}

void* SharedLibrary::Find(const char* symbol) const { return dlsym(handle_, symbol); }

}  // namespace tessera
