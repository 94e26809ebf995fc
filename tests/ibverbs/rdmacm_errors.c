/*
 * uroce's librdmacm through the C API as a program sees it (compiled
 * against Debian's <rdma/rdma_cma.h>, run with LD_LIBRARY_PATH=$(uroce
 * libdir)): error paths return -1 with librdmacm's errno (EINVAL for NULL
 * ids, channels and events and a multicast join on an id that is not a
 * bound UD one; ENOSYS for unknown options;
 * EAGAIN from a non-blocking channel), a connection to a port nobody
 * listens on is REJECTED with status 8 (invalid service ID), private data
 * beyond a REQ's 56 bytes is EINVAL, and connections in one process carry
 * their private data, fill the ids' routes, take an SRQ made on the id,
 * go through CONNECT_RESPONSE and rdma_establish for an id without a QP,
 * and disconnect.
 *
 * Two devices in one process: UROCE_DEVICES names them (the script sets
 * 127.41.2.1 and 127.41.2.2). Prints one line per check and
 * "N passed, N failed".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

/* -1 with errno e. */
#define ERR(rc, e) ((rc) == -1 && errno == (e))

static struct sockaddr_in addr_of(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	MUST(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
	return a;
}

/* The next event on a channel, which must be `type` (else NULL). */
static struct rdma_cm_event *expect(struct rdma_event_channel *ch, int type)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev)) {
		printf("      rdma_get_cm_event: errno %d\n", errno);
		return NULL;
	}
	if ((int)ev->event != type) {
		printf("      got %s (status %d), wanted %s\n",
		       rdma_event_str(ev->event), ev->status,
		       rdma_event_str(type));
		rdma_ack_cm_event(ev);
		return NULL;
	}
	return ev;
}

/* Resolves an id's address and route (from src to dst:port). */
static int resolve(struct rdma_event_channel *ch, struct rdma_cm_id *id,
		   const char *src, const char *dst, int port)
{
	struct sockaddr_in s = addr_of(src, 0), d = addr_of(dst, port);
	struct rdma_cm_event *ev;
	if (rdma_resolve_addr(id, (struct sockaddr *)&s, (struct sockaddr *)&d,
			      2000))
		return -1;
	if (!(ev = expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED)))
		return -1;
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 2000))
		return -1;
	if (!(ev = expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED)))
		return -1;
	rdma_ack_cm_event(ev);
	return 0;
}

static int create_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	/* NULL PD and CQs: the id's PD, CQs made for it. */
	return rdma_create_qp(id, NULL, &qa);
}

