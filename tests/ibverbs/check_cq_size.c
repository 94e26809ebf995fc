/*
 * UROCE_CHECK's `queue` category: a CQ of 4 entries receiving the
 * completions of a QP with 8 send and 8 receive WRs: when they complete
 * before the program polls, the CQ overruns (IBA 11.4.2.1: a CQ error,
 * and the QPs go to error). With UROCE_CHECK=1 exactly one report names
 * this file's line; a QP on a CQ of 16 entries is the clean case.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	open_side(&a, 0, 4, 8, IBV_QPT_RC); /* the mistake */
	open_side(&b, 1, 16, 8, IBV_QPT_RC);
	CHECK(a.qp && b.qp, "both QPs are made");
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
