/*
 * UROCE_CHECK's `queue` category: a send queue of 8 WRs overrun by
 * unsignaled RDMA WRITEs whose slots no polled completion frees. uroce
 * (like rxe) frees an unsignaled WR's slot once it executes, so every post
 * succeeds; a NIC such as mlx5 frees it only when the completion of a
 * later signaled WR is polled, and refuses the 9th post with ENOMEM.
 * With UROCE_CHECK=1 exactly one report names this file's line; a
 * signaled WRITE every 4 posts afterwards is the clean case.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	int ok = 1;
	for (int i = 0; i < 12; i++) {
		/* the mistake: none signaled, nothing polled */
		ok &= post(&a, IBV_WR_RDMA_WRITE, i, 0, 64, 0,
			   (uintptr_t)b.buf, b.mr->rkey) == 0;
		usleep(2000);
	}
	CHECK(ok, "12 unsignaled WRITEs posted on a queue of 8");
	MUST(post(&a, IBV_WR_RDMA_WRITE, 100, 0, 64, IBV_SEND_SIGNALED,
		  (uintptr_t)b.buf, b.mr->rkey) == 0);
	struct ibv_wc wc = wait1(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 100,
	      "a signaled WRITE completes");
	/* Clean: one signaled WR every 4, its completion polled. */
	for (int i = 0; i < 24; i++) {
		int last = i % 4 == 3;
		MUST(post(&a, IBV_WR_RDMA_WRITE, 200 + i, 0, 64,
			  last ? IBV_SEND_SIGNALED : 0, (uintptr_t)b.buf,
			  b.mr->rkey) == 0);
		if (last)
			ok &= wait1(a.cq).status == IBV_WC_SUCCESS;
	}
	CHECK(ok, "24 WRITEs, one in 4 signaled");
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
