#!/usr/bin/env bash
# The images and the container CI (what `make image-context`, `image-cpu`, `image`,
# `ci-container` and `pin-images` run).
#
#   scripts/containers.sh context     fill containers/build: the project as committed (git
#                                     archive HEAD), its lock, extra CA certificates
#                                     (EXTRA_CA_DIR, a corporate proxy), build args, and the CPU
#                                     image's torch wheel (pip download, with $PYTHON)
#   scripts/containers.sh cpu         the CPU image with podman (BASE: pins.env, or
#                                     BASE=localhost/… for a locally built one); OCI archive
#   scripts/containers.sh ci          the container CI: a Debian 12 base with debootstrap (no
#                                     registry needed), the CPU image on it with podman, its SIF
#                                     made by Apptainer running inside podman, and the whole test
#                                     suite run INSIDE the SIF (`make test-installed`, the project
#                                     mounted read-only, results written to $CI_RESULTS)
#   scripts/containers.sh train       the training image with Apptainer (needs a registry)
#   scripts/containers.sh pin         re-resolve the base digests in pins.env (skopeo), pull
#                                     the training base once and record what it holds
#                                     (containers/base-record.json, train_checks.py record)
#
# Cached between runs under $DEEPDIVE_CI_CACHE (default ~/.cache/deepdive-ci): the debootstrap
# root file system, and podman's images (tagged by the hash of what built them), so a second
# run with the same lock, Containerfile and commit rebuilds nothing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=../containers/pins.env
source containers/pins.env
BUILD=$ROOT/containers/build
CACHE=${DEEPDIVE_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deepdive-ci}
RESULTS=${CI_RESULTS:-$ROOT/containers/build/results}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/containers/podman/containers.conf}
# only the CPU image's torch wheel needs Python (pip download): the project's venv when there is
# one, else the host's python3; the training image's build needs only the host's python3 (a
# fresh build host: train_checks.py is standard library only)
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x $ROOT/.venv/bin/python ]] && PYTHON=$ROOT/.venv/bin/python
fi
stamp() { printf '%(%H:%M:%S)T %s\n' -1 "$*"; }

need() {  # need COMMAND PACKAGE: install PACKAGE (as root) when COMMAND is missing
  command -v "$1" >/dev/null && return 0
  "$ROOT/scripts/apt-install.sh" "$2" || { echo "containers: $1 is missing (apt-get install $2)" >&2; exit 1; }
}

