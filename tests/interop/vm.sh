# shellcheck shell=bash
# tests/interop/vm.sh — a Linux guest with kernel Soft-RoCE (rdma_rxe) in
# qemu, on a tap device inside a network namespace of its own. Sourced by
# run.sh; needs root and Debian's qemu-system-x86, linux-image-amd64 (or the
# image of the kernel UROCE_INTEROP_KERNEL names, e.g. linux-image-6.12-amd64),
# busybox-static, rdma-core, ibverbs-utils, ibverbs-providers.
#
# The guest boots the host's Debian kernel with a tiny initramfs (busybox
# + the virtio/9p modules) that mounts the host's root filesystem
# read-only over virtio-9p (uncached: fresh host builds are seen at once)
# and a run directory read-write at the same path as on the host. It then
# runs guest-init.sh, which loads rdma_rxe, adds rxe0 on eth0 and serves
# commands the host drops into $VM_RUN/jobs (vm_run / vm_bg / vm_wait).
#
#   host netns $VM_NS: tap $VM_TAP 10.99.0.1/24  <->  guest eth0 10.99.0.2/24
#
# Nothing leaves the namespace; the host's own interfaces are not touched.

VM_NS=${VM_NS:-uroce-interop-$$}
VM_TAP=${VM_TAP:-uroce-tap0}
VM_HOST_IP=10.99.0.1
VM_GUEST_IP=10.99.0.2
VM_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_RUN=""
VM_PID=""
VM_JOBN=0
VM_ACCEL_USED=""

vm_log() { echo "interop: $*" >&2; }

# The guest's kernel: UROCE_INTEROP_KERNEL names it, 6.1 unless set, so
# installing another kernel does not change what the matrix runs.
#   6.1, 6.12 (a Debian series)  the newest installed kernel of that series
#   6.12.117+deb12-amd64         that kernel exactly (a /lib/modules name)
VM_KERNEL=${UROCE_INTEROP_KERNEL:-6.1}

# Does this installed kernel have rdma_rxe and an image qemu can boot?
vm_kernel_usable() { # KVER
  [ -e "/boot/vmlinuz-$1" ] && [ -n "$(find "/lib/modules/$1" -name 'rdma_rxe.ko*' -print -quit 2>/dev/null)" ]
}

# The installed kernel VM_KERNEL names (a /lib/modules name).
vm_kernel_version() {
  local k
  if [ -d "/lib/modules/$VM_KERNEL" ]; then
    vm_kernel_usable "$VM_KERNEL" && echo "$VM_KERNEL"
    return
  fi
  # A series: 6.1 takes 6.1.0-56-amd64, not 6.12.x.
  for k in $(ls -1 /lib/modules 2>/dev/null | sort -rV); do
    case "$k" in
      "$VM_KERNEL".[0-9]* | "$VM_KERNEL"-*) vm_kernel_usable "$k" && { echo "$k"; return 0; } ;;
    esac
  done
  return 1
}

# The Debian package that installs VM_KERNEL: bookworm's linux-image-amd64
# is the 6.1 series; newer series have a package of their own.
vm_kernel_package() {
  case "$VM_KERNEL" in
    6.1) echo linux-image-amd64 ;;
    [0-9]*.[0-9]*[!0-9.]*) echo "linux-image-$VM_KERNEL" ;;
    *) echo "linux-image-$VM_KERNEL-amd64" ;;
  esac
}

# Prints what is missing to run the VM (empty: nothing).
vm_missing() {
  local miss=()
  [ "$(id -u)" = 0 ] || miss+=("root")
  command -v qemu-system-x86_64 >/dev/null || miss+=("qemu-system-x86_64 (qemu-system-x86)")
  [ -x /bin/busybox ] || miss+=("/bin/busybox (busybox-static)")
  vm_kernel_version >/dev/null || miss+=("kernel $VM_KERNEL with rdma_rxe in /boot and /lib/modules ($(vm_kernel_package))")
  command -v ibv_rc_pingpong >/dev/null || miss+=("ibv_rc_pingpong (ibverbs-utils)")
  [ -e /etc/libibverbs.d/rxe.driver ] || miss+=("the rxe verbs provider (ibverbs-providers)")
  command -v rdma >/dev/null || miss+=("rdma (iproute2)")
  command -v cpio >/dev/null || miss+=("cpio")
  echo "${miss[*]}"
}

