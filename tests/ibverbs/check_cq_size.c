/*
 * UROCE_CHECK's `queue` category: a CQ of 4 entries owed more completions
 * than it holds: 8 receive WRs posted to a QP whose completions go to it.
 * Once the messages arrive before the program polls, the CQ overruns
 * (IBA 11.4.2.1: a CQ error, and its QPs go to error). With
 * UROCE_CHECK=1 exactly one report names this file's line; 8 receive WRs
 * on a CQ of 16 entries are the clean case.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	open_side(&a, 0, 4, 8, IBV_QPT_RC);
	open_side(&b, 1, 16, 8, IBV_QPT_RC);
	rc_up(&a, &b);
	rc_up(&b, &a);
	int ok = 1;
	for (int i = 0; i < 8; i++) {
		ok &= post_recv(&b, i, 64 * i, 64) == 0;
		ok &= post_recv(&a, i, 64 * i, 64) == 0; /* the mistake at 5 */
	}
	CHECK(ok, "8 receive WRs posted on each side");
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
