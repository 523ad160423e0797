/* guestcheck: the parts of the guest suite busybox has no applet for.
 * Built statically on the host (tests/guest/setup.sh) and put in the
 * initramfs. Each subcommand prints nothing and exits 0 on success, or
 * prints what went wrong and exits 1.
 *
 *   guestcheck xattr FILE    set/get/list/remove a user.* attribute
 *   guestcheck lock FILE     fcntl record locks and flock, against a child
 *   guestcheck mmap FILE     shared writable mapping, read back with read()
 *   guestcheck direct FILE   O_DIRECT write and read of 1 MiB
 *   guestcheck acl FILE      an access ACL (fusebox --posix-acl) lets one
 *                            other user read a 0600 file, and only that one
 *
 *   guestcheck put SRC DST   writes SRC's contents to DST in one write
 *                            (selinuxfs's load takes a policy whole)
 *
 * And two for tests/guest/reboot.sh:
 *   guestcheck hold DIR N FILE  opens N files DIR/f0.. (made if missing)
 *                               and FILE, takes a POSIX write lock
 *                               (F_SETLK) and a flock on FILE, prints
 *                               "HELD ..." and keeps all of it until killed
 *   guestcheck relock FILE      takes both locks on FILE again without
 *                               waiting; prints "posix=R flock=R" (R: ok or
 *                               errno N) and exits 0 only if both were taken
 *
 * And three that print (tests/guest/labels.sh):
 *   guestcheck getx NAME FILE        the value of xattr NAME (lgetxattr)
 *   guestcheck setx NAME VALUE FILE  sets it (lsetxattr, no NUL added)
 *   guestcheck listx FILE            the xattr names, one per line
 * On failure they print "errno N" and exit 1.
 *
 * And three for the DAX checks of the guest suite (a file mapped through
 * the device's window, tests/guest/run.sh --dax):
 *   guestcheck mapput FILE OFF STR         writes STR at OFF through a
 *                                          shared mapping, msync
 *   guestcheck mapwatch FILE OFF STR SECS  waits up to SECS for STR to
 *                                          appear at OFF of a shared
 *                                          mapping (a host write)
 *   guestcheck mapshare FILE OFF STR       a child process writes STR at
 *                                          OFF through a shared mapping
 *                                          of its own; this process sees
 *                                          it through the one it made
 *                                          before (no msync, no remap)
 *
 * And two that print, for benches/dax-guest.sh:
 *   guestcheck randread FILE SECS  4 KiB preads at random page offsets of
 *                                  FILE for SECS seconds; prints
 *                                  "RANDREAD ops N usecs T"
 *   guestcheck seqread FILE        reads FILE whole, 1 MiB at a time;
 *                                  prints "SEQREAD bytes N usecs T"
 *
 * And one for tests/guest/pjdfstest.sh:
 *   guestcheck owners DIR  ownership changes the guest kernel permits a
 *                          file's owner through its supplementary groups
 *                          (see do_owners); prints "OWNERS PASS name" or
 *                          "OWNERS FAIL name: why" per check, leaves its
 *                          files in DIR for the host to look at, and exits
 *                          1 if any check failed
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <stdarg.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d)\n", errno); exit(1); } while (0)

static int do_xattr(const char *p) {
	char buf[64];
	if (setxattr(p, "user.fusebox", "hello", 5, 0)) FAIL("setxattr");
	ssize_t n = getxattr(p, "user.fusebox", buf, sizeof buf);
	if (n != 5 || memcmp(buf, "hello", 5)) FAIL("getxattr returned %zd", n);
	if (setxattr(p, "user.fusebox", "x", 1, XATTR_CREATE) == 0 || errno != EEXIST)
		FAIL("XATTR_CREATE on an existing attribute did not fail with EEXIST");
	char list[256];
	n = listxattr(p, list, sizeof list);
	int found = 0;
	for (ssize_t i = 0; i < n; i += strlen(list + i) + 1)
		if (!strcmp(list + i, "user.fusebox")) found = 1;
	if (!found) FAIL("listxattr does not show user.fusebox");
	if (removexattr(p, "user.fusebox")) FAIL("removexattr");
	if (getxattr(p, "user.fusebox", buf, sizeof buf) >= 0 || errno != ENODATA)
		FAIL("getxattr after remove did not fail with ENODATA");
	return 0;
}

static int child_status(pid_t pid) {
	int st;
	if (waitpid(pid, &st, 0) != pid) FAIL("waitpid");
	return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

/* Reads p as uid:gid in a child: 0 if it got "secret", else the errno. */
static int read_as(const char *p, unsigned id) {
	pid_t c = fork();
	if (c == 0) {
		char buf[16] = { 0 };
		if (setgroups(0, NULL) || setgid(id) || setuid(id)) _exit(98);
		int fd = open(p, O_RDONLY);
		if (fd < 0) _exit(errno);
		_exit(read(fd, buf, sizeof buf) == 6 && !memcmp(buf, "secret", 6) ? 0 : 97);
	}
	return child_status(c);
}