# Installs the Debian packages the VM needs (root, apt).
vm_install_packages() {
  local pk=(qemu-system-x86 "$(vm_kernel_package)" rdma-core ibverbs-utils ibverbs-providers
    perftest busybox-static libibverbs-dev gcc cpio iproute2 tcpdump tshark)
  local need=() p
  for p in "${pk[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || return 1
  vm_log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -q >/dev/null 2>&1 || true
  timeout 1200 apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
    timeout 1200 apt-get install -y -q "${need[@]}" >/dev/null 2>&1
}

vm_build_initramfs() { # KVER OUT
  local k=$1 out=$2 d m
  d=$(mktemp -d "$VM_RUN/initramfs.XXXX")
  mkdir -p "$d"/{bin,proc,sys,dev,newroot,mods}
  cp /bin/busybox "$d/bin/busybox"
  : >"$d/mods/order"
  for m in virtio_pci virtio_net 9pnet_virtio 9p; do
    modprobe -S "$k" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
  done | awk '!seen[$0]++' | while read -r m; do
    cp "$m" "$d/mods/"
    basename "$m" >>"$d/mods/order"
  done
  cp "$VM_HERE/initramfs-init" "$d/init"
  chmod +x "$d/init"
  (cd "$d" && find . | cpio -o -H newc --quiet | gzip -1) >"$out"
  rm -rf "$d"
}

# Network namespace with the tap qemu uses.
vm_net_up() {
  ip netns del "$VM_NS" 2>/dev/null || true
  ip netns add "$VM_NS"
  ip -n "$VM_NS" link set lo up
  ip netns exec "$VM_NS" ip tuntap add dev "$VM_TAP" mode tap
  ip -n "$VM_NS" addr add "$VM_HOST_IP/24" dev "$VM_TAP"
  # A queue that holds a burst: 16 QPs x 64 PSNs in flight arrive faster
  # than a TCG guest takes them, and the default 1000 packets drop some.
  ip -n "$VM_NS" link set "$VM_TAP" txqueuelen 20000 up
}

# Does KVM work here? Only a boot tells (a paravirtual /dev/kvm may hang a
# stock kernel): vm_boot tries it and falls back to TCG.
vm_qemu() { # ACCEL KVER
  local accel=$1 k=$2 acc
  if [ "$accel" = kvm ]; then acc=(-accel kvm -cpu host); else acc=(-accel tcg,thread=multi -cpu max); fi
  : >"$VM_RUN/console.log"
  rm -f "$VM_RUN/qemu.pid"
  # In a subshell whose stderr is the log: a qemu that aborts is reported
  # there, not on the matrix's output. VM_PID is qemu's own pid.
  (
    exec 2>>"$VM_RUN/qemu-$accel.log"
    ip netns exec "$VM_NS" qemu-system-x86_64 -nodefaults -no-user-config -display none \
    "${acc[@]}" -smp 2 -m 2048 \
    -kernel "/boot/vmlinuz-$k" -initrd "$VM_RUN/initramfs.gz" \
    -append "console=ttyS0 panic=-1 quiet uroce.run=$VM_RUN uroce.init=$VM_RUN/guest-init.sh uroce.ip=$VM_GUEST_IP/24" \
    -serial "file:$VM_RUN/console.log" -no-reboot \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$VM_RUN,mount_tag=run,security_model=none,multidevs=remap" \
    -netdev "tap,id=n0,ifname=$VM_TAP,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:99:00:02" \
    -pidfile "$VM_RUN/qemu.pid" >>"$VM_RUN/qemu-$accel.log" 2>&1
  ) &
  VM_PID=""
  local i
  for i in $(seq 100); do
    [ -s "$VM_RUN/qemu.pid" ] && break
    kill -0 $! 2>/dev/null || break
    sleep 0.05
  done
  VM_PID=$(cat "$VM_RUN/qemu.pid" 2>/dev/null)
  [ -n "$VM_PID" ] || VM_PID=$!
}

vm_wait_for() { # FILE SECONDS
  local f=$1 t=$2 end=$((SECONDS + $2))
  while [ ! -e "$f" ]; do
    [ $SECONDS -ge $end ] && return 1
    kill -0 "$VM_PID" 2>/dev/null || return 1
    sleep 0.1
  done
}

vm_kill() {
  if [ -n "$VM_PID" ] && kill -0 "$VM_PID" 2>/dev/null; then
    kill "$VM_PID" 2>/dev/null
    local i
    for i in $(seq 30); do kill -0 "$VM_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$VM_PID" 2>/dev/null || true
  fi
  VM_PID=""
}

