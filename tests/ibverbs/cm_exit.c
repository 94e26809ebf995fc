/* A passive side that exits the moment it sees DISCONNECTED leaves its
 * DREP on the wire (issue 24, item 12).
 *
 * qperf's server gets RDMA_CM_EVENT_DISCONNECTED on its peer's DREQ and
 * exits. uroce's CM lives in the process: unless the DREP that answered
 * the DREQ has left before the event reaches the program, it dies with
 * it, and the client waits in rdma_get_cm_event while its DREQ is resent
 * (about 77 s with the default 4.3 s timeout and 15 retries).
 *
 *   cm_exit ADDR PORT ROUNDS
 *
 * For each round the program starts itself as a server (a new process:
 * `cm_exit -s ADDR PORT`, on its own device ADDR), which accepts one
 * connection, waits for DISCONNECTED and calls _exit(0) at once (no atexit
 * handler may help). The client (this process, on the device
 * UROCE_CLIENT_DEVICES names) connects, disconnects and times its
 * DISCONNECTED: each must come well within the DREQ timeout (a lost DREP
 * shows as the DREQ's retries, ~4.3 s each; the limit is 3 s, which a
 * loaded machine's rounds stay under).
 * Prints each round's time, then "cm_exit: N rounds, N slow"; exits 1 if
 * any round was slow or failed. */
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LIMIT_MS 3000

static double now_ms(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch,
				    enum rdma_cm_event_type type) {
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e)) {
		perror("rdma_get_cm_event");
		return NULL;
	}
	if (e->event != type) {
		fprintf(stderr, "got %s (status %d), wanted %s\n", rdma_event_str(e->event),
			e->status, rdma_event_str(type));
		rdma_ack_cm_event(e);
		return NULL;
	}
	return e;
}

static int make_qp(struct rdma_cm_id *id) {
	struct ibv_qp_init_attr a = { .cap = { .max_send_wr = 4, .max_recv_wr = 4,
					       .max_send_sge = 1, .max_recv_sge = 1 },
				      .qp_type = IBV_QPT_RC };
	return rdma_create_qp(id, NULL, &a);
}

static int server(const char *addr, int port) {
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen_id;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, addr, &sa.sin_addr);
	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listen_id, (struct sockaddr *)&sa) || rdma_listen(listen_id, 1)) {
		perror("server: listen");
		return 1;
	}
	printf("listening\n");
	fflush(stdout);
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	if (!e)
		return 1;
	struct rdma_cm_id *id = e->id;
	rdma_ack_cm_event(e);
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1 };
	if (make_qp(id) || rdma_accept(id, &p)) {
		perror("server: accept");
		return 1;
	}
	if (!(e = expect(ch, RDMA_CM_EVENT_ESTABLISHED)))
		return 1;
	rdma_ack_cm_event(e);
	if (!(e = expect(ch, RDMA_CM_EVENT_DISCONNECTED)))
		return 1;
	/* As qperf: out, at once. _exit runs no atexit handler. */
	_exit(0);
}

/* One round: start the server, connect, disconnect; the time from
 * rdma_disconnect to DISCONNECTED, or -1. */
static double round_trip(const char *self, const char *addr, const char *port) {
	int out[2];
	if (pipe(out))
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		dup2(out[1], 1);
		close(out[0]);
		execl(self, self, "-s", addr, port, (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	char buf[64] = { 0 };
	/* Wait for the server's "listening". */
	if (read(out[0], buf, sizeof buf - 1) <= 0 || !strstr(buf, "listening")) {
		fprintf(stderr, "server did not start\n");
		close(out[0]);
		return -1;
	}
	close(out[0]);
	double t = -1;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = NULL;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(port)) };
	inet_pton(AF_INET, addr, &sa.sin_addr);
	struct rdma_cm_event *e;
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
				     .retry_count = 7, .rnr_retry_count = 7 };
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)&sa, 2000))
		goto out;
	if (!(e = expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED)))
		goto out;
	rdma_ack_cm_event(e);
	if (rdma_resolve_route(id, 2000) || !(e = expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED)))
		goto out;
	rdma_ack_cm_event(e);
	if (make_qp(id) || rdma_connect(id, &p) ||
	    !(e = expect(ch, RDMA_CM_EVENT_ESTABLISHED)))
		goto out;
	rdma_ack_cm_event(e);
	double t0 = now_ms();
	if (rdma_disconnect(id) || !(e = expect(ch, RDMA_CM_EVENT_DISCONNECTED)))
		goto out;
	t = now_ms() - t0;
	rdma_ack_cm_event(e);
out:
	if (t < 0)
		kill(pid, SIGKILL);
	int st;
	waitpid(pid, &st, 0);
	if (id) {
		if (id->qp)
			rdma_destroy_qp(id);
		rdma_destroy_id(id);
	}
	if (ch)
		rdma_destroy_event_channel(ch);
	return t;
}

int main(int argc, char **argv) {
	if (argc == 4 && !strcmp(argv[1], "-s")) {
		/* The server uses only its own device (UROCE_SERVER_DEVICES). */
		const char *d = getenv("UROCE_SERVER_DEVICES");
		if (d)
			setenv("UROCE_DEVICES", d, 1);
		return server(argv[2], atoi(argv[3]));
	}
	if (argc != 4) {
		fprintf(stderr, "usage: %s ADDR PORT ROUNDS\n", argv[0]);
		return 2;
	}
	/* Fewer retries: a lost DREP shows as a wait of ~13 s, not ~77 s.
	 * Not fewer than 2: on a loaded machine a REQ can time out once
	 * while the new server process is still setting up. */
	setenv("UROCE_CM_RETRIES", "2", 0);
	const char *c = getenv("UROCE_CLIENT_DEVICES");
	if (c)
		setenv("UROCE_DEVICES", c, 1);
	int rounds = atoi(argv[3]), slow = 0;
	for (int i = 0; i < rounds; i++) {
		double t = round_trip("/proc/self/exe", argv[1], argv[2]);
		printf("round %d: DISCONNECTED after %.1f ms\n", i, t);
		fflush(stdout);
		slow += t < 0 || t > LIMIT_MS;
	}
	printf("cm_exit: %d rounds, %d slow (limit %d ms)\n", rounds, slow, LIMIT_MS);
	return slow != 0;
}