int main(void)
{
	const char *ips = getenv("UROCE_DEVICES");
	char a_ip[64], b_ip[64];
	/* "name=ip,name=ip" */
	MUST(ips && sscanf(ips, "%*[^=]=%63[^,],%*[^=]=%63s", a_ip, b_ip) == 2);

	struct rdma_event_channel *ch, *sch;
	struct rdma_cm_id *id, *lid;
	struct rdma_cm_event *ev;
	int rc;
	MUST(ch = rdma_create_event_channel());
	MUST(sch = rdma_create_event_channel());

	/* ---- NULL arguments and bad values */
	rc = rdma_create_id(ch, NULL, NULL, RDMA_PS_TCP);
	CHECK(ERR(rc, EINVAL), "create_id with a NULL id pointer: -1/EINVAL");
	rc = rdma_create_id(ch, &id, NULL, 0x1234);
	CHECK(ERR(rc, EINVAL), "create_id in an unknown port space: -1/EINVAL");
	CHECK(ERR(rdma_destroy_id(NULL), EINVAL), "destroy_id(NULL): -1/EINVAL");
	CHECK(ERR(rdma_get_cm_event(NULL, &ev), EINVAL),
	      "get_cm_event(NULL channel): -1/EINVAL");
	CHECK(ERR(rdma_get_cm_event(ch, NULL), EINVAL),
	      "get_cm_event(NULL event pointer): -1/EINVAL");
	CHECK(ERR(rdma_ack_cm_event(NULL), EINVAL), "ack_cm_event(NULL): -1/EINVAL");
	struct sockaddr_in any = addr_of("0.0.0.0", 0);
	CHECK(ERR(rdma_bind_addr(NULL, (struct sockaddr *)&any), EINVAL),
	      "bind_addr(NULL id): -1/EINVAL");
	CHECK(ERR(rdma_resolve_route(NULL, 2000), EINVAL),
	      "resolve_route(NULL id): -1/EINVAL");
	CHECK(ERR(rdma_connect(NULL, NULL), EINVAL), "connect(NULL id): -1/EINVAL");
	CHECK(ERR(rdma_accept(NULL, NULL), EINVAL), "accept(NULL id): -1/EINVAL");
	CHECK(ERR(rdma_disconnect(NULL), EINVAL), "disconnect(NULL id): -1/EINVAL");
	CHECK(ERR(rdma_create_qp(NULL, NULL, NULL), EINVAL),
	      "create_qp(NULL id): -1/EINVAL");
	rdma_destroy_qp(NULL);
	rdma_destroy_ep(NULL);
	rdma_destroy_event_channel(NULL);
	CHECK(1, "destroy_qp/destroy_ep/destroy_event_channel(NULL) return");
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED),
		     "RDMA_CM_EVENT_ESTABLISHED") == 0 &&
		      strcmp(rdma_event_str(99), "UNKNOWN EVENT") == 0,
	      "event_str");

	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(id->ps == RDMA_PS_TCP && id->qp_type == IBV_QPT_RC &&
		      id->channel == ch && !id->verbs,
	      "a new id: ps TCP, RC, its channel, no device yet");
	CHECK(ERR(rdma_bind_addr(id, NULL), EINVAL), "bind_addr(NULL address): -1/EINVAL");
	CHECK(ERR(rdma_resolve_addr(id, NULL, NULL, 2000), EINVAL),
	      "resolve_addr(NULL destination): -1/EINVAL");
	CHECK(ERR(rdma_create_qp(id, NULL, NULL), EINVAL),
	      "create_qp(NULL attributes): -1/EINVAL");
	CHECK(ERR(create_qp(id), EINVAL), "create_qp on an id without a device: -1/EINVAL");
	/* (Nothing is sent: binding only looks the address up.) */
	struct sockaddr_in other = addr_of("192.0.2.99", 0);
	CHECK(ERR(rdma_bind_addr(id, (struct sockaddr *)&other), EADDRNOTAVAIL),
	      "bind to an address no device has: -1/EADDRNOTAVAIL");
	{
		/* A loopback address binds no device, as on the kernel's CMA
		 * (cma_any_addr): success, no device yet. */
		struct rdma_cm_id *lid;
		MUST(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0);
		struct sockaddr_in lo = addr_of("127.99.99.99", 0);
		CHECK(rdma_bind_addr(lid, (struct sockaddr *)&lo) == 0 && !lid->verbs,
		      "bind to a loopback address no device has: 0, no device (as the wildcard)");
		rdma_destroy_id(lid);
	}
	uint8_t tos = 0;
	int one = 1;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0,
	      "set_option TOS");
	CHECK(ERR(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, 4), EINVAL),
	      "set_option TOS of 4 bytes: -1/EINVAL");
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, 4) == 0,
	      "set_option REUSEADDR");
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tos, 1) == 0,
	      "set_option ACK_TIMEOUT on RC");
	CHECK(ERR(rdma_set_option(id, RDMA_OPTION_ID, 77, &one, 4), ENOSYS),
	      "set_option of an unknown option: -1/ENOSYS");
	CHECK(ERR(rdma_set_option(id, 9, 0, &one, 4), ENOSYS),
	      "set_option at an unknown level: -1/ENOSYS");
	CHECK(ERR(rdma_set_option(NULL, RDMA_OPTION_ID, 0, &tos, 1), EINVAL),
	      "set_option(NULL id): -1/EINVAL");

	/* ---- multicast on an id not bound (and not UD): EINVAL, as the
	 * kernel's rdma_join_multicast; rsockets' argument checks; ECE as
	 * without it */
	struct sockaddr_in mc = addr_of("239.1.2.3", 0);
	CHECK(ERR(rdma_join_multicast(id, (struct sockaddr *)&mc, NULL), EINVAL),
	      "join_multicast on an unbound RC id: -1/EINVAL (errno %d)", errno);
	CHECK(ERR(rdma_join_multicast(id, NULL, NULL), EINVAL),
	      "join_multicast(NULL address): -1/EINVAL");
	struct rdma_cm_join_mc_attr_ex mx = {
		.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
		.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER,
		.addr = (struct sockaddr *)&mc,
	};
	CHECK(ERR(rdma_join_multicast_ex(id, &mx, NULL), EINVAL),
	      "join_multicast_ex on an unbound RC id: -1/EINVAL");
	mx.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
	CHECK(ERR(rdma_join_multicast_ex(id, &mx, NULL), ENOTSUP),
	      "join_multicast_ex with a reserved mask bit: -1/ENOTSUP");
	CHECK(ERR(rdma_leave_multicast(id, (struct sockaddr *)&mc), EADDRNOTAVAIL),
	      "leave_multicast of a group never joined: -1/EADDRNOTAVAIL");
	CHECK(ERR(rsocket(AF_UNIX, SOCK_STREAM, 0), ENOTSUP),
	      "rsocket of another family: -1/ENOTSUP, as rsocket.c");
	CHECK(ERR(rclose(3), EBADF) && ERR(rsend(3, "x", 1, 0), EBADF),
	      "rclose/rsend on a non-rsocket: -1/EBADF");
	struct ibv_ece ece = { 0 };
	CHECK(ERR(rdma_set_local_ece(id, &ece), EINVAL), "set_local_ece vendor 0: -1/EINVAL");
	ece.vendor_id = 0x1234;
	CHECK(rdma_set_local_ece(id, &ece) == 0, "set_local_ece");
	CHECK(rdma_get_remote_ece(id, &ece) == 0 && ece.vendor_id == 0,
	      "get_remote_ece: none");

	/* ---- a non-blocking channel; the descriptor in poll(2) */
	int fl = fcntl(ch->fd, F_GETFL);
	CHECK(fl != -1 && !(fl & O_NONBLOCK), "the channel's fd is blocking");
	MUST(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0);
	CHECK(ERR(rdma_get_cm_event(ch, &ev), EAGAIN),
	      "get_cm_event on an empty O_NONBLOCK channel: -1/EAGAIN");
	struct sockaddr_in src = addr_of(a_ip, 0), dst = addr_of(b_ip, 9);
	MUST(rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst,
			       2000) == 0);
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 2000) == 1 && (pfd.revents & POLLIN),
	      "the channel's fd polls readable with an event waiting");
	rc = rdma_get_cm_event(ch, &ev);
	CHECK(rc == 0 && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == id &&
		      ev->status == 0,
	      "ADDR_RESOLVED from the non-blocking channel");
	if (rc == 0)
		rdma_ack_cm_event(ev);
	MUST(fcntl(ch->fd, F_SETFL, fl) == 0);
	CHECK(id->verbs && id->port_num == 1 && id->pd &&
		      ((struct sockaddr_in *)rdma_get_local_addr(id))->sin_addr.s_addr ==
			      src.sin_addr.s_addr &&
		      ntohs(rdma_get_src_port(id)) != 0 &&
		      ntohs(rdma_get_dst_port(id)) == 9,
	      "resolved id: device context, port 1, PD, local address, ports");
	int ndev = 0;
	struct ibv_context **devs = rdma_get_devices(&ndev);
	CHECK(devs && ndev == 2 && (devs[0] == id->verbs || devs[1] == id->verbs) &&
		      !devs[2],
	      "get_devices: both devices, one of them the id's context");
	rdma_free_devices(devs);

	/* ---- a connection to a port nobody listens on */
	MUST(rdma_resolve_route(id, 2000) == 0);
	MUST(ev = expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	rdma_ack_cm_event(ev);
	CHECK(id->route.num_paths == 1 &&
		      memcmp(&id->route.path_rec->dgid, &id->route.addr.addr.ibaddr.dgid,
			     16) == 0 &&
		      id->route.path_rec->dgid.raw[10] == 0xff,
	      "route: one path, the peer's IPv4-mapped GID");
	rc = create_qp(id);
	CHECK(rc == 0 && id->qp && id->send_cq && id->recv_cq && id->send_cq_channel &&
		      id->qp->state == IBV_QPS_INIT,
	      "create_qp with NULL PD and CQs: QP in INIT, CQs made for the id");
	uint8_t big[64];
	memset(big, 0xab, sizeof big);
	struct rdma_conn_param cp = { .private_data = big, .private_data_len = 57,
				      .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7, .rnr_retry_count = 7 };
	CHECK(ERR(rdma_connect(id, &cp), EINVAL),
	      "connect with 57 bytes of private data: -1/EINVAL");
	cp.private_data_len = 8;
	MUST(rdma_connect(id, &cp) == 0);
	ev = expect(ch, RDMA_CM_EVENT_REJECTED);
	CHECK(ev && ev->status == 8 && ev->id == id,
	      "connect to a port nobody listens on: REJECTED, status 8 (%d)",
	      ev ? ev->status : -1);
	if (ev)
		rdma_ack_cm_event(ev);
	CHECK(id->qp->state == IBV_QPS_ERR, "the rejected connection's QP is in ERR");
	rdma_destroy_qp(id);
	CHECK(!id->qp && !id->send_cq, "destroy_qp: QP and the CQs made for it gone");
	CHECK(rdma_destroy_id(id) == 0, "destroy_id");

	/* ---- a synchronous id: the call waits and fails with the event */
	struct rdma_cm_id *sid;
	MUST(rdma_create_id(NULL, &sid, NULL, RDMA_PS_TCP) == 0);
	CHECK(sid->channel != NULL, "a synchronous id has a channel of its own");
	src = addr_of(a_ip, 0);
	dst = addr_of(b_ip, 9);
	rc = rdma_resolve_addr(sid, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000);
	CHECK(rc == 0 && sid->event && sid->event->event == RDMA_CM_EVENT_ADDR_RESOLVED,
	      "synchronous resolve_addr: returns with id->event ADDR_RESOLVED");
	MUST(rdma_resolve_route(sid, 2000) == 0);
	MUST(create_qp(sid) == 0);
	rc = rdma_connect(sid, NULL);
	CHECK(ERR(rc, ECONNREFUSED) && sid->event &&
		      sid->event->event == RDMA_CM_EVENT_REJECTED,
	      "synchronous connect to nobody: -1/ECONNREFUSED, id->event REJECTED");
	rdma_destroy_qp(sid);
	CHECK(rdma_destroy_id(sid) == 0, "destroy a synchronous id (its event acknowledged)");

	/* ---- a connection: listener on b, client on a */
	MUST(rdma_create_id(sch, &lid, (void *)0x5a, RDMA_PS_TCP) == 0);
	CHECK(rdma_listen(lid, 4) == 0 && ntohs(rdma_get_src_port(lid)) != 0,
	      "listen on an unbound id binds the wildcard address, a port");
	MUST(rdma_destroy_id(lid) == 0);
	MUST(rdma_create_id(sch, &lid, (void *)0x5a, RDMA_PS_TCP) == 0);
	struct sockaddr_in laddr = addr_of(b_ip, 7471);
	MUST(rdma_bind_addr(lid, (struct sockaddr *)&laddr) == 0);
	MUST(rdma_listen(lid, 4) == 0);
	struct rdma_cm_id *busy;
	MUST(rdma_create_id(sch, &busy, NULL, RDMA_PS_TCP) == 0);
	CHECK(ERR(rdma_bind_addr(busy, (struct sockaddr *)&laddr), EADDRINUSE),
	      "bind to a port in use: -1/EADDRINUSE");
	/* The kernel's CMA: the wildcard against a bound port (either way
	 * round) is EADDRNOTAVAIL. */
	struct sockaddr_in wild = { .sin_family = AF_INET, .sin_port = htons(7471) };
	CHECK(ERR(rdma_bind_addr(busy, (struct sockaddr *)&wild), EADDRNOTAVAIL),
	      "bind the wildcard to a port bound on an address: -1/EADDRNOTAVAIL");
	MUST(rdma_destroy_id(busy) == 0);

	MUST(rdma_create_id(ch, &id, (void *)0xc1, RDMA_PS_TCP) == 0);
	MUST(resolve(ch, id, a_ip, b_ip, 7471) == 0);
	MUST(create_qp(id) == 0);
	for (int i = 0; i < 56; i++)
		big[i] = (uint8_t)i;
	cp.private_data_len = 56;
	MUST(rdma_connect(id, &cp) == 0);
	ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *cid = ev ? ev->id : NULL;
	CHECK(ev && ev->listen_id == lid && cid && cid != lid &&
		      cid->context == (void *)0x5a && cid->channel == sch &&
		      cid->verbs && cid->ps == RDMA_PS_TCP &&
		      ev->param.conn.private_data_len >= 56 &&
		      memcmp(ev->param.conn.private_data, big, 56) == 0,
	      "CONNECT_REQUEST: a new id, the listener, the 56 bytes sent");
	CHECK(cid && ntohs(rdma_get_src_port(cid)) == 7471 &&
		      rdma_get_dst_port(cid) == rdma_get_src_port(id) &&
		      cid->route.num_paths == 1,
	      "the new id's route: our port, the peer's, one path");
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
	CHECK(cid && rdma_create_srq(cid, NULL, &sa) == 0 && cid->srq &&
		      cid->srq->pd == cid->pd,
	      "create_srq on the new id: on the id's PD");
	MUST(cid && create_qp(cid) == 0);
	CHECK(cid->qp->srq == cid->srq, "the id's QP takes the id's SRQ");
	uint8_t reply[200];
	memset(reply, 0x5c, sizeof reply);
	struct rdma_conn_param ap = { .private_data = reply, .private_data_len = 197,
				      .responder_resources = 1, .initiator_depth = 1,
				      .rnr_retry_count = 7 };
	CHECK(ERR(rdma_accept(cid, &ap), EINVAL),
	      "accept with 197 bytes of private data: -1/EINVAL");
	ap.private_data_len = 16;
	CHECK(rdma_accept(cid, &ap) == 0, "accept");
	rdma_ack_cm_event(ev);
	ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(ev && ev->id == id && ev->param.conn.private_data_len >= 16 &&
		      memcmp(ev->param.conn.private_data, reply, 16) == 0 &&
		      id->qp->state == IBV_QPS_RTS,
	      "client ESTABLISHED with the accept's private data, QP in RTS");
	if (ev)
		rdma_ack_cm_event(ev);
	ev = expect(sch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(ev && ev->id == cid, "server ESTABLISHED");
	if (ev)
		rdma_ack_cm_event(ev);
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTR };
	int mask = 0;
	CHECK(rdma_init_qp_attr(cid, &qa, &mask) == 0 && (mask & IBV_QP_AV) &&
		      (mask & IBV_QP_DEST_QPN) && qa.dest_qp_num == id->qp->qp_num &&
		      qa.ah_attr.is_global,
	      "init_qp_attr(RTR): address vector and the peer's QP number");
	CHECK(ERR(rdma_init_qp_attr(cid, NULL, &mask), EINVAL),
	      "init_qp_attr(NULL attributes): -1/EINVAL");

	/* data over the QPs the CM connected */
	struct ibv_mr *smr, *rmr;
	char sbuf[32] = "hello over rdma_cm", rbuf[32] = { 0 };
	MUST(smr = ibv_reg_mr(id->pd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE));
	MUST(rmr = ibv_reg_mr(cid->pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE));
	struct ibv_sge rs = { (uintptr_t)rbuf, sizeof rbuf, rmr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	MUST(ibv_post_srq_recv(cid->srq, &rw, &rbad) == 0);
	struct ibv_sge ss = { (uintptr_t)sbuf, sizeof sbuf, smr->lkey };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *sbad;
	MUST(ibv_post_send(id->qp, &sw, &sbad) == 0);
	struct ibv_wc wc;
	int n = 0;
	for (int i = 0; i < 2000 && n == 0; i++) {
		n = ibv_poll_cq(cid->recv_cq, 1, &wc);
		if (!n)
			usleep(1000);
	}
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && strcmp(rbuf, sbuf) == 0,
	      "SEND over the connected ids' QPs arrives (through the SRQ)");
	CHECK(ERR(rdma_notify(cid, IBV_EVENT_PORT_ACTIVE), EINVAL),
	      "notify of an event other than COMM_EST: -1/EINVAL");

	/* migrate the client id to the server's channel, then disconnect */
	CHECK(rdma_migrate_id(id, sch) == 0 && id->channel == sch, "migrate_id");
	CHECK(rdma_disconnect(id) == 0 && id->qp->state == IBV_QPS_ERR,
	      "disconnect: the QP goes to ERR");
	int got_c = 0, got_s = 0;
	for (int i = 0; i < 2; i++) {
		if (rdma_get_cm_event(sch, &ev))
			break;
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED)
			got_c += ev->id == id, got_s += ev->id == cid;
		rdma_ack_cm_event(ev);
	}
	CHECK(got_c == 1 && got_s == 1,
	      "DISCONNECTED on both ids, both on the channel migrated to");
	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	rdma_destroy_qp(id);
	rdma_destroy_qp(cid);
	rdma_destroy_srq(cid);
	CHECK(!cid->srq, "destroy_srq");
	CHECK(rdma_destroy_id(id) == 0 && rdma_destroy_id(cid) == 0,
	      "destroy the connected ids");

	/* ---- an id without a QP: CONNECT_RESPONSE, the program readies its
	 * QP from rdma_init_qp_attr, rdma_establish sends the RTU */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	MUST(resolve(ch, id, a_ip, b_ip, 7471) == 0);
	struct ibv_cq *ocq;
	struct ibv_qp *oqp;
	MUST(ocq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0));
	struct ibv_qp_init_attr oqa = {
		.send_cq = ocq, .recv_cq = ocq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	MUST(oqp = ibv_create_qp(id->pd, &oqa));
	CHECK(ERR(rdma_establish(id), EINVAL), "establish before a response: -1/EINVAL");
	struct rdma_conn_param op = { .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7, .rnr_retry_count = 7,
				      .qp_num = oqp->qp_num };
	MUST(rdma_connect(id, &op) == 0);
	MUST(ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST));
	cid = ev->id;
	CHECK(ev->param.conn.qp_num == oqp->qp_num,
	      "the request names the QP the connect parameters gave");
	MUST(create_qp(cid) == 0);
	MUST(rdma_accept(cid, &ap) == 0);
	rdma_ack_cm_event(ev);
	ev = expect(ch, RDMA_CM_EVENT_CONNECT_RESPONSE);
	CHECK(ev && ev->id == id && ev->param.conn.qp_num == cid->qp->qp_num,
	      "an id without a QP gets CONNECT_RESPONSE, the peer's QP number");
	if (ev)
		rdma_ack_cm_event(ev);
	int ok = 1;
	for (int st = IBV_QPS_INIT; st <= IBV_QPS_RTS && ok; st++) {
		struct ibv_qp_attr x = { .qp_state = st };
		ok = rdma_init_qp_attr(id, &x, &mask) == 0 &&
		     ibv_modify_qp(oqp, &x, mask) == 0;
	}
	CHECK(ok && oqp->state == IBV_QPS_RTS,
	      "init_qp_attr INIT, RTR, RTS: ibv_modify_qp takes each");
	CHECK(rdma_establish(id) == 0, "establish");
	ev = expect(sch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(ev && ev->id == cid, "server ESTABLISHED on the RTU");
	if (ev)
		rdma_ack_cm_event(ev);
	MUST(rmr = ibv_reg_mr(cid->pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE));
	MUST(smr = ibv_reg_mr(id->pd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE));
	rs.lkey = rmr->lkey;
	ss.lkey = smr->lkey;
	memset(rbuf, 0, sizeof rbuf);
	MUST(ibv_post_recv(cid->qp, &rw, &rbad) == 0);
	MUST(ibv_post_send(oqp, &sw, &sbad) == 0);
	n = 0;
	for (int i = 0; i < 2000 && n == 0; i++) {
		n = ibv_poll_cq(cid->recv_cq, 1, &wc);
		if (!n)
			usleep(1000);
	}
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && strcmp(rbuf, sbuf) == 0,
	      "SEND from the program's own QP arrives");
	MUST(rdma_disconnect(cid) == 0);
	MUST(ev = expect(sch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_ack_cm_event(ev);
	MUST(ev = expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_ack_cm_event(ev);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	rdma_destroy_qp(cid);
	CHECK(ibv_destroy_qp(oqp) == 0 && ibv_destroy_cq(ocq) == 0,
	      "the program's own QP and CQ are its to destroy");
	CHECK(rdma_destroy_id(id) == 0 && rdma_destroy_id(cid) == 0 &&
		      rdma_destroy_id(lid) == 0,
	      "destroy the ids");

	/* ---- rdma_getaddrinfo */
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE,
				       .ai_port_space = RDMA_PS_TCP },
			     *res;
	rc = rdma_getaddrinfo(b_ip, "7471", &hints, &res);
	CHECK(rc == 0 && res->ai_src_addr && !res->ai_dst_addr &&
		      res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_TCP &&
		      (res->ai_flags & RAI_PASSIVE) &&
		      ntohs(((struct sockaddr_in *)res->ai_src_addr)->sin_port) == 7471,
	      "getaddrinfo RAI_PASSIVE: a source address, RC, TCP port space");
	if (rc == 0)
		rdma_freeaddrinfo(res);
	hints.ai_flags = 0;
	hints.ai_port_space = RDMA_PS_UDP;
	rc = rdma_getaddrinfo(b_ip, "7471", &hints, &res);
	CHECK(rc == 0 && res->ai_dst_addr && !res->ai_src_addr &&
		      res->ai_qp_type == IBV_QPT_UD && res->ai_port_space == RDMA_PS_UDP,
	      "getaddrinfo RDMA_PS_UDP: a destination, UD");
	if (rc == 0)
		rdma_freeaddrinfo(res);
	hints.ai_flags = RAI_NUMERICHOST;
	rc = rdma_getaddrinfo("not-an-address", "7471", &hints, &res);
	CHECK(rc == EAI_NONAME, "getaddrinfo of a name with RAI_NUMERICHOST: EAI_NONAME (%d)", rc);
	CHECK(ERR(rdma_getaddrinfo(NULL, NULL, NULL, &res), EINVAL),
	      "getaddrinfo with nothing: -1/EINVAL");

	rdma_destroy_event_channel(ch);
	rdma_destroy_event_channel(sch);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
