"""Mooncake Transfer Engine's Python API between two processes, on uroce.

    python3 mooncake_check.py server ADDR DIR SIZE UROCE
    python3 mooncake_check.py client ADDR DIR SIZE UROCE

Run by tests/ibverbs/apps.sh, each process under `uroce exec` with a
device of its own at ADDR, as a user runs the wheel
(`mooncake-transfer-engine-non-cuda`): protocol "rdma", no device named
(Mooncake discovers the RDMA devices from sysfs), the peer found by
Mooncake's own handshake (metadata "P2PHANDSHAKE"), no topology file.

The server registers 2*SIZE bytes: the first half for the client to
write, the second filled with a pattern for it to read. It publishes its
segment name and buffer address in DIR and waits. The client RDMA WRITEs
SIZE bytes of its own pattern into the first half and READs the second
half back, checks what it read, and tells the server, which checks its
first half. Mooncake falls back to TCP without a word when it finds no
usable RDMA device, and still moves the bytes: so the client also needs
uroce's counters (`uroce stat`; UROCE: the uroce command) to show its
device sent and received at least the packets SIZE bytes take.

Prints one line starting "mooncake_check: ok" on success; exits non-zero
otherwise.
"""

import os
import sys
import time

from mooncake.engine import TransferEngine
from wheel_check import Check, buffer, pattern, usage

check = Check("mooncake_check", "Mooncake fell back to TCP?")


def engine(addr):
    te = TransferEngine()
    rc = te.initialize(addr, "P2PHANDSHAKE", "rdma", "")
    if rc != 0:
        check.fail(f"initialize({addr!r}, P2PHANDSHAKE, rdma) returned {rc}")
    return te


def server(addr, d, size):
    te = engine(addr)
    m, base = buffer(2 * size)
    m[size:] = pattern(2, size)
    if te.register_memory(base, 2 * size) != 0:
        check.fail("register_memory failed")
    check.publish(d, "server", {"segment": f"{addr}:{te.get_rpc_port()}", "addr": base})
    check.wait_for(os.path.join(d, "written"))
    if m[:size] != pattern(1, size):
        check.fail("server: the client's WRITE differs")
    check.ok(f"server holds the {size} bytes the client wrote")


def client(addr, d, size, uroce):
    te = engine(addr)
    peer = check.fetch(d, "server")
    m, base = buffer(2 * size)
    m[:size] = pattern(1, size)
    if te.register_memory(base, 2 * size) != 0:
        check.fail("register_memory failed")
    t0 = time.monotonic()
    rc = te.transfer_sync_write(peer["segment"], base, peer["addr"], size)
    t1 = time.monotonic()
    if rc != 0:
        check.fail(f"transfer_sync_write returned {rc}")
    rc = te.transfer_sync_read(peer["segment"], base + size, peer["addr"] + size, size)
    t2 = time.monotonic()
    if rc != 0:
        check.fail(f"transfer_sync_read returned {rc}")
    if m[size:] != pattern(2, size):
        check.fail("client: the READ's bytes differ from the server's")
    open(os.path.join(d, "written"), "w").close()
    sent, rcvd = check.over_uroce(uroce, size)
    check.moved(size, t1 - t0, t2 - t1, sent, rcvd)


def main():
    if len(sys.argv) < 6 or sys.argv[1] not in ("server", "client"):
        usage(__doc__)
    role, addr, d, size, uroce = sys.argv[1:6]
    if role == "server":
        server(addr, d, int(size))
    else:
        client(addr, d, int(size), uroce)
    # Mooncake's threads can keep the interpreter from exiting: the
    # result is printed, so leave now.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
