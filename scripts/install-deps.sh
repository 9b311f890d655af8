#!/usr/bin/env bash
# Installs the build and test dependencies from Debian 12 packages (run as root).
# Usage: scripts/install-deps.sh [--test]   (--test adds the Python reference tools and Chromium)
set -euo pipefail
# libboost-dev: Boost.Asio + Beast (header-only), the daemon's HTTP server;
# libcpp-httplib-dev: only the integration tests' HTTP client and a benchmark.
packages=(build-essential cmake ninja-build pkg-config git
  libhdf5-dev hdf5-tools liblz4-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  libboost-dev libcpp-httplib-dev libfftw3-dev googletest libgtest-dev curl ca-certificates
  zlib1g-dev  # the catalog cache's checksum, gzip bodies of the catalog documents
  libsystemd-dev  # sd_notify for the Type=notify user unit (docs/deploy.md)
  python3 python3-numpy)  # numpy: the README's format=npy example
if [[ "${1:-}" == "--test" ]]; then
  # Independent references: h5py + the official bitshuffle filter + numpy.
  # hdf5-filter-plugin: the HDF5 LZ4 filter (32004) that hdf5plugin.LZ4() fixtures need
  # (only recommended by python3-hdf5plugin, and recommends are not installed here).
  packages+=(python3 python3-h5py python3-hdf5plugin bitshuffle hdf5-filter-plugin python3-numpy)
  # The viewer's browser test (tests/browser/): headless Chromium driven through WebDriver.
  packages+=(chromium chromium-driver python3-selenium)
  # systemd: systemd-analyze verifies the installed user unit (scripts/test-install.sh)
  packages+=(systemd)
  # The ssh recipes of docs/connect.md against a throwaway local sshd
  # (tests/integration/ssh_recipe_test.sh).
  packages+=(openssh-server openssh-client)
  # The fuzz targets (tests/fuzz): clang 14 and its libFuzzer/sanitizer runtimes
  # (libclang-rt-14-dev is only recommended by clang-14).
  packages+=(clang libclang-rt-14-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
