/*
 * UROCE_CHECK's `buffer` category: a SEND's source buffer changed between
 * ibv_post_send and the SEND's completion (ibv_post_send(3): the buffers
 * of a WR may be reused only after its completion is retrieved). The SEND
 * finds no receive WR at first (RNR NAK, retried), the program writes into
 * its buffer meanwhile, then the peer posts the receive WR. A second SEND
 * whose buffer is reused only after its completion is the clean case.
 * With UROCE_CHECK=1 exactly one report names this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	memset(a.buf, 'x', 1024);
	MUST(post(&a, IBV_WR_SEND, 7, 0, 1024, IBV_SEND_SIGNALED, 0, 0) == 0);
	usleep(20000);
	a.buf[100] = 'y'; /* the mistake: before the SEND's completion */
	MUST(post_recv(&b, 1, 0, 1024) == 0);
	struct ibv_wc wc = wait1(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 7,
	      "the first SEND completes (status %d)", wc.status);
	wc = wait1(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "its receive completes");

	return clean_send_and_finish(&a, &b, 0);
}