static int do_acl(const char *p) {
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, "secret", 6) != 6 || close(fd)) FAIL("write");
	if (chmod(p, 0600)) FAIL("chmod");
	int r = read_as(p, 1234);
	if (r != EACCES) FAIL("uid 1234 read a 0600 file before the ACL: %d", r);
	/* posix_acl_xattr: version 2, then {tag, perm, id}: u::rw- u:1234:r--
	 * g::--- m::r-- o::--- */
	struct { unsigned short tag, perm; unsigned id; } e[] = {
		{ 0x01, 6, ~0u }, { 0x02, 4, 1234 }, { 0x04, 0, ~0u }, { 0x10, 4, ~0u }, { 0x20, 0, ~0u },
	};
	char acl[4 + sizeof e];
	unsigned version = 2;
	memcpy(acl, &version, 4);
	memcpy(acl + 4, e, sizeof e);
	if (setxattr(p, "system.posix_acl_access", acl, sizeof acl, 0)) FAIL("set the ACL");
	char back[sizeof acl + 8];
	if (getxattr(p, "system.posix_acl_access", back, sizeof back) != (ssize_t)sizeof acl ||
	    memcmp(back, acl, sizeof acl))
		FAIL("the ACL read back differs");
	struct stat st;
	if (stat(p, &st) || (st.st_mode & 0777) != 0640) FAIL("mode %o after the ACL, not 640", st.st_mode & 0777);
	if ((r = read_as(p, 1234))) FAIL("uid 1234, named in the ACL, could not read: %d", r);
	if ((r = read_as(p, 1235)) != EACCES) FAIL("uid 1235 got %d, not EACCES", r);
	return 0;
}

static int do_lock(const char *p) {
	int fd = open(p, O_RDWR | O_CREAT, 0644);
	if (fd < 0) FAIL("open");
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 100 };
	if (fcntl(fd, F_SETLK, &fl)) FAIL("F_SETLK");
	pid_t parent = getpid();
	pid_t c = fork();
	if (c == 0) {
		int f2 = open(p, O_RDWR);
		struct flock t = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 50, .l_len = 10 };
		if (fcntl(f2, F_SETLK, &t) == 0) _exit(2);          /* conflict not seen */
		if (errno != EAGAIN && errno != EACCES) _exit(3);
		t.l_type = F_WRLCK;
		if (fcntl(f2, F_GETLK, &t)) _exit(4);
		if (t.l_type != F_WRLCK || t.l_pid != parent) _exit(5); /* holder not reported */
		t = (struct flock){ .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 200, .l_len = 10 };
		if (fcntl(f2, F_SETLK, &t)) _exit(6);                /* disjoint range refused */
		_exit(0);
	}
	int r = child_status(c);
	if (r) { errno = 0; FAIL("fcntl child check %d failed", r); }
	fl.l_type = F_UNLCK;
	if (fcntl(fd, F_SETLK, &fl)) FAIL("F_UNLCK");
	c = fork();
	if (c == 0) {
		int f2 = open(p, O_RDWR);
		struct flock t = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 50, .l_len = 10 };
		_exit(fcntl(f2, F_SETLK, &t) ? 7 : 0);
	}
	if ((r = child_status(c))) { errno = 0; FAIL("lock after unlock: child check %d failed", r); }
	if (flock(fd, LOCK_EX)) FAIL("flock");
	c = fork();
	if (c == 0) {
		int f2 = open(p, O_RDWR);
		if (flock(f2, LOCK_EX | LOCK_NB) == 0) _exit(8);
		_exit(errno == EWOULDBLOCK ? 0 : 9);
	}
	if ((r = child_status(c))) { errno = 0; FAIL("flock child check %d failed", r); }
	if (flock(fd, LOCK_UN)) FAIL("flock unlock");
	close(fd);
	return 0;
}