apptainer_at_least() {  # apptainer_at_least MAJOR MINOR: the Apptainer on PATH is that or newer
  local version major minor
  version=$(apptainer --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+' | head -1)
  [[ -n $version ]] || return 1
  major=${version%%.*} minor=${version#*.}
  (( major > $1 || (major == $1 && minor >= $2) ))
}

digest() {  # a short hash of files, to tag what was built from them
  cat "$@" | sha256sum | cut -c1-16
}

version() {  # the project's version (pyproject.toml), the images' version label
  sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1
}

by_digest() {  # by_digest NAME:TAG DIGEST: NAME@DIGEST (Apptainer up to 1.3 refuses TAG@DIGEST)
  local name=$1 last=${1##*/}
  [[ $last == *:* ]] && name=${1%:*}
  echo "$name@$2"
}

context() {  # what both images are built from (no Python needed)
  rm -rf "$BUILD/project" "$BUILD/wheels" "$BUILD/ca"
  mkdir -p "$BUILD/project" "$BUILD/wheels" "$BUILD/ca"
  git archive HEAD | tar -x -C "$BUILD/project"
  # the training base's record as `make image` checked it (`make pin-images` may not be
  # committed yet; the digest it goes with is pins.env's, read from the checkout too)
  [[ ! -f containers/base-record.json ]] || cp containers/base-record.json "$BUILD/project/containers/"
  if [[ -n ${EXTRA_CA_DIR:-} ]]; then
    cp "$EXTRA_CA_DIR"/*.crt "$BUILD/ca/"  # the builder stage only
  fi
  local lock; lock=$(sha256sum requirements.lock | cut -d' ' -f1)
  local revision; revision=$(git rev-parse HEAD)
  local version; version=$(version)
  printf 'CPU_BASE=%s\nREVISION=%s\nVERSION=%s\nLOCK_SHA256=%s\nTORCH=%s\n' \
    "${BASE:-$CPU_BASE_TAG@$CPU_BASE_DIGEST}" "$revision" "$version" "$lock" "$TORCH_CPU" > "$BUILD/cpu.args"
  printf 'TRAIN_BASE=%s\nTRAIN_BASE_TAG=%s\nSLIME_REPOSITORY=%s\nSLIME_COMMIT=%s\nMEGATRON_REPOSITORY=%s\nMEGATRON_COMMIT=%s\nSGLANG_VERSION=%s\nREVISION=%s\nVERSION=%s\nLOCK_SHA256=%s\n' \
    "$(by_digest "$TRAIN_BASE_TAG" "$TRAIN_BASE_DIGEST")" "$TRAIN_BASE_TAG" "$SLIME_REPOSITORY" "$SLIME_COMMIT" "$MEGATRON_REPOSITORY" \
    "$MEGATRON_COMMIT" "$SGLANG_VERSION" "$revision" "$version" "$lock" > "$BUILD/train.args"
}

cpu_context() {  # the context and the CPU image's torch wheel
  context
  "$PYTHON" -m pip download --quiet --no-deps -d "$BUILD/wheels" "$TORCH_CPU"
}

cpu() {  # cpu [BASE]: the CPU image, tagged by what built it; prints the tag
  need podman podman
  local base=${1:-${BASE:-$CPU_BASE_TAG@$CPU_BASE_DIGEST}}
  local tag; tag="localhost/deepdive-cpu:$(echo "$base" | cat - containers/Containerfile.cpu requirements.lock <(git rev-parse HEAD) | sha256sum | cut -c1-16)"
  if ! podman image exists "$tag"; then
    cpu_context >&2
    podman build --quiet -f containers/Containerfile.cpu --build-arg "BASE=$base" \
      --build-arg "REVISION=$(git rev-parse HEAD)" --build-arg "VERSION=$(version)" \
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

# Apptainer on the host where it runs there (not as root: one capability it needs is missing),
# else Apptainer inside podman (the runner image), as a non-root user.
host_apptainer() { [[ ${APPTAINER_IN:-} != podman ]] && command -v apptainer >/dev/null && [[ $(id -u) != 0 ]]; }

in_apptainer() {  # in_apptainer FOLDER COMMAND...: COMMAND where `apptainer` runs, FOLDER at /sif
  local folder=$1; shift
  if host_apptainer; then
    (cd "$folder" && SIF=$folder bash -c "$*")
  else
    podman run --rm --privileged --user 1000:1000 -v "$folder:/sif" -v "$ROOT:/src:ro" \
      -v "$RESULTS:/results" -e SIF=/sif "$(runner)" bash -c "$*"
  fi
}

sif() {  # sif IMAGE FOLDER: IMAGE as FOLDER/<image id>.sif (made once); prints the file's name
  local image=$1 folder=$2
  mkdir -p "$folder" "$RESULTS"; chmod 777 "$folder" "$RESULTS"
  local name; name="$(podman image inspect --format '{{.Id}}' "$image" | cut -c1-16).sif"
  if [[ ! -s $folder/$name ]]; then
    podman save --quiet --format oci-archive -o "$folder/image.oci.tar" "$image"
    chmod 644 "$folder/image.oci.tar"
    in_apptainer "$folder" \
      'export APPTAINER_TMPDIR=$SIF/tmp APPTAINER_CACHEDIR=$SIF/cache && mkdir -p $SIF/tmp &&
       apptainer build --force $SIF/'"$name"'.partial oci-archive://$SIF/image.oci.tar >/dev/null &&
       mv $SIF/'"$name"'.partial $SIF/'"$name"' && rm -rf $SIF/tmp $SIF/cache' >&2
    rm -f "$folder/image.oci.tar"
  fi
  echo "$name"
}

ci() {  # CI_BASE=debootstrap (default: no registry needed) or pinned (pins.env's base)
  need podman podman
  need runc runc
  local base=localhost/debian-base:bookworm
  if [[ ${CI_BASE:-debootstrap} == pinned ]]; then
    base="$CPU_BASE_TAG@$CPU_BASE_DIGEST"
  else
    stamp "base image (debootstrap, cached)"
    debian_base
  fi
  host_apptainer || { stamp "the Apptainer runner (Apptainer inside podman)"; runner >/dev/null; }
  stamp "CPU image (podman, on $base)"
  local image; image=$(cpu "$base")
  local labelled; labelled=$(podman image inspect --format '{{ index .Labels "org.deepdive-slurm.lock.sha256" }}' "$image")
  if [[ $labelled != "$(sha256sum requirements.lock | cut -d' ' -f1)" ]]; then
    echo "containers: the image's lock label ($labelled) is not requirements.lock's hash" >&2
    return 1
  fi
  stamp "SIF (Apptainer)"
  local sifs=$CACHE/sif
  local sif; sif=$(sif "$image" "$sifs")
  stamp "the test suite inside the SIF"
  local src=/src results=/results
  host_apptainer && src=$ROOT results=$RESULTS
  set +e
  in_apptainer "$sifs" \
    "apptainer exec --bind $src:/src:ro --bind $results:/results --pwd /src --env PYTHONPATH=/src \
       --env PYTEST_ADDOPTS=--junitxml=/results/junit.xml \$SIF/$sif make -f /src/Makefile test-installed" \
    2>&1 | tee "$RESULTS/log.txt"
  local code=${PIPESTATUS[0]}
  set -e
  stamp "done: exit $code (results in $RESULTS)"
  return "$code"
}

train() {
  if [[ ! $TRAIN_BASE_DIGEST =~ ^sha256:[0-9a-f]{64}$ ]]; then
    echo "containers: TRAIN_BASE_DIGEST in containers/pins.env is not resolved; run 'make pin-images' where Docker Hub is reachable" >&2
    exit 2
  fi
  need apptainer apptainer
  if ! apptainer_at_least 1 2; then
    echo "containers: $(apptainer --version 2>&1 | head -1): the training image's build needs" \
      "Apptainer 1.2 or newer (its {{ }} arguments and --build-arg-file came in 1.2;" \
      "docs/image.md, \"Apptainer versions\")" >&2
    exit 2
  fi
  need python3 python3
  # the base as `make pin-images` recorded it: of this digest, naming no problem (before the
  # download: a base that cannot pass %test is refused here, not after it)
  python3 containers/train_checks.py ready containers/base-record.json \
    "$(by_digest "$TRAIN_BASE_TAG" "$TRAIN_BASE_DIGEST")"
  context
  # NOTEST=1: --notest, for a build host without a GPU driver (%test imports need libcuda);
  # then `apptainer test --nv IMAGE` on a GPU node (`make gpu-smoke` step 1 runs it)
  local notest=()
  [[ ${NOTEST:-0} == 0 ]] || notest=(--notest)
  apptainer build "${notest[@]}" --build-arg-file "$BUILD/train.args" "${IMAGE:-deepdive-train.sif}" containers/train.def
}

record_base() {  # record_base NAME@DIGEST: pull the training base once, record what it holds
  local image=$1 sandbox=$BUILD/base-sandbox
  need apptainer apptainer
  mkdir -p "$BUILD"
  rm -rf "$sandbox"
  # a sandbox the user owns (--fix-perms): slime's image keeps its checkouts in /root, mode 0700
  stamp "pulling $image once, into $sandbox"
  apptainer build --force --fix-perms --sandbox "$sandbox" "docker://$image"
  mkdir -p "$sandbox/deepdive-containers"
  apptainer exec --writable --contain --bind "$ROOT/containers:/deepdive-containers:ro" "$sandbox" \
    python3 /deepdive-containers/train_checks.py record --image "$image" \
    --slime-commit "$SLIME_COMMIT" --megatron-commit "$MEGATRON_COMMIT" \
    --sglang-version "$SGLANG_VERSION" --slime-repository "$SLIME_REPOSITORY" \
    > "$BUILD/base-record.json.new"
  mv "$BUILD/base-record.json.new" containers/base-record.json
  [[ ${KEEP_SANDBOX:-0} == 1 ]] || rm -rf "$sandbox"
}

pin() {
  need skopeo skopeo
  need python3 python3
  local cpu train
  cpu=$(skopeo inspect --format '{{.Digest}}' "docker://$CPU_BASE_TAG")
  train=$(skopeo inspect --format '{{.Digest}}' "docker://$TRAIN_BASE_TAG")
  record_base "$(by_digest "$TRAIN_BASE_TAG" "$train")"
  # the digests move only with their record (a failed pull or record leaves both as they were)
  sed -i "s|^CPU_BASE_DIGEST=.*|CPU_BASE_DIGEST=$cpu|; s|^TRAIN_BASE_DIGEST=.*|TRAIN_BASE_DIGEST=$train|" containers/pins.env
  echo "pinned: $CPU_BASE_TAG@$cpu, $TRAIN_BASE_TAG@$train; recorded in containers/base-record.json"
  # what in the base would fail the build, named now (`make image` refuses it too)
  python3 containers/train_checks.py ready containers/base-record.json "$(by_digest "$TRAIN_BASE_TAG" "$train")"
}

# sourced (scripts/two-hosts.sh): its functions only
[[ ${BASH_SOURCE[0]} != "$0" ]] && return 0

case "${1:-}" in
  context) cpu_context ;;
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
