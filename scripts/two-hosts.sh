#!/usr/bin/env bash
# The cluster as users meet it, in containers: a 2-host Slurm made of three podman containers on
# a network of their own, and the test that runs `deepdive submit` on it with the job inside the
# CPU image's SIF (what `make ci-two-hosts` runs; .ci/run runs it after `make ci-container`).
#
#   ctl   10.89.77.10  slurmctld; the login host: `deepdive submit` runs here, as ci (uid 1000),
#                      from the CPU image's /opt/venv
#   n1    10.89.77.11  slurmd (root); each task runs `apptainer exec` of the CPU SIF as ci:
#   n2    10.89.77.12  nothing of the project is installed on a node (Apptainer runs inside
#                      podman only --privileged and as a non-root user)
#
# One munge key on every host, one slurm.conf (NodeAddr: the containers' addresses), a podman
# volume mounted at /shared on every host as the shared file system (the run folders: /shared/
# runs), the SIF folder bound read-only at /sif. The network is created here with its own
# subnet and --internal (no route out: traffic can only go between these containers) and removed
# by `down`, as are the containers and the volume; the images stay, cached by what built them.
#
#   scripts/two-hosts.sh images   the base, runner, CPU image, its SIF and the two host images
#   scripts/two-hosts.sh up       images, then the cluster; writes $TWO_HOSTS_DIR/cluster.env
#   scripts/two-hosts.sh test     pytest tests/two_hosts on the cluster that is up
#   scripts/two-hosts.sh down     containers, network and volume removed
#   scripts/two-hosts.sh ci       up, test, down (the run folders and Slurm's logs are kept in
#                                 $CI_RESULTS/two-hosts)
#
# Settings (environment): TWO_HOSTS_NET (10.89.77: the /24 it uses), TWO_HOSTS_DIR
# (/tmp/deepdive-two-hosts: key, slurm.conf, logs), and containers.sh's (DEEPDIVE_CI_CACHE,
# CI_BASE, EXTRA_CA_DIR, PYTHON).
set -euo pipefail
# shellcheck source=containers.sh
source "$(dirname "${BASH_SOURCE[0]}")/containers.sh"  # ROOT, CACHE, RESULTS, stamp, cpu, sif...

NET=${TWO_HOSTS_NET:-10.89.77}
DIR=${TWO_HOSTS_DIR:-/tmp/deepdive-two-hosts}
PREFIX=dd2h
NETWORK=$PREFIX-net
VOLUME=$PREFIX-shared
HOSTS=(ctl n1 n2)
declare -A ADDRESS=([ctl]=$NET.10 [n1]=$NET.11 [n2]=$NET.12)
NODE_CPUS=2
NODE_MEM_MB=4000

[[ $NET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "two-hosts: TWO_HOSTS_NET=$NET is not the first three numbers of a /24" >&2; exit 2; }

host_image() {  # host_image BASE PACKAGES: Containerfile.slurm on BASE, tagged by what built it
  local base=$1 packages=$2
  local tag
  tag="localhost/deepdive-slurm-host:$( (podman image inspect --format '{{.Id}}' "$base"; echo "$packages"
    cat containers/Containerfile.slurm containers/slurm/host.sh) | sha256sum | cut -c1-16)"
  if ! podman image exists "$tag"; then
    podman build --quiet -f containers/Containerfile.slurm --build-arg "BASE=$base" \
      --build-arg "PACKAGES=$packages" -t "$tag" containers/slurm >/dev/null
  fi
  echo "$tag"
}

images() {  # sets CPU_IMAGE, SIF_DIR, SIF_NAME, NODE_IMAGE, CTL_IMAGE
  need podman podman
  need runc runc
  stamp "images: the Debian base and the Apptainer runner (cached)"
  debian_base
  local runner_image; runner_image=$(runner)
  stamp "images: the CPU image (cached by commit and lock)"
  local base=localhost/debian-base:bookworm  # the base `ci` built it on (CI_BASE, as there)
  [[ ${CI_BASE:-debootstrap} == pinned ]] && base="$CPU_BASE_TAG@$CPU_BASE_DIGEST"
  CPU_IMAGE=$(cpu "$base")
  stamp "images: its SIF (cached by image id)"
  SIF_DIR=$CACHE/sif
  SIF_NAME=$(sif "$CPU_IMAGE" "$SIF_DIR")
  stamp "images: the Slurm hosts (cached by base and Containerfile)"
  NODE_IMAGE=$(host_image "$runner_image" "slurmd squashfuse")
  CTL_IMAGE=$(host_image "$CPU_IMAGE" slurmctld)
}