static int do_mmap(const char *p) {
	const size_t len = 1 << 20;
	int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) FAIL("open");
	if (ftruncate(fd, len)) FAIL("ftruncate");
	unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) FAIL("mmap");
	for (size_t i = 0; i < len; i++) m[i] = (unsigned char)(i * 7 + 3);
	if (msync(m, len, MS_SYNC)) FAIL("msync");
	munmap(m, len);
	close(fd);
	fd = open(p, O_RDONLY);
	unsigned char *b = malloc(len);
	size_t got = 0;
	while (got < len) {
		ssize_t n = read(fd, b + got, len - got);
		if (n <= 0) FAIL("read back");
		got += n;
	}
	for (size_t i = 0; i < len; i++)
		if (b[i] != (unsigned char)(i * 7 + 3)) { errno = 0; FAIL("byte %zu differs after mmap write", i); }
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) FAIL("mmap read");
	if (memcmp(m, b, len)) { errno = 0; FAIL("read mapping differs"); }
	munmap(m, len);
	close(fd);
	return 0;
}

/* The page-aligned mapping of FILE that holds [off, off + len). */
static unsigned char *map_at(const char *p, long off, size_t len, int prot, size_t *mlen, long *moff) {
	int fd = open(p, (prot & PROT_WRITE) ? O_RDWR : O_RDONLY);
	if (fd < 0) FAIL("open");
	*moff = off & ~4095L;
	*mlen = (size_t)(off - *moff) + len;
	unsigned char *m = mmap(NULL, *mlen, prot, MAP_SHARED, fd, *moff);
	if (m == MAP_FAILED) FAIL("mmap");
	close(fd);
	return m + (off - *moff);
}

static int do_mapput(const char *p, long off, const char *str) {
	size_t mlen, len = strlen(str);
	long moff;
	unsigned char *at = map_at(p, off, len, PROT_READ | PROT_WRITE, &mlen, &moff);
	memcpy(at, str, len);
	if (msync(at - (off - moff), mlen, MS_SYNC)) FAIL("msync");
	return 0;
}

static int do_mapwatch(const char *p, long off, const char *str, int secs) {
	size_t mlen, len = strlen(str);
	long moff;
	volatile unsigned char *at = map_at(p, off, len, PROT_READ, &mlen, &moff);
	for (int i = 0; i < secs * 10; i++) {
		size_t k = 0;
		while (k < len && at[k] == (unsigned char)str[k]) k++;
		if (k == len) return 0;
		usleep(100000);
	}
	errno = 0;
	FAIL("%s never appeared at %ld of the mapping", str, off);
}

