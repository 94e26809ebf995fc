/*
 * UROCE_CHECK's `event` category: ibv_destroy_cq with a completion event
 * from ibv_get_cq_event not acknowledged (ibv_get_cq_event(3): destroying
 * the CQ waits for every event to be acknowledged: a kernel device's
 * ibv_destroy_cq blocks; uroce refuses with EBUSY). With UROCE_CHECK=1
 * exactly one report names this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { .events = 1 };
	rc_pair(&a, &b, 32, 8);
	MUST(ibv_req_notify_cq(b.cq, 0) == 0);
	MUST(post_recv(&b, 1, 0, 64) == 0);
	MUST(post(&a, IBV_WR_SEND, 7, 0, 64, IBV_SEND_SIGNALED, 0, 0) == 0);
	struct ibv_cq *cq;
	void *cq_ctx;
	MUST(ibv_get_cq_event(b.ch, &cq, &cq_ctx) == 0);
	struct ibv_wc wc = wait1(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "the receive completes");
	CHECK(wait1(a.cq).status == IBV_WC_SUCCESS, "the SEND completes");
	MUST(ibv_destroy_qp(b.qp) == 0);
	b.qp = NULL;
	int r = ibv_destroy_cq(b.cq); /* the mistake: the event not acked */
	CHECK(r == EBUSY, "ibv_destroy_cq with an event not acknowledged: %d",
	      r);
	ibv_ack_cq_events(b.cq, 1);
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
