/*
 * UROCE_CHECK's `post` category: a SEND whose SGE's lkey is a region of
 * another protection domain than the QP's (IBA 10.6.3's L_Key check fails
 * when the WR executes: local protection error). With UROCE_CHECK=1
 * exactly one report names this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	struct ibv_pd *other;
	struct ibv_mr *mr;
	char *buf;
	MUST(other = ibv_alloc_pd(a.ctx));
	MUST(posix_memalign((void **)&buf, 4096, 4096) == 0);
	MUST(mr = ibv_reg_mr(other, buf, 4096, IBV_ACCESS_LOCAL_WRITE));
	MUST(post_recv(&b, 1, 0, 64) == 0);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64,
			       .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	MUST(ibv_post_send(a.qp, &wr, &bad) == 0); /* the mistake */
	struct ibv_wc wc = wait1(a.cq);
	CHECK(wc.wr_id == 7 && wc.status == IBV_WC_LOC_PROT_ERR,
	      "the SEND completes with a local protection error (%d)",
	      wc.status);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(other);
	free(buf);
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
