/* LD_PRELOAD shim for perftest's -R clients in rdmacm.sh.
 *
 * perftest -R connects twice: a control connection, a handshake over it,
 * then the data connection to a second rdma_listen the server makes only
 * after the handshake. The client's data REQ can reach the server before
 * that listen; the server's CM answers REJ reason 8 (no listener), as the
 * kernel's does, and Debian's perftest 4.5-0.17 then crashes in its retry
 * (it reuses the destroyed ids; fixed upstream in perftest 3d9d8d0,
 * December 2025). Seen on a loaded 2-core CI machine, twice in a row.
 *
 * The shim holds the client's second and later rdma_resolve_addr calls
 * (the data connection) for 300 ms, as a server on another host would
 * be ahead by a network round trip or two. The program is not modified
 * otherwise; every CM call still goes to uroce's librdmacm. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>

struct rdma_cm_id;
struct sockaddr;

int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src,
                      struct sockaddr *dst, int timeout_ms) {
  static int calls;
  int (*real)(struct rdma_cm_id *, struct sockaddr *, struct sockaddr *, int) =
      (int (*)(struct rdma_cm_id *, struct sockaddr *, struct sockaddr *, int))
          dlsym(RTLD_NEXT, "rdma_resolve_addr");
  if (__atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST) > 1)
    usleep(300000);
  return real(id, src, dst, timeout_ms);
}