static int do_mapshare(const char *p, long off, const char *str) {
	size_t mlen, len = strlen(str);
	long moff;
	volatile unsigned char *at = map_at(p, off, len, PROT_READ, &mlen, &moff);
	if (!memcmp((const void *)at, str, len)) { errno = 0; FAIL("%s is at %ld already", str, off); }
	pid_t c = fork();
	if (c < 0) FAIL("fork");
	if (c == 0) {
		unsigned char *w = map_at(p, off, len, PROT_READ | PROT_WRITE, &mlen, &moff);
		memcpy(w, str, len);
		_exit(0);
	}
	int st;
	if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st)) { errno = 0; FAIL("the writer failed"); }
	size_t k = 0;
	while (k < len && at[k] == (unsigned char)str[k]) k++;
	if (k != len) { errno = 0; FAIL("the child's write is not seen through this mapping"); }
	return 0;
}

static int do_randread(const char *p, int secs) {
	int fd = open(p, O_RDONLY);
	if (fd < 0) FAIL("open");
	struct stat st;
	if (fstat(fd, &st) || st.st_size < 4096) FAIL("fstat");
	long pages = st.st_size / 4096, ops = 0;
	char buf[4096];
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	unsigned long x = 88172645463325252UL;
	long us = 0;
	do {
		for (int i = 0; i < 256; i++) {
			x ^= x << 13; x ^= x >> 7; x ^= x << 17;
			if (pread(fd, buf, 4096, (off_t)(x % pages) * 4096) != 4096) FAIL("pread");
			ops++;
		}
		clock_gettime(CLOCK_MONOTONIC, &b);
		us = (b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000;
	} while (us < secs * 1000000L);
	printf("RANDREAD ops %ld usecs %ld\n", ops, us);
	return 0;
}

static int do_seqread(const char *p) {
	int fd = open(p, O_RDONLY);
	if (fd < 0) FAIL("open");
	static char buf[1 << 20];
	struct timespec a, b;
	long total = 0;
	ssize_t n;
	clock_gettime(CLOCK_MONOTONIC, &a);
	while ((n = read(fd, buf, sizeof buf)) > 0) total += n;
	if (n < 0) FAIL("read");
	clock_gettime(CLOCK_MONOTONIC, &b);
	long us = (b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000;
	printf("SEQREAD bytes %ld usecs %ld\n", total, us);
	return 0;
}

static int do_direct(const char *p) {
	const size_t len = 1 << 20;
	void *w, *r;
	if (posix_memalign(&w, 4096, len) || posix_memalign(&r, 4096, len)) FAIL("memalign");
	for (size_t i = 0; i < len; i++) ((unsigned char *)w)[i] = (unsigned char)(i ^ (i >> 8));
	int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
	if (fd < 0) FAIL("open O_DIRECT");
	if (pwrite(fd, w, len, 0) != (ssize_t)len) FAIL("O_DIRECT write");
	if (pread(fd, r, len, 0) != (ssize_t)len) FAIL("O_DIRECT read");
	if (memcmp(w, r, len)) { errno = 0; FAIL("O_DIRECT data differs"); }
	close(fd);
	return 0;
}

static int do_getx(const char *name, const char *p) {
	char v[4096];
	ssize_t n = lgetxattr(p, name, v, sizeof v);
	if (n < 0) { printf("errno %d\n", errno); return 1; }
	/* A label may carry its NUL: print up to it. */
	printf("%.*s\n", (int)n, v);
	return 0;
}

static int do_setx(const char *name, const char *value, const char *p) {
	if (lsetxattr(p, name, value, strlen(value), 0)) { printf("errno %d\n", errno); return 1; }
	return 0;
}

static int do_listx(const char *p) {
	char list[4096];
	ssize_t n = llistxattr(p, list, sizeof list);
	if (n < 0) { printf("errno %d\n", errno); return 1; }
	for (ssize_t i = 0; i < n; i += strlen(list + i) + 1) printf("%s\n", list + i);
	return 0;
}

static int do_put(const char *src, const char *dst) {
	static char buf[4 << 20];
	int in = open(src, O_RDONLY);
	if (in < 0) FAIL("open %s", src);
	size_t len = 0;
	for (;;) {
		ssize_t n = read(in, buf + len, sizeof buf - len);
		if (n < 0) FAIL("read %s", src);
		if (n == 0) break;
		len += n;
		if (len == sizeof buf) { errno = EFBIG; FAIL("%s is too big", src); }
	}
	close(in);
	int out = open(dst, O_WRONLY);
	if (out < 0) FAIL("open %s", dst);
	if (write(out, buf, len) != (ssize_t)len) FAIL("write %s", dst);
	close(out);
	return 0;
}

static int do_hold(const char *dir, int n, const char *p) {
	char path[4096];
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof path, "%s/f%d", dir, i);
		if (open(path, O_RDWR | O_CREAT, 0644) < 0) FAIL("open %s", path);
	}
	int fd = open(p, O_RDWR | O_CREAT, 0644);
	if (fd < 0) FAIL("open %s", p);
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
	if (fcntl(fd, F_SETLK, &fl)) FAIL("F_SETLK %s", p);
	if (flock(fd, LOCK_EX | LOCK_NB)) FAIL("flock %s", p);
	printf("HELD %d files open, a POSIX lock and a flock on %s\n", n, p);
	fflush(stdout);
	for (;;) pause();
}

