/* migcheck: the guest half of tests/migration/run.sh. Built statically on
 * the host and added to the test guest's initramfs; /migrate.sh runs it
 * on the virtiofs mount.
 *
 *   migcheck MOUNT [SCENARIO]
 *
 * Before the migration, with its cwd in MOUNT/mig (which the host made,
 * with rd and dir/e1..e3 in it): opens w (write), ap (O_APPEND), rd
 * (read, half of it read), dir (O_DIRECTORY, half of it listed) and lk
 * (read-write, a POSIX write lock on bytes 0-99), writes phase-1 data
 * through w, ap and lk, prints "MIGRATE-READY" and polls (every 100 ms, up
 * to 120 s) for MOUNT/trigger, which the host makes once the guest runs
 * on the destination. Each poll also reads 16 KiB of rd into a fresh
 * slot of a buffer the guest filled with 0xee beforehand: the daemon
 * writes those pages while the migration copies memory, so a daemon that
 * does not log its writes to guest memory (the dirty log of
 * SET_LOG_BASE) leaves slots the destination sees still holding 0xee. Then, through the same descriptors: writes phase-2
 * data, reads the rest of rd, lists dir again from the start and goes on
 * with the half-listed stream, opens relative to dir and to the cwd,
 * checks the lock from a child (a different owner must see it), fsyncs,
 * and prints "MIGRATE-OK" or "MIGRATE-FAIL: what" (and MIGRATE-INFO lines
 * along the way).
 *
 * SCENARIO "unlinked" also opens gone (read-write), writes phase-1 data
 * to it and unlinks it, keeping the fd; after the trigger it writes
 * phase 2 through that fd and reads both back.
 *
 * The trigger says where the guest now runs and what to expect, as the
 * host sees it: "dest" (migrated), "source" (the migration failed and the
 * guest goes on where it was) and any "eio:NAME" words (NAME is rd or
 * gone): every use of that descriptor after the move must fail with EIO
 * (its file was lost in the migration), every other one must work;
 * "copy": the destination's directory is a copy of the source's, so its
 * inode numbers differ (fstat's st_ino is not compared). The guest knows
 * where it runs only from that.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures;

/* The trigger's words: where the guest runs, which fds must give EIO. */
static char where[16] = "?";
static char eio_names[8][16];
static int n_eio;
static int copy;
static int expect_eio(const char *name) {
	for (int i = 0; i < n_eio; i++)
		if (!strcmp(eio_names[i], name)) return 1;
	return 0;
}

