#!/usr/bin/env bash
# A private Slurm cluster on this one host, for the tests and for trying `deepdive submit`:
# munged, slurmctld and one slurmd per emulated node (Debian's Slurm runs several slurmd on
# one host: nodes n1..nN, each on its own port, all at 127.0.0.1). No systemd, no cgroups,
# no accounting; every daemon is started and stopped by its pid file, never by name.
#
#   scripts/local-slurm.sh install   apt-get install Debian's Slurm and munge (as root)
#   scripts/local-slurm.sh up        start (idempotent); prints the SLURM_CONF to export
#   scripts/local-slurm.sh down      cancel this cluster's jobs, stop its daemons
#
# Settings (environment): DEEPDIVE_SLURM_DIR (/tmp/deepdive-slurm), NODES (2), NODE_CPUS
# (this host's cores, at most 2), NODE_MEM_MB (6000), CTLD_PORT (16817), SLURMD_PORT0 (16900),
# TASK_PLUGIN (task/none: nothing binds a task; task/affinity: every task bound to the cores its
# step was given, TaskPluginParam=Cores, as a site that binds cores does; docs/cluster.md "Your site").
# Gotchas it handles: the munge key must be 0400 and owned by munge; daemons need an absolute
# -f; DefMemPerCPU, or one job takes a whole node's memory; cred_expire=10 and short scheduler
# intervals, or a requeued job waits ~2 minutes; zombies are not alive.
set -euo pipefail

BASE=${DEEPDIVE_SLURM_DIR:-/tmp/deepdive-slurm}
NODES=${NODES:-2}
CORES=$(nproc)
NODE_CPUS=${NODE_CPUS:-$(( CORES < 2 ? CORES : 2 ))}
NODE_MEM_MB=${NODE_MEM_MB:-6000}
TASK_PLUGIN=${TASK_PLUGIN:-task/none}
case $TASK_PLUGIN in
  task/none|task/affinity) ;;
  *) echo "local-slurm: TASK_PLUGIN=$TASK_PLUGIN: expected task/none or task/affinity" >&2; exit 2 ;;
esac
CTLD_PORT=${CTLD_PORT:-16817}
SLURMD_PORT0=${SLURMD_PORT0:-16900}
CONF=$BASE/slurm.conf
M=$BASE/munge
S=$BASE/slurm
export SLURM_CONF=$CONF

