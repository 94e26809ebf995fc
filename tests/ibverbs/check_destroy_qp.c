/*
 * UROCE_CHECK's `lifetime` category: ibv_destroy_qp with a send WR still
 * outstanding (a SEND retried on RNR NAKs: the peer posts no receive WR).
 * The WR never completes. With UROCE_CHECK=1 exactly one report names
 * this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	MUST(post(&a, IBV_WR_SEND, 7, 0, 512, IBV_SEND_SIGNALED, 0, 0) == 0);
	usleep(20000);
	CHECK(ibv_destroy_qp(a.qp) == 0, "ibv_destroy_qp succeeds"); /* mistake */
	a.qp = NULL;
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
