#!/usr/bin/env bash
# The launchers tests/test_real_launchers.py runs for real: installs Slurm, munge and Open MPI
# from the distribution where missing, then starts a one-node Slurm cluster on this machine:
# munge with a generated key, slurmctld and slurmd, one partition over this machine's CPUs
# (srun -n 4 --overcommit runs 4 tasks on a 2-core runner). Needs root (re-runs itself with
# sudo where it can). Idempotent: a cluster that already answers is left as it is.
#
#   bash .ci/launchers_up.sh
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        exec sudo -n bash "$0" "$@"
    fi
    echo "launchers_up.sh: needs root (it installs packages and starts munged, slurmctld," \
        "slurmd)" >&2
    exit 1
fi

missing=()
command -v srun >/dev/null || missing+=(slurm-client)
command -v slurmctld >/dev/null || missing+=(slurmctld)
command -v slurmd >/dev/null || missing+=(slurmd)
command -v munged >/dev/null || missing+=(munge)
command -v mpirun >/dev/null || missing+=(openmpi-bin)
if [ ${#missing[@]} -gt 0 ]; then
    # No man pages index to rebuild after the install (seconds on a small runner).
    echo "man-db man-db/auto-update boolean false" | debconf-set-selections
    install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    }
    # Package lists are fetched only when the install cannot do without them.
    install 2>/dev/null || { apt-get update -qq && install; }
fi
if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
    echo "launchers_up.sh: a Slurm cluster already answers"; exit 0
fi

node=$(hostname -s)
cpus=$(nproc)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
chown slurm: /var/spool/slurmctld /var/log/slurm
cat >/etc/slurm/slurm.conf <<CONF
ClusterName=ci
SlurmctldHost=$node
SlurmUser=slurm
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerType=sched/backfill
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobAcctGatherType=jobacct_gather/none
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
echo "CgroupPlugin=cgroup/v1" >/etc/slurm/cgroup.conf

# munge: a key only munge can read, then the daemon.
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge: /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged

pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd

for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
        echo "launchers_up.sh: node $node up with $cpus CPUs (partition ci)"; exit 0
    fi
    sleep 0.5
done
echo "launchers_up.sh: the node did not come up within 30 s; the logs say:" >&2
tail -20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
