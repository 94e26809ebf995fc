/*
 * UROCE_CHECK's `post` category: IBV_SEND_INLINE with more data than the
 * QP's max_inline_data (64 here): ibv_post_send fails with EINVAL, and the
 * checker says why, and where. With UROCE_CHECK=1 exactly one report
 * names this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	/* the mistake: 200 bytes inline */
	int r = post(&a, IBV_WR_SEND, 7, 0, 200,
		     IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0, 0);
	CHECK(r == EINVAL, "200 bytes inline on a QP of 64: %d", r);
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