# Boots the guest and waits until rxe0 is up. Sets VM_ACCEL_USED and
# VM_BOOT_SECONDS. UROCE_INTEROP_ACCEL=kvm|tcg forces one.
vm_boot() {
  local k t0 accel
  k=$(vm_kernel_version) || { vm_log "no kernel $VM_KERNEL with rdma_rxe"; return 1; }
  VM_RUN=$(mktemp -d /tmp/uroce-interop.XXXXXX)
  chmod 755 "$VM_RUN"
  mkdir -p "$VM_RUN/jobs"
  # The guest mounts tmpfs on /tmp, /run, /var/tmp and /root, which would
  # hide a checkout there (a CI clone under /tmp): what it runs from the
  # checkout, guest-init.sh, goes to the run directory, which it mounts
  # explicitly. Nothing else of the checkout is read in the guest (the
  # peers it runs are built into the run directory or come from /usr).
  cp "$VM_HERE/guest-init.sh" "$VM_RUN/guest-init.sh" || return 1
  vm_build_initramfs "$k" "$VM_RUN/initramfs.gz" || return 1
  vm_net_up || return 1
  local tries=()
  case "${UROCE_INTEROP_ACCEL:-auto}" in
    kvm) tries=(kvm) ;;
    tcg) tries=(tcg) ;;
    *) if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then tries=(kvm tcg); else tries=(tcg); fi ;;
  esac
  for accel in "${tries[@]}"; do
    t0=$SECONDS
    rm -f "$VM_RUN/ready" "$VM_RUN/failed"
    vm_qemu "$accel" "$k"
    if [ "$accel" = kvm ] && [ ${#tries[@]} -gt 1 ]; then
      # A working KVM reaches the initramfs in a second or two.
      if ! vm_wait_for "$VM_RUN/stage-initramfs" 20; then
        vm_log "KVM could not boot the guest ($(grep -m 1 "^qemu-system-x86_64:" "$VM_RUN/qemu-kvm.log" 2>/dev/null)); using TCG"
        vm_kill
        continue
      fi
    fi
    if vm_wait_for "$VM_RUN/ready" 240; then
      VM_ACCEL_USED=$accel
      VM_BOOT_SECONDS=$((SECONDS - t0))
      return 0
    fi
    vm_log "guest ($accel) not ready; console:"
    tail -n 30 "$VM_RUN/console.log" >&2
    [ -e "$VM_RUN/failed" ] && cat "$VM_RUN/failed" >&2
    vm_kill
  done
  return 1
}

# vm_bg TIMEOUT CMD... — start CMD (a bash command line) in the guest under
# `timeout`; sets VM_JOB to its id.
vm_bg() {
  local t=$1
  shift
  VM_JOBN=$((VM_JOBN + 1))
  VM_JOB=$VM_JOBN
  echo "$t" >"$VM_RUN/jobs/$VM_JOB.limit"
  printf '%s\n' "$*" >"$VM_RUN/jobs/$VM_JOB.tmp"
  mv "$VM_RUN/jobs/$VM_JOB.tmp" "$VM_RUN/jobs/$VM_JOB.cmd"
}

# vm_wait JOB — waits for a job (its own timeout + 15 s at most), prints
# its output, returns its exit status (124: timed out, 125: lost).
vm_wait() {
  local j=$1 t end
  t=$(cat "$VM_RUN/jobs/$j.limit")
  end=$((SECONDS + ${t%%[!0-9]*} + 15))
  while [ ! -s "$VM_RUN/jobs/$j.rc" ]; do
    if [ $SECONDS -ge $end ] || ! kill -0 "$VM_PID" 2>/dev/null; then
      cat "$VM_RUN/jobs/$j.out" 2>/dev/null
      echo "(guest job $j lost)"
      return 125
    fi
    sleep 0.05
  done
  cat "$VM_RUN/jobs/$j.out"
  return "$(cat "$VM_RUN/jobs/$j.rc")"
}

# vm_run TIMEOUT CMD... — runs CMD in the guest, prints its output, returns
# its status.
vm_run() {
  vm_bg "$@"
  vm_wait "$VM_JOB"
}

vm_down() {
  if [ -n "$VM_PID" ] && [ -n "$VM_RUN" ]; then
    echo poweroff >"$VM_RUN/jobs/poweroff" 2>/dev/null || true
  fi
  vm_kill
  ip netns pids "$VM_NS" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$VM_NS" 2>/dev/null || true
  if [ -n "$VM_RUN" ] && [ -z "${UROCE_INTEROP_KEEP:-}" ]; then
    rm -rf "$VM_RUN"
  fi
}
