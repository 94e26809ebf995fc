/*
 * An MPI program for the applications matrix (tests/ibverbs/apps.sh): an
 * even number of ranks (2, or 4 as `mpirun -np 4`), every byte checked.
 * Ranks pair up as 0-1, 2-3, ...: the even rank of a pair leads.
 *
 *   1. ping-pong: sizes 1 B .. 4 MiB within each pair, each message filled
 *      with a pattern that depends on size, iteration and sender, checked
 *      on arrival; the one-way latency of 8-byte messages is printed;
 *   2. bandwidth: a window of non-blocking sends of 1 MiB from each even
 *      rank to its pair's odd one, which checks each buffer;
 *   3. all-to-all: MPI_Alltoall of 64 KiB blocks, so that every rank
 *      exchanges with every other, each block checked;
 *   4. one-sided: MPI_Win_allocate, MPI_Put and MPI_Get of 64 KiB into
 *      the next rank's window (rank + 1, round the ring) and
 *      MPI_Accumulate (MPI_SUM) of every rank into rank 0's, each epoch
 *      between fences, checked on every rank.
 *
 * `mpi_check p2p` runs 1 to 3, `mpi_check rma` runs 4, `mpi_check all` (or
 * no argument) all four. Prints "mpi_check: ok ..." from rank 0 and exits 0 when everything
 * checked; any mismatch prints what differed and aborts the job.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

static void fail(const char *what, size_t at, unsigned got, unsigned want)
{
	fprintf(stderr, "mpi_check: rank %d: %s: byte %zu is %#x, want %#x\n", rank, what, at,
		got, want);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static unsigned char pattern(size_t i, size_t size, int iter, int from)
{
	return (unsigned char)(i * 7 + size * 13 + (size_t)iter * 31 + (size_t)from * 101 + 1);
}

static void fill(unsigned char *buf, size_t size, int iter, int from)
{
	for (size_t i = 0; i < size; i++)
		buf[i] = pattern(i, size, iter, from);
}

static void check(const char *what, const unsigned char *buf, size_t size, int iter, int from)
{
	for (size_t i = 0; i < size; i++)
		if (buf[i] != pattern(i, size, iter, from))
			fail(what, i, buf[i], pattern(i, size, iter, from));
}

/* `iters` round trips of `size` bytes between the ranks of a pair, every
 * byte checked on both. */
static void exchange(unsigned char *sbuf, unsigned char *rbuf, size_t size, int iters)
{
	int peer = rank ^ 1;
	for (int it = 0; it < iters; it++) {
		if (rank % 2 == 0) {
			fill(sbuf, size, it, rank);
			MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
			MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			check("ping-pong reply", rbuf, size, it, peer);
		} else {
			MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			check("ping-pong request", rbuf, size, it, peer);
			fill(sbuf, size, it, rank);
			MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
		}
	}
}

/* Ping-pong at every power of two up to 4 MiB; returns the one-way
 * latency of 8-byte messages in microseconds (median of 5 runs of 200,
 * after a warm-up that connects the ranks). */
static double pingpong(unsigned char *sbuf, unsigned char *rbuf)
{
	double lat[5];
	exchange(sbuf, rbuf, 8, 100);
	for (int r = 0; r < 5; r++) {
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		exchange(sbuf, rbuf, 8, 200);
		lat[r] = (MPI_Wtime() - t0) / 200 / 2 * 1e6;
	}
	for (int i = 1; i < 5; i++)
		for (int j = i; j > 0 && lat[j] < lat[j - 1]; j--) {
			double t = lat[j];
			lat[j] = lat[j - 1];
			lat[j - 1] = t;
		}
	for (size_t size = 1; size <= 4u << 20; size *= 2) {
		MPI_Barrier(MPI_COMM_WORLD);
		exchange(sbuf, rbuf, size, size <= 4096 ? 100 : size <= (256u << 10) ? 20 : 4);
	}
	return lat[2];
}

/* A window of 8 non-blocking 1 MiB sends from each even rank to its pair,
 * repeated; returns MB/s as rank 0 measured it. */
