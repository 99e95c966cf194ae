#!/usr/bin/env bash
# The images and the container CI (what `make image-context`, `image-cpu`, `image`,
# `ci-container` and `pin-images` run).
#
#   scripts/containers.sh context     fill containers/build: the project as committed (git
#                                     archive HEAD), its lock, the torch wheel, extra CA
#                                     certificates (EXTRA_CA_DIR, a corporate proxy), build args
#   scripts/containers.sh cpu         the CPU image with podman (BASE: pins.env, or
#                                     BASE=localhost/… for a locally built one); OCI archive
#   scripts/containers.sh ci          the container CI: a Debian 12 base with debootstrap (no
#                                     registry needed), the CPU image on it with podman, its SIF
#                                     made by Apptainer running inside podman, and the whole test
#                                     suite run INSIDE the SIF (`make test-installed`, the project
#                                     mounted read-only, results written to $CI_RESULTS)
#   scripts/containers.sh train       the training image with Apptainer (needs a registry)
#   scripts/containers.sh pin         re-resolve the base digests in pins.env (skopeo)
#
# Cached between runs under $DEEPDIVE_CI_CACHE (default ~/.cache/deepdive-ci): the debootstrap
# root file system, and podman's images (tagged by the hash of what built them), so a second
# run with the same lock, Containerfile and commit rebuilds nothing.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=../containers/pins.env
source containers/pins.env
BUILD=$ROOT/containers/build
CACHE=${DEEPDIVE_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deepdive-ci}
RESULTS=${CI_RESULTS:-$ROOT/containers/build/results}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/containers/podman/containers.conf}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
stamp() { printf '%(%H:%M:%S)T %s\n' -1 "$*"; }

need() {  # need COMMAND PACKAGE: install PACKAGE (as root) when COMMAND is missing
  command -v "$1" >/dev/null && return 0
  "$ROOT/scripts/apt-install.sh" "$2" || { echo "containers: $1 is missing (apt-get install $2)" >&2; exit 1; }
}

digest() {  # a short hash of files, to tag what was built from them
  cat "$@" | sha256sum | cut -c1-16
}

