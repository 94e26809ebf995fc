"""Mooncake Transfer Engine's Python API between two processes, on uroce.

    python3 mooncake_check.py server ADDR DIR SIZE
    python3 mooncake_check.py client ADDR DIR SIZE UROCE

Run by tests/ibverbs/apps.sh, each process under `uroce exec` with a
device of its own at ADDR, as a user runs the wheel
(`mooncake-transfer-engine-non-cuda`): protocol "rdma", no device named
(Mooncake discovers the RDMA devices from sysfs), the peer found by
Mooncake's own handshake (metadata "P2PHANDSHAKE"), no topology file.

The server registers 2*SIZE bytes: the first half for the client to
write, the second filled with a pattern for it to read. It writes
DIR/server (its segment name and buffer address) and waits. The client
RDMA WRITEs SIZE bytes of its own pattern into the first half and READs
the second half back, checks what it read, and writes DIR/written; the
server then checks its first half and exits. Mooncake falls back to TCP
without a word when it finds no usable RDMA device, and still moves the
bytes: so the client also asks `uroce stat` (UROCE: the uroce command)
for its own device's counters, and passes only if that device sent and
received at least the packets SIZE bytes take each way at its QPs' path
MTU.

Prints one line starting "mooncake_check: ok" on success; exits non-zero
otherwise.
"""

import json
import mmap
import os
import random
import subprocess
import sys
import time

from mooncake.engine import TransferEngine


def fail(msg):
    print(f"mooncake_check: {msg}", flush=True)
    sys.exit(1)


def pattern(seed, size):
    return random.Random(seed).randbytes(size)


def buffer(size):
    """Page-aligned anonymous memory and its address."""
    import ctypes

    m = mmap.mmap(-1, size)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def wait_for(path, secs=60):
    end = time.monotonic() + secs
    while not os.path.exists(path):
        if time.monotonic() > end:
            fail(f"{path} did not appear in {secs} s")
        time.sleep(0.05)


def engine(addr):
    te = TransferEngine()
    rc = te.initialize(addr, "P2PHANDSHAKE", "rdma", "")
    if rc != 0:
        fail(f"initialize({addr!r}, P2PHANDSHAKE, rdma) returned {rc}")
    return te


def server(addr, d, size):
    te = engine(addr)
    m, base = buffer(2 * size)
    m[size:] = pattern(2, size)
    if te.register_memory(base, 2 * size) != 0:
        fail("register_memory failed")
    seg = f"{addr}:{te.get_rpc_port()}"
    tmp = os.path.join(d, "server.tmp")
    with open(tmp, "w") as f:
        json.dump({"segment": seg, "addr": base}, f)
    os.rename(tmp, os.path.join(d, "server"))
    wait_for(os.path.join(d, "written"))
    if m[:size] != pattern(1, size):
        bad = next(i for i, (a, b) in enumerate(zip(m[:size], pattern(1, size))) if a != b)
        fail(f"server: the client's WRITE differs from byte {bad}")
    print(f"mooncake_check: ok: server holds the {size} bytes the client wrote", flush=True)


def counters(uroce):
    """This process's devices' counters, from `uroce stat --json PID`."""
    out = subprocess.run(
        [uroce, "stat", "--json", str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=20,
    )
    if out.returncode != 0:
        # No state socket: the process never opened a uroce device.
        fail(f"uroce stat: {out.stderr.strip()} (Mooncake fell back to TCP?)")
    return json.loads(out.stdout)


def client(addr, d, size, uroce):
    te = engine(addr)
    wait_for(os.path.join(d, "server"))
    with open(os.path.join(d, "server")) as f:
        peer = json.load(f)
    m, base = buffer(2 * size)
    m[:size] = pattern(1, size)
    if te.register_memory(base, 2 * size) != 0:
        fail("register_memory failed")
    t0 = time.monotonic()
    rc = te.transfer_sync_write(peer["segment"], base, peer["addr"], size)
    t1 = time.monotonic()
    if rc != 0:
        fail(f"transfer_sync_write returned {rc}")
    rc = te.transfer_sync_read(peer["segment"], base + size, peer["addr"] + size, size)
    t2 = time.monotonic()
    if rc != 0:
        fail(f"transfer_sync_read returned {rc}")
    if m[size:] != pattern(2, size):
        fail("client: the READ's bytes differ from the server's")
    open(os.path.join(d, "written"), "w").close()
    procs = counters(uroce)
    devs = [dev for p in procs for dev in p.get("devices", [])]
    if not devs:
        fail(f"uroce stat shows no device in this process: {json.dumps(procs)[:300]}")
    sent = sum(dev.get("counters", {}).get("sent_pkts", 0) for dev in devs)
    rcvd = sum(dev.get("counters", {}).get("rcvd_pkts", 0) for dev in devs)
    mtus = [qp["path_mtu"] for dev in devs for qp in dev.get("qps", []) if qp.get("qp_type") == "RC"]
    if not mtus:
        fail("uroce stat shows no RC QP on this process's device")
    need = -(-size // max(mtus))
    if sent < need or rcvd < need:
        fail(
            f"the bytes did not go over RDMA: the device sent {sent} and received {rcvd} "
            f"packets, {size} bytes need {need} each way (TCP fallback?)"
        )
    mib = size / (1 << 20)
    print(
        f"mooncake_check: ok: RDMA WRITE {mib:.0f} MiB {mib / (t1 - t0):.0f} MiB/s, "
        f"READ {mib:.0f} MiB {mib / (t2 - t1):.0f} MiB/s, verified; uroce0 sent {sent} "
        f"and received {rcvd} packets",
        flush=True,
    )


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "server":
        server(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) >= 6 and sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    # Mooncake's threads can keep the interpreter from exiting: the
    # result is printed, so leave now.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