alive() {  # alive PIDFILE NAME: a live process of that name (zombies do not count)
  [[ -s $1 ]] || return 1
  local pid; pid=$(cat "$1")
  [[ -d /proc/$pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" &&
     $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}

wait_for() {  # wait_for WHAT COMMAND...: poll with backoff for up to ~20 s
  local what=$1; shift
  local delay=0.02
  for _ in $(seq 1 60); do
    "$@" && return 0
    sleep "$delay"; delay=$(awk -v d="$delay" 'BEGIN { d *= 1.5; print (d > 0.5 ? 0.5 : d) }')
  done
  echo "local-slurm: $what did not happen (logs under $BASE)" >&2
  return 1
}

stop_pid() {  # stop_pid PIDFILE NAME
  alive "$1" "$2" || { rm -f "$1"; return 0; }
  local pid; pid=$(cat "$1")
  kill -TERM "$pid"
  wait_for "$2 to stop" bash -c "! [[ -d /proc/$pid && \$(awk '{print \$3}' /proc/$pid/stat 2>/dev/null) != Z ]]" ||
    kill -KILL "$pid" 2>/dev/null || true
  rm -f "$1"
}

# The daemons: PATH's where there are (a `nix develop` shell's, with their plugins beside them in
# lib/slurm), else Debian's in /usr/sbin (not on a user's PATH).
daemon() {  # daemon NAME: the path of the daemon to run
  command -v "$1" 2>/dev/null || echo "/usr/sbin/$1"
}
SLURMCTLD=$(daemon slurmctld)
SLURMD=$(daemon slurmd)
MUNGED=$(daemon munged)
PLUGINS=$(dirname "$(dirname "$SLURMCTLD")")/lib/slurm  # Debian's: none there (its default)

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
     && command -v sbatch >/dev/null; then
    return 0
  fi
  "$(dirname "$0")/apt-install.sh" slurmctld slurmd slurm-client munge
}

up() {
  mkdir -p "$M"/{etc,run,log,lib} "$S"/{state,log,run}
  for i in $(seq 1 "$NODES"); do mkdir -p "$S/spool/n$i"; done
  [[ -s $M/etc/munge.key ]] || dd if=/dev/urandom of="$M/etc/munge.key" bs=1 count=1024 status=none
  chown -R munge:munge "$M"; chmod 700 "$M/etc"; chmod 400 "$M/etc/munge.key"
  if ! alive "$M/run/munged.pid" munged; then
    rm -f "$M/run/munge.socket" "$M/run/munge.socket.lock"
    runuser -u munge -- "$MUNGED" --key-file="$M/etc/munge.key" --socket="$M/run/munge.socket" \
      --pid-file="$M/run/munged.pid" --log-file="$M/log/munged.log" --seed-file="$M/lib/munged.seed"
    wait_for "munged to start" alive "$M/run/munged.pid" munged
  fi
  local host; host=$(hostname -s)
  local policy; policy=$(<"$(dirname "${BASH_SOURCE[0]}")/slurm-policy.conf")  # fails loudly
  policy=$(sed "s|^TaskPlugin=.*|TaskPlugin=$TASK_PLUGIN|" <<<"$policy")  # the policy's default: task/none
  [[ $TASK_PLUGIN == task/affinity ]] && policy+=$'\nTaskPluginParam=Cores'
  # Slurm's daemons and srun on loopback instead of every address (NoInAddrAny binds the address
  # this host's full name resolves to), where that is 127.0.0.1: what NodeAddr and SlurmctldHost say
  local bind="# this host's name does not resolve to 127.0.0.1: Slurm binds every address"
  [[ $(getent ahostsv4 "$(hostname)" | awk 'NR == 1 { print $1 }') == 127.0.0.1 ]] &&
    bind="CommunicationParameters=NoCtldInAddrAny,NoInAddrAny"
  local conf; conf=$(mktemp)
  cat > "$conf" <<CONF
# written by scripts/local-slurm.sh: one host, $NODES emulated node(s), $TASK_PLUGIN, no cgroups, no accounting
ClusterName=deepdive-dev
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$M/run/munge.socket,cred_expire=10
SlurmctldPort=$CTLD_PORT
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
$([[ -d $PLUGINS ]] && echo "PluginDir=$PLUGINS")
$bind
$policy
NodeName=n[1-$NODES] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((SLURMD_PORT0 + 1))-$((SLURMD_PORT0 + NODES))] CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  if ! cmp -s "$conf" "$CONF"; then
    mv "$conf" "$CONF"; chmod 644 "$CONF"
    for f in "$S"/run/slurmd-*.pid; do [[ -e $f ]] && stop_pid "$f" slurmd; done
    stop_pid "$S/run/slurmctld.pid" slurmctld
  else
    rm -f "$conf"
  fi
  if ! alive "$S/run/slurmctld.pid" slurmctld; then
    "$SLURMCTLD" -f "$CONF"
    wait_for "slurmctld to start" alive "$S/run/slurmctld.pid" slurmctld
  fi
  for i in $(seq 1 "$NODES"); do
    if ! alive "$S/run/slurmd-n$i.pid" slurmd; then
      "$SLURMD" -f "$CONF" -N "n$i"
      wait_for "slurmd n$i to start" alive "$S/run/slurmd-n$i.pid" slurmd
    fi
  done
  nodes_ready() {
    local states; states=$(sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
    [[ $(wc -l <<<"$states") -eq $NODES ]] || return 1
    if grep -q -E ' (down|drained|draining)' <<<"$states"; then
      scontrol update NodeName="n[1-$NODES]" State=RESUME >/dev/null 2>&1 || true
      return 1
    fi
    ! grep -q -v -E ' (idle|mixed|allocated|completing)$' <<<"$states"
  }
  wait_for "every node to be idle" nodes_ready
  echo "export SLURM_CONF=$CONF"
}

down() {
  if alive "$S/run/slurmctld.pid" slurmctld; then
    local jobs; jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086
      scancel $jobs || true
      wait_for "the jobs to end" bash -c '[[ -z $(squeue -h -o %i 2>/dev/null) ]]' || true
    fi
  fi
  for f in "$S"/run/slurmd-*.pid; do [[ -e $f ]] && stop_pid "$f" slurmd; done
  stop_pid "$S/run/slurmctld.pid" slurmctld
  stop_pid "$M/run/munged.pid" munged
  echo "local-slurm: down"
}

case "${1:-}" in
  install) install ;;
  up) install && up ;;
  down) down ;;
  *) echo "usage: $0 install|up|down" >&2; exit 2 ;;
esac
