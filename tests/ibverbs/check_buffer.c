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

	/* Clean: the buffer changes after the completion. */
	MUST(post_recv(&b, 2, 0, 1024) == 0);
	MUST(post(&a, IBV_WR_SEND, 8, 0, 1024, IBV_SEND_SIGNALED, 0, 0) == 0);
	wc = wait1(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 8,
	      "the second SEND completes");
	a.buf[100] = 'z';
	wc = wait1(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "its receive completes");
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
