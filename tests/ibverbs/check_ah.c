/*
 * UROCE_CHECK's `lifetime` category: a UD SEND naming an address handle
 * already destroyed (ibv_destroy_ah frees it). With the checker on, the
 * post is refused with EINVAL and one report names this file's line
 * (without it, the library reads the freed handle, as rdma-core's would).
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	open_side(&a, 0, 32, 8, IBV_QPT_UD);
	open_side(&b, 1, 32, 8, IBV_QPT_UD);
	struct ibv_qp_attr x = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = 0x11111111 };
	MUST(ibv_modify_qp(a.qp, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				 IBV_QP_PORT | IBV_QP_QKEY) == 0);
	x.qp_state = IBV_QPS_RTR;
	MUST(ibv_modify_qp(a.qp, &x, IBV_QP_STATE) == 0);
	x.qp_state = IBV_QPS_RTS;
	MUST(ibv_modify_qp(a.qp, &x, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = b.gid, .sgid_index = 1,
					   .hop_limit = 64 } };
	struct ibv_ah *ah;
	MUST(ah = ibv_create_ah(a.pd, &aa));
	MUST(ibv_destroy_ah(ah) == 0);
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 64,
			       .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah; /* the mistake: destroyed above */
	wr.wr.ud.remote_qpn = b.qp->qp_num;
	wr.wr.ud.remote_qkey = 0x11111111;
	int r = ibv_post_send(a.qp, &wr, &bad);
	CHECK(r == EINVAL, "the post with a destroyed AH is refused: %d", r);
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
