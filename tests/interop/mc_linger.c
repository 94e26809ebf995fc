/* LD_PRELOAD shim for the guest's mckey sender in run.sh's multicast
 * scenarios.
 *
 * mckey's sender posts its sends unsignaled, then at once leaves the group
 * (rdma_leave_multicast), destroys its address handle and its QP: it
 * never learns whether a datagram left. A NIC has sent them all within
 * microseconds; kernel rxe sends from a work queue, which in a TCG guest
 * often runs only after the address handle is gone, and then finds no
 * address vector and sends nothing (seen: "data transfers complete" in
 * the guest, no datagram on the tap).
 *
 * The shim holds rdma_leave_multicast for a second, as long as the
 * datagrams take to leave a slow guest; the program is not modified
 * otherwise. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>

struct rdma_cm_id;
struct sockaddr;

int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr) {
  int (*real)(struct rdma_cm_id *, struct sockaddr *) =
      (int (*)(struct rdma_cm_id *, struct sockaddr *))dlsym(RTLD_NEXT, "rdma_leave_multicast");
  sleep(1);
  return real(id, addr);
}
