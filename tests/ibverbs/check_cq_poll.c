/*
 * UROCE_CHECK's `event` category: a completion event taken and the CQ
 * never polled afterwards, then destroyed with the completions in it
 * (ibv_get_cq_event(3)'s example: wait for the event and ack it, re-arm,
 * then empty the CQ; a program that waits for another event instead
 * hangs, since completions already in the CQ make none). With
 * UROCE_CHECK=1 exactly one report names this file's line.
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
	ibv_ack_cq_events(cq, 1);
	MUST(ibv_req_notify_cq(b.cq, 0) == 0); /* re-arming first is right */
	CHECK(wait1(a.cq).status == IBV_WC_SUCCESS, "the SEND completes");
	MUST(ibv_destroy_qp(b.qp) == 0);
	b.qp = NULL;
	/* The mistake: the receive's completion was never polled. */
	CHECK(ibv_destroy_cq(b.cq) == 0, "ibv_destroy_cq");
	b.cq = NULL;
	close_side(&a);
	if (b.mr)
		ibv_dereg_mr(b.mr);
	ibv_destroy_comp_channel(b.ch);
	ibv_dealloc_pd(b.pd);
	ibv_close_device(b.ctx);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
