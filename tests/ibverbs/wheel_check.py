"""What tests/ibverbs/mooncake_check.py and nixl_check.py share: two
processes meeting through files in a directory, page-aligned buffers with
known bytes, and the proof from uroce's own counters that a transfer
crossed a uroce device (both libraries quietly use another transport
when they find none)."""

import ctypes
import json
import mmap
import os
import pickle
import random
import subprocess
import sys
import time


class Check:
    """Reports as NAME (`NAME: ok: ...`, `NAME: what failed`)."""

    def __init__(self, name, fallback):
        self.name = name
        # What it means when this process never opened a uroce device.
        self.fallback = fallback

    def ok(self, msg):
        print(f"{self.name}: ok: {msg}", flush=True)

    def fail(self, msg):
        print(f"{self.name}: {msg}", flush=True)
        # The libraries' threads can keep the interpreter from exiting.
        os._exit(1)

    def wait_for(self, path, secs=60):
        end = time.monotonic() + secs
        while not os.path.exists(path):
            if time.monotonic() > end:
                self.fail(f"{path} did not appear in {secs} s")
            time.sleep(0.05)

    def publish(self, d, name, obj):
        """Writes OBJ as DIR/NAME, whole or not at all."""
        tmp = os.path.join(d, name + ".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(obj, f)
        os.rename(tmp, os.path.join(d, name))

    def fetch(self, d, name):
        """What the other process published as DIR/NAME (waits for it)."""
        self.wait_for(os.path.join(d, name))
        with open(os.path.join(d, name), "rb") as f:
            return pickle.load(f)

    def over_uroce(self, uroce, size):
        """(sent, received) packets of this process's uroce devices, from
        `uroce stat --json PID` (UROCE: the uroce command); fails unless
        each is at least what SIZE bytes take at its RC QPs' path MTU."""
        out = subprocess.run(
            [uroce, "stat", "--json", str(os.getpid())],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if out.returncode != 0:
            # No state socket: the process never opened a uroce device.
            self.fail(f"uroce stat: {out.stderr.strip()} ({self.fallback})")
        devs = [dev for p in json.loads(out.stdout) for dev in p["devices"]]
        sent = sum(dev["counters"].get("sent_pkts", 0) for dev in devs)
        rcvd = sum(dev["counters"].get("rcvd_pkts", 0) for dev in devs)
        mtu = max(
            (qp["path_mtu"] for dev in devs for qp in dev["qps"] if qp["qp_type"] == "RC"),
            default=0,
        )
        need = -(-size // mtu) if mtu else 1
        if not mtu or sent < need or rcvd < need:
            self.fail(
                f"the bytes did not go over uroce: its device sent {sent} and received {rcvd} "
                f"packets (RC path MTU {mtu}), {size} bytes need {need} each way "
                f"({self.fallback})"
            )
        return sent, rcvd


    def moved(self, size, write_s, read_s, sent, rcvd):
        """The client's result line: SIZE bytes written in WRITE_S
        seconds and read in READ_S, verified, and the packets."""
        mib = size / (1 << 20)
        self.ok(
            f"RDMA WRITE {mib:.0f} MiB {mib / write_s:.0f} MiB/s, READ {mib:.0f} MiB "
            f"{mib / read_s:.0f} MiB/s, verified; uroce0 sent {sent} and received {rcvd} packets"
        )


def pattern(seed, size):
    """SIZE known bytes."""
    return random.Random(seed).randbytes(size)


def buffer(size):
    """Page-aligned anonymous memory and its address."""
    m = mmap.mmap(-1, size)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def usage(doc):
    print(doc, file=sys.stderr)
    sys.exit(2)
