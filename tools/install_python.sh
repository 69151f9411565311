#!/usr/bin/env bash
# Makes `import tessera.torch` work for Debian's /usr/bin/python3 (the interpreter
# python3-torch serves; another `python3` may come first on PATH): builds the extension module,
# copies the Python package `tessera` to a directory of its own, and puts a .pth file naming
# that directory in the interpreter's site-packages (the system's when run as root, the
# user's otherwise). Run it again after changing the backend.
#
#   tools/install_python.sh                  # package in <repo>/.python
#   tools/install_python.sh --prefix DIR     # package in DIR
#   tools/install_python.sh --uninstall      # removes the .pth file (and nothing else)
#
# Environment: TESSERA_PYTHON names another interpreter (it must import torch 1.13).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"

usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

python="${TESSERA_PYTHON:-/usr/bin/python3}"
prefix="$repo/.python"
uninstall=0
while (($# > 0)); do
  case "$1" in
    --prefix)
      [[ $# -ge 2 ]] || { echo "install_python: --prefix needs a directory" >&2; exit 2; }
      prefix="$2"
      shift 2
      ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --uninstall) uninstall=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install_python: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ "$python" == /usr/bin/python3 ]]; then
  tools/install_deps.sh torch  # Debian's PyTorch for that interpreter; quiet when present
fi
[[ -x "$python" ]] || { echo "install_python: no interpreter at $python (tools/install_deps.sh torch installs Debian's)" >&2; exit 1; }

# The site-packages directory this user can write: the interpreter's own when root, else the
# user's (which Python reads unless -s or PYTHONNOUSERSITE).
if ((EUID == 0)); then
  site="$("$python" -c 'import site; print(site.getsitepackages()[0])')"
else
  site="$("$python" -c 'import site; print(site.getusersitepackages())')"
fi
pth="$site/tessera.pth"

if ((uninstall)); then
  rm -f "$pth"
  echo "install_python: removed $pth"
  exit 0
fi

"$python" -c 'import torch' 2>/dev/null ||
  { echo "install_python: $python cannot import torch; run tools/install_deps.sh torch" >&2; exit 1; }

echo "install_python: building the extension (bazel build //worker/torch/tessera/torch:package)"
bazel build //worker/torch/tessera/torch:package
built="$(readlink -f bazel-bin)/worker/torch/tessera"  # bazel-bin: the build just made

mkdir -p "$prefix/tessera/torch"
prefix="$(cd "$prefix" && pwd)"
install -m 0644 worker/torch/tessera/__init__.py "$prefix/tessera/__init__.py"
# Every module of the package and of its subpackages (tessera.torch.fsdp), as the tree has them.
(cd worker/torch && find tessera/torch -name '*.py' -print0) |
  while IFS= read -r -d '' module; do
    install -D -m 0644 "worker/torch/$module" "$prefix/$module"
  done
install -m 0755 "$built/torch/_C.so" "$prefix/tessera/torch/_C.so"

mkdir -p "$site"
echo "$prefix" >"$pth"
"$python" -c 'import tessera.torch' ||
  { echo "install_python: $python still cannot import tessera.torch (see above)" >&2; exit 1; }
echo "install_python: $python imports tessera.torch from $prefix (through $pth)"
