/*
 * pingpong: the baseline for bench/osu, measuring an MPI library the way
 * bench/osu measures comm (and the OSU Micro-Benchmarks osu_latency and
 * osu_bw measure MPI), with the same sizes, iterations and output:
 *
 *   latency  rank 0 sends a message to rank 1, which sends it back;
 *            one-way latency = round trip / 2, averaged over the timed
 *            iterations that follow untimed warm-up ones.
 *   bw       rank 0 posts a window of 64 MPI_Isend, waits for them, then
 *            receives a 4-byte reply sent once rank 1 has received the
 *            whole window; MB/s = bytes of the timed windows / time / 1e6.
 *
 * Sizes double from 0 (latency) or 1 (bw) to 4 MiB. Up to 8 KiB: 10000
 * iterations after 100 warm-up (latency), 100 windows after 10 (bw);
 * above: 1000 after 10, 20 after 2.
 *
 *   mpicc -O2 -o pingpong pingpong.c
 *   mpirun -n 2 ./pingpong latency|bw [max-size]
 *
 * bench/ompi/run.sh builds and runs it over Open MPI's shared-memory and
 * TCP transports.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LARGE 8192
#define WINDOW 64
#define TAG_SYNC 1
#define TAG_PING 2
#define TAG_DATA 3
#define TAG_ACK 4

static void fail(const char *what)
{
	fprintf(stderr, "pingpong: %s\n", what);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static double latency(int rank, char *s, char *r, int size, int iters, int warmup)
{
	int peer = 1 - rank;
	double start = 0;
	for (int i = 0; i < iters + warmup; i++) {
		if (i == warmup)
			start = MPI_Wtime();
		if (rank == 0) {
			MPI_Send(s, size, MPI_CHAR, peer, TAG_PING, MPI_COMM_WORLD);
			MPI_Recv(r, size, MPI_CHAR, peer, TAG_PING, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(r, size, MPI_CHAR, peer, TAG_PING, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(s, size, MPI_CHAR, peer, TAG_PING, MPI_COMM_WORLD);
		}
	}
	return (MPI_Wtime() - start) * 1e6 / (2.0 * iters);
}

static double bandwidth(int rank, char *s, char *r, int size, int iters, int warmup)
{
	int peer = 1 - rank;
	MPI_Request reqs[WINDOW];
	double start = 0;
	for (int i = 0; i < iters + warmup; i++) {
		if (i == warmup)
			start = MPI_Wtime();
		if (rank == 0) {
			for (int w = 0; w < WINDOW; w++)
				MPI_Isend(s, size, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD, &reqs[w]);
			MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
			MPI_Recv(r, 4, MPI_CHAR, peer, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			for (int w = 0; w < WINDOW; w++)
				MPI_Irecv(r, size, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD, &reqs[w]);
			MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
			MPI_Send(s, 4, MPI_CHAR, peer, TAG_ACK, MPI_COMM_WORLD);
		}
	}
	double t = MPI_Wtime() - start;
	return (double)size * iters * WINDOW / t / 1e6;
}

int main(int argc, char **argv)
{
	int rank, nranks;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (nranks != 2)
		fail("takes exactly 2 ranks");
	if (argc < 2 || (strcmp(argv[1], "latency") != 0 && strcmp(argv[1], "bw") != 0))
		fail("usage: pingpong latency|bw [max-size]");
	int bw = strcmp(argv[1], "bw") == 0;
	long maxsize = argc > 2 ? atol(argv[2]) : 4L << 20;
	if (maxsize < 4 || maxsize > 1L << 30)
		fail("max-size from 4 to 1 GiB");

	char *s = NULL, *r = NULL;
	if (posix_memalign((void **)&s, 4096, maxsize) || posix_memalign((void **)&r, 4096, maxsize))
		fail("out of memory");
	memset(s, 'a', maxsize);
	memset(r, 'b', maxsize);

	if (rank == 0)
		printf("# MPI %s Test (bench/ompi/pingpong.c, as %s)\n%-10s%18s\n",
		       bw ? "Bandwidth" : "Latency", bw ? "osu_bw" : "osu_latency",
		       "# Size", bw ? "Bandwidth (MB/s)" : "Latency (us)");
	for (long size = bw ? 1 : 0; size <= maxsize; size = size ? 2 * size : 1) {
		int iters, warmup;
		if (bw) {
			iters = size > LARGE ? 20 : 100;
			warmup = size > LARGE ? 2 : 10;
		} else {
			iters = size > LARGE ? 1000 : 10000;
			warmup = size > LARGE ? 10 : 100;
		}
		MPI_Barrier(MPI_COMM_WORLD);
		double v = bw ? bandwidth(rank, s, r, (int)size, iters, warmup)
			      : latency(rank, s, r, (int)size, iters, warmup);
		if (rank == 0) {
			printf("%-10ld%18.2f\n", size, v);
			fflush(stdout);
		}
	}
	free(s);
	free(r);
	MPI_Finalize();
	return 0;
}