static int do_relock(const char *p) {
	int fd = open(p, O_RDWR);
	if (fd < 0) FAIL("open %s", p);
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
	int posix = fcntl(fd, F_SETLK, &fl) ? errno : 0;
	int fl_rc = flock(fd, LOCK_EX | LOCK_NB) ? errno : 0;
	printf("posix=");
	posix ? printf("errno %d", posix) : printf("ok");
	printf(" flock=");
	fl_rc ? printf("errno %d", fl_rc) : printf("ok");
	printf("\n");
	return posix || fl_rc;
}

/* The identities do_owners takes, as the test guest's /etc/passwd and
 * /etc/group have them (tests/guest/pjdfstest.sh): nobody (65534, group
 * nogroup 65534) is also in supp1 (65531) and supp2 (65532); tests
 * (65533, group tests 65533) is also in nogroup. */
enum { SUPP1 = 65531, SUPP2 = 65532, TESTS = 65533, NOBODY = 65534 };

static int owners_failed;

/* One check's line; ok false prints why (fmt) and marks the run failed. */
static void owners_report(int ok, const char *name, const char *fmt, ...) {
	if (ok) {
		printf("OWNERS PASS %s\n", name);
	} else {
		va_list ap;
		printf("OWNERS FAIL %s: ", name);
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
		printf("\n");
		owners_failed = 1;
	}
	fflush(stdout);
}

/* Whether p (not followed if nofollow) is uid:gid, with mode (all 12 bits)
 * too unless mode is -1; describes what it is in why otherwise. */
static int owners_is(const char *p, int nofollow, unsigned uid, unsigned gid, int mode, char *why, size_t n) {
	struct stat st;
	if ((nofollow ? lstat(p, &st) : stat(p, &st))) {
		snprintf(why, n, "stat %s: errno %d", p, errno);
		return 0;
	}
	snprintf(why, n, "%s is %u:%u mode %04o", p, (unsigned)st.st_uid, (unsigned)st.st_gid,
		 (unsigned)(st.st_mode & 07777));
	return st.st_uid == uid && st.st_gid == gid && (mode < 0 || (int)(st.st_mode & 07777) == mode);
}

/* Runs fn(dir) in a child that has dropped to uid:gid with the n groups;
 * returns whether the child ended normally with status 0. */
static int owners_as(unsigned uid, unsigned gid, const gid_t *groups, int n, void (*fn)(const char *), const char *dir) {
	fflush(stdout);
	pid_t c = fork();
	if (c < 0) FAIL("fork");
	if (c == 0) {
		if (setgroups(n, groups) || setgid(gid) || setuid(uid)) {
			printf("OWNERS FAIL become %u:%u: errno %d\n", uid, gid, errno);
			fflush(stdout);
			_exit(1);
		}
		owners_failed = 0;
		fn(dir);
		fflush(stdout);
		_exit(owners_failed);
	}
	return child_status(c) == 0;
}

