#!/bin/bash
# PID 1 of the interop guest after switch_root (see vm.sh): the host's root
# filesystem read-only, tmpfs where writes go, rdma_rxe on eth0, then a
# loop that runs the commands the host drops into $RUN/jobs.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C
fail() { echo "guest: $*" | tee "$RUN/failed" >/dev/ttyS0; sleep 1; echo o >/proc/sysrq-trigger; }
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /var/tmp
mount -t tmpfs tmpfs /root 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
ulimit -l unlimited
hostname rxe-guest 2>/dev/null
ip link set lo up
ip link set eth0 txqueuelen 20000 up || fail "no eth0"
sysctl -qw net.core.netdev_max_backlog=20000 net.core.rmem_max=16777216 net.core.wmem_max=16777216
ip addr add "$GIP" dev eth0 || fail "cannot set the address"
modprobe rdma_rxe || fail "modprobe rdma_rxe"
modprobe ib_uverbs || fail "modprobe ib_uverbs"
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add"
for i in $(seq 100); do
  [ -e /dev/infiniband/uverbs0 ] && break
  sleep 0.1
done
[ -e /dev/infiniband/uverbs0 ] || fail "no /dev/infiniband/uverbs0"
{ uname -r; rdma link show; } > "$RUN/guest-info"
echo ready > "$RUN/ready"
cd "$RUN/jobs" || fail "no jobs directory"
# The loop forks nothing while idle (TCG makes every fork slow): the
# jobs seen are remembered, the pause is a read with a time-out.
mkfifo /run/idle && exec 3<>/run/idle
shopt -s nullglob
declare -A seen
while :; do
  for f in *.cmd; do
    [ -n "${seen[$f]}" ] && continue
    seen[$f]=1
    n=${f%.cmd}
    read -r limit < "$n.limit"
    ( timeout -k 3 "$limit" bash "$f" > "$n.out" 2>&1; echo $? > "$n.rc" ) &
  done
  if [ -e poweroff ]; then
    sync
    echo o > /proc/sysrq-trigger
  fi
  read -r -t 0.03 -u 3
done
