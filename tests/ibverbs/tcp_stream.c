/* A plain TCP client and server, nothing RDMA in it: run under
 * librspreload.so (rdma-core's preload, which turns TCP sockets into
 * rsockets) it must move its bytes over RoCE.
 *
 *   tcp_stream -s ADDR PORT BYTES   serve one connection: receive BYTES,
 *                                   check them, send BYTES back, wait for EOF
 *   tcp_stream -c ADDR PORT BYTES   connect, send, receive the answer and
 *                                   check it, shut down, close
 *
 * Uses socket/setsockopt/bind/listen/accept/connect, poll for readiness
 * (the listener before accept, the client before each send and receive),
 * send/recv in pieces of varied sizes, shutdown and close; the client
 * also reads TCP_INFO (iperf3 does) and sets and reads back TCP_KEEPIDLE
 * and SO_LINGER. Prints
 * "tcp_stream: N bytes each way checked" and exits 0 on success.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static unsigned char pat(unsigned seed, size_t i)
{
	return (unsigned char)(i * 31 + seed + (i >> 12));
}

static int die(const char *what)
{
	fprintf(stderr, "tcp_stream: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void wait_for(int fd, short ev)
{
	struct pollfd p = { .fd = fd, .events = ev };
	int n = poll(&p, 1, 30000);
	if (n < 0)
		die("poll");
	if (n == 0) {
		fprintf(stderr, "tcp_stream: poll: nothing in 30 s\n");
		exit(1);
	}
	if (!(p.revents & ev)) {
		fprintf(stderr, "tcp_stream: poll: revents 0x%x\n", p.revents);
		exit(1);
	}
}

static void send_all(int fd, unsigned seed, size_t n)
{
	static unsigned char buf[100000];
	size_t done = 0, piece = 1000;
	while (done < n) {
		size_t k = n - done < piece ? n - done : piece;
		for (size_t i = 0; i < k; i++)
			buf[i] = pat(seed, done + i);
		wait_for(fd, POLLOUT);
		ssize_t r = send(fd, buf, k, 0);
		if (r < 0)
			die("send");
		done += r;
		piece = piece * 3 % sizeof buf + 1;
	}
}

static void recv_check(int fd, unsigned seed, size_t n)
{
	static unsigned char buf[65536];
	size_t done = 0;
	while (done < n) {
		wait_for(fd, POLLIN);
		size_t want = n - done < sizeof buf ? n - done : sizeof buf;
		ssize_t r = recv(fd, buf, want, 0);
		if (r < 0)
			die("recv");
		if (r == 0) {
			fprintf(stderr, "tcp_stream: EOF after %zu of %zu bytes\n", done, n);
			exit(1);
		}
		for (ssize_t i = 0; i < r; i++)
			if (buf[i] != pat(seed, done + i)) {
				fprintf(stderr, "tcp_stream: data mismatch at byte %zu\n", done + i);
				exit(1);
			}
		done += r;
	}
}

int main(int argc, char **argv)
{
	if (argc != 5 || (strcmp(argv[1], "-s") && strcmp(argv[1], "-c"))) {
		fprintf(stderr, "usage: tcp_stream -s|-c ADDR PORT BYTES\n");
		return 2;
	}
	int server = !strcmp(argv[1], "-s");
	size_t n = strtoull(argv[4], NULL, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[3])) };
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
		fprintf(stderr, "tcp_stream: bad address %s\n", argv[2]);
		return 2;
	}
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	if (server) {
		if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one))
			die("setsockopt SO_REUSEADDR");
		if (bind(fd, (struct sockaddr *)&a, sizeof a))
			die("bind");
		if (listen(fd, 4))
			die("listen");
		wait_for(fd, POLLIN);
		struct sockaddr_in peer;
		socklen_t len = sizeof peer;
		int c = accept(fd, (struct sockaddr *)&peer, &len);
		if (c < 0)
			die("accept");
		if (len != sizeof peer || peer.sin_family != AF_INET) {
			fprintf(stderr, "tcp_stream: accept gave no IPv4 peer\n");
			return 1;
		}
		recv_check(c, 1, n);
		send_all(c, 2, n);
		/* The client shuts down after reading: EOF. */
		char b;
		wait_for(c, POLLIN);
		ssize_t r = recv(c, &b, 1, 0);
		if (r != 0) {
			fprintf(stderr, "tcp_stream: expected EOF, got %zd\n", r);
			return 1;
		}
		close(c);
	} else {
		if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one))
			die("setsockopt TCP_NODELAY");
		if (connect(fd, (struct sockaddr *)&a, sizeof a))
			die("connect");
		struct sockaddr_in peer;
		socklen_t len = sizeof peer;
		if (getpeername(fd, (struct sockaddr *)&peer, &len) || peer.sin_port != a.sin_port)
			die("getpeername");
		/* What iperf3 and friends ask of a connected socket. */
		struct tcp_info info;
		len = sizeof info;
		if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len))
			die("getsockopt TCP_INFO");
		if (info.tcpi_state != TCP_ESTABLISHED) {
			fprintf(stderr, "tcp_stream: TCP_INFO state %u\n", info.tcpi_state);
			return 1;
		}
		int idle = 77, got = 0;
		len = sizeof got;
		if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) ||
		    getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &got, &len) || got != 77)
			die("TCP_KEEPIDLE set and read back");
		struct linger lg = { .l_onoff = 1, .l_linger = 0 };
		len = sizeof lg;
		if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg))
			die("setsockopt SO_LINGER");
		memset(&lg, 0, sizeof lg);
		if (getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &len) || !lg.l_onoff)
			die("SO_LINGER read back");
		send_all(fd, 1, n);
		recv_check(fd, 2, n);
		if (shutdown(fd, SHUT_WR))
			die("shutdown");
	}
	close(fd);
	printf("tcp_stream: %zu bytes each way checked\n", n);
	return 0;
}
