#!/usr/bin/env bash
# apt-get install PACKAGES as root, quietly; on a fresh machine without package lists, update
# them once and try again. Exits non-zero (saying why) when not root or the install fails.
set -euo pipefail
if [[ $(id -u) != 0 ]]; then
  echo "apt-install: not root; as root: apt-get install $*" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "$@" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null; }
