// WriteFileAtomically: a file appears whole or not at all. The bytes go to PATH.tmp, which is
// fsync'ed and renamed over PATH (and the directory fsync'ed), so a crash leaves either the
// old file or the new one, never a torn one. Errors name the file and the failing call.
//
// Thread-safety: thread-safe for distinct paths.
#ifndef TESSERA_COMMON_BASE_ATOMIC_FILE_H_
#define TESSERA_COMMON_BASE_ATOMIC_FILE_H_

#include <cstddef>
#include <string>

#include "common/base/status.h"

namespace tessera {

Status WriteFileAtomically(const std::string& path, const void* bytes, size_t size);

// mkdir -p; errors name the directory.
Status MakeDirectories(const std::string& path);

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_ATOMIC_FILE_H_