/* Runs a call expected to succeed, then checks p's owner (and mode). */
#define OWNERS_OK(name, call, p, nofollow, uid, gid, mode) do { \
		char why_[512]; \
		if ((call)) owners_report(0, name, "%s: errno %d", #call, errno); \
		else owners_report(owners_is(p, nofollow, uid, gid, mode, why_, sizeof why_), name, "%s", why_); \
	} while (0)
/* Runs a call expected to fail with EPERM, then checks p's owner and mode
 * are what they were before it. */
#define OWNERS_EPERM(name, call, p) do { \
		struct stat b_; \
		char why_[512]; \
		if (stat(p, &b_)) { owners_report(0, name, "stat %s: errno %d", p, errno); break; } \
		errno = 0; \
		int r_ = (call); \
		if (r_ == 0 || errno != EPERM) owners_report(0, name, "%s returned %d, errno %d, not EPERM", #call, r_, errno); \
		else owners_report(owners_is(p, 0, b_.st_uid, b_.st_gid, b_.st_mode & 07777, why_, sizeof why_), name, \
				   "after EPERM %s, not %u:%u", why_, (unsigned)b_.st_uid, (unsigned)b_.st_gid); \
	} while (0)

/* As nobody with supplementary groups supp1 and supp2, on files it makes. */
static void owners_nobody(const char *dir) {
	char f[4096], l[4096], g[4096];
	snprintf(f, sizeof f, "%s/own", dir);
	snprintf(l, sizeof l, "%s/own-link", dir);
	snprintf(g, sizeof g, "%s/setgid", dir);
	int fd = open(f, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0 || close(fd)) { owners_report(0, "nobody-creates", "open %s: errno %d", f, errno); return; }
	char why[512];
	owners_report(owners_is(f, 0, NOBODY, NOBODY, 0644, why, sizeof why), "nobody-creates", "%s", why);
	/* chown(2): the owner may set the group to any group it is in, its
	 * supplementary ones included, when the uid stays its own. */
	OWNERS_OK("chown-uid-and-supplementary-group", chown(f, NOBODY, SUPP1), f, 0, NOBODY, SUPP1, -1);
	OWNERS_OK("chown-supplementary-group-only", chown(f, (uid_t)-1, SUPP2), f, 0, NOBODY, SUPP2, -1);
	OWNERS_EPERM("chown-group-not-held-eperm", chown(f, (uid_t)-1, TESTS), f);
	OWNERS_EPERM("chown-other-uid-eperm", chown(f, TESTS, (gid_t)-1), f);
	OWNERS_EPERM("chown-root-uid-eperm", chown(f, 0, SUPP1), f);
	/* lchown changes the link itself, not what it points to. */
	struct stat t;
	if (symlink("own", l) || stat(f, &t)) {
		owners_report(0, "lchown-symlink-supplementary-group", "symlink %s: errno %d", l, errno);
	} else {
		OWNERS_OK("lchown-symlink-supplementary-group", lchown(l, (uid_t)-1, SUPP1), l, 1, NOBODY, SUPP1, -1);
		owners_report(owners_is(f, 0, t.st_uid, t.st_gid, -1, why, sizeof why), "lchown-leaves-the-target",
			      "%s, not %u:%u", why, (unsigned)t.st_uid, (unsigned)t.st_gid);
	}
	/* chmod(2) keeps S_ISGID when the file's group is one the caller is
	 * in (only a caller outside the group without CAP_FSETID loses it). */
	fd = open(g, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0 || close(fd) || chown(g, (uid_t)-1, SUPP1)) {
		owners_report(0, "chmod-setgid-supplementary-group", "make %s of group %d: errno %d", g, SUPP1, errno);
	} else {
		OWNERS_OK("chmod-setgid-supplementary-group", chmod(g, 02755), g, 0, NOBODY, SUPP1, 02755);
		/* A write by the owner (no CAP_FSETID) drops S_ISGID of a
		 * group-executable file. */
		fd = open(g, O_WRONLY);
		if (fd < 0 || write(fd, "x", 1) != 1 || close(fd))
			owners_report(0, "write-clears-setgid", "write %s: errno %d", g, errno);
		else
			owners_report(owners_is(g, 0, NOBODY, SUPP1, 0755, why, sizeof why), "write-clears-setgid", "%s", why);
		OWNERS_OK("chmod-setgid-again", chmod(g, 02755), g, 0, NOBODY, SUPP1, 02755);
	}
}

