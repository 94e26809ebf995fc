/*
 * UD multicast through the C API on uroce's libibverbs.so.1 (issue #24,
 * "what rxe has that uroce lacks"), checked as kernel rxe answers:
 *
 *  - ibv_query_device gives rxe's limits (8192 groups, 56 QPs each,
 *    458752 attachments);
 *  - ibv_attach_mcast: EINVAL for an RC QP and a GID that is not
 *    multicast, 0 for a second attach of the same group; ibv_detach_mcast:
 *    EINVAL for a group not attached;
 *  - a UD send through an AH to the group's GID (::ffff:239.106.3.1) and
 *    QP 0xFFFFFF reaches the attached QPs of both devices, the sender's
 *    own device included, each with the GRH area naming the group; after
 *    ibv_detach_mcast the detached QP receives nothing.
 *
 * Two devices in one process: UROCE_DEVICES names them (the matrix sets
 * 127.106.3.1 and 127.106.3.2). Prints one line per check and
 * "N passed, N failed".
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define QKEY 0x01234567u
#define BUF 4096

struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
};

static void open_dev(struct ibv_device *d, struct dev *o)
{
	o->ctx = ibv_open_device(d);
	if (!o->ctx) {
		perror("ibv_open_device");
		exit(2);
	}
	o->pd = ibv_alloc_pd(o->ctx);
	o->cq = ibv_create_cq(o->ctx, 64, NULL, NULL, 0);
	o->buf = calloc(1, BUF);
	o->mr = ibv_reg_mr(o->pd, o->buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	if (!o->pd || !o->cq || !o->buf || !o->mr) {
		perror("set-up");
		exit(2);
	}
}

static struct ibv_qp *make_qp(struct dev *d, enum ibv_qp_type t)
{
	struct ibv_qp_init_attr a = {
		.send_cq = d->cq,
		.recv_cq = d->cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = t,
	};
	struct ibv_qp *qp = ibv_create_qp(d->pd, &a);
	if (!qp) {
		perror("ibv_create_qp");
		exit(2);
	}
	return qp;
}

static void ud_up(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = QKEY };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					  IBV_QP_PORT | IBV_QP_QKEY))
		exit(2);
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		exit(2);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		exit(2);
}

static void post_recv(struct dev *d, struct ibv_qp *qp, int slot)
{
	struct ibv_sge s = { (uintptr_t)d->buf + 512 * slot, 512, d->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = 100 + slot, .sg_list = &s,
				 .num_sge = 1 },
			   *bad;
	if (ibv_post_recv(qp, &w, &bad))
		exit(2);
}

/* Completions in `cq` within `ms`: up to `max` into `wc`. */
static int poll_for(struct ibv_cq *cq, struct ibv_wc *wc, int max, int ms)
{
	int got = 0;
	for (int i = 0; i < ms && got < max; i++) {
		int n = ibv_poll_cq(cq, max - got, wc + got);
		if (n > 0)
			got += n;
		else
			usleep(1000);
	}
	return got;
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 2) {
		fprintf(stderr, "two devices needed (UROCE_DEVICES)\n");
		return 2;
	}
	struct dev a, b;
	open_dev(list[0], &a);
	open_dev(list[1], &b);

	struct ibv_device_attr da;
	CHECK(!ibv_query_device(a.ctx, &da) && da.max_mcast_grp == 8192 &&
		      da.max_mcast_qp_attach == 56 &&
		      da.max_total_mcast_qp_attach == 8192 * 56,
	      "ibv_query_device: max_mcast_grp %d, max_mcast_qp_attach %d, "
	      "max_total_mcast_qp_attach %d",
	      da.max_mcast_grp, da.max_mcast_qp_attach,
	      da.max_total_mcast_qp_attach);

	union ibv_gid g = { .raw = { [10] = 0xff, [11] = 0xff, [12] = 239,
				     [13] = 106, [14] = 3, [15] = 1 } };
	union ibv_gid unicast = g;
	unicast.raw[12] = 127;
	struct ibv_qp *rc = make_qp(&a, IBV_QPT_RC);
	struct ibv_qp *sender = make_qp(&a, IBV_QPT_UD);
	struct ibv_qp *a2 = make_qp(&a, IBV_QPT_UD);
	struct ibv_qp *b1 = make_qp(&b, IBV_QPT_UD);
	ud_up(sender);
	ud_up(a2);
	ud_up(b1);

	int r = ibv_attach_mcast(rc, &g, 0);
	CHECK(r == EINVAL, "ibv_attach_mcast on an RC QP: EINVAL (got %d)", r);
	r = ibv_attach_mcast(b1, &unicast, 0);
	CHECK(r == EINVAL, "ibv_attach_mcast of a unicast GID: EINVAL (got %d)",
	      r);
	r = ibv_detach_mcast(b1, &g, 0);
	CHECK(r == EINVAL,
	      "ibv_detach_mcast of a group not attached: EINVAL (got %d)", r);
	r = ibv_attach_mcast(b1, &g, 0);
	CHECK(r == 0, "ibv_attach_mcast (got %d)", r);
	r = ibv_attach_mcast(b1, &g, 0);
	CHECK(r == 0, "ibv_attach_mcast again: 0 (got %d)", r);
	r = ibv_attach_mcast(a2, &g, 0);
	CHECK(r == 0, "ibv_attach_mcast on the sender's device (got %d)", r);

	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = g, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
	CHECK(ah != NULL, "ibv_create_ah to a multicast GID");
	if (!ah)
		goto out;
	post_recv(&a, a2, 1);
	post_recv(&b, b1, 2);
	strcpy(a.buf, "multicast");
	struct ibv_sge s = { (uintptr_t)a.buf, 9, a.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.ud = { .ah = ah, .remote_qpn = 0xffffff,
					    .remote_qkey = QKEY } },
			   *bad;
	CHECK(!ibv_post_send(sender, &w, &bad), "ibv_post_send to the group");
	struct ibv_wc wc[4];
	int got = poll_for(a.cq, wc, 2, 5000);
	int sent = 0, a2_got = 0;
	for (int i = 0; i < got; i++) {
		sent |= wc[i].wr_id == 1 && wc[i].status == IBV_WC_SUCCESS;
		a2_got |= wc[i].wr_id == 101 && wc[i].status == IBV_WC_SUCCESS &&
			  wc[i].qp_num == a2->qp_num &&
			  wc[i].src_qp == sender->qp_num;
	}
	CHECK(sent && a2_got,
	      "the send completes, and the sender's device's member gets it");
	got = poll_for(b.cq, wc, 1, 5000);
	CHECK(got == 1 && wc[0].status == IBV_WC_SUCCESS &&
		      wc[0].qp_num == b1->qp_num && wc[0].byte_len == 40 + 9 &&
		      (wc[0].wc_flags & IBV_WC_GRH) &&
		      !memcmp(b.buf + 1024 + 40, "multicast", 9) &&
		      !memcmp(b.buf + 1024 + 36, &g.raw[12], 4),
	      "the other device's member gets it, its GRH area naming the "
	      "group");

	r = ibv_detach_mcast(b1, &g, 0);
	CHECK(r == 0, "ibv_detach_mcast (got %d)", r);
	post_recv(&b, b1, 3);
	post_recv(&a, a2, 1);
	w.wr_id = 2;
	ibv_post_send(sender, &w, &bad);
	got = poll_for(a.cq, wc, 2, 5000);
	CHECK(got == 2, "after the detach, the sender's member still gets it");
	got = poll_for(b.cq, wc, 1, 300);
	CHECK(got == 0, "and the detached QP does not");
	ibv_destroy_ah(ah);
out:
	/* Destroying an attached QP detaches it. */
	CHECK(!ibv_destroy_qp(a2), "ibv_destroy_qp of an attached QP");
	ibv_destroy_qp(b1);
	ibv_destroy_qp(sender);
	ibv_destroy_qp(rc);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
