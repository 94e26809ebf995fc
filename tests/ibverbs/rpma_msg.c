/* librpma's messaging examples 12, 12scch and 13 (librpma 1.2.0's
 * examples/12-receive-completion-queue, 12scch-receive-completion-queue
 * and 13-messages-ping-pong-with-srq), as one program of ours on Debian's
 * librpma-dev: tests/ibverbs/apps.sh runs it on uroce.
 *
 *   rpma_msg server ADDR PORT [scch | srq N]
 *   rpma_msg client ADDR PORT START ROUNDS [scch | srq]
 *
 * The client sends a counter, the server sends it back plus one, ROUNDS
 * times (each side checks the value it gets); then the client sends
 * I_M_DONE. In examples 12 and 12scch it posts that SEND unsignaled
 * (RPMA_F_COMPLETION_ON_ERROR) and at once calls rpma_conn_disconnect:
 * the server must still receive it, as from a NIC, which sends what was
 * posted before the disconnect; a SEND flushed instead leaves the server
 * waiting for it forever (issue #34 item 4). `scch` is 12scch: one
 * completion channel shared by the CQ and the receive CQ
 * (rpma_conn_wait). `srq N` is 13: the server takes N clients on one
 * shared receive queue and disconnects each after its I_M_DONE; the
 * client waits for that close.
 *
 * Exit 0 when every value came back right and the server got every
 * I_M_DONE; the server's last line says what it got. */
#include <inttypes.h>
#include <librpma.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MSG_SIZE sizeof(uint64_t)
#define RCQ_SIZE 10
#define I_M_DONE UINT64_MAX
#define CLIENT_MAX 10

enum mode { PLAIN, SCCH, SRQ };

