#!/bin/sh
# Install Halaman for the current user (no root): a menu entry, an icon and the `halaman` command.
# The first start then sets up PyTorch and the default model with a progress window.
#   ./install.sh [--prefix DIR] [--torch auto|cpu|cuda] [--no-bin-link] [--prepare-now]
# Needs Python 3.11 or newer (python3 on current Debian, Ubuntu 24.04, Fedora); HALAMAN_PYTHON picks one.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
for candidate in "${HALAMAN_PYTHON:-}" python3 python3.13 python3.12 python3.11 python3.14; do
  [ -n "$candidate" ] || continue
  if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    exec "$candidate" -s "$here/launch.py" install "$@"
  fi
done
echo "Halaman needs Python 3.11 or newer, and none was found (tried python3, python3.11 ... python3.14)." >&2
echo "Install it with your package manager (e.g. sudo apt install python3), or set HALAMAN_PYTHON=/path/to/python3.x." >&2
exit 1