context() {
  rm -rf "$BUILD/project" "$BUILD/wheels" "$BUILD/ca"
  mkdir -p "$BUILD/project" "$BUILD/wheels" "$BUILD/ca"
  git archive HEAD | tar -x -C "$BUILD/project"
  "$PYTHON" -m pip download --quiet --no-deps -d "$BUILD/wheels" "$TORCH_CPU"
  if [[ -n ${EXTRA_CA_DIR:-} ]]; then
    cp "$EXTRA_CA_DIR"/*.crt "$BUILD/ca/"  # the builder stage only
  fi
  local lock; lock=$(sha256sum requirements.lock | cut -d' ' -f1)
  local revision; revision=$(git rev-parse HEAD)
  printf 'CPU_BASE=%s\nREVISION=%s\nLOCK_SHA256=%s\nTORCH=%s\n' \
    "${BASE:-$CPU_BASE_TAG@$CPU_BASE_DIGEST}" "$revision" "$lock" "$TORCH_CPU" > "$BUILD/cpu.args"
  printf 'TRAIN_BASE=%s\nSLIME_REPOSITORY=%s\nSLIME_COMMIT=%s\nMEGATRON_REPOSITORY=%s\nMEGATRON_COMMIT=%s\nSGLANG_VERSION=%s\nREVISION=%s\nLOCK_SHA256=%s\n' \
    "$TRAIN_BASE_TAG@$TRAIN_BASE_DIGEST" "$SLIME_REPOSITORY" "$SLIME_COMMIT" "$MEGATRON_REPOSITORY" \
    "$MEGATRON_COMMIT" "$SGLANG_VERSION" "$revision" "$lock" > "$BUILD/train.args"
}

cpu() {  # cpu [BASE]: the CPU image, tagged by what built it; prints the tag
  need podman podman
  local base=${1:-${BASE:-$CPU_BASE_TAG@$CPU_BASE_DIGEST}}
  local tag; tag="localhost/deepdive-cpu:$(echo "$base" | cat - containers/Containerfile.cpu requirements.lock <(git rev-parse HEAD) | sha256sum | cut -c1-16)"
  if ! podman image exists "$tag"; then
    context >&2
    podman build --quiet -f containers/Containerfile.cpu --build-arg "BASE=$base" \
      --build-arg "REVISION=$(git rev-parse HEAD)" \
      --build-arg "LOCK_SHA256=$(sha256sum requirements.lock | cut -d' ' -f1)" \
      -t "$tag" "$BUILD" >&2
  fi
  echo "$tag"
}

debian_base() {  # a Debian 12 base image from debootstrap (cached), no registry needed
  need debootstrap debootstrap
  local image=localhost/debian-base:bookworm
  podman image exists "$image" && return 0
  mkdir -p "$CACHE"
  if [[ ! -s $CACHE/debian-bookworm-rootfs.tar ]]; then
    local mirror; mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    local rootfs; rootfs=$(mktemp -d)
    debootstrap --variant=minbase bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >/dev/null
    tar -C "$rootfs" -cf "$CACHE/debian-bookworm-rootfs.tar.partial" . && mv "$CACHE/debian-bookworm-rootfs.tar.partial" "$CACHE/debian-bookworm-rootfs.tar"
    rm -rf "$rootfs"
  fi
  podman import --quiet - "$image" < "$CACHE/debian-bookworm-rootfs.tar" >/dev/null
}

runner() {  # the Apptainer-in-podman image (cached by its Containerfile); prints its tag
  debian_base
  local tag; tag="localhost/deepdive-apptainer:$(digest containers/Containerfile.apptainer)"
  if ! podman image exists "$tag"; then
    podman build --quiet -f containers/Containerfile.apptainer --build-arg BASE=localhost/debian-base:bookworm \
      -t "$tag" containers >/dev/null
  fi
  echo "$tag"
}

sif() {  # sif IMAGE FOLDER: IMAGE as FOLDER/<image id>.sif (made once), by Apptainer inside
         # podman; prints the file's name
  local image=$1 folder=$2 apptainer; apptainer=$(runner)
  mkdir -p "$folder"; chmod 777 "$folder"
  local name; name="$(podman image inspect --format '{{.Id}}' "$image" | cut -c1-16).sif"
  if [[ ! -s $folder/$name ]]; then
    podman save --quiet --format oci-archive -o "$folder/image.oci.tar" "$image"
    chmod 644 "$folder/image.oci.tar"
    podman run --rm --privileged --user 1000:1000 -v "$folder:/sif" "$apptainer" bash -c \
      "export APPTAINER_TMPDIR=/sif/tmp APPTAINER_CACHEDIR=/sif/cache && mkdir -p /sif/tmp &&
       apptainer build --force /sif/$name.partial oci-archive:///sif/image.oci.tar >/dev/null &&
       mv /sif/$name.partial /sif/$name && rm -rf /sif/tmp /sif/cache" >&2
    rm -f "$folder/image.oci.tar"
  fi
  echo "$name"
}

ci() {
  need podman podman
  need runc runc
  stamp "base image (debootstrap, cached) and the Apptainer runner"
  local apptainer; apptainer=$(runner)
  stamp "CPU image (podman)"
  local image; image=$(cpu localhost/debian-base:bookworm)
  stamp "SIF (Apptainer inside podman)"
  local sifs=$CACHE/sif
  local sif; sif=$(sif "$image" "$sifs")
  stamp "the test suite inside the SIF"
  mkdir -p "$RESULTS"; chmod 777 "$RESULTS"
  podman run --rm --privileged --user 1000:1000 -v "$sifs:/sif:ro" -v "$ROOT:/src:ro" \
    -v "$RESULTS:/results" "$apptainer" \
    apptainer exec --bind /src:/src:ro --bind /results:/results --pwd /src --env PYTHONPATH=/src \
      --env PYTEST_ADDOPTS="--junitxml=/results/junit.xml" "/sif/$sif" \
      make -f /src/Makefile test-installed 2>&1 | tee "$RESULTS/log.txt"
  local code=${PIPESTATUS[0]}
  stamp "done: exit $code (results in $RESULTS)"
  return "$code"
}

train() {
  need apptainer apptainer
  if [[ -z $TRAIN_BASE_DIGEST ]]; then
    echo "containers: TRAIN_BASE_DIGEST in containers/pins.env is not resolved; run 'make pin-images' where Docker Hub is reachable" >&2
    exit 2
  fi
  context
  apptainer build --build-arg-file "$BUILD/train.args" "${IMAGE:-deepdive-train.sif}" containers/train.def
}

pin() {
  need skopeo skopeo
  local cpu train
  cpu=$(skopeo inspect --format '{{.Digest}}' "docker://$CPU_BASE_TAG")
  train=$(skopeo inspect --format '{{.Digest}}' "docker://$TRAIN_BASE_TAG")
  sed -i "s|^CPU_BASE_DIGEST=.*|CPU_BASE_DIGEST=$cpu|; s|^TRAIN_BASE_DIGEST=.*|TRAIN_BASE_DIGEST=$train|" containers/pins.env
  echo "pinned: $CPU_BASE_TAG@$cpu, $TRAIN_BASE_TAG@$train"
}

case "${1:-}" in
  context) context ;;
  cpu)
    image=$(cpu "${2:-}")
    name=$(sif "$image" "$BUILD/sif")
    ln -sf "sif/$name" "$BUILD/deepdive-cpu.sif"
    echo "built $image and $BUILD/deepdive-cpu.sif"
    ;;
  ci) ci ;;
  train) train ;;
  pin) pin ;;
  *) echo "usage: $0 context|cpu|ci|train|pin" >&2; exit 2 ;;
esac
