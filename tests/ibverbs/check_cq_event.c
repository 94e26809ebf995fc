/*
 * UROCE_CHECK's `event` category: a second completion event of a CQ taken
 * while the program has not polled the CQ since the first (ibv_get_cq_event
 * (3)'s example: wait for the event and ack it, re-arm, then empty the CQ).
 * Here a second message happens to come and make a second event; had it
 * not, the program would wait forever with a completion in the CQ. The
 * same loop done right (poll until empty after each event) is the clean
 * case. With UROCE_CHECK=1 exactly one report names this file's line.
 */
#include "check_pair.h"

static void get_event(struct side *b)
{
	struct ibv_cq *cq;
	void *cq_ctx;
	MUST(ibv_get_cq_event(b->ch, &cq, &cq_ctx) == 0);
	ibv_ack_cq_events(cq, 1);
	MUST(ibv_req_notify_cq(b->cq, 0) == 0);
}

int main(void)
{
	struct side a = { 0 }, b = { .events = 1 };
	rc_pair(&a, &b, 32, 8);
	MUST(ibv_req_notify_cq(b.cq, 0) == 0);
	for (int i = 0; i < 4; i++)
		MUST(post_recv(&b, i + 1, 0, 64) == 0);
	MUST(post(&a, IBV_WR_SEND, 7, 0, 64, IBV_SEND_SIGNALED, 0, 0) == 0);
	get_event(&b); /* and then no poll */
	CHECK(wait1(a.cq).status == IBV_WC_SUCCESS, "the first SEND completes");
	MUST(post(&a, IBV_WR_SEND, 8, 0, 64, IBV_SEND_SIGNALED, 0, 0) == 0);
	get_event(&b); /* the mistake: the first event's completion unpolled */
	struct ibv_wc wc;
	int n = 0;
	while (ibv_poll_cq(b.cq, 1, &wc) == 1)
		n += wc.status == IBV_WC_SUCCESS;
	CHECK(n == 2, "both receives completed (%d)", n);
	CHECK(wait1(a.cq).status == IBV_WC_SUCCESS, "the second SEND completes");

	/* Clean: each event, then the CQ polled until empty. */
	for (int i = 0; i < 2; i++) {
		MUST(post(&a, IBV_WR_SEND, 9 + i, 0, 64, IBV_SEND_SIGNALED, 0,
			  0) == 0);
		get_event(&b);
		n = 0;
		while (ibv_poll_cq(b.cq, 1, &wc) == 1)
			n++;
		if (n == 0) {
			wc = wait1(b.cq);
			n = wc.status == IBV_WC_SUCCESS;
		}
		CHECK(n == 1, "receive %d completed", i + 3);
		CHECK(wait1(a.cq).status == IBV_WC_SUCCESS, "SEND %d completes",
		      i + 3);
	}
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
