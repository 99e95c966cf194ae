#!/bin/bash
# The entry point of a 2-host CI cluster's host (Containerfile.slurm): munged with the cluster's
# shared key (bound at /run/dd-munge/munge.key; munge wants it 0400 and owned by munge), then
# slurmctld (`slurm-host ctl`) or slurmd (`slurm-host node`) in the foreground, reading the
# slurm.conf bound at /etc/slurm. Logs go to /var/log/slurm (bound from the host: the test
# prints them when a job fails).
set -euo pipefail
install -o munge -g munge -m 0400 /run/dd-munge/munge.key /etc/munge/munge.key
install -d -o munge -g munge /run/munge /var/lib/munge /var/log/munge
runuser -u munge -- /usr/sbin/munged
case ${1:-} in
  ctl)
    install -d /var/spool/slurmctld
    exec /usr/sbin/slurmctld -D -f /etc/slurm/slurm.conf
    ;;
  node)
    install -d /var/spool/slurmd
    # as udev leaves it on a Debian host: Apptainer mounts the SIF with squashfuse as the job's
    # (non-root) user; without it, it unpacks the whole image to a temporary sandbox per task
    chmod 666 /dev/fuse
    exec /usr/sbin/slurmd -D -f /etc/slurm/slurm.conf
    ;;
  *) echo "usage: slurm-host ctl|node" >&2; exit 2 ;;
esac
