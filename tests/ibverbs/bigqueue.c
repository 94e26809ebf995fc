/* A QP or SRQ whose queues cannot be allocated is refused with ENOMEM, as
 * the kernel refuses one whose queue memory it cannot get; the process
 * lives on (uroce aborted on the failed allocation).
 *
 * Caps the address space (RLIMIT_AS) at what the process uses plus 64 MiB,
 * then creates QPs, and then SRQs, with the deepest queues the device
 * offers until one fails: it must fail with ENOMEM before the device's
 * max_qp (max_srq), i.e. for want of memory, not of handles. After the
 * objects are destroyed, creating one succeeds again.
 *
 * Uses the first device of UROCE_DEVICES. Prints each check, then
 * "bigqueue: N checks, N failed"; exits 1 on a failure. */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"

#define MAX_OBJS 4096

static long vm_size(void) {
	FILE *f = fopen("/proc/self/statm", "r");
	long pages = 0;
	if (f) {
		if (fscanf(f, "%ld", &pages) != 1)
			pages = 0;
		fclose(f);
	}
	return pages * sysconf(_SC_PAGESIZE);
}

int main(void) {
	setvbuf(stdout, NULL, _IONBF, 0);
	struct ibv_device **l = ibv_get_device_list(NULL);
	MUST(l && l[0]);
	struct ibv_context *ctx = ibv_open_device(l[0]);
	MUST(ctx);
	struct ibv_device_attr da;
	MUST(ibv_query_device(ctx, &da) == 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	MUST(pd);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	MUST(cq);
	static struct ibv_qp *qps[MAX_OBJS];
	static struct ibv_srq *srqs[MAX_OBJS];

	struct rlimit rl = { .rlim_cur = vm_size() + (64l << 20),
			     .rlim_max = RLIM_INFINITY };
	MUST(setrlimit(RLIMIT_AS, &rl) == 0);

	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = da.max_qp_wr,
			 .max_recv_wr = da.max_qp_wr,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	int n = 0;
	errno = 0;
	while (n < MAX_OBJS && (qps[n] = ibv_create_qp(pd, &qa)))
		n++;
	int e = errno;
	CHECK(n < MAX_OBJS && n < da.max_qp && e == ENOMEM,
	      "QPs of %d-deep queues under a 64 MiB cap: NULL/ENOMEM after "
	      "%d (max_qp %d; errno %s)",
	      da.max_qp_wr, n, da.max_qp, strerror(e));
	while (n > 0)
		ibv_destroy_qp(qps[--n]);
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	CHECK(qp != NULL, "with the QPs destroyed, one is created again");
	if (qp)
		ibv_destroy_qp(qp);

	struct ibv_srq_init_attr sa = {
		.attr = { .max_wr = da.max_srq_wr, .max_sge = 1 } };
	n = 0;
	errno = 0;
	while (n < MAX_OBJS && (srqs[n] = ibv_create_srq(pd, &sa)))
		n++;
	e = errno;
	CHECK(n < MAX_OBJS && n < da.max_srq && e == ENOMEM,
	      "SRQs of %d WRs under the cap: NULL/ENOMEM after %d (max_srq "
	      "%d; errno %s)",
	      da.max_srq_wr, n, da.max_srq, strerror(e));
	while (n > 0)
		ibv_destroy_srq(srqs[--n]);

	printf("bigqueue: %d checks, %d failed\n", passed + failed, failed);
	return failed ? 1 : 0;
}
