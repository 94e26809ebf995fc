/* The checks the C tests here share: CHECK prints "ok    " or "FAIL  "
 * and its message, counting each in `passed` or `failed` (the programs
 * end with a summary line of both); MUST stops the program (exit 2) when
 * a step its checks need fails, saying which and errno. */
#ifndef UROCE_TESTS_CHECK_H
#define UROCE_TESTS_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static int passed, failed;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (cond) {                                                    \
			passed++;                                              \
			printf("ok    ");                                      \
		} else {                                                       \
			failed++;                                              \
			printf("FAIL  ");                                      \
		}                                                              \
		printf(__VA_ARGS__);                                           \
		printf("\n");                                                  \
	} while (0)

#define MUST(x)                                                                \
	do {                                                                   \
		if (!(x)) {                                                    \
			printf("FAIL  setup %s:%d: %s (errno %d)\n", __FILE__, \
			       __LINE__, #x, errno);                           \
			fflush(stdout);                                        \
			exit(2);                                               \
		}                                                              \
	} while (0)

#endif