static double bandwidth(unsigned char *sbuf, unsigned char *rbuf)
{
	enum { WINDOW = 8, ROUNDS = 8, SIZE = 1 << 20 };
	MPI_Request req[WINDOW];
	MPI_Status st[WINDOW];
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (int r = 0; r < ROUNDS; r++) {
		for (int w = 0; w < WINDOW; w++) {
			unsigned char *b = (rank % 2 == 0 ? sbuf : rbuf) + (size_t)w * SIZE;
			if (rank % 2 == 0) {
				fill(b, SIZE, r * WINDOW + w, rank);
				MPI_Isend(b, SIZE, MPI_BYTE, rank + 1, 3, MPI_COMM_WORLD, &req[w]);
			} else {
				MPI_Irecv(b, SIZE, MPI_BYTE, rank - 1, 3, MPI_COMM_WORLD, &req[w]);
			}
		}
		MPI_Waitall(WINDOW, req, st);
		if (rank % 2 == 1)
			for (int w = 0; w < WINDOW; w++)
				check("bandwidth", rbuf + (size_t)w * SIZE, SIZE, r * WINDOW + w,
				      rank - 1);
		/* The receiver's ack keeps rank 0 from timing only its own copies. */
		MPI_Sendrecv(NULL, 0, MPI_BYTE, rank ^ 1, 4, NULL, 0, MPI_BYTE, rank ^ 1, 4,
			     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	}
	double secs = MPI_Wtime() - t0;
	return (double)ROUNDS * WINDOW * SIZE / secs / 1e6;
}

/* MPI_Alltoall of 64 KiB blocks: block d of rank s's send buffer, filled
 * for (iteration d, sender s), lands in block s of rank d's receive
 * buffer. */
static void all_to_all(void)
{
	enum { BLOCK = 64 << 10 };
	unsigned char *sbuf = malloc((size_t)nranks * BLOCK), *rbuf = malloc((size_t)nranks * BLOCK);
	if (!sbuf || !rbuf)
		MPI_Abort(MPI_COMM_WORLD, 2);
	for (int d = 0; d < nranks; d++)
		fill(sbuf + (size_t)d * BLOCK, BLOCK, d, rank);
	memset(rbuf, 0, (size_t)nranks * BLOCK);
	MPI_Alltoall(sbuf, BLOCK, MPI_BYTE, rbuf, BLOCK, MPI_BYTE, MPI_COMM_WORLD);
	for (int s = 0; s < nranks; s++)
		check("MPI_Alltoall", rbuf + (size_t)s * BLOCK, BLOCK, rank, s);
	free(sbuf);
	free(rbuf);
}

/* MPI_Put and MPI_Get of 64 KiB and MPI_Accumulate, each between fences. */
static void one_sided(void)
{
	enum { WIN = 64 << 10, COUNT = 1024 };
	unsigned char *base;
	MPI_Win win;
	MPI_Win_allocate(WIN + COUNT * sizeof(int64_t), 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base,
			 &win);
	int64_t *acc = (int64_t *)(base + WIN);
	unsigned char *local = malloc(WIN);
	int64_t *add = malloc(COUNT * sizeof(int64_t));
	int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;

	/* Each rank puts its pattern into the next rank's window. */
	MPI_Win_fence(0, win);
	memset(base, 0, WIN);
	for (int i = 0; i < COUNT; i++)
		acc[i] = 1000 * i;
	fill(local, WIN, 7, rank);
	MPI_Win_fence(0, win);
	MPI_Put(local, WIN, MPI_BYTE, next, 0, WIN, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	check("MPI_Put target", base, WIN, 7, prev);

	/* Each rank reads back what it put: the next rank's window holds it. */
	memset(local, 0, WIN);
	MPI_Get(local, WIN, MPI_BYTE, next, 0, WIN, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	check("MPI_Get origin", local, WIN, 7, rank);

	/* Every rank r adds (r + 1) (i + 1) into rank 0's counters:
	 * acc[i] = 1000 i + (1 + 2 + ... + nranks) (i + 1). */
	int64_t sum = (int64_t)nranks * (nranks + 1) / 2;
	for (int i = 0; i < COUNT; i++)
		add[i] = (int64_t)(rank + 1) * (i + 1);
	MPI_Accumulate(add, COUNT, MPI_INT64_T, 0, WIN, COUNT, MPI_INT64_T, MPI_SUM, win);
	MPI_Win_fence(0, win);
	if (rank == 0)
		for (int i = 0; i < COUNT; i++)
			if (acc[i] != 1000 * i + sum * (i + 1)) {
				fprintf(stderr, "mpi_check: MPI_Accumulate: acc[%d] = %lld, want %lld\n",
					i, (long long)acc[i], (long long)(1000 * i + sum * (i + 1)));
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
	MPI_Win_fence(0, win);
	free(local);
	free(add);
	MPI_Win_free(&win);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (nranks < 2 || nranks % 2) {
		if (rank == 0)
			fprintf(stderr, "mpi_check: needs an even number of ranks, has %d\n", nranks);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int all = argc < 2 || strcmp(argv[1], "all") == 0;
	int p2p = all || strcmp(argv[1], "p2p") == 0;
	int rma = all || strcmp(argv[1], "rma") == 0;
	if (!p2p && !rma) {
		if (rank == 0)
			fprintf(stderr, "usage: mpi_check [p2p|rma|all]\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	char line[320];
	snprintf(line, sizeof(line), " %d ranks;", nranks);
	if (p2p) {
		unsigned char *sbuf = malloc(8u << 20), *rbuf = malloc(8u << 20);
		if (!sbuf || !rbuf)
			MPI_Abort(MPI_COMM_WORLD, 2);
		double lat = pingpong(sbuf, rbuf);
		double bw = bandwidth(sbuf, rbuf);
		all_to_all();
		snprintf(line + strlen(line), sizeof(line) - strlen(line),
			 " ping-pong 1 B-4 MiB checked, 8 B %.1f us one way; 1 MiB x 8 window %.0f MB/s;"
			 " MPI_Alltoall 64 KiB checked;",
			 lat, bw);
		free(sbuf);
		free(rbuf);
	}
	if (rma) {
		one_sided();
		snprintf(line + strlen(line), sizeof(line) - strlen(line),
			 " MPI_Put/MPI_Get 64 KiB and MPI_Accumulate checked;");
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_check: ok:%s\n", line);
	MPI_Finalize();
	return 0;
}
