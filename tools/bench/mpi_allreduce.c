/* OpenMPI's side of `tessera-bench allreduce`: times MPI_Allreduce (float32, sum, in place) the
 * way Tessera's side (worker/allreduce_bench_job.h) times its ring, and prints one JSON line per
 * size from rank 0:
 *   {"bench":"allreduce","system":"mpi","bytes":B,"ranks":W,"iters":K,"median_s":...,...}
 * Per size: a zeroed buffer; WARMUP untimed calls, whose mean time (MPI_MAX over the ranks)
 * gives the timed iterations (ITERS, or as many as fit in SECONDS, 5 to 10000); each timed
 * iteration is MPI_Barrier then MPI_Allreduce timed with MPI_Wtime; the per-iteration times are
 * MPI_MAX-reduced over the ranks and rank 0 reports their median, min and mean.
 *
 * Usage: mpirun -np N mpi_allreduce SIZES WARMUP ITERS SECONDS   (SIZES: bytes, comma-separated)
 * tessera-bench compiles it with mpicc at run time. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int CompareDoubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc != 5) {
    if (rank == 0) fprintf(stderr, "usage: %s SIZES WARMUP ITERS SECONDS\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  const long warmup = atol(argv[2]);
  const long fixed_iters = atol(argv[3]);
  const double seconds = atof(argv[4]);
  char* sizes = strdup(argv[1]);
  for (char* item = strtok(sizes, ","); item != NULL; item = strtok(NULL, ",")) {
    const long bytes = atol(item);
    const int count = (int)(bytes / (long)sizeof(float));
    float* buffer = calloc((size_t)count, sizeof(float));
    if (buffer == NULL) {
      fprintf(stderr, "rank %d: cannot allocate %ld bytes\n", rank, bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double start = MPI_Wtime();
    for (long i = 0; i < warmup; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buffer, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double warm_mean = warmup > 0 ? (MPI_Wtime() - start) / (double)warmup : 0.0;
    MPI_Allreduce(MPI_IN_PLACE, &warm_mean, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long iters = fixed_iters;
    if (iters == 0) {
      iters = warm_mean > 0 ? (long)(seconds / warm_mean) : 10000;
      if (iters < 5) iters = 5;
      if (iters > 10000) iters = 10000;
    }
    double* times = malloc((size_t)iters * sizeof(double));
    for (long i = 0; i < iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      start = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buffer, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      times[i] = MPI_Wtime() - start;
    }
    MPI_Allreduce(MPI_IN_PLACE, times, (int)iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      double total = 0;
      for (long i = 0; i < iters; ++i) total += times[i];
      qsort(times, (size_t)iters, sizeof(double), CompareDoubles);
      const double median =
          iters % 2 == 1 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2;
      printf("{\"bench\":\"allreduce\",\"system\":\"mpi\",\"bytes\":%ld,\"ranks\":%d,"
             "\"iters\":%ld,\"median_s\":%.9g,\"min_s\":%.9g,\"mean_s\":%.9g}\n",
             bytes, world, iters, median, times[0], total / (double)iters);
      fflush(stdout);
    }
    free(times);
    free(buffer);
  }
  free(sizes);
  MPI_Finalize();
  return 0;
}
