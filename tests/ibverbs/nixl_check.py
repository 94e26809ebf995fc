"""NIXL's UCX backend between two processes, on uroce, from the unmodified
wheel (`nixl-cu12`, which bundles UCX and rdma-core's libibverbs).

    python3 nixl_check.py target DIR SIZE UROCE
    python3 nixl_check.py initiator DIR SIZE UROCE

Run by tests/ibverbs/apps.sh, each process under `uroce exec` with a
device of its own (its LD_AUDIT module makes the wheel's bundled
`libibverbs-<hash>.so` uroce's), host memory (DRAM), UCX held to its
verbs transports (UCX_TLS, UCX_NET_DEVICES: two processes on one host
would otherwise meet in shared memory).

The agents swap their metadata and descriptors through files in DIR. The
target registers 2*SIZE bytes: the first half for the initiator to
WRITE, the second holding a pattern for it to READ. The initiator
WRITEs SIZE bytes of its own pattern with a notification, READs the
second half and checks it, and tells the target, which checks its first
half. Each side then asks `uroce stat` (UROCE: the uroce command) for
its own device's counters: the initiator must have sent and received at
least the packets SIZE bytes take at its QPs' path MTU, so a run that
moved the bytes any other way cannot pass.

Prints one line starting "nixl_check: ok" on success.
"""

import ctypes
import json
import mmap
import os
import pickle
import random
import subprocess
import sys
import time

from nixl_cu12 import nixl_agent, nixl_agent_config


def fail(msg):
    print(f"nixl_check: {msg}", flush=True)
    os._exit(1)


def pattern(seed, size):
    return random.Random(seed).randbytes(size)


def wait_for(path, secs=60):
    end = time.monotonic() + secs
    while not os.path.exists(path):
        if time.monotonic() > end:
            fail(f"{path} did not appear in {secs} s")
        time.sleep(0.05)


def publish(d, name, obj):
    tmp = os.path.join(d, name + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(obj, f)
    os.rename(tmp, os.path.join(d, name))


def fetch(d, name):
    wait_for(os.path.join(d, name))
    with open(os.path.join(d, name), "rb") as f:
        return pickle.load(f)


def rdma_packets(uroce):
    """(sent, received, largest RC path MTU) of this process's devices."""
    out = subprocess.run(
        [uroce, "stat", "--json", str(os.getpid())], capture_output=True, text=True, timeout=20
    )
    if out.returncode != 0:
        # No state socket: the process never opened a uroce device.
        fail(f"uroce stat: {out.stderr.strip()} (UCX took another transport?)")
    devs = [dev for p in json.loads(out.stdout) for dev in p.get("devices", [])]
    sent = sum(dev["counters"].get("sent_pkts", 0) for dev in devs)
    rcvd = sum(dev["counters"].get("rcvd_pkts", 0) for dev in devs)
    mtus = [qp["path_mtu"] for dev in devs for qp in dev["qps"] if qp["qp_type"] == "RC"]
    return sent, rcvd, max(mtus, default=0)


def wait_xfer(agent, handle, what):
    state = agent.transfer(handle)
    end = time.monotonic() + 60
    while state == "PROC":
        if time.monotonic() > end:
            fail(f"{what}: not done after 60 s")
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        fail(f"{what}: transfer state {state}")


def main():
    if len(sys.argv) < 5 or sys.argv[1] not in ("target", "initiator"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    role, d, size, uroce = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    me, peer = (role, "initiator" if role == "target" else "target")
    agent = nixl_agent(me, nixl_agent_config(backends=["UCX"]))
    m = mmap.mmap(-1, 2 * size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    reg = agent.register_memory([(base, 2 * size, 0, "")], "DRAM")
    if role == "target":
        m[size:] = pattern(2, size)
        halves = [agent.get_xfer_descs([(base + i * size, size, 0)], "DRAM") for i in (0, 1)]
        publish(d, me, (agent.get_agent_metadata(), [agent.get_serialized_descs(h) for h in halves]))
        meta, _ = fetch(d, peer)
        agent.add_remote_agent(meta)
        end = time.monotonic() + 60
        while not agent.check_remote_xfer_done(peer, b"written"):
            if time.monotonic() > end:
                fail("target: no notification of the WRITE in 60 s")
            time.sleep(0.001)
        if m[:size] != pattern(1, size):
            fail("target: the initiator's WRITE differs")
        # Stay until the initiator has read.
        wait_for(os.path.join(d, "read"))
        print(f"nixl_check: ok: target holds the {size} bytes the initiator wrote", flush=True)
    else:
        m[:size] = pattern(1, size)
        publish(d, me, (agent.get_agent_metadata(), None))
        meta, sdescs = fetch(d, peer)
        remote = agent.add_remote_agent(meta)
        rdescs = [agent.deserialize_descs(h) for h in sdescs]
        # UCX's connection first, so that the figures are the transfers'.
        agent.make_connection(remote)
        t0 = time.monotonic()
        w = agent.initialize_xfer(
            "WRITE",
            agent.get_xfer_descs([(base, size, 0)], "DRAM"),
            rdescs[0],
            remote,
            b"written",
        )
        wait_xfer(agent, w, "WRITE")
        t1 = time.monotonic()
        r = agent.initialize_xfer(
            "READ",
            agent.get_xfer_descs([(base + size, size, 0)], "DRAM"),
            rdescs[1],
            remote,
        )
        wait_xfer(agent, r, "READ")
        t2 = time.monotonic()
        if m[size:] != pattern(2, size):
            fail("initiator: the READ's bytes differ from the target's")
        sent, rcvd, mtu = rdma_packets(uroce)
        need = -(-size // mtu) if mtu else 1
        if not mtu or sent < need or rcvd < need:
            fail(
                f"the bytes did not go over uroce: its device sent {sent} and received {rcvd} "
                f"packets (RC path MTU {mtu}), {size} bytes need {need} each way"
            )
        open(os.path.join(d, "read"), "w").close()
        mib = size / (1 << 20)
        print(
            f"nixl_check: ok: WRITE {mib:.0f} MiB {mib / (t1 - t0):.0f} MiB/s, READ {mib:.0f} "
            f"MiB {mib / (t2 - t1):.0f} MiB/s, verified; uroce0 sent {sent} and received "
            f"{rcvd} packets",
            flush=True,
        )
    agent.deregister_memory(reg)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