slurm_conf() {
  local policy; policy=$(<"$ROOT/scripts/slurm-policy.conf")  # fails loudly
  cat <<CONF
# written by scripts/two-hosts.sh: ctl runs slurmctld, n1 and n2 slurmd, each in its own container
ClusterName=deepdive-two-hosts
SlurmctldHost=ctl(${ADDRESS[ctl]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$policy
NodeName=n1 NodeAddr=${ADDRESS[n1]} CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB State=UNKNOWN
NodeName=n2 NodeAddr=${ADDRESS[n2]} CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
}

wait_for() {  # wait_for WHAT SECONDS COMMAND...: poll every 0.5 s
  local what=$1 seconds=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      echo "two-hosts: $what did not happen within $seconds s (logs under $DIR/logs)" >&2
      return 1
    fi
    sleep 0.5
  done
}

nodes_idle() {
  local states; states=$(podman exec "$PREFIX-ctl" sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [[ $(grep -c -E ' (idle|mixed|allocated)$' <<<"$states") -eq 2 ]]
}

up() {
  images
  stamp "cluster: network $NET.0/24, volume, ctl, n1, n2"
  down >/dev/null
  mkdir -p "$DIR/munge" "$DIR/logs"
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1 count=1024 status=none
  chmod 600 "$DIR/munge/munge.key"
  slurm_conf > "$DIR/slurm.conf"
  podman network create --internal --subnet "$NET.0/24" "$NETWORK" >/dev/null
  podman volume create "$VOLUME" >/dev/null
  local hosts=() host
  for host in "${HOSTS[@]}"; do hosts+=(--add-host "$host:${ADDRESS[$host]}"); done
  for host in "${HOSTS[@]}"; do
    rm -rf "${DIR:?}/logs/$host"; mkdir -p "$DIR/logs/$host"
    local role=(node) image=$NODE_IMAGE extra=(--privileged --shm-size=2g)
    if [[ $host == ctl ]]; then
      role=(ctl) image=$CTL_IMAGE extra=(-v "$ROOT:/src:ro")
    fi
    podman run -d --init --name "$PREFIX-$host" --hostname "$host" \
      --network "$NETWORK" --ip "${ADDRESS[$host]}" "${hosts[@]}" \
      -v "$DIR/munge:/run/dd-munge:ro" -v "$DIR/slurm.conf:/etc/slurm/slurm.conf:ro" \
      -v "$DIR/logs/$host:/var/log/slurm" -v "$VOLUME:/shared" -v "$SIF_DIR:/sif:ro" \
      "${extra[@]}" "$image" "${role[@]}" >/dev/null
  done
  podman exec "$PREFIX-ctl" install -d -o 1000 -g 1000 -m 700 /shared/runs /shared/keys
  wait_for "both nodes to be idle" 60 nodes_idle
  cat > "$DIR/cluster.env" <<ENV
TWO_HOSTS_PREFIX=$PREFIX
TWO_HOSTS_NET=$NET
TWO_HOSTS_SIF=/sif/$SIF_NAME
TWO_HOSTS_SHARED=$(podman volume inspect --format '{{.Mountpoint}}' "$VOLUME")
TWO_HOSTS_LOGS=$DIR/logs
ENV
  stamp "cluster up: $(podman exec "$PREFIX-ctl" sinfo -h -N -o '%N=%T' | tr '\n' ' ')"
  echo "export DEEPDIVE_TWO_HOSTS=$DIR/cluster.env"
}

down() {
  local host
  for host in "${HOSTS[@]}"; do podman rm -f -t 0 "$PREFIX-$host" >/dev/null 2>&1 || true; done
  podman volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  podman network rm -f "$NETWORK" >/dev/null 2>&1 || true
  echo "two-hosts: down"
}

run_tests() {
  [[ -s $DIR/cluster.env ]] || { echo "two-hosts: no cluster is up ($DIR/cluster.env)" >&2; return 1; }
  stamp "the 2-host tests (tests/two_hosts)"
  DEEPDIVE_TWO_HOSTS=$DIR/cluster.env "$PYTHON" -m pytest -p no:cacheprovider -v -s tests/two_hosts
}

keep_results() {  # the run folders (small: a tiny model) and Slurm's logs, for a failed run
  local shared; shared=$(podman volume inspect --format '{{.Mountpoint}}' "$VOLUME" 2>/dev/null) || return 0
  rm -rf "$RESULTS/two-hosts"; mkdir -p "$RESULTS/two-hosts"
  cp -r "$shared/runs" "$RESULTS/two-hosts/runs" 2>/dev/null || true
  cp -r "$DIR/logs" "$RESULTS/two-hosts/slurm-logs" 2>/dev/null || true
}

ci() {
  trap 'keep_results; down >/dev/null' EXIT  # whatever fails, nothing of the cluster stays
  up
  set +e
  run_tests
  local code=$?
  set -e
  stamp "two hosts done: exit $code (results in $RESULTS/two-hosts after the cluster is down)"
  return "$code"
}

case "${1:-}" in
  images) images; echo "CPU $CPU_IMAGE, SIF $SIF_DIR/$SIF_NAME, node $NODE_IMAGE, ctl $CTL_IMAGE" ;;
  up) up ;;
  test) run_tests ;;
  down) down ;;
  ci) ci ;;
  *) echo "usage: $0 images|up|test|down|ci" >&2; exit 2 ;;
esac
