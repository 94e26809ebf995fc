/*
 * UROCE_CHECK's `lifetime` category: ibv_dereg_mr of a region a send WR
 * still outstanding uses (its completion not retrieved). The SEND finds
 * no receive WR (RNR NAK, retried) while the program deregisters its
 * buffer; what it then sends is whatever the NIC (here uroce, which
 * keeps a copy of the bytes of a message it retransmits) read. With UROCE_CHECK=1 exactly one
 * report names this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	MUST(post(&a, IBV_WR_SEND, 7, 0, 512, IBV_SEND_SIGNALED, 0, 0) == 0);
	usleep(20000);
	CHECK(ibv_dereg_mr(a.mr) == 0, "ibv_dereg_mr succeeds"); /* mistake */
	a.mr = NULL;
	MUST(post_recv(&b, 1, 0, 1024) == 0);
	struct ibv_wc wc = wait1(a.cq);
	CHECK(wc.wr_id == 7, "the SEND completes (status %d)", wc.status);
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
