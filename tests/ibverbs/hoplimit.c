/*
 * The IP TTL of UD datagrams through the C API on uroce's libibverbs.so.1
 * (issue #24, multicast against kernel rxe), as the receiver's GRH area
 * shows it (the IPv4 header at offset 20, its TTL at byte 28):
 *
 *  - a datagram to a multicast group carries its address handle's
 *    grh.hop_limit, as rxe writes it into the header: 5, 1, and 0 (the
 *    kernel keeps a TTL 0 datagram on the host and loops it back to the
 *    host's members, the other device here);
 *  - a unicast datagram carries the route's TTL (net.ipv4.ip_default_ttl,
 *    64) whatever its address handle asks (hop limit 1 here), as the
 *    kernel replaces a unicast address vector's hop limit with the route's
 *    when it resolves it.
 *
 * Two devices in one process: UROCE_DEVICES names them (the matrix sets
 * 127.110.4.1 and 127.110.4.2; the group is 239.110.4.1). Prints one line
 * per check and "N passed, N failed".
 */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
	struct ibv_qp *qp;
};

static void open_dev(struct ibv_device *d, struct dev *o)
{
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = QKEY };

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
	qa.send_cq = o->cq;
	qa.recv_cq = o->cq;
	o->qp = ibv_create_qp(o->pd, &qa);
	if (!o->qp || ibv_modify_qp(o->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					       IBV_QP_PORT | IBV_QP_QKEY)) {
		perror("UD QP");
		exit(2);
	}
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(o->qp, &a, IBV_QP_STATE))
		exit(2);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	if (ibv_modify_qp(o->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
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

/* Sends 8 bytes from `a` to `dgid` (QP `qpn`) through an AH with hop limit
 * `hop`; returns the TTL in the GRH area of what `b` receives in receive
 * slot `slot`, or -1 if nothing arrives. */
static int ttl_of(struct dev *a, struct dev *b, union ibv_gid dgid,
		  uint32_t qpn, uint8_t hop, int slot)
{
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = dgid, .hop_limit = hop } };
	struct ibv_sge rs = { (uintptr_t)b->buf + 512 * slot, 512,
			      b->mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = slot, .sg_list = &rs, .num_sge = 1 },
			   *rbad;
	struct ibv_sge s = { (uintptr_t)a->buf, 8, a->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.ud = { .remote_qpn = qpn,
					    .remote_qkey = QKEY } },
			   *bad;
	struct ibv_wc wc;
	struct ibv_ah *ah = ibv_create_ah(a->pd, &aa);
	int ttl = -1;

	if (!ah || ibv_post_recv(b->qp, &rw, &rbad))
		return -1;
	w.wr.ud.ah = ah;
	if (!ibv_post_send(a->qp, &w, &bad) &&
	    poll_for(a->cq, &wc, 1, 5000) == 1 && wc.status == IBV_WC_SUCCESS &&
	    poll_for(b->cq, &wc, 1, 5000) == 1 && wc.status == IBV_WC_SUCCESS &&
	    (wc.wc_flags & IBV_WC_GRH) &&
	    (uint8_t)b->buf[512 * slot + 20] == 0x45)
		ttl = (uint8_t)b->buf[512 * slot + 28];
	ibv_destroy_ah(ah);
	return ttl;
}

/* The TTL of the host's routes. */
static int route_ttl(void)
{
	int t = 64;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_default_ttl", "r");
	if (f) {
		if (fscanf(f, "%d", &t) != 1)
			t = 64;
		fclose(f);
	}
	return t;
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

	union ibv_gid g = { .raw = { [10] = 0xff, [11] = 0xff, [12] = 239,
				     [13] = 110, [14] = 4, [15] = 1 } };
	union ibv_gid bgid;
	CHECK(!ibv_query_gid(b.ctx, 1, 1, &bgid) && bgid.raw[10] == 0xff,
	      "the second device's IPv4-mapped GID (index 1)");
	CHECK(!ibv_attach_mcast(b.qp, &g, 0), "ibv_attach_mcast");

	uint8_t hops[] = { 5, 1, 0 };
	for (int i = 0; i < 3; i++) {
		int t = ttl_of(&a, &b, g, 0xffffff, hops[i], i);
		CHECK(t == hops[i],
		      "a datagram to the group with hop limit %d arrives with "
		      "TTL %d (got %d)",
		      hops[i], hops[i], t);
	}
	int t = ttl_of(&a, &b, bgid, b.qp->qp_num, 1, 3);
	CHECK(t == route_ttl(),
	      "a unicast datagram with hop limit 1 arrives with the route's "
	      "TTL %d (got %d)",
	      route_ttl(), t);
	ibv_detach_mcast(b.qp, &g, 0);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
