/*
 * UROCE_CHECK's `post` category for the buffer that receives a response:
 * a FETCH_ADD whose SGE's lkey names no region. As on rxe and NICs, the
 * request is sent anyway (IBA 10.6.3's L_Key check fails where the
 * response is placed): the remote word is added to, and the WR completes
 * with a local protection error. With UROCE_CHECK=1 exactly one report
 * names this file's line, and says that the request was sent.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	uint64_t five = 5;
	memcpy(b.buf, &five, 8);
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 8,
			       .lkey = a.mr->lkey ^ 0x5a5a };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.atomic.remote_addr = (uintptr_t)b.buf;
	wr.wr.atomic.rkey = b.mr->rkey;
	wr.wr.atomic.compare_add = 1;
	MUST(ibv_post_send(a.qp, &wr, &bad) == 0); /* the mistake */
	struct ibv_wc wc = wait1(a.cq);
	CHECK(wc.wr_id == 7 && wc.status == IBV_WC_LOC_PROT_ERR,
	      "the FETCH_ADD completes with a local protection error (%d)",
	      wc.status);
	uint64_t now;
	memcpy(&now, b.buf, 8);
	CHECK(now == 6, "the remote atomic executed (%llu)", (unsigned long long)now);
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
