// ReadPrivateFile: the text of a file that holds a secret (a job key file, an HTTP auth file),
// read only when nobody else could have read or changed it.
//
// Refused, naming the file and the reason: a symbolic link, anything but a regular file, a file
// another user owns, one whose group or others have any permission bit ("run chmod 600 PATH"),
// and one larger than the caller's limit (not read whole). The caller wipes the text it gets
// (sodium_memzero) once parsed.
//
// Thread-safety: a function of the file system.
#ifndef TESSERA_COMMON_SECURITY_PRIVATE_FILE_H_
#define TESSERA_COMMON_SECURITY_PRIVATE_FILE_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

// `what` names the file in errors: "key file" gives "key file /path: mode 0644 lets ...".
StatusOr<std::string> ReadPrivateFile(const std::string& path, std::string_view what,
                                      size_t max_bytes);

}  // namespace tessera

#endif  // TESSERA_COMMON_SECURITY_PRIVATE_FILE_H_
