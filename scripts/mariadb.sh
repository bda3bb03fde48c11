#!/usr/bin/env bash
# Installs MariaDB's server binaries, and libfaketime for the fault tests,
# from Debian's packages when they are missing. Only the binaries: no system
# service is set up or started; the tests and the demo start their own
# throwaway server in a temp directory.
#
#   scripts/mariadb.sh install
set -euo pipefail

have_server() {
  for b in mariadbd mysqld; do
    command -v "$b" >/dev/null 2>&1 && return 0
    [ -x "/usr/sbin/$b" ] && return 0
  done
  return 1
}

# have_faketime: libfaketime, which fault tests preload into mariadbd to fake
# its clock (internal/mariadb looks in the same places).
have_faketime() {
  for f in /usr/lib/*/faketime/libfaketime*.so.1 /usr/lib/faketime/libfaketime*.so.1 \
    /usr/local/lib/faketime/libfaketime*.so.1; do
    [ -f "$f" ] && return 0
  done
  return 1
}

case "${1:-}" in
install)
  packages=()
  if ! (have_server && command -v mariadb-install-db >/dev/null 2>&1); then
    packages+=(mariadb-server-core mariadb-client-core)
  fi
  if ! have_faketime; then
    packages+=(faketime)
  fi
  if [ ${#packages[@]} = 0 ]; then
    exit 0
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    sudo="sudo"
  fi
  echo "scripts/mariadb.sh: installing ${packages[*]} from Debian's packages" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" >/dev/null
  ;;
*)
  echo "usage: $0 install" >&2
  exit 2
  ;;
esac
