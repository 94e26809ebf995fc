/*
 * UROCE_CHECK's `post` category: posting to a QP that went to ERR (an RDMA
 * WRITE with a wrong rkey: remote access error) before the program polled
 * any of its error completions: the new WR can only be flushed. With
 * UROCE_CHECK=1 exactly one report names this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	MUST(post(&a, IBV_WR_RDMA_WRITE, 7, 0, 64, IBV_SEND_SIGNALED,
		  (uintptr_t)b.buf, b.mr->rkey ^ 0x80) == 0);
	struct ibv_qp_attr at;
	struct ibv_qp_init_attr ia;
	for (int i = 0; i < 5000; i++) {
		MUST(ibv_query_qp(a.qp, &at, IBV_QP_STATE, &ia) == 0);
		if (at.qp_state == IBV_QPS_ERR)
			break;
		usleep(1000);
	}
	CHECK(at.qp_state == IBV_QPS_ERR, "the QP is in ERR");
	/* the mistake: the error completion is not looked at */
	MUST(post(&a, IBV_WR_SEND, 8, 0, 64, IBV_SEND_SIGNALED, 0, 0) == 0);
	struct ibv_wc wc = wait1(a.cq);
	CHECK(wc.wr_id == 7 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "the WRITE completes with a remote access error (%d)", wc.status);
	wc = wait1(a.cq);
	CHECK(wc.wr_id == 8 && wc.status == IBV_WC_WR_FLUSH_ERR,
	      "the SEND is flushed (%d)", wc.status);
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
