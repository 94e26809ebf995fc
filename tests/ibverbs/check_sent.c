/*
 * UROCE_CHECK's `buffer` category at transmission: a SEND's source buffer
 * changed after ibv_post_send and before the engine copies its first
 * packet for the wire (ibv_post_send(3): the buffers of a WR may be reused
 * only after its completion is retrieved). The QP is drained (SQD) when
 * the SEND is posted, so nothing goes out until it is back in RTS: the
 * report comes then, saying "before it was sent" (the peer got the new
 * bytes). A second SEND whose buffer changes after its completion is the
 * clean case. With UROCE_CHECK=1 exactly one report names this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	struct ibv_qp_attr d = { .qp_state = IBV_QPS_SQD };
	MUST(ibv_modify_qp(a.qp, &d, IBV_QP_STATE) == 0);
	memset(a.buf, 'x', 1024);
	MUST(post_recv(&b, 1, 4096, 1024) == 0);
	MUST(post(&a, IBV_WR_SEND, 7, 0, 1024, IBV_SEND_SIGNALED, 0, 0) == 0);
	usleep(20000);
	a.buf[100] = 'y'; /* the mistake: before the SEND went out */
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS };
	MUST(ibv_modify_qp(a.qp, &r, IBV_QP_STATE) == 0);
	struct ibv_wc wc = wait1(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 7,
	      "the first SEND completes (status %d)", wc.status);
	wc = wait1(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "its receive completes");
	CHECK(b.buf[4096 + 100] == 'y',
	      "the peer received the bytes as they were when it was sent");

	return clean_send_and_finish(&a, &b, 4096);
}
