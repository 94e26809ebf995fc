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

Prints one line starting "nixl_check: ok" on success; exits non-zero
otherwise.
"""

import os
import sys
import time

from nixl_cu12 import nixl_agent, nixl_agent_config
from wheel_check import Check, buffer, pattern, usage

check = Check("nixl_check", "UCX took another transport?")


def wait_xfer(agent, handle, what):
    state = agent.transfer(handle)
    end = time.monotonic() + 60
    while state == "PROC":
        if time.monotonic() > end:
            check.fail(f"{what}: not done after 60 s")
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        check.fail(f"{what}: transfer state {state}")


def target(agent, d, size, m, base):
    m[size:] = pattern(2, size)
    halves = [agent.get_xfer_descs([(base + i * size, size, 0)], "DRAM") for i in (0, 1)]
    check.publish(
        d, "target", (agent.get_agent_metadata(), [agent.get_serialized_descs(h) for h in halves])
    )
    meta, _ = check.fetch(d, "initiator")
    agent.add_remote_agent(meta)
    end = time.monotonic() + 60
    while not agent.check_remote_xfer_done("initiator", b"written"):
        if time.monotonic() > end:
            check.fail("target: no notification of the WRITE in 60 s")
        time.sleep(0.001)
    if m[:size] != pattern(1, size):
        check.fail("target: the initiator's WRITE differs")
    # Stay until the initiator has read.
    check.wait_for(os.path.join(d, "read"))
    check.ok(f"target holds the {size} bytes the initiator wrote")


def initiator(agent, d, size, m, base, uroce):
    m[:size] = pattern(1, size)
    check.publish(d, "initiator", (agent.get_agent_metadata(), None))
    meta, sdescs = check.fetch(d, "target")
    remote = agent.add_remote_agent(meta)
    rdescs = [agent.deserialize_descs(h) for h in sdescs]
    # UCX's connection first, so that the figures are the transfers'.
    agent.make_connection(remote)
    t0 = time.monotonic()
    local = agent.get_xfer_descs([(base, size, 0)], "DRAM")
    wait_xfer(agent, agent.initialize_xfer("WRITE", local, rdescs[0], remote, b"written"), "WRITE")
    t1 = time.monotonic()
    local = agent.get_xfer_descs([(base + size, size, 0)], "DRAM")
    wait_xfer(agent, agent.initialize_xfer("READ", local, rdescs[1], remote), "READ")
    t2 = time.monotonic()
    if m[size:] != pattern(2, size):
        check.fail("initiator: the READ's bytes differ from the target's")
    sent, rcvd = check.over_uroce(uroce, size)
    open(os.path.join(d, "read"), "w").close()
    check.moved(size, t1 - t0, t2 - t1, sent, rcvd)


def main():
    if len(sys.argv) < 5 or sys.argv[1] not in ("target", "initiator"):
        usage(__doc__)
    role, d, size, uroce = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    agent = nixl_agent(role, nixl_agent_config(backends=["UCX"]))
    m, base = buffer(2 * size)
    reg = agent.register_memory([(base, 2 * size, 0, "")], "DRAM")
    if role == "target":
        target(agent, d, size, m, base)
    else:
        initiator(agent, d, size, m, base, uroce)
    agent.deregister_memory(reg)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