static void fail(const char *fmt, ...) {
	va_list ap;
	int e = errno;
	printf("MIGRATE-FAIL: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" (errno %d %s)\n", e, strerror(e));
	fflush(stdout);
	failures++;
}

static void info(const char *fmt, ...) {
	va_list ap;
	printf("MIGRATE-INFO: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

/* The host's rd: 64 KiB, byte i is (i * 13 + 7) & 255. */
#define RD_SIZE 65536
static int rd_ok(const unsigned char *b, size_t off, size_t n) {
	for (size_t i = 0; i < n; i++)
		if (b[i] != (unsigned char)(((off + i) * 13 + 7) & 255)) return 0;
	return 1;
}

static int write_all(int fd, const char *s, const char *what) {
	size_t n = strlen(s);
	ssize_t w = write(fd, s, n);
	if (w != (ssize_t)n) {
		fail("write %s returned %zd of %zu", what, w, n);
		return -1;
	}
	return 0;
}

/* A call that must fail with EIO: ret is what it returned. */
static void want_eio(long ret, const char *what) {
	if (ret >= 0) {
		errno = 0;
		fail("%s returned %ld, expected EIO (its file was lost in the migration)", what, ret);
	} else if (errno != EIO)
		fail("%s failed, but not with EIO", what);
	else
		info("%s: EIO, as expected", what);
}

/* The slots: 16 KiB each, filled from rd at (slot * 16 KiB) % 64 KiB. */
#define SLOT 16384
#define NSLOTS 1024

/* Names from one getdents64 call of up to `max` entries' worth of
 * buffer: appends them to list (space separated). */
static int list_some(int dfd, char *list, size_t cap, size_t bufsize) {
	char buf[4096];
	if (bufsize > sizeof buf) bufsize = sizeof buf;
	long n = syscall(SYS_getdents64, dfd, buf, bufsize);
	if (n < 0) return -1;
	for (long off = 0; off < n;) {
		struct {
			unsigned long long ino;
			long long off;
			unsigned short reclen;
			unsigned char type;
			char name[];
		} *d = (void *)(buf + off);
		if (strcmp(d->name, ".") && strcmp(d->name, "..")) {
			strncat(list, " ", cap - strlen(list) - 1);
			strncat(list, d->name, cap - strlen(list) - 1);
		}
		off += d->reclen;
	}
	return (int)n;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
	if (argc != 2 && argc != 3) {
		fprintf(stderr, "usage: migcheck MOUNT [normal|unlinked|missing|corrupt]\n");
		return 2;
	}
	const char *m = argv[1];
	int unlinked = argc == 3 && !strcmp(argv[2], "unlinked");
	char path[512];
	setvbuf(stdout, NULL, _IOLBF, 0);

	snprintf(path, sizeof path, "%s/mig", m);
	if (chdir(path)) { fail("chdir %s", path); return 1; }
	int w = open("w", O_WRONLY | O_CREAT | O_TRUNC, 0644);
	int ap = open("ap", O_WRONLY | O_CREAT | O_APPEND, 0644);
	int rd = open("rd", O_RDONLY);
	int dir = open("dir", O_RDONLY | O_DIRECTORY);
	int lk = open("lk", O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (w < 0 || ap < 0 || rd < 0 || dir < 0 || lk < 0) {
		fail("open before migration: w=%d ap=%d rd=%d dir=%d lk=%d", w, ap, rd, dir, lk);
		return 1;
	}
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 100 };
	if (fcntl(lk, F_SETLK, &fl)) fail("F_SETLK on lk");

	/* unlinked: a file whose only name goes away while the guest holds it. */
	int gone = -1;
	if (unlinked) {
		gone = open("gone", O_RDWR | O_CREAT | O_TRUNC, 0644);
		if (gone < 0 || write_all(gone, "gone-phase1\n", "gone")) { fail("open/write gone"); return 1; }
		if (unlink("gone")) { fail("unlink gone"); return 1; }
		struct stat gst;
		if (fstat(gone, &gst) || gst.st_nlink != 0) fail("fstat gone after unlink: nlink %ld", (long)gst.st_nlink);
	}

	/* Phase 1. */
	if (write_all(w, "w-phase1\n", "w") || write_all(ap, "ap-phase1-a\n", "ap") ||
	    write_all(ap, "ap-phase1-b\n", "ap") || write_all(lk, "lk-phase1\n", "lk"))
		return 1;
	static unsigned char rbuf[2 * RD_SIZE];
	ssize_t r = read(rd, rbuf, RD_SIZE / 2);
	if (r != RD_SIZE / 2 || !rd_ok(rbuf, 0, RD_SIZE / 2)) fail("read of rd's first half returned %zd or wrong data", r);
	/* Half the directory: a small buffer takes only some entries. */
	char before[1024] = "";
	if (list_some(dir, before, sizeof before, 80) <= 0) fail("getdents64 on dir before migration");
	struct stat dst0, wst0;
	if (fstat(dir, &dst0) || fstat(w, &wst0)) fail("fstat before migration");
	unsigned char *slots = malloc((size_t)NSLOTS * SLOT);
	if (!slots) { fail("malloc"); return 1; }
	memset(slots, 0xee, (size_t)NSLOTS * SLOT);
	/* Per slot: 0 not read, 1 read, else the errno of its failed pread. */
	static int slot_state[NSLOTS];
	int filled = 0;
	info("holding w ap rd dir lk (POSIX write lock 0-99)%s in %s; listed so far:%s", unlinked ? " and gone (unlinked)" : "", path, before);
	printf("MIGRATE-READY\n");
	fflush(stdout);

	/* Until the host says the guest runs on the destination. */
	snprintf(path, sizeof path, "%s/trigger", m);
	double t0 = now();
	struct stat st;
	int polls = 0, errs = 0;
	while (stat(path, &st)) {
		if (errno != ENOENT && errs++ < 5) info("stat %s during the wait: %s", path, strerror(errno));
		if (now() - t0 > 120) { fail("no %s after 120 s", path); return 1; }
		if (filled < NSLOTS) {
			off_t o = ((off_t)filled * SLOT) % RD_SIZE;
			ssize_t g = pread(rd, slots + (size_t)filled * SLOT, SLOT, o);
			slot_state[filled] = g == SLOT ? 1 : g < 0 ? errno : -1;
			if (g != SLOT && errs++ < 5) info("pread rd into slot %d during the wait returned %zd: %s", filled, g, strerror(errno));
			filled++;
		}
		usleep(100000);
		polls++;
	}
	info("trigger seen after %.1f s (%d polls)", now() - t0, polls);
	char tbuf[128] = "";
	int tfd = open(path, O_RDONLY);
	if (tfd < 0 || read(tfd, tbuf, sizeof tbuf - 1) < 0) fail("read trigger");
	if (tfd >= 0) close(tfd);
	{
		char words[128], *save = NULL;
		snprintf(words, sizeof words, "%s", tbuf);
		for (char *t = strtok_r(words, " \t\n", &save); t; t = strtok_r(NULL, " \t\n", &save)) {
			if (!strcmp(t, "dest") || !strcmp(t, "source")) snprintf(where, sizeof where, "%s", t);
			else if (!strcmp(t, "copy")) copy = 1;
			else if (!strncmp(t, "eio:", 4) && n_eio < 8) {
				snprintf(eio_names[n_eio], sizeof eio_names[0], "%s", t + 4);
				if (strcmp(eio_names[n_eio], "rd") && strcmp(eio_names[n_eio], "gone")) {
					errno = 0;
					fail("trigger: eio:%s is not a descriptor this check knows (rd, gone)", eio_names[n_eio]);
				}
				n_eio++;
			} else {
				errno = 0;
				fail("trigger: unknown word '%s'", t);
			}
		}
	}
	if (strcmp(where, "dest") && strcmp(where, "source")) {
		errno = 0;
		fail("trigger holds '%s': says neither dest nor source", tbuf);
	}
	{
		char el[160] = "";
		for (int i = 0; i < n_eio; i++) {
			strncat(el, " ", sizeof el - strlen(el) - 1);
			strncat(el, eio_names[i], sizeof el - strlen(el) - 1);
		}
		info("the host says the guest runs on the %s%s; EIO expected on:%s", !strcmp(where, "dest") ? "destination" : !strcmp(where, "source") ? "source (the migration failed)" : "?",
		     copy ? ", on a copy of the directory" : "", n_eio ? el : " nothing");
	}
	if (expect_eio("gone") && gone < 0) {
		errno = 0;
		fail("trigger expects EIO on gone, which this scenario does not open");
	}

	/* What the daemon wrote into guest memory while the memory was copied.
	 * Slots whose pread failed with EIO are left out when rd is expected
	 * to be lost (the reads after the switch-over). */
	int stale = 0, first = -1, eio_slots = 0, read_slots = 0;
	for (int i = 0; i < filled; i++) {
		if (slot_state[i] == EIO && expect_eio("rd")) { eio_slots++; continue; }
		if (slot_state[i] == 1) read_slots++;
		if (slot_state[i] != 1 || !rd_ok(slots + (size_t)i * SLOT, ((size_t)i * SLOT) % RD_SIZE, SLOT)) {
			stale++;
			if (first < 0) first = i;
		}
	}
	if (stale) {
		errno = 0;
		fail("%d of %d read buffers filled by the daemon around the migration do not hold the data read (first: slot %d, byte 0 is %#x, pread state %d): guest memory the daemon wrote was not migrated (dirty log?)", stale, filled, first, slots[(size_t)first * SLOT], slot_state[first]);
	} else
		info("%d read buffers filled during the wait hold the data read%s", read_slots, eio_slots ? " (the later preads got EIO, as expected)" : "");
	if (expect_eio("rd") && eio_slots) info("%d preads of rd during the wait got EIO (after the move)", eio_slots);

	/* Phase 2, through the same descriptors. */
	write_all(w, "w-phase2\n", "w");
	write_all(ap, "ap-phase2-a\n", "ap");
	write_all(ap, "ap-phase2-b\n", "ap");
	write_all(lk, "lk-phase2\n", "lk");
	if (expect_eio("rd")) {
		want_eio(read(rd, rbuf + RD_SIZE / 2, RD_SIZE), "read of rd's second half");
		want_eio(pread(rd, rbuf, 100, 1000), "pread rd");
		struct stat rst;
		want_eio(fstat(rd, &rst), "fstat rd");
	} else {
		r = read(rd, rbuf + RD_SIZE / 2, RD_SIZE);
		if (r != RD_SIZE / 2 || !rd_ok(rbuf + RD_SIZE / 2, RD_SIZE / 2, RD_SIZE / 2))
			fail("read of rd's second half returned %zd or wrong data", r);
		if (pread(rd, rbuf, 100, 1000) != 100 || !rd_ok(rbuf, 1000, 100)) fail("pread rd");
		r = read(rd, rbuf, 10);
		if (r != 0) fail("read at rd's end returned %zd", r);
	}

	/* The unlinked file, through the fd the guest kept. */
	if (gone >= 0) {
		char gbuf[64] = "";
		struct stat gst;
		if (expect_eio("gone")) {
			want_eio(pwrite(gone, "gone-phase2\n", 12, 12), "pwrite gone (unlinked)");
			want_eio(pread(gone, gbuf, sizeof gbuf - 1, 0), "pread gone (unlinked)");
			want_eio(fstat(gone, &gst), "fstat gone (unlinked)");
		} else {
			ssize_t gw = pwrite(gone, "gone-phase2\n", 12, 12);
			if (gw != 12) fail("pwrite gone (unlinked) returned %zd", gw);
			ssize_t gr = pread(gone, gbuf, sizeof gbuf - 1, 0);
			if (gr != 24 || strcmp(gbuf, "gone-phase1\ngone-phase2\n")) fail("pread gone (unlinked) returned %zd: '%s'", gr, gbuf);
			if (fstat(gone, &gst)) fail("fstat gone (unlinked) after migration");
			else if (gst.st_nlink != 0 || gst.st_size != 24) {
				errno = 0;
				fail("fstat gone (unlinked): nlink %ld, size %ld", (long)gst.st_nlink, (long)gst.st_size);
			} else
				info("gone (unlinked) holds both phases through the fd kept");
		}
	}

	/* The directory stream: the rest of it, then from the start. */
	char rest[1024] = "", all[1024] = "";
	int n;
	while ((n = list_some(dir, rest, sizeof rest, 4096)) > 0) {}
	if (n < 0) fail("getdents64 on dir after migration (continuing)");
	if (lseek(dir, 0, SEEK_SET)) fail("lseek dir to 0");
	while ((n = list_some(dir, all, sizeof all, 4096)) > 0) {}
	if (n < 0) fail("getdents64 on dir after migration (from the start)");
	info("dir: before%s | rest%s | all%s", before, rest, all);
	for (int i = 1; i <= 3; i++) {
		char e[8], pat[8];
		snprintf(e, sizeof e, "e%d", i);
		snprintf(pat, sizeof pat, " e%d", i);
		char *p = strstr(all, pat);
		if (!p || (p[3] != ' ' && p[3] != 0)) fail("dir listing after migration lacks %s:%s", e, all);
		int c = (strstr(before, pat) != NULL) + (strstr(rest, pat) != NULL);
		if (c != 1) fail("%s seen %d times across the split listing", e, c);
	}
	struct stat dst1, wst1;
	if (fstat(dir, &dst1)) fail("fstat dir after migration");
	else if ((!copy && dst1.st_ino != dst0.st_ino) || !S_ISDIR(dst1.st_mode)) fail("fstat dir: inode %lu, was %lu", (unsigned long)dst1.st_ino, (unsigned long)dst0.st_ino);
	int e2 = openat(dir, "e2", O_RDONLY);
	char ebuf[16] = "";
	if (e2 < 0 || read(e2, ebuf, sizeof ebuf - 1) < 0 || strcmp(ebuf, "entry2\n")) fail("openat(dir, e2) read '%s'", ebuf);
	if (e2 >= 0) close(e2);
	int nf = openat(dir, "new-after", O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (nf < 0 || write_all(nf, "made-after\n", "dir/new-after")) fail("create dir/new-after");
	if (nf >= 0) close(nf);

	/* The cwd. */
	char cwd[256];
	if (!getcwd(cwd, sizeof cwd)) fail("getcwd");
	else {
		snprintf(path, sizeof path, "%s/mig", m);
		if (strcmp(cwd, path)) fail("cwd is %s, not %s", cwd, path);
	}
	int rd2 = open("rd", O_RDONLY);
	if (expect_eio("rd")) {
		/* Lost: its name is gone on the destination's side too. */
		if (rd2 >= 0) {
			errno = 0;
			fail("open rd relative to the cwd worked, though rd was lost");
		} else
			info("open rd relative to the cwd: %s (rd is not on the destination's side)", strerror(errno));
	} else if (rd2 < 0 || pread(rd2, rbuf, 200, 5000) != 200 || !rd_ok(rbuf, 5000, 200))
		fail("open rd relative to the cwd and read");
	if (rd2 >= 0) close(rd2);
	int c2 = open("cwd-after", O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (c2 < 0 || write_all(c2, "cwd-after\n", "cwd-after")) fail("create cwd-after relative to the cwd");
	if (c2 >= 0) close(c2);

	/* fstat through the write fd: the same inode, the size both phases. */
	if (fstat(w, &wst1)) fail("fstat w after migration");
	else if ((!copy && wst1.st_ino != wst0.st_ino) || wst1.st_size != 18) fail("fstat w: inode %lu (was %lu), size %ld", (unsigned long)wst1.st_ino, (unsigned long)wst0.st_ino, (long)wst1.st_size);

	/* The lock: a child is another owner, it must see the parent's. */
	pid_t c = fork();
	if (c == 0) {
		struct flock q = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 10, .l_len = 1 };
		if (fcntl(lk, F_GETLK, &q)) _exit(2);
		if (q.l_type == F_UNLCK) _exit(3);
		if (q.l_pid != getppid()) info("F_GETLK in a child names pid %d as the holder, the parent is %d", (int)q.l_pid, (int)getppid());
		struct flock s = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 50, .l_len = 1 };
		if (fcntl(lk, F_SETLK, &s) == 0) _exit(5);
		_exit(0);
	}
	int wst;
	if (c < 0 || waitpid(c, &wst, 0) != c) fail("fork/wait for the lock check");
	else if (!WIFEXITED(wst) || WEXITSTATUS(wst)) fail("lock check in a child: status %d (2 F_GETLK failed, 3 unlocked, 5 could lock)", WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
	else info("the POSIX lock on lk is still seen by another owner in the guest");

	if (fsync(w) || fsync(ap) || fsync(lk)) fail("fsync");
	close(w);
	close(ap);
	if (close(rd) && !expect_eio("rd")) fail("close rd");
	if (gone >= 0 && close(gone) && !expect_eio("gone")) fail("close gone");
	close(dir);
	/* Unlocks (and closes: the lock goes). */
	fl.l_type = F_UNLCK;
	if (fcntl(lk, F_SETLK, &fl)) fail("unlock lk");
	close(lk);
	info("finished on the %s (as the host said)", !strcmp(where, "dest") ? "destination" : where);
	if (failures == 0) printf("MIGRATE-OK\n");
	else printf("MIGRATE-FAIL: %d check(s) failed\n", failures);
	fflush(stdout);
	return failures != 0;
}