/* As tests, a member of nogroup only as a supplementary group. */
static void owners_tests(const char *dir) {
	char f[4096];
	snprintf(f, sizeof f, "%s/tests-own", dir);
	int fd = open(f, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0 || close(fd)) { owners_report(0, "tests-creates", "open %s: errno %d", f, errno); return; }
	OWNERS_OK("chown-group-held-as-supplementary-only", chown(f, (uid_t)-1, NOBODY), f, 0, TESTS, NOBODY, 0600);
	OWNERS_EPERM("chown-to-a-group-of-nobodys-eperm", chown(f, (uid_t)-1, SUPP1), f);
}

/* Ownership changes a file's owner may make through its supplementary
 * groups, which a guest kernel permits before the daemon sees them: each
 * identity runs in a child of its own (setgroups, setgid, setuid), on
 * files it creates in DIR (made here, mode 01777). */
static int do_owners(const char *dir) {
	if (mkdir(dir, 0777) || chmod(dir, 01777)) FAIL("mkdir %s", dir);
	const gid_t nobody_groups[] = { SUPP1, SUPP2 };
	const gid_t tests_groups[] = { NOBODY };
	int ok = owners_as(NOBODY, NOBODY, nobody_groups, 2, owners_nobody, dir);
	ok &= owners_as(TESTS, TESTS, tests_groups, 1, owners_tests, dir);
	return !ok;
}

int main(int argc, char **argv) {
	if (argc == 4 && !strcmp(argv[1], "getx")) return do_getx(argv[2], argv[3]);
	if (argc == 5 && !strcmp(argv[1], "setx")) return do_setx(argv[2], argv[3], argv[4]);
	if (argc == 3 && !strcmp(argv[1], "listx")) return do_listx(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "put")) return do_put(argv[2], argv[3]);
	if (argc == 5 && !strcmp(argv[1], "hold")) return do_hold(argv[2], atoi(argv[3]), argv[4]);
	if (argc == 3 && !strcmp(argv[1], "relock")) return do_relock(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "owners")) return do_owners(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "seqread")) return do_seqread(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "randread")) return do_randread(argv[2], atoi(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "mapput")) return do_mapput(argv[2], atol(argv[3]), argv[4]);
	if (argc == 5 && !strcmp(argv[1], "mapshare")) return do_mapshare(argv[2], atol(argv[3]), argv[4]);
	if (argc == 6 && !strcmp(argv[1], "mapwatch")) return do_mapwatch(argv[2], atol(argv[3]), argv[4], atoi(argv[5]));
	if (argc != 3) { fprintf(stderr, "usage: guestcheck xattr|lock|mmap|direct|acl FILE, getx NAME FILE, setx NAME VALUE FILE, listx FILE, put SRC DST, hold DIR N FILE, relock FILE, owners DIR, mapput FILE OFF STR, mapshare FILE OFF STR, mapwatch FILE OFF STR SECS, randread FILE SECS, seqread FILE\n"); return 2; }
	if (!strcmp(argv[1], "xattr")) return do_xattr(argv[2]);
	if (!strcmp(argv[1], "lock")) return do_lock(argv[2]);
	if (!strcmp(argv[1], "mmap")) return do_mmap(argv[2]);
	if (!strcmp(argv[1], "direct")) return do_direct(argv[2]);
	if (!strcmp(argv[1], "acl")) return do_acl(argv[2]);
	fprintf(stderr, "unknown check %s\n", argv[1]);
	return 2;
}