static void die(const char *what, int ret)
{
	fprintf(stderr, "rpma_msg: %s: %s\n", what, rpma_err_2str(ret));
	exit(1);
}
#define TRY(call)                                  \
	do {                                       \
		int ret_ = (call);                 \
		if (ret_)                          \
			die(#call, ret_);          \
	} while (0)

static uint64_t *page(size_t size)
{
	void *p;
	if (posix_memalign(&p, (size_t)sysconf(_SC_PAGESIZE), size)) {
		perror("posix_memalign");
		exit(1);
	}
	memset(p, 0, size);
	return p;
}

/* The next completion of `opcode` on `cq` (12: each CQ alone) or on the
 * connection's shared channel (12scch); exits on any other. */
static void next_wc(struct rpma_conn *conn, struct rpma_cq *cq, enum ibv_wc_opcode opcode,
		    struct ibv_wc *wc)
{
	if (conn) {
		TRY(rpma_conn_wait(conn, 0, &cq, NULL));
	} else {
		TRY(rpma_cq_wait(cq));
	}
	TRY(rpma_cq_get_wc(cq, 1, wc, NULL));
	if (wc->status != IBV_WC_SUCCESS || wc->opcode != opcode) {
		fprintf(stderr, "rpma_msg: completion %s, opcode %d (want %d)\n",
			ibv_wc_status_str(wc->status), wc->opcode, opcode);
		exit(1);
	}
}

/* 13's client: one CQ, the SEND's and the RECV's completions in either
 * order. */
static void both_wc(struct rpma_cq *cq)
{
	bool sent = false, received = false;
	while (!sent || !received) {
		struct ibv_wc wc[2];
		int got = 0;
		TRY(rpma_cq_wait(cq));
		int ret = rpma_cq_get_wc(cq, 2, wc, &got);
		if (ret == RPMA_E_NO_COMPLETION)
			continue;
		if (ret)
			die("rpma_cq_get_wc", ret);
		for (int k = 0; k < got; k++) {
			if (wc[k].status != IBV_WC_SUCCESS ||
			    (wc[k].opcode != IBV_WC_SEND && wc[k].opcode != IBV_WC_RECV)) {
				fprintf(stderr, "rpma_msg: completion %s, opcode %d\n",
					ibv_wc_status_str(wc[k].status), wc[k].opcode);
				exit(1);
			}
			if (wc[k].opcode == IBV_WC_SEND)
				sent = true;
			else
				received = true;
		}
	}
}

static void expect_event(struct rpma_conn *conn, enum rpma_conn_event want)
{
	enum rpma_conn_event ev = RPMA_CONN_UNDEFINED;
	TRY(rpma_conn_next_event(conn, &ev));
	if (ev != want) {
		fprintf(stderr, "rpma_msg: connection event %s (want %s)\n",
			rpma_utils_conn_event_2str(ev), rpma_utils_conn_event_2str(want));
		exit(1);
	}
}

static struct rpma_conn_cfg *config(enum mode mode, struct rpma_srq *srq)
{
	struct rpma_conn_cfg *cfg;
	TRY(rpma_conn_cfg_new(&cfg));
	if (mode == SRQ) {
		TRY(rpma_conn_cfg_set_srq(cfg, srq));
	} else {
		TRY(rpma_conn_cfg_set_rcq_size(cfg, RCQ_SIZE));
		if (mode == SCCH)
			TRY(rpma_conn_cfg_set_compl_channel(cfg, true));
	}
	return cfg;
}

/* Examples 12 and 12scch's server: one client, receives on its own RCQ. */
static int serve_one(struct rpma_peer *peer, struct rpma_ep *ep, enum mode mode)
{
	uint64_t *recv = page(MSG_SIZE), *send = page(MSG_SIZE);
	struct rpma_mr_local *recv_mr, *send_mr;
	TRY(rpma_mr_reg(peer, recv, MSG_SIZE, RPMA_MR_USAGE_RECV, &recv_mr));
	TRY(rpma_mr_reg(peer, send, MSG_SIZE, RPMA_MR_USAGE_SEND, &send_mr));
	struct rpma_conn_cfg *cfg = config(mode, NULL);
	struct rpma_conn_req *req;
	struct rpma_conn *conn;
	TRY(rpma_ep_next_conn_req(ep, cfg, &req));
	TRY(rpma_conn_req_recv(req, recv_mr, 0, MSG_SIZE, recv));
	TRY(rpma_conn_req_connect(&req, NULL, &conn));
	expect_event(conn, RPMA_CONN_ESTABLISHED);
	struct rpma_cq *cq, *rcq;
	TRY(rpma_conn_get_cq(conn, &cq));
	TRY(rpma_conn_get_rcq(conn, &rcq));
	struct rpma_conn *shared = mode == SCCH ? conn : NULL;
	struct ibv_wc wc;
	unsigned values = 0;
	for (;;) {
		next_wc(shared, rcq, IBV_WC_RECV, &wc);
		if (*recv == I_M_DONE)
			break;
		values++;
		*send = *recv + 1;
		TRY(rpma_recv(conn, recv_mr, 0, MSG_SIZE, recv));
		TRY(rpma_send(conn, send_mr, 0, MSG_SIZE, RPMA_F_COMPLETION_ALWAYS, NULL));
		next_wc(shared, cq, IBV_WC_SEND, &wc);
	}
	TRY(rpma_conn_disconnect(conn));
	expect_event(conn, RPMA_CONN_CLOSED);
	TRY(rpma_conn_delete(&conn));
	TRY(rpma_conn_cfg_delete(&cfg));
	TRY(rpma_mr_dereg(&send_mr));
	TRY(rpma_mr_dereg(&recv_mr));
	printf("rpma_msg server: %u values answered, then I_M_DONE\n", values);
	return 0;
}

/* Example 13's server: `n` clients, one shared receive queue with `n`
 * receive slots (any client's value may land in any slot), and a send
 * slot per client. */
static int serve_srq(struct rpma_peer *peer, struct rpma_ep *ep, int n)
{
	uint64_t *recv = page(CLIENT_MAX * MSG_SIZE), *send = page(CLIENT_MAX * MSG_SIZE);
	struct rpma_mr_local *recv_mr, *send_mr;
	TRY(rpma_mr_reg(peer, recv, CLIENT_MAX * MSG_SIZE, RPMA_MR_USAGE_RECV, &recv_mr));
	TRY(rpma_mr_reg(peer, send, CLIENT_MAX * MSG_SIZE, RPMA_MR_USAGE_SEND, &send_mr));
	struct rpma_srq *srq;
	TRY(rpma_srq_new(peer, NULL, &srq));
	struct rpma_conn_cfg *cfg = config(SRQ, srq);
	struct rpma_conn *conns[CLIENT_MAX] = {0};
	uint32_t qpns[CLIENT_MAX];
	for (int i = 0; i < n; i++) {
		struct rpma_conn_req *req;
		TRY(rpma_srq_recv(srq, recv_mr, i * MSG_SIZE, MSG_SIZE, recv + i));
		TRY(rpma_ep_next_conn_req(ep, cfg, &req));
		TRY(rpma_conn_req_connect(&req, NULL, &conns[i]));
		expect_event(conns[i], RPMA_CONN_ESTABLISHED);
		TRY(rpma_conn_get_qp_num(conns[i], &qpns[i]));
	}
	struct rpma_cq *rcq;
	TRY(rpma_srq_get_rcq(srq, &rcq));
	struct ibv_wc wc[CLIENT_MAX];
	int done = 0;
	unsigned values = 0;
	while (done < n) {
		int got = 0;
		TRY(rpma_cq_wait(rcq));
		int ret = rpma_cq_get_wc(rcq, n, wc, &got);
		if (ret == RPMA_E_NO_COMPLETION)
			continue;
		if (ret)
			die("rpma_cq_get_wc", ret);
		for (int k = 0; k < got; k++) {
			if (wc[k].status != IBV_WC_SUCCESS || wc[k].opcode != IBV_WC_RECV) {
				fprintf(stderr, "rpma_msg: srq completion %s, opcode %d\n",
					ibv_wc_status_str(wc[k].status), wc[k].opcode);
				return 1;
			}
			int c = -1;
			for (int i = 0; i < n; i++)
				if (qpns[i] == wc[k].qp_num)
					c = i;
			uint64_t *buf = (uint64_t *)(uintptr_t)wc[k].wr_id;
			if (c < 0 || buf < recv || buf >= recv + CLIENT_MAX) {
				fprintf(stderr, "rpma_msg: a receive on QP 0x%x, no client's\n",
					wc[k].qp_num);
				return 1;
			}
			size_t at = (size_t)(buf - recv);
			if (*buf == I_M_DONE) {
				/* As example 13: the server ends each connection. */
				TRY(rpma_conn_disconnect(conns[c]));
				done++;
				continue;
			}
			values++;
			/* The answer goes out of client c's own send slot: the
			 * receive slot `at` may next hold another client's
			 * value, while this SEND (unsignaled) is still being
			 * sent. Client c sends again only once it has this
			 * answer, so its slot is free by then. */
			send[c] = *buf + 1;
			TRY(rpma_srq_recv(srq, recv_mr, at * MSG_SIZE, MSG_SIZE, buf));
			TRY(rpma_send(conns[c], send_mr, (size_t)c * MSG_SIZE, MSG_SIZE,
				      RPMA_F_COMPLETION_ON_ERROR, NULL));
		}
	}
	for (int i = 0; i < n; i++) {
		expect_event(conns[i], RPMA_CONN_CLOSED);
		TRY(rpma_conn_delete(&conns[i]));
	}
	TRY(rpma_conn_cfg_delete(&cfg));
	TRY(rpma_srq_delete(&srq));
	TRY(rpma_mr_dereg(&send_mr));
	TRY(rpma_mr_dereg(&recv_mr));
	printf("rpma_msg server: %d clients on one SRQ, %u values answered, each ended with I_M_DONE\n",
	       n, values);
	return 0;
}

static int client(struct rpma_peer *peer, const char *addr, const char *port, uint64_t counter,
		  uint64_t rounds, enum mode mode)
{
	uint64_t *recv = page(MSG_SIZE), *send = page(MSG_SIZE);
	struct rpma_mr_local *recv_mr, *send_mr;
	TRY(rpma_mr_reg(peer, recv, MSG_SIZE, RPMA_MR_USAGE_RECV, &recv_mr));
	TRY(rpma_mr_reg(peer, send, MSG_SIZE, RPMA_MR_USAGE_SEND, &send_mr));
	struct rpma_conn_cfg *cfg = mode == SRQ ? NULL : config(mode, NULL);
	struct rpma_conn_req *req;
	struct rpma_conn *conn;
	TRY(rpma_conn_req_new(peer, addr, port, cfg, &req));
	TRY(rpma_conn_req_connect(&req, NULL, &conn));
	expect_event(conn, RPMA_CONN_ESTABLISHED);
	struct rpma_cq *cq, *rcq;
	TRY(rpma_conn_get_cq(conn, &cq));
	TRY(rpma_conn_get_rcq(conn, &rcq));
	if (!rcq) /* 13: one CQ for both */
		rcq = cq;
	struct rpma_conn *shared = mode == SCCH ? conn : NULL;
	struct ibv_wc wc;
	for (uint64_t r = 0; r < rounds; r++) {
		TRY(rpma_recv(conn, recv_mr, 0, MSG_SIZE, recv));
		*send = counter;
		TRY(rpma_send(conn, send_mr, 0, MSG_SIZE, RPMA_F_COMPLETION_ALWAYS, NULL));
		if (rcq == cq) {
			both_wc(cq);
		} else {
			next_wc(shared, cq, IBV_WC_SEND, &wc);
			next_wc(shared, rcq, IBV_WC_RECV, &wc);
		}
		if (*recv != counter + 1) {
			fprintf(stderr, "rpma_msg: sent %" PRIu64 ", got %" PRIu64 " back\n", counter,
				*recv);
			return 1;
		}
		counter = *recv;
	}
	/* The last message, unsignaled, and at once the disconnect (12) or
	 * the wait for the server's (13). */
	*send = I_M_DONE;
	TRY(rpma_send(conn, send_mr, 0, MSG_SIZE, RPMA_F_COMPLETION_ON_ERROR, NULL));
	if (mode == SRQ) {
		expect_event(conn, RPMA_CONN_CLOSED);
		TRY(rpma_conn_disconnect(conn));
	} else {
		TRY(rpma_conn_disconnect(conn));
		expect_event(conn, RPMA_CONN_CLOSED);
	}
	TRY(rpma_conn_delete(&conn));
	if (cfg)
		TRY(rpma_conn_cfg_delete(&cfg));
	TRY(rpma_mr_dereg(&send_mr));
	TRY(rpma_mr_dereg(&recv_mr));
	printf("rpma_msg client: %" PRIu64 " values checked, I_M_DONE sent\n", rounds);
	return 0;
}

static enum mode mode_of(const char *s)
{
	if (!s)
		return PLAIN;
	if (!strcmp(s, "scch"))
		return SCCH;
	if (!strcmp(s, "srq"))
		return SRQ;
	fprintf(stderr, "rpma_msg: unknown mode %s\n", s);
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "server")) {
		enum mode mode = mode_of(argc > 4 ? argv[4] : NULL);
		int n = mode == SRQ && argc > 5 ? atoi(argv[5]) : 1;
		if (n < 1 || n > CLIENT_MAX) {
			fprintf(stderr, "rpma_msg: 1 to %d clients\n", CLIENT_MAX);
			return 2;
		}
		struct ibv_context *ctx;
		struct rpma_peer *peer;
		struct rpma_ep *ep;
		TRY(rpma_utils_get_ibv_context(argv[2], RPMA_UTIL_IBV_CONTEXT_LOCAL, &ctx));
		TRY(rpma_peer_new(ctx, &peer));
		TRY(rpma_ep_listen(peer, argv[2], argv[3], &ep));
		/* apps.sh waits for this line before it starts a client. */
		printf("rpma_msg server: listening\n");
		fflush(stdout);
		int rc = mode == SRQ ? serve_srq(peer, ep, n) : serve_one(peer, ep, mode);
		TRY(rpma_ep_shutdown(&ep));
		TRY(rpma_peer_delete(&peer));
		return rc;
	}
	if (argc >= 6 && !strcmp(argv[1], "client")) {
		struct ibv_context *ctx;
		struct rpma_peer *peer;
		TRY(rpma_utils_get_ibv_context(argv[2], RPMA_UTIL_IBV_CONTEXT_REMOTE, &ctx));
		TRY(rpma_peer_new(ctx, &peer));
		int rc = client(peer, argv[2], argv[3], strtoull(argv[4], NULL, 0),
				strtoull(argv[5], NULL, 0), mode_of(argc > 6 ? argv[6] : NULL));
		TRY(rpma_peer_delete(&peer));
		return rc;
	}
	fprintf(stderr, "usage: rpma_msg server ADDR PORT [scch | srq N]\n"
			"       rpma_msg client ADDR PORT START ROUNDS [scch | srq]\n");
	return 2;
}
