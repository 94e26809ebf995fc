/*
 * UROCE_CHECK's `buffer` category for RDMA READ targets: the program
 * writes into the local buffer of a READ it posted before the READ's
 * response arrives (ibv_post_send(3): the buffers of a WR are the NIC's
 * until its completion is retrieved; the response overwrites what the
 * program wrote). The QP is drained (SQD) when the READ is posted, so its
 * request goes out only once it is back in RTS. A READ whose target
 * changes after its completion is the clean case. With UROCE_CHECK=1
 * exactly one report names this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	memset(b.buf, 'r', 1024);
	struct ibv_qp_attr d = { .qp_state = IBV_QPS_SQD };
	MUST(ibv_modify_qp(a.qp, &d, IBV_QP_STATE) == 0);
	MUST(post(&a, IBV_WR_RDMA_READ, 7, 0, 1024, IBV_SEND_SIGNALED,
		  (uintptr_t)b.buf, b.mr->rkey) == 0);
	a.buf[100] = 'w'; /* the mistake: the READ's target, still the NIC's */
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS };
	MUST(ibv_modify_qp(a.qp, &r, IBV_QP_STATE) == 0);
	struct ibv_wc wc = wait1(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 7,
	      "the READ completes (status %d)", wc.status);
	CHECK(a.buf[100] == 'r', "the response overwrote what the program wrote");

	/* Clean: the target changes after the completion. */
	MUST(post(&a, IBV_WR_RDMA_READ, 8, 2048, 1024, IBV_SEND_SIGNALED,
		  (uintptr_t)b.buf, b.mr->rkey) == 0);
	wc = wait1(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 8,
	      "the second READ completes");
	a.buf[2048] = 'z';
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
